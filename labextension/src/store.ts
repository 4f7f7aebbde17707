/**
 * The sidebar's state: the latest answer of each endpoint and why the last request for it
 * failed.  `refresh()` asks only what the open sections show; a poll calls it (sidebar.tsx).
 * Actions (start, stop, create, share, answer) throw `LabfleetError` for the form that made
 * them to show, and refresh what they changed.
 *
 * Usage statistics (30 days of them) change slowly and cost the service more than a quota:
 * the poll asks for them at most every `USAGE_MIN_AGE_MS`; the refresh button (`invalidate`)
 * and opening the section ask at once.  The launch options (the Quota section shows their
 * `free_now` per resource group; the new-session form its choices) cost more than a quota too:
 * at most every `LAUNCH_OPTIONS_MIN_AGE_MS`, and at the next tick after a start or a stop.
 * Sections in `CLOSED_AT_FIRST` (My Environments) start collapsed: nothing is asked for them
 * until they are opened.
 */
import { ISignal, Signal } from '@lumino/signaling';

import { FleetAPI, LabfleetError } from './api';
import { instantMs } from './format';
import { ImportRun } from './importrun';
import { hubLocation, type IHubLocation } from './imports';
import type {
  IAnnouncement,
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
  IInvitation,
  ILaunchOptions,
  IMountedFolder,
  IMyUsage,
  IQuota,
  ISessionInfo,
  ISessionSummary,
  ISpawnOptions,
  IStorageHost
} from './types';

export type SectionId =
  | 'start'
  | 'session'
  | 'quota'
  | 'usage'
  | 'sessions'
  | 'environments'
  | 'folders'
  | 'apps'
  | 'serving';

export const SECTIONS: SectionId[] = [
  'start',
  'session',
  'quota',
  'usage',
  'sessions',
  'environments',
  'folders',
  'apps',
  'serving'
];

/** Sections that start collapsed (nothing asked for them until they are opened). */
export const CLOSED_AT_FIRST: SectionId[] = ['environments'];

export type Resource =
  | 'announcement'
  | 'session'
  | 'quota'
  | 'usage'
  | 'sessions'
  | 'mounted'
  | 'apps'
  | 'folders'
  | 'invitations'
  | 'launchOptions'
  | 'hosts'
  | 'endpoints'
  | 'environments';

/**
 * A form the sidebar scrolls to (its first field focused) when something (the Start section, a
 * command, a launcher card) opens it: `import` is the Start section's Import from URL.
 */
export type RevealTarget = 'new-session' | 'new-folder' | 'import';

/** The poll asks for my usage statistics at most this often (ms). */
export const USAGE_MIN_AGE_MS = 60_000;

/** The poll asks for the launch options (what the fleet has free now) at most this often (ms). */
export const LAUNCH_OPTIONS_MIN_AGE_MS = 30_000;

/** Resources the poll asks for no more often than this (ms); the others at every tick. */
const MIN_AGE_MS: Partial<Record<Resource, number>> = {
  usage: USAGE_MIN_AGE_MS,
  launchOptions: LAUNCH_OPTIONS_MIN_AGE_MS
};

/** What each section shows. */
const SECTION_RESOURCES: Record<SectionId, Resource[]> = {
  // Nothing on the clock: the import form asks for my folders once (ImportForm), and whether this
  // session mounts a folder is in the session info.
  start: [],
  session: ['session'],
  // Beside the quota, what the fleet can give now (the launch options' `free_now`).
  quota: ['quota', 'launchOptions'],
  usage: ['usage'],
  sessions: ['sessions'],
  // The build log of an environment has its own 2-s refresh while it is shown (Environments.tsx).
  environments: ['environments'],
  folders: ['folders', 'invitations', 'mounted'],
  apps: ['apps'],
  serving: ['endpoints']
};

