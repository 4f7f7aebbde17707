"""Pure formatting for the widgets: sizes, slot amounts, percentages, durations and usage-bar levels.

No I/O and no widgets here: the same numbers read the same in every widget, and tests check them
without a kernel.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

SLOT_ORDER = ("cpu", "mem", "gpu", "gpu.shares")
SLOT_LABELS = {"cpu": "CPU cores", "mem": "Memory", "gpu": "Whole GPUs", "gpu.shares": "GPU shares"}
WARN_AT = 0.8  # a bar turns "warn" at 80 % of its limit

# ipywidgets' bar_style for each level.
BAR_STYLES = {"ok": "success", "warn": "warning", "over": "danger"}

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


def fmt_bytes(value: Any) -> str:
    """``1536`` -> ``1.5 KiB``; binary units, at most one decimal, no trailing ``.0``."""
    amount = number(value)
    for unit, size in _BINARY_UNITS:
        if abs(amount) >= size:
            return f"{_trim(amount / size)} {unit}"
    return f"{int(amount)} B"


def _trim(x: float, digits: int = 1) -> str:
    text = f"{x:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def slot_name(slot: str) -> str:
    return SLOT_LABELS.get(slot, slot)


def fmt_slot(slot: str, value: Any) -> str:
    """An amount of one slot as people read it; None is "unlimited"."""
    if value is None:
        return "unlimited"
    if slot == "mem" or slot.startswith("mem"):
        return fmt_bytes(value)
    return _trim(number(value), 2)


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
        return f"{_trim(seconds / 60)} min"
    return f"{_trim(h, 0 if h >= 100 else 1 if h >= 10 else 2)} h"


def fmt_percent(value: Any) -> str:
    """``37.46`` -> ``37 %``; None -> ``n/a`` (the driver could not tell)."""
    if value is None:
        return "n/a"
    return f"{_trim(number(value), 0 if number(value) >= 10 else 1)} %"


def fmt_duration(seconds: Any) -> str:
    """``3725`` -> ``1 h 2 min``; None -> ``no limit``; under a minute in seconds."""
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
        return f"{minutes} min"
    return f"{secs} s"


def level(used: Any, limit: Any) -> str:
    """The bar level of ``used`` against ``limit``: ``ok``, ``warn`` (>= 80 %) or ``over`` (nothing left).

    A limit of None means unlimited (always ``ok``); a limit of 0 allows nothing, so it reads ``over``.
    """
    if limit is None:
        return "ok"
    used_f, limit_f = number(used), number(limit)
    if used_f >= limit_f:
        return "over"
    if used_f >= WARN_AT * limit_f:
        return "warn"
    return "ok"


def bar(used: Any, limit: Any) -> dict[str, Any]:
    """The traits of a FloatProgress for ``used`` of ``limit`` (``limit`` > 0 or 0): value, max, bar_style.

    A zero limit shows a full red bar (nothing may be used) rather than an empty one.
    """
    used_f, limit_f = max(number(used), 0.0), number(limit)
    lv = level(used, limit)
    if limit_f <= 0:
        return {"value": 1.0, "max": 1.0, "bar_style": BAR_STYLES[lv], "level": lv}
    return {"value": min(used_f, limit_f), "max": limit_f, "bar_style": BAR_STYLES[lv], "level": lv}


def sort_slots(slots: Any) -> list[str]:
    """Known slots first in their usual order, then the rest (per-model slots) by name."""
    names = set(slots)
    return [s for s in SLOT_ORDER if s in names] + sorted(names - set(SLOT_ORDER))


def used_of(slot: str, used: Any, limit: Any) -> str:
    """``512 MiB of 1 GiB``; ``3 (unlimited)`` when there is no limit."""
    if limit is None:
        return f"{fmt_slot(slot, used or 0)} (unlimited)"
    return f"{fmt_slot(slot, used or 0)} of {fmt_slot(slot, limit)}"


def text(value: Any) -> str:
    """Anything from the service, safe inside an HTML widget."""
    return escape("" if value is None else str(value))


def error_html(message: str | None) -> str:
    """The error line widgets show; empty when there is none."""
    if not message:
        return ""
    return f'<div class="lf-error" style="color: #b00020;">&#9888; {text(message)}</div>'
