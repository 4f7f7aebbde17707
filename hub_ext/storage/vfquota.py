"""Folder sizes against their limits: the folder's own, its quota scope's (the owning user or
project, from their resource policy) and the storage host's capacity.

Usage is what the last scan of the folder found (labfleet.storage.store.FolderStore.usage), kept
current by the service after every change through the API and periodically for what sessions
write.  An upload reserves its whole size (a ``vfolder_uploads`` row) in the same transaction
that checks the room left, under a lock on the scope's owner row, so two uploads at a limit
can never both pass it.  ``room_left`` is pure.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from labfleet.core.errors import Conflict, LabfleetError, NotFound
from labfleet.core.models import Project, User, VFolder, VFolderUpload

if TYPE_CHECKING:
    from labfleet.storage.store import Usage


class QuotaExceeded(LabfleetError):
    status = 413


class Room(NamedTuple):
    """One limit: what is used (scanned), reserved (uploads in flight) and allowed (0 = no limit)."""

    what: str
    used: int
    reserved: int
    limit: int


def room_left(size: int, rooms: list[Room]) -> str | None:
    """Why ``size`` more bytes do not fit, or None when they do (pure)."""
    for r in rooms:
        if r.limit and r.used + r.reserved + size > r.limit:
            free = max(0, r.limit - r.used - r.reserved)
            return (
                f"{size} bytes do not fit in {r.what}: {r.used} used, {r.reserved} reserved by uploads "
                f"in progress, limit {r.limit} ({free} free)"
            )
    return None


def _policy(v: VFolder):
    if v.owner_kind == "user":
        return v.user.resource_policy if v.user else None
    return v.project.resource_policy if v.project else None


def folder_limit(v: VFolder) -> int:
    pol = _policy(v)
    limits = [x for x in (v.max_size, pol.max_vfolder_size if pol else 0) if x]
    return min(limits) if limits else 0


def scope_limit(v: VFolder) -> int:
    pol = _policy(v)
    return pol.max_quota_scope_size if pol else 0


def _scope_col(v: VFolder):
    return VFolder.user_id == v.user_id if v.owner_kind == "user" else VFolder.project_id == v.project_id


def scope_name(v: VFolder) -> str:
    return v.user.username if v.owner_kind == "user" else v.project.full_name  # type: ignore[union-attr]


def scope_label(v: VFolder) -> str:
    return f"{v.owner_kind} {scope_name(v)}"


def _used(db: Session, where) -> int:
    return int(db.scalar(select(func.coalesce(func.sum(VFolder.usage_bytes), 0)).where(where)) or 0)


def _reserved(db: Session, where) -> int:
    q = select(func.coalesce(func.sum(VFolderUpload.reserved), 0)).join(
        VFolder, VFolderUpload.vfolder_id == VFolder.id
    )
    return int(db.scalar(q.where(where)) or 0)


def rooms(db: Session, v: VFolder) -> list[Room]:
    scope = _scope_col(v)
    out = [
        Room(f"vfolder {v.name}", v.usage_bytes, _reserved(db, VFolder.id == v.id), folder_limit(v)),
        Room(f"the quota of {scope_label(v)}", _used(db, scope), _reserved(db, scope), scope_limit(v)),
    ]
    if v.host.capacity:
        host = VFolder.host_id == v.host_id
        out.append(Room(f"storage host {v.host.name}", _used(db, host), _reserved(db, host), v.host.capacity))
    return out


def _lock_scope(db: Session, v: VFolder) -> None:
    # One lock per scope (PostgreSQL row lock; SQLite's BEGIN IMMEDIATE already serialises).
    if db.get_bind().dialect.name != "postgresql":
        return
    if v.owner_kind == "user":
        db.execute(select(User.id).where(User.id == v.user_id).with_for_update())
    else:
        db.execute(select(Project.id).where(Project.id == v.project_id).with_for_update())


def _check_room(db: Session, v: VFolder, size: int, free_disk: int | None) -> None:
    """Raise 413 unless ``size`` more bytes fit in ``v``, its scope and its host; the scope is
    locked first, and the folder's usage read as of the lock."""
    _lock_scope(db, v)
    db.refresh(v)
    why = room_left(size, rooms(db, v))
    if why is None and free_disk is not None and size > free_disk:
        why = f"{size} bytes do not fit on storage host {v.host.name}: {free_disk} bytes free on its disk"
    if why:
        raise QuotaExceeded(why)


def reserve(
    db: Session, v: VFolder, user_id: int | None, path: str, size: int, free_disk: int | None
) -> VFolderUpload:
    """Check the room left and reserve ``size`` bytes for an upload to ``path``."""
    _check_room(db, v, size, free_disk)
    up = VFolderUpload(
        id=secrets.token_hex(16), vfolder_id=v.id, user_id=user_id, path=path, size=size, reserved=size
    )
    db.add(up)
    db.flush()
    return up


def hold(db: Session, v: VFolder, up: VFolderUpload, free_disk: int | None) -> None:
    """Reserve a resumable upload's whole size again for a request that writes it (413 when the
    rest no longer fits).  The caller holds the upload's writer lock."""
    db.refresh(up)
    need = up.size - up.reserved
    if need > 0:
        _check_room(db, v, need, free_disk)
        up.reserved = up.size


