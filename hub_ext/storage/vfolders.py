"""Virtual folders: create, find, list, change, trash, restore and purge; who reaches what.

Permissions rank ``ro`` < ``rw`` < ``wd`` (write and delete).  A user folder's owner has ``wd``
and shares it by invitation (labfleet.storage.sharing); a project folder gives its members the project's
permission, which a project's domain admin may override per user.  Admins (superadmin, the
folder's domain admin) manage every folder in their reach but read a user's files only when the
owner shared them.  A folder nobody may see is *not found*, whatever the route.

The folder's data lives at ``<host path>/<id>/data`` (labfleet.storage.store); ``open_files`` decides
who reaches it and how far.  Sizes are kept by labfleet.storage.vfquota.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Select, false, or_, select
from sqlalchemy.orm import Session, joinedload

from labfleet.core import audit
from labfleet.core.authz import Actor
from labfleet.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from labfleet.core.models import (
    ComputeSession,
    Domain,
    Project,
    ProjectMember,
    StorageHost,
    User,
    VFolder,
    VFolderMount,
    VFolderPermission,
)
from labfleet.core.pages import Page, contains_text, page_of
from labfleet.core.validate import check_choice, check_fields, check_int, check_username, parse_project_ref
from labfleet.core.vocab import FOLDER_PERMISSIONS, LIVE_STATUSES
from labfleet.storage import hosts, vfquota
from labfleet.storage.store import FolderStore
from labfleet.tenancy.directory import actor_for

RANK = {p: i for i, p in enumerate(FOLDER_PERMISSIONS, 1)}
USAGE_MODES = ("general", "model", "data")
STATUSES = ("READY", "DELETE_PENDING")
FOLDER_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def check_folder_name(value: Any, field: str = "name") -> str:
    if not isinstance(value, str) or not FOLDER_NAME_RE.match(value) or value in (".", ".."):
        raise InvalidInput(
            f"{field} must be 1-64 letters, digits, '.', '-' or '_' (not '.' or '..'); got {value!r:.80}"
        )
    return value


def check_permission(value: Any, field: str = "permission") -> str:
    return check_choice(value, field, FOLDER_PERMISSIONS)


# ---------------------------------------------------------------- access (pure)


@dataclass(frozen=True)
class Facts:
    """What access depends on, read from the DB once."""

    owner_kind: str  # user | project
    owner: str  # the owner's user name, or DOMAIN/PROJECT
    domain: str
    members: frozenset[str]  # the project's members (project folders; or just the actor, if one)
    project_permission: str
    grant: str | None  # the actor's own row: an accepted share, or an admin's override


@dataclass(frozen=True)
class Access:
    permission: str | None  # what the actor may do with the files: None, ro, rw, wd
    owner: bool
    manage: bool  # rename, trash, restore, purge, change permissions
    admin: bool
    sees: bool  # may see that the folder exists

    def at_least(self, level: str) -> bool:
        return self.permission is not None and RANK[self.permission] >= RANK[level]


def access_of(actor: Actor, f: Facts) -> Access:
    admin = actor.is_superadmin or actor.is_domain_admin_of(f.domain)
    owner = False
    perm: str | None = None
    if f.owner_kind == "user":
        owner = actor.kind == "user" and actor.name == f.owner
        perm = "wd" if owner else f.grant
    elif admin:
        perm = "wd"
    elif actor.kind == "user" and actor.name in f.members:
        perm = f.grant or f.project_permission
    manage = owner or admin
    sees = perm is not None or manage or actor.reads_everything
    return Access(permission=perm, owner=owner, manage=manage, admin=admin, sees=sees)


# ---------------------------------------------------------------- reading


def owner_label(v: VFolder) -> str:
    if v.owner_kind == "user":
        return f"user:{v.user.username}"  # type: ignore[union-attr]
    return f"project:{v.project.full_name}"  # type: ignore[union-attr]


def facts_of(db: Session, actor: Actor, v: VFolder) -> Facts:
    grant = None
    if actor.user_id is not None:
        grant = db.scalar(
            select(VFolderPermission.permission).where(
                VFolderPermission.vfolder_id == v.id, VFolderPermission.user_id == actor.user_id
            )
        )
    if v.owner_kind == "user":
        return Facts("user", v.user.username, v.domain.name, frozenset(), v.permission, grant)  # type: ignore[union-attr]
    members = frozenset(u.username for u in v.project.members)  # type: ignore[union-attr]
    return Facts("project", v.project.full_name, v.domain.name, members, v.permission, grant)  # type: ignore[union-attr]


def readable(db: Session, actor: Actor, folder_id: str, *, lock: bool = False) -> tuple[VFolder, Access]:
    """The folder and the actor's access; *not found* when the actor may not see it."""
    if not isinstance(folder_id, str) or not UUID_RE.match(folder_id):
        raise NotFound(f"no vfolder {folder_id!r:.60}")
    q = select(VFolder).where(VFolder.id == folder_id)
    if lock and db.get_bind().dialect.name == "postgresql":
        q = q.with_for_update()
    v = db.scalar(q)
    if v is None:
        raise NotFound(f"no vfolder {folder_id!r}")
    acc = access_of(actor, facts_of(db, actor, v))
    if not acc.sees:
        raise NotFound(f"no vfolder {folder_id!r}")
    return v, acc


