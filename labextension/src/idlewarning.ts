/**
 * The idle reclamation's warning, in words: when it shows, what it says (the countdown, why, the
 * rule that decides) and which notification is due.  Pure: the timing lives in idle.ts.
 */
import type { IIdleInfo } from './types';

/** The idle warning shows when the reclamation is less than this many seconds away. */
export const IDLE_WARN_S = 600;

/** A notification this many seconds before the reclamation, each once per deadline. */
export const IDLE_NOTIFY_S = [300, 60];

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
