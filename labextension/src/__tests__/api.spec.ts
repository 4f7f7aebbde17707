/**
 * The data layer against a fake `fetch`: URLs, methods, bodies and headers that reach the
 * server, and errors that carry the server's own message.
 */
import { ServerConnection } from '@jupyterlab/services';

import { errorMessage, FleetAPI, LabfleetError, logSizeHeader, serverNamePath } from '../api';

const BASE = 'http://127.0.0.1:8000/user/alice/work/';

interface ICall {
  method: string;
  path: string;
  body: string;
  headers: Headers;
}

/** A FleetAPI whose requests are answered by `reply` and recorded in `calls`. */
function fake(reply: (call: ICall) => Response | Promise<Response>): {
  api: FleetAPI;
  calls: ICall[];
} {
  const calls: ICall[] = [];
  const fetchFn = async (input: RequestInfo | URL, init?: RequestInit) => {
    const req = input instanceof Request ? input : new Request(input as string, init);
    const url = new URL(req.url);
    const call: ICall = {
      method: req.method,
      path: url.pathname,
      body: await req.text(),
      headers: req.headers
    };
    calls.push(call);
    return reply(call);
  };
  const settings = ServerConnection.makeSettings({
    baseUrl: BASE,
    token: '',
    fetch: fetchFn as typeof fetch
  });
  return { api: new FleetAPI(settings), calls };
}

function json(data: unknown, status = 200): Response {
  return new Response(JSON.stringify(data), {
    status,
    headers: { 'Content-Type': 'application/json' }
  });
}

afterEach(() => {
  document.cookie = '_xsrf=; expires=Thu, 01 Jan 1970 00:00:00 GMT';
});

describe('FleetAPI requests', () => {
  it('asks the session endpoints under the server base URL', async () => {
    const session = { name: 'work', user: 'alice', project: 'acme/ml' };
    const { api, calls } = fake(() => json(session));
    await expect(api.session()).resolves.toEqual(session);
    await api.usage();
    await api.mountedFolders();
    await api.quota();
    await api.apps();
    await api.sessions();
    expect(calls.map(c => `${c.method} ${c.path}`)).toEqual([
      'GET /user/alice/work/labfleet/session',
      'GET /user/alice/work/labfleet/usage',
      'GET /user/alice/work/labfleet/vfolders',
      'GET /user/alice/work/labfleet/quota',
      'GET /user/alice/work/labfleet/apps',
      'GET /user/alice/work/labfleet/sessions'
    ]);
  });

  it('sends the XSRF cookie as a header and never a token', async () => {
    document.cookie = '_xsrf=2|abc|def';
    const { api, calls } = fake(() => json([]));
    await api.sessions();
    expect(calls[0].headers.get('X-XSRFToken')).toBe('2|abc|def');
    expect(calls[0].headers.get('Authorization')).toBeNull();
  });

  it('posts "I\'m still here" with the XSRF header and reads the idle object', async () => {
    document.cookie = '_xsrf=2|abc|def';
    const idle = {
      idle_for: 0,
      timeout: 540,
      reclaim_at: '2026-11-24T10:09:00+00:00',
      checker: 'short',
      reason: 'no activity for 0 s (timeout 540 s)',
      only_when_queue_waiting: false
    };
    const { api, calls } = fake(() => json(idle));
    await expect(api.stillHere()).resolves.toEqual(idle);
    expect(`${calls[0].method} ${calls[0].path}`).toBe(
      'POST /user/alice/work/labfleet/session/still-here'
    );
    expect(calls[0].headers.get('X-XSRFToken')).toBe('2|abc|def');
  });

  it('posts spawn options as JSON to the named session', async () => {
    const { api, calls } = fake(() => json({ name: 'exp-1', status: 'PENDING' }, 201));
    const options = {
      project: 'acme/ml',
      type: 'interactive' as const,
      image: 'local',
      cpu: '2',
      mem: '4g',
      gpu: '0.5',
      vfolders: ['data']
    };
    await expect(api.startSession('exp-1', options)).resolves.toEqual({
      name: 'exp-1',
      status: 'PENDING'
    });
    expect(calls[0].method).toBe('POST');
    expect(calls[0].path).toBe('/user/alice/work/labfleet/sessions/exp-1');
    expect(JSON.parse(calls[0].body)).toEqual(options);
    expect(calls[0].headers.get('Content-Type')).toBe('application/json');
  });

  it('stops the default server as ~ and escapes other names', async () => {
    const { api, calls } = fake(() => new Response(null, { status: 204 }));
    await expect(api.stopSession('')).resolves.toBeNull();
    await api.stopSession('a b');
    expect(calls.map(c => `${c.method} ${c.path}`)).toEqual([
      'DELETE /user/alice/work/labfleet/sessions/~',
      'DELETE /user/alice/work/labfleet/sessions/a%20b'
    ]);
  });

  it('reaches the labfleet service through the api proxy', async () => {
    const { api, calls } = fake(() => json({}));
    await api.launchOptions('alice');
    await api.folders();
    await api.createFolder({ name: 'data', usage_mode: 'general' });
    await api.invite('f-1', 'bob', 'ro');
    await api.invitations();
    await api.answerInvitation('i-1', true);
    await api.answerInvitation('i-2', false);
    await api.storageHosts();
    await api.myUsage();
    expect(calls.map(c => `${c.method} ${c.path} ${c.body}`)).toEqual([
      'GET /user/alice/work/labfleet/api/users/alice/launch-options ',
      'GET /user/alice/work/labfleet/api/vfolders ',
      'POST /user/alice/work/labfleet/api/vfolders {"name":"data","usage_mode":"general"}',
      'POST /user/alice/work/labfleet/api/vfolders/f-1/invitations {"invitee":"bob","permission":"ro"}',
      'GET /user/alice/work/labfleet/api/vfolder-invitations ',
      'POST /user/alice/work/labfleet/api/vfolder-invitations/i-1/accept {}',
      'POST /user/alice/work/labfleet/api/vfolder-invitations/i-2/decline {}',
      'GET /user/alice/work/labfleet/api/storage-hosts ',
      'GET /user/alice/work/labfleet/api/usage/me '
    ]);
  });

  it('starts an import (202) and asks about it by id', async () => {
    const job = { id: 'a b', status: 'fetching', folder: { id: null, name: 'repo' } };
    const { api, calls } = fake(() => json(job, 202));
    await expect(
      api.startImport({ url: 'https://example.org/r.git', folder: 'data', open: 'a.ipynb' })
    ).resolves.toEqual(job);
    await api.getImport('a b');
    expect(calls.map(c => `${c.method} ${c.path} ${c.body}`)).toEqual([
      'POST /user/alice/work/labfleet/api/imports {"url":"https://example.org/r.git","folder":"data","open":"a.ipynb"}',
      'GET /user/alice/work/labfleet/api/imports/a%20b '
    ]);
    expect(calls[0].headers.get('Content-Type')).toBe('application/json');
  });

  it("carries an import's refusal in the service's words", async () => {
    const { api } = fake(() =>
      json({ message: 'url: file scheme; an import fetches only https, http, git URLs' }, 400)
    );
    await expect(api.startImport({ url: 'file:///etc/passwd' })).rejects.toMatchObject({
      status: 400,
      message: 'url: file scheme; an import fetches only https, http, git URLs'
    });
  });
});