def actor_user(db: Session, actor: Actor) -> User | None:
    return db.get(User, actor.user_id) if actor.user_id is not None else None


def host_rights(db: Session, actor: Actor, v: VFolder) -> frozenset[str]:
    return hosts.rights_for(actor, actor_user(db, actor), v.host, v.project)


def host_owner(h: StorageHost) -> tuple[int, int] | None:
    """(uid, gid) that what the service writes on host ``h`` is given to (None: the service's own)."""
    if h.owner_uid is None:
        return None
    return (h.owner_uid, h.owner_gid if h.owner_gid is not None else h.owner_uid)


def store_of(v: VFolder) -> FolderStore:
    h = v.host
    return FolderStore(f"{h.path.rstrip('/')}/{v.id}", owner=host_owner(h))


def need_ready(v: VFolder) -> None:
    if v.status != "READY":
        raise Conflict(f"vfolder {v.name} is in the trash: restore it first")


def open_files(
    db: Session, actor: Actor, folder_id: str, level: str, right: str | None = None
) -> tuple[VFolder, FolderStore]:
    """The folder and its store, when the actor has ``level`` on its files (and ``right`` on its
    storage host); the folder must be READY.  Admins who may manage a user's folder still reach
    its files only when the owner shared them."""
    v, acc = readable(db, actor, folder_id)
    if acc.permission is None:
        raise Forbidden(
            f"you cannot reach the files of vfolder {v.name}: its owner has not shared it with you"
        )
    if not acc.at_least(level):
        raise Forbidden(f"vfolder {v.name} is shared with you {acc.permission}; this needs {level}")
    need_ready(v)
    if right is not None:
        hosts.need_right(host_rights(db, actor, v), right, v.host)
    return v, store_of(v)


def folders_query(db: Session, actor: Actor, filters: Mapping[str, str | None]) -> Select:
    """The folders ``actor`` sees with ``filters`` (scope, status, domain), by name.

    ``scope=mine`` (the default): the caller's folders, those shared with them and their projects'
    folders; ``scope=domain`` (domain admins, monitors, superadmins) or ``scope=all`` (monitors and
    superadmins) widen it to every folder in reach.  The WHERE clause is ``access_of(...).sees``,
    so pages and their totals are exact."""
    scope = filters.get("scope") or "mine"
    check_choice(scope, "scope", ("mine", "domain", "all"))
    q = select(VFolder)
    if scope == "mine":
        if actor.user_id is None:
            return q.where(false())
        shared = select(VFolderPermission.vfolder_id).where(VFolderPermission.user_id == actor.user_id)
        projects = select(ProjectMember.project_id).where(ProjectMember.user_id == actor.user_id)
        q = q.where(
            or_(VFolder.user_id == actor.user_id, VFolder.id.in_(shared), VFolder.project_id.in_(projects))
        )
        if not actor.reads_everything:
            # A share of a project folder shows it to the project's members and its domain's admins only.
            seen = [VFolder.owner_kind == "user", VFolder.project_id.in_(projects)]
            if actor.role == "admin" and actor.domain is not None:
                seen.append(VFolder.domain_id.in_(select(Domain.id).where(Domain.name == actor.domain)))
            q = q.where(or_(*seen))
    elif scope == "domain":
        if not (actor.reads_everything or actor.role == "admin"):
            raise Forbidden("scope=domain is for domain admins, monitors and superadmins")
        dname = filters.get("domain") or actor.domain
        if not actor.reads_everything and dname != actor.domain:
            raise Forbidden("you can list only your own domain's folders")
        q = q.where(VFolder.domain_id.in_(select(Domain.id).where(Domain.name == dname)))
    elif not actor.reads_everything:
        raise Forbidden("scope=all is for monitors and superadmins")
    status = filters.get("status")
    if status:
        q = q.where(VFolder.status == check_choice(status, "status", STATUSES))
    search = (filters.get("search") or "").strip()
    if search:
        q = q.where(_found_by(search))
    return q.order_by(VFolder.name, VFolder.id)


