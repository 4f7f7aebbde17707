/**
 * The sidebar rendered with React in jsdom from a store filled by a fake API: the hooks the
 * browser test targets exist, bars carry their values, the form shows the cost of a choice.
 */
import * as React from 'react';
import { act } from 'react';
import { createRoot, Root } from 'react-dom/client';

import { FleetAPI, LabfleetError } from '../api';
import { hubLocation } from '../imports';
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
  openApp: jest.fn(),
  openPath: jest.fn(),
  openTab: jest.fn()
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
  store = new FleetStore(fakeApi(), {
    user: 'alice',
    serverName: 'work',
    now: () => 1000,
    hub: hubLocation('', '/hub/', 'https://hub.example.org')
  });
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

/** An import job as the service answers it. */
function importJob(extra: Record<string, unknown>): Record<string, unknown> {
  return {
    id: 'j1',
    url: 'https://example.org/org/repo.git',
    kind: 'repository',
    status: 'done',
    message: 'cloned 3 files',
    folder: { id: 'f7', name: 'repo' },
    path: 'intro.ipynb',
    resync: false,
    report: { updated: [], kept: [], renamed: [] },
    ...extra
  };
}

function type(testid: string, value: string): void {
  const input = byTestId(testid) as HTMLInputElement;
  act(() => {
    // React tracks the value: set it through the prototype's setter, then say it changed.
    Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value')?.set?.call(input, value);
    input.dispatchEvent(new Event('input', { bubbles: true }));
  });
}

async function submitImport(answer: () => Promise<unknown>): Promise<jest.Mock> {
  const start = jest.fn(answer);
  (store.api as any).startImport = start;
  type('lf-import-url', 'https://example.org/org/repo.git');
  await act(async () => {
    (byTestId('lf-import-submit') as HTMLButtonElement).click();
  });
  return start;
}

describe('the Start section', () => {
  it('comes first, open, with the import form and the ways to the other forms', () => {
    const sections = [...container.querySelectorAll('section.lf-section')].map(s =>
      s.getAttribute('data-testid')
    );
    expect(sections[0]).toBe('lf-section-start');
    expect(byTestId('lf-section-toggle-start')?.getAttribute('aria-expanded')).toBe('true');
    expect(byTestId('lf-import-form')).not.toBeNull();
    expect((byTestId('lf-import-submit') as HTMLButtonElement).disabled).toBe(true);
    // My writable folders are the choices beside a new one.
    const options = [...(byTestId('lf-import-folder') as HTMLSelectElement).options].map(
      o => o.textContent
    );
    expect(options).toEqual(['a new folder', 'data']);
  });

  it("shows a refusal in the service's words", async () => {
    const start = await submitImport(async () => {
      throw new LabfleetError(
        'url: file scheme; an import fetches only https, http, git URLs',
        400
      );
    });
    expect(start).toHaveBeenCalledWith({ url: 'https://example.org/org/repo.git' });
    expect(byTestId('lf-import-error')?.textContent).toBe(
      'url: file scheme; an import fetches only https, http, git URLs'
    );
    expect(byTestId('lf-import-job')).toBeNull();
  });

  it('opens the result here when this session mounts the folder', async () => {
    type('lf-import-open-path', 'intro.ipynb');
    await submitImport(async () =>
      importJob({
        folder: { id: 'f1', name: 'data' },
        resync: true,
        report: { updated: ['a.py'], kept: ['intro.ipynb'], renamed: ['b.py'] }
      })
    );
    expect(byTestId('lf-import-job')?.getAttribute('data-status')).toBe('done');
    expect(byTestId('lf-import-status')?.textContent).toBe('Re-synced in folder data');
    expect(byTestId('lf-import-message')?.textContent).toBe('cloned 3 files');
    expect(byTestId('lf-import-report-counts')?.textContent).toBe('1 updated, 1 kept, 1 renamed');
    expect(byTestId('lf-import-kept')?.textContent).toContain('intro.ipynb');
    expect(byTestId('lf-import-open-session')).toBeNull();
    act(() => (byTestId('lf-import-open') as HTMLButtonElement).click());
    expect(actions.openPath).toHaveBeenCalledWith('vfolders/data/intro.ipynb');
  });

  it("else opens the Hub's import page, which finds or starts a session that mounts it", async () => {
    await submitImport(async () => importJob({}));
    expect(byTestId('lf-import-status')?.textContent).toBe('Imported into folder repo');
    expect(byTestId('lf-import-report')).toBeNull();
    expect(byTestId('lf-import-open')).toBeNull();
    act(() => (byTestId('lf-import-open-session') as HTMLButtonElement).click());
    expect(actions.openTab).toHaveBeenCalledWith(
      'https://hub.example.org/hub/labfleet/import?url=https%3A%2F%2Fexample.org%2Forg%2Frepo.git&folder=repo'
    );
  });

  it('shows a running job and keeps the form from a second start', async () => {
    (store.api as any).getImport = () => new Promise(() => undefined);
    await submitImport(async () => importJob({ status: 'fetching', message: '' }));
    expect(byTestId('lf-import-status')?.textContent).toBe('Fetching the repository…');
    expect(byTestId('lf-section-badge-start')?.textContent).toBe('importing…');
    expect((byTestId('lf-import-submit') as HTMLButtonElement).disabled).toBe(true);
    store.imports.dispose();
  });

  it('opens the new-session and the new-folder forms where they are', async () => {
    act(() => store.toggle('sessions', false));
    await act(async () => (byTestId('lf-start-new-session') as HTMLButtonElement).click());
    expect(store.isOpen('sessions')).toBe(true);
    expect(byTestId('lf-new-session-form')).not.toBeNull();
    expect(byTestId('lf-sessions')?.contains(byTestId('lf-new-session-form'))).toBe(true);
    await act(async () => (byTestId('lf-start-new-folder') as HTMLButtonElement).click());
    expect(byTestId('lf-folders')?.contains(byTestId('lf-folder-create'))).toBe(true);
    expect(document.activeElement).toBe(byTestId('lf-folder-create-name'));
    expect(byTestId('lf-folder-create-toggle')?.textContent).toBe('Cancel');
  });
});

describe('Share as a link', () => {
  it('opens a dialog with the link generator', async () => {
    const button = byTestId('lf-folder-data')?.querySelector(
      '[data-testid="lf-folder-share-link"]'
    ) as HTMLButtonElement;
    await act(async () => button.click());
    const dialog = document.querySelector('.jp-Dialog');
    expect(dialog?.querySelector('[data-testid="lf-share-link"]')).not.toBeNull();
    expect(dialog?.textContent).toContain('Share as a link: data');
    await act(async () => (dialog?.querySelector('.jp-mod-accept') as HTMLButtonElement).click());
  });
});
