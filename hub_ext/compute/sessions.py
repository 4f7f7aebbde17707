"""Compute sessions in the DB: admit, queue, schedule, release, reconcile.

Each decision runs in one transaction that first takes the locks it needs (the
session's domain row and its resource group's row on PostgreSQL; the database write
lock on SQLite, see hub_ext.core.db), then reads usage, calls the pure admission checks
(:mod:`hub_ext.compute.scheduler.admission`) and placement (:mod:`hub_ext.compute.scheduler.placement`),
and writes the outcome.  So two concurrent decisions never see the same free share.
"""

from __future__ import annotations

import re
import secrets
import uuid
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from functools import lru_cache
from typing import Any, NamedTuple

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hub_ext.compute import clustercache, images
from hub_ext.compute.nodes import DEFAULT_GROUP, SESSION_TYPES
from hub_ext.compute.scheduler import admission, queueing
from hub_ext.compute.scheduler.placement import Placement, PlacementError, Request
from hub_ext.core import audit, authz
from hub_ext.core.authz import Actor
from hub_ext.core.errors import Conflict, Forbidden, InvalidInput, LabfleetError, NotFound
from hub_ext.core.models import (
    FINAL_STATUSES,
    HOLDING_STATUSES,
    Allocation,
    ComputeSession,
    Device,
    Domain,
    Image,
    Keypair,
    Node,
    Project,
    ResourceGroup,
    User,
    VFolderMount,
)
from hub_ext.core.slots import ResourceSlots, charged
from hub_ext.core.validate import (
    check_choice,
    check_fields,
    check_int,
    check_slots,
    check_string_list,
    check_text,
    check_username,
    parse_project_ref,
)
from hub_ext.storage import folders as vfolders

REQUEST_SLOTS = ("cpu", "mem", "gpu", "gpu.shares")
# Where the spawner may move a session; the scheduler alone makes SCHEDULED and CANCELLED.
SPAWNER_TRANSITIONS = {
    "SCHEDULED": {"PREPARING", "RUNNING", "TERMINATING", "TERMINATED", "ERROR"},
    "PREPARING": {"RUNNING", "TERMINATING", "TERMINATED", "ERROR"},
    "RUNNING": {"TERMINATING", "TERMINATED", "ERROR"},
    "TERMINATING": {"TERMINATED", "ERROR"},
    "PENDING": {"CANCELLED"},
}


# Who may not (403) versus what does not fit the limits now (409).
REFUSAL_STATUS = {
    admission.RESOURCE_GROUP_DENIED: 403,
    admission.SESSION_TYPE_NOT_ALLOWED: 403,
    admission.IMAGE_NOT_FOUND: 403,
    admission.IMAGE_NOT_ALLOWED: 403,
    admission.IMAGE_MIN_RESOURCES: 400,
}


class Refused(LabfleetError):
    """Admission said no; ``code`` names the check, the message says why."""

    def __init__(self, refusal: admission.Refusal, status: int) -> None:
        super().__init__(refusal.message, status)
        self.code = refusal.code


# ---------------------------------------------------------------- helpers


def _now() -> datetime:
    return datetime.now(timezone.utc)


def set_status(s: ComputeSession, status: str, reason: str = "") -> None:
    s.status = status
    s.status_reason = reason
    s.status_changed_at = _now()
    s.status_history = [
        *(s.status_history or []),
        {"status": status, "at": s.status_changed_at.isoformat(), "reason": reason},
    ]


def _lock(db: Session, domain_id: int, group_id: int) -> None:
    """Row locks on PostgreSQL, domain first then group: one order everywhere, so no deadlock."""
    if db.get_bind().dialect.name == "postgresql":
        db.execute(select(Domain.id).where(Domain.id == domain_id).with_for_update())
        db.execute(select(ResourceGroup.id).where(ResourceGroup.id == group_id).with_for_update())


class _Use(NamedTuple):
    """One live session as quotas see it: who it charges and its charged slots."""

    id: str
    keypair_id: int
    user_id: int
    project_id: int
    status: str
    charged: ResourceSlots


@lru_cache(maxsize=4096)
def _charged(stored: tuple[tuple[str, Any], ...]) -> ResourceSlots:
    # Sessions ask for a few distinct sizes: parse each once, not once per decision.
    return charged(ResourceSlots.parse(dict(stored)))


