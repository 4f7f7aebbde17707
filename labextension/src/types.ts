/**
 * The shapes the session's server extension answers (server_ext/ENDPOINTS.md) and the labfleet
 * service's REST API answers through it (`labfleet/api/...`, hub_ext/service/openapi.yaml).
 */

/** Slot amounts: numbers from the API (`mem` in bytes); strings tolerated. */
export type Slots = Record<string, number | string>;

/** Amounts left per slot; `null` means no limit. */
export type SlotsLeft = Record<string, number | string | null>;

export type SessionType = 'interactive' | 'batch' | 'inference';

// Python's labfleet.core.vocab; tests/unit/test_vocabulary.py checks this copy against it.
export const SESSION_TYPES: SessionType[] = ['interactive', 'batch', 'inference'];

export interface IDevice {
  uuid?: string;
  index: number;
  model: string;
  memory?: number | null;
  /** The share of the device this session holds: 1 for a whole device. */
  shares?: number | string | null;
}

export interface IRunner {
  state?: string;
  command?: string;
  exit_code?: number | null;
  output?: string;
}

export interface IInference {
  url: string;
  ready: boolean;
  example?: string;
}

/**
 * Idle reclamation as the labfleet service judges it (`idle` of `GET labfleet/session`, and the
 * answer of `POST labfleet/session/still-here`).
 */
export interface IIdleInfo {
  /** Seconds since the session's last activity. */
  idle_for: number;
  /** Seconds of idleness after which it is reclaimed; null: never for idleness. */
  timeout: number | null;
  /** When the rule that reclaims it first will do it if nothing changes (ISO 8601); null: none will. */
  reclaim_at: string | null;
  /** The idle checker that would reclaim it (`policy:<name>` for a keypair policy's timeout). */
  checker: string | null;
  /** Why, in the service's words (`no activity for 420 s (timeout 540 s)`, `over the last ...`). */
  reason: string | null;
  /** Reclaimed only while another session waits for its resources. */
  only_when_queue_waiting?: boolean;
}

/** `GET labfleet/session` */
/** A fraction of one device (server_ext/fleet.py `gpu_share`). */
export interface IGpuShare {
  shares: number | null;
  /** Bytes of the device's memory the share is; null when the device's size is unknown. */
  memory: number | null;
  /** `mps`: the node's MPS daemon holds the session to it; `caps`: only the frameworks' own caps. */
  enforcement: 'mps' | 'caps' | string;
  /** Why the backend gave the session no MPS where its node runs it (absent: it did not withhold it). */
  mps_withheld?: string;
}

export interface ISessionInfo {
  id: string | null;
  name: string;
  user: string;
  type: SessionType;
  project: string | null;
  domain: string | null;
  image: string | null;
  resource_group: string | null;
  node: string | null;
  status: string | null;
  slots: Slots;
  devices: IDevice[];
  /** The folders mounted here: `vfolder` is the folder's id (server_ext/fleet.py `session_info`). */
  mounts: { vfolder?: string; id?: string; name: string; permission: string }[];
  created_at: string | null;
  started_at: string | null;
  uptime: number | null;
  max_lifetime: number | null;
  expires_at: string | null;
  time_left: number | null;
  /** While the session runs; null or absent otherwise (or from an older server extension). */
  idle?: IIdleInfo | null;
  /** Its share of one device and how the node holds it to it; null for whole devices or none. */
  gpu_share?: IGpuShare | null;
  urls: { lab?: string; base?: string };
  runner: IRunner | null;
  inference: IInference | null;
  service: string;
}

export interface IGpuUsage {
  uuid?: string;
  index: number;
  model: string;
  shares?: number | string | null;
  utilization: number | null;
  memory_used: number | null;
  memory_total: number | null;
  memory_limit: number | null;
  source?: string;
}

/** `GET labfleet/usage` */
export interface IUsage {
  at?: string;
  cpu: { percent: number | null; limit: number | null };
  memory: { used: number | null; limit: number | null };
  gpus: IGpuUsage[];
}

