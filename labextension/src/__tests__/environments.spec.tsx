/**
 * My Environments: the pure parts (which launch-option images are bases, how a row reads, the
 * body built from the form and Save as environment's, the log followed by byte offset) and the
 * section rendered in jsdom from a store filled by a fake API: the list, the build form (a
 * refusal inline, changing nothing), the log followed every tick while the build runs (from the
 * bytes already read) and no more once it FAILED, delete after the confirm; and Save as
 * environment in the This session section.
 */
import * as React from 'react';
import { act } from 'react';
import { createRoot, Root } from 'react-dom/client';

import { FleetAPI, LabfleetError } from '../api';
import { Environments } from '../components/Environments';
import { ThisSession } from '../components/ThisSession';
import {
  baseImages,
  EMPTY_ENVIRONMENT_FORM,
  EMPTY_SAVE_AS_FORM,
  ENV_LOG_CHUNK_BYTES,
  environmentBody,
  environmentBuilding,
  environmentMeta,
  environmentStatusClass,
  environmentStatusText,
  logEnded,
  LogFollower,
  logRestarted,
  nextLogOffset,
  ownerText,
  saveAsBody,
  utf8Length
} from '../environments';
import { FleetStore } from '../store';
import type { IEnvironment, ILaunchOptions, ILogPiece, ISessionInfo } from '../types';

const encode = (text: string) => new TextEncoder().encode(text);

/** An answer to `?offset=`: the bytes after `offset` of `log` (at most `tail`), and its size. */
function pieceOf(log: Uint8Array, offset: number, tail = ENV_LOG_CHUNK_BYTES): ILogPiece {
  return { bytes: log.slice(Math.min(offset, log.length), offset + tail), size: log.length };
}

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

describe('the body of Save as environment', () => {
  it('is the name and the session, personal unless a project is chosen', () => {
    expect(saveAsBody({ ...EMPTY_SAVE_AS_FORM, name: ' my-setup ' }, 's-1')).toEqual({
      name: 'my-setup',
      session: 's-1'
    });
    expect(saveAsBody({ name: 'my-setup', project: 'acme/ml' }, 's-1')).toEqual({
      name: 'my-setup',
      session: 's-1',
      project: 'acme/ml'
    });
  });

  it('says what is missing', () => {
    expect(() => saveAsBody({ name: ' ', project: '' }, 's-1')).toThrow(
      'give the environment a name'
    );
    expect(() => saveAsBody({ name: 'x', project: '' }, null)).toThrow(
      'does not know this session'
    );
  });
});