def _sum(uses) -> ResourceSlots:
    total = ResourceSlots()
    for u in uses:
        total = total + u.charged
    return total


def _in_quota(db: Session, domain_id: int) -> list[_Use]:
    """The domain's sessions that count against quotas: admitted and not ended.

    Plain rows, not ORM objects: admission reads every live session of the domain each time.
    """
    rows = db.execute(
        select(
            ComputeSession.id,
            ComputeSession.keypair_id,
            ComputeSession.user_id,
            ComputeSession.project_id,
            ComputeSession.status,
            ComputeSession.requested_slots,
        ).where(
            ComputeSession.domain_id == domain_id,
            ComputeSession.status.in_((*HOLDING_STATUSES, "PENDING")),
        )
    )
    return [
        _Use(sid, kp, user, project, status, _charged(tuple(sorted((slots or {}).items()))))
        for sid, kp, user, project, status, slots in rows
    ]


def _cluster(db: Session, group: ResourceGroup) -> clustercache.Entry:
    """The group's ALIVE nodes with what their allocations hold, as a placement Cluster.

    Cached per process and checked against the group's alloc_version (see hub_ext.compute.clustercache);
    call it holding the group lock.
    """
    return clustercache.get(db, group.id)


def _fits_empty(entry: clustercache.Entry, req: Request) -> bool:
    """Could the request fit on some node of the group if that node were empty?"""
    return entry.empty().place(req, "pack", None) is not None


# ---------------------------------------------------------------- admission


SESSION_FIELDS = (
    "project",
    "resource_group",
    "type",
    "image",
    "slots",
    "gpu_models",
    "name",
    "username",
    "vfolders",
    "command",
)
MAX_COMMAND = 8192


def parse_request(body: Any) -> dict[str, Any]:
    body = check_fields(body, required=["project"], optional=SESSION_FIELDS)
    out: dict[str, Any] = {"project_ref": body["project"]}
    out["resource_group"] = body.get("resource_group", DEFAULT_GROUP)
    if not isinstance(out["resource_group"], str):
        raise InvalidInput("resource_group must be a name")
    out["type"] = check_choice(body.get("type", "interactive"), "type", SESSION_TYPES)
    image = body.get("image")
    out["image"] = None if image is None else check_text(image, "image", 255)
    slots = body.get("slots", {})
    if not isinstance(slots, dict):
        raise InvalidInput('slots must be an object like {"cpu": 2, "mem": "8g", "gpu.shares": 0.5}')
    unknown = sorted(k for k in slots if k.split(":", 1)[0] not in REQUEST_SLOTS)
    if unknown:
        raise InvalidInput(
            f"unknown slot(s) {', '.join(map(str, unknown))}; a session asks cpu, mem, gpu or gpu.shares"
        )
    out["slots"] = check_slots(slots, "slots")
    try:
        Request.from_slots(out["slots"], check_string_list(body.get("gpu_models", []), "gpu_models"))
    except ValueError as e:
        raise InvalidInput(str(e)) from None
    out["gpu_models"] = check_string_list(body.get("gpu_models", []), "gpu_models")
    out["name"] = check_text(body.get("name", ""), "name", 255)
    out["username"] = body.get("username")
    out["vfolders"] = body.get("vfolders", [])
    # The command of a batch or inference session: the spawner runs it; admission does not look at it.
    out["command"] = check_text(body.get("command", ""), "command", MAX_COMMAND)
    return out


def _requested_user(actor: Actor, req: dict[str, Any]) -> str:
    # The Hub (spawner) asks on behalf of a user; anyone else asks for themselves.
    if req["username"] is not None:
        if actor.kind not in ("hub", "cli") and req["username"] != actor.name:
            raise Forbidden("you can start sessions only for yourself")
        return check_username(req["username"])
    return actor.name


