"""Storage hosts: the named roots where virtual folders live, and who may do what on them.

A host's rights for a user are the union of the host's ``default_permissions``, the user's
domain's grants, the user's main keypair policy's grants and, for a project's folder, the
project's grants.  Grants are ``{host: [rights]}``; a keypair policy may also list host names,
which grants every right there.  ``rights_union`` is pure; the rest reads and writes the DB.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from labfleet.core import audit, authz
from labfleet.core.authz import Actor
from labfleet.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from labfleet.core.models import Project, StorageHost, User, VFolder
from labfleet.core.rights import RIGHTS, check_rights, rights_union
from labfleet.core.validate import check_bool, check_fields, check_int, check_name, check_text

MAX_BYTES = 2**62


def rights_for(actor: Actor, user: User | None, host: StorageHost, project: Project | None) -> frozenset[str]:
    """What ``user`` (acting as ``actor``) may do on ``host``, for a folder of ``project`` or their own."""
    if actor.is_superadmin:
        return frozenset(RIGHTS)
    if user is None:
        return frozenset()
    kp = user.main_keypair
    return rights_union(
        host.name,
        host.default_permissions or (),
        user.domain.allowed_vfolder_hosts,
        kp.resource_policy.allowed_storage_hosts if kp else None,
        project.allowed_vfolder_hosts if project is not None else None,
    )


def need_right(rights: frozenset[str], right: str, host: StorageHost) -> None:
    if right not in rights:
        raise Forbidden(f"you lack the {right} right on storage host {host.name}")


# ---------------------------------------------------------------- CRUD (superadmins)

HOST_FIELDS = (
    "path",
    "capacity",
    "description",
    "default_permissions",
    "owner_uid",
    "owner_gid",
    "is_active",
)


def check_host_path(value: Any) -> str:
    path = check_text(value, "path", 4096)
    if not path.startswith("/") or os.path.normpath(path) != path or path == "/":
        raise InvalidInput("path must be an absolute, normalised directory path other than /")
    return path


def _apply(h: StorageHost, body: dict[str, Any]) -> None:
    if "path" in body:
        h.path = check_host_path(body["path"])
    if "capacity" in body:
        h.capacity = check_int(body["capacity"], "capacity", maximum=MAX_BYTES)
    if "description" in body:
        h.description = check_text(body["description"], "description")
    if "default_permissions" in body:
        h.default_permissions = check_rights(body["default_permissions"], "default_permissions")
    for key in ("owner_uid", "owner_gid"):
        if key in body:
            setattr(h, key, None if body[key] is None else check_int(body[key], key, maximum=2**31 - 2))
    if "is_active" in body:
        h.is_active = check_bool(body["is_active"], "is_active")


def get_host(db: Session, name: str) -> StorageHost:
    h = db.scalar(select(StorageHost).where(StorageHost.name == name))
    if h is None:
        raise NotFound(f"no storage host {name!r}")
    return h


def list_hosts(db: Session) -> list[StorageHost]:
    return list(db.scalars(select(StorageHost).order_by(StorageHost.name)))


def create_host(db: Session, actor: Actor, body: Any) -> StorageHost:
    body = check_fields(body, required=["name", "path"], optional=HOST_FIELDS)
    name = check_name(body["name"], "storage host name")
    if not authz.can_manage_domains(actor):
        raise Forbidden("only a superadmin can add storage hosts")
    if db.scalar(select(StorageHost).where(StorageHost.name == name)):
        raise Conflict(f"storage host {name!r} already exists")
    h = StorageHost(name=name, capacity=0, description="", default_permissions=[], is_active=True)
    _apply(h, body)
    try:
        os.makedirs(h.path, mode=0o711, exist_ok=True)
    except OSError as e:
        raise InvalidInput(f"cannot create {h.path}: {e.strerror}") from None
    db.add(h)
    db.flush()
    audit.record(db, actor, "storage_host.create", name, details={"path": h.path})
    return h


def update_host(db: Session, actor: Actor, name: str, body: Any) -> StorageHost:
    body = check_fields(body, optional=HOST_FIELDS)
    if not authz.can_manage_domains(actor):
        raise Forbidden("only a superadmin can change storage hosts")
    h = get_host(db, name)
    if "path" in body and check_host_path(body["path"]) != h.path and _folder_count(db, h):
        raise Conflict(f"storage host {name} has folders: move their data, not the path")
    _apply(h, body)
    audit.record(db, actor, "storage_host.update", name, details=dict(body))
    return h


def delete_host(db: Session, actor: Actor, name: str) -> None:
    if not authz.can_manage_domains(actor):
        raise Forbidden("only a superadmin can remove storage hosts")
    h = get_host(db, name)
    used = _folder_count(db, h)
    if used:
        raise Conflict(f"storage host {name} still holds {used} folder(s)")
    db.delete(h)
    audit.record(db, actor, "storage_host.delete", name)


def _folder_count(db: Session, h: StorageHost) -> int:
    return db.scalar(select(func.count()).select_from(VFolder).where(VFolder.host_id == h.id)) or 0


def ensure_host(db: Session, spec: Mapping[str, Any]) -> StorageHost:
    """A host from the service's configuration (name, path, and any field of POST
    /api/storage-hosts), added at start when missing; an existing one is left as it is."""
    body = check_fields(spec, required=["name", "path"], optional=HOST_FIELDS, what="storage host")
    h = db.scalar(select(StorageHost).where(StorageHost.name == body["name"]))
    if h is None:
        h = StorageHost(
            name=check_name(body["name"], "storage host name"),
            capacity=0,
            description="",
            default_permissions=[],
            is_active=True,
        )
        _apply(h, body)
        db.add(h)
        db.flush()
    os.makedirs(h.path, mode=0o711, exist_ok=True)
    return h


def disk_usage(path: str):
    """The file system's total and free bytes at ``path``; None when it cannot be read."""
    try:
        return shutil.disk_usage(path)
    except OSError:
        return None


def free_disk(path: str) -> int | None:
    """Free bytes on the file system at ``path``; None when it cannot be read."""
    disk = disk_usage(path)
    return disk.free if disk else None


def view_for(db: Session, actor: Actor, h: StorageHost) -> dict:
    """A host as ``actor`` sees it: their rights there (for folders of their own), and the
    operator's details for those who read everything."""
    user = db.get(User, actor.user_id) if actor.user_id is not None else None
    return host_view(db, h, rights=rights_for(actor, user, h, None), admin=actor.reads_everything)


def host_view(
    db: Session, h: StorageHost, *, rights: frozenset[str] | None = None, admin: bool = False
) -> dict:
    used = db.scalar(select(func.coalesce(func.sum(VFolder.usage_bytes), 0)).where(VFolder.host_id == h.id))
    out: dict[str, Any] = {
        "name": h.name,
        "description": h.description,
        "capacity": h.capacity,
        "used": int(used or 0),
        "is_active": h.is_active,
    }
    disk = disk_usage(h.path)
    out["disk"] = {"total": disk.total, "free": disk.free} if disk else None
    if rights is not None:
        out["rights"] = sorted(rights, key=RIGHTS.index)
    if admin:
        # Paths and owners are the operator's business, not every user's.
        out.update(
            path=h.path,
            default_permissions=list(h.default_permissions or []),
            owner_uid=h.owner_uid,
            owner_gid=h.owner_gid,
        )
    return out
