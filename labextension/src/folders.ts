/**
 * Shared folders: a folder's use against its size limit or its scope's storage quota, access
 * rights in words, whether the user may invite others.  Pure: no DOM, no requests.
 */
import { toNumber } from './format';
import { DEFAULT_WARN_RATIO, type Level, quotaLevel } from './quota';
import type { IFolder } from './types';

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
