/**
 * Quotas: the level of a use against its limit (ok, warn, over...), one row per slot of a quota
 * scope (`GET labfleet/quota`) and its line of text.  Pure: no DOM, no requests.
 */
import { formatNumber, toNumber } from './format';
import { baseSlot, EPSILON, formatSlot, sortSlots } from './slots';
import type { IQuotaScope } from './types';

/** At this fraction of a limit a bar turns to a warning. */
export const DEFAULT_WARN_RATIO = 0.8;

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