def admit(
    db: Session, actor: Actor, body: Any, *, launch: Launch | None = None, dry_run: bool = False
) -> ComputeSession:
    """Admit a session: every check, then placement; SCHEDULED, PENDING, or refused (raises).

    ``launch``: the Hub admits the server of a session started through the API (see
    :func:`prepare_launch`); the session takes that request's exact slots and GPU models and is
    charged to the keypair that signed it.  ``dry_run``: every check (the capacity that could ever
    hold it included) but no placement; the session returned is not added, and the caller rolls back.
    """
    if launch is not None and isinstance(body, Mapping):
        body = {**body, "slots": launch.slots, "gpu_models": list(launch.gpu_models)}
    req = parse_request(body)
    username = _requested_user(actor, req)
    user = db.scalar(select(User).where(User.username == username))
    if user is None or not user.is_active:
        raise NotFound(f"no active user {username!r}")
    dname, pname = parse_project_ref(req["project_ref"], user.domain.name)
    project = db.scalar(select(Project).join(Domain).where(Domain.name == dname, Project.name == pname))
    if project is None or user not in project.members:
        raise Forbidden(f"{username} is not a member of project {dname}/{pname}")
    if not project.is_active or not user.domain.is_active:
        raise Forbidden(f"project {dname}/{pname} or its domain is inactive")
    group = db.scalar(select(ResourceGroup).where(ResourceGroup.name == req["resource_group"]))
    if group is None:
        raise NotFound(f"no resource group {req['resource_group']!r}")
    keypair = _charged_keypair(db, actor, user, launch.keypair if launch is not None else None)
    # The folders to mount (named ones and the user's dot-folders), refused before anything is held.
    mounts = vfolders.resolve_mounts(db, user, req["vfolders"])

    _lock(db, user.domain_id, group.id)
    session = ComputeSession(
        id=str(uuid.uuid4()),
        name=req["name"],
        user=user,
        keypair=keypair,
        project=project,
        domain=user.domain,
        resource_group=group,
        type=req["type"],
        image=req["image"],
        requested_slots=req["slots"].to_db(),
        gpu_models=req["gpu_models"],
        status_history=[],
        mounts=[VFolderMount(vfolder_id=v.id, permission=perm) for v, perm in mounts],
    )
    refusal = check(db, session)
    if refusal is not None:
        audit.record(
            db,
            actor,
            "session.refuse",
            username,
            target_domain=user.domain.name,
            details={"reason": refusal.message, "code": refusal.code, "project": project.full_name},
            success=False,
        )
        raise Refused(refusal, REFUSAL_STATUS.get(refusal.code, 409))
    if dry_run:
        _check_could_fit(db, group, session)
        return session
    db.add(session)
    set_status(session, "PENDING", "waiting for the scheduler")
    db.flush()
    placed = _try_place(db, session)
    if not placed:
        try:
            _check_could_fit(db, group, session)
        except Refused:
            db.delete(session)
            db.flush()
            raise
        set_status(session, "PENDING", f"waiting for free capacity in resource group {group.name}")
    audit.record(
        db,
        actor,
        "session.create",
        session.id,
        target_domain=user.domain.name,
        details={"project": project.full_name, "slots": session.slots.to_json(), "status": session.status},
    )
    return session


def _check_could_fit(db: Session, group: ResourceGroup, session: ComputeSession) -> None:
    """Refuse (409) a request that no node of the group could hold even empty: it would wait for ever."""
    if not _fits_empty(_cluster(db, group), _request_of(session)):
        message = f"no node of resource group {group.name} could ever hold {session.slots.to_cli() or 'this request'}"
        raise Refused(admission.Refusal(code="capacity", message=message, retryable=False), 409)


def _charged_keypair(db: Session, actor: Actor, user: User, access_key: str | None = None) -> Keypair:
    """The keypair a new session is charged to: the one that signed the request (or, for the Hub's
    admission of an API session, ``access_key``, the one that signed that request), else the main one."""
    if access_key is None and actor.keypair is not None and actor.name == user.username:
        access_key = actor.keypair
    if access_key is not None:
        kp = db.scalar(select(Keypair).where(Keypair.access_key == access_key))
        if kp is None or kp.user_id != user.id:
            raise Forbidden(f"keypair {access_key} does not belong to {user.username}")
        if not kp.is_active:
            raise Forbidden(f"keypair {access_key} is not active")
        return kp
    keypair = user.main_keypair
    if keypair is None:
        raise Conflict(f"{user.username} has no active main keypair")
    return keypair