describe('FleetAPI errors', () => {
  it("carries the server's message and status", async () => {
    const { api } = fake(() =>
      json({ message: 'project acme/ml has 0.5 GPU shares left; this asks 1' }, 403)
    );
    const err: LabfleetError = await api
      .startSession('x', { project: 'acme/ml', type: 'interactive' })
      .then(() => {
        throw new Error('not refused');
      })
      .catch((e: LabfleetError) => e);
    expect(err).toBeInstanceOf(LabfleetError);
    expect(err.status).toBe(403);
    expect(err.message).toBe('project acme/ml has 0.5 GPU shares left; this asks 1');
  });

  it('passes on a 502 from the proxy with its words', async () => {
    const { api } = fake(() => json({ message: 'the labfleet service did not answer' }, 502));
    await expect(api.folders()).rejects.toMatchObject({
      status: 502,
      message: 'the labfleet service did not answer'
    });
  });

  it('does not show an HTML error page', async () => {
    const { api } = fake(
      () =>
        new Response('<html><body>404: Not Found</body></html>', {
          status: 404,
          statusText: 'Not Found'
        })
    );
    await expect(api.session()).rejects.toMatchObject({
      status: 404,
      message: '404 Not Found'
    });
  });

  it('turns a network failure into an error with status 0', async () => {
    const { api } = fake(() => {
      throw new TypeError('Failed to fetch');
    });
    await expect(api.usage()).rejects.toMatchObject({ status: 0 });
    await expect(api.usage()).rejects.toThrow(/cannot reach this session's server/);
  });

  it('asks for my environments through the proxy: list, create, delete, the log as text', async () => {
    const made = { id: 'e1', name: 'torch', status: 'QUEUED' };
    const { api, calls } = fake(call => {
      if (call.path.endsWith('/logs')) {
        // A log line that happens to be JSON stays text.
        return new Response('42\n', { headers: { 'Content-Type': 'text/plain' } });
      }
      return call.method === 'GET' ? json({ items: [made] }) : json(made, 202);
    });
    await expect(api.environments()).resolves.toEqual([made]);
    const body = { name: 'torch', base: 'local/host', files: { 'requirements.txt': 'numpy\n' } };
    await api.createEnvironment(body);
    await api.deleteEnvironment('e1');
    await expect(api.environmentLog('e1', 65536)).resolves.toBe('42\n');
    expect(calls.map(c => `${c.method} ${c.path}`)).toEqual([
      'GET /user/alice/work/labfleet/api/environments',
      'POST /user/alice/work/labfleet/api/environments',
      'DELETE /user/alice/work/labfleet/api/environments/e1',
      'GET /user/alice/work/labfleet/api/environments/e1/logs'
    ]);
    expect(JSON.parse(calls[1].body)).toEqual(body);
  });

  it("asks for the log's tail, and carries a refusal's words", async () => {
    const urls: string[] = [];
    const fetchFn = async (input: RequestInfo | URL, init?: RequestInit) => {
      urls.push(new Request(input as string, init).url);
      return json({ message: "no environment 'e9'" }, 404);
    };
    const api = new FleetAPI(
      ServerConnection.makeSettings({ baseUrl: BASE, token: '', fetch: fetchFn as typeof fetch })
    );
    await expect(api.environmentLog('e9', 1024)).rejects.toMatchObject({
      status: 404,
      message: "no environment 'e9'"
    });
    expect(new URL(urls[0]).searchParams.get('tail')).toBe('1024');
  });

  it('follows the log by byte offset: the bytes as they came and X-Log-Size', async () => {
    const urls: string[] = [];
    const log = new TextEncoder().encode('Step 1 : é€😀\n');
    const fetchFn = async (input: RequestInfo | URL, init?: RequestInit) => {
      const url = new URL(new Request(input as string, init).url);
      urls.push(url.href);
      const offset = Number(url.searchParams.get('offset'));
      return new Response(log.slice(offset), {
        headers: { 'Content-Type': 'text/plain; charset=utf-8', 'X-Log-Size': String(log.length) }
      });
    };
    const api = new FleetAPI(
      ServerConnection.makeSettings({ baseUrl: BASE, token: '', fetch: fetchFn as typeof fetch })
    );
    const piece = await api.environmentLogFrom('e1', 9, 4096);
    expect(piece.size).toBe(log.length);
    expect(Array.from(piece.bytes)).toEqual(Array.from(log.slice(9)));
    expect(new TextDecoder().decode(piece.bytes)).toBe('é€😀\n');
    const q = new URL(urls[0]).searchParams;
    expect([q.get('offset'), q.get('tail')]).toEqual(['9', '4096']);
    expect(new URL(urls[0]).pathname).toBe('/user/alice/work/labfleet/api/environments/e1/logs');
  });

  it('has no size where the answer did not carry X-Log-Size, and a refusal in its words', async () => {
    let status = 200;
    const fetchFn = async () =>
      status === 200 ? new Response('abc') : json({ message: "no environment 'e9'" }, status);
    const api = new FleetAPI(
      ServerConnection.makeSettings({ baseUrl: BASE, token: '', fetch: fetchFn as typeof fetch })
    );
    await expect(api.environmentLogFrom('e1', 0, 10)).resolves.toMatchObject({ size: null });
    status = 404;
    await expect(api.environmentLogFrom('e9', 0, 10)).rejects.toMatchObject({
      status: 404,
      message: "no environment 'e9'"
    });
    expect([
      logSizeHeader('12'),
      logSizeHeader(' 0 '),
      logSizeHeader(''),
      logSizeHeader('x')
    ]).toEqual([12, 0, null, null]);
  });

  it('saves a session as an environment: its name and id in the body', async () => {
    const { api, calls } = fake(() => json({ id: 'e2', name: 'mine', status: 'QUEUED' }, 202));
    await api.createEnvironment({ name: 'mine', session: 's-1' });
    expect(`${calls[0].method} ${calls[0].path}`).toBe(
      'POST /user/alice/work/labfleet/api/environments'
    );
    expect(JSON.parse(calls[0].body)).toEqual({ name: 'mine', session: 's-1' });
  });
});

describe('errorMessage', () => {
  it('prefers message, then reason, then short text', () => {
    expect(errorMessage(400, 'Bad Request', { message: ' cpu must be a number ' })).toBe(
      'cpu must be a number'
    );
    expect(errorMessage(403, 'Forbidden', { reason: 'not yours' })).toBe('not yours');
    expect(errorMessage(409, 'Conflict', 'already exists')).toBe('already exists');
    expect(errorMessage(500, 'Internal Server Error', 'x'.repeat(400))).toBe(
      '500 Internal Server Error'
    );
    expect(errorMessage(0, '', null)).toBe('the server did not answer');
  });
});

describe('serverNamePath', () => {
  it('names the default server ~', () => {
    expect(serverNamePath('')).toBe('~');
    expect(serverNamePath('work')).toBe('work');
    expect(serverNamePath('a/b')).toBe('a%2Fb');
  });
});
