/**
 * Typed requests to the session's server extension (`<base url>labfleet/...`).
 *
 * Everything goes through `ServerConnection.makeRequest`: JupyterLab adds the XSRF header and
 * the login cookie does the rest, so the page never holds a token.  The labfleet service is
 * reached through the extension's proxy (`labfleet/api/<path>`), which calls it with the
 * session's own Hub token.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import type {
  IAnnouncementAnswer,
  IApp,
  IEndpoint,
  IEndpointCreate,
  IEndpointToken,
  IEnvironment,
  IEnvironmentCreate,
  IEnvironmentSave,
  IFolder,
  IFolderCreate,
  IIdleInfo,
  IImportCreate,
  IImportJob,
  IInvitation,
  ILaunchOptions,
  ILogPiece,
  IMountedFolder,
  IMyUsage,
  IQuota,
  ISessionInfo,
  ISessionSummary,
  IPreview,
  ISpawnOptions,
  IStorageHost,
  IUsage
} from './types';

/** A refused or failed request; `message` is the server's own words where it gave some. */
export class LabfleetError extends Error {
  constructor(
    message: string,
    readonly status: number
  ) {
    super(message);
    this.name = 'LabfleetError';
  }
}

const MAX_TEXT_MESSAGE = 300;

/** The message a person should read for a failed response. */
export function errorMessage(status: number, statusText: string, body: unknown): string {
  if (body && typeof body === 'object') {
    const b = body as Record<string, unknown>;
    // Jupyter server errors carry `message` and sometimes `reason`.
    for (const key of ['message', 'reason', 'error']) {
      const v = b[key];
      if (typeof v === 'string' && v.trim()) {
        return v.trim();
      }
    }
  }
  if (typeof body === 'string') {
    const text = body.trim();
    // A short plain-text answer is worth showing; an HTML error page is not.
    if (text && !text.startsWith('<') && text.length <= MAX_TEXT_MESSAGE) {
      return text;
    }
  }
  if (status === 0) {
    return 'the server did not answer';
  }
  return `${status} ${statusText || 'error'}`.trim();
}

/** A server name as a path component: the default server ("") is `~`. */
export function serverNamePath(name: string): string {
  return name === '' ? '~' : encodeURIComponent(name);
}

/** `X-Log-Size` as a number of bytes; null when absent or not a whole number. */
export function logSizeHeader(value: string | null | undefined): number | null {
  const v = (value ?? '').trim();
  return /^\d+$/.test(v) ? Number(v) : null;
}