def _request_of(s: ComputeSession) -> Request:
    return Request.from_slots(s.slots, s.gpu_models or ())


def check(db: Session, s: ComputeSession) -> admission.Refusal | None:
    """Run the pure admission checks for session ``s`` against current usage."""
    user, project, domain, kp = s.user, s.project, s.domain, s.keypair
    # Quotas count every admitted session that has not ended, queued ones included, so a
    # request over quota is refused now instead of waiting for ever.
    scope = [x for x in _in_quota(db, domain.id) if x.id != s.id]
    holding = [x for x in scope if x.status in HOLDING_STATUSES]
    pending_kp = sum(1 for x in scope if x.status == "PENDING" and x.keypair_id == kp.id)
    policy = kp.resource_policy
    group = s.resource_group
    ctx = admission.AdmissionContext(
        request=admission.SessionRequest(
            session_id=s.id,
            user=user.username,
            keypair=kp.access_key,
            project=project.full_name,
            domain=domain.name,
            resource_group=group.name,
            session_type=s.type,
            image=s.image,
            slots=charged(s.slots),
            gpu_models=tuple(s.gpu_models or ()),
        ),
        keypair_policy=admission.KeypairPolicySnapshot(
            total_slots=policy.slots,
            unlimited_unspecified=policy.default_for_unspecified == "UNLIMITED",
            max_concurrent_sessions=policy.max_concurrent_sessions,
            max_pending_sessions=policy.max_pending_sessions,
        ),
        keypair_used=_sum(x for x in scope if x.keypair_id == kp.id),
        keypair_active_sessions=sum(1 for x in holding if x.keypair_id == kp.id),
        keypair_pending_sessions=int(pending_kp),
        user_limit=None,
        user_used=_sum(x for x in scope if x.user_id == user.id),
        project_limit=project.slots,
        project_used=_sum(x for x in scope if x.project_id == project.id),
        domain_limit=domain.slots,
        domain_used=_sum(scope),
        group=admission.GroupSnapshot(
            name=group.name,
            allowed_session_types=tuple(group.allowed_session_types or ()),
            domains=frozenset(g.target for g in group.grants if g.kind == "domain"),
            projects=frozenset(g.target for g in group.grants if g.kind == "project"),
            users=frozenset(g.target for g in group.grants if g.kind == "user"),
            is_public=group.is_public,
        ),
        image=_image_snapshot(db, s.image, project.full_name),
    )
    return admission.check_admission(ctx)


def _image_snapshot(db: Session, name: str | None, project: str) -> admission.ImageSnapshot | None:
    image = images.find(db, name)
    if image is None or not image.is_active:
        return None  # with a name asked, admission refuses it as not registered
    allowed = None if images.allowed_for(image, project) else frozenset(image.projects or ())
    return admission.ImageSnapshot(name=image.name, min_slots=image.min_slots, allowed_projects=allowed)


def _try_place(db: Session, s: ComputeSession) -> bool:
    """Place ``s`` on its group's nodes; on success write allocations and mark it SCHEDULED."""
    group = s.resource_group
    entry = _cluster(db, group)
    placement = entry.cluster.place(_request_of(s), group.placement, None)
    if placement is None:
        return False
    version = clustercache.bump(db, group.id)
    node_id = entry.nodes[placement.node]
    node = db.get(Node, node_id)
    s.node = node
    cpu_milli = int(placement.cpu * 1000)
    taken = []
    rows = []
    for i, (dev_uuid, shares) in enumerate(placement.devices):
        centi = int(shares * 100)
        rows.append(
            Allocation(
                session=s,
                node_id=node_id,
                device_id=entry.devices[dev_uuid].id,
                shares_centi=centi,
                cpu_milli=cpu_milli if i == 0 else 0,
                mem=placement.mem if i == 0 else 0,
            )
        )
        taken.append((dev_uuid, Decimal(centi) / 100))
    if not placement.devices:
        rows.append(
            Allocation(
                session=s,
                node_id=node_id,
                device_id=None,
                shares_centi=0,
                cpu_milli=cpu_milli,
                mem=placement.mem,
            )
        )
    clustercache.expect(db, rows)
    db.add_all(rows)
    where = ", ".join(
        f"{shares} of {entry.devices[u].model} #{entry.devices[u].index}" for u, shares in placement.devices
    )
    set_status(s, "SCHEDULED", f"on {placement.node}" + (f": {where}" if where else ""))
    db.flush()
    # The cached cluster takes exactly what the rows say, so a rebuild from the DB equals it.
    clustercache.claim(db, group.id, entry)
    entry.cluster.apply(
        Placement(node=placement.node, devices=tuple(taken), cpu=Decimal(cpu_milli) / 1000, mem=placement.mem)
    )
    entry.version = version
    return True