def _found_by(needle: str) -> Any:
    """A folder whose name, owner (user name, or project as ``domain/project``), host, domain or
    id contains ``needle`` (case-insensitive): the console's search."""
    project_name = Domain.name + "/" + Project.name
    return or_(
        contains_text(VFolder.name, needle),
        contains_text(VFolder.id, needle),
        VFolder.user_id.in_(select(User.id).where(contains_text(User.username, needle))),
        VFolder.project_id.in_(
            select(Project.id).join(Project.domain).where(contains_text(project_name, needle))
        ),
        VFolder.host_id.in_(select(StorageHost.id).where(contains_text(StorageHost.name, needle))),
        VFolder.domain_id.in_(select(Domain.id).where(contains_text(Domain.name, needle))),
    )


# What folder_view reads: host, domain, the owning user or project (its domain) and their policies.
FOLDER_LOADS = (
    joinedload(VFolder.host),
    joinedload(VFolder.domain),
    joinedload(VFolder.user).joinedload(User.resource_policy),
    joinedload(VFolder.project).joinedload(Project.domain),
    joinedload(VFolder.project).joinedload(Project.resource_policy),
)


def accesses(db: Session, actor: Actor, folders: list[VFolder]) -> list[Access]:
    """``access_of`` for many folders, their facts read in two statements (not two per folder).

    Facts.members holds the actor alone where they are a member (all that access_of asks)."""
    ids = [v.id for v in folders]
    grants: dict[str, str] = {}
    if actor.user_id is not None and ids:
        rows = db.execute(
            select(VFolderPermission.vfolder_id, VFolderPermission.permission).where(
                VFolderPermission.user_id == actor.user_id, VFolderPermission.vfolder_id.in_(ids)
            )
        )
        grants = {folder_id: permission for folder_id, permission in rows}
    project_ids = {v.project_id for v in folders if v.owner_kind == "project"}
    member_of: set[int] = set()
    if project_ids:
        member_of = set(
            db.scalars(
                select(ProjectMember.project_id)
                .join(User, ProjectMember.user_id == User.id)
                .where(User.username == actor.name, ProjectMember.project_id.in_(project_ids))
            )
        )
    out = []
    for v in folders:
        if v.owner_kind == "user":
            f = Facts("user", v.user.username, v.domain.name, frozenset(), v.permission, grants.get(v.id))  # type: ignore[union-attr]
        else:
            members = frozenset({actor.name}) if v.project_id in member_of else frozenset()
            f = Facts("project", v.project.full_name, v.domain.name, members, v.permission, grants.get(v.id))  # type: ignore[union-attr]
        out.append(access_of(actor, f))
    return out


def list_folders(db: Session, actor: Actor, filters: dict[str, str | None]) -> list[tuple[VFolder, Access]]:
    """Every folder ``actor`` sees with ``filters`` (see ``folders_query``), with their access."""
    folders = list(db.scalars(folders_query(db, actor, filters).options(*FOLDER_LOADS)).unique())
    return [(v, acc) for v, acc in zip(folders, accesses(db, actor, folders), strict=True) if acc.sees]


