"""Pure GPU placement: choose a node and devices for a request.

No I/O, no database.  The DB-backed scheduler loads its nodes into a :class:`Cluster` (from
:class:`Node` objects or plain dicts, see :meth:`Node.from_dict`), calls :func:`place` to pick a
:class:`Placement`, records it, and calls :func:`apply` (or :func:`release` when the task ends).

- :func:`place` never changes the cluster's state (only internal memo caches).
- :func:`apply` and :func:`release` change it, and are exact inverses: amounts are
  :class:`~decimal.Decimal` in the public structures (0.1 + 0.2 shares == 0.3 shares) and exact
  integers inside (millicores, bytes, hundredths of a device).
- Every decision is deterministic: ties go to the smallest node name, then the smallest device
  index.

Policies (:data:`POLICIES`):

``whole-gpu``
    A fractional request takes a whole free device (rounded up); nodes chosen as in ``pack``.
``spread``
    The node that keeps the most free GPU shares after placement (then CPU, then memory), and
    within it the device with the most free shares: least loaded first.
``pack``
    Best fit: the node that keeps the least free GPU shares after placement (then CPU, then
    memory), and within it the fullest device that still fits.
``fgd``
    Fragmentation gradient descent (Weng et al., USENIX ATC 2023): the node and device whose
    expected GPU fragmentation w.r.t. a target :class:`~labfleet.compute.scheduler.fragmentation.Workload`
    grows the least.  See :mod:`labfleet.compute.scheduler.fragmentation`.

A request for ``gpu.shares`` <= 1 is placed on a single device, never split.  Whole devices go
only on devices with nothing allocated, and take all of their share; on a node that mixes GPU
models they are taken model by model (in the order the cluster first saw the models), then by
index.

Speed: nodes in the same free state (free CPU, memory and the multiset of device states) form
one group that is scored once, and per-state results are memoised, so a decision over a
thousand nodes takes well under a millisecond.  For ``fgd`` a cluster keeps one fragmentation
evaluator per workload (keyed by the workload's content, :meth:`Workload.key`, so that requests
of different shapes that alternate each find theirs), and each group keeps its score per query
(evaluator and request): a group's state never changes (a node whose state changes moves to
another group), so its score stays true for as long as the group lives.  Each query also keeps
a heap of (score, smallest node name) over the groups; a decision pushes only the groups born
or whose smallest name changed since the query was last asked (the cluster logs both), and pops
entries that no longer hold (a dead group, an old name) off the top.  A query that was last
asked longer ago than that is worth is ranked again from every group.  These memos change no
decision: a cluster used for a long time picks exactly what a fresh one picks.  A
:class:`Cluster` is not thread-safe: use one per thread, or a lock.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from heapq import heapify, heappop, heappush
from typing import Any

from labfleet.compute.scheduler.fragmentation import (
    CPU_UNITS,
    FREE_MASK,
    MODEL_SHIFT,
    SHARE_UNITS,
    FragEvaluator,
    Workload,
)
from labfleet.core.slots import SlotError, base_slot, parse_amount

POLICIES: tuple[str, ...] = ("whole-gpu", "spread", "pack", "fgd")

# Memo entries kept before a cache is dropped and rebuilt; a long-lived Cluster stays bounded.
_CACHE_LIMIT = 1_000_000
# fgd: evaluators kept (the least recently used dropped first), and distinct queries (evaluator,
# GPU part, CPU, memory) whose per-group scores are kept before they are all dropped.
_EVALUATOR_LIMIT = 256
_QUERY_LIMIT = 512
# How often (in fgd decisions) the evaluators' memos are added up against _CACHE_LIMIT.
_MEMO_CHECK_EVERY = 1024
_MISS: Any = object()

_ONE = Decimal(1)
_ZERO = Decimal(0)


class PlacementError(ValueError):
    """A placement that cannot be applied or released on this cluster state."""


def _cpu(value: Any, what: str) -> Decimal:
    try:
        return parse_amount("cpu", value)
    except SlotError as e:
        raise ValueError(f"{what}: {e}") from None


def _mem(value: Any, what: str) -> int:
    try:
        return int(parse_amount("mem", value))
    except SlotError as e:
        raise ValueError(f"{what}: {e}") from None


def _fmt(amount: Decimal) -> str:
    """Canonical text of an exact amount: "0.5", "2", never "0.50" or "1E+2"."""
    if amount == amount.to_integral_value():
        return str(int(amount))
    return str(amount.normalize())


def _shares(value: Any, what: str) -> Decimal:
    try:
        return parse_amount("gpu.shares", value)
    except SlotError as e:
        raise ValueError(f"{what}: {e}") from None


# --------------------------------------------------------------------------------------------
# Public data model
# --------------------------------------------------------------------------------------------


@dataclass
class Device:
    """One GPU: ``allocated`` shares in use, 0..1 (1 = the whole device)."""

    id: str
    index: int
    model: str
    memory: int = 0  # bytes of device memory; informative, placement does not use it
    allocated: Decimal = _ZERO

    def __post_init__(self) -> None:
        self.allocated = _shares(self.allocated, f"device {self.id} allocated")
        if self.allocated > 1:
            raise ValueError(f"device {self.id}: allocated {self.allocated} shares, more than 1")
        if not isinstance(self.index, int) or self.index < 0:
            raise ValueError(f"device {self.id}: index must be a non-negative int, not {self.index!r}")

    @property
    def free(self) -> Decimal:
        return _ONE - self.allocated

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Device:
        """From ``{"id", "index", "model", "memory"?, "allocated"?}``; numbers may be strings."""
        return cls(
            id=str(data["id"]),
            index=int(data["index"]),
            model=str(data["model"]),
            memory=_mem(data.get("memory", 0), f"device {data['id']} memory"),
            allocated=data.get("allocated", 0),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "index": self.index,
            "model": self.model,
            "memory": self.memory,
            "allocated": _fmt(self.allocated),
        }


@dataclass
class Node:
    """A host: capacities, what is allocated, its GPUs (kept sorted by index) and labels."""

    name: str
    cpu: Decimal
    mem: int
    devices: list[Device] = field(default_factory=list)
    cpu_allocated: Decimal = _ZERO
    mem_allocated: int = 0
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.cpu = _cpu(self.cpu, f"node {self.name} cpu")
        self.mem = _mem(self.mem, f"node {self.name} mem")
        self.cpu_allocated = _cpu(self.cpu_allocated, f"node {self.name} cpu_allocated")
        self.mem_allocated = _mem(self.mem_allocated, f"node {self.name} mem_allocated")
        if self.cpu_allocated > self.cpu or self.mem_allocated > self.mem:
            raise ValueError(f"node {self.name}: more CPU or memory allocated than it has")
        self.devices = sorted(self.devices, key=lambda d: d.index)
        if len({d.index for d in self.devices}) != len(self.devices):
            raise ValueError(f"node {self.name}: two devices share an index")
        if len({d.id for d in self.devices}) != len(self.devices):
            raise ValueError(f"node {self.name}: two devices share an id")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Node:
        """From plain data, e.g. a DB row::

        {"name": "gpu-01", "cpu": 64, "mem": "256g", "cpu_allocated": "3.5", "mem_allocated": 0,
         "labels": {...}, "devices": [{"id": UUID, "index": 0, "model": "A100", "allocated": "0.5"}]}
        """
        return cls(
            name=str(data["name"]),
            cpu=data["cpu"],
            mem=data["mem"],
            devices=[d if isinstance(d, Device) else Device.from_dict(d) for d in data.get("devices", ())],
            cpu_allocated=data.get("cpu_allocated", 0),
            mem_allocated=data.get("mem_allocated", 0),
            labels=dict(data.get("labels") or {}),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "cpu": _fmt(self.cpu),
            "mem": self.mem,
            "cpu_allocated": _fmt(self.cpu_allocated),
            "mem_allocated": self.mem_allocated,
            "labels": dict(self.labels),
            "devices": [d.to_dict() for d in self.devices],
        }


@dataclass(frozen=True)
class Request:
    """What one task asks for.

    ``gpu`` whole devices, or ``shares`` of ONE device (a fraction, never split across devices),
    not both.  ``shares`` > 1 must be a whole number and then means that many whole devices.
    ``models``: accepted GPU models (empty: any).
    """

    cpu: Decimal = _ZERO
    mem: int = 0
    gpu: int = 0
    shares: Decimal = _ZERO
    models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        cpu = _cpu(self.cpu, "request cpu")
        mem = _mem(self.mem, "request mem")
        if isinstance(self.gpu, bool) or int(self.gpu) != self.gpu or self.gpu < 0:
            raise ValueError(f"request gpu: {self.gpu!r} is not a whole number of devices >= 0")
        gpu = int(self.gpu)
        shares = _shares(self.shares, "request gpu.shares")
        if gpu and shares:
            raise ValueError("a request asks either whole devices (gpu) or a fraction (gpu.shares), not both")
        if shares >= 1:
            if shares != shares.to_integral_value():
                raise ValueError(
                    f"gpu.shares={shares} spans more than one device but is not a whole number: "
                    "a fraction must fit on one device (<= 1); ask whole devices for more"
                )
            gpu, shares = int(shares), _ZERO
        models = (self.models,) if isinstance(self.models, str) else self.models
        object.__setattr__(self, "cpu", cpu)
        object.__setattr__(self, "mem", mem)
        object.__setattr__(self, "gpu", gpu)
        object.__setattr__(self, "shares", shares)
        object.__setattr__(self, "models", tuple(sorted(set(models))))

    @classmethod
    def from_slots(cls, slots: Mapping[str, Any], models: Iterable[str] = ()) -> Request:
        """From resource slots (``cpu``, ``mem``, ``gpu``, ``gpu.shares``).

        A per-model slot (``gpu:A100`` or ``gpu.shares:A100``) restricts the request to that model;
        at most one model may be named that way.
        """
        amounts: dict[str, Decimal] = {}
        model_set = set(models)
        named: set[str] = set()
        for name, value in slots.items():
            base = base_slot(name)
            amount = parse_amount(name, value)
            if ":" in name and base in ("gpu", "gpu.shares"):
                named.add(name.split(":", 1)[1])
            amounts[base] = amounts.get(base, _ZERO) + amount
        if len(named) > 1:
            raise ValueError(f"a request can name at most one GPU model slot, got {sorted(named)}")
        model_set |= named
        gpu = amounts.get("gpu", _ZERO)
        if gpu != gpu.to_integral_value():
            raise ValueError(f"gpu={gpu}: whole devices only; use gpu.shares for a fraction")
        return cls(
            cpu=amounts.get("cpu", _ZERO),
            mem=int(amounts.get("mem", _ZERO)),
            gpu=int(gpu),
            shares=amounts.get("gpu.shares", _ZERO),
            models=tuple(model_set),
        )


@dataclass(frozen=True)
class Placement:
    """Where a request goes: a node, the (device id, shares taken) pairs, CPU and memory."""

    node: str
    devices: tuple[tuple[str, Decimal], ...]
    cpu: Decimal
    mem: int

    @property
    def gpu_shares(self) -> Decimal:
        """Shares taken over all devices (whole devices count 1 each)."""
        return sum((s for _, s in self.devices), _ZERO)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "devices": [{"id": i, "shares": _fmt(s)} for i, s in self.devices],
            "cpu": _fmt(self.cpu),
            "mem": self.mem,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Placement:
        return cls(
            node=str(data["node"]),
            devices=tuple((str(d["id"]), _shares(d["shares"], "placement shares")) for d in data["devices"]),
            cpu=_cpu(data["cpu"], "placement cpu"),
            mem=_mem(data["mem"], "placement mem"),
        )


# --------------------------------------------------------------------------------------------
# In-memory state with indices
# --------------------------------------------------------------------------------------------


class _NodeState:
    """Integer mirror of one node, kept in sync by Cluster.apply/release."""

    __slots__ = ("node", "pos_by_id", "codes", "cpu_free", "mem_free", "sig")

    def __init__(self, node: Node, model_id: Mapping[str, int]) -> None:
        self.node = node
        self.pos_by_id = {d.id: i for i, d in enumerate(node.devices)}
        self.codes = [(model_id[d.model] << MODEL_SHIFT) | int(d.free * SHARE_UNITS) for d in node.devices]
        self.cpu_free = int((node.cpu - node.cpu_allocated) * CPU_UNITS)
        self.mem_free = node.mem - node.mem_allocated
        self.sig: tuple[int, int, int] = (0, 0, -1)


class _Group:
    """Nodes in the same free state: they score the same, so each state is scored once."""

    __slots__ = ("cpu_free", "mem_free", "did", "dset", "total", "names", "_min", "memo", "serial", "alive")

    def __init__(self, cpu_free: int, mem_free: int, did: int, dset: tuple[int, ...]) -> None:
        self.cpu_free = cpu_free
        self.mem_free = mem_free
        self.did = did
        self.dset = dset
        self.total = sum(c & FREE_MASK for c in dset)  # free hundredths over all devices
        self.names: set[str] = set()
        self._min: str | None = None
        # fgd: query id -> (least growth of fragmentation, the device codes that reach it), or
        # None where the query's request does not fit.  True for ever: the state is fixed.
        self.memo: dict[int, tuple[int, tuple[Any, ...]] | None] = {}
        self.serial = 0  # order of birth in its cluster; never reused
        self.alive = True  # False once its last node has left (the same state again is a new group)

    @property
    def min_name(self) -> str:
        if self._min is None:
            self._min = min(self.names)
        return self._min

    def add(self, name: str) -> None:
        self.names.add(name)
        if self._min is not None and name < self._min:
            self._min = name

    def discard(self, name: str) -> None:
        self.names.discard(name)
        if name == self._min:
            self._min = None


class _Query:
    """fgd, one (evaluator, request): a heap of (growth of fragmentation, smallest node name,
    group serial), and how far it has read the cluster's births and its log of groups whose names
    changed.  An entry holds while its group lives and its smallest name is the one in the entry;
    the others are popped when they reach the top.  Entries hold no object (the group is found
    by its serial, its device codes in its memo), so the garbage collector need not walk them."""

    __slots__ = ("qid", "heap", "births", "log", "built")

    def __init__(self, qid: int) -> None:
        self.qid = qid  # the key of this query in the groups' memos
        self.heap: list[tuple[int, str, int]] = []
        self.births = 0
        self.log = 0
        self.built = False


class Cluster:
    """Mutable in-memory cluster state: the nodes plus indices that make :func:`place` fast.

    Change it only through :func:`apply` / :func:`release` (or :meth:`add_node`,
    :meth:`remove_node`, :meth:`refresh` after editing a :class:`Node` directly), so the indices
    stay in sync with the public ``nodes``.
    """

    def __init__(self, nodes: Iterable[Node | Mapping[str, Any]] = ()) -> None:
        self.nodes: dict[str, Node] = {}
        self._states: dict[str, _NodeState] = {}
        self._groups: dict[tuple[int, int, int], _Group] = {}
        self._model_id: dict[str, int] = {}
        self._dset_id: dict[tuple[int, ...], int] = {}
        self._dsets: list[tuple[int, ...]] = []
        self._gpart_id: dict[tuple[int, int, frozenset[int] | None], int] = {}
        self._cands: dict[tuple[int, int], tuple[tuple[Any, int, int], ...]] = {}
        # fgd: (workload content, number of models) -> (evaluator, its serial), least recently used
        # first.  Serials and query ids are never reused: a group's memo entry cannot outlive
        # what it was computed with.
        self._evs: OrderedDict[tuple[frozenset[Any], int], tuple[FragEvaluator, int]] = OrderedDict()
        self._ev_serial = 0
        self._queries: dict[tuple[int, int, int, int], _Query] = {}
        self._query_serial = 0
        self._fgd_calls = 0
        self._group_serial = 0
        self._born: dict[int, _Group] = {}  # serial -> group, live groups only
        # Live groups whose set of names changed (so perhaps their smallest name), in order; the
        # position of entry i is _log_base + i.  Emptied now and then (a query that lagged behind
        # the emptying is ranked again from every group).
        self._log: list[_Group] = []
        self._log_base = 0
        for n in nodes:
            self.add_node(n if isinstance(n, Node) else Node.from_dict(n))

    @classmethod
    def from_dicts(cls, data: Iterable[Mapping[str, Any]]) -> Cluster:
        """From plain node dicts (see :meth:`Node.from_dict`)."""
        return cls(Node.from_dict(d) for d in data)

    def to_dicts(self) -> list[dict[str, Any]]:
        return [self.nodes[n].to_dict() for n in sorted(self.nodes)]

    def copy(self) -> Cluster:
        """An independent copy (the public nodes are copied too)."""
        return Cluster.from_dicts(self.to_dicts())

    # -- maintenance ------------------------------------------------------------------------

    def add_node(self, node: Node) -> None:
        if node.name in self.nodes:
            raise ValueError(f"node {node.name!r} is already in the cluster")
        for d in node.devices:
            if d.model not in self._model_id:
                self._model_id[d.model] = len(self._model_id)
        self.nodes[node.name] = node
        st = _NodeState(node, self._model_id)
        self._states[node.name] = st
        self._regroup(st)

    def remove_node(self, name: str) -> Node:
        st = self._states.pop(name)
        self._leave(st)
        return self.nodes.pop(name)

    def refresh(self, name: str) -> None:
        """Re-read node ``name`` after its :class:`Node` was edited directly."""
        node = self.remove_node(name)
        node.__post_init__()
        self.add_node(node)

    def _intern(self, dset: tuple[int, ...]) -> int:
        did = self._dset_id.get(dset)
        if did is None:
            did = len(self._dsets)
            self._dset_id[dset] = did
            self._dsets.append(dset)
        return did

    def _leave(self, st: _NodeState) -> None:
        g = self._groups.get(st.sig)
        if g is not None:
            g.discard(st.node.name)
            if not g.names:
                del self._groups[st.sig]
                del self._born[g.serial]
                g.alive = False
            else:
                self._log_change(g)

    def _log_change(self, g: _Group) -> None:
        self._log.append(g)
        if len(self._log) > 4 * len(self._groups) + 1024:
            self._log_base += len(self._log)
            self._log.clear()

    def _regroup(self, st: _NodeState) -> None:
        self._leave(st)
        dset = tuple(sorted(st.codes))
        did = self._intern(dset)
        st.sig = (st.cpu_free, st.mem_free, did)
        g = self._groups.get(st.sig)
        if g is None:
            g = self._groups[st.sig] = _Group(st.cpu_free, st.mem_free, did, dset)
            self._group_serial += 1
            g.serial = self._group_serial
            self._born[g.serial] = g
        else:
            self._log_change(g)
        g.add(st.node.name)

    # -- apply / release -------------------------------------------------------------------

    def _check(self, placement: Placement, sign: int) -> tuple[_NodeState, list[tuple[int, int]]]:
        st = self._states.get(placement.node)
        if st is None:
            raise PlacementError(f"no node {placement.node!r} in this cluster")
        node = st.node
        verb = "apply" if sign > 0 else "release"
        if placement.cpu < 0 or placement.mem < 0:
            raise PlacementError("negative CPU or memory in a placement")
        if sign > 0 and (
            node.cpu_allocated + placement.cpu > node.cpu or node.mem_allocated + placement.mem > node.mem
        ):
            raise PlacementError(f"cannot {verb}: node {node.name} has not that much CPU or memory free")
        if sign < 0 and (placement.cpu > node.cpu_allocated or placement.mem > node.mem_allocated):
            raise PlacementError(f"cannot {verb}: node {node.name} has not that much CPU or memory allocated")
        moves: list[tuple[int, int]] = []
        seen: set[str] = set()
        for dev_id, shares in placement.devices:
            pos = st.pos_by_id.get(dev_id)
            if pos is None:
                raise PlacementError(f"node {node.name} has no device {dev_id}")
            if dev_id in seen:
                raise PlacementError(f"device {dev_id} appears twice in one placement")
            seen.add(dev_id)
            dev = node.devices[pos]
            if shares <= 0 or shares > 1:
                raise PlacementError(f"device {dev_id}: {shares} shares is not in (0, 1]")
            if sign > 0 and dev.allocated + shares > 1:
                raise PlacementError(f"cannot {verb}: device {dev_id} has only {dev.free} shares free")
            if sign < 0 and shares > dev.allocated:
                raise PlacementError(
                    f"cannot {verb}: device {dev_id} has only {dev.allocated} shares allocated"
                )
            hundredths = shares * SHARE_UNITS
            if hundredths != hundredths.to_integral_value():
                raise PlacementError(f"device {dev_id}: {shares} shares is not a multiple of 0.01")
            moves.append((pos, int(hundredths)))
        return st, moves

    def apply(self, placement: Placement) -> None:
        """Take what ``placement`` names; raises :class:`PlacementError` (changing nothing) if it does not fit."""
        st, moves = self._check(placement, +1)
        node = st.node
        node.cpu_allocated += placement.cpu
        node.mem_allocated += placement.mem
        st.cpu_free -= int(placement.cpu * CPU_UNITS)
        st.mem_free -= placement.mem
        for (pos, h), (_, shares) in zip(moves, placement.devices, strict=True):
            node.devices[pos].allocated += shares
            st.codes[pos] -= h
        self._regroup(st)

    def release(self, placement: Placement) -> None:
        """Give back what :meth:`apply` took for ``placement``: its exact inverse."""
        st, moves = self._check(placement, -1)
        node = st.node
        node.cpu_allocated -= placement.cpu
        node.mem_allocated -= placement.mem
        st.cpu_free += int(placement.cpu * CPU_UNITS)
        st.mem_free += placement.mem
        for (pos, h), (_, shares) in zip(moves, placement.devices, strict=True):
            node.devices[pos].allocated -= shares
            st.codes[pos] += h
        self._regroup(st)

    # -- placement --------------------------------------------------------------------------

    def _evaluator(self, workload: Workload) -> tuple[FragEvaluator, int]:
        """The evaluator of ``workload`` (by content) for this cluster's model table, and its serial.

        A model the cluster first sees later changes what a shape's models map to, so the number
        of models is part of the key (model ids are only ever added, never reassigned)."""
        self._fgd_calls += 1
        if self._fgd_calls % _MEMO_CHECK_EVERY == 0 and (
            sum(ev.memo_size() for ev, _ in self._evs.values()) > _CACHE_LIMIT
        ):
            self._drop_fgd_memos()
        key = (workload.key(), len(self._model_id))
        got = self._evs.get(key)
        if got is None or got[0].memo_size() > _CACHE_LIMIT:
            self._ev_serial += 1
            got = self._evs[key] = (FragEvaluator(workload, self._model_id), self._ev_serial)
            if len(self._evs) > _EVALUATOR_LIMIT:
                self._evs.popitem(last=False)
        else:
            self._evs.move_to_end(key)
        return got

    def _drop_fgd_memos(self) -> None:
        """Forget every evaluator and per-group score (memory only: no decision changes)."""
        self._evs.clear()
        self._queries.clear()
        for g in self._groups.values():
            g.memo.clear()

    def _query(self, serial: int, gid: int, rc: int, rm: int) -> _Query:
        """A query: an evaluator (by serial), a GPU part, the CPU and memory asked."""
        key = (serial, gid, rc, rm)
        q = self._queries.get(key)
        if q is None:
            if len(self._queries) >= _QUERY_LIMIT:
                self._queries.clear()
                for g in self._groups.values():
                    g.memo.clear()
            self._query_serial += 1
            q = self._queries[key] = _Query(self._query_serial)
        return q

    def _fgd_best(
        self,
        q: _Query,
        ev: FragEvaluator,
        gid: int,
        gkey: tuple[int, int, frozenset[int] | None],
        rc: int,
        rm: int,
    ) -> tuple[_Group, tuple[Any, ...]] | None:
        """The live group with the least growth of fragmentation (a tie: the smallest node name)
        and its device codes, from the query's heap brought up to date; None when nothing fits."""
        qid = q.qid
        score = self._fgd_score
        log_end = self._log_base + len(self._log)
        catch_up = (self._group_serial - q.births) + (log_end - q.log)
        live = len(self._groups)
        if not q.built or q.log < self._log_base or catch_up > live or len(q.heap) > 2 * live + 64:
            heap = []
            for g in self._groups.values():
                r = g.memo.get(qid, _MISS)
                if r is _MISS:
                    r = g.memo[qid] = score(g, ev, gid, gkey, rc, rm)
                if r is not None:
                    heap.append((r[0], g.min_name, g.serial))
            heapify(heap)
            q.heap = heap
            q.built = True
        else:
            heap = q.heap
            born = self._born
            changed: list[_Group | None] = [born.get(b) for b in range(q.births + 1, self._group_serial + 1)]
            changed += self._log[q.log - self._log_base :]
            for c in changed:
                if c is None or not c.alive:
                    continue  # born and dead since, or dead since its change
                g = c
                r = g.memo.get(qid, _MISS)
                if r is _MISS:
                    r = g.memo[qid] = score(g, ev, gid, gkey, rc, rm)
                if r is not None:
                    heappush(heap, (r[0], g.min_name, g.serial))
        q.births = self._group_serial
        q.log = log_end
        born = self._born
        while heap:
            _d, name, serial = heap[0]
            top = born.get(serial)
            if top is not None and top.min_name == name:
                r = top.memo[qid]
                assert r is not None
                return top, r[1]
            heappop(heap)  # a dead group, or one whose smallest name changed (it has a newer entry)
        return None

    def _fgd_score(
        self,
        g: _Group,
        ev: FragEvaluator,
        gid: int,
        gkey: tuple[int, int, frozenset[int] | None],
        rc: int,
        rm: int,
    ) -> tuple[int, tuple[Any, ...]] | None:
        """A group's least growth of fragmentation for a request and the device codes that reach
        it (in candidate order), or None where the request does not fit the group's state."""
        cf = g.cpu_free - rc
        mf = g.mem_free - rm
        if cf < 0 or mf < 0:
            return None
        cands = self._cands.get((g.did, gid))
        if cands is None:
            cands = self._candidates(g.did, gid, gkey)
        if not cands:
            return None
        fb = ev.frag(g.did, g.dset, g.cpu_free, g.mem_free)
        cb = bisect_right(ev.cpu_thr, cf)
        mb = bisect_right(ev.mem_thr, mf)
        dsets = self._dsets
        frag = ev.frag_bucketed
        best: int | None = None
        codes: list[Any] = []
        for c, _after, did2 in cands:
            d = frag(did2, dsets[did2], cb, mb) - fb
            if best is None or d < best:
                best, codes = d, [c]
            elif d == best:
                codes.append(c)
        assert best is not None
        return best, tuple(codes)

    def _gpart_key(
        self, whole: int, frac: int, models: tuple[str, ...]
    ) -> tuple[int, int, frozenset[int] | None]:
        # Models the cluster does not have map to nothing: such a request fits nowhere.
        allowed = frozenset(self._model_id[m] for m in models if m in self._model_id) if models else None
        return (whole, frac, allowed)

    def _candidates(
        self, did: int, gid: int, gkey: tuple[int, int, frozenset[int] | None]
    ) -> tuple[tuple[Any, int, int], ...]:
        """The distinct ways a GPU part fits a device state: (codes taken, device free after, new state id)."""
        cands = self._cands.get((did, gid))
        if cands is not None:
            return cands
        dset = self._dsets[did]
        whole, frac, allowed = gkey
        out: list[tuple[Any, int, int]] = []
        if whole:
            # First ``whole`` fully free allowed devices, in code order (by model, then index later).
            taken: list[int] = []
            for code in dset:
                if (code & FREE_MASK) == SHARE_UNITS and (
                    allowed is None or (code >> MODEL_SHIFT) in allowed
                ):
                    taken.append(code)
                    if len(taken) == whole:
                        break
            if len(taken) == whole:
                rest = list(dset)
                for code in taken:
                    rest.remove(code)
                    rest.append(code - SHARE_UNITS)
                out.append((tuple(taken), 0, self._intern(tuple(sorted(rest)))))
        elif frac:
            last = -1
            for i, code in enumerate(dset):
                free = code & FREE_MASK
                if (
                    code == last
                    or free < frac
                    or (allowed is not None and (code >> MODEL_SHIFT) not in allowed)
                ):
                    continue
                last = code
                rest = list(dset)
                rest[i] = code - frac
                out.append((code, free - frac, self._intern(tuple(sorted(rest)))))
        else:
            out.append((None, 0, did))
        cands = tuple(out)
        self._cands[(did, gid)] = cands
        return cands

    def place(
        self, request: Request, policy: str = "pack", workload: Workload | None = None
    ) -> Placement | None:
        """See :func:`place`."""
        if policy not in POLICIES:
            raise ValueError(f"unknown placement policy {policy!r}; choose one of {', '.join(POLICIES)}")
        if len(self._cands) > _CACHE_LIMIT:
            self._cands.clear()
        whole, frac = request.gpu, int(request.shares * SHARE_UNITS)
        taken_shares = request.shares
        if policy == "whole-gpu" and frac:
            whole, frac, taken_shares = 1, 0, _ONE
        gkey = self._gpart_key(whole, frac, request.models if (whole or frac) else ())
        gid = self._gpart_id.get(gkey)
        if gid is None:
            gid = self._gpart_id[gkey] = len(self._gpart_id)
        rc = int(request.cpu * CPU_UNITS)
        rm = request.mem
        need = whole * SHARE_UNITS + frac

        cands_cache = self._cands
        best_group: _Group | None = None
        best_codes: Sequence[Any] = []

        if policy == "fgd":
            wl = workload if workload else Workload.from_requests([request])
            ev, serial = self._evaluator(wl)
            best = self._fgd_best(self._query(serial, gid, rc, rm), ev, gid, gkey, rc, rm)
            if best is not None:
                best_group, best_codes = best
        else:
            # pack (and whole-gpu) minimise, spread maximises: (free GPU left on the node, free
            # shares left on the device, free CPU, free memory).
            sign = -1 if policy == "spread" else 1
            best_key: tuple[int, int, int, int] = (0, 0, 0, 0)
            best_list: list[Any] = []
            for g in self._groups.values():
                cf = g.cpu_free - rc
                if cf < 0:
                    continue
                mf = g.mem_free - rm
                if mf < 0:
                    continue
                cands = cands_cache.get((g.did, gid))
                if cands is None:
                    cands = self._candidates(g.did, gid, gkey)
                if not cands:
                    continue
                total_after = g.total - need
                for codes, after, _did2 in cands:
                    key = (sign * total_after, sign * after, sign * cf, sign * mf)
                    if best_group is None or key < best_key:
                        best_key, best_group, best_list = key, g, [codes]
                    elif key == best_key:
                        if g is best_group:
                            best_list.append(codes)
                        elif g.min_name < best_group.min_name:
                            best_group, best_list = g, [codes]
            best_codes = best_list

        if best_group is None:
            return None
        st = self._states[best_group.min_name]
        return Placement(
            node=st.node.name,
            devices=self._pick_devices(st, best_codes, whole, taken_shares),
            cpu=request.cpu,
            mem=request.mem,
        )

    def _pick_devices(
        self, st: _NodeState, best_codes: Sequence[Any], whole: int, taken_shares: Decimal
    ) -> tuple[tuple[str, Decimal], ...]:
        devs = st.node.devices
        codes = st.codes
        if whole:
            # One candidate for whole devices: map each code to the lowest free index with it.
            used: set[int] = set()
            picked = []
            for code in best_codes[0]:
                pos = next(p for p, c in enumerate(codes) if c == code and p not in used)
                used.add(pos)
                picked.append(pos)
            return tuple((devs[p].id, _ONE) for p in sorted(picked))
        if best_codes[0] is None:
            return ()
        wanted = set(best_codes)
        pos = next(p for p, c in enumerate(codes) if c in wanted)
        return ((devs[pos].id, taken_shares),)


# --------------------------------------------------------------------------------------------
# Functional API
# --------------------------------------------------------------------------------------------


def place(
    request: Request,
    nodes: Cluster | Iterable[Node],
    policy: str = "pack",
    *,
    workload: Workload | None = None,
) -> Placement | None:
    """Choose where ``request`` goes under ``policy``; ``None`` when it fits nowhere.

    ``nodes`` is a :class:`Cluster` (fast: its indices and caches are reused) or any iterable
    of :class:`Node` (a temporary Cluster is built).  ``workload`` is the target workload for
    ``fgd`` (default: the request alone).  Changes no state; deterministic.
    """
    cluster = nodes if isinstance(nodes, Cluster) else Cluster(nodes)
    return cluster.place(request, policy, workload)


def apply(nodes_state: Cluster, placement: Placement) -> None:
    """Allocate ``placement`` on ``nodes_state``; :class:`PlacementError` if it would over-commit."""
    nodes_state.apply(placement)


def release(nodes_state: Cluster, placement: Placement) -> None:
    """Free what :func:`apply` took for ``placement``; the exact inverse of :func:`apply`."""
    nodes_state.release(placement)
