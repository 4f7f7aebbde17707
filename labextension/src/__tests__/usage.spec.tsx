/**
 * The "Usage" section rendered with React in jsdom from sample answers of
 * `GET labfleet/api/usage/me`: the plots carry their numbers (hours), a refusal or an
 * unreachable service shows its message, an empty history says so.
 */
import * as React from 'react';
import { act } from 'react';
import { createRoot, Root } from 'react-dom/client';

import { FleetAPI, LabfleetError } from '../api';
import { Usage } from '../components/Usage';
import { FleetPanel, IFleetActions } from '../sidebar';
import { FleetStore } from '../store';
import type { IMyUsage, IUsageFigures } from '../types';
import {
  formatDay,
  formatHours,
  hasUsage,
  niceMax,
  usageDays,
  usageEfficiency,
  usagePeriodBars
} from '../usage';

const H = 3600;
const GiB = 2 ** 30;

/** Figures of `gpu` / `cpu` hours allocated and used. */
function figures(sessions: number, gpu: [number, number], cpu: [number, number]): IUsageFigures {
  const eff = (a: number, u: number) => (a > 0 ? u / a : null);
  return {
    sessions,
    allocated: { cpu: cpu[0] * H, mem: cpu[0] * H * GiB, 'gpu.shares': gpu[0] * H },
    used: {
      cpu: cpu[1] * H,
      mem: cpu[1] * H * GiB,
      mem_peak: sessions ? 2 * GiB : 0,
      'gpu.shares': gpu[1] * H,
      gpu_mem_peak: sessions && gpu[0] ? GiB : 0
    },
    efficiency: {
      cpu: eff(cpu[0], cpu[1]),
      mem: eff(cpu[0], cpu[1]),
      'gpu.shares': eff(gpu[0], gpu[1])
    }
  };
}

/** 30 days from 2026-10-26 to 2026-11-24, oldest first; work on three of them. */
function sample(): IMyUsage {
  const daily = [];
  for (let i = 0; i < 30; i++) {
    const day = new Date(Date.UTC(2026, 9, 26 + i)).toISOString().slice(0, 10);
    const f =
      i === 29
        ? figures(1, [1, 0.5], [2, 1]) // today: half a GPU for 2 hours, 0.5 GPU-h of it used
        : i === 27
          ? figures(2, [2.5, 0.75], [4, 3])
          : i === 10
            ? figures(1, [4, 3], [8, 2])
            : figures(0, [0, 0], [0, 0]);
    daily.push({ bucket: `${day}T00:00:00+00:00`, ...f });
  }
  return {
    user: 'alice',
    now: '2026-11-24T10:00:00+00:00',
    periods: [
      {
        key: '7d',
        label: 'last 7 days',
        start: '2026-11-17T10:00:00+00:00',
        end: '2026-11-24T10:00:00+00:00',
        ...figures(3, [3.5, 1.25], [6, 4])
      },
      {
        key: '30d',
        label: 'last 30 days',
        start: '2026-10-25T10:00:00+00:00',
        end: '2026-11-24T10:00:00+00:00',
        ...figures(4, [7.5, 4.25], [14, 6])
      },
      {
        key: 'month',
        label: 'November 2026',
        start: '2026-11-01T00:00:00+00:00',
        end: '2026-11-24T10:00:00+00:00',
        ...figures(3, [3.5, 1.25], [6, 4])
      }
    ],
    daily
  };
}

/** An answer with nothing in it: a new user. */
function nothing(): IMyUsage {
  const u = sample();
  const zero = figures(0, [0, 0], [0, 0]);
  return {
    ...u,
    periods: u.periods.map(p => ({ ...p, ...zero })),
    daily: u.daily.map(d => ({ ...d, ...zero }))
  };
}

let answer: () => Promise<IMyUsage>;

function fakeApi(): FleetAPI {
  const api = Object.create(FleetAPI.prototype) as FleetAPI;
  (api as any).myUsage = () => answer();
  for (const name of ['session', 'quota', 'sessions', 'mountedFolders', 'apps']) {
    (api as any)[name] = async () => (name === 'session' ? { user: 'alice' } : null);
  }
  (api as any).folders = async () => [];
  (api as any).invitations = async () => [];
  return api;
}

let container: HTMLDivElement;
let root: Root;
let store: FleetStore;
let clock: number;

const byTestId = (id: string) => container.querySelector(`[data-testid="${id}"]`);

async function show(): Promise<void> {
  await act(async () => {
    await store.fetch('usage');
    root.render(<Usage store={store} />);
  });
}

beforeAll(() => {
  (globalThis as any).IS_REACT_ACT_ENVIRONMENT = true;
});

