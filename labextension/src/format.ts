/**
 * Numbers, sizes and instants, read and written for a person: `0.5`, `1.5 GiB`, `8g` and back,
 * `2h 5m`, an ISO instant in ms.  Pure: no DOM, no requests.
 */

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

// labfleet's size grammar (core/slots.py); tests/unit/test_vocabulary.py checks this copy against it.
const MEM_RE = /^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgtp]?)(?:i?b)?\s*$/i;
const MEM_UNITS: Record<string, number> = {
  '': 1,
  k: 2 ** 10,
  m: 2 ** 20,
  g: 2 ** 30,
  t: 2 ** 40,
  p: 2 ** 50
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

/** An ISO 8601 instant in ms since the epoch; null when absent or unreadable. */
export function instantMs(iso: string | null | undefined): number | null {
  if (!iso) {
    return null;
  }
  const ms = Date.parse(iso);
  return Number.isFinite(ms) ? ms : null;
}