/** An answer's body: its JSON, else its text (null when empty). */
function parseBody(text: string): unknown {
  if (!text) {
    return null;
  }
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

export class FleetAPI {
  /**
   * @param settings the server connection; tests pass one with their own `fetch`.
   */
  constructor(settings?: ServerConnection.ISettings) {
    this._settings = settings ?? ServerConnection.makeSettings();
  }

  get settings(): ServerConnection.ISettings {
    return this._settings;
  }

  /** The URL of `labfleet/<path>` on this session's server. */
  url(path: string): string {
    return URLExt.join(this._settings.baseUrl, 'labfleet', path);
  }

  /** One request; resolves to the parsed JSON answer (null for an empty body). */
  async request<T>(path: string, init: RequestInit = {}, body?: unknown): Promise<T> {
    const { response, text } = await this._send(path, init, body);
    const data = parseBody(text);
    if (!response.ok) {
      throw new LabfleetError(
        errorMessage(response.status, response.statusText, data),
        response.status
      );
    }
    return data as T;
  }

  /** One request whose answer is text (a log): resolves to it as it came, never parsed. */
  async requestText(path: string, init: RequestInit = {}): Promise<string> {
    const { response, text } = await this._send(path, init);
    if (!response.ok) {
      throw new LabfleetError(
        errorMessage(response.status, response.statusText, parseBody(text)),
        response.status
      );
    }
    return text;
  }

  /**
   * One request whose answer is bytes as they came (a log followed by byte offset, where a
   * string's length would miscount), with the answer's headers.
   */
  async requestBytes(
    path: string,
    init: RequestInit = {}
  ): Promise<{ bytes: Uint8Array; headers: Headers }> {
    const { response, text, bytes } = await this._send(path, init, undefined, true);
    if (!response.ok) {
      throw new LabfleetError(
        errorMessage(response.status, response.statusText, parseBody(text)),
        response.status
      );
    }
    return { bytes, headers: response.headers };
  }

  private async _send(
    path: string,
    init: RequestInit,
    body?: unknown,
    asBytes = false
  ): Promise<{ response: Response; text: string; bytes: Uint8Array }> {
    const req: RequestInit = { ...init };
    if (body !== undefined) {
      req.body = JSON.stringify(body);
      req.headers = { 'Content-Type': 'application/json', ...init.headers };
    }
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(this.url(path), req, this._settings);
    } catch (e) {
      const why = e instanceof Error ? e.message : String(e);
      throw new LabfleetError(`cannot reach this session's server: ${why}`, 0);
    }
    let text = '';
    let bytes: Uint8Array | undefined;
    try {
      if (asBytes) {
        bytes = new Uint8Array(await response.arrayBuffer());
        // A refusal's words are text (JSON or not).
        text = response.ok ? '' : new TextDecoder().decode(bytes);
      } else {
        text = await response.text();
      }
    } catch {
      text = '';
    }
    return { response, text, bytes: bytes ?? new Uint8Array(0) };
  }

  // ------------------------------------------------------------ this session (server extension)

  session(): Promise<ISessionInfo> {
    return this.request('session');
  }

  /** "I'm still here": counts as activity now; answers the idle object after it. */
  stillHere(): Promise<IIdleInfo> {
    return this.request('session/still-here', { method: 'POST' });
  }

  usage(): Promise<IUsage> {
    return this.request('usage');
  }

  mountedFolders(): Promise<IMountedFolder[]> {
    return this.request('vfolders');
  }

  quota(): Promise<IQuota> {
    return this.request('quota');
  }

  apps(): Promise<IApp[]> {
    return this.request('apps');
  }

  // ------------------------------------------------------------ my sessions

  sessions(): Promise<ISessionSummary[]> {
    return this.request('sessions');
  }

  startSession(name: string, options: ISpawnOptions): Promise<unknown> {
    return this.request(`sessions/${serverNamePath(name)}`, { method: 'POST' }, options);
  }

  stopSession(name: string): Promise<unknown> {
    return this.request(`sessions/${serverNamePath(name)}`, {
      method: 'DELETE'
    });
  }

  // ------------------------------------------------------------ the labfleet service, via the proxy

  launchOptions(user: string): Promise<ILaunchOptions> {
    return this.request(`api/users/${encodeURIComponent(user)}/launch-options`);
  }

  /** What starting this request would do now (starts, waits, refused), changing nothing. */
  previewSession(body: Record<string, unknown>): Promise<IPreview> {
    return this.request('api/sessions/preview', { method: 'POST', body: JSON.stringify(body) });
  }

  folders(): Promise<IFolder[]> {
    return this.request('api/vfolders');
  }

  createFolder(body: IFolderCreate): Promise<IFolder> {
    return this.request('api/vfolders', { method: 'POST' }, body);
  }

  invite(folderId: string, invitee: string, permission: string): Promise<IInvitation> {
    return this.request(
      `api/vfolders/${encodeURIComponent(folderId)}/invitations`,
      { method: 'POST' },
      { invitee, permission }
    );
  }

  /** Pending invitations I received or sent. */
  invitations(): Promise<IInvitation[]> {
    return this.request('api/vfolder-invitations');
  }

  answerInvitation(id: string, accept: boolean): Promise<IInvitation> {
    const action = accept ? 'accept' : 'decline';
    return this.request(
      `api/vfolder-invitations/${encodeURIComponent(id)}/${action}`,
      { method: 'POST' },
      {}
    );
  }

  storageHosts(): Promise<IStorageHost[]> {
    return this.request('api/storage-hosts');
  }

  /** The announcement in force (a superadmin publishes it from the admin console). */
  announcement(): Promise<IAnnouncementAnswer> {
    return this.request('api/announcement');
  }

  /** My GPU- and CPU-time, allocated and used: the last 7 and 30 days and day by day. */
  myUsage(): Promise<IMyUsage> {
    return this.request('api/usage/me');
  }

  // ------------------------------------------------------------ Import & Run

  /**
   * Import a notebook, a git repository or an archive by URL into a folder: answers the job
   * (202) as it is now; a refusal (bad URL, host, folder, quota) rejects with the service's words.
   */
  startImport(body: IImportCreate): Promise<IImportJob> {
    return this.request('api/imports', { method: 'POST' }, body);
  }

  /** An import of mine, where it stands (fetching, writing, done, failed) and its report. */
  getImport(id: string): Promise<IImportJob> {
    return this.request(`api/imports/${encodeURIComponent(id)}`);
  }

  // ------------------------------------------------------------ model serving

  /** My endpoints (a domain admin's: their domain's), with their routes. */
  endpoints(): Promise<IEndpoint[]> {
    return this.request('api/endpoints');
  }

  createEndpoint(body: IEndpointCreate): Promise<IEndpoint> {
    return this.request('api/endpoints', { method: 'POST' }, body);
  }

  scaleEndpoint(name: string, replicas: number): Promise<IEndpoint> {
    return this.request(
      `api/endpoints/${encodeURIComponent(name)}`,
      { method: 'PATCH' },
      { replicas }
    );
  }

  deleteEndpoint(name: string): Promise<IEndpoint> {
    return this.request(`api/endpoints/${encodeURIComponent(name)}`, { method: 'DELETE' });
  }

  /** One endpoint (404 when it is not mine, or gone). */
  endpoint(name: string): Promise<IEndpoint> {
    return this.request(`api/endpoints/${encodeURIComponent(name)}`);
  }

  /** A new token; its value (`token`) is in this answer only. */
  createEndpointToken(name: string, expiresIn?: number, note?: string): Promise<IEndpointToken> {
    const body: { expires_in?: number; note?: string } = {};
    if (expiresIn) {
      body.expires_in = expiresIn;
    }
    if (note) {
      body.note = note;
    }
    return this.request(
      `api/endpoints/${encodeURIComponent(name)}/tokens`,
      { method: 'POST' },
      body
    );
  }

  /** An endpoint's tokens, revoked and expired ones too; never their values. */
  endpointTokens(name: string): Promise<IEndpointToken[]> {
    return this.request(`api/endpoints/${encodeURIComponent(name)}/tokens`);
  }

  /** Revoke a token: the endpoint's URL answers 401 for it from now on. */
  revokeEndpointToken(name: string, id: number): Promise<IEndpointToken> {
    return this.request(
      `api/endpoints/${encodeURIComponent(name)}/tokens/${encodeURIComponent(String(id))}`,
      { method: 'DELETE' }
    );
  }

  // ------------------------------------------------------------ My Environments

  /** The environments I see (mine, my projects'; an admin's: their domain's), newest first. */
  environments(): Promise<IEnvironment[]> {
    return this.request<{ items: IEnvironment[] }>('api/environments').then(a => a?.items ?? []);
  }

  /**
   * Ask for a build (202: QUEUED, or READY at once with an image of the same recipe), or (Save as
   * environment, `{name, session}`) for a running session of mine to be committed (202: QUEUED).
   */
  createEnvironment(body: IEnvironmentCreate | IEnvironmentSave): Promise<IEnvironment> {
    return this.request('api/environments', { method: 'POST' }, body);
  }

  deleteEnvironment(id: string): Promise<{ deleted: string; name: string }> {
    return this.request(`api/environments/${encodeURIComponent(id)}`, { method: 'DELETE' });
  }

  /** The end of an environment's build log (`tail` bytes at most), as far as the build got. */
  environmentLog(id: string, tail: number): Promise<string> {
    return this.requestText(
      `api/environments/${encodeURIComponent(id)}/logs?tail=${encodeURIComponent(String(tail))}`
    );
  }

  /**
   * What an environment's build log has after byte `offset` (`tail` bytes at most), as bytes, and
   * the log's size then (`X-Log-Size`; null where the answer did not carry it).
   */
  async environmentLogFrom(id: string, offset: number, tail: number): Promise<ILogPiece> {
    const q = `offset=${encodeURIComponent(String(offset))}&tail=${encodeURIComponent(String(tail))}`;
    const { bytes, headers } = await this.requestBytes(
      `api/environments/${encodeURIComponent(id)}/logs?${q}`
    );
    return { bytes, size: logSizeHeader(headers.get('X-Log-Size')) };
  }

  private _settings: ServerConnection.ISettings;
}
