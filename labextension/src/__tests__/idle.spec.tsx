/**
 * "Warn first": the countdown to an idle reclamation on a fake clock (jest's fake timers move
 * `Date.now` and the timers together).  The panel shows it only in the last 10 minutes, with
 * the right M:SS, ticking every second without a request per tick; "I'm still here" posts and
 * the warning goes when the answer moves the deadline out; the notifications come once at 5
 * and once at 1 minute; the status bar counts down too.
 */
import { Notification } from '@jupyterlab/apputils';
import { MessageLoop } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';
import * as React from 'react';
import { act } from 'react';
import { createRoot, Root } from 'react-dom/client';

import { FleetAPI, LabfleetError } from '../api';
import { IdleWatch, type INotifier } from '../idle';
import {
  formatCountdown,
  idleKind,
  idleNotificationDue,
  idleWarning,
  lowResources
} from '../idlewarning';
import { FleetPanel, IFleetActions } from '../sidebar';
import { UsageStatus } from '../statusbar';
import { FleetStore } from '../store';
import type { IIdleInfo } from '../types';

const T0 = Date.parse('2026-11-24T10:00:00Z');
const TIMEOUT = 900;

/** What the fake server knows: the last activity; the idle object follows from it. */
class FakeServer {
  lastActive = T0;
  timeout: number | null = TIMEOUT;
  onlyWhenQueueWaiting = false;
  stillHereFails: string | null = null;
  calls: string[] = [];

  idle(): IIdleInfo {
    const idleFor = (Date.now() - this.lastActive) / 1000;
    return {
      idle_for: idleFor,
      timeout: this.timeout,
      reclaim_at:
        this.timeout === null
          ? null
          : new Date(this.lastActive + this.timeout * 1000).toISOString(),
      checker: 'short',
      reason: `no activity for ${idleFor.toFixed(0)} s (timeout ${this.timeout} s)`,
      only_when_queue_waiting: this.onlyWhenQueueWaiting
    };
  }

  api(): FleetAPI {
    const api = Object.create(FleetAPI.prototype) as FleetAPI;
    for (const name of Object.getOwnPropertyNames(FleetAPI.prototype)) {
      if (name !== 'constructor' && name !== 'settings') {
        (api as any)[name] = async () => {
          this.calls.push(name);
          return [];
        };
      }
    }
    (api as any).session = async () => {
      this.calls.push('session');
      return {
        id: 's1',
        name: 'work',
        user: 'alice',
        type: 'interactive',
        project: 'acme/ml',
        status: 'RUNNING',
        slots: { cpu: 1 },
        devices: [],
        mounts: [],
        uptime: null,
        started_at: null,
        max_lifetime: null,
        time_left: null,
        idle: this.idle(),
        urls: {},
        runner: null,
        inference: null,
        service: 'ok'
      };
    };
    (api as any).usage = async () => {
      this.calls.push('usage');
      return { cpu: { percent: 1, limit: 1 }, memory: { used: 2 ** 20, limit: null }, gpus: [] };
    };
    (api as any).stillHere = async () => {
      this.calls.push('stillHere');
      if (this.stillHereFails) {
        throw new LabfleetError(this.stillHereFails, 502);
      }
      this.lastActive = Date.now();
      return this.idle();
    };
    return api;
  }
}

/** A notifier that records what JupyterLab would show. */
class FakeNotifier implements INotifier {
  shown: { id: string; message: string; options: Notification.IOptions<any> }[] = [];
  errors: string[] = [];
  dismissed: string[] = [];
  warning(message: string, options: Notification.IOptions<any>): string {
    const id = `n${this.shown.length + 1}`;
    this.shown.push({ id, message, options });
    return id;
  }
  error(message: string): string {
    this.errors.push(message);
    return 'e';
  }
  dismiss(id: string): void {
    this.dismissed.push(id);
  }
}

const actions: IFleetActions = {
  stopThisSession: jest.fn(async () => undefined),
  stopSession: jest.fn(async () => undefined),
  openSession: jest.fn(),
  openFolder: jest.fn(),
  openApp: jest.fn()
};

let server: FakeServer;
let store: FleetStore;
let notifier: FakeNotifier;
let watch: IdleWatch;
let container: HTMLDivElement;
let root: Root;

const byTestId = (id: string) => container.querySelector(`[data-testid="${id}"]`);

function render(): void {
  root.render(<FleetPanel store={store} actions={actions} onRefresh={() => undefined} />);
}

