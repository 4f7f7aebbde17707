/**
 * Slots (cpu, mem, gpu, gpu.shares[:MODEL]) and GPU devices for a person: their order, labels,
 * amounts (`1 core, 1 GiB, 0.5 GPU`), a device's share and how it holds.  Pure: no DOM, no requests.
 */
import { formatBytes, formatNumber, toNumber } from './format';
import type { IDevice, IGpuShare, Slots } from './types';

/** The order slots are shown in; others follow by name. */
export const SLOT_ORDER = ['cpu', 'mem', 'gpu', 'gpu.shares'];

/** The smallest share of a GPU (spawner/options.py GPU_QUANTUM). */
export const GPU_QUANTUM = 0.01;

/** Amounts are compared with a little slack: slot amounts come as decimals (0.01 shares). */
export const EPSILON = 1e-9;

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