describe('the log, followed by byte offset', () => {
  it('moves the offset by the bytes that came, not the characters', () => {
    expect(utf8Length('é€😀')).toBe(2 + 3 + 4);
    expect(nextLogOffset(10, 'é€😀\n')).toBe(20);
    expect(nextLogOffset(10, encode('é€😀\n'))).toBe(20);
    expect(nextLogOffset(0, new Uint8Array(0))).toBe(0);
  });

  it('knows a log that began again: its size less than the offset', () => {
    expect(logRestarted(100, 99)).toBe(true);
    expect(logRestarted(100, 100)).toBe(false);
    expect(logRestarted(100, null)).toBe(false);
  });

  it('appends what came after the offset, a character split between answers whole', () => {
    const log = encode('Step 1/2 : é\nStep 2/2 : 😀 done\n');
    const f = new LogFollower(1024, 1024);
    const cut = utf8Length('Step 1/2 : é\nStep 2/2 : ') + 2; // inside the 4 bytes of 😀
    expect(f.take({ bytes: log.slice(0, cut), size: cut })).toBe(false);
    expect(f.offset).toBe(cut);
    expect(f.text).toBe('Step 1/2 : é\nStep 2/2 : ');
    expect(f.take(pieceOf(log, f.offset))).toBe(false);
    expect(f.text).toBe('Step 1/2 : é\nStep 2/2 : 😀 done\n');
    expect(f.offset).toBe(log.length);
    expect(f.cut).toBe(false);
    // Nothing new: nothing changes.
    expect(f.take(pieceOf(log, f.offset))).toBe(false);
    expect(f.offset).toBe(log.length);
  });

  it('reads again from 0 when the log began again', () => {
    const f = new LogFollower(1024, 1024);
    f.take(pieceOf(encode('first build\nlabfleet: FAILED: x\n'), 0));
    const again = encode('second\n');
    // Asked from the old offset: nothing, and a size less than it.
    expect(f.take(pieceOf(again, f.offset))).toBe(true);
    expect([f.offset, f.text, f.restarts]).toEqual([0, '', 1]);
    expect(f.take(pieceOf(again, f.offset))).toBe(false);
    expect(f.text).toBe('second\n');
  });

  it('asks again at once while more is there: by its size, or a full chunk without one', () => {
    const log = encode('a\nb\nc\nd\n');
    const f = new LogFollower(1024, 4);
    expect(f.take(pieceOf(log, 0, 4))).toBe(true);
    expect(f.take(pieceOf(log, f.offset, 4))).toBe(false);
    expect(f.text).toBe('a\nb\nc\nd\n');
    const g = new LogFollower(1024, 4);
    expect(g.take({ bytes: log.slice(0, 4), size: null })).toBe(true);
    expect(g.take({ bytes: log.slice(4, 8), size: null })).toBe(true);
    expect(g.take({ bytes: log.slice(8, 12), size: null })).toBe(false);
    expect(g.text).toBe('a\nb\nc\nd\n');
  });

  it('keeps the last `keep` bytes, from a line start, and says the start was cut', () => {
    const f = new LogFollower(8, 1024);
    f.take(pieceOf(encode('line1\nline2\n'), 0));
    expect(f.cut).toBe(true);
    expect(f.text).toBe('line2\n');
    expect(utf8Length(f.text)).toBeLessThanOrEqual(8);
    // No line start in the last bytes: cut at a character's first byte.
    const g = new LogFollower(5, 1024);
    g.take(pieceOf(encode('ab€€€'), 0));
    expect(g.text).toBe('€');
  });

  it('skips to the last `keep` bytes of a log far longer, from its next line', () => {
    const lines = Array.from({ length: 100 }, (_, i) => `line ${i}\n`).join('');
    const log = encode(lines);
    const f = new LogFollower(32, 16);
    expect(f.take(pieceOf(log, 0, 16))).toBe(true);
    expect(f.offset).toBe(log.length - 32);
    while (f.take(pieceOf(log, f.offset, 16))) {
      // read on
    }
    expect(f.cut).toBe(true);
    expect(f.offset).toBe(log.length);
    expect(f.text).toBe('line 97\nline 98\nline 99\n'.slice(-f.text.length));
    expect(f.text.startsWith('line ')).toBe(true);
    expect(lines.endsWith(f.text)).toBe(true);
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
/** Whether the log's answers carry X-Log-Size (the session's proxy may leave it out). */
let sizeHeader: boolean;
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
    environmentLogFrom: async (id: string, offset: number, tail: number) => {
      calls.push(['log', id, offset, tail]);
      const piece = pieceOf(encode(log), offset, tail);
      return sizeHeader ? piece : { ...piece, size: null };
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
  // The requests a click makes, and the renders after them, in the same act.
  await act(async () => {
    (byTestId(id, within) as HTMLElement).click();
    await new Promise(resolve => setTimeout(resolve, 0));
  });
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
  sizeHeader = true;
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
    expect(calls.find(c => c[0] === 'log')).toEqual(['log', 'e2', 0, ENV_LOG_CHUNK_BYTES]);
    expect(byTestId('lf-env-log-text', row)?.textContent).toContain('Step 1/4');
    await settle(70);
    expect(logCalls()).toBeGreaterThanOrEqual(3);
    // Asked from the bytes already read on, and what came appended.
    const read = utf8Length(log);
    expect(calls.filter(c => c[0] === 'log').at(-1)).toEqual([
      'log',
      'e2',
      read,
      ENV_LOG_CHUNK_BYTES
    ]);
    log += 'Step 2/4 : RUN pip install ünïcode\n';
    await settle(50);
    expect(calls.filter(c => c[0] === 'log').at(-1)?.[2]).toBe(utf8Length(log));
    expect(byTestId('lf-env-log-text', row)?.textContent).toBe(log);
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

  it('reads the log again from its start when it began again', async () => {
    await store.fetch('environments');
    const row = byTestId('lf-env-vision')!;
    await click('lf-env-log-toggle', row);
    await settle(30);
    log = 'labfleet: building environment vision again\n';
    await settle(60);
    const offsets = calls.filter(c => c[0] === 'log').map(c => c[2]);
    expect(offsets[0]).toBe(0);
    // Read on from the old end, then (the log shorter than that) from 0 again.
    expect(offsets.slice(1)).toContain(0);
    expect(byTestId('lf-env-log-text', row)?.textContent).toBe(log);
  });
});

describe('the log, without X-Log-Size', () => {
  it('follows by offset all the same, and reads again from 0 when the build started again', async () => {
    sizeHeader = false;
    envs = envs.map(e => (e.id === 'e2' ? { ...e, started_at: '2026-11-28T10:00:00+00:00' } : e));
    await store.fetch('environments');
    await click('lf-env-log-toggle', byTestId('lf-env-vision')!);
    await settle(30);
    const read = utf8Length(log);
    expect(calls.filter(c => c[0] === 'log').at(-1)?.[2]).toBe(read);
    log = 'labfleet: building environment vision again\n';
    envs = envs.map(e => (e.id === 'e2' ? { ...e, started_at: '2026-11-28T11:00:00+00:00' } : e));
    await store.fetch('environments');
    await settle(30);
    expect(byTestId('lf-env-log-text')?.textContent).toBe(log);
  });
});

// ------------------------------------------------------------ Save as environment (This session)

const SESSION = {
  id: '5e551014-0000-4000-8000-000000000001',
  name: 'work',
  user: 'alice',
  type: 'interactive',
  project: 'acme/ml',
  domain: 'acme',
  image: 'local/host',
  resource_group: 'default',
  node: 'node-1',
  status: 'RUNNING',
  slots: { cpu: 1 },
  devices: [],
  mounts: [],
  created_at: null,
  started_at: null,
  uptime: 60,
  max_lifetime: null,
  expires_at: null,
  time_left: null,
  urls: {},
  runner: null,
  inference: null,
  service: 'ok'
} as unknown as ISessionInfo;

describe('Save as environment, in the This session section', () => {
  beforeEach(async () => {
    (store.api as any).session = async () => SESSION;
    await store.fetch('session');
    act(() => {
      root.render(<ThisSession store={store} onStop={() => undefined} />);
    });
    store.changed.disconnect(render);
    store.changed.connect(() =>
      act(() => root.render(<ThisSession store={store} onStop={() => undefined} />))
    );
  });

  it('saves this session by its id, personal by default; My Environments opens and lists it', async () => {
    expect(store.isOpen('environments')).toBe(false);
    await click('lf-save-env-toggle');
    const form = byTestId('lf-save-env-form')!;
    const owners = [...(byTestId('lf-save-env-project', form) as HTMLSelectElement).options];
    expect(owners.map(o => o.value)).toEqual(['', 'acme/ml', 'acme/vision']);
    type(byTestId('lf-save-env-name', form), 'my-setup');
    await click('lf-save-env-submit', form);
    expect(calls.find(c => c[0] === 'create')).toEqual([
      'create',
      { name: 'my-setup', session: SESSION.id }
    ]);
    await settle();
    expect(store.isOpen('environments')).toBe(true);
    expect(store.data.environments?.map(e => e.name)).toContain('my-setup');
    expect(byTestId('lf-save-env-form')).toBeNull();
    const saved = byTestId('lf-save-env-saved')!;
    expect(saved.getAttribute('data-status')).toBe('QUEUED');
    expect(saved.textContent).toBe('Saved as my-setup: QUEUED. See My Environments.');
    // How it stands moves with the list: FAILED, with the reason.
    envs = envs.map(e =>
      e.name === 'my-setup'
        ? { ...e, status: 'FAILED', status_reason: 'session x has no running container' }
        : e
    );
    await store.fetch('environments');
    expect(byTestId('lf-save-env-saved')?.textContent).toBe(
      'Saved as my-setup: FAILED: session x has no running container. See My Environments.'
    );
  });

  it('names the project of a project environment', async () => {
    await click('lf-save-env-toggle');
    type(byTestId('lf-save-env-name'), 'team-setup');
    type(byTestId('lf-save-env-project'), 'acme/ml');
    await click('lf-save-env-submit');
    expect(calls.find(c => c[0] === 'create')?.[1]).toEqual({
      name: 'team-setup',
      session: SESSION.id,
      project: 'acme/ml'
    });
  });

  it("shows the service's refusal inline and changes nothing", async () => {
    await click('lf-save-env-toggle');
    refuse = 'you already have an environment named torch';
    type(byTestId('lf-save-env-name'), 'torch');
    await click('lf-save-env-submit');
    expect(byTestId('lf-save-env-error')?.textContent).toBe(refuse);
    expect((byTestId('lf-save-env-name') as HTMLInputElement).value).toBe('torch');
    expect(byTestId('lf-save-env-saved')).toBeNull();
    expect(store.isOpen('environments')).toBe(false);
    expect(calls.filter(c => c[0] === 'list')).toHaveLength(0);
  });

  it('asks for a name before anything is sent; Cancel closes the form', async () => {
    await click('lf-save-env-toggle');
    await click('lf-save-env-submit');
    expect(byTestId('lf-save-env-error')?.textContent).toBe('give the environment a name');
    expect(calls.filter(c => c[0] === 'create')).toHaveLength(0);
    await click('lf-save-env-cancel');
    expect(byTestId('lf-save-env-form')).toBeNull();
    expect(byTestId('lf-save-env-toggle')).not.toBeNull();
  });

  it('is not offered for a session the service does not know', async () => {
    (store.api as any).session = async () => ({ ...SESSION, id: null });
    await store.fetch('session');
    expect(byTestId('lf-this-session')).not.toBeNull();
    expect(byTestId('lf-save-env-toggle')).toBeNull();
  });
});