/** Let the clock run `ms` (timers fire, promises settle, React renders). */
async function run(ms: number): Promise<void> {
  await act(async () => {
    await jest.advanceTimersByTimeAsync(ms);
  });
}

/** Let the clock run until `seconds` are left before the fake server's deadline. */
async function runUntilLeft(seconds: number): Promise<void> {
  const deadline = server.lastActive + (server.timeout ?? 0) * 1000;
  await run(deadline - seconds * 1000 - Date.now());
}

beforeAll(() => {
  (globalThis as any).IS_REACT_ACT_ENVIRONMENT = true;
});

beforeEach(async () => {
  jest.useFakeTimers({ now: T0 });
  server = new FakeServer();
  notifier = new FakeNotifier();
  store = new FleetStore(server.api(), { user: 'alice', serverName: 'work' });
  await act(async () => {
    await store.fetch('session');
  });
  watch = new IdleWatch(store, { notifier });
  container = document.createElement('div');
  document.body.appendChild(container);
  root = createRoot(container);
  store.changed.connect(render);
  watch.changed.connect(render);
  act(() => render());
});

afterEach(() => {
  act(() => root.unmount());
  container.remove();
  watch.dispose();
  jest.useRealTimers();
});

describe('the idle countdown in "This session"', () => {
  it('shows nothing while the deadline is more than 10 minutes away', async () => {
    // 15 minutes of timeout, no activity: the deadline is 15 minutes away, then 10:01.
    expect(byTestId('lf-idle-warning')).toBeNull();
    await runUntilLeft(601);
    expect(byTestId('lf-idle-warning')).toBeNull();
    expect(byTestId('lf-section-badge-session')?.textContent).toBe('RUNNING');
  });

  it('counts down M:SS every second from reclaim_at, without asking the server', async () => {
    await runUntilLeft(600);
    // Exactly 10:00 left is not "less than 10 minutes".
    expect(byTestId('lf-idle-warning')).toBeNull();
    await run(1000);
    expect(byTestId('lf-idle-countdown')?.textContent).toBe('9:59');
    expect(byTestId('lf-idle-title')?.textContent).toBe(
      'This session will be stopped for inactivity in 9:59'
    );
    const asked = server.calls.filter(c => c === 'session').length;
    await runUntilLeft(272);
    expect(byTestId('lf-idle-countdown')?.textContent).toBe('4:32');
    await run(1000);
    expect(byTestId('lf-idle-countdown')?.textContent).toBe('4:31');
    await run(500);
    expect(byTestId('lf-idle-countdown')?.textContent).toBe('4:31');
    await run(500);
    expect(byTestId('lf-idle-countdown')?.textContent).toBe('4:30');
    // The panel's own poll is not running here; the watch asks every 30 s, not every second
    // (and once more before each notification).
    const more = server.calls.filter(c => c === 'session').length - asked;
    expect(more).toBeLessThanOrEqual(Math.ceil((600 - 270) / 30) + 2);
    // Why, in words, with the service's own words as the tooltip; the badge counts down too.
    expect(byTestId('lf-idle-why')?.textContent).toBe(
      'No activity in it for 11 minutes; the idle checker "short" stops sessions after 15 ' +
        'minutes without activity.'
    );
    expect(byTestId('lf-idle-why')?.getAttribute('title')).toMatch(
      /^idle checker short: no activity for \d+ s \(timeout 900 s\)$/
    );
    expect(byTestId('lf-section-badge-session')?.textContent).toBe('idle: stops in 4:30');
    expect(byTestId('lf-section-badge-session')?.className).toContain('lf-section-badge-warn');
  });

  it('says when it is stopped only if someone needs its resources', async () => {
    server.onlyWhenQueueWaiting = true;
    await runUntilLeft(125);
    await act(async () => {
      await store.fetch('session');
    });
    expect(byTestId('lf-idle-title')?.textContent).toBe(
      'This session will be stopped for inactivity in 2:05, but only if someone needs its resources'
    );
    expect(byTestId('lf-idle-warning')?.getAttribute('data-contention')).toBe('true');
  });

  it('"I\'m still here" posts, and the warning goes when the answer moves the deadline out', async () => {
    await runUntilLeft(200);
    expect(byTestId('lf-idle-warning')).not.toBeNull();
    const button = byTestId('lf-still-here') as HTMLButtonElement;
    expect(button.textContent).toBe("I'm still here");
    await act(async () => {
      button.click();
    });
    expect(server.calls.filter(c => c === 'stillHere')).toHaveLength(1);
    // 15 minutes from now: out of the window at once, no session request needed.
    expect(byTestId('lf-idle-warning')).toBeNull();
    expect(byTestId('lf-section-badge-session')?.textContent).toBe('RUNNING');
    // ...and back 5 minutes later, counting from the new deadline.
    await run(5 * 60_000 + 1000);
    expect(byTestId('lf-idle-countdown')?.textContent).toBe('9:59');
  });

  it('keeps the warning with a note when the answer leaves the deadline inside the window', async () => {
    server.timeout = 540; // shorter than the window: the deadline never leaves it
    await act(async () => {
      await store.fetch('session');
    });
    await runUntilLeft(100);
    expect(byTestId('lf-idle-countdown')?.textContent).toBe('1:40');
    await act(async () => {
      (byTestId('lf-still-here') as HTMLButtonElement).click();
    });
    expect(byTestId('lf-idle-countdown')?.textContent).toBe('9:00');
    expect(byTestId('lf-idle-noted')?.textContent).toBe('Noted: the idle timer started again.');
  });

  it('shows why an "I\'m still here" failed', async () => {
    server.stillHereFails = 'cannot reset the idle timer: the labfleet service did not answer';
    await runUntilLeft(200);
    await act(async () => {
      (byTestId('lf-still-here') as HTMLButtonElement).click();
    });
    expect(byTestId('lf-idle-error')?.textContent).toBe(server.stillHereFails);
    expect(byTestId('lf-idle-countdown')).not.toBeNull();
  });

  it('ignores a session answer asked for before the "I\'m still here" answer', async () => {
    await runUntilLeft(200);
    // A poll leaves with the old deadline; "I'm still here" is answered before it comes back.
    let release: (v: unknown) => void = () => undefined;
    const api = store.api as any;
    const real = api.session;
    api.session = async () => {
      const stale = await real();
      await new Promise(resolve => (release = resolve));
      return stale;
    };
    let polled: Promise<void> = Promise.resolve();
    await act(async () => {
      polled = store.fetch('session');
      await Promise.resolve();
      await store.stillHere();
    });
    api.session = real;
    await act(async () => {
      release(undefined);
      await polled;
    });
    expect(byTestId('lf-idle-warning')).toBeNull();
  });
});