export interface IFleetData {
  /** The announcement in force: the banner at the top of the panel, whatever section is open. */
  announcement: IAnnouncement | null;
  session: ISessionInfo | null;
  quota: IQuota | null;
  usage: IMyUsage | null;
  sessions: ISessionSummary[] | null;
  mounted: IMountedFolder[] | null;
  apps: IApp[] | null;
  folders: IFolder[] | null;
  invitations: IInvitation[] | null;
  launchOptions: ILaunchOptions | null;
  hosts: IStorageHost[] | null;
  endpoints: IEndpoint[] | null;
  environments: IEnvironment[] | null;
}

export interface IStoreOptions {
  /** The Hub user this session belongs to (PageConfig `hubUser`). */
  user: string;
  /** This server's name (PageConfig `hubServerName`; "" for the default server). */
  serverName: string;
  /** Clock in ms, for tests. */
  now?: () => number;
  /** Where the Hub is, for its import links (default: `/hub/` on this page's origin). */
  hub?: IHubLocation;
  /** How often a running import is asked about (ms; tests). */
  importPollMs?: number;
}

function messageOf(e: unknown): string {
  if (e instanceof LabfleetError || e instanceof Error) {
    return e.message;
  }
  return String(e);
}

export class FleetStore {
  constructor(api: FleetAPI, options: IStoreOptions) {
    this.api = api;
    this.user = options.user;
    this.serverName = options.serverName;
    this._now = options.now ?? (() => Date.now());
    this.hub =
      options.hub ??
      hubLocation('', '/hub/', typeof window !== 'undefined' ? window.location.origin : '');
    this.imports = new ImportRun(api, {
      intervalMs: options.importPollMs,
      // A new folder (or new files in one) from the import: the Folders section lists it.
      onFinished: () => void this.fetch('folders')
    });
    this.imports.changed.connect(() => this._changed.emit(), this);
  }

  readonly api: FleetAPI;
  /** Where the Hub is: its import links. */
  readonly hub: IHubLocation;
  /** The import started from the Start section, followed until it ends. */
  readonly imports: ImportRun;
  readonly serverName: string;
  /** The Hub user; the session endpoint's answer wins once known. */
  user: string;

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get data(): Readonly<IFleetData> {
    return this._data;
  }

  /** Why the last request for each resource failed; absent when it succeeded. */
  get errors(): Readonly<Partial<Record<Resource, string>>> {
    return this._errors;
  }

  /** When the session info arrived (ms), to count its uptime and time left on. */
  get sessionReceivedAt(): number {
    return this._sessionAt;
  }

  now(): number {
    return this._now();
  }

  /** Whether a request for the resource is on its way. */
  isFetching(resource: Resource): boolean {
    return (this._inFlight[resource] ?? 0) > 0;
  }

  /** When a resource was last asked for (ms, this page's clock), answered or not; null: never. */
  askedAt(resource: Resource): number | null {
    return this._fetchedAt[resource] ?? null;
  }

  /**
   * How far the server's clock is ahead of this page's (ms), from the session info's
   * `started_at` and `uptime`: `reclaim_at` is the server's time.
   */
  get clockOffset(): number {
    return this._clockOffset;
  }

  /** When the idle reclamation is due on this page's clock (ms); null: no rule plans one. */
  idleDeadline(): number | null {
    const at = instantMs(this._data.session?.idle?.reclaim_at);
    return at === null ? null : at - this._clockOffset;
  }

  /** Seconds until the idle reclamation, now (negative: due); null: no rule plans one. */
  idleSecondsLeft(): number | null {
    const at = this.idleDeadline();
    return at === null ? null : (at - this._now()) / 1000;
  }

  /** Whether an "I'm still here" is on its way. */
  get stillHerePending(): boolean {
    return this._stillHerePending;
  }

  /** Why the last "I'm still here" failed; null when it did not. */
  get stillHereError(): string | null {
    return this._stillHereError;
  }