def let_go(up: VFolderUpload, received: int) -> None:
    """No request writes the upload now: it holds only the ``received`` bytes on disk.  The caller
    still holds its writer lock, so no new request's :func:`hold` can be undone by this."""
    up.reserved = min(received, up.size)


def get_upload(db: Session, v: VFolder, upload_id: str) -> VFolderUpload:
    up = db.get(VFolderUpload, upload_id) if isinstance(upload_id, str) and len(upload_id) == 32 else None
    if up is None or up.vfolder_id != v.id:
        raise NotFound(f"no upload {upload_id!r:.40} in this folder (finished, cancelled or expired)")
    return up


def expired_uploads(db: Session, idle: float) -> list[VFolderUpload]:
    cutoff = datetime.now(timezone.utc) - timedelta(seconds=idle)
    return list(db.scalars(select(VFolderUpload).where(VFolderUpload.updated_at < cutoff)))


def check_count(db: Session, user: User | None, project: Project | None) -> None:
    if project is not None:
        pol: Any = project.resource_policy
        col = VFolder.project_id == project.id
    elif user is not None:
        pol = user.resource_policy
        col = VFolder.user_id == user.id
    else:
        return
    if pol is None or not pol.max_vfolder_count:
        return
    count = db.scalar(select(func.count()).select_from(VFolder).where(col)) or 0
    if count >= pol.max_vfolder_count:
        who = f"project {project.full_name}" if project is not None else "you"
        raise Conflict(
            f"{who} already {'has' if project is not None else 'have'} {count} folder(s), the most "
            f"policy {pol.name} allows (folders in the trash count until purged)"
        )


def set_usage(db: Session, folder_id: str, usage: Usage) -> None:
    v = db.get(VFolder, folder_id)
    if v is None:  # purged meanwhile
        return
    v.usage_bytes = usage.bytes + usage.trash_bytes
    v.usage_files = usage.files
    v.trash_bytes = usage.trash_bytes
    v.usage_scanned_at = datetime.now(timezone.utc)


def scope_key(v: VFolder) -> tuple[str, int | None]:
    """Which quota scope the folder counts against: ("user", user id) or ("project", project id)."""
    return (v.owner_kind, v.user_id if v.owner_kind == "user" else v.project_id)


def scope_totals(db: Session, folders: list[VFolder]) -> dict[tuple[str, int | None], tuple[int, int]]:
    """{scope_key: (bytes used, folders)} of the folders' scopes, in at most two statements."""
    out: dict[tuple[str, int | None], tuple[int, int]] = {scope_key(v): (0, 0) for v in folders}
    for kind, col in (("user", VFolder.user_id), ("project", VFolder.project_id)):
        ids = {i for k, i in out if k == kind and i is not None}
        if ids:
            q = select(col, func.coalesce(func.sum(VFolder.usage_bytes), 0), func.count())
            for owner_id, used, count in db.execute(q.where(col.in_(ids)).group_by(col)):
                out[(kind, owner_id)] = (int(used), int(count))
    return out


def usage_view(db: Session, v: VFolder, totals: tuple[int, int] | None = None) -> dict[str, Any]:
    """The folder's usage and limits; ``totals``: its scope's (bytes used, folders) when already
    counted (``scope_totals``), else counted now."""
    scope = _scope_col(v)
    pol = _policy(v)
    used, folders = totals if totals is not None else (None, None)
    return {
        "usage": {
            "bytes": v.usage_bytes,
            "files": v.usage_files,
            "trash_bytes": v.trash_bytes,
            "scanned_at": v.usage_scanned_at.isoformat() if v.usage_scanned_at else None,
        },
        "limits": {
            "max_size": folder_limit(v),
            "scope": {
                "kind": v.owner_kind,
                "name": scope_name(v),
                "used": _used(db, scope) if used is None else used,
                "limit": scope_limit(v),
                "folders": (db.scalar(select(func.count()).select_from(VFolder).where(scope)) or 0)
                if folders is None
                else folders,
                "max_folders": pol.max_vfolder_count if pol else 0,
            },
        },
    }


def scope_views(db: Session, user: User) -> list[dict[str, Any]]:
    """The user's own scope and their projects' scopes: used, limit, folder counts."""
    out = []
    scopes: list[tuple[str, str, Any, Any]] = [
        ("user", user.username, VFolder.user_id == user.id, user.resource_policy)
    ]
    for p in user.projects:
        scopes.append(("project", p.full_name, VFolder.project_id == p.id, p.resource_policy))
    for kind, name, col, pol in scopes:
        out.append(
            {
                "kind": kind,
                "name": name,
                "used": _used(db, col),
                "reserved": _reserved(db, col),
                "limit": pol.max_quota_scope_size if pol else 0,
                "folders": db.scalar(select(func.count()).select_from(VFolder).where(col)) or 0,
                "max_folders": pol.max_vfolder_count if pol else 0,
                "max_folder_size": pol.max_vfolder_size if pol else 0,
            }
        )
    return out
