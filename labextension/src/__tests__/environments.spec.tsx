/**
 * My Environments: the pure parts (which launch-option images are bases, how a row reads, the
 * body built from the form, the log's tail) and the section rendered in jsdom from a store filled
 * by a fake API: the list, the build form (a refusal inline, changing nothing), the log asked
 * every tick while the build runs and no more once it FAILED, delete after the confirm.
 */
import * as React from 'react';
import { act } from 'react';
import { createRoot, Root } from 'react-dom/client';

import { FleetAPI, LabfleetError } from '../api';
import { Environments } from '../components/Environments';
import {
  baseImages,
  EMPTY_ENVIRONMENT_FORM,
  environmentBody,
  environmentBuilding,
  environmentMeta,
  environmentStatusClass,
  environmentStatusText,
  logEnded,
  logView,
  ownerText,
  utf8Length
} from '../environments';
import { FleetStore } from '../store';
import type { IEnvironment, ILaunchOptions } from '../types';

function env(over: Partial<IEnvironment> = {}): IEnvironment {
  return {
    id: '0b5e3c1e-0000-4000-8000-000000000001',
    name: 'torch',
    owner_kind: 'user',
    owner: 'user:alice',
    project: null,
    base: 'local/host',
    status: 'READY',
    status_reason: '',
    image: 'labfleet/env:abc',
    size_bytes: 1.5 * 2 ** 30,
    created_at: '2026-11-28T10:00:00+00:00',
    ...over
  };
}

const IMAGE = { min_slots: {}, accelerators: [] };

const OPTIONS: ILaunchOptions = {
  user: 'alice',
  projects: [
    { name: 'acme/ml', left: {} },
    { name: 'acme/vision', left: {} }
  ],
  images: [
    {
      name: 'local/host',
      display_name: 'JupyterLab on the Hub host',
      projects: ['acme/ml'],
      ...IMAGE
    },
    { name: 'cuda/12', display_name: '', projects: ['acme/vision'], ...IMAGE },
    { name: 'nowhere/x', display_name: 'X', projects: [], ...IMAGE },
    {
      name: 'env:0b5e3c1e-0000-4000-8000-000000000001',
      display_name: 'torch (my environment, on local/host)',
      projects: ['acme/ml'],
      ...IMAGE
    }
  ],
  resource_groups: [],
  vfolders: []
} as unknown as ILaunchOptions;

describe('which images are bases', () => {
  it('leaves out my environments (env:...)', () => {
    expect(baseImages(OPTIONS).map(b => b.value)).toEqual(['local/host', 'cuda/12', 'nowhere/x']);
  });

  it('labels a base by its display name, else its name', () => {
    expect(baseImages(OPTIONS).slice(0, 2)).toEqual([
      { value: 'local/host', label: 'JupyterLab on the Hub host' },
      { value: 'cuda/12', label: 'cuda/12' }
    ]);
  });

  it('for a project environment, those usable in that project; personal: in any of mine', () => {
    expect(baseImages(OPTIONS, 'acme/vision').map(b => b.value)).toEqual(['cuda/12']);
    expect(baseImages(OPTIONS, '').map(b => b.value)).toEqual(['local/host', 'cuda/12']);
  });

  it('has none before the launch options came', () => {
    expect(baseImages(null)).toEqual([]);
  });
});