def page_folder_views(
    db: Session, actor: Actor, filters: dict[str, str | None], *, offset: int, limit: int
) -> Page[dict[str, Any]]:
    """One page of the folders ``actor`` sees, as ``view_for`` shows them, in a handful of statements."""
    page = page_of(db, folders_query(db, actor, filters), offset, limit, options=FOLDER_LOADS)
    user = actor_user(db, actor)
    totals = vfquota.scope_totals(db, page.items)
    views = [
        folder_view(db, v, acc, user=user, totals=totals[vfquota.scope_key(v)])
        for v, acc in zip(page.items, accesses(db, actor, page.items), strict=True)
    ]
    return Page(views, page.total, page.offset, page.limit)


# ---------------------------------------------------------------- changing

CREATE_FIELDS = ("host", "usage_mode", "project", "permission", "max_size")


def create(db: Session, actor: Actor, body: Any, *, default_host: str | None) -> VFolder:
    body = check_fields(body, required=["name"], optional=CREATE_FIELDS)
    name = check_folder_name(body["name"])
    usage_mode = check_choice(body.get("usage_mode", "general"), "usage_mode", USAGE_MODES)
    max_size = check_int(body.get("max_size", 0), "max_size", maximum=hosts.MAX_BYTES)
    user = actor_user(db, actor)
    if user is None and not ("project" in body and actor.is_superadmin):
        raise Forbidden("user folders are created by their users (the CLI may create project folders)")
    if actor.role == "monitor":
        raise Forbidden("monitors read; they create nothing")
    host_name = body.get("host", default_host)
    if host_name is None:
        raise InvalidInput("no storage host given and the service has no default one")
    host = hosts.get_host(db, host_name)
    if not host.is_active:
        raise Conflict(f"storage host {host.name} is not active")

    project = None
    if "project" in body and body["project"] is not None:
        dname, pname = parse_project_ref(body["project"], actor.domain)
        project = db.scalar(select(Project).join(Domain).where(Domain.name == dname, Project.name == pname))
        if project is None or not (actor.is_superadmin or actor.is_domain_admin_of(dname)):
            if project is not None and user is not None and user in project.members:
                raise Forbidden(
                    f"only an admin of domain {dname} can create project {dname}/{pname}'s folders"
                )
            raise NotFound(f"no project {dname}/{pname}")
        permission = check_permission(body.get("permission", "rw"))
    elif "permission" in body:
        raise InvalidInput("permission is for project folders: a user folder is shared by invitation")
    else:
        permission = "wd"
    hosts.need_right(hosts.rights_for(actor, user, host, project), "create-vfolder", host)

    if _name_taken(db, name, project_id=project.id if project else None, user_id=user.id if user else None):
        raise Conflict(
            f"{'project ' + project.full_name if project else 'you'} already "
            f"{'has' if project else 'have'} a folder named {name} (perhaps in the trash)"
        )
    vfquota.check_count(db, user, project)
    v = VFolder(
        id=str(uuid.uuid4()),
        name=name,
        host=host,
        domain=project.domain if project else user.domain,  # type: ignore[union-attr]
        owner_kind="project" if project else "user",
        user=None if project else user,
        project=project,
        creator=user.username if user is not None else actor.name,
        usage_mode=usage_mode,
        permission=permission,
        max_size=max_size,
        status="READY",
        usage_bytes=0,
        usage_files=0,
        trash_bytes=0,
    )
    db.add(v)
    db.flush()
    store_of(v).create()
    audit.record(
        db,
        actor,
        "vfolder.create",
        f"{owner_label(v)}/{name}",
        target_domain=v.domain.name,
        details={"id": v.id, "host": host.name},
    )
    return v


def _name_taken(db: Session, name: str, *, project_id: int | None, user_id: int | None) -> bool:
    """Names are unique per owner: the project when there is one, else the user."""
    owner = VFolder.project_id == project_id if project_id is not None else VFolder.user_id == user_id
    return db.scalar(select(VFolder.id).where(owner, VFolder.name == name)) is not None


UPDATE_FIELDS = ("name", "usage_mode", "permission", "max_size")