  /**
   * "I'm still here": counts as activity now; the answer (the idle object after it) replaces
   * this session's.  Throws LabfleetError after keeping its message in `stillHereError`.
   */
  async stillHere(): Promise<IIdleInfo> {
    this._stillHerePending = true;
    this._changed.emit();
    try {
      const idle = await this.api.stillHere();
      this._stillHereSeq += 1;
      this._stillHereError = null;
      const s = this._data.session;
      if (s) {
        this._data.session = { ...s, idle };
      }
      return idle;
    } catch (e) {
      this._stillHereError = messageOf(e);
      throw e;
    } finally {
      this._stillHerePending = false;
      this._changed.emit();
    }
  }

  /** The quota bar warning ratio (settings). */
  get warnRatio(): number {
    return this._warnRatio;
  }
  set warnRatio(value: number) {
    if (value !== this._warnRatio) {
      this._warnRatio = value;
      this._changed.emit();
    }
  }

  isOpen(section: SectionId): boolean {
    return this._open.has(section);
  }

  /** Open or close a section; opening one fetches what it shows. */
  toggle(section: SectionId, open?: boolean): void {
    const want = open ?? !this._open.has(section);
    if (want === this._open.has(section)) {
      return;
    }
    if (want) {
      this._open.add(section);
      this.invalidate(SECTION_RESOURCES[section]);
      void this.refresh([section]);
    } else {
      this._open.delete(section);
    }
    this._changed.emit();
  }

  /** Whether the "New session" form is shown (a command opens it). */
  get newSessionOpen(): boolean {
    return this._newSessionOpen;
  }
  set newSessionOpen(value: boolean) {
    if (value === this._newSessionOpen) {
      return;
    }
    this._newSessionOpen = value;
    if (value) {
      this._open.add('sessions');
      void this.loadLaunchOptions();
    }
    this._changed.emit();
  }

  /** Whether the "New folder" form is shown (the Start section opens it). */
  get newFolderOpen(): boolean {
    return this._newFolderOpen;
  }
  set newFolderOpen(value: boolean) {
    if (value === this._newFolderOpen) {
      return;
    }
    this._newFolderOpen = value;
    if (value) {
      this.toggle('folders', true);
    }
    this._changed.emit();
  }

  /** Open the "New session" form and have the panel scroll to it. */
  showNewSession(): void {
    this._reveal = 'new-session';
    this.toggle('sessions', true);
    this.newSessionOpen = true;
    this._changed.emit();
  }

  /** Open the "New folder" form and have the panel scroll to it. */
  showNewFolder(): void {
    this._reveal = 'new-folder';
    this.newFolderOpen = true;
    this._changed.emit();
  }

  /** Open the Start section and have the panel scroll to its import form (its URL focused). */
  showImport(): void {
    this._reveal = 'import';
    this.toggle('start', true);
    this._changed.emit();
  }

  /**
   * Whether the form was asked to be shown since the last call (then the caller scrolls to it);
   * answers true once.
   */
  takeReveal(target: RevealTarget): boolean {
    if (this._reveal !== target) {
      return false;
    }
    this._reveal = null;
    return true;
  }

  /**
   * Fetch what the given (default: the open) sections show, side by side; a slow-changing
   * resource (`MIN_AGE_MS`) only when its last answer is older than its minimum age.
   */
  async refresh(sections?: SectionId[]): Promise<void> {
    const wanted = new Set<Resource>();
    for (const s of sections ?? SECTIONS.filter(s => this._open.has(s))) {
      SECTION_RESOURCES[s].forEach(r => wanted.add(r));
    }
    // The session info names the user and this session's project for the other sections.
    if (this._data.session === null) {
      wanted.add('session');
    }
    // The banner shows above every section.
    wanted.add('announcement');
    const now = this._now();
    const due = [...wanted].filter(r => {
      const at = this._fetchedAt[r];
      return at === undefined || now - at >= (MIN_AGE_MS[r] ?? 0);
    });
    await Promise.all(due.map(r => this.fetch(r)));
  }