# ---------------------------------------------------------------- sessions started through the API

# A Hub server name a session started through the API may take (one URL path component).
SERVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")


@dataclass(frozen=True)
class Launch:
    """A session asked for by someone other than the Hub (a user's token, a keypair's signature):
    the Hub server to start for it, and what the spawner's admission of that server takes from
    the request (see :func:`prepare_launch` and ``admit(launch=...)``)."""

    username: str
    server: str
    project: str  # as the request named it (the spawner's admission names it the same way)
    user_options: dict[str, Any]  # for the Hub: the spawn form's keys
    slots: dict[str, Any]  # the request's own slots, per-model ones included
    gpu_models: tuple[str, ...]
    keypair: str | None  # the access key that signed the request: the session is charged to it

    def matches(self, body: Any) -> bool:
        """Is ``body`` (the spawner's admission request) the admission of this launch's server?"""
        return (
            isinstance(body, Mapping)
            and body.get("username") == self.username
            and body.get("name") == self.server
            and body.get("project") == self.project
        )


def launch_options(req: dict[str, Any]) -> dict[str, Any]:
    """The spawn options (``user_options``: the spawn form's keys) of a parsed session request (pure)."""
    options: dict[str, Any] = {"project": req["project_ref"], "type": req["type"]}
    if req["image"]:
        options["image"] = req["image"]
    if req["resource_group"] != DEFAULT_GROUP:
        options["resource_group"] = req["resource_group"]
    wanted = Request.from_slots(req["slots"], req["gpu_models"])
    if wanted.cpu:
        options["cpu"] = format(wanted.cpu.normalize(), "f")
    if wanted.mem:
        options["mem"] = wanted.mem
    gpu = wanted.gpu + wanted.shares
    if gpu:
        # Whole devices or a fraction of one, as the form says it; admission takes the exact slots.
        options["gpu"] = format(Decimal(gpu).normalize(), "f")
    if req["command"].strip():
        options["command"] = req["command"]
    if req["vfolders"]:
        options["vfolders"] = list(req["vfolders"])
    return options


def prepare_launch(db: Session, actor: Actor, body: Any) -> Launch:
    """Check a session request from the API as admission would, and say which Hub server to start.

    Every check of :func:`admit` runs (bad input 400, access 403, quotas 409, a request no node could
    ever hold 409), and a live session on the server named is a conflict (409); nothing is placed.
    The caller rolls the transaction back: nothing is held until the Hub's spawner asks for the
    session, as it does for the spawn form.
    """
    req = parse_request(body)
    if req["type"] == "interactive" and req["command"].strip():
        raise InvalidInput("an interactive session takes no command (type batch or inference runs one)")
    if req["type"] != "interactive" and not req["command"].strip():
        raise InvalidInput(f"a {req['type']} session needs a command")
    username = _requested_user(actor, req)
    server = req["name"] or f"api-{secrets.token_hex(4)}"
    if not SERVER_NAME.match(server):
        raise InvalidInput(
            f"name {server[:80]!r} is not a server name (letters, digits, '.', '_' and '-', "
            "starting with a letter or digit)"
        )
    live = db.scalar(
        select(ComputeSession.id)
        .join(User, ComputeSession.user_id == User.id)
        .where(
            User.username == username,
            ComputeSession.name == server,
            ComputeSession.status.in_((*HOLDING_STATUSES, "PENDING")),
        )
    )
    if live is not None:
        raise Conflict(
            f"{username} already has session {live} on server {server!r}: stop it or choose another name"
        )
    admit(db, actor, {**body, "name": server}, dry_run=True)
    return Launch(
        username=username,
        server=server,
        project=req["project_ref"],
        user_options=launch_options(req),
        slots=dict(body.get("slots") or {}),
        gpu_models=tuple(req["gpu_models"]),
        keypair=actor.keypair if actor.keypair is not None and actor.name == username else None,
    )