describe('the idle notifications', () => {
  it('come once at 5 minutes and once at 1 minute before the deadline', async () => {
    await runUntilLeft(301);
    expect(notifier.shown).toHaveLength(0);
    await run(2000);
    expect(notifier.shown).toHaveLength(1);
    expect(notifier.shown[0].message).toMatch(
      /^This session will be stopped for inactivity in about 5 minutes \(at .+\)\.$/
    );
    expect(notifier.shown[0].options.autoClose).toBe(false);
    expect(notifier.shown[0].options.actions?.map(a => a.label)).toEqual(["I'm still here"]);
    // Ticks, polls and re-renders do not repeat it.
    await runUntilLeft(61);
    expect(notifier.shown).toHaveLength(1);
    await run(2000);
    expect(notifier.shown).toHaveLength(2);
    expect(notifier.shown[1].message).toMatch(/in about 1 minute \(at .+\)\.$/);
    // The 5-minute one is dismissed: the 1-minute one says the same, closer.
    expect(notifier.dismissed).toEqual(['n1']);
    await run(50_000);
    expect(notifier.shown).toHaveLength(2);
    expect(watch.notified).toEqual([300, 60]);
  });

  it('gives only the 1-minute one when the deadline is first seen under a minute away', async () => {
    server.timeout = 50;
    await act(async () => {
      await store.fetch('session');
    });
    await run(1000);
    expect(notifier.shown).toHaveLength(1);
    expect(notifier.shown[0].message).toMatch(/in about 1 minute/);
    await run(30_000);
    expect(notifier.shown).toHaveLength(1);
  });

  it('"I\'m still here" from a notification posts; a new deadline gets its own', async () => {
    await runUntilLeft(299);
    expect(notifier.shown).toHaveLength(1);
    await act(async () => {
      notifier.shown[0].options.actions![0].callback(new MouseEvent('click'));
    });
    expect(server.calls.filter(c => c === 'stillHere')).toHaveLength(1);
    expect(byTestId('lf-idle-warning')).toBeNull();
    expect(watch.notified).toEqual([]);
    // The new deadline, 15 minutes from the click: its own notifications, in their time.
    await run(10 * 60_000 - 2000);
    expect(notifier.shown).toHaveLength(1);
    await run(4000);
    expect(notifier.shown).toHaveLength(2);
  });

  it('says so when "I\'m still here" from a notification fails', async () => {
    server.stillHereFails = 'the labfleet service did not answer';
    await runUntilLeft(299);
    await act(async () => {
      await watch.stillHere();
    });
    expect(notifier.errors).toEqual([
      'Could not tell the labfleet service that you are still here: the labfleet service did not answer'
    ]);
  });

  it("uses JupyterLab's notifications by default", async () => {
    watch.dispose();
    Notification.manager.dismiss();
    watch = new IdleWatch(store);
    await runUntilLeft(299);
    const shown = Notification.manager.notifications;
    expect(shown).toHaveLength(1);
    expect(shown[0].type).toBe('warning');
    expect(shown[0].message).toMatch(
      /^This session will be stopped for inactivity in about 5 minutes/
    );
    expect(shown[0].options.actions?.[0].label).toBe("I'm still here");
    Notification.manager.dismiss();
  });
});