  /** Let the next `refresh` ask for these (default: all) resources whatever their age. */
  invalidate(resources?: Resource[]): void {
    if (!resources) {
      this._fetchedAt = {};
      return;
    }
    for (const r of resources) {
      delete this._fetchedAt[r];
    }
  }

  /** Fetch one resource; a failure is kept in `errors` (the last good answer stays). */
  async fetch(resource: Resource): Promise<void> {
    // Counted from the ask, failed or not: a failing service is not asked more often.
    this._fetchedAt[resource] = this._now();
    this._inFlight[resource] = (this._inFlight[resource] ?? 0) + 1;
    const stillHereSeq = this._stillHereSeq;
    try {
      const value = await this._load(resource);
      if (resource === 'session') {
        this._sessionAt = this._now();
        const s = value as ISessionInfo;
        if (s?.user) {
          this.user = s.user;
        }
        this._keepIdle(s, stillHereSeq);
        this._setClockOffset(s);
      }
      (this._data as any)[resource] = value;
      delete this._errors[resource];
    } catch (e) {
      this._errors[resource] = messageOf(e);
    }
    this._inFlight[resource] = (this._inFlight[resource] ?? 1) - 1;
    this._changed.emit();
  }

  loadLaunchOptions(): Promise<void> {
    return this.fetch('launchOptions');
  }

  loadStorageHosts(): Promise<void> {
    return this.fetch('hosts');
  }

  /** Start a session named `name`; throws LabfleetError with the service's message. */
  async startSession(name: string, options: ISpawnOptions): Promise<void> {
    await this.api.startSession(name, options);
    this._capacityChanged();
    await this.fetch('sessions');
    await this.fetch('quota');
  }

  /** Stop one of my sessions (not this one: see `stopThisSession`). */
  async stopSession(name: string): Promise<void> {
    await this.api.stopSession(name);
    this._capacityChanged();
    await this.fetch('sessions');
    await this.fetch('quota');
  }

  /** Stop the session this page runs in: afterwards the page has no server. */
  async stopThisSession(): Promise<void> {
    await this.api.stopSession(this.serverName);
  }

  async createFolder(body: IFolderCreate): Promise<IFolder> {
    const folder = await this.api.createFolder(body);
    await this.fetch('folders');
    return folder;
  }

  async invite(folderId: string, invitee: string, permission: string): Promise<IInvitation> {
    const inv = await this.api.invite(folderId, invitee, permission);
    await this.fetch('invitations');
    return inv;
  }

  async answerInvitation(id: string, accept: boolean): Promise<void> {
    await this.api.answerInvitation(id, accept);
    await Promise.all([this.fetch('invitations'), this.fetch('folders')]);
  }

  /** Deploy a model folder as an endpoint; throws LabfleetError with the service's message. */
  async createEndpoint(body: IEndpointCreate): Promise<IEndpoint> {
    const e = await this.api.createEndpoint(body);
    this._capacityChanged();
    await Promise.all([this.fetch('endpoints'), this.fetch('quota')]);
    return e;
  }

  async scaleEndpoint(name: string, replicas: number): Promise<void> {
    await this.api.scaleEndpoint(name, replicas);
    this._capacityChanged();
    await Promise.all([this.fetch('endpoints'), this.fetch('quota')]);
  }

  async deleteEndpoint(name: string): Promise<void> {
    await this.api.deleteEndpoint(name);
    this._capacityChanged();
    await Promise.all([this.fetch('endpoints'), this.fetch('quota')]);
  }

  /** A new token of an endpoint: its value is in this answer only (the list never shows it). */
  createEndpointToken(name: string, expiresIn?: number): Promise<IEndpointToken> {
    return this.api.createEndpointToken(name, expiresIn);
  }

  /**
   * Ask for a build of a new environment; throws LabfleetError with the service's message (a
   * refusal records nothing).  A READY one is offered for new sessions: the launch options again.
   */
  async createEnvironment(body: IEnvironmentCreate): Promise<IEnvironment> {
    const env = await this.api.createEnvironment(body);
    this.invalidate(['launchOptions']);
    await this.fetch('environments');
    return env;
  }

