"""What an admission reads besides the ledger: who asks, for which project, group, keypair and
image, from the per-process tenancy cache (:mod:`labfleet.tenancy.snapshot`); and the pure
admission context built from those values and the ledger's rows.

Nothing here reads a session: usage comes from the ledger (:mod:`labfleet.compute.ledger`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from labfleet.compute.scheduler import admission
from labfleet.compute.shapes import Shape
from labfleet.core import quanta, versions
from labfleet.core.authz import Actor
from labfleet.core.errors import Conflict, Forbidden, NotFound
from labfleet.core.models import Image, ResourceGroup, User, VFolder
from labfleet.core.slots import ResourceSlots, charged
from labfleet.core.validate import parse_project_ref
from labfleet.storage import vfolders
from labfleet.tenancy import snapshot
from labfleet.tenancy.snapshot import KeypairSnap, PolicySnap, ProjectSnap, UserSnap


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
    """The tenants of a session request at ``version``; raises as admission refuses (404, 403, 409).

    Cached as a whole under the same version (one look-up instead of one per user, project,
    group, keypair and image); what raises is not cached."""
    signed = actor.keypair if actor.name == username else None  # all _charged_keypair reads of the actor
    key = ("tenants", username, req["project_ref"], req["resource_group"], req["image"], access_key, signed)
    return snapshot.cached(  # type: ignore[no-any-return]
        db, version, key, lambda db: _resolve(db, version, actor, username, req, access_key)
    )


def _resolve(
    db: Session, version: int, actor: Actor, username: str, req: Mapping, access_key: str | None
) -> Tenants:
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
_dot_owners = versions.VersionedCache(versions.FOLDERS)


def _users_with_dot_folders(db: Session, folders_version: int) -> frozenset[int]:
    """Ids of the users who own a folder whose name starts with '.' (any status): one statement
    per folders version, so that a user who has none (most) costs no folder query at all."""

    def load(db: Session) -> frozenset[int]:
        owners = select(VFolder.user_id).where(VFolder.user_id.is_not(None), VFolder.name.startswith("."))
        return frozenset(db.scalars(owners.distinct()))

    return _dot_owners.get(db, folders_version, "owners", load)  # type: ignore[no-any-return]


def dot_folder_mounts(
    db: Session, tenancy_version: int, folders_version: int, user_id: int
) -> list[tuple[str, str]]:
    """(folder id, permission) of the user's own folders whose name starts with '.', which every
    session of theirs mounts; cached by both counters (rights come from tenancy)."""

    def load(db: Session) -> list[tuple[str, str]]:
        u = db.get(User, user_id)
        return [(v.id, perm) for v, perm in vfolders.resolve_mounts(db, u, [])] if u is not None else []

    if user_id not in _users_with_dot_folders(db, folders_version):
        return []  # resolve_mounts adds only the user's own dot folders when none is named
    if versions.bumped_here(db, versions.TENANCY):
        return load(db)
    return _mounts.get(db, folders_version, (tenancy_version, user_id), load)  # type: ignore[no-any-return]


# ---------------------------------------------------------------- the admission context


_NOTHING = ResourceSlots()


def _keypair_slots_capped(policy: PolicySnap) -> bool:
    # LIMITED refuses any slot the policy does not name: every requested slot is capped.
    return bool(policy.slots) or not policy.unlimited_unspecified


def _keypair_counts_capped(policy: PolicySnap) -> bool:
    return bool(policy.max_concurrent_sessions or policy.max_pending_sessions)


def _keypair_policy_scope(t: Tenants) -> tuple[str, int]:
    """The ledger scope a keypair policy's limits are checked against: the user's, all their
    keypairs together, so that a second keypair under the same policy gives no more sessions or
    slots than one (a keypair of another policy is held to that policy, over the same total)."""
    return ("user", t.user.id)


def reads(t: Tenants, keys: Iterable[str]) -> dict[tuple[str, int], list[str]]:
    """The ledger rows admission's checks read (see :func:`context`), per scope: the request's
    rows (``keys``, :func:`labfleet.core.quanta.request_keys`) of each scope whose cap could refuse
    it, and the user's session counts where the keypair's policy limits them.  The rows the
    session's own charge changes come back too; every other row would be read for nothing."""
    slot_keys = [k for k in keys if k not in quanta.COUNTS]
    policy = t.keypair.policy
    out: dict[tuple[str, int], list[str]] = {}
    keypair = slot_keys if _keypair_slots_capped(policy) else []
    if _keypair_counts_capped(policy):
        keypair = [*keypair, *quanta.COUNTS]
    if keypair:
        out[_keypair_policy_scope(t)] = keypair
    if t.project.slots:
        out[("project", t.project.id)] = slot_keys
    if t.user.domain_slots:
        out[("domain", t.user.domain_id)] = slot_keys
    return out  # no user cap exists (context: user_limit=None); a resource group has none either


