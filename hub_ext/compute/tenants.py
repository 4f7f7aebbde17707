"""What an admission reads besides the ledger: who asks, for which project, group, keypair and
image, from the per-process tenancy cache (:mod:`hub_ext.tenancy.snapshot`); and the pure
admission context built from those values and the ledger's rows.

Nothing here reads a session: usage comes from the ledger (:mod:`hub_ext.compute.ledger`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from hub_ext.compute.scheduler import admission
from hub_ext.core import quanta, versions
from hub_ext.core.authz import Actor
from hub_ext.core.errors import Conflict, Forbidden, NotFound
from hub_ext.core.models import Image, ResourceGroup, User
from hub_ext.core.slots import ResourceSlots
from hub_ext.core.validate import parse_project_ref
from hub_ext.storage import folders as vfolders
from hub_ext.tenancy import snapshot
from hub_ext.tenancy.snapshot import KeypairSnap, ProjectSnap, UserSnap


@dataclass(frozen=True)
class GroupSnap:
    id: int
    name: str
    placement: str
    scheduler: str
    pending_timeout: int
    admission: admission.GroupSnapshot


@dataclass(frozen=True)
class ImageSnap:
    name: str
    is_active: bool
    min_slots: ResourceSlots
    projects: frozenset[str]
    domains: frozenset[str]

    def for_project(self, project: str) -> admission.ImageSnapshot | None:
        if not self.is_active:
            return None  # admission refuses it as not registered
        open_to_all = not self.projects and not self.domains
        allowed = open_to_all or project in self.projects or project.split("/", 1)[0] in self.domains
        return admission.ImageSnapshot(
            name=self.name, min_slots=self.min_slots, allowed_projects=None if allowed else self.projects
        )


@dataclass(frozen=True)
class Tenants:
    """Everything an admission needs to know of the tenants, as of tenancy version ``version``."""

    version: int
    user: UserSnap
    project: ProjectSnap
    group: GroupSnap
    keypair: KeypairSnap
    image: ImageSnap | None


def group(db: Session, version: int, name: str) -> GroupSnap | None:
    def load(db: Session) -> GroupSnap | None:
        g = db.scalar(
            select(ResourceGroup)
            .where(ResourceGroup.name == name)
            .options(selectinload(ResourceGroup.grants))
        )
        if g is None:
            return None
        return GroupSnap(
            id=g.id,
            name=g.name,
            placement=g.placement,
            scheduler=g.scheduler,
            pending_timeout=g.pending_timeout,
            admission=admission.GroupSnapshot(
                name=g.name,
                allowed_session_types=tuple(g.allowed_session_types or ()),
                domains=frozenset(x.target for x in g.grants if x.kind == "domain"),
                projects=frozenset(x.target for x in g.grants if x.kind == "project"),
                users=frozenset(x.target for x in g.grants if x.kind == "user"),
                is_public=g.is_public,
            ),
        )

    return snapshot.cached(db, version, ("group", name), load)


def image(db: Session, version: int, name: str) -> ImageSnap | None:
    def load(db: Session) -> ImageSnap | None:
        i = db.scalar(select(Image).where(Image.name == name))
        if i is None:
            return None
        return ImageSnap(
            name=i.name,
            is_active=i.is_active,
            min_slots=i.min_slots,
            projects=frozenset(i.projects or ()),
            domains=frozenset(i.domains or ()),
        )

    return snapshot.cached(db, version, ("image", name), load)


def resolve(
    db: Session, version: int, actor: Actor, username: str, req: Mapping, access_key: str | None
) -> Tenants:
    """The tenants of a session request at ``version``; raises as admission refuses (404, 403, 409)."""
    user = snapshot.user(db, version, username)
    if user is None or not user.is_active:
        raise NotFound(f"no active user {username!r}")
    dname, pname = parse_project_ref(req["project_ref"], user.domain)
    project = snapshot.project(db, version, dname, pname)
    if project is None or project.id not in user.project_ids:
        raise Forbidden(f"{username} is not a member of project {dname}/{pname}")
    if not project.is_active or not user.domain_active:
        raise Forbidden(f"project {dname}/{pname} or its domain is inactive")
    grp = group(db, version, req["resource_group"])
    if grp is None:
        raise NotFound(f"no resource group {req['resource_group']!r}")
    keypair = _charged_keypair(db, version, actor, user, access_key)
    img = image(db, version, req["image"]) if req["image"] is not None else None
    return Tenants(version=version, user=user, project=project, group=grp, keypair=keypair, image=img)


def _charged_keypair(
    db: Session, version: int, actor: Actor, user: UserSnap, access_key: str | None
) -> KeypairSnap:
    """The keypair a new session is charged to: the one that signed the request (or, for the Hub's
    admission of an API session, ``access_key``, the one that signed that request), else the main one."""
    if access_key is None and actor.keypair is not None and actor.name == user.username:
        access_key = actor.keypair
    if access_key is not None:
        kp = snapshot.keypair(db, version, access_key)
        if kp is None or kp.user_id != user.id:
            raise Forbidden(f"keypair {access_key} does not belong to {user.username}")
        if not kp.is_active:
            raise Forbidden(f"keypair {access_key} is not active")
        return kp
    if user.main_keypair is None:
        raise Conflict(f"{user.username} has no active main keypair")
    return user.main_keypair


_mounts = versions.VersionedCache(versions.FOLDERS)


def dot_folder_mounts(
    db: Session, tenancy_version: int, folders_version: int, user_id: int
) -> list[tuple[str, str]]:
    """(folder id, permission) of the user's own folders whose name starts with '.', which every
    session of theirs mounts; cached by both counters (rights come from tenancy)."""

    def load(db: Session) -> list[tuple[str, str]]:
        u = db.get(User, user_id)
        return [(v.id, perm) for v, perm in vfolders.resolve_mounts(db, u, [])] if u is not None else []

    if versions.bumped_here(db, versions.TENANCY):
        return load(db)
    return _mounts.get(db, folders_version, (tenancy_version, user_id), load)


# ---------------------------------------------------------------- the admission context


def context(
    t: Tenants,
    request: admission.SessionRequest,
    rows: Mapping[tuple[str, int], Mapping[str, int]],
) -> admission.AdmissionContext:
    """The pure admission context: limits from ``t``, usage from the ledger ``rows`` of the
    session's scopes, without the session being decided (subtract it before calling)."""

    def used(kind: str, ident: int) -> ResourceSlots:
        return quanta.used_slots(rows.get((kind, ident), {}), request.slots)

    kp_row = rows.get(("keypair", t.keypair.id), {})
    live, pending = kp_row.get(quanta.SESSIONS, 0), kp_row.get(quanta.PENDING, 0)
    policy = t.keypair.policy
    return admission.AdmissionContext(
        request=request,
        keypair_policy=admission.KeypairPolicySnapshot(
            total_slots=policy.slots,
            unlimited_unspecified=policy.unlimited_unspecified,
            max_concurrent_sessions=policy.max_concurrent_sessions,
            max_pending_sessions=policy.max_pending_sessions,
        ),
        keypair_used=used("keypair", t.keypair.id),
        keypair_active_sessions=max(live - pending, 0),
        keypair_pending_sessions=max(pending, 0),
        user_limit=None,
        user_used=used("user", t.user.id),
        project_limit=t.project.slots,
        project_used=used("project", t.project.id),
        domain_limit=t.user.domain_slots,
        domain_used=used("domain", t.user.domain_id),
        group=t.group.admission,
        image=t.image.for_project(t.project.full_name) if t.image is not None else None,
    )


def scopes(t: Tenants) -> list[tuple[str, int]]:
    """The ledger scopes a session of these tenants charges (the ledger's lock order)."""
    return [
        ("domain", t.user.domain_id),
        ("project", t.project.id),
        ("user", t.user.id),
        ("keypair", t.keypair.id),
        ("resource_group", t.group.id),
    ]