beforeEach(() => {
  container = document.createElement('div');
  document.body.appendChild(container);
  root = createRoot(container);
  clock = 1_000_000;
  store = new FleetStore(fakeApi(), { user: 'alice', serverName: 'work', now: () => clock });
  answer = async () => sample();
});

afterEach(() => {
  act(() => root.unmount());
  container.remove();
});

describe('usage helpers', () => {
  it('turns slot-seconds into hours per period and day', () => {
    const u = sample();
    const gpu = usagePeriodBars(u, 'gpu.shares');
    expect(gpu.map(b => [b.key, b.label, b.allocated, b.used, b.sessions])).toEqual([
      ['7d', '7 days', 3.5, 1.25, 3],
      ['30d', '30 days', 7.5, 4.25, 4]
    ]);
    expect(gpu[0].efficiency).toBeCloseTo(1.25 / 3.5);
    const days = usageDays(u, 'cpu');
    expect(days).toHaveLength(30);
    expect(days[29]).toEqual({ day: '2026-11-24T00:00:00+00:00', allocated: 2, used: 1 });
    expect(hasUsage(u)).toBe(true);
    expect(hasUsage(nothing())).toBe(false);
    expect(hasUsage(null)).toBe(false);
  });

  it('computes efficiency where the API gave none, and none without an allocation', () => {
    const f = figures(1, [2, 1], [0, 0]);
    f.efficiency = {};
    expect(usageEfficiency(f, 'gpu.shares')).toBe(0.5);
    expect(usageEfficiency(f, 'cpu')).toBeNull();
  });

  it('formats hours, days and the top of a scale', () => {
    expect([0, 0.0001, 0.004, 0.075, 0.25, 3.5, 12.34, 140.4].map(formatHours)).toEqual([
      '0 h',
      '< 1 s',
      '14 s',
      '4.5 min',
      '0.25 h',
      '3.5 h',
      '12.3 h',
      '140 h'
    ]);
    expect(formatDay('2026-11-03T00:00:00+00:00')).toBe('Nov 3');
    expect(formatDay('2026-12-31T00:00:00-05:00')).toBe('Dec 31'); // as written, no time zone
    expect([0, 0.3, 1, 3.4, 4, 7, 12, 200].map(niceMax)).toEqual([1, 0.5, 1, 5, 5, 10, 20, 200]);
  });
});