def context(
    t: Tenants,
    request: admission.SessionRequest,
    rows: Mapping[tuple[str, int], Mapping[str, int]],
) -> admission.AdmissionContext:
    """The pure admission context: limits from ``t``, usage from the ledger ``rows`` of the
    session's scopes, without the session being decided (subtract it before calling).

    A scope with no cap gets no usage (nothing to check it against; :func:`reads` does not read
    it), and the counts are read only where the keypair's policy limits them.  The keypair's
    policy is checked against the user's usage, all their keypairs together
    (:func:`_keypair_policy_scope`)."""

    def used(kind: str, ident: int, capped: bool) -> ResourceSlots:
        return quanta.used_slots(rows.get((kind, ident), {}), request.slots) if capped else _NOTHING

    policy = t.keypair.policy
    kind, ident = _keypair_policy_scope(t)
    if _keypair_counts_capped(policy):
        kp_row = rows.get((kind, ident), {})
        live, pending = kp_row.get(quanta.SESSIONS, 0), kp_row.get(quanta.PENDING, 0)
    else:
        live = pending = 0
    return admission.AdmissionContext(
        request=request,
        keypair_usage_of_user=True,
        keypair_policy=_policy_snapshot(policy),
        keypair_used=used(kind, ident, _keypair_slots_capped(policy)),
        keypair_active_sessions=max(live - pending, 0),
        keypair_pending_sessions=max(pending, 0),
        user_limit=None,
        user_used=_NOTHING,
        project_limit=t.project.slots,
        project_used=used("project", t.project.id, bool(t.project.slots)),
        domain_limit=t.user.domain_slots,
        domain_used=used("domain", t.user.domain_id, bool(t.user.domain_slots)),
        group=t.group.admission,
        image=t.image.for_project(t.project.full_name) if t.image is not None else None,
    )


def session_request(
    t: Tenants,
    session_id: str,
    session_type: str,
    image: str | None,
    slots: ResourceSlots,
    gpu_models: Iterable[str],
    *,
    charged_slots: ResourceSlots | None = None,
) -> admission.SessionRequest:
    """The session as admission's checks see it (``charged_slots``: ``charged(slots)``, when the
    caller has it)."""
    return admission.SessionRequest(
        session_id=session_id,
        user=t.user.username,
        keypair=t.keypair.access_key,
        project=t.project.full_name,
        domain=t.user.domain,
        resource_group=t.group.name,
        session_type=session_type,
        image=image,
        slots=charged(slots) if charged_slots is None else charged_slots,
        gpu_models=tuple(gpu_models),
    )


# (id(tenants), id(shape), type, image) -> (tenants, shape, verdict): see check_new.
_UNCAPPED: dict[tuple[int, int, str, str | None], tuple[Tenants, Shape, admission.Refusal | None]] = {}


def check_new(
    t: Tenants,
    shape: Shape,
    session_type: str,
    image: str | None,
    before: Mapping[tuple[str, int], Mapping[str, int]] | None,
) -> admission.Refusal | None:
    """Admission's verdict on a new session: the first refusal, or None.

    ``before``: the ledger rows :func:`reads` named, as they were without this session; None
    when it named none (no cap applies).  Then the verdict depends on nothing but the tenants
    and the request (:func:`context` reads no usage), and is kept for the next request of the
    same shape and tenants (both cached values, compared by identity)."""
    key = (id(t), id(shape), session_type, image)
    if before is None:
        got = _UNCAPPED.get(key)
        if got is not None and got[0] is t and got[1] is shape:
            return got[2]
    request = session_request(
        t, "", session_type, image, shape.slots, shape.gpu_models, charged_slots=shape.charged
    )
    refusal = admission.check_admission(context(t, request, before or {}))
    if before is None:
        if len(_UNCAPPED) > 10_000:
            _UNCAPPED.clear()  # bounded: one entry per (user's tenants, shape) in use
        _UNCAPPED[key] = (t, shape, refusal)
    return refusal


# id(policy value) -> (that value, its admission snapshot): by identity, since two policies equal
# as values can differ for admission (a slot capped at 0 and a slot not named compare equal).
_POLICIES: dict[int, tuple[PolicySnap, admission.KeypairPolicySnapshot]] = {}


def _policy_snapshot(policy: PolicySnap) -> admission.KeypairPolicySnapshot:
    """The policy as admission takes it, made once per cached policy value (it parses slots)."""
    got = _POLICIES.get(id(policy))
    if got is not None and got[0] is policy:
        return got[1]
    snap = admission.KeypairPolicySnapshot(
        total_slots=policy.slots,
        unlimited_unspecified=policy.unlimited_unspecified,
        max_concurrent_sessions=policy.max_concurrent_sessions,
        max_pending_sessions=policy.max_pending_sessions,
        name=policy.name,
    )
    if len(_POLICIES) > 10_000:
        _POLICIES.clear()  # bounded: each tenancy version loads its policies afresh
    _POLICIES[id(policy)] = (policy, snap)
    return snap


def scopes(t: Tenants) -> list[tuple[str, int]]:
    """The ledger scopes a session of these tenants charges (the ledger's lock order)."""
    return [
        ("domain", t.user.domain_id),
        ("project", t.project.id),
        ("user", t.user.id),
        ("keypair", t.keypair.id),
        ("resource_group", t.group.id),
    ]
