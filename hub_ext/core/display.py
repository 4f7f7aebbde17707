"""How labfleet's numbers read for people: sizes, slot amounts, percentages, durations and times,
and text made safe for HTML.  The formatting kit of the widgets, the admin console's pages and the
spawn form alike.

Pure: no I/O, nothing but the standard library, so the Hub, kernels and the console import it, and
the same numbers read the same everywhere; tests check them without a kernel.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from labfleet.core.vocab import SLOT_NAMES

SLOT_LABELS = {"cpu": "CPU cores", "mem": "Memory", "gpu": "Whole GPUs", "gpu.shares": "GPU shares"}
_BINARY_UNITS = (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def number(value: Any) -> float:
    """A JSON amount (int, float or the service's decimal string) as a float; None and junk count as 0."""
    if value is None or isinstance(value, bool):
        return 0.0
    try:
        out = float(value)
    except (TypeError, ValueError):
        return 0.0
    return out if math.isfinite(out) else 0.0


def trim(x: float, digits: int = 2) -> str:
    """``0.50`` -> ``0.5``, ``2.0`` -> ``2``: a number without trailing zeros."""
    out = f"{x:.{digits}f}"
    return out.rstrip("0").rstrip(".") if "." in out else out


def fmt_bytes(value: Any) -> str:
    """``1536`` -> ``1.5 KiB``, ``85899345920`` -> ``80 GiB``: binary units, at most one decimal."""
    amount = number(value)
    for unit, size in _BINARY_UNITS:
        if abs(amount) >= size:
            return f"{trim(amount / size, 1)} {unit}"
    return f"{int(amount)} B"


def mem_input(value: Any) -> str:
    """Bytes as people type a size into a form (``2g``, ``512m``; plain bytes when no unit divides
    them): what the spawn form, the sidebar (``memInput``) and the CLI read back."""
    amount = int(number(value))
    for unit, size in (("t", 2**40), ("g", 2**30), ("m", 2**20), ("k", 2**10)):
        if amount >= size and amount % size == 0:
            return f"{amount // size}{unit}"
    return str(amount)


def slot_name(slot: str) -> str:
    return SLOT_LABELS.get(slot, slot)


def fmt_slot(slot: str, value: Any) -> str:
    """An amount of one slot as people read it; None is "unlimited"."""
    if value is None:
        return "unlimited"
    if slot == "mem" or slot.startswith("mem"):
        return fmt_bytes(value)
    return trim(number(value), 2)


def fmt_hours(value: Any) -> str:
    """Hours as people read them: ``0 h``, ``0.25 h``, ``3.5 h``, ``12.3 h``, ``140 h``; under 6 minutes in
    minutes or seconds (``4.5 min``, ``18 s``, ``< 1 s``), as a session's first minutes are."""
    h = number(value)
    if h <= 0:
        return "0 h"
    seconds = h * 3600
    if seconds < 59.5:
        return "< 1 s" if seconds < 0.5 else f"{round(seconds)} s"
    if h < 0.1:
        return f"{trim(seconds / 60, 1)} min"
    return f"{trim(h, 0 if h >= 100 else 1 if h >= 10 else 2)} h"


def fmt_percent(value: Any) -> str:
    """``37.46`` -> ``37 %``; None -> ``n/a`` (the driver could not tell)."""
    if value is None:
        return "n/a"
    return f"{trim(number(value), 0 if number(value) >= 10 else 1)} %"


def fmt_duration(seconds: Any) -> str:
    """``3725`` -> ``1 h 2 min``, ``125`` -> ``2 min 5 s``; None -> ``no limit``; never negative."""
    if seconds is None:
        return "no limit"
    s = max(int(number(seconds)), 0)
    days, rest = divmod(s, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s" if minutes < 10 and secs else f"{minutes} min"
    return f"{secs} s"


def parse_time(iso: Any) -> datetime | None:
    """An ISO time from the service as an aware datetime (naive ones are UTC); None if it is not one."""
    if not iso:
        return None
    try:
        t = datetime.fromisoformat(str(iso))
    except ValueError:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


def seconds_since(iso: Any, now: datetime) -> float | None:
    """Seconds from ``iso`` to ``now`` (0 when ``iso`` is in the future); None when there is no time."""
    t = parse_time(iso)
    return None if t is None else max((now - t).total_seconds(), 0.0)


def fmt_ago(iso: Any, now: datetime) -> str:
    """``12 s ago``; ``never`` when the service has no time."""
    ago = seconds_since(iso, now)
    return "never" if ago is None else f"{fmt_duration(ago)} ago"


def fmt_timeout(seconds: Any) -> str:
    """A resource group's pending timeout: ``0`` waits for ever."""
    s = int(number(seconds))
    return "waits for ever" if s <= 0 else fmt_duration(s)


def fmt_slots(slots: Mapping[str, Any]) -> str:
    """A session's slots as people read them: ``cpu 0.5, mem 4 GiB, gpu 2``, known slots first."""
    parts = []
    for n in sort_slots(slots):
        v = slots[n]
        parts.append(f"{n} {fmt_bytes(v) if n.split(':')[0] == 'mem' else trim(number(v))}")
    return ", ".join(parts) or "nothing"


def sort_slots(slots: Any) -> list[str]:
    """Known slots first in their usual order, then the rest (per-model slots) by name."""
    names = set(slots)
    return [s for s in SLOT_NAMES if s in names] + sorted(names - set(SLOT_NAMES))


def used_of(slot: str, used: Any, limit: Any) -> str:
    """``512 MiB of 1 GiB``; ``3 (unlimited)`` when there is no limit."""
    if limit is None:
        return f"{fmt_slot(slot, used or 0)} (unlimited)"
    return f"{fmt_slot(slot, used or 0)} of {fmt_slot(slot, limit)}"


def esc(value: Any) -> str:
    """Anything from the service, safe inside HTML and SVG text and attributes."""
    return html.escape("" if value is None else str(value), quote=True)