describe('how a row reads', () => {
  it('says whose it is', () => {
    expect(ownerText(env(), 'alice')).toBe('personal');
    expect(ownerText(env({ owner: 'user:bob' }), 'alice')).toBe('personal (bob)');
    expect(
      ownerText(env({ owner_kind: 'project', owner: 'project:acme/ml', project: 'acme/ml' }))
    ).toBe('project acme/ml');
  });

  it('is owner · base · size, the size once there is an image', () => {
    expect(environmentMeta(env(), 'alice')).toBe('personal · local/host · 1.5 GiB');
    expect(environmentMeta(env({ status: 'QUEUED', size_bytes: 0 }), 'alice')).toBe(
      'personal · local/host'
    );
  });

  it('gives the reason with FAILED only', () => {
    const failed = env({ status: 'FAILED', status_reason: 'the Docker engine is not reachable' });
    expect(environmentStatusText(failed)).toBe('FAILED: the Docker engine is not reachable');
    expect(environmentStatusText(env({ status_reason: 'reused' }))).toBe('READY');
    expect(environmentStatusText(env({ status: 'FAILED' }))).toBe('FAILED');
  });

  it('colours the status, and knows a build that waits or runs', () => {
    expect(environmentStatusClass('READY')).toBe('lf-status lf-status-running');
    expect(environmentStatusClass('QUEUED')).toBe('lf-status lf-status-pending');
    expect(environmentStatusClass('BUILDING')).toBe('lf-status lf-status-pending');
    expect(environmentStatusClass('FAILED')).toBe('lf-status lf-status-error');
    expect(['QUEUED', 'BUILDING', 'READY', 'FAILED'].map(environmentBuilding)).toEqual([
      true,
      true,
      false,
      false
    ]);
  });
});

describe('the body built from the form', () => {
  const form = { ...EMPTY_ENVIRONMENT_FORM, name: ' torch ', base: 'local/host' };

  it('is personal, with no files, when only a name and a base are given', () => {
    expect(environmentBody(form)).toEqual({ name: 'torch', base: 'local/host', files: {} });
  });

  it('names the project of a project environment, and carries the files as typed', () => {
    expect(
      environmentBody({
        ...form,
        project: 'acme/ml',
        requirements: 'numpy==2.1.3\npandas\n',
        apt: 'ffmpeg\n'
      })
    ).toEqual({
      name: 'torch',
      base: 'local/host',
      project: 'acme/ml',
      files: { 'requirements.txt': 'numpy==2.1.3\npandas\n', 'apt.txt': 'ffmpeg\n' }
    });
  });

  it('leaves out a file of blanks only', () => {
    expect(environmentBody({ ...form, requirements: '  \n', apt: '' }).files).toEqual({});
  });

  it('says what is missing', () => {
    expect(() => environmentBody({ ...form, name: '  ' })).toThrow('give the environment a name');
    expect(() => environmentBody({ ...form, base: '' })).toThrow('choose a base image');
  });
});

describe('the log', () => {
  it('drops the cut first line when the answer fills the tail', () => {
    expect(logView('a\nb\n', 100)).toEqual({ text: 'a\nb\n', cut: false });
    expect(logView('partial\nwhole\n', 14)).toEqual({ text: 'whole\n', cut: true });
    expect(utf8Length('é€😀')).toBe(2 + 3 + 4);
  });

  it("knows the build's last word", () => {
    expect(logEnded('labfleet: building\nlabfleet: FAILED: no engine\n')).toBe(true);
    expect(logEnded('labfleet: building\nlabfleet: READY: image x (1 GiB)')).toBe(true);
    expect(logEnded('labfleet: building\nStep 2/5\n')).toBe(false);
    expect(logEnded('')).toBe(false);
  });
});

// ------------------------------------------------------------ the section, rendered

let container: HTMLDivElement;
let root: Root;
let store: FleetStore;
let envs: IEnvironment[];
let log: string;
let calls: [string, ...unknown[]][];
let refuse: string | null;
let confirmed: boolean;
let asked: string[];

function fakeApi(): FleetAPI {
  const api = Object.create(FleetAPI.prototype) as FleetAPI;
  Object.assign(api, {
    environments: async () => {
      calls.push(['list']);
      return envs;
    },
    launchOptions: async () => OPTIONS,
    createEnvironment: async (body: any) => {
      calls.push(['create', body]);
      if (refuse) {
        throw new LabfleetError(refuse, 400);
      }
      const made = env({
        id: 'new',
        name: body.name,
        status: 'QUEUED',
        size_bytes: 0,
        image: null,
        project: body.project ?? null
      });
      envs = [made, ...envs];
      return made;
    },
    deleteEnvironment: async (id: string) => {
      calls.push(['delete', id]);
      envs = envs.filter(e => e.id !== id);
      return { deleted: id, name: 'x' };
    },
    environmentLog: async (id: string, tail: number) => {
      calls.push(['log', id, tail]);
      return log;
    }
  });
  return api;
}

const byTestId = (id: string, within: Element = container) =>
  within.querySelector(`[data-testid="${id}"]`);

