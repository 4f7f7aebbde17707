"""Order of a resource group's queue of PENDING sessions, and one scheduling pass over it.

Pure: no I/O, no database, deterministic (every tie is broken by ``created_at`` then
``session_id``).  The service loads the group's PENDING sessions as :class:`PendingItem`, orders
them with :func:`order_queue`, reports :func:`queue_positions` to the spawners' progress bars, and
runs :func:`schedule_pass` with a callback that places and records one session.

Schedulers (:data:`SCHEDULERS`):

``fifo``
    Oldest first.
``lifo``
    Newest first.
``drf``
    Dominant resource fairness (Ghodsi et al., NSDI 2011) across users.  A user's dominant share
    is the largest, over the slots, of ``used / capacity`` (slots with zero capacity ignored).
    The queue is built the way DRF allocates: repeatedly take the oldest item of the user with the
    smallest dominant share, then count that item's slots as used by them.  So a user with nothing
    running goes before one using half the GPUs, and users with many queued sessions take turns
    instead of filling the head of the queue.  Ties go to the user whose next item is older.

For DRF, per-model slots count as their base slot (``gpu:A100`` as ``gpu``) and ``gpu.shares`` as
``gpu`` (a share is a fraction of one device); the capacity of that GPU dimension is
``capacity["gpu"]`` (or ``capacity["gpu.shares"]``, the larger if both are given: they describe
the same devices).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from fractions import Fraction
from typing import Any

from labfleet.core.slots import ResourceSlots, base_slot

SCHEDULERS: tuple[str, ...] = ("fifo", "lifo", "drf")


@dataclass(frozen=True)
class PendingItem:
    """One PENDING session.

    ``created_at``: when it was admitted; all items of one queue use the same kind (all floats, or
    all timezone-aware datetimes), since the two do not compare.
    """

    session_id: str
    user: str
    created_at: float | datetime
    slots: ResourceSlots

    def __post_init__(self) -> None:
        object.__setattr__(self, "slots", ResourceSlots.parse(self.slots))


def _age_key(item: PendingItem) -> tuple[Any, str]:
    return (item.created_at, item.session_id)


def _drf_dims(slots: Mapping[str, Decimal]) -> dict[str, Decimal]:
    """Slots as DRF compares them: models folded, shares counted as devices."""
    out: dict[str, Decimal] = {}
    for name, amount in slots.items():
        base = base_slot(name)
        if base == "gpu.shares":
            base = "gpu"
        out[base] = out.get(base, Decimal(0)) + amount
    return out


def _drf_capacity(capacity: Mapping[str, Decimal]) -> dict[str, Decimal]:
    """Capacity per DRF dimension; dimensions with zero capacity are dropped (ignored)."""
    base_caps: dict[str, Decimal] = {}
    model_caps: dict[tuple[str, str], Decimal] = {}
    for name, amount in ResourceSlots.parse(capacity).items():
        dim = "gpu" if base_slot(name) == "gpu.shares" else base_slot(name)
        # gpu and gpu.shares name the same devices: take the larger, never the sum.
        if ":" in name:
            key = (dim, name.split(":", 1)[1])
            model_caps[key] = max(model_caps.get(key, Decimal(0)), amount)
        else:
            base_caps[dim] = max(base_caps.get(dim, Decimal(0)), amount)
    out = dict(base_caps)
    for (dim, _model), amount in sorted(model_caps.items()):
        # Per-model capacities add up to their base, unless the base is given itself.
        if dim not in base_caps:
            out[dim] = out.get(dim, Decimal(0)) + amount
    return {k: v for k, v in out.items() if v > 0}


def dominant_share(used: Mapping[str, Decimal], capacity: Mapping[str, Decimal]) -> Fraction:
    """max over slots of used / capacity, exact; slots with zero (or no) capacity are ignored."""
    cap = _drf_capacity(capacity)
    use = _drf_dims(ResourceSlots.parse(used))
    return _share(use, cap)


def _share(use: Mapping[str, Decimal], cap: Mapping[str, Decimal]) -> Fraction:
    best = Fraction(0)
    for name, total in cap.items():
        amount = use.get(name)
        if amount:
            best = max(best, Fraction(amount) / Fraction(total))
    return best


def _order_drf(
    pending: list[PendingItem],
    usage_by_user: Mapping[str, Mapping[str, Decimal]],
    capacity: Mapping[str, Decimal],
) -> list[PendingItem]:
    cap = _drf_capacity(capacity)
    per_user: dict[str, list[PendingItem]] = {}
    for item in sorted(pending, key=_age_key):
        per_user.setdefault(item.user, []).append(item)
    used: dict[str, dict[str, Decimal]] = {
        user: _drf_dims(ResourceSlots.parse(usage_by_user.get(user, {}))) for user in per_user
    }
    # Heap of (dominant share, next item's age, user, index of that item in the user's list).
    heap: list[tuple[Fraction, tuple[Any, str], str, int]] = [
        (_share(used[user], cap), _age_key(items[0]), user, 0) for user, items in per_user.items()
    ]
    heapq.heapify(heap)
    ordered: list[PendingItem] = []
    while heap:
        _, _, user, i = heapq.heappop(heap)
        item = per_user[user][i]
        ordered.append(item)
        # Count the item as the user's: DRF hands out one task at a time, then re-ranks.
        for name, amount in _drf_dims(item.slots).items():
            used[user][name] = used[user].get(name, Decimal(0)) + amount
        if i + 1 < len(per_user[user]):
            nxt = per_user[user][i + 1]
            heapq.heappush(heap, (_share(used[user], cap), _age_key(nxt), user, i + 1))
    return ordered


def order_queue(
    pending: Iterable[PendingItem],
    policy: str,
    usage_by_user: Mapping[str, Mapping[str, Decimal]] | None = None,
    capacity: Mapping[str, Decimal] | None = None,
) -> list[PendingItem]:
    """The queue in the order the scheduler tries it (a new list; the input is not changed).

    ``usage_by_user``: slots each user holds in the resource group now (DRF only; users missing
    hold nothing).  ``capacity``: the group's total slots (DRF only).  Raises ValueError for an
    unknown policy.
    """
    items = list(pending)
    if policy == "fifo":
        return sorted(items, key=_age_key)
    if policy == "lifo":
        # Newest first; equal times keep session_id order (a stable sort with reverse=True
        # keeps the order of equal keys).
        return sorted(sorted(items, key=lambda it: it.session_id), key=lambda it: it.created_at, reverse=True)
    if policy == "drf":
        return _order_drf(items, usage_by_user or {}, capacity or {})
    raise ValueError(f"unknown scheduler {policy!r}: choose one of {', '.join(SCHEDULERS)}")


def queue_positions(ordered: Iterable[PendingItem]) -> dict[str, int]:
    """session_id -> position in the queue, 1 for the head."""
    return {item.session_id: pos for pos, item in enumerate(ordered, start=1)}


def schedule_pass(
    ordered: Iterable[PendingItem],
    try_place: Callable[[PendingItem], bool],
    *,
    strict_head: bool = False,
) -> list[str]:
    """Walk the ordered queue once; return the session ids that ``try_place`` placed, in order.

    ``try_place(item)`` is the caller's: it places the session and applies the placement to the
    cluster state (so later items see it), returning True, or returns False when it does not fit.

    By default an item that does not fit is skipped and the pass goes on (backfilling): smaller
    sessions behind it may start.  The price: a large request may starve while small ones keep
    taking the space it waits for.  ``strict_head=True`` stops at the first item that does not fit
    instead (head-of-line blocking: nothing overtakes it, so it starts as soon as enough is free,
    but everything behind it waits too).
    """
    placed: list[str] = []
    for item in ordered:
        if try_place(item):
            placed.append(item.session_id)
        elif strict_head:
            break
    return placed
