/**
 * Pure helpers for the sidebar and the status bar: formatting, quota levels, the cost of a
 * new session against what is left.  No DOM, no requests: the unit tests cover these.
 */
import type {
  IDevice,
  IFolder,
  IGpuShare,
  IGpuUsage,
  IIdleInfo,
  IMyUsage,
  IQuotaScope,
  ISessionSummary,
  IUsage,
  IUsageFigures,
  Slots,
  SlotsLeft
} from './types';

/** The order slots are shown in; others follow by name. */
export const SLOT_ORDER = ['cpu', 'mem', 'gpu', 'gpu.shares'];

/** At this fraction of a limit a bar turns to a warning. */
export const DEFAULT_WARN_RATIO = 0.8;

/** The smallest share of a GPU (spawner/options.py GPU_QUANTUM). */
export const GPU_QUANTUM = 0.01;

// Amounts are compared with a little slack: slot amounts come as decimals (0.01 shares).
const EPSILON = 1e-9;

export function toNumber(value: unknown): number | null {
  if (typeof value === 'number') {
    return Number.isFinite(value) ? value : null;
  }
  if (typeof value === 'string' && value.trim() !== '') {
    const n = Number(value);
    return Number.isFinite(n) ? n : null;
  }
  return null;
}

/** A number with at most `digits` decimals and no trailing zeros: 0.5, 2, 1.25. */
export function formatNumber(n: number, digits = 2): string {
  const f = 10 ** digits;
  const rounded = Math.round(n * f) / f;
  return String(Object.is(rounded, -0) ? 0 : rounded);
}

const BYTE_UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

/** Bytes in binary units: `0 B`, `512 MiB`, `1.5 GiB`. */
export function formatBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined || !Number.isFinite(bytes)) {
    return '–';
  }
  const sign = bytes < 0 ? '-' : '';
  let n = Math.abs(bytes);
  let unit = 0;
  while (n >= 1024 && unit < BYTE_UNITS.length - 1) {
    n /= 1024;
    unit += 1;
  }
  const digits = unit === 0 ? 0 : n < 10 ? 2 : n < 100 ? 1 : 0;
  return `${sign}${formatNumber(n, digits)} ${BYTE_UNITS[unit]}`;
}

/** The base kind of a slot name: `gpu.shares:A100` → `gpu.shares`. */
export function baseSlot(slot: string): string {
  return slot.split(':', 1)[0];
}

export function slotLabel(slot: string): string {
  const [base, model] = slot.split(':', 2);
  const label =
    {
      cpu: 'CPU',
      mem: 'Memory',
      gpu: 'GPU',
      'gpu.shares': 'GPU shares'
    }[base] ?? base;
  return model ? `${label} (${model})` : label;
}

/** An amount of a slot for a person: memory in bytes units, CPU in cores, GPUs as counts. */
export function formatSlot(slot: string, amount: unknown): string {
  const n = toNumber(amount);
  if (n === null) {
    return amount === null || amount === undefined ? '–' : String(amount);
  }
  switch (baseSlot(slot)) {
    case 'mem':
      return formatBytes(n);
    case 'cpu':
      return `${formatNumber(n, 3)} ${n === 1 ? 'core' : 'cores'}`;
    case 'gpu':
      return `${formatNumber(n)} ${n === 1 ? 'GPU' : 'GPUs'}`;
    case 'gpu.shares':
      return formatNumber(n);
    default:
      return formatNumber(n, 3);
  }
}

/**
 * Use against a limit in few words: `3.5 / 4 cores · 0.5 left`, `1 GiB / 8 GiB · 7 GiB left`,
 * `1 core used · no limit`.
 */
export function formatQuotaRow(r: Pick<IQuotaRow, 'slot' | 'used' | 'limit' | 'left'>): string {
  if (r.limit === null) {
    return `${formatSlot(r.slot, r.used)} used · no limit`;
  }
  const base = baseSlot(r.slot);
  // Counts share the limit's unit: "3.5 / 4 cores"; sizes keep their own: "1 GiB / 8 GiB".
  const amount = (n: number) => (base === 'mem' ? formatSlot(r.slot, n) : formatNumber(n, 3));
  return `${amount(r.used)} / ${formatSlot(r.slot, r.limit)} · ${amount(r.left ?? 0)} left`;
}