function render(): void {
  act(() => {
    root.render(
      <Environments
        store={store}
        logPollMs={20}
        confirm={async title => {
          asked.push(title);
          return confirmed;
        }}
      />
    );
  });
}

/** Let the requests, timers and renders of `ms` pass. */
async function settle(ms = 0): Promise<void> {
  await act(async () => {
    await new Promise(resolve => setTimeout(resolve, ms));
  });
}

async function click(id: string, within: Element = container): Promise<void> {
  await act(async () => {
    (byTestId(id, within) as HTMLElement).click();
  });
  await settle();
}

/** Type into a controlled input, select or textarea as React sees it. */
function type(el: Element | null, value: string): void {
  const proto =
    el instanceof HTMLTextAreaElement
      ? HTMLTextAreaElement.prototype
      : el instanceof HTMLSelectElement
        ? HTMLSelectElement.prototype
        : HTMLInputElement.prototype;
  const setter = Object.getOwnPropertyDescriptor(proto, 'value')!.set!;
  act(() => {
    setter.call(el, value);
    el!.dispatchEvent(
      new Event(el instanceof HTMLSelectElement ? 'change' : 'input', { bubbles: true })
    );
  });
}

const logCalls = () => calls.filter(c => c[0] === 'log').length;

beforeAll(() => {
  (globalThis as any).IS_REACT_ACT_ENVIRONMENT = true;
});

beforeEach(async () => {
  envs = [
    env(),
    env({
      id: 'e2',
      name: 'vision',
      owner_kind: 'project',
      owner: 'project:acme/vision',
      project: 'acme/vision',
      base: 'cuda/12',
      status: 'BUILDING',
      size_bytes: 0,
      image: null
    })
  ];
  log = 'labfleet: building environment vision\nStep 1/4 : FROM cuda/12\n';
  calls = [];
  refuse = null;
  confirmed = true;
  asked = [];
  container = document.createElement('div');
  document.body.appendChild(container);
  root = createRoot(container);
  store = new FleetStore(fakeApi(), { user: 'alice', serverName: 'work', now: () => 1000 });
  store.changed.connect(render);
  render();
});

afterEach(() => {
  act(() => root.unmount());
  container.remove();
});

