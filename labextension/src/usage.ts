/**
 * Usage: this session's use now, as the status bar shows it (`GPU 37% 2 GiB · CPU 12% · ...`),
 * and the user's usage statistics as the Usage section charts them (`/api/usage/me`: hours
 * allocated and used per period and per day).  Pure: no DOM, no requests.
 */
import { formatBytes, formatNumber, toNumber } from './format';
import { deviceLabel, formatSlot } from './slots';
import type { IGpuUsage, IMyUsage, IUsage, IUsageFigures } from './types';

// ---------------------------------------------------------------- usage now (status bar)

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
