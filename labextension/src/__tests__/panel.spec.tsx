/**
 * The sidebar rendered with React in jsdom from a store filled by a fake API: the hooks the
 * browser test targets exist, bars carry their values, the form shows the cost of a choice.
 */
import * as React from 'react';
import { act } from 'react';
import { createRoot, Root } from 'react-dom/client';

import { FleetAPI } from '../api';
import { FleetPanel, IFleetActions } from '../sidebar';
import { FleetStore } from '../store';

const GiB = 2 ** 30;

const DATA: Record<string, unknown> = {
  session: {
    id: 's1',
    name: 'work',
    user: 'alice',
    type: 'interactive',
    project: 'acme/ml',
    domain: 'acme',
    image: 'local',
    resource_group: 'default',
    node: 'node-1',
    status: 'RUNNING',
    slots: { cpu: 1, mem: GiB, 'gpu.shares': 0.5 },
    devices: [{ uuid: 'GPU-1', index: 0, model: 'A100-80GB', memory: 80 * GiB, shares: 0.5 }],
    mounts: [],
    created_at: null,
    started_at: null,
    uptime: 3600,
    max_lifetime: 86400,
    expires_at: null,
    time_left: 82800,
    urls: {},
    runner: null,
    inference: null,
    service: 'ok'
  },
  quota: {
    keypair: {
      limit: { cpu: 4, mem: 8 * GiB, 'gpu.shares': 1 },
      used: { cpu: 3.5, mem: GiB, 'gpu.shares': 0.5 },
      left: { cpu: 0.5, mem: 7 * GiB, 'gpu.shares': 0.5 },
      unspecified: 'UNLIMITED'
    },
    project: { limit: {}, used: { cpu: 1 }, left: { cpu: null }, unspecified: 'UNLIMITED' },
    domain: null,
    project_name: 'acme/ml'
  },
  sessions: [
    {
      id: 's1',
      name: 'work',
      project: 'acme/ml',
      type: 'interactive',
      image: 'local',
      status: 'RUNNING',
      current: true,
      url: '/user/alice/work/lab'
    },
    {
      id: 's2',
      name: '',
      project: 'acme/cv',
      type: 'batch',
      image: 'local',
      status: 'PENDING',
      queue_position: 3,
      url: null
    }
  ],
  mountedFolders: [
    {
      id: 'f1',
      name: 'data',
      owner: 'user:alice',
      permission: 'wd',
      usage_mode: 'general',
      host: 'local',
      path: 'vfolders/data',
      usage_bytes: 0,
      max_size: null,
      status: 'READY'
    }
  ],
  folders: [
    {
      id: 'f1',
      name: 'data',
      host: 'local',
      owner: 'user:alice',
      owner_kind: 'user',
      domain: 'acme',
      usage_mode: 'general',
      permission: 'wd',
      is_owner: true,
      can_manage: true,
      status: 'READY',
      auto_mount: false,
      usage: { bytes: 9 * GiB },
      limits: {
        max_size: 10 * GiB,
        scope: {
          kind: 'user',
          name: 'alice',
          used: 9 * GiB,
          limit: null,
          folders: 1,
          max_folders: 5
        }
      },
      rights: ['create-vfolder', 'invite-others']
    }
  ],
  invitations: [
    {
      id: 'i1',
      vfolder: 'f9',
      vfolder_name: 'shared-models',
      inviter: 'bob',
      invitee: 'alice',
      permission: 'ro',
      state: 'pending',
      created_at: null
    }
  ],
  apps: [
    {
      name: 'tensorboard',
      title: 'TensorBoard',
      url: '/user/alice/work/tensorboard/',
      source: 'launcher'
    }
  ],
  launchOptions: {
    user: 'alice',
    projects: [{ name: 'acme/ml', left: { cpu: 0.5, mem: 7 * GiB, gpu: null, 'gpu.shares': 0.5 } }],
    images: [
      {
        name: 'local',
        display_name: 'Local',
        min_slots: {},
        accelerators: [],
        projects: ['acme/ml']
      }
    ],
    resource_groups: [
      {
        name: 'a100',
        description: null,
        session_types: ['interactive'],
        free_now: { alive_nodes: 2, nodes: 2, cpu: 16, mem: 64 * GiB, gpu: 2, 'gpu.shares': 1 }
      },
      {
        name: 'default',
        description: null,
        session_types: ['interactive', 'batch'],
        free_now: { alive_nodes: 1, nodes: 1, cpu: 3, mem: 5 * GiB, gpu: 0, 'gpu.shares': 0.5 }
      }
    ],
    vfolders: [
      {
        id: 'f1',
        name: 'data',
        owner: 'user:alice',
        permission: 'wd',
        usage_mode: 'general',
        host: 'local',
        auto: false,
        mountable: true
      }
    ]
  },
  storageHosts: [],
  // A new user: nothing used yet (usage.spec.tsx plots real numbers).
  myUsage: { user: 'alice', now: '2026-11-24T10:00:00+00:00', periods: [], daily: [] }
};

function fakeApi(): FleetAPI {
  const api = Object.create(FleetAPI.prototype) as FleetAPI;
  for (const name of Object.keys(DATA)) {
    (api as any)[name] = async () => DATA[name];
  }
  return api;
}