/** One item of `GET labfleet/vfolders`: a folder mounted in this session. */
export interface IMountedFolder {
  id: string;
  name: string;
  owner: string;
  permission: string;
  usage_mode: string;
  host: string;
  /** Relative to the Lab's root, e.g. `vfolders/data`. */
  path: string;
  usage_bytes: number | null;
  max_size: number | null;
  status: string;
}

export interface IQuotaScope {
  limit: Slots;
  used: Slots;
  left: SlotsLeft;
  unspecified?: 'LIMITED' | 'UNLIMITED' | string;
}

/** `GET labfleet/quota` */
export interface IQuota {
  keypair: IQuotaScope | null;
  project: IQuotaScope | null;
  domain: IQuotaScope | null;
  project_name: string | null;
}

/** One item of `GET labfleet/apps`. */
export interface IApp {
  name: string;
  title: string;
  url: string;
  source: 'launcher' | 'image' | string;
}

/** One item of `GET labfleet/sessions`. */
export interface ISessionSummary {
  id: string | null;
  name: string;
  project: string | null;
  type: SessionType | string;
  image: string | null;
  status: string;
  status_reason?: string | null;
  queue_position?: number | null;
  /** A PENDING session: why it waits now and for how long (hub_ext/compute/waiting.py). */
  waiting_for?: string | null;
  /** A serving replica: its endpoint's name (it is scaled there, not stopped). */
  endpoint?: string | null;
  slots?: Slots;
  devices?: IDevice[];
  created_at?: string | null;
  url?: string | null;
  current?: boolean;
}

/** hub_ext/core/capacity.py `FreeNow`: `gpu` whole free devices on one node, `gpu.shares` the largest free part of one. */
export interface IFreeNow {
  alive_nodes: number;
  nodes: number;
  cpu: number;
  mem: number;
  gpu: number;
  'gpu.shares': number;
}

/** `POST /api/sessions/preview`: what a request would do now, changing nothing (`refused`: its error, here). */
export interface IPreview {
  outcome: 'starts' | 'waits' | 'refused';
  message: string;
}

/** `GET labfleet/api/users/<me>/launch-options` (hub_ext/launchoptions.py). */
export interface ILaunchOptions {
  user: string;
  projects: { name: string; left: SlotsLeft }[];
  images: {
    name: string;
    display_name: string;
    min_slots: Slots;
    accelerators: string[];
    projects: string[];
  }[];
  resource_groups: {
    name: string;
    description: string | null;
    session_types: string[];
    /** What one session could get there now: the most one alive node has free. */
    free_now?: IFreeNow;
    pending_timeout?: number;
  }[];
  role?: string;
  /** What every launcher offers first (hub_ext/core/vocab.py DEFAULT_SESSION_SLOTS). */
  defaults?: { cpu: number; mem: number; gpu: number };
  /** Who may add the user to a project, by name. */
  project_admins?: string[];
  vfolders: {
    id: string;
    name: string;
    owner: string;
    permission: string | null;
    usage_mode: string;
    host: string;
    auto: boolean;
    mountable: boolean;
  }[];
}

/** What `POST labfleet/sessions/<name>` takes (spawner/options.py). */
export interface ISpawnOptions {
  project: string;
  type: SessionType;
  image?: string;
  resource_group?: string;
  cpu?: string;
  mem?: string;
  gpu?: string;
  vfolders?: string[];
  command?: string;
}

/** One item of `GET labfleet/api/vfolders` (hub_ext/vfolders.py `folder_view`). */
export interface IFolder {
  id: string;
  name: string;
  host: string;
  owner: string;
  owner_kind: 'user' | 'project' | string;
  domain: string;
  usage_mode: string;
  permission: string | null;
  is_owner: boolean;
  can_manage: boolean;
  status: string;
  auto_mount: boolean;
  creator?: string | null;
  created_at?: string | null;
  project_permission?: string;
  usage: {
    bytes: number;
    files?: number;
    trash_bytes?: number;
    scanned_at?: string | null;
  };
  limits: {
    max_size: number | null;
    scope: {
      kind: string;
      name: string;
      used: number;
      limit: number | null;
      folders: number;
      max_folders: number | null;
    };
  };
  rights?: string[];
}

