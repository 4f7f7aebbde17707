/** The sidebar's state against a fake API: what it asks, what it keeps when a request fails. */
import { FleetAPI, LabfleetError } from '../api';
import { FleetStore, LAUNCH_OPTIONS_MIN_AGE_MS } from '../store';

type Handler = (...args: any[]) => Promise<unknown>;

/** A FleetAPI whose methods are the given handlers; every call is logged by name. */
function fakeApi(handlers: Record<string, Handler>): { api: FleetAPI; log: string[] } {
  const log: string[] = [];
  const api = Object.create(FleetAPI.prototype) as FleetAPI;
  const names = [
    'announcement',
    'session',
    'usage',
    'myUsage',
    'mountedFolders',
    'quota',
    'apps',
    'sessions',
    'startSession',
    'stopSession',
    'launchOptions',
    'folders',
    'createFolder',
    'invite',
    'invitations',
    'answerInvitation',
    'storageHosts',
    'stillHere',
    'endpoints',
    'startImport',
    'getImport'
  ];
  for (const name of names) {
    (api as any)[name] = (...args: unknown[]) => {
      log.push(args.length ? `${name}(${args.map(a => JSON.stringify(a)).join(',')})` : name);
      return (handlers[name] ?? (async () => []))(...args);
    };
  }
  return { api, log };
}

const SESSION = {
  id: 's1',
  name: 'work',
  user: 'alice',
  type: 'interactive',
  project: 'acme/ml',
  domain: 'acme',
  time_left: 100,
  uptime: 10
};