# ---------------------------------------------------------------- queue


class Served(NamedTuple):
    scheduled: list[str]  # ids placed
    cancelled: list[str]  # ids whose wait passed the group's pending timeout


def groups_with_queue(db: Session) -> list[int]:
    """Ids of the groups where a session waits."""
    return list(
        db.scalars(
            select(ComputeSession.resource_group_id).where(ComputeSession.status == "PENDING").distinct()
        )
    )


def schedule_group(db: Session, group: ResourceGroup) -> Served:
    """Give free capacity to the group's queue in scheduler order; cancel timed-out waits."""
    if db.get_bind().dialect.name == "postgresql":
        db.execute(select(ResourceGroup.id).where(ResourceGroup.id == group.id).with_for_update())
    pending = list(
        db.scalars(
            select(ComputeSession).where(
                ComputeSession.resource_group_id == group.id, ComputeSession.status == "PENDING"
            )
        )
    )
    now = _now()
    live, cancelled = [], []
    for s in pending:
        if group.pending_timeout and (now - s.created_at).total_seconds() > group.pending_timeout:
            set_status(s, "CANCELLED", f"waited longer than the pending timeout of {group.pending_timeout}s")
            cancelled.append(s.id)
        else:
            live.append(s)
    if not live:
        return Served([], cancelled)  # nothing waits: no need to order the queue (DRF reads every node)
    by_id = {s.id: s for s in live}
    ordered = _ordered_queue(db, group, live)
    scheduled = []
    for item in ordered:
        s = by_id[item.session_id]
        if check(db, s) is not None:
            continue  # still over a quota: it waits, and its reason says so at the next look
        if _try_place(db, s):
            scheduled.append(s.id)
    return Served(scheduled, cancelled)


def _ordered_queue(
    db: Session, group: ResourceGroup, pending: list[ComputeSession]
) -> list[queueing.PendingItem]:
    """The group's queue in its scheduler's order (DRF looks at what each user holds now)."""
    items = [
        queueing.PendingItem(
            session_id=s.id, user=s.user.username, created_at=s.created_at.timestamp(), slots=s.slots
        )
        for s in pending
    ]
    if group.scheduler != "drf":
        return queueing.order_queue(items, group.scheduler)  # only DRF looks at usage and capacity
    usage: dict[str, ResourceSlots] = defaultdict(ResourceSlots)
    held = select(ComputeSession).where(
        ComputeSession.resource_group_id == group.id, ComputeSession.status.in_(HOLDING_STATUSES)
    )
    for s in db.scalars(held):
        usage[s.user.username] = usage[s.user.username] + _drf_slots(s.slots)
    return queueing.order_queue(items, group.scheduler, dict(usage), _group_capacity(db, group))


def _group_capacity(db: Session, group: ResourceGroup) -> ResourceSlots:
    # One query for every node and its device count, not one per node.
    rows = db.execute(
        select(Node.cpu, Node.mem, func.count(Device.id))
        .outerjoin(Device, Device.node_id == Node.id)
        .where(Node.resource_group_id == group.id)
        .group_by(Node.id, Node.cpu, Node.mem)
    ).all()
    total = ResourceSlots()
    for cpu, mem, n_devices in rows:
        total = total + ResourceSlots({"cpu": Decimal(cpu), "mem": mem, "gpu.shares": n_devices})
    return total


def _drf_slots(slots: ResourceSlots) -> ResourceSlots:
    # Fairness over CPU, memory and GPU, whole devices counted as shares.
    c = charged(slots)
    return ResourceSlots({k: v for k, v in c.items() if k in ("cpu", "mem", "gpu.shares")})


def queue_view(db: Session, group: ResourceGroup) -> list[dict[str, Any]]:
    pending = list(
        db.scalars(
            select(ComputeSession).where(
                ComputeSession.resource_group_id == group.id, ComputeSession.status == "PENDING"
            )
        )
    )
    ordered = _ordered_queue(db, group, pending)
    positions = queueing.queue_positions(ordered)
    by_id = {s.id: s for s in pending}
    return [dict(session_view(by_id[i.session_id]), position=positions[i.session_id]) for i in ordered]