/** `{cpu: 1, mem: 1g}` → `1 core, 1 GiB`. */
export function formatSlots(slots: Slots | null | undefined): string {
  if (!slots) {
    return '–';
  }
  const names = sortSlots(Object.keys(slots));
  if (!names.length) {
    return '–';
  }
  return names
    .map(s =>
      baseSlot(s) === 'gpu.shares' ? `${formatSlot(s, slots[s])} GPU` : formatSlot(s, slots[s])
    )
    .join(', ');
}

export function sortSlots(names: Iterable<string>): string[] {
  const rank = (s: string) => {
    const i = SLOT_ORDER.indexOf(baseSlot(s));
    return i < 0 ? SLOT_ORDER.length : i;
  };
  return [...new Set(names)].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
}

/** "0.5 of GPU 0 (A100-80GB)", or "GPU 1 (A100-80GB)" for a whole device. */
export function deviceLabel(d: Pick<IDevice, 'index' | 'model' | 'shares'>): string {
  const name = `GPU ${d.index}${d.model ? ` (${d.model})` : ''}`;
  const shares = toNumber(d.shares);
  if (shares === null || shares >= 1 - EPSILON) {
    return name;
  }
  return `${formatNumber(shares)} of ${name}`;
}

/**
 * A fraction of a device and how it holds: `0.25 of a GPU · 35.2 GiB · held by MPS`, or
 * `… · framework caps only (advisory)` where the node runs no MPS daemon, or
 * `… · framework caps only (advisory; MPS withheld: why)` where the backend withheld it.
 */
export function gpuShareLabel(g: IGpuShare): string {
  const parts = [g.shares === null ? 'a share of a GPU' : `${formatNumber(g.shares)} of a GPU`];
  if (g.memory !== null) {
    parts.push(formatBytes(g.memory));
  }
  if (g.enforcement === 'mps') {
    parts.push('held by MPS');
  } else if (g.mps_withheld) {
    parts.push(`framework caps only (advisory; MPS withheld: ${g.mps_withheld})`);
  } else {
    parts.push('framework caps only (advisory)');
  }
  return parts.join(' · ');
}

/** Seconds for a person: `42s`, `5m 3s`, `2h 5m`, `3d 4h`. */
export function formatDuration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) {
    return 'no limit';
  }
  const s = Math.max(0, Math.floor(seconds));
  const d = Math.floor(s / 86400);
  const h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  const sec = s % 60;
  if (d > 0) {
    return h ? `${d}d ${h}h` : `${d}d`;
  }
  if (h > 0) {
    return m ? `${h}h ${m}m` : `${h}h`;
  }
  if (m > 0) {
    return sec ? `${m}m ${sec}s` : `${m}m`;
  }
  return `${sec}s`;
}

/**
 * Time left before a session's max lifetime, `elapsed` seconds after the server said
 * `timeLeft` (the panel counts down between polls).  `null`: no limit.
 */
export function timeLeftNow(timeLeft: number | null | undefined, elapsed: number): number | null {
  if (timeLeft === null || timeLeft === undefined) {
    return null;
  }
  return Math.max(0, timeLeft - Math.max(0, elapsed));
}

/** `warn` when less than 10 % of the lifetime or 15 minutes is left, `over` at zero. */
export function timeLeftLevel(timeLeft: number | null, maxLifetime: number | null): Level {
  if (timeLeft === null) {
    return 'unlimited';
  }
  if (timeLeft <= 0) {
    return 'over';
  }
  const soon = Math.max(15 * 60, (maxLifetime ?? 0) * 0.1);
  return timeLeft <= soon ? 'warn' : 'ok';
}

// ---------------------------------------------------------------- idle reclamation

/** The idle warning shows when the reclamation is less than this many seconds away. */
export const IDLE_WARN_S = 600;

/** A notification this many seconds before the reclamation, each once per deadline. */
export const IDLE_NOTIFY_S = [300, 60];

/** An ISO 8601 instant in ms since the epoch; null when absent or unreadable. */
export function instantMs(iso: string | null | undefined): number | null {
  if (!iso) {
    return null;
  }
  const ms = Date.parse(iso);
  return Number.isFinite(ms) ? ms : null;
}

/** A countdown: `9:59`, `0:05`, `1:02:03`; whole seconds rounded up, never below `0:00`. */
export function formatCountdown(seconds: number): string {
  const s = Math.max(0, Math.ceil(seconds - 1e-6));
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const sec = String(s % 60).padStart(2, '0');
  return h > 0 ? `${h}:${String(m).padStart(2, '0')}:${sec}` : `${m}:${sec}`;
}