/** `POST labfleet/api/vfolders` body. */
export interface IFolderCreate {
  name: string;
  host?: string;
  usage_mode?: string;
  max_size?: number;
}

/** hub_ext/vfshare.py `invitation_view`. */
export interface IInvitation {
  id: string;
  vfolder: string;
  vfolder_name: string;
  inviter: string;
  invitee: string;
  permission: string;
  state: string;
  created_at: string | null;
}

/** One item of `GET labfleet/api/storage-hosts`. */
export interface IStorageHost {
  name: string;
  description?: string | null;
  capacity?: number | null;
  used?: number;
  is_active: boolean;
  /** Listings: the host of a folder created without one. */
  is_default?: boolean;
  rights?: string[];
}

// Folder rights: Python's labfleet.core.vocab, checked against it (tests/unit/test_vocabulary.py).
export const PERMISSIONS = ['ro', 'rw', 'wd'] as const;
export const USAGE_MODES = ['general', 'model', 'data'] as const;

/**
 * Amounts of a usage statistic, in slot-seconds: `cpu` core-seconds, `mem` byte-seconds,
 * `gpu.shares` device-share-seconds (a whole GPU counts 1 per second, half a GPU 0.5).
 * `used` adds the peaks `mem_peak` and `gpu_mem_peak` (bytes).
 */
export type UsageAmounts = Record<string, number | null>;

/** What one period, day or report row adds up (hub_ext/usage/stats.py). */
export interface IUsageFigures {
  sessions: number;
  allocated: UsageAmounts;
  used: UsageAmounts;
  /** used / allocated per slot; null where nothing was allocated. */
  efficiency: Record<string, number | null>;
}

/** One period of `GET labfleet/api/usage/me`: `7d`, `30d`, `month`. */
export interface IUsagePeriod extends IUsageFigures {
  key: string;
  label: string;
  start: string;
  end: string;
}

/** One day of `GET labfleet/api/usage/me` (`bucket`: the day's start, ISO). */
export interface IUsageDay extends IUsageFigures {
  bucket: string;
}

/** `GET labfleet/api/usage/me`: my usage over the last 7 and 30 days, and day by day. */
export interface IMyUsage {
  user: string;
  now: string;
  periods: IUsagePeriod[];
  /** The last 30 days, oldest first; days with nothing are there with zeros. */
  daily: IUsageDay[];
}

/** The announcement in force (`GET labfleet/api/announcement`): a banner at the top of the panel. */
export interface IAnnouncement {
  id: number;
  /** Plain text, shown as text (line breaks kept). */
  text: string;
  level: 'info' | 'warning';
  published_at: string | null;
  /** The superadmin who published it (admins and monitors only). */
  published_by?: string;
}

/** `GET labfleet/api/announcement`: the announcement, or null when there is none. */
export interface IAnnouncementAnswer {
  announcement: IAnnouncement | null;
}

// ------------------------------------------------------------ model serving (issue 20)

/** One replica of an endpoint (`routes[]` of GET /api/endpoints/{name}). */
export interface IEndpointRoute {
  id: number;
  server: string;
  session_id: string | null;
  address: string;
  status: string;
  health: string;
  traffic: string;
  failures: number;
  last_error: string | null;
  created_at: string | null;
  ready_at: string | null;
  checked_at: string | null;
  ended_at: string | null;
}

/** A model serving endpoint (GET /api/endpoints). */
export interface IEndpoint {
  id: string;
  name: string;
  owner: string;
  project: string;
  domain: string;
  model_folder: { id: string | null; name: string | null };
  image: string | null;
  resource_group: string | null;
  slots: Slots;
  replicas: number;
  active_replicas: number;
  healthy_replicas: number;
  status: string;
  status_reason: string | null;
  open_to_public: boolean;
  /** The endpoint's one URL, a path on the Hub's host (`/services/labfleet/serve/<name>/`). */
  url: string;
  requests: number;
  errors: number;
  latency_ms_avg: number | null;
  last_error: string;
  created_at: string | null;
  routes?: IEndpointRoute[];
}