def lifetime_of(s: ComputeSession) -> tuple[str | None, int | None, datetime | None]:
    """(when it first ran, its max lifetime in seconds, when that ends): ``None`` where there is none."""
    started = next((h["at"] for h in s.status_history or [] if h.get("status") == "RUNNING"), None)
    policy = s.keypair.resource_policy if s.keypair is not None else None
    lifetime = (policy.max_session_lifetime or None) if policy is not None else None
    expires = datetime.fromisoformat(started) + timedelta(seconds=lifetime) if started and lifetime else None
    return started, lifetime, expires


def session_detail(db: Session, s: ComputeSession) -> dict[str, Any]:
    """One session as its own endpoint answers it: the view, plus where it queues, the service ports its
    image declares (the session's app launchers) and its lifetime under the keypair policy."""
    view = session_view(s)
    view["queue_position"] = position_of(db, s)
    image = db.scalar(select(Image).where(Image.name == s.image)) if s.image else None
    view["service_ports"] = list(image.service_ports or []) if image is not None else []
    started, lifetime, expires = lifetime_of(s)
    view["started_at"] = started
    view["max_lifetime"] = lifetime
    view["expires_at"] = expires.isoformat() if expires else None
    return view


def past_lifetime(db: Session, now: datetime) -> list[ComputeSession]:
    """Running sessions that have outlived their keypair policy's ``max_session_lifetime``."""
    running = db.scalars(select(ComputeSession).where(ComputeSession.status == "RUNNING"))
    return [s for s in running if (expires := lifetime_of(s)[2]) is not None and expires <= now]


def position_of(db: Session, s: ComputeSession) -> int | None:
    if s.status != "PENDING":
        return None
    for row in queue_view(db, s.resource_group):
        if row["id"] == s.id:
            return row["position"]
    return None


# ---------------------------------------------------------------- release, status, reconcile


def release(db: Session, s: ComputeSession, status: str, reason: str) -> None:
    """Give back what ``s`` holds (the cached cluster kept in step) and set its final ``status``."""
    group_id = s.resource_group_id
    if db.get_bind().dialect.name == "postgresql":
        db.execute(select(ResourceGroup.id).where(ResourceGroup.id == group_id).with_for_update())
    # Read them again under the group lock: a concurrent stop or placement may have changed them.
    allocations = list(db.scalars(select(Allocation).where(Allocation.session_id == s.id)))
    if allocations:
        version = clustercache.bump(db, group_id)
        entry = clustercache.lookup(db, group_id, version - 1)
        given_back = _placement_of(entry, allocations) if entry is not None else None
        clustercache.expect(db, allocations)
        for a in allocations:
            db.delete(a)
        if entry is not None and given_back is not None:
            clustercache.claim(db, group_id, entry)
            try:
                entry.cluster.release(given_back)
                entry.version = version
            except PlacementError:
                pass  # the cache disagrees with the rows: leave it stale, the next decision rebuilds
        # Otherwise the cached cluster keeps its old version, and the next decision rebuilds it.
    set_status(s, status, reason)
    db.flush()
    db.expire(s, ["allocations"])


def _placement_of(entry: clustercache.Entry, allocations: list[Allocation]) -> Placement | None:
    """What ``allocations`` hold, as a placement on the cached cluster; None if it has not their node."""
    node = entry.node_names.get(allocations[0].node_id)
    if (
        node is None
        or node not in entry.cluster.nodes
        or any(a.node_id != allocations[0].node_id for a in allocations)
    ):
        return None
    devices = []
    for a in allocations:
        if a.device_id is not None:
            dev_uuid = entry.device_uuids.get(a.device_id)
            if dev_uuid is None:
                return None
            devices.append((dev_uuid, Decimal(a.shares_centi) / 100))
    return Placement(
        node=node,
        devices=tuple(devices),
        cpu=Decimal(sum(a.cpu_milli for a in allocations)) / 1000,
        mem=sum(a.mem for a in allocations),
    )


