"""Each resource group's placement state, kept in memory between decisions and checked against the DB.

Rebuilding a placement :class:`~labfleet.compute.scheduler.placement.Cluster` from every node, device and
allocation of a group costs tens of milliseconds at a thousand nodes, while a decision on a built
one takes well under a millisecond.  So each process keeps, per (engine, group), the last Cluster
it built, tagged with the group's ``alloc_version`` (a column of ``resource_groups``).

Why a cached Cluster is never wrong:

1. Every transaction that changes a group's allocations, nodes or devices first bumps the group's
   ``alloc_version`` (:func:`labfleet.core.allocversions.bump`).  The bump updates the group's
   row, so on PostgreSQL it takes the row lock that decisions take (on SQLite every transaction
   holds the write lock), and holds it until commit: a decision that holds the lock sees the
   group's rows as of one version.  Any other write to those rows (a node edited elsewhere, a
   user deleted with its sessions) is bumped by a flush hook
   (:func:`labfleet.core.allocversions.bump_changed_groups`).
2. A decision reads the version after taking the lock (:func:`get`) and uses the cached Cluster
   only if it carries that version; otherwise it rebuilds it from the DB (:func:`build`).
3. A transaction that changes a cached Cluster (apply / release in place, or a rebuild that saw
   its own uncommitted bump) owns it until it commits (:func:`claim`).  Other transactions treat
   an owned entry as missing, and a rollback drops it: the DB keeps the old version, and another
   process may later commit that same next version with a different state.  The transaction's
   part (:class:`_Tx`) joins the unit of work (:func:`labfleet.core.unitofwork.participant`),
   which tells it how the transaction ended.

A :class:`~labfleet.compute.scheduler.placement.Cluster` is not thread-safe; the group lock serialises
the decisions that use one, and a plain lock guards the cache's dict.  Caches are per engine (a
weak key), so two databases never share one.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import cast

from sqlalchemy import Engine, Table, and_, bindparam, select, update
from sqlalchemy.orm import Session

from labfleet.compute.scheduler.placement import Cluster
from labfleet.compute.scheduler.placement import Device as PDevice
from labfleet.compute.scheduler.placement import Node as PNode
from labfleet.core import allocversions, unitofwork, versions
from labfleet.core.database import Prepared
from labfleet.core.models import Allocation, Device, Node, ResourceGroup
from labfleet.core.versions import engine_of as _engine

_INFO_KEY = "labfleet.clustercache"


@dataclass(frozen=True)
class DeviceRef:
    """What a decision needs of a device row without loading it."""

    id: int
    node_id: int
    index: int  # the device's own index (NVML), not its position on the node
    model: str


@dataclass
class Entry:
    """A group's placement state as of ``version``, with the row ids behind its names."""

    version: int
    cluster: Cluster
    devices: dict[str, DeviceRef]  # device uuid -> row
    nodes: dict[str, int]  # node name -> row id
    owner: object | None = None  # the uncommitted transaction that changed it, if any
    device_uuids: dict[int, str] = field(default_factory=dict)  # device row id -> uuid
    node_names: dict[int, str] = field(default_factory=dict)  # node row id -> name
    # The group's drained and LOST nodes, empty: placement skips them, but a request one of them
    # could hold waits in the queue (the node comes back) instead of being refused as never fitting.
    resting: tuple[PNode, ...] = ()
    _empty: Cluster | None = None

    def __post_init__(self) -> None:
        self.device_uuids = {ref.id: uuid for uuid, ref in self.devices.items()}
        self.node_names = {node_id: name for name, node_id in self.nodes.items()}

    def empty(self) -> Cluster:
        """The same nodes with nothing allocated, and the resting ones: could a request ever fit?"""
        if self._empty is None:
            working = (
                PNode(
                    name=n.name,
                    cpu=n.cpu,
                    mem=n.mem,
                    devices=[
                        PDevice(id=d.id, index=d.index, model=d.model, memory=d.memory) for d in n.devices
                    ],
                    labels=dict(n.labels),
                )
                for n in self.cluster.nodes.values()
            )
            self._empty = Cluster([*working, *self.resting])
        return self._empty


class _Tx:
    """This transaction's part in the cache: its token and the entries it changed (a
    :class:`~labfleet.core.unitofwork.Participant`: it hears how the transaction ended)."""

    __slots__ = ("token", "touched")

    def __init__(self) -> None:
        self.token = object()
        self.touched: list[tuple[dict[int, Entry], int, Entry]] = []

    def committed(self) -> None:
        for _per, _group_id, entry in self.touched:
            if entry.owner is self.token:
                entry.owner = None
        self.touched.clear()

    def rolled_back(self) -> None:
        _drop(self.touched)
        self.touched.clear()

    def ended(self) -> None:
        _drop(self.touched)  # neither committed nor rolled back (e.g. closed): never trust it


