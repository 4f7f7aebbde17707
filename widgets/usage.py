"""UsageChart: GPU-hours and CPU-hours, allocated against used, drawn with bqplot.

By default it shows my usage (``GET /api/usage/me``): a table of the last 7 days, 30 days and this month,
and for GPU-hours and CPU-hours a bar a day over the last 30 days: what was allocated, wide and light, with
what was used of it, narrow and dark, in front. Given
``group_by=``, ``start=``, ``end=`` or ``bucket=`` it plots a usage report (``GET /api/usage``) instead, the
same way: one bar per group (e.g. per user, for an admin) or, with a bucket, per bucket summed over the
groups, of GPU-hours (``metric="gpu"``) or CPU-hours (``metric="cpu"``).

Two one-dimensional ``Bars`` marks on shared scales, not one ``type="grouped"`` mark with a 2-D ``y``: the
latter draws nothing in bqplot 0.13's front end (bqplot issue 1646), and ``align="left"``/``"right"`` to
pair two marks hangs it.

The API counts slot-seconds: ``gpu.shares`` device-share-seconds (a whole GPU counts 1 a second, half a GPU
0.5) and ``cpu`` core-seconds; divided by 3600 they are GPU-hours and CPU-hours.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import ipywidgets as W
import numpy as np
from bqplot import Axis, Bars, DateScale, Figure, LinearScale, OrdinalScale, Tooltip
from traitlets import Float

from labfleet.core.display import esc, fmt_hours, fmt_percent, number

from .base import FleetWidget

# kind -> (the API's slot, what its hours are called)
KINDS = {"gpu": ("gpu.shares", "GPU-hours"), "cpu": ("cpu", "CPU-hours")}
PERIODS = ("7d", "30d", "month")
GROUPS = ("user", "project", "domain", "resource_group", "session")
BUCKETS = ("15m", "hour", "day", "none")
BUCKET_SECONDS = {"15m": 900, "hour": 3600, "day": 86400}
SERIES = ("allocated", "used")
# JupyterLab's brand blues: allocated light (--md-blue-200), used full (--jp-brand-color1).
COLORS = {"allocated": "#90caf9", "used": "#1976d2"}
# The share of a bar's band left empty: allocated wide, used narrow in front of it.
PADDING = {"allocated": 0.1, "used": 0.45}
LEGEND = (
    "<div class='lf-usage-legend' style='margin: 4px 0 0 60px'>"
    + " &nbsp; ".join(f"<span style='color:{c}'>&#9632;</span> {name}" for name, c in COLORS.items())
    + "</div>"
)
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def hours(amounts: dict[str, Any] | None, slot: str) -> float:
    """Slot-seconds of ``slot`` as hours (0 where absent), rounded to a second's worth of precision."""
    return round(number((amounts or {}).get(slot)) / 3600.0, 4)


# How finely a bar reads in each unit: the hours themselves are kept to 0.0001 h (0.36 s).
DIGITS = {"seconds": 0, "minutes": 1, "hours": 4}


def axis_unit(most: float) -> tuple[str, float]:
    """The unit a y axis reads in, chosen by its tallest bar (``most`` hours) as :func:`fmt_hours`
    writes an amount: (its name, how many make an hour). Ticks of 0.0008 h would all read 0."""
    if 0 < most * 3600 < 59.5:
        return "seconds", 3600.0
    if 0 < most < 0.1:
        return "minutes", 60.0
    return "hours", 1.0


def nice_ticks(most: float, n: int = 4) -> list[float]:
    """Ticks from 0 up to a round top at or above ``most`` (1, 2, 2.5 or 5 times a power of ten
    per step, ``n`` steps): an axis of round numbers whose top is its scale, not a bar's value."""
    if most <= 0:
        return [0.0, 1.0]
    raw = most / n
    power = 10.0 ** np.floor(np.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw - 1e-12)
    return [round(i * step, 10) for i in range(n + 1)]


def time_label(iso: str | None, bucket: str = "day") -> str:
    """A bucket's start as a short label, as written (no time zone change): ``Nov 3`` for a day,
    ``Nov 3 14:15`` for an hour or a quarter; ``all`` for no bucket."""
    if not iso:
        return "all"
    try:
        t = datetime.fromisoformat(iso)
    except ValueError:
        return str(iso)
    day = f"{_MONTHS[t.month - 1]} {t.day}"
    return day if bucket == "day" else f"{day} {t:%H:%M}"


