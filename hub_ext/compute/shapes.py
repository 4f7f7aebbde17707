"""What an admission derives from a request's slots and GPU models, checked and derived once per
distinct request (pure; a per-process cache).

A fleet asks for a few shapes over and over (the spawn form's presets; the openb trace's 8,152
tasks have 151), and deriving one (parse the slots, the placement request, the ledger's quanta
and rows, the stored and shown forms) costs tens of µs that every admission of that shape would
pay again.  A cached :class:`Shape` is immutable in use: nothing that reads it changes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from labfleet.compute.scheduler.fragmentation import Workload
from labfleet.compute.scheduler.placement import Request
from labfleet.core import quanta
from labfleet.core.errors import InvalidInput
from labfleet.core.slots import ResourceSlots, charged
from labfleet.core.validate import check_slots, check_string_list
from labfleet.core.vocab import SLOT_NAMES

_CACHE_LIMIT = 4096


@dataclass(frozen=True)
class Shape:
    """A request's slots and GPU models, checked, with what admission derives from them."""

    slots: ResourceSlots
    gpu_models: tuple[str, ...]
    wanted: Request  # what placement looks for
    charged: ResourceSlots  # what quotas count (whole devices as shares too)
    stored: Mapping[str, str]  # the session row's requested_slots (copy before storing)
    shown: Mapping[str, int | float]  # as the API and the audit log show them (copy before use)
    keys: tuple[str, ...]  # the ledger rows admission reads (quanta.request_keys)
    admitted: Mapping[str, int]  # the ledger change of admitting it
    queued: Mapping[str, int]  # the same, waiting in the queue
    # fgd's target workload when none is given: this request alone (what place() builds when
    # given none). A cluster keeps an evaluator per workload content (Workload.key()) and each
    # group's score per request, so requests of this shape find theirs whatever came between;
    # one object per shape builds that key once.
    workload: Workload


_cache: dict[Any, Shape] = {}


def _key(slots: Mapping[str, Any], models: Any) -> Any:
    """A cache key that tells apart what parses differently (``True`` and ``1``, ``1`` and ``1.0``
    compare equal), or None when the request cannot be a key (a list among the values...)."""
    if not isinstance(models, list) or not all(type(m) is str for m in models):
        return None
    items = []
    for name, value in slots.items():
        if type(value) not in (str, int, float, Decimal) or type(name) is not str:
            return None
        items.append((name, type(value), value))
    return (tuple(items), tuple(models))


def shape_of(slots: Any, models: Any) -> Shape:
    """The checked shape of a request's ``slots`` and ``gpu_models``; InvalidInput as
    :func:`labfleet.compute.sessions.parse_request` says it."""
    if not isinstance(slots, dict):
        raise InvalidInput('slots must be an object like {"cpu": 2, "mem": "8g", "gpu.shares": 0.5}')
    key = _key(slots, models)
    got = _cache.get(key) if key is not None else None
    if got is not None:
        return got
    shape = _derive(slots, models)
    if key is not None:
        if len(_cache) >= _CACHE_LIMIT:
            _cache.clear()  # bounded; a fleet has far fewer shapes than this
        _cache[key] = shape
    return shape


def _derive(slots: dict[str, Any], models: Any) -> Shape:
    unknown = sorted(k for k in slots if str(k).split(":", 1)[0] not in SLOT_NAMES)
    if unknown:
        raise InvalidInput(
            f"unknown slot(s) {', '.join(map(str, unknown))}; a session asks cpu, mem, gpu or gpu.shares"
        )
    parsed = check_slots(slots, "slots")
    gpu_models = check_string_list(models, "gpu_models")
    try:
        wanted = Request.from_slots(parsed, gpu_models)
    except ValueError as e:
        raise InvalidInput(str(e)) from None
    return Shape(
        slots=parsed,
        gpu_models=tuple(gpu_models),
        wanted=wanted,
        charged=charged(parsed),
        stored=parsed.to_db(),
        shown=parsed.to_json(),
        keys=tuple(quanta.request_keys(parsed)),
        admitted=quanta.session_delta(parsed, live=1, pending=0),
        queued=quanta.session_delta(parsed, live=1, pending=1),
        workload=Workload.from_requests([wanted]),
    )
