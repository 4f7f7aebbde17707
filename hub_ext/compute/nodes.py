"""Resource groups and nodes: CRUD, grants, node registration from device plugins,
and the capacity view (what each node and device has, holds and has free)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Select, func, select, update
from sqlalchemy.orm import Session, joinedload, selectinload
from sqlalchemy.orm.attributes import set_committed_value

from labfleet.compute.devices.mps import MpsStatus
from labfleet.core import allocversions, audit
from labfleet.core.authz import Actor
from labfleet.core.bootstrap import (
    DEFAULT_GROUP,
    GPU_OVERUSE_POLICIES,
    ensure_default_group,
    new_group,
)
from labfleet.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from labfleet.core.models import Allocation, Device, Node, ResourceGroup, ResourceGroupGrant, User, utcnow
from labfleet.core.pages import Page, page_of
from labfleet.core.validate import (
    check_bool,
    check_choice,
    check_fields,
    check_int,
    check_name,
    check_string_list,
    check_text,
)
from labfleet.core.vocab import SESSION_TYPES

SCHEDULERS = ("fifo", "lifo", "drf")
PLACEMENTS = ("whole-gpu", "spread", "pack", "fgd")
GRANT_KINDS = ("domain", "project", "user")

GROUP_FIELDS = (
    "description",
    "is_public",
    "scheduler",
    "placement",
    "allowed_session_types",
    "pending_timeout",
    "gpu_overuse",
    "grants",
)


# ---------------------------------------------------------------- who may use a group


def group_allows(group: ResourceGroup, user: User, project_full_name: str) -> bool:
    """The union of grants: the user's domain, the session's project, or the user."""
    if group.is_public:
        return True
    wanted = {("domain", user.domain.name), ("project", project_full_name), ("user", user.username)}
    return any((g.kind, g.target) in wanted for g in group.grants)


def usable_groups(db: Session, user: User) -> list[ResourceGroup]:
    projects = [p.full_name for p in user.projects]
    out = []
    for g in db.scalars(select(ResourceGroup).order_by(ResourceGroup.name)):
        if group_allows(g, user, "") or any(group_allows(g, user, p) for p in projects):
            out.append(g)
    return out


def can_read_group(db: Session, actor: Actor, group: ResourceGroup) -> bool:
    if actor.reads_everything:
        return True
    if actor.role == "admin":
        return group.is_public or any(
            (g.kind == "domain" and g.target == actor.domain)
            or (g.kind == "project" and g.target.startswith(f"{actor.domain}/"))
            for g in group.grants
        )
    user = db.scalar(select(User).where(User.username == actor.name))
    return user is not None and group in usable_groups(db, user)


# ---------------------------------------------------------------- CRUD


def _check_grants(value: Any) -> list[tuple[str, str]]:
    if not isinstance(value, list):
        raise InvalidInput("grants must be a list of {kind, target}")
    grants = []
    for item in value:
        g = check_fields(item, required=["kind", "target"], what="a grant")
        kind = check_choice(g["kind"], "grant kind", GRANT_KINDS)
        target = check_text(g["target"], "grant target", 255)
        if not target:
            raise InvalidInput("grant target must not be empty")
        grants.append((kind, target))
    return grants


def _apply_group_fields(group: ResourceGroup, body: dict[str, Any]) -> None:
    if "description" in body:
        group.description = check_text(body["description"], "description")
    if "is_public" in body:
        group.is_public = check_bool(body["is_public"], "is_public")
    if "scheduler" in body:
        group.scheduler = check_choice(body["scheduler"], "scheduler", SCHEDULERS)
    if "placement" in body:
        group.placement = check_choice(body["placement"], "placement", PLACEMENTS)
    if "allowed_session_types" in body:
        types = check_string_list(body["allowed_session_types"], "allowed_session_types")
        for t in types:
            check_choice(t, "allowed_session_types", SESSION_TYPES)
        group.allowed_session_types = sorted(set(types))
    if "pending_timeout" in body:
        group.pending_timeout = check_int(body["pending_timeout"], "pending_timeout", maximum=30 * 24 * 3600)
    if "gpu_overuse" in body:
        group.gpu_overuse = check_choice(body["gpu_overuse"], "gpu_overuse", GPU_OVERUSE_POLICIES)
    if "grants" in body:
        # Keep the rows of grants that stay: replacing them would insert a row the UNIQUE
        # (group, kind, target) constraint still sees before the old one is deleted.
        wanted = list(dict.fromkeys(_check_grants(body["grants"])))
        kept = {(g.kind, g.target): g for g in group.grants if (g.kind, g.target) in wanted}
        group.grants = [kept.get(kt) or ResourceGroupGrant(kind=kt[0], target=kt[1]) for kt in wanted]


def create_group(db: Session, actor: Actor, body: Any) -> ResourceGroup:
    body = check_fields(body, required=["name"], optional=GROUP_FIELDS)
    name = check_name(body["name"], "resource group name")
    if not actor.is_superadmin:
        raise Forbidden("only a superadmin can create resource groups")
    if db.scalar(select(ResourceGroup).where(ResourceGroup.name == name)):
        raise Conflict(f"resource group {name!r} already exists")
    group = new_group(name)
    _apply_group_fields(group, body)
    db.add(group)
    db.flush()
    audit.record(db, actor, "resource_group.create", name, details=body)
    return group


def get_group(db: Session, actor: Actor, name: str) -> ResourceGroup:
    group = db.scalar(select(ResourceGroup).where(ResourceGroup.name == name))
    if group is None or not can_read_group(db, actor, group):
        raise NotFound(f"no resource group {name!r}")
    return group


def update_group(db: Session, actor: Actor, name: str, body: Any) -> ResourceGroup:
    group = get_group(db, actor, name)
    body = check_fields(body, optional=GROUP_FIELDS)
    if not actor.is_superadmin:
        raise Forbidden("only a superadmin can change resource groups")
    _apply_group_fields(group, body)
    audit.record(db, actor, "resource_group.update", name, details=body)
    return group


def list_groups(db: Session, actor: Actor) -> list[ResourceGroup]:
    rows = db.scalars(select(ResourceGroup).order_by(ResourceGroup.name))
    return [g for g in rows if can_read_group(db, actor, g)]


# ---------------------------------------------------------------- nodes


def mark_seen(db: Session, name: str, now: datetime | None = None) -> None:
    """Node ``name`` was heard from (its agent's heartbeat, or the service on its own node).

    A plain UPDATE: last_seen is not placement state, so the cached clusters stay valid."""
    db.execute(
        update(Node)
        .where(Node.name == name)
        .values(last_seen=now or utcnow())
        .execution_options(synchronize_session=False)
    )


def register_node(db: Session, info: Any, group_name: str = DEFAULT_GROUP) -> Node:
    """Create or refresh a node and its devices from a device plugin's NodeInfo.

    Devices that disappeared are removed unless a live allocation still uses them,
    in which case the node keeps them (and the mismatch is logged by the caller).
    """
    group = db.scalar(select(ResourceGroup).where(ResourceGroup.name == group_name))
    if group is None:
        group = ensure_default_group(db) if group_name == DEFAULT_GROUP else None
    if group is None:
        raise InvalidInput(f"no resource group {group_name!r}")
    node = db.scalar(select(Node).where(Node.name == info.name))
    # Bump before changing anything: cached clusters of the group are out of date from here on
    # (and on PostgreSQL this takes the group's lock, so no decision sees half a registration).
    allocversions.bump(db, group.id if node is None else node.resource_group_id)
    if node is None:
        node = Node(name=info.name, resource_group=group, cpu="0", mem=0, labels={}, status="ALIVE")
        db.add(node)
    node.cpu = str(Decimal(str(info.cpu)))
    node.mem = int(info.mem)
    node.plugin = getattr(info, "plugin", "") or ""
    node.status = "ALIVE"
    node.last_seen = utcnow()
    seen = {d.uuid for d in info.devices}
    by_uuid = {d.uuid: d for d in node.devices}
    for d in info.devices:
        dev = by_uuid.get(d.uuid)
        if dev is None:
            dev = Device(uuid=d.uuid, node=node)
            db.add(dev)
        dev.index, dev.model, dev.memory_bytes = d.index, d.model, int(d.memory_bytes)
        dev.kind, dev.parent_uuid = getattr(d, "kind", "gpu"), getattr(d, "parent_uuid", None)
    for dev in list(node.devices):
        if dev.uuid not in seen:
            used = db.scalar(
                select(func.count()).select_from(Allocation).where(Allocation.device_id == dev.id)
            )
            if not used:
                node.devices.remove(dev)
    db.flush()
    return node


def mps_view(node: Node) -> dict[str, Any]:
    """The node's MPS daemon as it reported it: ``{"state", "reason", "pipe_dir"}``."""
    return {"state": node.mps or "off", "reason": node.mps_reason, "pipe_dir": node.mps_pipe_dir}


def set_mps(db: Session, node: Node, status: MpsStatus) -> None:
    """Store the MPS state a node reports. A plain UPDATE, and only on a change: it is not placement
    state, so the cached clusters stay valid."""
    values = {
        "mps": status.state,
        "mps_reason": status.reason,
        "mps_pipe_dir": status.pipe_dir if status.state == "on" else None,
    }
    if (node.mps, node.mps_reason, node.mps_pipe_dir) == tuple(values.values()):
        return
    db.execute(
        update(Node).where(Node.id == node.id).values(**values).execution_options(synchronize_session=False)
    )
    for key, value in values.items():
        set_committed_value(node, key, value)


def node_usage(db: Session, node: Node) -> tuple[int, int, dict[int, int]]:
    """(cpu milli-cores held, memory held, {device id: hundredths held})."""
    cpu, mem = db.execute(
        select(
            func.coalesce(func.sum(Allocation.cpu_milli), 0), func.coalesce(func.sum(Allocation.mem), 0)
        ).where(Allocation.node_id == node.id)
    ).one()
    rows = db.execute(
        select(Allocation.device_id, func.sum(Allocation.shares_centi))
        .where(Allocation.node_id == node.id, Allocation.device_id.is_not(None))
        .group_by(Allocation.device_id)
    ).all()
    return int(cpu), int(mem), {dev_id: int(total) for dev_id, total in rows if dev_id is not None}


def nodes_usage(db: Session, node_ids: list[int]) -> dict[int, tuple[int, int, dict[int, int]]]:
    """``node_usage`` of many nodes in two statements: {node id: (cpu milli, mem, {device id: centi})}."""
    out: dict[int, tuple[int, int, dict[int, int]]] = {i: (0, 0, {}) for i in node_ids}
    if not node_ids:
        return out
    for node_id, cpu, mem in db.execute(
        select(Allocation.node_id, func.sum(Allocation.cpu_milli), func.sum(Allocation.mem))
        .where(Allocation.node_id.in_(node_ids))
        .group_by(Allocation.node_id)
    ):
        out[node_id] = (int(cpu or 0), int(mem or 0), out[node_id][2])
    for node_id, dev_id, total in db.execute(
        select(Allocation.node_id, Allocation.device_id, func.sum(Allocation.shares_centi))
        .where(Allocation.node_id.in_(node_ids), Allocation.device_id.is_not(None))
        .group_by(Allocation.node_id, Allocation.device_id)
    ):
        if dev_id is not None:
            out[node_id][2][dev_id] = int(total)
    return out


def node_view(
    db: Session, node: Node, usage: tuple[int, int, dict[int, int]] | None = None
) -> dict[str, Any]:
    """The node with what it has, holds and has free (``usage``: from ``nodes_usage``, or read now)."""
    cpu_milli, mem, shares = usage if usage is not None else node_usage(db, node)
    cpu_total = Decimal(node.cpu)
    cpu_used = Decimal(cpu_milli) / 1000
    devices = []
    for d in node.devices:
        held = Decimal(shares.get(d.id, 0)) / 100
        devices.append(
            {
                "uuid": d.uuid,
                "index": d.index,
                "model": d.model,
                "memory_bytes": d.memory_bytes,
                "kind": d.kind,
                "capacity": 1,
                "allocated": float(held),
                "free": float(1 - held),
            }
        )
    return {
        "name": node.name,
        "resource_group": node.resource_group.name,
        "status": node.status,
        "plugin": node.plugin,
        "capacity": {"cpu": float(cpu_total), "mem": node.mem, "gpu": len(node.devices)},
        "allocated": {"cpu": float(cpu_used), "mem": mem, "gpu.shares": float(sum(shares.values()) / 100)},
        "free": {"cpu": float(cpu_total - cpu_used), "mem": node.mem - mem},
        "devices": devices,
        "last_seen": node.last_seen.isoformat() if node.last_seen else None,
        "schedulable": bool(node.schedulable),
        "agent": node.agent_token_id is not None,
        "labels": dict(node.labels or {}),
        "mps": mps_view(node),
    }


def nodes_query(db: Session, actor: Actor) -> Select:
    """The nodes of the resource groups ``actor`` may see, by name."""
    groups = [g.id for g in list_groups(db, actor)]  # a few groups; the rule is can_read_group's
    return select(Node).where(Node.resource_group_id.in_(groups)).order_by(Node.name, Node.id)


def list_nodes(db: Session, actor: Actor) -> list[Node]:
    return list(db.scalars(nodes_query(db, actor)))


def page_node_views(db: Session, actor: Actor, *, offset: int, limit: int) -> Page[dict[str, Any]]:
    """One page of ``node_view``s of the nodes ``actor`` may see, in a handful of statements."""
    loads = (joinedload(Node.resource_group), selectinload(Node.devices))
    page = page_of(db, nodes_query(db, actor), offset, limit, options=loads)
    usage = nodes_usage(db, [n.id for n in page.items])
    return page.map(lambda n: node_view(db, n, usage[n.id]))


def group_view(g: ResourceGroup) -> dict[str, Any]:
    return {
        "name": g.name,
        "description": g.description,
        "is_public": g.is_public,
        "scheduler": g.scheduler,
        "placement": g.placement,
        "allowed_session_types": list(g.allowed_session_types or []),
        "pending_timeout": g.pending_timeout,
        "gpu_overuse": g.gpu_overuse or "auto",
        "grants": [{"kind": x.kind, "target": x.target} for x in g.grants],
        "nodes": [n.name for n in g.nodes],
    }
