"""Node agents (``labfleet agent``), service side: node tokens, registration, heartbeats, the node
lifecycle (ALIVE -> LOST -> ALIVE) and draining.

- A **node token** is issued by a superadmin, shown once and stored hashed (:mod:`labfleet.core.passwords`);
  it reads ``lfnode_<id>_<secret>``. A token bound to a node name registers only that node; an unbound
  one any name that no other live token's agent holds. Revoked tokens authenticate nothing.
- An agent **registers** its node (CPU, memory, devices as ``describe_node`` gives them, labels) and
  then **heartbeats**: it reports what it sees running, what ended, and the trusted sampler's readings;
  the answer lists what the service believes runs there, and ``stop``: sessions the agent sees that
  the service no longer holds (it stops them).
- The **lifecycle**: :func:`judge` (pure) says which agent nodes missed ``lost_after`` heartbeats;
  :func:`mark_lost` marks one LOST, ends its live sessions in ERROR ("node lost"), frees their
  allocations (the ledger follows), audits, and serves the queue. A node without an agent (the one the
  service registers itself) is never judged. A LOST node's agent that comes back makes it ALIVE again.
- **Drain**: a node with ``schedulable = false`` gets no new placement (nor does a LOST one: the cluster
  cache builds from ALIVE, schedulable nodes only); what runs there stays.

Everything an agent sends is untrusted: bodies are checked whole before anything changes (400 otherwise),
and ended reports are accepted only for sessions on that agent's own node.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from labfleet.compute import envremote, nodes, sessions
from labfleet.compute.devices.base import DeviceInfo, NodeInfo
from labfleet.compute.devices.mps import MAX_REASON, MPS_STATES, MpsStatus
from labfleet.core import allocversions, audit, passwords
from labfleet.core.authz import Actor
from labfleet.core.bootstrap import DEFAULT_GROUP, ensure_default_group
from labfleet.core.errors import Conflict, Forbidden, InvalidInput, NotFound, Unauthorized
from labfleet.core.models import (
    RECLAIM_REASONS,
    Allocation,
    ComputeSession,
    Device,
    Node,
    NodeToken,
    ResourceGroup,
    utcnow,
)
from labfleet.core.validate import (
    check_bool,
    check_fields,
    check_int,
    check_name,
    check_session_id,
    check_text,
)
from labfleet.core.vocab import FINAL_STATUSES, HOLDING_STATUSES

TOKEN_PREFIX = "lfnode_"
_TOKEN_RE = re.compile(r"^lfnode_([0-9]{1,10})_([A-Za-z0-9_-]{20,100})$")
# Host names (RFC 1123, dots allowed), as the service's own node name may be one.
NODE_NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$")
DEFAULT_HEARTBEAT = 10.0
DEFAULT_LOST_AFTER = 3
MAX_DEVICES = 1024
MAX_LABELS = 64
MAX_IDS = 10_000  # sessions one heartbeat may name (running, ended)
MAX_CPU = 100_000
MAX_MEM = 2**60


def agent_actor(token: NodeToken, node: str = "", remote_addr: str = "") -> Actor:
    """Who an agent is in the audit log: ``agent:<node>`` (or ``agent#<token id>`` before it names one)."""
    return Actor(
        name=f"agent:{node}" if node else f"agent#{token.id}",
        role="agent",
        kind="agent",
        remote_addr=remote_addr,
    )


# ---------------------------------------------------------------- tokens


def _check_node_name(value: Any, field: str = "node") -> str:
    if not isinstance(value, str) or not NODE_NAME_RE.match(value):
        raise InvalidInput(
            f"{field} must be a host name: 1-253 letters, digits, '.', '-' or '_', starting and ending "
            f"with a letter or digit (got {value!r:.80})"
        )
    return value


def _superadmin(actor: Actor, what: str) -> None:
    if not actor.is_superadmin:
        raise Forbidden(f"only a superadmin can {what}")


def create_token(db: Session, actor: Actor, body: Any) -> tuple[NodeToken, str]:
    """Issue a node token; returns it with its plain value (to show once)."""
    body = check_fields(body, optional=["node", "resource_group", "note"])
    _superadmin(actor, "issue node tokens")
    node = _check_node_name(body["node"]) if body.get("node") is not None else None
    group = (
        check_name(body["resource_group"], "resource_group")
        if body.get("resource_group") is not None
        else None
    )
    if group is not None and db.scalar(select(ResourceGroup.id).where(ResourceGroup.name == group)) is None:
        raise NotFound(f"no resource group {group!r}")
    note = check_text(body.get("note", ""), "note", 255)
    token = NodeToken(
        token_hash="", node=node, resource_group=group, note=note, created_by=actor.name, created_at=utcnow()
    )
    db.add(token)
    db.flush()
    secret = secrets.token_urlsafe(32)
    token.token_hash = passwords.hash_password(secret)
    audit.record(
        db,
        actor,
        "node_token.create",
        str(token.id),
        details={"node": node, "resource_group": group, "note": note},
    )
    return token, f"{TOKEN_PREFIX}{token.id}_{secret}"


def list_tokens(db: Session, actor: Actor) -> list[NodeToken]:
    if not actor.reads_everything:
        raise Forbidden("only a superadmin or a monitor can list node tokens")
    return list(db.scalars(select(NodeToken).order_by(NodeToken.id)))


def revoke_token(db: Session, actor: Actor, token_id: Any) -> NodeToken:
    """Revoke a token: its agent's next request is refused, and its node goes LOST in time."""
    _superadmin(actor, "revoke node tokens")
    if isinstance(token_id, str) and token_id.isdigit() and len(token_id) <= 10:
        token_id = int(token_id)
    token_id = check_int(token_id, "node token id", minimum=1)
    token = db.get(NodeToken, token_id)
    if token is None:
        raise NotFound(f"no node token {token_id}")
    if token.revoked_at is None:
        token.revoked_at = utcnow()
        audit.record(db, actor, "node_token.revoke", str(token.id), details={"node": token.node})
    return token


def token_view(db: Session, t: NodeToken) -> dict[str, Any]:
    held = list(db.scalars(select(Node.name).where(Node.agent_token_id == t.id).order_by(Node.name)))
    return {
        "id": t.id,
        "node": t.node,
        "resource_group": t.resource_group,
        "note": t.note,
        "created_by": t.created_by,
        "created_at": t.created_at.isoformat() if t.created_at else None,
        "last_used": t.last_used.isoformat() if t.last_used else None,
        "revoked": t.revoked_at is not None,
        "nodes": held,
    }


# Tokens verified in this process, by id: (sha256 of the presented token, the stored hash it matched).
# The stored hash costs 600,000 PBKDF2 rounds to check; an agent heartbeats every few seconds.
_verified: dict[int, tuple[bytes, str]] = {}
_verified_lock = threading.Lock()


def authenticate(db: Session, presented: str) -> NodeToken:
    """The live token ``presented`` is; Unauthorized otherwise (malformed, unknown, wrong, revoked)."""
    m = _TOKEN_RE.match(presented or "")
    if m is None:
        raise Unauthorized("not a node token")
    token = db.get(NodeToken, int(m.group(1)))
    if token is None or token.revoked_at is not None or not token.token_hash:
        raise Unauthorized("unknown or revoked node token")
    digest = hashlib.sha256(presented.encode()).digest()
    with _verified_lock:
        known = _verified.get(token.id)
    if known is not None and known[1] == token.token_hash and hmac.compare_digest(known[0], digest):
        return token
    if not passwords.verify_password(m.group(2), token.token_hash):
        raise Unauthorized("unknown or revoked node token")
    with _verified_lock:
        _verified[token.id] = (digest, token.token_hash)
    return token


def looks_like_token(presented: str) -> bool:
    return presented.startswith(TOKEN_PREFIX)


# ---------------------------------------------------------------- registration


def _check_labels(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise InvalidInput("labels must be an object of strings")
    if len(value) > MAX_LABELS:
        raise InvalidInput(f"labels: at most {MAX_LABELS}")
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or not 1 <= len(k) <= 128 or "\x00" in k:
            raise InvalidInput(f"labels: a key must be a string of 1-128 characters (got {k!r:.40})")
        out[k] = check_text(v, f"labels[{k}]", 1024)
    return out


def _check_cpu(value: Any) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidInput("cpu must be a number of cores")
    try:
        cpu = Decimal(str(value))
    except InvalidOperation:
        raise InvalidInput(f"cpu must be a number of cores (got {value!r:.40})") from None
    if not cpu.is_finite() or cpu <= 0 or cpu > MAX_CPU or cpu != cpu.quantize(Decimal("0.001")):
        raise InvalidInput(f"cpu must be more than 0 and at most {MAX_CPU} cores, in thousandths")
    return cpu


def _check_device(value: Any, i: int) -> DeviceInfo:
    where = f"devices[{i}]"
    d = check_fields(
        value,
        required=["uuid", "index", "model", "memory_bytes"],
        optional=["kind", "parent_uuid"],
        what=where,
    )
    uuid = check_text(d["uuid"], f"{where}.uuid", 128)
    model = check_text(d["model"], f"{where}.model", 128)
    parent = d.get("parent_uuid")
    if parent is not None:
        parent = check_text(parent, f"{where}.parent_uuid", 128)
    try:
        return DeviceInfo(
            uuid=uuid,
            index=check_int(d["index"], f"{where}.index", maximum=MAX_DEVICES),
            model=model,
            memory_bytes=check_int(d["memory_bytes"], f"{where}.memory_bytes", maximum=MAX_MEM),
            kind=d.get("kind", "gpu"),
            parent_uuid=parent,
        )
    except ValueError as e:
        raise InvalidInput(f"{where}: {e}") from None


def check_mps(value: Any, field: str = "mps") -> MpsStatus:
    """A node's MPS report ``{"state", "reason", "pipe_dir"}``, checked (InvalidInput otherwise)."""
    d = check_fields(value, required=["state"], optional=["reason", "pipe_dir"], what=field)
    if d["state"] not in MPS_STATES:
        raise InvalidInput(f"{field}.state must be one of {', '.join(MPS_STATES)} (got {d['state']!r:.40})")
    reason = d.get("reason")
    if reason is not None:
        reason = check_text(reason, f"{field}.reason", MAX_REASON)
    pipe = d.get("pipe_dir")
    if pipe is not None:
        pipe = check_text(pipe, f"{field}.pipe_dir", 1024)
        if not pipe.startswith("/"):
            raise InvalidInput(f"{field}.pipe_dir must be an absolute path (got {pipe!r:.80})")
    if d["state"] == "on" and pipe is None:
        raise InvalidInput(f"{field}.pipe_dir is required when the state is on")
    return MpsStatus(d["state"], reason, pipe)


@dataclass(frozen=True)
class Registration:
    node: str
    resource_group: str | None
    info: NodeInfo
    labels: dict[str, str]
    mps: MpsStatus | None = None


def parse_register(body: Any) -> Registration:
    """A register body, checked whole (InvalidInput, nothing changed, otherwise)."""
    body = check_fields(
        body,
        required=["node", "cpu", "mem"],
        optional=["resource_group", "devices", "plugin", "labels", "mps"],
    )
    name = _check_node_name(body["node"])
    group = body.get("resource_group")
    group = check_name(group, "resource_group") if group is not None else None
    cpu = _check_cpu(body["cpu"])
    mem = check_int(body["mem"], "mem", minimum=1, maximum=MAX_MEM)
    raw = body.get("devices", [])
    if not isinstance(raw, list) or len(raw) > MAX_DEVICES:
        raise InvalidInput(f"devices must be a list of at most {MAX_DEVICES} devices")
    devices = [_check_device(d, i) for i, d in enumerate(raw)]
    uuids = [d.uuid for d in devices]
    if len(set(uuids)) != len(uuids):
        raise InvalidInput("devices: two devices have the same uuid")
    plugin = check_text(body.get("plugin", ""), "plugin", 64)
    labels = _check_labels(body.get("labels", {}))
    mps = check_mps(body["mps"]) if body.get("mps") is not None else None
    return Registration(
        name, group, NodeInfo(name=name, cpu=cpu, mem=mem, devices=devices, plugin=plugin), labels, mps
    )


def _held_by_other(db: Session, node: Node, token: NodeToken) -> bool:
    if node.agent_token_id is None or node.agent_token_id == token.id:
        return False
    other = db.get(NodeToken, node.agent_token_id)
    return other is not None and other.revoked_at is None


def register(db: Session, token: NodeToken, body: Any, remote_addr: str = "") -> Node:
    """Register or refresh the agent's node; it is ALIVE from now on."""
    reg = parse_register(body)
    actor = agent_actor(token, reg.node, remote_addr)
    if token.node is not None and token.node != reg.node:
        raise Forbidden(f"this node token registers node {token.node!r} only, not {reg.node!r}")
    if token.resource_group is not None and reg.resource_group not in (None, token.resource_group):
        raise Forbidden(f"this node token registers nodes of resource group {token.resource_group!r} only")
    node = db.scalar(select(Node).where(Node.name == reg.node))
    if node is not None and node.agent_token_id is None and token.node != reg.node:
        raise Conflict(
            f"node {reg.node!r} is registered by the service itself: only a token issued for it (--node) takes it"
        )
    if node is not None and _held_by_other(db, node, token):
        raise Conflict(f"node {reg.node!r} is held by another node token's agent")
    wanted = token.resource_group or reg.resource_group
    group_name = wanted or (node.resource_group.name if node is not None else DEFAULT_GROUP)
    group = db.scalar(select(ResourceGroup).where(ResourceGroup.name == group_name))
    if group is None:
        if group_name != DEFAULT_GROUP:
            raise InvalidInput(f"no resource group {group_name!r}")
        group = ensure_default_group(db)
    uuids = [d.uuid for d in reg.info.devices]
    if uuids:
        taken = db.scalar(
            select(Device.uuid)
            .join(Node, Node.id == Device.node_id)
            .where(Device.uuid.in_(uuids), Node.name != reg.node)
            .limit(1)
        )
        if taken is not None:
            raise Conflict(f"device {taken} belongs to another node")
    if node is not None and node.resource_group_id != group.id:
        live = db.scalar(select(func.count()).select_from(Allocation).where(Allocation.node_id == node.id))
        if live:
            raise Conflict(
                f"node {reg.node!r} is in resource group {node.resource_group.name!r} and runs sessions there: "
                f"it moves to {group_name!r} once they end"
            )
        for group_id in sorted((node.resource_group_id, group.id)):
            allocversions.bump(db, group_id)
        node.resource_group = group
        db.flush()
    was = (node.status, node.agent_token_id) if node is not None else None
    node = nodes.register_node(db, reg.info, group_name)
    node.labels = reg.labels
    node.agent_token_id = token.id
    if reg.mps is not None:
        nodes.set_mps(db, node, reg.mps)
    token.last_used = utcnow()
    db.flush()
    details = {
        "resource_group": group_name,
        "cpu": str(reg.info.cpu),
        "mem": reg.info.mem,
        "devices": len(reg.info.devices),
        "labels": reg.labels,
        "token": token.id,
    }
    if was is not None and was[0] == "LOST":
        details["was"] = "LOST"
    audit.record(db, actor, "node.register", reg.node, details=details)
    return node


# ---------------------------------------------------------------- heartbeats


@dataclass(frozen=True)
class Ended:
    session: str
    exit_code: int | None


@dataclass(frozen=True)
class Beat:
    node: str
    running: tuple[str, ...]
    ended: tuple[Ended, ...]
    mps: MpsStatus | None = None  # the node's MPS daemon now (None: not reported, unchanged)
    # What the agent did of the kills it was handed, raw: checked by labfleet.usage.overuse.parse_kill_reports.
    kill_reports: tuple[Any, ...] = ()
    # What the agent says of the commits it was handed, raw: checked by labfleet.compute.envremote.
    commit_reports: tuple[Any, ...] = ()


def parse_heartbeat(body: Any) -> tuple[Beat, Any]:
    """A heartbeat body, checked whole but for its readings (returned raw, for
    :func:`labfleet.usage.records.parse_agent_readings`) and its kill reports (``kill_reports``, a
    list kept raw for :func:`labfleet.usage.overuse.parse_kill_reports`) and its commit reports
    (``commit_reports``, kept raw for :func:`labfleet.compute.envremote.parse_commit_reports`)."""
    body = check_fields(
        body,
        required=["node"],
        optional=["running", "ended", "readings", "mps", "kill_reports", "commit_reports"],
    )
    name = _check_node_name(body["node"])
    running = body.get("running", [])
    if not isinstance(running, list) or len(running) > MAX_IDS:
        raise InvalidInput(f"running must be a list of at most {MAX_IDS} session ids")
    ids = tuple(check_session_id(s, "running[]") for s in running)
    raw_ended = body.get("ended", [])
    if not isinstance(raw_ended, list) or len(raw_ended) > MAX_IDS:
        raise InvalidInput(f"ended must be a list of at most {MAX_IDS} objects")
    ended = []
    for i, e in enumerate(raw_ended):
        e = check_fields(e, required=["session"], optional=["exit_code"], what=f"ended[{i}]")
        code = e.get("exit_code")
        if code is not None:
            code = check_int(code, f"ended[{i}].exit_code", minimum=-255, maximum=255)
        ended.append(Ended(check_session_id(e["session"], f"ended[{i}].session"), code))
    readings = body.get("readings", [])
    if not isinstance(readings, list):
        raise InvalidInput("readings must be a list")
    mps = check_mps(body["mps"]) if body.get("mps") is not None else None
    kill_reports = body.get("kill_reports", [])
    if not isinstance(kill_reports, list):
        raise InvalidInput("kill_reports must be a list")
    commit_reports = body.get("commit_reports", [])
    if not isinstance(commit_reports, list):
        raise InvalidInput("commit_reports must be a list")
    return Beat(name, ids, tuple(ended), mps, tuple(kill_reports), tuple(commit_reports)), readings


@dataclass
class BeatResult:
    node: Node
    stop: list[str] = field(default_factory=list)  # seen running, no longer held by the service
    released: list[str] = field(default_factory=list)  # ended reports that released a session
    live: set[str] = field(default_factory=set)  # sessions held on the node (readings accepted for)
    came_back: bool = False


def agent_node(db: Session, token: NodeToken, name: str) -> Node:
    """The node ``token``'s agent holds by ``name``: NotFound (register first) or Forbidden."""
    node = db.scalar(select(Node).where(Node.name == name))
    if node is None:
        raise NotFound(f"no node {name!r}: register it first")
    if node.agent_token_id != token.id:
        raise Forbidden(f"node {name!r} is not held by this node token: register it first")
    return node


def held_on(db: Session, node_id: int) -> list[ComputeSession]:
    """The sessions holding slots on a node."""
    return list(
        db.scalars(
            select(ComputeSession).where(
                ComputeSession.node_id == node_id, ComputeSession.status.in_(HOLDING_STATUSES)
            )
        )
    )


def heartbeat(db: Session, token: NodeToken, beat: Beat, remote_addr: str = "") -> BeatResult:
    """Refresh the node, release what the agent reports ended (its own node's sessions only), and say
    which running sessions the service no longer holds (``stop``)."""
    node = agent_node(db, token, beat.node)
    now = utcnow()
    result = BeatResult(node)
    if node.status != "ALIVE":
        # Back from LOST (or DISABLED by hand: left alone). Through the ORM: the cached cluster learns of it.
        if node.status == "LOST":
            node.status = "ALIVE"
            node.last_seen = now
            result.came_back = True
            audit.record(db, agent_actor(token, node.name, remote_addr), "node.alive", node.name)
    nodes.mark_seen(db, node.name, now)
    if beat.mps is not None:
        nodes.set_mps(db, node, beat.mps)
    db.execute(
        update(NodeToken)
        .where(NodeToken.id == token.id)
        .values(last_used=now)
        .execution_options(synchronize_session=False)
    )
    served: set[int] = set()
    for e in beat.ended:
        s = db.get(ComputeSession, e.session)
        if s is None or s.node_id != node.id or s.status in FINAL_STATUSES or s.status == "PENDING":
            continue  # not this node's, or already ended: ignored
        if e.exit_code is not None:
            s.exit_code = e.exit_code
        status = "TERMINATED" if e.exit_code in (None, 0) else "ERROR"
        reason = f"ended on node {node.name}" + (
            f" (exit code {e.exit_code})" if e.exit_code is not None else ""
        )
        if s.status_reason.split(":", 1)[0] in RECLAIM_REASONS:
            reason = s.status_reason  # the service stopped it: the end keeps saying why
        if sessions.release(db, s, status, reason):
            result.released.append(s.id)
            served.add(s.resource_group_id)
    for group_id in sorted(served):
        group = db.get(ResourceGroup, group_id)
        if group is not None:
            sessions.schedule_group(db, group)
    held = {s.id for s in held_on(db, node.id)}
    result.live = held
    result.stop = sorted(sid for sid in set(beat.running) if sid not in held)
    return result


# ---------------------------------------------------------------- the lifecycle


@dataclass(frozen=True)
class NodeBeat:
    """What the lifecycle judgment needs of a node."""

    name: str
    status: str
    last_seen: datetime | None
    agent: bool  # registered by an agent (the service keeps its own node alive itself)


def judge(
    beats: list[NodeBeat], now: datetime, heartbeat: float, lost_after: int, since: datetime | None = None
) -> list[str]:
    """The agent nodes that are ALIVE but missed ``lost_after`` heartbeats of ``heartbeat`` seconds:
    to be marked LOST. ``since``: when the service started (heartbeats missed while it was down do not
    count: an agent was retrying). Pure."""
    limit = timedelta(seconds=heartbeat * max(1, lost_after))
    out = []
    for b in beats:
        if not b.agent or b.status != "ALIVE":
            continue
        seen = max((t for t in (b.last_seen, since) if t is not None), default=None)
        if seen is None or now - seen > limit:
            out.append(b.name)
    return out


def node_beats(db: Session) -> list[NodeBeat]:
    rows = db.execute(select(Node.name, Node.status, Node.last_seen, Node.agent_token_id)).all()
    return [NodeBeat(name, status, seen, token_id is not None) for name, status, seen, token_id in rows]


@dataclass(frozen=True)
class LostSession:
    id: str
    user: str
    server: str


def mark_lost(
    db: Session, name: str, now: datetime, heartbeat: float, lost_after: int, since: datetime | None = None
) -> list[LostSession] | None:
    """Mark node ``name`` LOST if it still missed its heartbeats (read again here), end its live
    sessions in ERROR ("node lost"), free their slots, audit, serve the queues. None: not lost after all."""
    node = db.scalar(select(Node).where(Node.name == name))
    if node is None:
        return None
    beat = NodeBeat(node.name, node.status, node.last_seen, node.agent_token_id is not None)
    if not judge([beat], now, heartbeat, lost_after, since):
        return None  # a heartbeat came meanwhile
    node.status = "LOST"  # through the ORM: the flush bumps the group, the cached cluster drops the node
    reason = (
        f"node lost: node {name} missed {lost_after} heartbeats ({heartbeat:g} s each); last seen "
        f"{node.last_seen.isoformat() if node.last_seen else 'never'}"
    )
    lost: list[LostSession] = []
    groups: set[int] = set()
    system = Actor.cli()
    for s in held_on(db, node.id):
        view = LostSession(s.id, s.user.username, s.name)
        domain = s.domain.name
        if sessions.release(db, s, "ERROR", reason):
            lost.append(view)
            groups.add(s.resource_group_id)
            audit.record(
                db,
                system,
                "session.node-lost",
                s.id,
                target_domain=domain,
                details={"node": name, "user": view.user, "server": view.server},
            )
    envremote.fail_handed(db, name, reason)
    audit.record(
        db,
        system,
        "node.lost",
        name,
        details={
            "last_seen": node.last_seen.isoformat() if node.last_seen else None,
            "sessions": [x.id for x in lost],
        },
    )
    db.flush()
    for group_id in sorted(groups):
        group = db.get(ResourceGroup, group_id)
        if group is not None:
            sessions.schedule_group(db, group)
    return lost


# ---------------------------------------------------------------- drain


def set_schedulable(db: Session, actor: Actor, name: str, body: Any) -> Node:
    """Drain (``{"schedulable": false}``) or undrain a node; superadmins only."""
    body = check_fields(body, required=["schedulable"])
    value = check_bool(body["schedulable"], "schedulable")
    node = (
        db.scalar(select(Node).where(Node.name == name))
        if isinstance(name, str) and len(name) <= 255
        else None
    )
    if node is None or not nodes.can_read_group(db, actor, node.resource_group):
        raise NotFound(f"no node {name!r:.80}")
    _superadmin(actor, "drain or undrain nodes")
    if node.schedulable != value:
        allocversions.bump(db, node.resource_group_id)
        node.schedulable = value
        audit.record(db, actor, "node.undrain" if value else "node.drain", node.name)
        db.flush()
    return node


def has_agent(db: Session, name: str) -> bool:
    """Whether an agent holds node ``name`` (it samples that node's sessions, not the service)."""
    return db.scalar(select(Node.agent_token_id).where(Node.name == name)) is not None
