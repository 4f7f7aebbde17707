/**
 * Sessions (named servers): names and their checks, status and lifetime in words, and what a new
 * session's form choice asks for and costs against the quota left.  Pure: no DOM, no requests.
 */
import { parseMem, toNumber } from './format';
import type { Level } from './quota';
import { EPSILON, formatSlot, GPU_QUANTUM, slotLabel, sortSlots } from './slots';
import type { IFreeNow, ISessionSummary, Slots, SlotsLeft } from './types';

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

/** `PENDING (#2 in queue): short of CPU: ...`, `RUNNING`, `ERROR: why`. */
export function sessionStatusLabel(
  s: Pick<ISessionSummary, 'status' | 'queue_position' | 'status_reason' | 'waiting_for'>
): string {
  const status = s.status || 'UNKNOWN';
  if (status === 'PENDING') {
    const where =
      s.queue_position !== null && s.queue_position !== undefined
        ? ` (#${s.queue_position} in queue)`
        : '';
    const why = s.waiting_for || s.status_reason;
    return `PENDING${where}${why ? `: ${why}` : ''}`;
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

// ---------------------------------------------------------------- a new session's cost

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

/**
 * The service's session request (`POST /api/sessions`, `/api/sessions/preview`) for a form choice,
 * read as the spawner reads its options: whole GPUs when integral, else a fraction of one device.
 */
export function sessionRequest(choice: {
  project: string;
  group: string;
  type: string;
  image: string;
  cpu: string;
  mem: string;
  gpu: string;
  command: string;
  vfolders: string[];
}): Record<string, unknown> {
  const slots: Record<string, number | string> = {};
  if (choice.cpu.trim()) {
    slots.cpu = Number(choice.cpu.trim());
  }
  if (choice.mem.trim()) {
    slots.mem = choice.mem.trim();
  }
  const gpu = Number(choice.gpu.trim() || '0');
  if (gpu > 0) {
    slots[Number.isInteger(gpu) ? 'gpu' : 'gpu.shares'] = gpu;
  }
  const body: Record<string, unknown> = { project: choice.project, type: choice.type, slots };
  if (choice.group) {
    body.resource_group = choice.group;
  }
  if (choice.image) {
    body.image = choice.image;
  }
  if (choice.type !== 'interactive') {
    body.command = choice.command || 'true';
  }
  if (choice.vfolders.length) {
    body.vfolders = choice.vfolders;
  }
  return body;
}

/**
 * What the chosen resource group can give one session now (the most one node has free), beside
 * the quota left, since a quota is what one may still ask and not what the fleet has free:
 * `1 core, 21.5 GiB, 1 whole GPU, up to 0.75 of one GPU`.
 */
export function freeNowText(free: IFreeNow | undefined): string {
  if (!free) {
    return '';
  }
  if (!free.alive_nodes) {
    return 'nothing: no node of the group is up';
  }
  const whole = free.gpu === 1 ? '1 whole GPU' : `${free.gpu} whole GPUs`;
  return [
    formatSlot('cpu', free.cpu),
    formatSlot('mem', free.mem),
    whole,
    `up to ${formatSlot('gpu.shares', free['gpu.shares'])} of one GPU`
  ].join(', ');
}

/** One resource group's line beside the quota: what the fleet can give one session there now. */
export interface IFreeNowLine {
  group: string;
  /** The group this session runs in. */
  own: boolean;
  /** `Free now in default: 1 core, 2 GiB, 0 whole GPUs, up to 0.5 of one GPU` */
  text: string;
}

/**
 * A line per resource group the user may use (launch options' `resource_groups`) that says what
 * one session could get there now (`free_now`): a quota says what one may still ask, not what the
 * fleet has free.  The group this session runs in (`ownGroup`) comes first, the others keep the
 * service's order; a group without `free_now` (an older service) has no line.
 */
export function freeNowLines(
  groups: readonly { name: string; free_now?: IFreeNow }[] | null | undefined,
  ownGroup?: string | null
): IFreeNowLine[] {
  const lines = (groups ?? [])
    .filter(g => g.free_now)
    .map(g => {
      const own = !!ownGroup && g.name === ownGroup;
      const where = own ? `${g.name} (this session's group)` : g.name;
      return { group: g.name, own, text: `Free now in ${where}: ${freeNowText(g.free_now)}` };
    });
  // A stable sort: the own group first, the rest as listed.
  return lines.sort((a, b) => Number(b.own) - Number(a.own));
}