describe('FleetStore', () => {
  it('asks what the open sections show, side by side', async () => {
    const { api, log } = fakeApi({ session: async () => SESSION });
    const store = new FleetStore(api, { user: 'alice', serverName: 'work' });
    let changes = 0;
    store.changed.connect(() => changes++);
    await store.refresh();
    expect(log.sort()).toEqual(
      [
        'announcement',
        'apps',
        'endpoints',
        'folders',
        'invitations',
        // The Quota section shows what the fleet can give now beside what the quota allows.
        'launchOptions("alice")',
        'mountedFolders',
        'myUsage',
        'quota',
        'session',
        'sessions'
      ].sort()
    );
    expect(store.data.session?.project).toBe('acme/ml');
    expect(changes).toBe(11);
  });

  it('asks the launch options with the quota, at most every 30 s, and again after a start', async () => {
    let now = 1000;
    const { api, log } = fakeApi({ session: async () => SESSION });
    const store = new FleetStore(api, { user: 'alice', serverName: 'work', now: () => now });
    const launchOptions = () => log.filter(l => l.startsWith('launchOptions')).length;
    await store.refresh();
    expect(launchOptions()).toBe(1);
    now += 5000; // the next ticks of the poll: the quota each time, the launch options not yet
    await store.refresh();
    expect(log.filter(l => l === 'quota').length).toBe(2);
    expect(launchOptions()).toBe(1);
    now += LAUNCH_OPTIONS_MIN_AGE_MS;
    await store.refresh();
    expect(launchOptions()).toBe(2);
    // A start takes from what is free: the next tick asks again.
    await store.startSession('exp', { project: 'acme/ml', type: 'interactive' });
    expect(launchOptions()).toBe(2);
    now += 5000;
    await store.refresh();
    expect(launchOptions()).toBe(3);
    // With the Quota section closed, the poll does not ask for them.
    store.toggle('quota', false);
    now += LAUNCH_OPTIONS_MIN_AGE_MS;
    await store.refresh();
    expect(launchOptions()).toBe(3);
  });

  it('stops asking for a closed section', async () => {
    const { api, log } = fakeApi({ session: async () => SESSION });
    const store = new FleetStore(api, { user: 'alice', serverName: 'work' });
    await store.refresh();
    store.toggle('folders');
    store.toggle('apps');
    store.toggle('quota');
    store.toggle('usage');
    store.toggle('serving');
    log.length = 0;
    await store.refresh();
    expect(log.sort()).toEqual(['announcement', 'session', 'sessions']);
    expect(store.isOpen('folders')).toBe(false);
  });

  it("keeps the last good answer and the failure's words", async () => {
    let fail = false;
    const { api } = fakeApi({
      session: async () => SESSION,
      quota: async () => {
        if (fail) {
          throw new LabfleetError('the labfleet service did not answer', 502);
        }
        return { keypair: null, project: null, domain: null, project_name: 'acme/ml' };
      }
    });
    const store = new FleetStore(api, { user: 'alice', serverName: 'work' });
    await store.refresh();
    expect(store.errors.quota).toBeUndefined();
    fail = true;
    await store.refresh();
    expect(store.errors.quota).toBe('the labfleet service did not answer');
    expect(store.data.quota?.project_name).toBe('acme/ml');
    fail = false;
    await store.refresh();
    expect(store.errors.quota).toBeUndefined();
  });

  it('asks launch options for the user the session names', async () => {
    const { api, log } = fakeApi({
      session: async () => ({ ...SESSION, user: 'alice@example.org' })
    });
    const store = new FleetStore(api, { user: '', serverName: 'work' });
    await store.fetch('session');
    store.newSessionOpen = true;
    await store.loadLaunchOptions();
    expect(log).toContain('launchOptions("alice@example.org")');
    expect(store.isOpen('sessions')).toBe(true);
  });

  it('refreshes sessions and quota after a start, and lets a refusal through', async () => {
    const { api, log } = fakeApi({
      startSession: async (name: string) => {
        if (name === 'big') {
          throw new LabfleetError('keypair quota: 0 GPU left, this asks 1', 403);
        }
        return { name };
      }
    });
    const store = new FleetStore(api, { user: 'alice', serverName: 'work' });
    await store.startSession('exp', { project: 'acme/ml', type: 'interactive' });
    expect(log).toEqual([
      'startSession("exp",{"project":"acme/ml","type":"interactive"})',
      'sessions',
      'quota'
    ]);
    await expect(
      store.startSession('big', { project: 'acme/ml', type: 'interactive', gpu: '1' })
    ).rejects.toThrow('keypair quota: 0 GPU left, this asks 1');
  });

  it('stops this session by its own server name', async () => {
    const { api, log } = fakeApi({});
    const store = new FleetStore(api, { user: 'alice', serverName: '' });
    await store.stopThisSession();
    expect(log).toEqual(['stopSession("")']);
  });

  it('refreshes folders and invitations after answering one', async () => {
    const { api, log } = fakeApi({});
    const store = new FleetStore(api, { user: 'bob', serverName: 'work' });
    await store.answerInvitation('i-1', true);
    expect(log.sort()).toEqual(['answerInvitation("i-1",true)', 'folders', 'invitations']);
  });

  it("counts the idle deadline on the server's clock", async () => {
    // The page's clock is 2 minutes behind the server's: started 100 s before the server's now.
    const serverNow = Date.parse('2026-11-24T10:00:00Z');
    let now = serverNow - 120_000;
    const idle = {
      idle_for: 60,
      timeout: 540,
      reclaim_at: '2026-11-24T10:08:00Z',
      checker: 'short',
      reason: 'no activity for 60 s (timeout 540 s)'
    };
    const { api } = fakeApi({
      session: async () => ({
        ...SESSION,
        started_at: new Date(serverNow - 100_000).toISOString(),
        uptime: Math.floor((now + 120_000 - (serverNow - 100_000)) / 1000),
        idle
      })
    });
    const store = new FleetStore(api, { user: 'alice', serverName: 'work', now: () => now });
    await store.fetch('session');
    // `uptime` is whole seconds: within a second.
    expect(Math.abs(store.clockOffset - 120_000)).toBeLessThanOrEqual(1000);
    expect(Math.abs(store.idleSecondsLeft()! - 480)).toBeLessThanOrEqual(1);
    now += 30_000;
    expect(Math.abs(store.idleSecondsLeft()! - 450)).toBeLessThanOrEqual(1);
    // A later answer a fraction of a second off does not move the offset (no jumps).
    const before = store.clockOffset;
    now += 400;
    await store.fetch('session');
    expect(store.clockOffset).toBe(before);
  });

  it('keeps the idle deadline while the service does not answer', async () => {
    const idle = {
      idle_for: 60,
      timeout: 540,
      reclaim_at: '2026-11-24T10:08:00Z',
      checker: 'short',
      reason: 'no activity for 60 s (timeout 540 s)'
    };
    let service = 'ok';
    const { api } = fakeApi({
      session: async () => ({ ...SESSION, idle: service === 'ok' ? idle : null, service })
    });
    const store = new FleetStore(api, { user: 'alice', serverName: 'work' });
    await store.fetch('session');
    service = 'the labfleet service did not answer';
    await store.fetch('session');
    expect(store.data.session?.idle?.reclaim_at).toBe(idle.reclaim_at);
    // An answer from the service without one: none planned.
    service = 'ok';
    idle.reclaim_at = null as unknown as string;
    await store.fetch('session');
    expect(store.idleSecondsLeft()).toBeNull();
  });

  it('"I\'m still here" replaces the idle object and keeps a failure\'s words', async () => {
    let fail = false;
    const answer = { idle_for: 0, timeout: 540, reclaim_at: '2026-11-24T10:09:00Z' };
    const { api, log } = fakeApi({
      session: async () => ({
        ...SESSION,
        idle: { ...answer, reclaim_at: '2026-11-24T10:01:00Z' }
      }),
      stillHere: async () => {
        if (fail) {
          throw new LabfleetError('cannot reset the idle timer: no', 409);
        }
        return answer;
      }
    });
    const store = new FleetStore(api, { user: 'alice', serverName: 'work' });
    await store.fetch('session');
    await expect(store.stillHere()).resolves.toEqual(answer);
    expect(store.data.session?.idle?.reclaim_at).toBe('2026-11-24T10:09:00Z');
    expect(log).toEqual(['session', 'stillHere']);
    fail = true;
    await expect(store.stillHere()).rejects.toThrow('cannot reset the idle timer: no');
    expect(store.stillHereError).toBe('cannot reset the idle timer: no');
    expect(store.stillHerePending).toBe(false);
  });

  it('counts time from when the session answered', async () => {
    let now = 1000;
    const { api } = fakeApi({ session: async () => SESSION });
    const store = new FleetStore(api, { user: 'alice', serverName: 'work', now: () => now });
    await store.fetch('session');
    now = 4000;
    expect((store.now() - store.sessionReceivedAt) / 1000).toBe(3);
  });

  it('opens the new-session and new-folder forms, their sections too, and says once to scroll', () => {
    const { api } = fakeApi({});
    const store = new FleetStore(api, { user: 'alice', serverName: 'work' });
    store.toggle('sessions', false);
    store.toggle('folders', false);
    store.showNewSession();
    expect(store.isOpen('sessions')).toBe(true);
    expect(store.newSessionOpen).toBe(true);
    expect(store.takeReveal('new-folder')).toBe(false);
    expect(store.takeReveal('new-session')).toBe(true);
    expect(store.takeReveal('new-session')).toBe(false);
    store.showNewFolder();
    expect(store.isOpen('folders')).toBe(true);
    expect(store.newFolderOpen).toBe(true);
    expect(store.takeReveal('new-folder')).toBe(true);
  });

  it('opens the Start section for an import and says once to scroll to it', () => {
    const { api } = fakeApi({});
    const store = new FleetStore(api, { user: 'alice', serverName: 'work' });
    store.toggle('start', false);
    let changes = 0;
    store.changed.connect(() => changes++);
    store.showImport();
    expect(store.isOpen('start')).toBe(true);
    expect(changes).toBeGreaterThan(0);
    // Neither form elsewhere opens.
    expect(store.newSessionOpen).toBe(false);
    expect(store.newFolderOpen).toBe(false);
    expect(store.takeReveal('new-session')).toBe(false);
    expect(store.takeReveal('import')).toBe(true);
    expect(store.takeReveal('import')).toBe(false);
    // Asked again while the section is open: it scrolls again.
    store.showImport();
    expect(store.isOpen('start')).toBe(true);
    expect(store.takeReveal('import')).toBe(true);
  });

  it("lists my folders again when an import ends, and asks nothing on the Start section's account", async () => {
    const done = {
      id: 'j1',
      status: 'done',
      folder: { id: 'f7', name: 'repo' },
      report: { updated: [], kept: [], renamed: [] }
    };
    const { api, log } = fakeApi({ session: async () => SESSION, startImport: async () => done });
    const store = new FleetStore(api, { user: 'alice', serverName: 'work' });
    for (const s of [
      'session',
      'quota',
      'usage',
      'sessions',
      'folders',
      'apps',
      'serving'
    ] as const) {
      store.toggle(s, false);
    }
    await store.refresh();
    log.length = 0;
    await store.refresh();
    expect(log).toEqual(['announcement']);
    log.length = 0;
    await store.imports.start({ url: 'https://example.org/r.git' });
    await new Promise(resolve => setTimeout(resolve, 0));
    expect(log).toEqual(['startImport({"url":"https://example.org/r.git"})', 'folders']);
    expect(store.imports.job?.status).toBe('done');
  });
});