describe('the My Environments section', () => {
  it('starts closed, asked for nothing until it is opened', async () => {
    expect(store.isOpen('environments')).toBe(false);
    await store.refresh();
    expect(calls.filter(c => c[0] === 'list')).toHaveLength(0);
    store.toggle('environments', true);
    await settle();
    expect(calls.filter(c => c[0] === 'list')).toHaveLength(1);
    await store.refresh();
    expect(calls.filter(c => c[0] === 'list')).toHaveLength(2);
  });

  it('lists name, owner, base, status and size', async () => {
    await store.fetch('environments');
    const torch = byTestId(`lf-env-torch`)!;
    expect(byTestId('lf-env-status', torch)?.textContent).toBe('READY');
    expect(byTestId('lf-env-meta', torch)?.textContent).toBe('personal · local/host · 1.5 GiB');
    const vision = byTestId('lf-env-vision')!;
    expect(vision.getAttribute('data-status')).toBe('BUILDING');
    expect(byTestId('lf-env-meta', vision)?.textContent).toBe('project acme/vision · cuda/12');
  });

  it('says why one FAILED', async () => {
    envs = [env({ status: 'FAILED', status_reason: 'the Docker engine is not reachable' })];
    await store.fetch('environments');
    const row = byTestId('lf-env-torch')!;
    expect(byTestId('lf-env-reason', row)?.textContent).toBe('the Docker engine is not reachable');
    expect(byTestId('lf-env-status', row)?.getAttribute('title')).toBe(
      'FAILED: the Docker engine is not reachable'
    );
  });

  it('builds one from the form: the bases without env:, the body as typed', async () => {
    await store.fetch('environments');
    await click('lf-env-build-toggle');
    const form = byTestId('lf-env-form')!;
    const bases = () =>
      [...(byTestId('lf-env-base', form) as HTMLSelectElement).options].map(o => o.value);
    expect(bases()).toEqual(['local/host', 'cuda/12']);
    type(byTestId('lf-env-project', form), 'acme/vision');
    expect(bases()).toEqual(['cuda/12']);
    type(byTestId('lf-env-name', form), 'viz');
    type(byTestId('lf-env-requirements', form), 'matplotlib\n');
    await click('lf-env-submit', form);
    expect(calls.find(c => c[0] === 'create')).toEqual([
      'create',
      {
        name: 'viz',
        base: 'cuda/12',
        project: 'acme/vision',
        files: { 'requirements.txt': 'matplotlib\n' }
      }
    ]);
    expect(byTestId('lf-env-form')).toBeNull();
    expect(byTestId('lf-env-viz')?.getAttribute('data-status')).toBe('QUEUED');
    expect(byTestId('lf-env-asked')?.textContent).toContain('Environment viz is QUEUED');
  });

  it("shows the service's refusal inline, and keeps the form as it was", async () => {
    await store.fetch('environments');
    await click('lf-env-build-toggle');
    refuse = "name must be 1-64 lower-case letters, digits, '-' or '_'";
    type(byTestId('lf-env-name'), 'Bad Name');
    await click('lf-env-submit');
    expect(byTestId('lf-env-form-error')?.textContent).toBe(refuse);
    expect((byTestId('lf-env-name') as HTMLInputElement).value).toBe('Bad Name');
    expect(container.querySelectorAll('li.lf-environment')).toHaveLength(2);
  });

  it('asks for the log every tick while the build runs, and no more once it FAILED', async () => {
    await store.fetch('environments');
    const row = byTestId('lf-env-vision')!;
    await click('lf-env-log-toggle', row);
    expect(calls.find(c => c[0] === 'log')).toEqual(['log', 'e2', 64 * 1024]);
    expect(byTestId('lf-env-log-text', row)?.textContent).toContain('Step 1/4');
    await settle(70);
    expect(logCalls()).toBeGreaterThanOrEqual(3);
    // The build's last line: the list is asked at once, and its status ends the polling.
    log += 'labfleet: FAILED: the Docker engine is not reachable\n';
    envs = envs.map(e =>
      e.id === 'e2' ? { ...e, status: 'FAILED', status_reason: 'no engine' } : e
    );
    const lists = calls.filter(c => c[0] === 'list').length;
    await settle(50);
    expect(calls.filter(c => c[0] === 'list').length).toBeGreaterThan(lists);
    expect(byTestId('lf-env-vision')?.getAttribute('data-status')).toBe('FAILED');
    const after = logCalls();
    await settle(80);
    expect(logCalls()).toBe(after);
    // The log of a FAILED build stays to read.
    expect(byTestId('lf-env-log-text')?.textContent).toContain('labfleet: FAILED');
    await click('lf-env-log-toggle', byTestId('lf-env-vision')!);
    expect(byTestId('lf-env-log')).toBeNull();
  });

  it('asks the log of a READY one once', async () => {
    await store.fetch('environments');
    log = 'labfleet: READY: image labfleet/env:abc (1.5 GiB)\n';
    await click('lf-env-log-toggle', byTestId('lf-env-torch')!);
    await settle(60);
    expect(logCalls()).toBe(1);
    expect(byTestId('lf-env-log')?.getAttribute('data-live')).toBe('false');
  });

  it('deletes after the confirm, and not without it', async () => {
    await store.fetch('environments');
    confirmed = false;
    await click('lf-env-delete', byTestId('lf-env-torch')!);
    expect(asked).toEqual(['Delete environment torch?']);
    expect(calls.filter(c => c[0] === 'delete')).toHaveLength(0);
    confirmed = true;
    await click('lf-env-delete', byTestId('lf-env-torch')!);
    expect(calls.filter(c => c[0] === 'delete')).toEqual([
      ['delete', '0b5e3c1e-0000-4000-8000-000000000001']
    ]);
    expect(byTestId('lf-env-torch')).toBeNull();
    expect(byTestId('lf-env-vision')).not.toBeNull();
  });

  it('says when there are none', async () => {
    envs = [];
    await store.fetch('environments');
    expect(byTestId('lf-environments-empty')?.textContent).toContain('No environments yet');
  });
});
