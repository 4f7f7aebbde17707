"""Usage arithmetic: plain values in, plain values out (no DB, no clock).

- :func:`held_interval`: when a session held slots, from its status history;
- :func:`alloc_rates`: what it holds per second (cores, bytes, devices' worth of shares: a whole
  device counts 1, as quotas count it);
- :func:`split`: an interval cut at 15-minute bucket boundaries;
- :func:`used_amounts`: what one sampler reading adds to a session's used figures, from the
  previous one (a counter for CPU, rectangles for memory and GPU busy time);
- :func:`efficiency`: used against allocated, per slot.

Amounts are floats in slot-seconds: ``cpu`` core-seconds, ``mem`` byte-seconds, ``gpu.shares``
share-seconds (allocated) or device-seconds of busy time (used).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from labfleet.core.slots import ResourceSlots, SlotError, base_slot
from labfleet.core.vocab import FINAL_STATUSES, HOLDING_STATUSES

BUCKET_SECONDS = 900  # 15 minutes
BUCKET = timedelta(seconds=BUCKET_SECONDS)
DAY_SECONDS = 86400  # the rollup of the buckets per UTC day
DAY = timedelta(seconds=DAY_SECONDS)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

# The figures a bucket carries, by what they mean in the API.
ALLOC_KEYS = {"cpu": "alloc_cpu", "mem": "alloc_mem", "gpu.shares": "alloc_gpu"}
USED_KEYS = {"cpu": "used_cpu", "mem": "used_mem", "gpu.shares": "used_gpu"}
PEAK_KEYS = {"mem_peak": "mem_peak", "gpu_mem_peak": "gpu_mem_peak"}


def floor_bucket(t: datetime, seconds: int = BUCKET_SECONDS) -> datetime:
    """The start of the bucket of ``seconds`` that holds ``t`` (UTC)."""
    offset = (t - _EPOCH).total_seconds()
    return _EPOCH + timedelta(seconds=offset - offset % seconds)


def split(start: datetime, end: datetime) -> list[tuple[datetime, float]]:
    """(bucket start, seconds of [start, end) in that bucket), in time order; empty if end <= start."""
    out: list[tuple[datetime, float]] = []
    t = start
    while t < end:
        bucket = floor_bucket(t)
        stop = min(bucket + BUCKET, end)
        out.append((bucket, (stop - t).total_seconds()))
        t = stop
    return out


def _parse_at(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def held_interval(
    history: Sequence[Mapping[str, Any]] | None,
    status: str,
    status_changed_at: datetime,
) -> tuple[datetime, datetime | None] | None:
    """When a session held its slots: (from, until; None while it still holds them); None if it never did.

    From its first holding status (SCHEDULED .. TERMINATING) in the history, until its first final
    status after that; a history that lost its times falls back to ``status_changed_at``.
    """
    start: datetime | None = None
    end: datetime | None = None
    for entry in history or ():
        if not isinstance(entry, Mapping):
            continue
        at = _parse_at(entry.get("at"))
        if start is None and entry.get("status") in HOLDING_STATUSES:
            start = at or status_changed_at
        elif start is not None and entry.get("status") in FINAL_STATUSES:
            end = at or status_changed_at
            break
    if start is None:
        if status not in HOLDING_STATUSES:
            return None
        start = status_changed_at
    if end is None and status in FINAL_STATUSES:
        end = status_changed_at
    if end is not None and end < start:
        end = start
    return start, end


def alloc_rates(requested: Mapping[str, Any] | None) -> dict[str, float]:
    """What a session holds per second: ``cpu`` cores, ``mem`` bytes, ``gpu.shares`` devices' worth
    (whole devices and every model's slots included); bad stored slots hold nothing."""
    try:
        slots = ResourceSlots.parse(requested or {})
    except SlotError:
        return {"cpu": 0.0, "mem": 0.0, "gpu.shares": 0.0}
    gpu = sum(float(v) for k, v in slots.items() if base_slot(k) in ("gpu", "gpu.shares"))
    return {"cpu": float(slots.get_amount("cpu")), "mem": float(slots.get_amount("mem")), "gpu.shares": gpu}


@dataclass(frozen=True)
class Used:
    """What one reading adds: CPU core-seconds over [cpu_from, at], memory byte-seconds and GPU
    device-seconds over [rect_from, at], and the figures now (for peaks and the metrics)."""

    cpu: float
    cpu_from: datetime
    mem: float
    gpu: float
    rect_from: datetime
    cpu_total: float | None  # the new counter baseline
    cpu_now: float | None  # cores
    mem_now: float | None
    gpu_now: float | None  # devices' worth of busy time
    gpu_mem_now: float | None


def used_amounts(
    at: datetime,
    cpu_seconds: float | None,
    mem_bytes: float | None,
    gpu_utils: Iterable[float | None],
    gpu_mems: Iterable[float | None],
    *,
    prev_at: datetime | None,
    prev_cpu: float | None,
    held_from: datetime,
    max_gap: float,
) -> Used | None:
    """What a reading taken at ``at`` adds since the previous one (``prev_at``, ``prev_cpu``).

    CPU is a counter: the difference is exact whatever the gap, and the first reading counts from
    ``held_from`` (the counter starts with the session's processes). A counter that went back (the
    server restarted) counts nothing and becomes the new baseline. Memory and GPU busy time are
    rates: each reading stands for the time since the previous one, at most ``max_gap`` seconds.
    None when the reading is not after the previous one.
    """
    since = prev_at or held_from
    if at <= since:
        return None
    dt = (at - since).total_seconds()
    rect = min(dt, max_gap)
    cpu = 0.0
    if cpu_seconds is not None:
        base = prev_cpu if prev_at is not None and prev_cpu is not None else 0.0
        cpu = cpu_seconds - base if cpu_seconds >= base else 0.0
    utils = [u for u in gpu_utils if u is not None]
    mems = [m for m in gpu_mems if m is not None]
    gpu_now = sum(max(u, 0.0) for u in utils) / 100 if utils else None
    return Used(
        cpu=cpu,
        cpu_from=since,
        mem=max(mem_bytes or 0.0, 0.0) * rect,
        gpu=(gpu_now or 0.0) * rect,
        rect_from=at - timedelta(seconds=rect),
        cpu_total=cpu_seconds,
        cpu_now=cpu / dt if cpu_seconds is not None else None,
        mem_now=mem_bytes,
        gpu_now=gpu_now,
        gpu_mem_now=float(sum(mems)) if mems else None,
    )


def efficiency(allocated: Mapping[str, float], used: Mapping[str, float]) -> dict[str, float | None]:
    """used / allocated per slot; None where nothing was allocated."""
    return {k: (used.get(k, 0.0) / a if a > 0 else None) for k, a in allocated.items()}