/** Seconds in a few words: `40 s`, `1 minute`, `9 minutes`, `1 h 30 min`. */
export function formatAbout(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) {
    return `${s} s`;
  }
  const minutes = Math.round(s / 60);
  if (minutes < 60) {
    return minutes === 1 ? '1 minute' : `${minutes} minutes`;
  }
  const h = Math.floor(minutes / 60);
  const m = minutes % 60;
  return m ? `${h} h ${m} min` : `${h} h`;
}

/** What the rule looks at: activity (requests, kernels, terminals) or the use of resources. */
export type IdleKind = 'activity' | 'utilization' | 'other';

// hub_ext/reclaim/checkers.py: a utilization judgment names its thresholds ("cpu_util 1.2 % < 5 %").
const UTIL_RE = /\b(cpu_util|gpu_util|gpu_mem|mem) [\d.]+ % (<|>=)/;
const UTIL_LABELS: Record<string, string> = {
  cpu_util: 'CPU',
  gpu_util: 'GPU',
  mem: 'memory',
  gpu_mem: 'GPU memory'
};

/** What the rule that would reclaim the session looks at, from the service's words. */
export function idleKind(idle: Pick<IIdleInfo, 'reason'>): IdleKind {
  const reason = idle.reason ?? '';
  if (/^over the last\b/.test(reason) || UTIL_RE.test(reason)) {
    return 'utilization';
  }
  if (/no activity|kernel is computing/.test(reason)) {
    return 'activity';
  }
  return 'other';
}

/** The resources a utilization judgment found under their thresholds: `['CPU', 'GPU']`. */
export function lowResources(reason: string | null | undefined): string[] {
  const out: string[] = [];
  for (const m of (reason ?? '').matchAll(new RegExp(UTIL_RE.source, 'g'))) {
    const label = UTIL_LABELS[m[1]];
    if (m[2] === '<' && !out.includes(label)) {
      out.push(label);
    }
  }
  return out;
}

/** `policy:default` → `your resource policy "default"`, `short` → `the idle checker "short"`. */
export function checkerLabel(checker: string | null | undefined): string {
  if (!checker) {
    return 'an idle checker';
  }
  if (checker.startsWith('policy:')) {
    return `your resource policy "${checker.slice('policy:'.length)}"`;
  }
  return `the idle checker "${checker}"`;
}

/** A list in words: `CPU`, `CPU and GPU`, `CPU, memory and GPU`. */
function andList(items: string[]): string {
  return items.length <= 1
    ? items.join('')
    : `${items.slice(0, -1).join(', ')} and ${items[items.length - 1]}`;
}

export interface IIdleWarning {
  /** Seconds until the reclamation; 0 or less: due (the service's next round does it). */
  secondsLeft: number;
  /** `4:32` */
  countdown: string;
  /** Reclaimed only while another session waits for its resources. */
  contention: boolean;
  kind: IdleKind;
  /** The headline, e.g. `This session will be stopped for inactivity in 4:32`. */
  title: string;
  /** Why, in a person's words: `Its CPU and GPU use is low.` */
  why: string;
  /** The service's own words, with the rule that decides: for a tooltip. */
  detail: string;
  /** The short status bar text: `stops in 4:32`, `stopping`. */
  short: string;
}

/**
 * The warning to show `secondsLeft` before the idle reclamation (`IIdleInfo.reclaim_at` less now),
 * or null outside the last `IDLE_WARN_S` seconds or when no rule plans one.
 */
