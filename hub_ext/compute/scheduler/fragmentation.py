"""GPU fragmentation of a node with respect to a target workload (for the ``fgd`` policy).

Definition (Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent", USENIX ATC 2023): for one task shape ``m``, the fragment of a
node is the part of its free GPU capacity that ``m`` cannot use:

- all of it when ``m`` cannot run on the node at all (not enough CPU or memory, not enough
  devices with room, no device of an allowed model), and all of it for a task that asks no GPU;
- otherwise the free shares of the devices that ``m`` cannot use: devices whose free shares are
  below what ``m`` needs on one device (1 whole device for a whole-GPU task), or whose model
  ``m`` does not accept.

The node's fragmentation for a workload is the expectation over the workload's shapes,
weighted by how often each shape occurs.  FGD places a task where this expectation grows the
least.

Amounts here are integers: GPU in hundredths of a device (the ``gpu.shares`` quantum), CPU in
millicores, memory in bytes, and weights are counts.  ``F = sum(weight * fragment)`` is thus an
exact integer, so equal states always compare equal and ties break deterministically.

Pure module: no I/O.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from labfleet.compute.scheduler.placement import Node, Request

SHARE_UNITS = 100  # hundredths of a device: the gpu.shares quantum is 0.01
CPU_UNITS = 1000  # millicores: the cpu quantum is 0.001

# A device's state is coded as one int, model id in the high bits, free hundredths in the low
# bits, so that a node's devices sort into a compact, hashable tuple.
MODEL_SHIFT = 10
FREE_MASK = (1 << MODEL_SHIFT) - 1


@dataclass(frozen=True, order=True)
class TaskShape:
    """One task shape of a workload, in integer units.

    ``whole`` whole devices, or ``frac`` hundredths of one device (never both), ``models`` the
    accepted GPU models (empty: any).
    """

    cpu: int  # millicores
    mem: int  # bytes
    whole: int = 0
    frac: int = 0
    models: tuple[str, ...] = ()

    @property
    def needs_gpu(self) -> bool:
        return self.whole > 0 or self.frac > 0


def shape_of(request: Request) -> TaskShape:
    """The workload shape of a placement request (what was asked, never rounded up)."""
    cpu = int(request.cpu * CPU_UNITS)
    if request.gpu:
        return TaskShape(cpu, request.mem, whole=request.gpu, models=request.models)
    if request.shares:
        return TaskShape(cpu, request.mem, frac=int(request.shares * SHARE_UNITS), models=request.models)
    return TaskShape(cpu, request.mem)


class Workload:
    """The target workload: task shapes and how often each occurs.

    Build it up front from a known task mix (:meth:`from_requests`) or grow it online with
    :meth:`observe` as requests arrive.  ``version`` changes on every update so that cached
    fragmentation values are recomputed.
    """

    def __init__(self, counts: Mapping[TaskShape, int] | None = None) -> None:
        self._counts: dict[TaskShape, int] = {}
        self.version = 0
        self._key: frozenset[tuple[TaskShape, int]] | None = None
        self._key_version = -1
        for shape, weight in (counts or {}).items():
            self.add_shape(shape, weight)

    @classmethod
    def from_requests(cls, requests: Iterable[Request]) -> Workload:
        """A workload in which each request counts once."""
        wl = cls()
        for r in requests:
            wl.observe(r)
        return wl

    def observe(self, request: Request, weight: int = 1) -> None:
        """Count one more occurrence of ``request``'s shape."""
        self.add_shape(shape_of(request), weight)

    def add_shape(self, shape: TaskShape, weight: int = 1) -> None:
        if weight <= 0:
            raise ValueError(f"workload weight must be a positive integer, not {weight!r}")
        self._counts[shape] = self._counts.get(shape, 0) + int(weight)
        self.version += 1

    def counts(self) -> dict[TaskShape, int]:
        """TaskShape -> weight, a copy."""
        return dict(self._counts)

    def key(self) -> frozenset[tuple[TaskShape, int]]:
        """What the workload is now, as an immutable value: equal for equal counts, whichever
        object holds them.  Caches of what depends only on the workload (a cluster's evaluators)
        are keyed by it.  Built once per :attr:`version`; a frozenset keeps its hash."""
        if self._key is None or self._key_version != self.version:
            self._key = frozenset(self._counts.items())
            self._key_version = self.version
        return self._key

    def top(self, coverage: float) -> Workload:
        """The most frequent shapes that together make up ``coverage`` (0..1] of the weight.

        Fewer shapes make fragmentation cheaper to compute; the tail rarely changes a decision.
        """
        if not 0 < coverage <= 1:
            raise ValueError("coverage must be in (0, 1]")
        total = sum(self._counts.values())
        out: dict[TaskShape, int] = {}
        acc = 0
        for shape, w in sorted(self._counts.items(), key=lambda kv: (-kv[1], kv[0])):
            if acc >= coverage * total:
                break
            out[shape] = w
            acc += w
        return Workload(out)

    def __len__(self) -> int:
        return len(self._counts)

    def __bool__(self) -> bool:
        return bool(self._counts)


def encode_devices(devices: Iterable[tuple[int, int]]) -> tuple[int, ...]:
    """(model id, free hundredths) pairs -> the sorted code tuple used as a cache key."""
    return tuple(sorted((m << MODEL_SHIFT) | f for m, f in devices))