describe('the idle countdown in the status bar', () => {
  it('shows a compact countdown in the last 10 minutes only', async () => {
    const item = new UsageStatus(store.api, 5000, () => undefined, watch);
    await act(async () => {
      Widget.attach(item, document.body);
      MessageLoop.sendMessage(item, Widget.Msg.UpdateRequest);
    });
    const idle = () => item.node.querySelector('[data-testid="lf-statusbar-idle"]');
    expect(idle()).toBeNull();
    await runUntilLeft(185);
    await act(async () => MessageLoop.flush());
    expect(idle()?.textContent).toBe('idle: stops in 3:05');
    expect(idle()?.getAttribute('title')).toMatch(
      /^This session will be stopped for inactivity in 3:05\. No activity/
    );
    expect(item.node.getAttribute('aria-label')).toMatch(
      /; stopped for inactivity in about 3 min\)$/
    );
    // It ticks on its own: each tick asks for an update (Lumino runs it on the next frame).
    for (const expected of ['3:04', '3:03']) {
      await run(1000);
      await act(async () => MessageLoop.flush());
      expect(idle()?.textContent).toBe(`idle: stops in ${expected}`);
    }
    act(() => item.dispose());
  });
});

describe('idle helpers', () => {
  it('formats a countdown', () => {
    expect(formatCountdown(599.2)).toBe('10:00');
    expect(formatCountdown(272)).toBe('4:32');
    expect(formatCountdown(5)).toBe('0:05');
    expect(formatCountdown(-3)).toBe('0:00');
    expect(formatCountdown(3723)).toBe('1:02:03');
  });

  it('warns only inside the window, and says what the rule looks at', () => {
    const base = {
      idle_for: 0,
      timeout: 600,
      reclaim_at: '2026-11-24T10:10:00Z',
      checker: 'low-use',
      reason:
        'over the last 600 s: cpu_util 1.2 % < 5 %, gpu_util 0.0 % < 10 %, mem 40.0 % >= 20 %',
      only_when_queue_waiting: false
    };
    expect(idleWarning(base, 600)).toBeNull();
    expect(idleWarning(base, null)).toBeNull();
    expect(idleWarning(null, 10)).toBeNull();
    expect(idleKind(base)).toBe('utilization');
    expect(lowResources(base.reason)).toEqual(['CPU', 'GPU']);
    const w = idleWarning(base, 0)!;
    expect(w.title).toBe('This session will be stopped for inactivity at any moment');
    expect(w.why).toBe('Its CPU and GPU use is low (the idle checker "low-use").');
    expect(w.short).toBe('idle: stopping');
    const policy = idleWarning(
      { ...base, checker: 'policy:default', reason: 'no activity for 3000 s (timeout 3600 s)' },
      90
    )!;
    expect(policy.kind).toBe('activity');
    expect(policy.why).toBe(
      'No activity in it for 9 minutes; your resource policy "default" stops sessions after ' +
        '10 minutes without activity.'
    );
    // A computing kernel keeps moving the deadline: nothing to warn about.
    expect(idleWarning({ ...base, reason: 'a kernel is computing' }, 300)).toBeNull();
  });

  it('picks the notification due', () => {
    expect(idleNotificationDue(null, [])).toBeNull();
    expect(idleNotificationDue(301, [])).toBeNull();
    expect(idleNotificationDue(300, [])).toBe(300);
    expect(idleNotificationDue(200, [300])).toBeNull();
    expect(idleNotificationDue(60, [300])).toBe(60);
    expect(idleNotificationDue(30, [])).toBe(60);
    expect(idleNotificationDue(-5, [300, 60])).toBeNull();
  });
});