export function idleWarning(
  idle: IIdleInfo | null | undefined,
  secondsLeft: number | null
): IIdleWarning | null {
  if (!idle || secondsLeft === null || !Number.isFinite(secondsLeft)) {
    return null;
  }
  if (secondsLeft >= IDLE_WARN_S) {
    return null;
  }
  if (/kernel is computing/.test(idle.reason ?? '')) {
    // The deadline moves on with every instant the kernel computes: nothing to warn about.
    return null;
  }
  const contention = idle.only_when_queue_waiting === true;
  const due = secondsLeft <= 0;
  const countdown = formatCountdown(secondsLeft);
  let title: string;
  if (due) {
    title = contention
      ? 'This session will be stopped for inactivity as soon as someone needs its resources'
      : 'This session will be stopped for inactivity at any moment';
  } else {
    title =
      `This session will be stopped for inactivity in ${countdown}` +
      (contention ? ', but only if someone needs its resources' : '');
  }
  const kind = idleKind(idle);
  const rule = checkerLabel(idle.checker);
  let why: string;
  if (kind === 'utilization') {
    const low = lowResources(idle.reason);
    why = `Its ${low.length ? andList(low) : 'CPU/GPU'} use is low (${rule}).`;
  } else if (kind === 'activity' && idle.timeout !== null && idle.timeout > 0) {
    // The activity rule's deadline is the last activity plus the timeout.
    const idleFor = Math.max(idle.timeout - Math.max(secondsLeft, 0), 0);
    why =
      `No activity in it for ${formatAbout(idleFor)}; ${rule} stops sessions ` +
      `after ${formatAbout(idle.timeout)} without activity.`;
  } else {
    why = `It has been idle (${rule}).`;
  }
  const detail = [idle.checker ? `idle checker ${idle.checker}` : '', idle.reason ?? '']
    .filter(Boolean)
    .join(': ');
  return {
    secondsLeft,
    countdown,
    contention,
    kind,
    title,
    why,
    detail,
    short: due ? 'idle: stopping' : `idle: stops in ${countdown}`
  };
}

/**
 * The notification due `secondsLeft` before the reclamation: the smallest threshold of
 * `IDLE_NOTIFY_S` reached and not yet `fired` (seconds), or null.
 */
export function idleNotificationDue(secondsLeft: number | null, fired: number[]): number | null {
  if (secondsLeft === null) {
    return null;
  }
  const reached = IDLE_NOTIFY_S.filter(t => secondsLeft <= t);
  if (!reached.length) {
    return null;
  }
  const smallest = Math.min(...reached);
  return fired.includes(smallest) ? null : smallest;
}

/** The notification's text (JupyterLab cuts a message at 140 characters). */
export function idleNotificationText(
  secondsLeft: number,
  deadline: Date,
  contention: boolean
): string {
  const when = deadline.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
  const only = contention ? ' if someone needs its resources' : '';
  if (secondsLeft <= 0) {
    return `This session will be stopped for inactivity at any moment${only}.`;
  }
  const minutes = Math.max(1, Math.round(secondsLeft / 60));
  const inWords = minutes === 1 ? '1 minute' : `${minutes} minutes`;
  return `This session will be stopped for inactivity in about ${inWords} (at ${when})${only}.`;
}

/**
 * ok / warn / over: how close `used` is to `limit`.  `unlimited` when there is no limit,
 * `none` when the limit is zero and nothing is used (the slot is simply not granted).
 */
export type Level = 'ok' | 'warn' | 'over' | 'unlimited' | 'none';

export function quotaLevel(
  used: number,
  limit: number | null,
  warnRatio = DEFAULT_WARN_RATIO
): Level {
  if (limit === null) {
    return 'unlimited';
  }
  if (limit <= 0) {
    return used > EPSILON ? 'over' : 'none';
  }
  if (used >= limit - EPSILON) {
    return 'over';
  }
  return used >= limit * warnRatio - EPSILON ? 'warn' : 'ok';
}

export interface IQuotaRow {
  slot: string;
  used: number;
  /** null: no limit */
  limit: number | null;
  /** null: no limit */
  left: number | null;
  /** used / limit, clamped to [0, 1]; 0 without a limit */
  fraction: number;
  level: Level;
}

/**
 * One row per slot of a quota scope (`GET labfleet/quota`).  A slot the scope does not name
 * follows `unspecified`: no limit when UNLIMITED, none left when LIMITED.
 */
export function quotaRows(scope: IQuotaScope, warnRatio = DEFAULT_WARN_RATIO): IQuotaRow[] {
  const names = sortSlots([
    ...Object.keys(scope.limit ?? {}),
    ...Object.keys(scope.used ?? {}),
    ...Object.keys(scope.left ?? {})
  ]);
  const unlimited = scope.unspecified !== 'LIMITED';
  return names.map(slot => {
    const used = toNumber(scope.used?.[slot]) ?? 0;
    let limit: number | null =
      slot in (scope.limit ?? {}) ? toNumber(scope.limit[slot]) : unlimited ? null : 0;
    const leftRaw = scope.left?.[slot];
    let left: number | null;
    if (leftRaw === null) {
      // The server's word: nothing limits this slot.
      limit = null;
      left = null;
    } else {
      left = toNumber(leftRaw) ?? (limit === null ? null : Math.max(limit - used, 0));
    }
    const fraction =
      limit === null ? 0 : limit <= 0 ? (used > 0 ? 1 : 0) : Math.min(Math.max(used / limit, 0), 1);
    return {
      slot,
      used,
      limit,
      left,
      fraction,
      level: quotaLevel(used, limit, warnRatio)
    };
  });
}