describe('Usage section', () => {
  it('plots GPU- and CPU-hours, allocated against used, for 7 and 30 days', async () => {
    await show();
    const gpu7 = byTestId('lf-usage-gpu-7d');
    expect(gpu7?.getAttribute('data-allocated')).toBe('3.5');
    expect(gpu7?.getAttribute('data-used')).toBe('1.25');
    expect(gpu7?.getAttribute('role')).toBe('img');
    expect(gpu7?.getAttribute('aria-label')).toBe(
      'GPU-hours, last 7 days: 1.25 h used of 3.5 h allocated (36%); 3 sessions'
    );
    expect(byTestId('lf-usage-gpu-7d-allocated')?.textContent).toBe('3.5 h');
    expect(byTestId('lf-usage-gpu-7d-used')?.textContent).toBe('1.25 h');
    expect(byTestId('lf-usage-gpu-7d-efficiency')?.textContent).toBe('36% used');
    expect(byTestId('lf-usage-gpu-30d-allocated')?.textContent).toBe('7.5 h');
    expect(byTestId('lf-usage-cpu-30d-used')?.textContent).toBe('6 h');
    expect(byTestId('lf-usage-cpu-7d-efficiency')?.textContent).toBe('67% used');
    // The bars share a scale: the longest (30 days allocated) fills its row.
    const widths = (id: string) =>
      [...(byTestId(id)?.querySelectorAll('.lf-usage-fill') ?? [])].map(r =>
        Number(r.getAttribute('width'))
      );
    expect(widths('lf-usage-gpu-30d')).toEqual([100, (4.25 / 7.5) * 100]);
    expect(widths('lf-usage-gpu-7d')).toEqual([(3.5 / 7.5) * 100, (1.25 / 7.5) * 100]);
    expect(byTestId('lf-usage-empty')).toBeNull();
    expect(byTestId('lf-error-usage')).toBeNull();
  });

  it('draws a bar a day for the last 30 days', async () => {
    await show();
    const chart = byTestId('lf-usage-gpu-daily');
    const days = [...(chart?.querySelectorAll('[data-testid="lf-usage-day"]') ?? [])];
    expect(days).toHaveLength(30);
    expect(days[0].getAttribute('data-day')).toBe('2026-10-26T00:00:00+00:00');
    expect(days[10].getAttribute('data-allocated')).toBe('4');
    expect(days[10].getAttribute('data-used')).toBe('3');
    expect(days[10].querySelector('title')?.textContent).toBe('Nov 5: 4 h allocated, 3 h used');
    // The scale goes to 5 h: 4 h allocated is 38.4 of the chart's 48 px, 3 h used 28.8.
    expect(byTestId('lf-usage-gpu-daily-top')?.textContent).toBe('5 h');
    const rect = (g: Element, cls: string) => g.querySelector(`.${cls}`) as SVGRectElement;
    expect(Number(rect(days[10], 'lf-usage-day-allocated').getAttribute('height'))).toBeCloseTo(
      38.4
    );
    expect(Number(rect(days[10], 'lf-usage-day-used').getAttribute('height'))).toBeCloseTo(28.8);
    expect(Number(rect(days[0], 'lf-usage-day-allocated').getAttribute('height'))).toBe(0);
    expect(chart?.textContent).toContain('Oct 26');
    expect(chart?.textContent).toContain('Nov 24');
    expect(chart?.querySelector('svg')?.getAttribute('aria-label')).toBe(
      'GPU-hours per day, Oct 26 to Nov 24: 7.5 h allocated, 4.25 h used; the scale goes to 5 h'
    );
    expect(byTestId('lf-usage-cpu-daily-top')?.textContent).toBe('10 h');
  });

  it('says when there was no GPU time', async () => {
    answer = async () => {
      const u = sample();
      for (const f of [...u.periods, ...u.daily]) {
        f.allocated['gpu.shares'] = 0;
        f.used['gpu.shares'] = 0;
      }
      return u;
    };
    await show();
    expect(byTestId('lf-usage-gpu-none')?.textContent).toBe('No GPU time in the last 30 days.');
    expect(byTestId('lf-usage-gpu-7d')).toBeNull();
    expect(byTestId('lf-usage-cpu-7d')).not.toBeNull();
  });

  it('says when there is no usage yet', async () => {
    answer = async () => nothing();
    await show();
    expect(byTestId('lf-usage-empty')?.textContent).toContain('No usage yet');
    expect(byTestId('lf-usage-gpu')).toBeNull();
  });

  it("shows the service's refusal instead of plots", async () => {
    answer = async () => {
      throw new LabfleetError('you may only see your own usage', 403);
    };
    await show();
    expect(byTestId('lf-error-usage')?.textContent).toBe('you may only see your own usage');
    expect(byTestId('lf-error-usage')?.getAttribute('role')).toBe('alert');
    expect(byTestId('lf-usage-gpu')).toBeNull();
    expect(container.textContent).not.toContain('Loading');
  });

  it('keeps the last plots when the service becomes unreachable, and clears the error after', async () => {
    await show();
    answer = async () => {
      throw new LabfleetError(
        'cannot reach the labfleet service at http://127.0.0.1:8090: Connection refused',
        502
      );
    };
    await show();
    expect(byTestId('lf-error-usage')?.textContent).toContain('cannot reach the labfleet service');
    expect(byTestId('lf-usage-gpu-7d')?.getAttribute('data-used')).toBe('1.25');
    // Shown as the last numbers, dimmed, until the service answers again.
    expect(container.querySelector('.lf-usage-plots')?.className).toContain('lf-stale');
    answer = async () => sample();
    await show();
    expect(byTestId('lf-error-usage')).toBeNull();
    expect(container.querySelector('.lf-usage-plots')?.className).not.toContain('lf-stale');
  });
});

describe('Usage in the panel', () => {
  const actions: IFleetActions = {
    stopThisSession: jest.fn(async () => undefined),
    stopSession: jest.fn(async () => undefined),
    openSession: jest.fn(),
    openFolder: jest.fn(),
    openApp: jest.fn()
  };

  it('is a section of the sidebar, asked for at most once a minute by the poll', async () => {
    const asked: number[] = [];
    answer = async () => {
      asked.push(clock);
      return sample();
    };
    await act(async () => {
      await store.refresh();
      root.render(<FleetPanel store={store} actions={actions} onRefresh={() => undefined} />);
    });
    expect(byTestId('lf-section-toggle-usage')?.textContent).toBe('Usage');
    expect(byTestId('lf-usage-cpu-30d')?.getAttribute('data-allocated')).toBe('14');
    clock += 5_000;
    await store.refresh();
    expect(asked).toHaveLength(1); // 5 s later: not asked again
    clock += 60_000;
    await store.refresh();
    expect(asked).toHaveLength(2);
    store.invalidate(); // the refresh button
    await store.refresh();
    expect(asked).toHaveLength(3);
  });
});