def efficiency(figures: dict[str, Any], slot: str) -> float | None:
    """used / allocated of ``slot``: the API's figure, else computed; None when nothing was allocated."""
    given = (figures.get("efficiency") or {}).get(slot)
    if given is not None:
        return number(given)
    allocated = hours(figures.get("allocated"), slot)
    return hours(figures.get("used"), slot) / allocated if allocated else None


def period_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """``/api/usage/me``'s periods (7 days, 30 days, this month) as rows of hours per kind (pure)."""
    by_key = {p.get("key"): p for p in data.get("periods") or []}
    rows = []
    for key in [k for k in PERIODS if k in by_key] + [k for k in by_key if k not in PERIODS]:
        p = by_key[key]
        row: dict[str, Any] = {
            "key": key,
            "label": p.get("label") or key,
            "sessions": int(number(p.get("sessions"))),
        }
        for kind, (slot, _) in KINDS.items():
            row[kind] = {
                "allocated": hours(p.get("allocated"), slot),
                "used": hours(p.get("used"), slot),
                "efficiency": efficiency(p, slot),
            }
        rows.append(row)
    return rows


def bar_time(iso: str | None, seconds: float) -> np.datetime64 | None:
    """Where a bucket's bar stands on a date axis: the middle of the bucket, in UTC. A day's bar at noon
    falls on its own date for a browser anywhere from UTC-11 to UTC+11 (the axis shows local time)."""
    if not iso:
        return None
    try:
        t = datetime.fromisoformat(iso)
    except ValueError:
        return None
    if t.tzinfo is not None:
        t = t.astimezone(timezone.utc).replace(tzinfo=None)
    return np.datetime64(t + timedelta(seconds=seconds / 2), "ms")


def daily_series(data: dict[str, Any], kind: str) -> dict[str, Any]:
    """``/api/usage/me``'s daily entries as the bars of one kind (pure): the days' starts (ISO) and labels,
    the bars' places on a date axis (``x``, each day's noon) and the hours allocated and used."""
    slot = KINDS[kind][0]
    days = [d for d in data.get("daily") or [] if bar_time(d.get("bucket"), 0) is not None]
    return {
        "starts": [d["bucket"] for d in days],
        "labels": [time_label(d["bucket"]) for d in days],
        "x": np.array([bar_time(d["bucket"], 86400) for d in days], dtype="datetime64[ms]"),
        "allocated": [hours(d.get("allocated"), slot) for d in days],
        "used": [hours(d.get("used"), slot) for d in days],
    }


