"""The widgets' own formatting: usage-bar levels and the error line.  How numbers read is
:mod:`labfleet.core.display`, shared with the console and the spawn form.
"""

from __future__ import annotations

from typing import Any

from labfleet.core.display import esc, number

WARN_AT = 0.8  # a bar turns "warn" at 80 % of its limit

# ipywidgets' bar_style for each level.
BAR_STYLES = {"ok": "success", "warn": "warning", "over": "danger"}


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


def error_html(message: str | None) -> str:
    """The error line widgets show; empty when there is none."""
    if not message:
        return ""
    return f'<div class="lf-error" style="color: #b00020;">&#9888; {esc(message)}</div>'