// ---------------------------------------------------------------- a new session's cost

const MEM_RE = /^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$/i;
const MEM_UNITS: Record<string, number> = {
  '': 1,
  k: 2 ** 10,
  m: 2 ** 20,
  g: 2 ** 30,
  t: 2 ** 40
};

/** Bytes from `8g`, `512m`, `1.5GiB` or plain bytes, as the spawner reads them; throws a message. */
export function parseMem(value: string, what = 'memory'): number {
  const m = MEM_RE.exec(value);
  if (!m) {
    throw new Error(`${what} must be a size like 8g or 512m, not "${value}"`);
  }
  const bytes = Math.floor(Number(m[1]) * MEM_UNITS[m[2].toLowerCase()]);
  if (bytes <= 0) {
    throw new Error(`${what} must be more than 0`);
  }
  return bytes;
}

/** Bytes as a form value: `2g`, `512m`, or plain bytes when no unit divides them. */
export function memInput(bytes: number): string {
  for (const unit of ['t', 'g', 'm', 'k']) {
    const size = MEM_UNITS[unit];
    if (bytes >= size && bytes % size === 0) {
      return `${bytes / size}${unit}`;
    }
  }
  return String(Math.floor(bytes));
}

/** Is `n` a multiple of `quantum` (within float noise)? */
function onStep(n: number, quantum: number): boolean {
  const steps = n / quantum;
  return Math.abs(steps - Math.round(steps)) < 1e-6;
}

export interface IChoice {
  cpu: string;
  mem: string;
  gpu: string;
}

export interface IRequested {
  /** What the service charges against quotas (a whole GPU counts as a share too). */
  charged: Record<string, number>;
  /** Input problems, one message per field. */
  errors: Record<string, string>;
}

/**
 * The slots a form choice asks for.  Empty fields ask nothing (the service's defaults apply).
 * Whole GPUs are charged as `gpu` and as `gpu.shares` (hub_ext/slots.py `charged`), a fraction
 * as `gpu.shares` only.
 */
export function requestedSlots(choice: IChoice): IRequested {
  const charged: Record<string, number> = {};
  const errors: Record<string, string> = {};
  const cpu = choice.cpu.trim();
  if (cpu) {
    const n = Number(cpu);
    if (!Number.isFinite(n) || n <= 0) {
      errors.cpu = `CPU must be a number of cores above 0, not "${cpu}"`;
    } else if (!onStep(n, 0.001)) {
      errors.cpu = 'CPU takes steps of 0.001';
    } else {
      charged.cpu = n;
    }
  }
  const mem = choice.mem.trim();
  if (mem) {
    try {
      charged.mem = parseMem(mem);
    } catch (e) {
      errors.mem = (e as Error).message;
    }
  }
  const gpu = choice.gpu.trim();
  if (gpu) {
    const n = Number(gpu);
    if (!Number.isFinite(n) || n < 0) {
      errors.gpu = `GPU must be a number (0.5 = half a device), not "${gpu}"`;
    } else if (!onStep(n, GPU_QUANTUM)) {
      errors.gpu = `GPU takes steps of ${GPU_QUANTUM}`;
    } else if (n > 0) {
      if (Number.isInteger(n)) {
        charged.gpu = n;
      }
      charged['gpu.shares'] = n;
    }
  }
  return { charged, errors };
}

export interface ICostRow {
  slot: string;
  requested: number;
  /** null: no limit */
  left: number | null;
  /** What would be left afterwards; null: no limit */
  after: number | null;
  fits: boolean;
}

export interface ICost {
  rows: ICostRow[];
  fits: boolean;
}

/** What a request would take from what is left (launch-options' per-project `left`). */
export function costAgainstQuota(
  charged: Record<string, number>,
  left: SlotsLeft | null | undefined
): ICost {
  const rows = sortSlots(Object.keys(charged)).map(slot => {
    const requested = charged[slot];
    const raw = left ? left[slot] : null;
    // A slot the launch options do not mention is not limited by any scope.
    const l = raw === null || raw === undefined ? null : toNumber(raw);
    const fits = l === null || requested <= l + EPSILON;
    return {
      slot,
      requested,
      left: l,
      after: l === null ? null : l - requested,
      fits
    };
  });
  return { rows, fits: rows.every(r => r.fits) };
}