def update(db: Session, actor: Actor, folder_id: str, body: Any) -> tuple[VFolder, Access]:
    body = check_fields(body, optional=UPDATE_FIELDS)
    v, acc = readable(db, actor, folder_id)
    if not acc.manage:
        raise Forbidden(f"only the owner or an admin can change vfolder {v.name}")
    if "name" in body:
        name = check_folder_name(body["name"])
        if name != v.name:
            if _name_taken(db, name, project_id=v.project_id, user_id=v.user_id):
                raise Conflict(f"a folder named {name} already exists for {owner_label(v)}")
            v.name = name
    if "usage_mode" in body:
        v.usage_mode = check_choice(body["usage_mode"], "usage_mode", USAGE_MODES)
    if "permission" in body:
        if v.owner_kind != "project":
            raise InvalidInput("permission is for project folders: a user folder is shared by invitation")
        if not acc.admin:
            raise Forbidden("only an admin can change a project folder's permission")
        v.permission = check_permission(body["permission"])
    if "max_size" in body:
        v.max_size = check_int(body["max_size"], "max_size", maximum=hosts.MAX_BYTES)
    audit.record(db, actor, "vfolder.update", v.id, target_domain=v.domain.name, details=dict(body))
    return v, acc


def trash(db: Session, actor: Actor, folder_id: str) -> VFolder:
    v, acc = readable(db, actor, folder_id)
    if not acc.manage:
        raise Forbidden(f"only the owner or an admin can delete vfolder {v.name}")
    if not acc.admin:
        hosts.need_right(host_rights(db, actor, v), "delete-vfolder", v.host)
    need_ready(v)
    v.status = "DELETE_PENDING"
    v.deleted_at = datetime.now(timezone.utc)
    audit.record(db, actor, "vfolder.delete", v.id, target_domain=v.domain.name, details={"name": v.name})
    return v


def restore(db: Session, actor: Actor, folder_id: str) -> VFolder:
    v, acc = readable(db, actor, folder_id)
    if not acc.manage:
        raise Forbidden(f"only the owner or an admin can restore vfolder {v.name}")
    if v.status != "DELETE_PENDING":
        raise Conflict(f"vfolder {v.name} is not in the trash")
    v.status = "READY"
    v.deleted_at = None
    audit.record(db, actor, "vfolder.restore", v.id, target_domain=v.domain.name, details={"name": v.name})
    return v


def mounted_in(db: Session, v: VFolder) -> list[str]:
    """Sessions holding (or waiting to hold) a mount of the folder."""
    return list(
        db.scalars(
            select(ComputeSession.id)
            .join(VFolderMount, VFolderMount.session_id == ComputeSession.id)
            .where(
                VFolderMount.vfolder_id == v.id,
                ComputeSession.status.in_(LIVE_STATUSES),
            )
        )
    )


def purge(db: Session, actor: Actor, folder_id: str) -> str:
    """Remove a trashed folder and its data for good."""
    v, acc = readable(db, actor, folder_id, lock=True)
    if not acc.manage:
        raise Forbidden(f"only the owner or an admin can purge vfolder {v.name}")
    if v.status != "DELETE_PENDING":
        raise Conflict(f"vfolder {v.name} is not in the trash: delete it first")
    busy = mounted_in(db, v)
    if busy:
        raise Conflict(f"vfolder {v.name} is mounted in {len(busy)} running session(s): stop them first")
    name, domain = v.name, v.domain.name
    db.delete(v)
    db.flush()
    # Data last: if the row cannot go, the data stays too.
    store_of(v).destroy()
    audit.record(db, actor, "vfolder.purge", folder_id, target_domain=domain, details={"name": name})
    return folder_id


# ---------------------------------------------------------------- sessions


def mountable_for(db: Session, user: User) -> list[tuple[VFolder, Access, bool]]:
    """Every READY folder the user reaches, with whether the host lets them mount it."""
    actor = _user_actor(user)
    out = []
    for v, acc in list_folders(db, actor, {"status": "READY"}):
        if acc.permission is None:
            continue
        rights = hosts.rights_for(actor, user, v.host, v.project)
        out.append((v, acc, "mount-in-session" in rights))
    return out


def _user_actor(user: User) -> Actor:
    return actor_for(user, "")


