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

RANGES = {"last 7 days": 7, "last 30 days": 30, "last 90 days": 90}


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
    """The ``n`` groups that held the most GPU (then CPU) hours: name, GPU-hours allocated and used,
    GPU efficiency, CPU-hours allocated and used, sessions."""

    def h(x: float) -> str:
        return f"{x / 3600:.2f}"

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