/** What `POST /api/endpoints` takes. */
export interface IEndpointCreate {
  name: string;
  project: string;
  model_folder: string;
  replicas: number;
  slots: Slots;
  open_to_public?: boolean;
}

/** A token of an endpoint; `token` only in the answer that made it. */
export interface IEndpointToken {
  id: number;
  note: string;
  rate_limit: number;
  created_by: string;
  created_at: string | null;
  expires_at: string | null;
  last_used: string | null;
  revoked_at: string | null;
  valid: boolean;
  requests: number;
  latency_ms_avg: number | null;
  token?: string;
}

// ------------------------------------------------------------ Import & Run (issue 31)

/** Where an import stands (hub_ext/storage/imports.py `STATUSES`). */
export type ImportStatus = 'fetching' | 'writing' | 'done' | 'failed';

/** What a re-sync did to the files already there (nbgitpuller's rules): paths in the folder. */
export interface IImportReport {
  updated: string[];
  kept: string[];
  renamed: string[];
}

/** An import job (`POST /api/imports`, `GET /api/imports/{id}`; openapi.yaml `Import`). */
export interface IImportJob {
  id: string;
  url: string;
  kind: 'notebook' | 'repository' | 'archive' | string;
  status: ImportStatus | string;
  /** What it did, or why it failed, in the service's words. */
  message: string;
  folder: { id: string | null; name: string };
  /** What a session opens, relative to the folder ("": the folder itself). */
  path: string;
  resync?: boolean;
  report: IImportReport;
  /** The session options the request gave (project, image, gpu, resource_group). */
  session?: Record<string, unknown>;
  created_at?: string;
  finished_at?: string | null;
}

/** What `POST /api/imports` takes (openapi.yaml `ImportCreate`). */
export interface IImportCreate {
  url: string;
  /** A folder's name or id; absent: a new folder of mine, named after what is imported. */
  folder?: string;
  branch?: string;
  /** A path inside what is imported, for a session to open. */
  open?: string;
  project?: string;
  image?: string;
  gpu?: number;
  resource_group?: string;
}

// ------------------------------------------------------------ My Environments (issue "My Environments")

/** Where an environment's build stands (hub_ext/core/vocab.py ENVIRONMENT_STATUSES). */
export type EnvironmentStatus = 'QUEUED' | 'BUILDING' | 'READY' | 'FAILED';

/** An environment (hub_ext/compute/environments.py `view()`): a registered base plus a recipe. */
export interface IEnvironment {
  id: string;
  name: string;
  owner_kind: 'user' | 'project' | string;
  /** `user:<name>` or `project:<domain>/<project>`. */
  owner: string;
  /** A project environment's project (`domain/project`); null: a personal one. */
  project: string | null;
  domain?: string;
  creator?: string;
  /** The registered image it is built on. */
  base: string;
  /** The recipe's files (`requirements.txt`, `apt.txt`, ...) and their text. */
  files?: Record<string, string>;
  status: EnvironmentStatus | string;
  /** Why it is FAILED (or how it got READY at once); "" when there is nothing to say. */
  status_reason: string;
  image: string | null;
  size_bytes: number;
  /** Save as environment: the session it was made of; null or absent for a build of a recipe. */
  source_session?: string | null;
  created_at: string | null;
  started_at?: string | null;
  finished_at?: string | null;
}

/** What `POST /api/environments` takes to build a recipe. */
export interface IEnvironmentCreate {
  name: string;
  base: string;
  /** `domain/project`; absent: a personal environment. */
  project?: string;
  files: Record<string, string>;
}

/**
 * What `POST /api/environments` takes for Save as environment: one of my running Docker or Swarm
 * sessions, committed into an image (its base: the session's registered image).
 */
export interface IEnvironmentSave {
  name: string;
  /** The session's id (`ISessionInfo.id`). */
  session: string;
  /** `domain/project`; absent: a personal environment. */
  project?: string;
}

/** A piece of a build log asked with `?offset=`: the bytes after it, and the log's size then. */
export interface ILogPiece {
  bytes: Uint8Array;
  /** `X-Log-Size`: the log's size in bytes when it was read; null when the answer did not say. */
  size: number | null;
}