def resolve_mounts(db: Session, user: User, wanted: list[str]) -> list[tuple[VFolder, str]]:
    """The folders a session of ``user`` mounts: those asked for by name or id, and the
    user's own folders whose name starts with '.'.  Refuses what the user may not mount."""
    if not isinstance(wanted, list) or len(wanted) > 64:
        raise InvalidInput("vfolders must be a list of at most 64 folder names or ids")
    reachable = mountable_for(db, user)
    chosen: dict[str, tuple[VFolder, str]] = {}
    for ref in wanted:
        if not isinstance(ref, str):
            raise InvalidInput("vfolders must be folder names or ids")
        if UUID_RE.match(ref):
            hits = [r for r in reachable if r[0].id == ref]
        else:
            check_folder_name(ref, "vfolder")
            hits = [r for r in reachable if r[0].name == ref]
            own = [r for r in hits if r[0].user_id == user.id]
            hits = own or hits
        if not hits:
            raise NotFound(f"no vfolder {ref!r} that you can mount")
        if len(hits) > 1:
            raise InvalidInput(f"several folders are named {ref}: give the id of the one to mount")
        v, acc, can_mount = hits[0]
        if not can_mount:
            raise Forbidden(f"you lack the mount-in-session right on storage host {v.host.name} ({v.name})")
        chosen[v.id] = (v, acc.permission)  # type: ignore[assignment]
    for v, acc, can_mount in reachable:
        if v.user_id == user.id and v.name.startswith(".") and can_mount:
            chosen.setdefault(v.id, (v, acc.permission))  # type: ignore[arg-type]
    names = [v.name for v, _ in chosen.values()]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InvalidInput(f"two folders would mount at ~/vfolders/{dup[0]}: mount only one of them")
    return list(chosen.values())


def mount_view(v: VFolder, permission: str) -> dict[str, Any]:
    """What a spawner needs to mount a folder: the host directory and the permission."""
    return {"vfolder": v.id, "name": v.name, "source": str(store_of(v).data_dir), "permission": permission}


# ---------------------------------------------------------------- views


def folder_view(
    db: Session, v: VFolder, acc: Access, *, user: User | None = None, totals: tuple[int, int] | None = None
) -> dict[str, Any]:
    """The folder as seen with ``acc``; ``user``: add their rights on its host; ``totals``: its
    quota scope's (bytes used, folders) when already counted (quota.scope_totals)."""
    out: dict[str, Any] = {
        "id": v.id,
        "name": v.name,
        "host": v.host.name,
        "owner": owner_label(v),
        "owner_kind": v.owner_kind,
        "domain": v.domain.name,
        "usage_mode": v.usage_mode,
        "permission": acc.permission,
        "is_owner": acc.owner,
        "can_manage": acc.manage,
        "status": v.status,
        "auto_mount": v.owner_kind == "user" and v.name.startswith("."),
        "creator": v.creator,
        "created_at": v.created_at.isoformat() if v.created_at else None,
        "deleted_at": v.deleted_at.isoformat() if v.deleted_at else None,
    }
    if v.owner_kind == "project":
        out["project_permission"] = v.permission
    out.update(vfquota.usage_view(db, v, totals))
    if user is not None:
        rights = hosts.rights_for(_user_actor(user), user, v.host, v.project)
        out["rights"] = sorted(rights, key=hosts.RIGHTS.index)
    return out


def scope_usage(db: Session, actor: Actor, username: str | None) -> dict[str, Any]:
    """Usage against limits per quota scope: the actor's own, or (``username``) a user's for
    themselves, their domain's admins, monitors and superadmins; *not found* for anyone else."""
    user = actor_user(db, actor) if username is None else find_user(db, username)
    if user is None:
        raise NotFound("give ?user=NAME: the Hub and the CLI have no folders of their own")
    if user.id != actor.user_id and not (
        actor.reads_everything or actor.is_domain_admin_of(user.domain.name)
    ):
        raise NotFound(f"no user {username!r}")
    return {"user": user.username, "scopes": vfquota.scope_views(db, user)}


def view_for(db: Session, actor: Actor, v: VFolder, acc: Access | None = None) -> dict[str, Any]:
    """A folder as ``actor`` sees it (``acc``: their access, worked out when not given)."""
    if acc is None:
        acc = access_of(actor, facts_of(db, actor, v))
    return folder_view(db, v, acc, user=actor_user(db, actor))


def status_view(v: VFolder) -> dict[str, Any]:
    return {"id": v.id, "name": v.name, "status": v.status}


def find_user(db: Session, username: Any) -> User:
    u = db.scalar(select(User).where(User.username == check_username(username)))
    if u is None:
        raise NotFound(f"no user {username!r}")
    return u