_lock = threading.Lock()
_caches: weakref.WeakKeyDictionary[Engine, dict[int, Entry]] = weakref.WeakKeyDictionary()
_stats: Counter[str] = Counter()


def _tx(db: Session) -> _Tx:
    return unitofwork.participant(db, _INFO_KEY, _Tx)


def _per_engine(db: Session) -> dict[int, Entry]:
    engine = _engine(db)
    with _lock:
        per = _caches.get(engine)
        if per is None:
            per = _caches[engine] = {}
        return per


# ---------------------------------------------------------------- the cache


_LOCK_STATEMENTS: dict[tuple[str, ...], Prepared] = {}


def _lock_statement(counters: tuple[str, ...]) -> Prepared:
    """``UPDATE resource_groups SET alloc_version = alloc_version + 1 WHERE id = :group_id
    RETURNING alloc_version, (counter)...``, compiled once per tuple of counter names: a decision
    runs it every time, and building it costs far more than running it."""
    stmt = _LOCK_STATEMENTS.get(counters)
    if stmt is None:
        groups = cast(Table, ResourceGroup.__table__)
        stmt = _LOCK_STATEMENTS[counters] = Prepared(
            update(groups)
            .where(groups.c.id == bindparam("group_id"))
            .values(alloc_version=groups.c.alloc_version + 1)
            .returning(groups.c.alloc_version, *(versions.subquery(name) for name in counters))
        )
    return stmt


def lock_for_decision(db: Session, group_id: int, *counters: str) -> tuple[Entry, int, tuple[int, ...]]:
    """Take the group's lock and its placement state in one statement: bump its alloc_version.

    Returns the entry valid before the bump (cached, or built now and cached: the transaction has
    changed nothing yet, so what it reads is what is committed), the new version, and the state
    version ``counters`` (:mod:`labfleet.core.versions` names) read in the same statement.  The
    entry is not claimed: call :func:`settle` before changing it or before commit, so that it
    carries the new version; a rollback without it leaves the entry valid (the version it carries
    is the committed one).
    """
    stmt = _lock_statement(counters)
    row = stmt.execute(db.connection(), {"group_id": group_id}).one()
    new = int(row[0])
    allocversions.note_bumped(db, group_id)
    entry = lookup(db, group_id, new - 1)
    if entry is None:
        entry = build(db, group_id, new - 1)
        per = _per_engine(db)  # takes _lock itself: it is not reentrant
        with _lock:
            per[group_id] = entry
            _stats["rebuilds"] += 1
    else:
        _stats["hits"] += 1
    return entry, new, tuple(int(row[i] or 0) for i in range(1, len(row)))


def settle(db: Session, group_id: int, entry: Entry, new: int) -> None:
    """This transaction keeps its bump of the group: ``entry`` (changed or not) is its state at ``new``."""
    claim(db, group_id, entry)
    entry.version = new


# The nodes a placement sees: ALIVE and not drained. A LOST or drained node keeps its sessions (their
# release finds no cached node and leaves the rebuild to the next decision); marking one (a Node row
# through the ORM) bumps its group, so no cached cluster outlives the change.
_PLACEABLE = (Node.status == "ALIVE", Node.schedulable.is_(True))
_RESTING = (Node.status.in_(("ALIVE", "LOST")), ~and_(*_PLACEABLE))


def _resting_nodes(db: Session, group_id: int) -> tuple[PNode, ...]:
    """The group's drained and LOST nodes as empty shapes (for :meth:`Entry.empty` only)."""
    rows = db.execute(
        select(Node.id, Node.name, Node.cpu, Node.mem, Node.labels).where(
            Node.resource_group_id == group_id, *_RESTING
        )
    ).all()
    if not rows:
        return ()
    devs: dict[int, list[PDevice]] = defaultdict(list)
    for node_id, uuid_, model, memory in db.execute(
        select(Device.node_id, Device.uuid, Device.model, Device.memory_bytes)
        .where(Device.node_id.in_([r[0] for r in rows]))
        .order_by(Device.node_id, Device.index, Device.id)
    ):
        devs[node_id].append(PDevice(id=uuid_, index=len(devs[node_id]), model=model, memory=memory))
    return tuple(
        PNode(name=name, cpu=Decimal(cpu), mem=mem, devices=devs[node_id], labels=dict(labels or {}))
        for node_id, name, cpu, mem, labels in rows
    )