class FragEvaluator:
    """Memoised node fragmentation for one workload snapshot and one model-id table.

    ``frag(dset_id, dset, cpu_free, mem_free)`` is exact (an int); a node's value depends on its
    free device codes and on which shapes its free CPU and memory can host, so the memo key is
    (device-state id, CPU bucket, memory bucket) and is shared by all nodes in that state.
    """

    def __init__(self, workload: Workload, model_ids: Mapping[str, int]) -> None:
        counts = workload.counts()
        self.total_weight = sum(counts.values())
        gparts: dict[tuple[int, int, frozenset[int] | None], int] = {}
        gpu_shapes = [s for s in sorted(counts) if s.needs_gpu]
        self.cpu_thr: list[int] = sorted({s.cpu for s in gpu_shapes})
        self.mem_thr: list[int] = sorted({s.mem for s in gpu_shapes})
        cpu_rank = {c: i for i, c in enumerate(self.cpu_thr)}
        mem_rank = {m: i for i, m in enumerate(self.mem_thr)}
        # (weight, cpu rank, mem rank, gpu-part index): shapes that differ only in CPU/memory
        # share one GPU part, whose usable capacity is computed once per device state.
        self.shapes: list[tuple[int, int, int, int]] = []
        for s in gpu_shapes:
            allowed = frozenset(model_ids[m] for m in s.models if m in model_ids) if s.models else None
            key = (s.whole, s.frac, allowed)
            gi = gparts.setdefault(key, len(gparts))
            self.shapes.append((counts[s], cpu_rank[s.cpu], mem_rank[s.mem], gi))
        self.gparts: list[tuple[int, int, frozenset[int] | None]] = list(gparts)
        self._usable: dict[int, list[int]] = {}
        self._frag: dict[int, int] = {}

    def memo_size(self) -> int:
        return len(self._frag) + len(self._usable)

    def buckets(self, cpu_free: int, mem_free: int) -> tuple[int, int]:
        """How many distinct shape CPU / memory sizes fit into the free amounts."""
        return bisect_right(self.cpu_thr, cpu_free), bisect_right(self.mem_thr, mem_free)

    def usable(self, dset_id: int, dset: Sequence[int]) -> list[int]:
        """Per GPU part: free hundredths that part could use on a node with these devices."""
        u = self._usable.get(dset_id)
        if u is None:
            u = [_usable(dset, whole, frac, allowed) for whole, frac, allowed in self.gparts]
            self._usable[dset_id] = u
        return u

    def frag(self, dset_id: int, dset: Sequence[int], cpu_free: int, mem_free: int) -> int:
        """Expected fragment of a node, times the workload's total weight, in hundredths."""
        cb, mb = self.buckets(cpu_free, mem_free)
        key = (dset_id << 24) | (cb << 12) | mb
        f = self._frag.get(key)
        if f is None:
            f = self._compute(dset_id, dset, cb, mb)
            self._frag[key] = f
        return f

    def frag_bucketed(self, dset_id: int, dset: Sequence[int], cb: int, mb: int) -> int:
        """:meth:`frag` with the CPU / memory buckets already known (the hot path)."""
        key = (dset_id << 24) | (cb << 12) | mb
        f = self._frag.get(key)
        if f is None:
            f = self._compute(dset_id, dset, cb, mb)
            self._frag[key] = f
        return f

    def _compute(self, dset_id: int, dset: Sequence[int], cb: int, mb: int) -> int:
        total_free = 0
        for code in dset:
            total_free += code & FREE_MASK
        if total_free == 0:
            return 0
        u = self.usable(dset_id, dset)
        used = 0
        for w, cr, mr, gi in self.shapes:
            if cr < cb and mr < mb:
                used += w * u[gi]
        # Every shape (CPU-only ones included) sees all free GPU as fragment, minus what it can use.
        return total_free * self.total_weight - used


def _usable(dset: Sequence[int], whole: int, frac: int, allowed: frozenset[int] | None) -> int:
    need = SHARE_UNITS if whole else frac
    usable = 0
    fitting = 0
    for code in dset:
        free = code & FREE_MASK
        if free >= need and (allowed is None or (code >> MODEL_SHIFT) in allowed):
            usable += free
            fitting += 1
    if whole and fitting < whole:
        return 0
    return usable


def node_fragmentation(node: Node, workload: Workload) -> Decimal:
    """The expected GPU fragment of ``node`` for ``workload``, in device shares.

    A convenience for reports and tests; placement uses the memoised :class:`FragEvaluator`.
    Zero for an empty workload.
    """
    total = sum(workload.counts().values())
    if total == 0:
        return Decimal(0)
    models = sorted({d.model for d in node.devices})
    ids = {m: i for i, m in enumerate(models)}
    ev = FragEvaluator(workload, ids)
    dset = encode_devices((ids[d.model], int((1 - d.allocated) * SHARE_UNITS)) for d in node.devices)
    cpu_free = int((node.cpu - node.cpu_allocated) * CPU_UNITS)
    f = ev.frag(0, dset, cpu_free, node.mem - node.mem_allocated)
    return Decimal(f) / Decimal(total * SHARE_UNITS)