  /**
   * Save as environment: ask for a running session of mine (`body.session`) to be committed into
   * a new environment; throws LabfleetError with the service's message (a refusal records
   * nothing).  My Environments opens (or, open, is asked again) and lists the new one.
   */
  async saveAsEnvironment(body: IEnvironmentSave): Promise<IEnvironment> {
    const env = await this.api.createEnvironment(body);
    this.invalidate(['launchOptions']);
    if (this.isOpen('environments')) {
      await this.fetch('environments');
    } else {
      this.toggle('environments', true);
    }
    return env;
  }

  /** Delete an environment (a build that runs stops); throws LabfleetError with the service's message. */
  async deleteEnvironment(id: string): Promise<void> {
    await this.api.deleteEnvironment(id);
    this.invalidate(['launchOptions']);
    await this.fetch('environments');
  }

  /** What the fleet has free moved: the poll's next tick asks the launch options again. */
  private _capacityChanged(): void {
    this.invalidate(['launchOptions']);
  }

  /**
   * The idle object a new session info should carry: the "I'm still here" answer that came
   * after the info was asked for is newer; so is the last one while the service is not answering.
   */
  private _keepIdle(s: ISessionInfo | null, stillHereSeq: number): void {
    const before = this._data.session?.idle;
    if (!s || !before) {
      return;
    }
    const newer = stillHereSeq !== this._stillHereSeq;
    const unknown = (s.idle === null || s.idle === undefined) && s.service && s.service !== 'ok';
    if (newer || unknown) {
      s.idle = before;
    }
  }

  /** The server's clock against this page's, kept steady: moved only by more than 2 s. */
  private _setClockOffset(s: ISessionInfo | null): void {
    const started = instantMs(s?.started_at);
    if (started === null || typeof s?.uptime !== 'number') {
      return;
    }
    // `uptime` is whole seconds, rounded down.
    const offset = started + (s.uptime + 0.5) * 1000 - this._now();
    if (Math.abs(offset - this._clockOffset) > 2000) {
      this._clockOffset = offset;
    }
  }

  private _load(resource: Resource): Promise<unknown> {
    const api = this.api;
    switch (resource) {
      case 'announcement':
        return api.announcement().then((a: IAnnouncementAnswer) => a?.announcement ?? null);
      case 'session':
        return api.session();
      case 'quota':
        return api.quota();
      case 'usage':
        return api.myUsage();
      case 'sessions':
        return api.sessions();
      case 'mounted':
        return api.mountedFolders();
      case 'apps':
        return api.apps();
      case 'folders':
        return api.folders();
      case 'invitations':
        return api.invitations();
      case 'launchOptions':
        return api.launchOptions(this.user);
      case 'hosts':
        return api.storageHosts();
      case 'endpoints':
        return api.endpoints();
      case 'environments':
        return api.environments();
    }
  }

  private _data: IFleetData = {
    announcement: null,
    session: null,
    quota: null,
    usage: null,
    sessions: null,
    mounted: null,
    apps: null,
    folders: null,
    invitations: null,
    launchOptions: null,
    hosts: null,
    endpoints: null,
    environments: null
  };
  private _errors: Partial<Record<Resource, string>> = {};
  private _fetchedAt: Partial<Record<Resource, number>> = {};
  private _inFlight: Partial<Record<Resource, number>> = {};
  private _open = new Set<SectionId>(SECTIONS.filter(s => !CLOSED_AT_FIRST.includes(s)));
  private _newSessionOpen = false;
  private _newFolderOpen = false;
  private _reveal: RevealTarget | null = null;
  private _sessionAt = 0;
  private _warnRatio = 0.8;
  private _clockOffset = 0;
  private _stillHerePending = false;
  private _stillHereError: string | null = null;
  private _stillHereSeq = 0;
  private _now: () => number;
  private _changed = new Signal<this, void>(this);
}