def report_series(data: dict[str, Any], kind: str) -> dict[str, Any]:
    """``/api/usage`` rows as the bars of one kind (pure).

    Without a bucket: one bar per group (``x`` the group's names). With one: one bar per bucket of the
    report's span, summed over the groups, in time order, the buckets without a row as zeros (``x`` the
    buckets' middles on a date axis, ``starts`` their starts).
    """
    slot = KINDS[kind][0]
    group_by = data.get("group_by") or "user"
    bucket = data.get("bucket") or "none"
    rows = data.get("rows") or []
    totals: dict[str, list[float]] = {}
    for row in rows:
        key = str(row.get(group_by)) if bucket == "none" else str(row.get("bucket"))
        t = totals.setdefault(key, [0.0, 0.0])
        t[0] += hours(row.get("allocated"), slot)
        t[1] += hours(row.get("used"), slot)
    if bucket == "none" or not totals:
        order = list(totals)
        return {
            "starts": [],
            "labels": order,
            "x": order,
            "allocated": [round(totals[k][0], 4) for k in order],
            "used": [round(totals[k][1], 4) for k in order],
        }
    step = timedelta(seconds=BUCKET_SECONDS.get(bucket, 86400))
    by_time = {datetime.fromisoformat(k): v for k, v in totals.items()}
    starts = sorted(by_time)
    # Every bucket of the span, aligned on the service's own (those of the rows).
    lo = _time(data.get("start"), starts[0])
    hi = _time(data.get("end"), starts[-1] + step)
    first = starts[0] - step * ((starts[0] - lo) // step)
    if first > lo:
        first -= step
    buckets = []
    b = first
    while b < hi or b <= starts[-1]:
        if b + step > lo:
            buckets.append(b)
        b += step
    isos = [b.isoformat() for b in buckets]
    return {
        "starts": isos,
        "labels": [time_label(i, bucket) for i in isos],
        "x": np.array([bar_time(i, step.total_seconds()) for i in isos], dtype="datetime64[ms]"),
        "allocated": [round(by_time.get(b, [0.0, 0.0])[0], 4) for b in buckets],
        "used": [round(by_time.get(b, [0.0, 0.0])[1], 4) for b in buckets],
    }


def _time(iso: Any, default: datetime) -> datetime:
    try:
        t = datetime.fromisoformat(str(iso))
    except ValueError:
        return default
    if (t.tzinfo is None) != (default.tzinfo is None):
        return default
    return t


class UsageChart(FleetWidget):
    """Allocated against used GPU-hours and CPU-hours: mine by default, a usage report given its filters.

    ``UsageChart()``: my last 30 days, day by day, and a table of the last 7 days, 30 days and this month.
    ``UsageChart(group_by="user", start=..., end=..., bucket="none", metric="gpu")``: the report's rows.
    """

    title = "Usage"
    refresh_interval = Float(
        60.0, help="Seconds between automatic refreshes (0: only the first load); usage changes slowly."
    )

    def __init__(
        self,
        client: Any = None,
        refresh_interval: float | None = None,
        *,
        group_by: str | None = None,
        start: datetime | str | None = None,
        end: datetime | str | None = None,
        bucket: str | None = None,
        metric: str = "gpu",
        **kwargs: Any,
    ) -> None:
        if metric not in KINDS:
            raise ValueError(f"metric must be one of {', '.join(KINDS)}, not {metric!r}")
        if group_by is not None and group_by not in GROUPS:
            raise ValueError(f"group_by must be one of {', '.join(GROUPS)}, not {group_by!r}")
        if bucket is not None and bucket not in BUCKETS:
            raise ValueError(f"bucket must be one of {', '.join(BUCKETS)}, not {bucket!r}")
        self.report = any(v is not None for v in (group_by, start, end, bucket))
        self.group_by = group_by or "user"
        self.bucket = bucket or "none"
        self.start = start
        self.end = end
        self.metric = metric
        self.data: dict[str, Any] | None = None  # the last answer
        self.periods: list[dict[str, Any]] = []  # my usage: period_rows()
        self.series: dict[str, dict[str, Any]] = {}  # figure key -> the bars' data (shown ones only)
        self.summary = W.HTML("")
        self.legend = W.HTML("")
        self.empty = W.HTML("")
        self.figures: dict[str, Figure] = {}
        self.bars: dict[str, dict[str, Bars]] = {}  # figure key -> series (allocated, used) -> its mark
        self.x_axes: dict[str, Axis] = {}
        self.y_axes: dict[str, Axis] = {}
        if self.report:
            self._figure("report", KINDS[metric][1], None if self.bucket == "none" else self.bucket)
        else:
            for kind, (_, what) in KINDS.items():
                self._figure(kind, what, "day")
        super().__init__(client, refresh_interval, **kwargs)
        self.add_class("labfleet-usage")
        self.children = [
            self.header,
            self.summary,
            self.empty,
            self.legend,
            *self.figures.values(),
            self.error_box,
        ]

    def _figure(self, key: str, what: str, bucket: str | None) -> None:
        """A figure of two bar marks on shared scales; ``bucket`` None: one bar per group (ordinal axis),
        else per bucket on a date axis."""
        x = OrdinalScale() if bucket is None else DateScale()
        y = LinearScale(min=0.0)
        when = "" if bucket is None else ("%b %-d" if bucket == "day" else "%b %-d %H:%M")
        marks = {
            series: Bars(
                x=[],
                y=[],
                scales={"x": x, "y": y},
                colors=[COLORS[series]],
                padding=PADDING[series],
                labels=[series],
                tooltip=Tooltip(fields=["x", "y"], labels=["", f"{series} (hours)"], formats=[when, ",.2f"]),
            )
            for series in SERIES
        }
        x_axis = Axis(scale=x, grid_lines="none", tick_format=when or None, num_ticks=6 if when else None)
        # The scale's unit in the axis title and ticks up the axis (not a lone top value that reads as a figure).
        y_axis = Axis(
            scale=y,
            side="left",
            label="hours",
            tick_format=",~g",
            grid_lines="dashed",
            label_offset="40px",
        )
        self.bars[key] = marks
        self.x_axes[key] = x_axis
        self.y_axes[key] = y_axis
        self.figures[key] = Figure(
            marks=list(marks.values()),
            axes=[x_axis, y_axis],
            title=what,
            fig_margin={"top": 40, "bottom": 40, "left": 60, "right": 32},
            layout=W.Layout(width="100%", max_width="760px", height="240px"),
        )

    # -- refreshing ---------------------------------------------------------------------------------

    async def fetch(self) -> dict[str, Any]:
        if self.report:
            return await self.client.usage_report(
                group_by=self.group_by, start=self.start, end=self.end, bucket=self.bucket
            )
        return await self.client.my_usage()

    def render(self, data: dict[str, Any]) -> None:
        if self.report:
            self._render_report(data)
        else:
            self._render_mine(data)
        self.data = data

    def _show(self, key: str, series: dict[str, Any], title: str) -> None:
        fig = self.figures[key]
        # The bars in the axis's unit (the series stay in hours); the axis title names the unit.
        most = max([*series["allocated"], *series["used"], 0.0])
        unit, per_hour = axis_unit(most)
        ticks = nice_ticks(most * per_hour)
        y_axis = self.y_axes[key]
        with y_axis.scale.hold_sync():
            y_axis.scale.min, y_axis.scale.max = 0.0, ticks[-1]
        y_axis.label, y_axis.tick_values = unit, np.array(ticks)
        for name, bars in self.bars[key].items():
            with bars.hold_sync():
                bars.x = series["x"]
                bars.y = [round(v * per_hour, DIGITS[unit]) for v in series[name]]
                if bars.tooltip is not None:
                    bars.tooltip.labels = [bars.tooltip.labels[0], f"{name} ({unit})"]
        fig.title = title
        fig.layout.display = None
        self.series[key] = series
        self.legend.value = LEGEND

    def _hide(self, key: str) -> None:
        self.figures[key].layout.display = "none"
        self.series.pop(key, None)
        if not self.series:
            self.legend.value = ""

    def _render_mine(self, data: dict[str, Any]) -> None:
        self.periods = period_rows(data)
        notes = []
        for kind, (_, what) in KINDS.items():
            series = daily_series(data, kind)
            if any(series["allocated"]) or any(series["used"]):
                self._show(kind, series, f"{what} per day, last {len(series['labels'])} days")
            else:
                self._hide(kind)
                notes.append(f"No {what} in the last 30 days.")
        anything = any(r["sessions"] for r in self.periods) or len(notes) < len(KINDS)
        if not anything:
            self.summary.value = ""
            self.empty.value = (
                "<i>No usage yet: the GPU- and CPU-hours of your sessions show here once they have run.</i>"
            )
            return
        self.summary.value = self._table(self.periods)
        self.empty.value = "".join(f"<div><i>{esc(n)}</i></div>" for n in notes)

    def _render_report(self, data: dict[str, Any]) -> None:
        what = KINDS[self.metric][1]
        series = report_series(data, self.metric)
        group_by = data.get("group_by") or self.group_by
        bucket = data.get("bucket") or self.bucket
        span = f"{time_label(data.get('start'), 'hour')} to {time_label(data.get('end'), 'hour')}"
        per = (
            f"per {group_by.replace('_', ' ')}"
            if bucket == "none"
            else f"per {bucket} (all {group_by.replace('_', ' ')}s)"
        )
        total_a, total_u = sum(series["allocated"]), sum(series["used"])
        self.summary.value = (
            f"<div>{esc(what.replace('-hours', ' time'))} {esc(per)}, {esc(span)}: {esc(fmt_hours(total_u))} used of "
            f"{esc(fmt_hours(total_a))} allocated"
            + (f" ({esc(fmt_percent(100 * total_u / total_a))})" if total_a else "")
            + "</div>"
        )
        if series["labels"] and (total_a or total_u):
            self._show("report", series, f"{what} {per}")
            self.empty.value = ""
        else:
            self._hide("report")
            self.empty.value = f"<i>No {esc(what)} from {esc(span)}.</i>"

    @staticmethod
    def _table(periods: list[dict[str, Any]]) -> str:
        """The periods as an HTML table: used of allocated hours, and the share used, per kind."""
        head = "".join(f"<th style='text-align:left;padding:0 12px'>{esc(w)}</th>" for _, w in KINDS.values())
        body = []
        for p in periods:
            cells = []
            for kind in KINDS:
                k = p[kind]
                share = f" ({fmt_percent(100 * k['efficiency'])})" if k["efficiency"] is not None else ""
                cells.append(
                    f"<td style='padding:0 12px'>{esc(fmt_hours(k['used']))} used of "
                    f"{esc(fmt_hours(k['allocated']))}{esc(share)}</td>"
                )
            n = p["sessions"]
            label = f"{p['label']} ({n} session{'' if n == 1 else 's'})"
            body.append(f"<tr><td>{esc(label)}</td>{''.join(cells)}</tr>")
        return f"<table class='lf-usage-table'><tr><th></th>{head}</tr>{''.join(body)}</table>"