/** The image's minimum slots that the choice does not reach: messages. */
export function belowImageMinimum(
  charged: Record<string, number>,
  minSlots: Slots | null | undefined
): string[] {
  const out: string[] = [];
  for (const slot of sortSlots(Object.keys(minSlots ?? {}))) {
    const min = toNumber(minSlots?.[slot]);
    if (min === null || min <= 0 || !(slot in charged)) {
      continue; // not asked: the service fills in at least the image's minimum
    }
    if (charged[slot] + EPSILON < min) {
      out.push(`the image needs at least ${formatSlot(slot, min)} of ${slotLabel(slot)}`);
    }
  }
  return out;
}

// ---------------------------------------------------------------- sessions

const SERVER_NAME_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;

/** null when fine, else why not. */
export function serverNameProblem(name: string, taken: string[] = []): string | null {
  if (!name) {
    return 'give the session a name';
  }
  if (!SERVER_NAME_RE.test(name)) {
    return 'a session name is up to 63 letters, digits, ".", "_" or "-", starting with a letter or digit';
  }
  if (taken.includes(name)) {
    return `you already have a session named ${name}`;
  }
  return null;
}

/** `session-1`, `session-2`, ...: the first not taken. */
export function suggestServerName(taken: string[], prefix = 'session'): string {
  for (let i = 1; i < 10000; i++) {
    const name = `${prefix}-${i}`;
    if (!taken.includes(name)) {
      return name;
    }
  }
  return `${prefix}-${Date.now()}`;
}

/** `PENDING (#2 in queue)`, `RUNNING`, `ERROR: why`. */
export function sessionStatusLabel(
  s: Pick<ISessionSummary, 'status' | 'queue_position' | 'status_reason'>
): string {
  const status = s.status || 'UNKNOWN';
  if (status === 'PENDING' && s.queue_position !== null && s.queue_position !== undefined) {
    return `PENDING (#${s.queue_position} in queue)`;
  }
  if (s.status_reason && !['RUNNING', 'PENDING'].includes(status)) {
    return `${status}: ${s.status_reason}`;
  }
  return status;
}

/** A session's display name: the default server is "(default)". */
export function sessionDisplayName(name: string): string {
  return name === '' ? '(default)' : name;
}

// ---------------------------------------------------------------- folders

export interface IFolderUsage {
  used: number;
  /** The tighter of the folder's own limit and its scope's room; null: no limit */
  limit: number | null;
  fraction: number;
  level: Level;
}

/** A folder's use against its own size limit (or else its owner's storage quota). */
export function folderUsage(
  f: Pick<IFolder, 'usage' | 'limits'>,
  warnRatio = DEFAULT_WARN_RATIO
): IFolderUsage {
  const used = f.usage?.bytes ?? 0;
  const own = toNumber(f.limits?.max_size);
  const limit = own !== null && own > 0 ? own : null;
  const fraction = limit ? Math.min(used / limit, 1) : 0;
  return { used, limit, fraction, level: quotaLevel(used, limit, warnRatio) };
}

/** The owner's storage quota for the folder's scope (user or project). */
export function scopeUsage(
  f: Pick<IFolder, 'limits'>,
  warnRatio = DEFAULT_WARN_RATIO
): IFolderUsage {
  const scope = f.limits?.scope;
  const used = scope?.used ?? 0;
  const raw = toNumber(scope?.limit);
  const limit = raw !== null && raw > 0 ? raw : null;
  const fraction = limit ? Math.min(used / limit, 1) : 0;
  return { used, limit, fraction, level: quotaLevel(used, limit, warnRatio) };
}

export function permissionLabel(p: string | null | undefined): string {
  return (
    { ro: 'read-only', rw: 'read-write', wd: 'read-write-delete' }[p ?? ''] ?? (p ? p : 'no access')
  );
}

/** May this user invite others to the folder?  Only owners of user folders with the right. */
export function canInvite(
  f: Pick<IFolder, 'is_owner' | 'owner_kind' | 'rights' | 'status'>
): boolean {
  return (
    f.is_owner &&
    f.owner_kind === 'user' &&
    f.status === 'READY' &&
    (f.rights === undefined || f.rights.includes('invite-others'))
  );
}

