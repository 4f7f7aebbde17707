"""Compute sessions in the DB: admit, queue, schedule, release, reconcile.

Each decision runs in one transaction that first takes the locks it needs (the
session's domain row and its resource group's row on PostgreSQL; the database write
lock on SQLite, see labfleet.core.database), then reads usage, calls the pure admission checks
(:mod:`labfleet.compute.scheduler.admission`) and placement (:mod:`labfleet.compute.scheduler.placement`),
and writes the outcome.  So two concurrent decisions never see the same free share.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
import uuid
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, NamedTuple

from sqlalchemy import func, select
from sqlalchemy.orm import Session, object_session

from labfleet.compute import admitrows, clustercache, environments, shapes, tenants
from labfleet.compute.nodes import DEFAULT_GROUP, mps_view
from labfleet.compute.scheduler import admission, queueing
from labfleet.compute.scheduler.placement import Placement, PlacementError, Request
from labfleet.core import allocversions, audit, authz, quanta, usage_ledger, versions
from labfleet.core.authz import Actor
from labfleet.core.errors import Conflict, Forbidden, InvalidInput, LabfleetError, NotFound
from labfleet.core.models import (
    RECLAIM_REASONS,
    Allocation,
    ComputeSession,
    Device,
    Image,
    Node,
    ResourceGroup,
    User,
    VFolderMount,
)
from labfleet.core.slots import ResourceSlots, charged
from labfleet.core.validate import (
    check_choice,
    check_fields,
    check_int,
    check_text,
    check_username,
)
from labfleet.core.vocab import (
    CHARGED_SLOTS,
    COMMAND_PORT_RANGE,
    ENVIRONMENT_IMAGE_PREFIX,
    FINAL_STATUSES,
    HOLDING_STATUSES,
    LIVE_STATUSES,
    SESSION_TYPES,
)
from labfleet.storage import vfolders
from labfleet.tenancy import snapshot

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
    """Admission said no; ``code`` names the check, the message says why.  Its transaction rolls
    back (the ledger's charge with it); whoever caught it records it in a unit of work of its own
    (:func:`record_refusal`), so that the refusal is audited."""

    def __init__(
        self, refusal: admission.Refusal, status: int, audit_args: dict[str, Any] | None = None
    ) -> None:
        super().__init__(refusal.message, status)
        self.code = refusal.code
        self.audit_args = audit_args  # the session.refuse entry: actor, target, domain, details


def record_refusal(db: Session, refused: Refused) -> None:
    """Audit a refused admission (``session.refuse``), in a unit of work after the refused one's
    rollback."""
    if refused.audit_args is not None:
        audit.record(db, action="session.refuse", success=False, **refused.audit_args)


# ---------------------------------------------------------------- helpers


def _now() -> datetime:
    return datetime.now(timezone.utc)


def set_status(s: ComputeSession, status: str, reason: str = "", *, ledger: bool = True) -> None:
    """Change a session's status; the usage ledger follows (``ledger=False``: the caller charged it)."""
    old = s.status
    s.status = status
    s.status_reason = reason
    s.status_changed_at = _now()
    s.status_history = [
        *(s.status_history or []),
        {"status": status, "at": s.status_changed_at.isoformat(), "reason": reason},
    ]
    if ledger and old != status:
        db = object_session(s)
        if db is not None:
            usage_ledger.on_transition(db, s, old, status)


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
    "port",
    "id",
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
    # Slots and GPU models: checked and derived once per distinct request (compute.shapes).
    shape = out["shape"] = shapes.shape_of(body.get("slots", {}), body.get("gpu_models", []))
    out["slots"] = shape.slots
    out["gpu_models"] = list(shape.gpu_models)
    out["name"] = check_text(body.get("name", ""), "name", 255)
    out["username"] = body.get("username")
    out["vfolders"] = body.get("vfolders", [])
    # The command of a batch or inference session: the spawner runs it; admission does not look at it.
    out["command"] = check_text(body.get("command", ""), "command", MAX_COMMAND)
    port = body.get("port")
    out["port"] = (
        None
        if port is None
        else check_int(port, "port", minimum=COMMAND_PORT_RANGE[0], maximum=COMMAND_PORT_RANGE[1])
    )
    if out["port"] is not None and out["type"] != "inference":
        raise InvalidInput("port is for inference sessions only (the port their command listens on)")
    out["id"] = None if body.get("id") is None else check_proposed_id(body["id"])
    return out


def check_proposed_id(value: Any) -> str:
    """The id the Hub's spawner proposes for the session it asks for: a UUID as ``str(uuid4())``
    writes it, so that it can ask again with the same id when an answer is lost."""
    try:
        ok = isinstance(value, str) and str(uuid.UUID(value)) == value
    except ValueError:
        ok = False
    if not ok:
        raise InvalidInput("id must be a UUID in its canonical form (lower case, with hyphens)")
    return value


def admitted_before(db: Session, actor: Actor, body: Any) -> ComputeSession | None:
    """The session the Hub's spawner asked for with this id already, or None.

    The spawner proposes the session's id and asks again with the same body when the service did
    not answer (it was restarting, or died after committing): the session admitted then is the
    answer, and nothing is admitted twice.  An id taken by another user's or server's session is a
    conflict."""
    if not isinstance(body, Mapping) or body.get("id") is None or actor.kind != "hub":
        return None
    sid = check_proposed_id(body["id"])
    earlier = db.get(ComputeSession, sid)
    if earlier is None:
        return None
    username = body.get("username")
    if earlier.user.username != username or earlier.name != body.get("name", ""):
        raise Conflict(f"session id {sid} is taken")
    return earlier


def _requested_user(actor: Actor, req: dict[str, Any]) -> str:
    # The Hub (spawner) asks on behalf of a user; anyone else asks for themselves.
    if req["username"] is not None:
        if actor.kind not in ("hub", "cli") and req["username"] != actor.name:
            raise Forbidden("you can start sessions only for yourself")
        return check_username(req["username"])
    return actor.name


def admit(
    db: Session,
    actor: Actor,
    body: Any,
    *,
    launch: Launch | None = None,
    dry_run: bool = False,
    queue: admission.QueueLimits | None = None,
) -> ComputeSession:
    """Admit a session: every check, then placement; SCHEDULED, PENDING, or refused (raises).

    ``launch``: the Hub admits the server of a session started through the API (see
    :func:`prepare_launch`); the session takes that request's exact slots and GPU models and is
    charged to the keypair that signed it.  ``dry_run``: every check (the capacity that could ever
    hold it included) but no placement; the session returned is not added, and the caller rolls back.
    ``queue``: how many may wait, for a session that does not fit now (two counts, then).

    Statements in the common case: the group's lock with its alloc_version and the tenancy and
    folder versions (one UPDATE ... RETURNING), then on SQLite (after its BEGIN) the ledger's
    upsert and the inserts of the session, its allocations and the audit entry (six in all), on
    PostgreSQL all of those as one statement (two in all).  The ledger reads back only the rows
    a cap checks (none when nothing is capped).  Tenancy, the request's derived values
    (:mod:`labfleet.compute.shapes`) and, where nothing is capped, the checks' verdict come
    from per-process caches.
    """
    if launch is not None and isinstance(body, Mapping):
        body = {**body, "slots": launch.slots, "gpu_models": list(launch.gpu_models)}
    req = parse_request(body)
    username = _requested_user(actor, req)
    if req["id"] is not None and actor.kind != "hub":
        raise InvalidInput("id: labfleet names the session (only the Hub's spawner proposes an id)")
    access_key = launch.keypair if launch is not None else None
    # An environment's image: admission checks its base; the session runs the environment's image.
    env_image = None
    if req["image"] is not None and req["image"].startswith(ENVIRONMENT_IMAGE_PREFIX):
        req["image"], env_image = environments.session_image(db, username, req["project_ref"], req["image"])
    guess = snapshot.latest(db)
    try:
        t = tenants.resolve(
            db, guess if guess is not None else snapshot.current(db), actor, username, req, access_key
        )
    except LabfleetError:
        if guess is None:
            raise
        t = tenants.resolve(db, snapshot.current(db), actor, username, req, access_key)  # say why, as of now
    # Named folders are checked (and refused) before anything is held.
    named_mounts = None
    if req["vfolders"]:
        owner = db.get(User, t.user.id)
        assert owner is not None  # resolve() found them in this transaction
        named_mounts = vfolders.resolve_mounts(db, owner, req["vfolders"])

    entry, alloc_version, (tenancy_v, folders_v) = clustercache.lock_for_decision(
        db, t.group.id, versions.TENANCY, versions.FOLDERS
    )
    if tenancy_v != t.version:
        t2 = tenants.resolve(db, tenancy_v, actor, username, req, access_key)
        if t2.group.id != t.group.id:  # the group was renamed or replaced meanwhile: lock the right one
            entry, alloc_version, _ = clustercache.lock_for_decision(db, t2.group.id)
        t = t2
    shape: shapes.Shape = req["shape"]
    # Placement is pure (nothing changes before apply), so it runs first: the ledger's change
    # then also counts the session as queued when it does not fit now.
    placement = None if dry_run else entry.cluster.place(shape.wanted, t.group.placement, shape.workload)
    if placement is None and not dry_run and queue is not None and (queue.fleet or queue.per_user):
        fleet_pending, user_pending = _pending_counts(db, t.user.id)
        full = admission.check_queue_room(queue, fleet_pending, user_pending, t.user.username)
        if full is not None:
            raise _refused(actor, username, t, full, 409)
    scopes = tenants.scopes(t)
    delta = shape.queued if placement is None and not dry_run else shape.admitted
    # Nothing capped (the usual case): the charge reads nothing back, and no check needs usage.
    reads = tenants.reads(t, shape.keys)
    if named_mounts is not None:
        mounts = [(v.id, perm) for v, perm in named_mounts]
    else:
        mounts = tenants.dot_folder_mounts(db, tenancy_v, folders_v, t.user.id)
    now = _now()
    row = admitrows.session_row(t, req, now)
    if env_image is not None:
        row["image"] = env_image
    allocations: list[dict[str, Any]] = []
    if placement is not None:
        allocations, taken, where = _allocation_rows(entry, placement, row["id"])
        row["node_id"] = allocations[0]["node_id"]
        admitrows.set_first_status(row, "SCHEDULED", where, now)
    elif not dry_run:
        reason = f"waiting for free capacity in resource group {t.group.name}"
        admitrows.set_first_status(row, "PENDING", reason, now)
    created = audit.entry(
        actor,
        "session.create",
        row["id"],
        target_domain=t.user.domain,
        details={"project": t.project.full_name, "slots": dict(shape.shown), "status": row["status"]},
    )
    # On PostgreSQL the charge and every insert are one statement, before the checks: a refusal
    # rolls it all back.  Elsewhere the charge comes first and the inserts only once admitted.
    in_one = not dry_run and admitrows.one_statement(db)
    if in_one:
        changes = usage_ledger.charge_values(scopes, delta, reads)
        rows = admitrows.write_in_one(db, changes, bool(reads), row, allocations, mounts, created)
    else:
        rows = usage_ledger.charge(db, scopes, delta, reads=reads or None)
    before = {scope: {k: v - delta.get(k, 0) for k, v in got.items()} for scope, got in rows.items()}
    refusal = tenants.check_new(t, shape, req["type"], req["image"], before if reads else None)
    if refusal is not None:
        raise _refused(actor, username, t, refusal, REFUSAL_STATUS.get(refusal.code, 409))
    if placement is None:
        _check_could_fit(entry, t.group.name, shape)  # raises (the caller rolls back) if it never fits
    if dry_run:
        session = admitrows.as_object(row)
        session.mounts = [VFolderMount(vfolder_id=vid, permission=perm) for vid, perm in mounts]
        return session
    if not in_one:
        # Plain inserts of statements compiled once, not the ORM's unit of work: a hot path.
        admitrows.insert_rows(db, row, allocations, mounts)
        audit.write(db, created)
    clustercache.settle(db, t.group.id, entry, alloc_version)
    if placement is not None:
        entry.cluster.apply(taken)  # the cached cluster takes exactly what the rows say
    return admitrows.attach(db, row)


def _refused(
    actor: Actor, username: str, t: tenants.Tenants, refusal: admission.Refusal, status: int
) -> Refused:
    """The refusal to raise: the transaction rolls back (the ledger's charge with it), the refusal
    is still audited."""
    details = {"reason": refusal.message, "code": refusal.code, "project": t.project.full_name}
    return Refused(
        refusal,
        status,
        {"actor": actor, "target": username, "target_domain": t.user.domain, "details": details},
    )


def _pending_counts(db: Session, user_id: int) -> tuple[int, int]:
    """Sessions waiting (PENDING) in the whole fleet, and of this user."""
    fleet, mine = db.execute(
        select(func.count(), func.count().filter(ComputeSession.user_id == user_id)).where(
            ComputeSession.status == "PENDING"
        )
    ).one()
    return fleet or 0, mine or 0


def _allocation_rows(
    entry: clustercache.Entry, placement: Placement, session_id: str
) -> tuple[list[dict[str, Any]], Placement, str]:
    """A placement as allocation rows (amounts in quanta), the exact placement they hold (for the
    cached cluster), and the status reason that says where it runs."""
    node_id = entry.nodes[placement.node]
    cpu_milli = int(placement.cpu * 1000)
    rows: list[dict[str, Any]] = []
    taken = []
    for i, (dev_uuid, shares) in enumerate(placement.devices):
        centi = int(shares * 100)
        rows.append(
            {
                "session_id": session_id,
                "node_id": node_id,
                "device_id": entry.devices[dev_uuid].id,
                "shares_centi": centi,
                "cpu_milli": cpu_milli if i == 0 else 0,
                "mem": placement.mem if i == 0 else 0,
            }
        )
        taken.append((dev_uuid, Decimal(centi) / 100))
    if not placement.devices:
        rows.append(
            {
                "session_id": session_id,
                "node_id": node_id,
                "device_id": None,
                "shares_centi": 0,
                "cpu_milli": cpu_milli,
                "mem": placement.mem,
            }
        )
    where = ", ".join(
        f"{shares} of {entry.devices[u].model} #{entry.devices[u].index}" for u, shares in placement.devices
    )
    exact = Placement(
        node=placement.node, devices=tuple(taken), cpu=Decimal(cpu_milli) / 1000, mem=placement.mem
    )
    return rows, exact, f"on {placement.node}" + (f": {where}" if where else "")


def _check_could_fit(entry: clustercache.Entry, group: str, shape: shapes.Shape) -> None:
    """Refuse (409) a request that no node of the group could hold even empty: it would wait for ever."""
    if not _fits_empty(entry, shape.wanted):
        message = (
            f"no node of resource group {group} could ever hold {shape.slots.to_cli() or 'this request'}"
        )
        raise Refused(admission.Refusal(code="capacity", message=message, retryable=False), 409)


def _request_of(s: ComputeSession) -> Request:
    return Request.from_slots(s.slots, s.gpu_models or ())


def check(db: Session, s: ComputeSession, version: int | None = None) -> admission.Refusal | None:
    """Run the pure admission checks for the queued session ``s`` against the ledger (which holds
    ``s`` itself: it is taken out).  ``version``: the tenancy version, when the caller read it."""
    version = snapshot.current(db) if version is None else version
    actor = Actor.hub()
    image = s.image
    if image and tenants.image(db, version, image) is None:
        # An environment's image: admitted against its base, as at the session's admission (an image
        # no environment has any more is refused as unregistered).
        image = environments.base_of_image(db, image) or image
    req = {
        "project_ref": s.project.full_name,
        "resource_group": s.resource_group.name,
        "image": image,
    }
    try:
        t = tenants.resolve(db, version, actor, s.user.username, req, s.keypair.access_key)
    except LabfleetError as e:
        return admission.Refusal(code="tenancy", message=e.message, retryable=False)
    request = tenants.session_request(t, s.id, s.type, image, s.slots, s.gpu_models or ())
    own = quanta.session_delta(s.slots, live=1, pending=int(s.status == "PENDING"))
    rows = usage_ledger.read(db, usage_ledger.scopes_of(s))
    before = {scope: {k: v - own.get(k, 0) for k, v in row.items()} for scope, row in rows.items()}
    return admission.check_admission(tenants.context(t, request, before))


def _try_place(db: Session, s: ComputeSession) -> bool:
    """Place the queued session ``s`` on its group's nodes (the caller holds the group's lock)."""
    group = s.resource_group
    return _place(db, s, group.id, group.placement, clustercache.get(db, group.id), None, _request_of(s))


def _place(
    db: Session,
    s: ComputeSession,
    group_id: int,
    policy: str,
    entry: clustercache.Entry,
    version: int | None,
    wanted: Request,
) -> bool:
    """Place the queued ``s`` with ``entry``, its group's state before this transaction's bump to
    ``version`` (None: not bumped yet; bumped here if it places); on success write its allocations
    and mark it SCHEDULED."""
    placement = entry.cluster.place(wanted, policy, None)
    if placement is None:
        return False
    if version is None:
        version = allocversions.bump(db, group_id)
    rows, taken, where = _allocation_rows(entry, placement, s.id)
    s.node_id = rows[0]["node_id"]
    allocations = [Allocation(**{k: v for k, v in r.items() if k != "session_id"}, session=s) for r in rows]
    allocversions.expect(db, allocations)
    db.add_all(allocations)
    set_status(s, "SCHEDULED", where)
    clustercache.settle(db, group_id, entry, version)
    entry.cluster.apply(taken)  # the cached cluster takes exactly what the rows say
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
    wanted = req["shape"].wanted
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
    if req.get("port") is not None:
        options["port"] = req["port"]
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
            ComputeSession.status.in_(LIVE_STATUSES),
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


# Key in a unit of work's ``Session.info``: (resource group name, seconds waited) of each session that
# ``schedule_group`` placed from a queue in it, for whoever commits the unit (the service's queue-wait
# metric). Kept on the unit, not returned, because a release serves its group's queue deep inside
# ``terminate``, ``update_status`` and ``reconcile``.
QUEUE_WAITS = "labfleet.queue_waits"


def take_queue_waits(db: Session) -> list[tuple[str, float]]:
    """The waits ``schedule_group`` recorded in the unit of work ``db`` (once: they are taken out)."""
    waits: list[tuple[str, float]] = db.info.pop(QUEUE_WAITS, [])
    return waits


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
    version = snapshot.current(db)
    for item in ordered:
        s = by_id[item.session_id]
        if check(db, s, version) is not None:
            continue  # still over a quota: it waits, and its reason says so at the next look
        if _try_place(db, s):
            scheduled.append(s.id)
            waited = (now - s.created_at).total_seconds()
            db.info.setdefault(QUEUE_WAITS, []).append((group.name, max(0.0, waited)))
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
    return ResourceSlots({k: v for k, v in c.items() if k in CHARGED_SLOTS})


def would_start_if_released(db: Session, s: ComputeSession) -> str | None:
    """A session waiting in ``s``'s group's queue that could be placed if ``s`` gave its slots back
    (capacity only; quotas are the waiting one's own business): its id, or None. Nothing changes:
    the check runs on a private copy of the group's cluster (for idle reclamation's
    ``only_when_queue_waiting``)."""
    group = s.resource_group
    pending = list(
        db.scalars(
            select(ComputeSession).where(
                ComputeSession.resource_group_id == group.id, ComputeSession.status == "PENDING"
            )
        )
    )
    allocations = list(db.scalars(select(Allocation).where(Allocation.session_id == s.id)))
    if not pending or not allocations:
        return None
    entry = clustercache.build(db, group.id, allocversions.version(db, group.id))  # a copy of our own
    given_back = _placement_of(entry, allocations)
    if given_back is None:
        return None
    try:
        entry.cluster.release(given_back)
    except PlacementError:
        return None
    by_id = {p.id: p for p in pending}
    for item in _ordered_queue(db, group, pending):
        if entry.cluster.place(_request_of(by_id[item.session_id]), group.placement, None) is not None:
            return item.session_id
    return None


def _pending_in(db: Session, group: ResourceGroup) -> list[ComputeSession]:
    return list(
        db.scalars(
            select(ComputeSession).where(
                ComputeSession.resource_group_id == group.id, ComputeSession.status == "PENDING"
            )
        )
    )


def queue_positions(db: Session, group: ResourceGroup) -> dict[str, int]:
    """{session id: its place in the group's queue, 1 for the head}, without building any view."""
    return queueing.queue_positions(_ordered_queue(db, group, _pending_in(db, group)))


def queue_view(db: Session, group: ResourceGroup) -> list[dict[str, Any]]:
    pending = _pending_in(db, group)
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


def position_of(db: Session, s: ComputeSession) -> int | None:
    if s.status != "PENDING":
        return None
    return queue_positions(db, s.resource_group).get(s.id)


# ---------------------------------------------------------------- release, status, reconcile


def lock_current(db: Session, s: ComputeSession) -> None:
    """Take the lock of ``s``'s group (PostgreSQL; SQLite's transactions hold the database's) and
    read its status again under it: every status change and release takes this lock, so what
    the caller then decides from ``s.status`` cannot be overwritten by a concurrent stop."""
    if db.get_bind().dialect.name == "postgresql":
        group_id = s.resource_group_id
        db.execute(select(ResourceGroup.id).where(ResourceGroup.id == group_id).with_for_update())
        db.refresh(s, ["status", "status_reason", "status_history", "status_changed_at"])


def release(db: Session, s: ComputeSession, status: str, reason: str) -> bool:
    """Give back what ``s`` holds (the cached cluster kept in step) and set its final ``status``.

    False (and nothing changed) when ``s`` had already ended: a concurrent stop got there first.
    """
    group_id = s.resource_group_id
    lock_current(db, s)  # its status as of now: the ledger takes it out once, not once per stop
    if s.status in FINAL_STATUSES:
        return False
    if status == "CANCELLED" and s.status != "PENDING":
        status = "TERMINATED"  # placed meanwhile: it ran (or was about to)
    # Read them again under the group lock: a concurrent stop or placement may have changed them.
    allocations = list(db.scalars(select(Allocation).where(Allocation.session_id == s.id)))
    if allocations:
        version = allocversions.bump(db, group_id)
        entry = clustercache.lookup(db, group_id, version - 1)
        given_back = _placement_of(entry, allocations) if entry is not None else None
        allocversions.expect(db, allocations)
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
    return True


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
    if not release(
        db, s, "CANCELLED" if s.status == "PENDING" else "TERMINATED", f"{reason} by {actor.name}"
    ):
        return s  # a concurrent stop ended it first
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
    body = check_fields(body, required=["status"], optional=["reason", "exit_code", "runtime"])
    status = check_choice(
        body["status"], "status", ("PREPARING", "RUNNING", "TERMINATING", "TERMINATED", "ERROR", "CANCELLED")
    )
    runtime = check_runtime(body["runtime"]) if body.get("runtime") is not None else None
    lock_current(db, s)  # a concurrent stop may have ended it since it was read
    if status not in SPAWNER_TRANSITIONS.get(s.status, set()):
        raise Conflict(f"session {s.id} is {s.status}; it cannot become {status}")
    reason = check_text(body.get("reason", ""), "reason", 1000)
    if s.status_reason.split(":", 1)[0] in RECLAIM_REASONS and status in ("TERMINATING", *FINAL_STATUSES):
        reason = s.status_reason  # the service stopped it (idle, lifetime): the stop keeps saying why
    if "exit_code" in body:
        s.exit_code = check_int(body["exit_code"], "exit_code", minimum=-255, maximum=255)
    if runtime is not None:
        s.runtime = runtime
    if status in FINAL_STATUSES:
        release(db, s, status, reason)
        schedule_group(db, s.resource_group)
    else:
        set_status(s, status, reason)
    return s


_CONTAINER_ID = re.compile(r"^[0-9a-f]{12,64}$")
PID_MAX = 2**22  # the kernel's largest pid_max


def check_runtime(value: Any) -> dict[str, Any]:
    """Where a session runs, as the spawner reports it: ``{"pid": N}`` (a local server's root
    process) or ``{"container": ID}`` (a Docker container), with ``"address"`` where the session has
    a network of its own (the serving router calls its replica there); InvalidInput otherwise."""
    body = check_fields(value, optional=["pid", "container", "address"])
    where = {k: v for k, v in body.items() if k != "address"}
    if len(where) != 1:
        raise InvalidInput('runtime must be {"pid": N} or {"container": ID}, with an optional "address"')
    out: dict[str, Any]
    if "pid" in where:
        out = {"pid": check_int(where["pid"], "runtime.pid", minimum=1, maximum=PID_MAX)}
    else:
        container = where["container"]
        if not isinstance(container, str) or not _CONTAINER_ID.match(container):
            raise InvalidInput("runtime.container must be a Docker container id (12 to 64 hex digits)")
        out = {"container": container}
    if "address" in body:
        try:
            out["address"] = str(ipaddress.ip_address(str(body["address"])[:64]))
        except ValueError:
            raise InvalidInput("runtime.address must be an IP address") from None
    return out


def list_sessions(db: Session, actor: Actor, filters: dict[str, str | None]) -> list[ComputeSession]:
    """Every session ``actor`` may read that matches ``filters``, oldest first; the REST API
    answers pages of the same query (labfleet.compute.sessionlist.page_sessions)."""
    from labfleet.compute.sessionlist import all_sessions  # authz and filters in SQL

    return all_sessions(db, actor, filters)


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
        # The node's MPS daemon (state, reason, pipe_dir): the spawner limits a fraction with it.
        "node_mps": mps_view(s.node) if s.node else None,
        "devices": devices,
        "exit_code": s.exit_code,
        "created_at": s.created_at.isoformat() if s.created_at else None,
        "mounts": [vfolders.mount_view(m.vfolder, m.permission) for m in s.mounts],
    }
