"""The Statistics page: GPU- and CPU-hours by project and user over time, allocated against used,
the top users, and the report as CSV, all from ``GET /api/usage`` as the viewer.

The plots are the notebooks' own :class:`labfleet.widgets.UsageChart` fed by :class:`UsageSource`, which answers
its two calls from the labfleet service directly (the widget normally asks a session's endpoints).
"""

from __future__ import annotations

import base64
import html
from datetime import datetime, timedelta, timezone
from typing import Any

from labfleet.console.console import Console
from labfleet.core.display import fmt_hours

RANGES = {"last 7 days": 7, "last 30 days": 30, "last 90 days": 90}
# The top table's columns: each time cell carries its own unit (fmt_hours: "3.5 h", "4.5 min", "19 s"),
# so the headings name what is counted, not a unit.
TOP_COLUMNS = ["GPU time held", "GPU time used", "GPU use", "CPU time held", "CPU time used", "sessions"]


def _iso(value: datetime | str | None) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else value


class UsageSource:
    """What :class:`labfleet.widgets.UsageChart` asks, answered by the labfleet service as the viewer."""

    def __init__(self, console: Console) -> None:
        self.console = console

    async def my_usage(self) -> dict[str, Any]:
        return self.console.get("/usage/me")

    async def usage_report(
        self,
        group_by: str = "user",
        start: datetime | str | None = None,
        end: datetime | str | None = None,
        bucket: str = "none",
    ) -> dict[str, Any]:
        return self.console.get("/usage", group_by=group_by, start=_iso(start), end=_iso(end), bucket=bucket)


def window(days: int, now: datetime | None = None) -> tuple[datetime, datetime]:
    """The last ``days`` days up to now (UTC)."""
    end = now or datetime.now(timezone.utc)
    return end - timedelta(days=days), end


def top_rows(report: dict[str, Any], key: str, n: int = 10) -> list[list[Any]]:
    """The ``n`` groups that held the most GPU (then CPU) hours: name, GPU time allocated and used,
    GPU efficiency, CPU time allocated and used, sessions (see :data:`TOP_COLUMNS`); times as
    :func:`fmt_hours` writes them (the API counts slot-seconds)."""

    def h(x: float) -> str:
        return fmt_hours(x / 3600)

    def pct(e: float | None) -> str:
        return "-" if e is None else f"{100 * e:.0f} %"

    rows = sorted(
        report.get("rows", []),
        key=lambda r: (-r["allocated"].get("gpu.shares", 0.0), -r["allocated"].get("cpu", 0.0), r[key]),
    )[:n]
    return [
        [
            r[key],
            h(r["allocated"].get("gpu.shares", 0.0)),
            h(r["used"].get("gpu.shares", 0.0)),
            pct(r["efficiency"].get("gpu.shares")),
            h(r["allocated"].get("cpu", 0.0)),
            h(r["used"].get("cpu", 0.0)),
            r["sessions"],
        ]
        for r in rows
    ]


def csv_link(text: str, name: str) -> str:
    """An HTML download link carrying ``text`` (the page needs no server round trip to save it)."""
    data = base64.b64encode(text.encode()).decode()
    return (
        f'<a download="{html.escape(name)}" href="data:text/csv;base64,{data}" '
        f'style="color: var(--jp-brand-color1)">Download {html.escape(name)}</a>'
    )
