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
    expected GPU fragmentation w.r.t. a target :class:`~hub_ext.compute.scheduler.fragmentation.Workload`
    grows the least.  See :mod:`hub_ext.compute.scheduler.fragmentation`.

A request for ``gpu.shares`` <= 1 is placed on a single device, never split.  Whole devices go
only on devices with nothing allocated, and take all of their share; on a node that mixes GPU
models they are taken model by model (in the order the cluster first saw the models), then by
index.

Speed: nodes in the same free state (free CPU, memory and the multiset of device states) form
one group that is scored once, and per-state results are memoised, so a decision over a
thousand nodes takes well under a millisecond.  A :class:`Cluster` is not thread-safe: use one
per thread, or a lock.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from hub_ext.compute.scheduler.fragmentation import (
    CPU_UNITS,
    FREE_MASK,
    MODEL_SHIFT,
    SHARE_UNITS,
    FragEvaluator,
    Workload,
)
from hub_ext.core.slots import SlotError, base_slot, parse_amount

POLICIES: tuple[str, ...] = ("whole-gpu", "spread", "pack", "fgd")

# Memo entries kept before a cache is dropped and rebuilt; a long-lived Cluster stays bounded.
_CACHE_LIMIT = 1_000_000

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

    __slots__ = ("cpu_free", "mem_free", "did", "dset", "total", "names", "_min", "fb", "fev")

    def __init__(self, cpu_free: int, mem_free: int, did: int, dset: tuple[int, ...]) -> None:
        self.cpu_free = cpu_free
        self.mem_free = mem_free
        self.did = did
        self.dset = dset
        self.total = sum(c & FREE_MASK for c in dset)  # free hundredths over all devices
        self.names: set[str] = set()
        self._min: str | None = None
        self.fb = 0  # fragmentation before placement, valid for evaluator ``fev``
        self.fev: FragEvaluator | None = None

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
        self._ev: FragEvaluator | None = None
        self._ev_workload: Workload | None = None  # held, not id()'d: ids are reused after GC
        self._ev_key: tuple[int, int] = (-1, -1)
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

    def _regroup(self, st: _NodeState) -> None:
        self._leave(st)
        dset = tuple(sorted(st.codes))
        did = self._intern(dset)
        st.sig = (st.cpu_free, st.mem_free, did)
        g = self._groups.get(st.sig)
        if g is None:
            g = self._groups[st.sig] = _Group(st.cpu_free, st.mem_free, did, dset)
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

    def _evaluator(self, workload: Workload) -> FragEvaluator:
        key = (workload.version, len(self._model_id))
        if (
            self._ev is None
            or self._ev_workload is not workload
            or self._ev_key != key
            or self._ev.memo_size() > _CACHE_LIMIT
        ):
            self._ev = FragEvaluator(workload, self._model_id)
            self._ev_workload = workload
            self._ev_key = key
        return self._ev

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
        best_codes: list[Any] = []

        if policy == "fgd":
            wl = workload if workload else Workload.from_requests([request])
            ev = self._evaluator(wl)
            cpu_thr, mem_thr = ev.cpu_thr, ev.mem_thr
            dsets = self._dsets
            frag = ev.frag_bucketed
            best_d = 0
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
                if g.fev is not ev:
                    g.fb = ev.frag(g.did, g.dset, g.cpu_free, g.mem_free)
                    g.fev = ev
                cb = bisect_right(cpu_thr, cf)
                mb = bisect_right(mem_thr, mf)
                fb = g.fb
                for codes, _after, did2 in cands:
                    d = frag(did2, dsets[did2], cb, mb) - fb
                    if best_group is None or d < best_d:
                        best_d, best_group, best_codes = d, g, [codes]
                    elif d == best_d:
                        if g is best_group:
                            best_codes.append(codes)
                        elif g.min_name < best_group.min_name:
                            best_group, best_codes = g, [codes]
        else:
            # pack (and whole-gpu) minimise, spread maximises: (free GPU left on the node, free
            # shares left on the device, free CPU, free memory).
            sign = -1 if policy == "spread" else 1
            best_key: tuple[int, int, int, int] = (0, 0, 0, 0)
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
                        best_key, best_group, best_codes = key, g, [codes]
                    elif key == best_key:
                        if g is best_group:
                            best_codes.append(codes)
                        elif g.min_name < best_group.min_name:
                            best_group, best_codes = g, [codes]

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
        self, st: _NodeState, best_codes: list[Any], whole: int, taken_shares: Decimal
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