const actions: IFleetActions = {
  stopThisSession: jest.fn(async () => undefined),
  stopSession: jest.fn(async () => undefined),
  openSession: jest.fn(),
  openFolder: jest.fn(),
  openApp: jest.fn()
};

let container: HTMLDivElement;
let root: Root;
let store: FleetStore;

function render(): void {
  act(() => {
    root.render(<FleetPanel store={store} actions={actions} onRefresh={() => undefined} />);
  });
}

const byTestId = (id: string) => container.querySelector(`[data-testid="${id}"]`);

beforeAll(() => {
  (globalThis as any).IS_REACT_ACT_ENVIRONMENT = true;
});

beforeEach(async () => {
  container = document.createElement('div');
  document.body.appendChild(container);
  root = createRoot(container);
  // A stopped clock: the time left does not count down during the test.
  store = new FleetStore(fakeApi(), { user: 'alice', serverName: 'work', now: () => 1000 });
  await store.refresh();
  store.changed.connect(render);
  render();
});

afterEach(() => {
  act(() => root.unmount());
  container.remove();
});

describe('FleetPanel', () => {
  it('shows this session with its device share', () => {
    expect(byTestId('lf-this-project')?.textContent).toBe('acme/ml');
    expect(byTestId('lf-this-devices')?.textContent).toBe('0.5 of GPU 0 (A100-80GB)');
    expect(byTestId('lf-this-resources')?.textContent).toBe('1 core, 1 GiB, 0.5 GPU in default');
    expect(byTestId('lf-this-time-left')?.textContent).toBe('23h');
  });

  it('asks the app to stop this session', () => {
    act(() => (byTestId('lf-stop-this') as HTMLButtonElement).click());
    expect(actions.stopThisSession).toHaveBeenCalled();
  });

  it('draws quota bars that warn near the limit', () => {
    const cpu = byTestId('lf-quota-keypair-cpu');
    const bar = cpu?.querySelector('[role="progressbar"]');
    expect(bar?.getAttribute('aria-valuenow')).toBe('88');
    expect(bar?.getAttribute('data-level')).toBe('warn');
    expect(byTestId('lf-quota-project-cpu')?.querySelector('.lf-bar')?.className).toContain(
      'lf-level-unlimited'
    );
  });

  it("shows beside the quota what the fleet can give now, this session's group first", () => {
    const free = byTestId('lf-quota-free');
    const lines = [...(free?.querySelectorAll('[data-group]') ?? [])].map(l => l.textContent);
    expect(lines).toEqual([
      "Free now in default (this session's group): 3 cores, 5 GiB, 0 whole GPUs, up to 0.5 of one GPU",
      'Free now in a100: 16 cores, 64 GiB, 2 whole GPUs, up to 1 of one GPU'
    ]);
    expect(byTestId('lf-quota-free-default')?.getAttribute('data-own')).toBe('true');
    expect(byTestId('lf-quota')?.contains(free ?? null)).toBe(true);
  });

  it('lists sessions with the queue position', () => {
    expect(
      byTestId('lf-session-~')?.querySelector('[data-testid="lf-session-status"]')?.textContent
    ).toBe('PENDING (#3 in queue)');
    // This session has no "Open" (it is open) but can be stopped.
    expect(
      byTestId('lf-session-work')?.querySelector('[data-testid="lf-session-open"]')
    ).toBeNull();
  });

  it('shows folders, opens a mounted one and lists an invitation', () => {
    const folder = byTestId('lf-folder-data');
    expect(folder?.getAttribute('data-mounted')).toBe('true');
    expect(folder?.querySelector('[role="progressbar"]')?.getAttribute('data-level')).toBe('warn');
    act(() =>
      (folder?.querySelector('[data-testid="lf-folder-open"]') as HTMLButtonElement).click()
    );
    expect(actions.openFolder).toHaveBeenCalledWith('vfolders/data');
    expect(byTestId('lf-invitation-shared-models')?.textContent).toContain('bob invites you');
  });

  it('opens apps', () => {
    act(() => (byTestId('lf-app-tensorboard') as HTMLButtonElement).click());
    expect(actions.openApp).toHaveBeenCalledWith(expect.objectContaining({ name: 'tensorboard' }));
  });

  it('shows what a new session costs before it is sent', async () => {
    await act(async () => {
      store.newSessionOpen = true;
      await store.loadLaunchOptions();
    });
    expect(byTestId('lf-new-session-form')).not.toBeNull();
    expect((byTestId('lf-ns-name') as HTMLInputElement).value).toBe('session-1');
    // The defaults ask 1 core of the 0.5 left: over the quota.
    expect(byTestId('lf-cost-cpu')?.className).toContain('lf-cost-over');
    expect(byTestId('lf-ns-over-quota')).not.toBeNull();
    expect(byTestId('lf-cost-mem')?.className).toContain('lf-cost-fits');
  });

  it('has a Usage section that says when there is no usage yet', () => {
    expect(byTestId('lf-section-toggle-usage')?.getAttribute('aria-expanded')).toBe('true');
    expect(byTestId('lf-usage-empty')?.textContent).toContain('No usage yet');
  });

  it('collapses a section', () => {
    act(() => (byTestId('lf-section-toggle-apps') as HTMLButtonElement).click());
    expect(byTestId('lf-section-toggle-apps')?.getAttribute('aria-expanded')).toBe('false');
    expect(byTestId('lf-apps')).toBeNull();
  });
});