// ---------------------------------------------------------------- usage (status bar)

export function percent(n: number | null | undefined): string {
  return n === null || n === undefined ? '–' : `${Math.round(n)}%`;
}

/** The memory a GPU user may fill: the session's limit on a shared device, else the device's. */
export function gpuMemoryCap(g: IGpuUsage): number | null {
  return g.memory_limit ?? g.memory_total ?? null;
}

/** The short status bar text: `GPU 37% 2.0 GiB · CPU 12% · Mem 118 MiB`. */
export function usageSummary(u: IUsage | null): string {
  if (!u) {
    return 'labfleet: –';
  }
  const parts: string[] = [];
  const gpus = u.gpus ?? [];
  if (gpus.length === 1) {
    const g = gpus[0];
    parts.push(`GPU ${percent(g.utilization)} ${formatBytes(g.memory_used)}`);
  } else if (gpus.length > 1) {
    const known = gpus.filter(g => g.utilization !== null);
    const avg = known.length
      ? known.reduce((a, g) => a + (g.utilization ?? 0), 0) / known.length
      : null;
    const mem = gpus.reduce((a, g) => a + (g.memory_used ?? 0), 0);
    parts.push(`${gpus.length} GPUs ${percent(avg)} ${formatBytes(mem)}`);
  }
  parts.push(`CPU ${percent(u.cpu?.percent)}`);
  parts.push(`Mem ${formatBytes(u.memory?.used)}`);
  return parts.join(' · ');
}

/** One tooltip line per device, then CPU and memory. */
export function usageTooltip(u: IUsage | null): string {
  if (!u) {
    return 'labfleet: no usage yet';
  }
  const lines = (u.gpus ?? []).map(g => {
    const cap = gpuMemoryCap(g);
    const mem = `${formatBytes(g.memory_used)} of ${formatBytes(cap)}${
      g.memory_limit !== null && g.memory_limit !== undefined ? ' (this session’s limit)' : ''
    }`;
    const util = g.utilization === null ? 'utilization unknown' : `${percent(g.utilization)} busy`;
    const mock = g.source === 'mock' ? ' [mock device]' : '';
    return `${deviceLabel(g)}: ${util}, ${mem}${mock}`;
  });
  const cpuLimit = toNumber(u.cpu?.limit);
  lines.push(
    `CPU: ${percent(u.cpu?.percent)} of one core${
      cpuLimit !== null ? ` (limit ${formatSlot('cpu', cpuLimit)})` : ''
    }`
  );
  lines.push(
    `Memory: ${formatBytes(u.memory?.used)}${
      u.memory?.limit ? ` of ${formatBytes(u.memory.limit)}` : ''
    }`
  );
  return lines.join('\n');
}

// ---------------------------------------------------------------- usage statistics (Usage section)

/** The two amounts the Usage section plots, as slot-seconds of the usage API turned into hours. */
export interface IUsageKind {
  id: 'gpu' | 'cpu';
  /** The usage API's slot: device-share-seconds for GPUs, core-seconds for CPUs. */
  slot: string;
  title: string;
  /** What "none of it" is called in the empty note. */
  noun: string;
}

export const USAGE_KINDS: IUsageKind[] = [
  { id: 'gpu', slot: 'gpu.shares', title: 'GPU-hours', noun: 'GPU time' },
  { id: 'cpu', slot: 'cpu', title: 'CPU-hours', noun: 'CPU time' }
];

/** The periods the Usage section compares (keys of `/api/usage/me` periods). */
export const USAGE_PERIODS = ['7d', '30d'];

const PERIOD_LABELS: Record<string, string> = { '7d': '7 days', '30d': '30 days' };

/** Slot-seconds of `slot` as hours (GPU-hours for `gpu.shares`, CPU-hours for `cpu`); 0 if absent. */
export function slotHours(
  amounts: Record<string, unknown> | null | undefined,
  slot: string
): number {
  const n = toNumber(amounts?.[slot]);
  return n === null ? 0 : n / 3600;
}

/**
 * Hours for a person: `0 h`, `0.25 h`, `3.5 h`, `12.3 h`, `140 h`; under 6 minutes in minutes or
 * seconds (`4.5 min`, `18 s`, `< 1 s`), as a session's first minutes are.
 */