def build(db: Session, group_id: int, version: int) -> Entry:
    """The group's ALIVE, schedulable nodes with what their allocations hold, read from the DB."""
    node_rows = db.execute(
        select(Node.id, Node.name, Node.cpu, Node.mem, Node.labels).where(
            Node.resource_group_id == group_id, *_PLACEABLE
        )
    ).all()
    dev_rows = db.execute(
        select(Device.id, Device.node_id, Device.uuid, Device.index, Device.model, Device.memory_bytes)
        .join(Node, Device.node_id == Node.id)
        .where(Node.resource_group_id == group_id, *_PLACEABLE)
        .order_by(Device.node_id, Device.index, Device.id)
    ).all()
    held_cpu: dict[int, int] = defaultdict(int)
    held_mem: dict[int, int] = defaultdict(int)
    held_dev: dict[int, int] = defaultdict(int)
    alloc_rows = db.execute(
        select(
            Allocation.node_id,
            Allocation.device_id,
            Allocation.cpu_milli,
            Allocation.mem,
            Allocation.shares_centi,
        )
        .join(Node, Allocation.node_id == Node.id)
        .where(Node.resource_group_id == group_id, *_PLACEABLE)
    ).all()
    for node_id, device_id, cpu_milli, mem, centi in alloc_rows:
        held_cpu[node_id] += cpu_milli
        held_mem[node_id] += mem
        if device_id is not None:
            held_dev[device_id] += centi
    devs_of: dict[int, list[PDevice]] = defaultdict(list)
    devices: dict[str, DeviceRef] = {}
    for dev_id, node_id, dev_uuid, index, model, memory in dev_rows:
        position = len(devs_of[node_id])  # position, not NVML index: MIG instances share theirs
        devs_of[node_id].append(
            PDevice(
                id=dev_uuid,
                index=position,
                model=model,
                memory=memory,
                allocated=Decimal(held_dev[dev_id]) / 100,
            )
        )
        devices[dev_uuid] = DeviceRef(id=dev_id, node_id=node_id, index=index, model=model)
    pnodes = [
        PNode(
            name=name,
            cpu=Decimal(cpu),
            mem=mem,
            devices=devs_of[node_id],
            cpu_allocated=Decimal(held_cpu[node_id]) / 1000,
            mem_allocated=held_mem[node_id],
            labels=dict(labels or {}),
        )
        for node_id, name, cpu, mem, labels in node_rows
    ]
    return Entry(
        version=version,
        cluster=Cluster(pnodes),
        devices=devices,
        nodes={name: node_id for node_id, name, *_ in node_rows},
        resting=_resting_nodes(db, group_id),
    )


def get(db: Session, group_id: int) -> Entry:
    """The group's placement state as of the DB's alloc_version; call it holding the group lock.

    The cached entry when its version matches and no other transaction owns it, else a rebuilt one.
    """
    current = allocversions.version(db, group_id)
    tx = _tx(db)
    per = _per_engine(db)
    with _lock:
        entry = per.get(group_id)
        if entry is not None and entry.version == current and entry.owner in (None, tx.token):
            _stats["hits"] += 1
            return entry
    entry = build(db, group_id, current)
    if allocversions.bumped_here(db, group_id):
        # It saw this transaction's own uncommitted changes: not to be trusted before commit.
        entry.owner = tx.token
        tx.touched.append((per, group_id, entry))
    with _lock:
        per[group_id] = entry
        _stats["rebuilds"] += 1
    return entry


def lookup(db: Session, group_id: int, current: int) -> Entry | None:
    """The cached entry if it is valid at version ``current`` for this transaction, else None."""
    per = _per_engine(db)  # takes _lock itself: it is not reentrant
    with _lock:
        entry = per.get(group_id)
    if entry is not None and entry.version == current and entry.owner in (None, _tx(db).token):
        return entry
    return None


def claim(db: Session, group_id: int, entry: Entry) -> None:
    """This transaction is about to change ``entry``: others must not use it before the commit."""
    tx = _tx(db)
    if entry.owner is not tx.token:
        entry.owner = tx.token
        tx.touched.append((_per_engine(db), group_id, entry))


def peek(engine: Engine, group_id: int) -> Entry | None:
    """The cached entry, whatever its state (for tests and benchmarks)."""
    with _lock:
        return (_caches.get(engine) or {}).get(group_id)


def stats() -> dict[str, int]:
    """Cache hits and rebuilds of decisions, and entries dropped by rollbacks, in this process."""
    return {k: _stats[k] for k in ("hits", "rebuilds", "dropped")}


def reset_stats() -> None:
    _stats.clear()


def _drop(touched: Iterable[tuple[dict[int, Entry], int, Entry]]) -> None:
    with _lock:
        for per, group_id, entry in touched:
            if per.get(group_id) is entry:
                del per[group_id]
                _stats["dropped"] += 1