def readable(db: Session, actor: Actor, session_id: str) -> ComputeSession:
    s = db.get(ComputeSession, session_id) if isinstance(session_id, str) and len(session_id) <= 64 else None
    if s is None or not (
        actor.kind in ("hub", "cli") or authz.can_read_user(actor, s.user.username, s.domain.name)
    ):
        raise NotFound(f"no session {session_id!r:.70}")
    return s


def terminate(db: Session, actor: Actor, session_id: str, reason: str = "stopped") -> ComputeSession:
    """Stop a session: its slots come back at once, then the group's queue is served."""
    s = readable(db, actor, session_id)
    if actor.role == "monitor":
        raise Forbidden("a monitor changes nothing")
    if not (
        actor.kind in ("hub", "cli")
        or actor.name == s.user.username
        or authz.can_manage_in_domain(actor, s.domain.name)
    ):
        raise Forbidden("you cannot stop this session")
    if s.status in FINAL_STATUSES:
        return s
    release(db, s, "CANCELLED" if s.status == "PENDING" else "TERMINATED", f"{reason} by {actor.name}")
    audit.record(
        db, actor, "session.terminate", s.id, target_domain=s.domain.name, details={"reason": reason}
    )
    schedule_group(db, s.resource_group)
    return s


def update_status(db: Session, actor: Actor, session_id: str, body: Any) -> ComputeSession:
    """The spawner reports progress: PREPARING, RUNNING, TERMINATING, TERMINATED, ERROR."""
    s = readable(db, actor, session_id)
    if actor.kind not in ("hub", "cli"):
        raise Forbidden("only the Hub reports session status")
    body = check_fields(body, required=["status"], optional=["reason", "exit_code"])
    status = check_choice(
        body["status"], "status", ("PREPARING", "RUNNING", "TERMINATING", "TERMINATED", "ERROR", "CANCELLED")
    )
    if status not in SPAWNER_TRANSITIONS.get(s.status, set()):
        raise Conflict(f"session {s.id} is {s.status}; it cannot become {status}")
    reason = check_text(body.get("reason", ""), "reason", 1000)
    if "exit_code" in body:
        s.exit_code = check_int(body["exit_code"], "exit_code", minimum=-255, maximum=255)
    if status in FINAL_STATUSES:
        release(db, s, status, reason)
        schedule_group(db, s.resource_group)
    else:
        set_status(s, status, reason)
    return s


def list_sessions(db: Session, actor: Actor, filters: dict[str, str | None]) -> list[ComputeSession]:
    q = select(ComputeSession).order_by(ComputeSession.created_at)
    if filters.get("status"):
        q = q.where(ComputeSession.status == filters["status"])
    if filters.get("user"):
        q = q.join(User, ComputeSession.user_id == User.id).where(User.username == filters["user"])
    if filters.get("domain"):
        q = q.where(ComputeSession.domain_id.in_(select(Domain.id).where(Domain.name == filters["domain"])))
    out = []
    for s in db.scalars(q):
        if filters.get("project") and s.project.full_name != filters["project"]:
            continue
        if actor.kind in ("hub", "cli") or authz.can_read_user(actor, s.user.username, s.domain.name):
            out.append(s)
    return out


def session_view(s: ComputeSession) -> dict[str, Any]:
    devices = [
        {
            "uuid": a.device.uuid,
            "index": a.device.index,
            "model": a.device.model,
            "memory": a.device.memory_bytes,
            "shares": float(Decimal(a.shares_centi) / 100),
        }
        for a in s.allocations
        if a.device is not None
    ]
    return {
        "id": s.id,
        "name": s.name,
        "user": s.user.username,
        "project": s.project.full_name,
        "domain": s.domain.name,
        "resource_group": s.resource_group.name,
        "type": s.type,
        "image": s.image,
        "slots": s.slots.to_json(),
        "status": s.status,
        "status_reason": s.status_reason,
        "status_history": s.status_history,
        "node": s.node.name if s.node else None,
        "devices": devices,
        "exit_code": s.exit_code,
        "created_at": s.created_at.isoformat() if s.created_at else None,
        "mounts": [vfolders.mount_view(m.vfolder, m.permission) for m in s.mounts],
    }