export function formatHours(hours: number): string {
  if (!Number.isFinite(hours) || hours <= 0) {
    return '0 h';
  }
  const seconds = hours * 3600;
  if (seconds < 59.5) {
    return seconds < 0.5 ? '< 1 s' : `${Math.round(seconds)} s`;
  }
  if (hours < 0.1) {
    return `${formatNumber(seconds / 60, 1)} min`;
  }
  const digits = hours >= 100 ? 0 : hours >= 10 ? 1 : 2;
  return `${formatNumber(hours, digits)} h`;
}

/** used / allocated as a share (the API's own figure where it gave one); null: nothing allocated. */
export function usageEfficiency(f: IUsageFigures, slot: string): number | null {
  const given = toNumber(f.efficiency?.[slot]);
  if (given !== null) {
    return given;
  }
  const allocated = slotHours(f.allocated, slot);
  return allocated > 0 ? slotHours(f.used, slot) / allocated : null;
}

export interface IUsageBars {
  key: string;
  /** `7 days`, `30 days` (the API's label for other periods). */
  label: string;
  /** The API's own label, e.g. `last 7 days`. */
  title: string;
  sessions: number;
  allocated: number;
  used: number;
  efficiency: number | null;
}

/** Allocated and used hours of `slot` for each compared period that the answer has, in order. */
export function usagePeriodBars(
  u: IMyUsage,
  slot: string,
  keys: string[] = USAGE_PERIODS
): IUsageBars[] {
  const out: IUsageBars[] = [];
  for (const key of keys) {
    const p = (u.periods ?? []).find(x => x.key === key);
    if (!p) {
      continue;
    }
    out.push({
      key,
      label: PERIOD_LABELS[key] ?? p.label ?? key,
      title: p.label ?? PERIOD_LABELS[key] ?? key,
      sessions: toNumber(p.sessions) ?? 0,
      allocated: slotHours(p.allocated, slot),
      used: slotHours(p.used, slot),
      efficiency: usageEfficiency(p, slot)
    });
  }
  return out;
}

export interface IUsageDayBar {
  /** The day's start as the API gave it (ISO). */
  day: string;
  allocated: number;
  used: number;
}

/** The daily series of `slot` in hours, oldest first. */
export function usageDays(u: IMyUsage, slot: string): IUsageDayBar[] {
  return (u.daily ?? []).map(d => ({
    day: d.bucket,
    allocated: slotHours(d.allocated, slot),
    used: slotHours(d.used, slot)
  }));
}

/** Any amount above zero (peaks such as `mem_peak` are no amounts of time: left out). */
function anyAmount(amounts: Record<string, unknown> | null | undefined): boolean {
  return Object.entries(amounts ?? {}).some(
    ([slot, v]) => !slot.endsWith('_peak') && (toNumber(v) ?? 0) > 0
  );
}

/** Whether the answer holds any session or any allocated or used amount at all. */
export function hasUsage(u: IMyUsage | null | undefined): boolean {
  if (!u) {
    return false;
  }
  const figures: IUsageFigures[] = [...(u.periods ?? []), ...(u.daily ?? [])];
  return figures.some(
    f => (toNumber(f.sessions) ?? 0) > 0 || anyAmount(f.allocated) || anyAmount(f.used)
  );
}

/** Whether `slot` has anything allocated or used in the compared periods or the daily series. */
export function hasSlotUsage(u: IMyUsage, slot: string): boolean {
  return (
    usagePeriodBars(u, slot).some(b => b.allocated > 0 || b.used > 0) ||
    usageDays(u, slot).some(d => d.allocated > 0 || d.used > 0)
  );
}

/** The top of a chart's scale for a largest value: 1, 2 or 5 times a power of ten (0 → 1). */
export function niceMax(value: number): number {
  if (!Number.isFinite(value) || value <= 0) {
    return 1;
  }
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 5, 10]) {
    if (value <= step * power * (1 + 1e-9)) {
      return step * power;
    }
  }
  return 10 * power;
}

const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];

/** A day bucket (`2026-11-03T00:00:00+00:00`) as `Nov 3`: the date as written, in no time zone. */
export function formatDay(iso: string): string {
  const m = /^(\d{4})-(\d{2})-(\d{2})/.exec(iso ?? '');
  if (!m) {
    return iso ?? '';
  }
  return `${MONTHS[Number(m[2]) - 1] ?? m[2]} ${Number(m[3])}`;
}
