"""The Scheduler page: each resource group's queue, where each session stands and why it waits.

The queue comes from ``GET /api/scheduler/queue?resource_group=NAME`` (as the viewer: the service
shows a domain admin only their domain's sessions, while positions count every session in the
queue, so a domain admin may see positions 2 and 5 and nothing between). Why a session waits is
said twice: its ``status_reason`` as the service wrote it (which capacity, or which limit), and
what the group's nodes have free right now against what the session asks (``GET /api/nodes``),
worked out here by :func:`capacity_note` so an admin sees at once whether it is short of whole
GPUs, of a large enough fraction of one, of CPU or of memory, or whether it would fit now (and a
limit, or the next queue pass, is what it waits for).

Pure helpers first (plain dicts in, plain values and HTML/SVG text out, unit-tested without a
kernel); :func:`page` at the bottom builds the widgets, with a cancel button per session
(``DELETE /api/sessions/{id}`` after a second click, disabled for monitors). Sessions are named
``user/server`` (:func:`labfleet.console.sessions.session_label`), their id a muted detail.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

import ipywidgets as W

from labfleet.console.console import Say, ServiceError, confirm_first, grid, refreshable_page
from labfleet.console.resources import muted, section
from labfleet.console.sessions import session_html, session_label
from labfleet.core.capacity import judge
from labfleet.core.display import (
    esc,
    fmt_duration,
    fmt_slots,
    fmt_timeout,
    number,
    seconds_since,
)


def capacity_note(
    slots: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]], placement: str = "pack"
) -> str:
    """What the group's ``nodes`` (``GET /api/nodes``, this group's) have free now against ``slots``
    (:func:`labfleet.core.capacity.judge`): when it fits, a limit or the next queue pass holds it."""
    verdict = judge(slots, nodes, placement)
    if verdict.fits:
        return f"{verdict.note}: the next pass of the queue places it, unless a limit holds it back"
    return verdict.note


# ---------------------------------------------------------------- the queue (pure)


@dataclass(frozen=True)
class QueueRow:
    """One waiting session as the page shows it."""

    position: int
    id: str
    user: str
    name: str  # the Hub server's name ("" for the default server)
    project: str
    domain: str
    type: str
    asks: str
    waited: float  # seconds since it was queued
    cancel_in: float | None  # seconds until the group's pending timeout cancels it; None: never
    reason: str  # the service's status_reason
    capacity: str  # capacity_note: what the nodes have free against what it asks


def waited_seconds(created_at: Any, now: datetime) -> float:
    """Seconds since ``created_at`` (ISO; naive is UTC), 0 for a time in the future or none."""
    ago = seconds_since(created_at, now)
    return 0.0 if ago is None else ago


def queue_rows(
    entries: Iterable[Mapping[str, Any]],
    group: Mapping[str, Any],
    nodes: Sequence[Mapping[str, Any]],
    now: datetime,
) -> list[QueueRow]:
    """``GET /api/scheduler/queue`` entries of ``group`` as rows, by position.

    ``nodes``: every node in reach (only ``group``'s are read); ``now``: the time waits count to.
    """
    mine = [n for n in nodes if n.get("resource_group") == group.get("name")]
    placement = str(group.get("placement") or "pack")
    timeout = int(number(group.get("pending_timeout")))
    rows = []
    for e in entries:
        waited = waited_seconds(e.get("created_at"), now)
        slots = e.get("slots") or {}
        rows.append(
            QueueRow(
                position=int(number(e.get("position"))),
                id=str(e.get("id", "")),
                user=str(e.get("user", "")),
                name=str(e.get("name") or ""),
                project=str(e.get("project", "")),
                domain=str(e.get("domain", "")),
                type=str(e.get("type", "")),
                asks=fmt_slots(slots),
                waited=waited,
                cancel_in=max(timeout - waited, 0.0) if timeout > 0 else None,
                reason=str(e.get("status_reason") or ""),
                capacity=capacity_note(slots, mine, placement),
            )
        )
    return sorted(rows, key=lambda r: (r.position, r.id))


# The waiting bars' scales: the smallest of these that holds the longest wait (and the timeout).
SCALES = (60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400, 30 * 86400)


def nice_scale(seconds: float) -> float:
    """The scale of a group's waiting bars: 1 min, 5 min, 15 min, 1 h, 6 h, 1 d, 1 week, 30 d, or more."""
    return float(next((s for s in SCALES if s >= seconds), max(seconds, 1.0)))


def wait_bar_svg(row: QueueRow, scale: float, timeout: float = 0) -> str:
    """A small bar of how long ``row`` has waited, on a common ``scale`` (seconds) for its group;
    with a pending ``timeout``, a red mark where the service cancels it (the bar turns orange past
    80 % of it)."""
    width, height = 140, 12
    scale = max(scale, timeout, row.waited, 1.0)
    w = width * min(row.waited / scale, 1.0)
    late = timeout > 0 and row.waited >= 0.8 * timeout
    fill = "var(--jp-warn-color1, #f57c00)" if late else "var(--jp-brand-color1, #1976d2)"
    mark = ""
    if timeout > 0:
        x = width * min(timeout / scale, 1.0)
        mark = (
            f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{height}" '
            'style="stroke: var(--jp-error-color1, #d32f2f); stroke-width: 2"/>'
        )
    return (
        f'<svg class="lf-wait" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'style="vertical-align: middle; margin-right: 6px">'
        f'<rect x="0" y="2" width="{width}" height="{height - 4}" rx="3" '
        'style="fill: var(--jp-layout-color3, #e0e0e0)"/>'
        f'<rect x="0" y="2" width="{w:.1f}" height="{height - 4}" rx="3" style="fill: {fill}"/>{mark}</svg>'
    )


def waiting_html(row: QueueRow, scale: float, timeout: float = 0) -> str:
    """The waiting cell: the bar, how long, and when the pending timeout cancels it."""
    then = (
        f'<div class="lf-muted">cancelled in {esc(fmt_duration(row.cancel_in))} (pending timeout)</div>'
        if row.cancel_in is not None
        else ""
    )
    return f"<div>{wait_bar_svg(row, scale, timeout)}{esc(fmt_duration(row.waited))}</div>{then}"


def why_html(row: QueueRow) -> str:
    """The why cell: the service's reason, then what the nodes have free against what it asks."""
    return (
        f'<div class="lf-why">{esc(row.reason or "waiting")}</div>'
        f'<div class="lf-muted lf-capacity">now: {esc(row.capacity)}</div>'
    )


@dataclass(frozen=True)
class GroupQueue:
    """A group's queue as the page shows it: its settings and its rows (those in the viewer's reach)."""

    name: str
    scheduler: str
    placement: str
    pending_timeout: int
    rows: tuple[QueueRow, ...]

    @property
    def oldest(self) -> float:
        return max((r.waited for r in self.rows), default=0.0)


def group_queue(
    group: Mapping[str, Any],
    entries: Iterable[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]],
    now: datetime,
) -> GroupQueue:
    return GroupQueue(
        name=str(group.get("name")),
        scheduler=str(group.get("scheduler") or "fifo"),
        placement=str(group.get("placement") or "pack"),
        pending_timeout=int(number(group.get("pending_timeout"))),
        rows=tuple(queue_rows(entries, group, nodes, now)),
    )


def queues_chart_svg(queues: Sequence[GroupQueue]) -> str:
    """Every group at a glance: a bar of its waiting sessions (in reach) and the oldest wait."""
    label_w, bar_w, row_h = 160, 300, 24
    top = 4
    most = max((len(q.rows) for q in queues), default=0) or 1
    height = top + row_h * max(len(queues), 1) + 4
    width = label_w + bar_w + 220
    out = [
        f'<svg class="lf-queues" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'style="font-family: var(--jp-ui-font-family, sans-serif); font-size: 12px; max-width: 100%">'
    ]
    for i, q in enumerate(queues):
        y = top + row_h * i
        w = bar_w * len(q.rows) / most
        n = len(q.rows)
        text = f"{n} waiting" + (f", oldest {fmt_duration(q.oldest)}" if n else "")
        out.append(
            f'<g class="lf-queue" data-group="{esc(q.name)}" data-waiting="{n}">'
            f'<text x="{label_w - 10}" y="{y + 16}" text-anchor="end" '
            f'style="fill: var(--jp-ui-font-color1, #212121)">{esc(q.name)}</text>'
            f'<rect x="{label_w}" y="{y + 5}" width="{bar_w}" height="14" rx="2" '
            'style="fill: var(--jp-layout-color2, #eeeeee)"/>'
            f'<rect x="{label_w}" y="{y + 5}" width="{w:.1f}" height="14" rx="2" '
            'style="fill: var(--jp-brand-color1, #1976d2)"/>'
            f'<text x="{label_w + bar_w + 8}" y="{y + 16}" '
            f'style="fill: var(--jp-ui-font-color2, #757575)">{esc(text)}</text></g>'
        )
    out.append("</svg>")
    return "".join(out)


COLUMNS = ("#", "session", "project", "type", "asks", "waiting", "why it waits", "")


# ---------------------------------------------------------------- the page (widgets)


def cancel_button(row: QueueRow, enabled: bool, on_click: Any, say: Say | None = None) -> W.Button:
    """The cancel button of a queued session (its tooltip names the session, for people and tests).
    With ``say``, it asks first (:func:`confirm_first`): ``on_click(None)`` runs on the second click."""
    b = W.Button(
        description="Cancel",
        button_style="danger",
        icon="times",
        tooltip=f"Cancel session {row.id}",
        disabled=not enabled,
        layout=W.Layout(width="130px"),  # room for "Really cancel?"
    )
    b.add_class("lf-cancel")
    if say is None:
        b.on_click(on_click)
        return b
    warning = (
        f"Cancel {session_label(row.user, row.name)} (queued at position {row.position})? "
        "It leaves the queue for good."
    )
    return confirm_first(b, lambda: on_click(None), warning, say)


def queue_grid(q: GroupQueue, can_change: bool, cancel: Any, say: Say | None = None) -> W.Widget:
    """A group's queue as a grid of rows with their cancel buttons (asking first, given ``say``);
    a line when it is empty."""
    if not q.rows:
        return muted("Nobody waits here (of the sessions you may see).")
    scale = nice_scale(max(q.oldest, q.pending_timeout))
    lines = []
    for r in q.rows:
        lines.append(
            [
                W.HTML(f"<b>{r.position}</b>"),
                W.HTML(session_html(r.id, r.user, r.name)),
                r.project,
                r.type,
                r.asks,
                W.HTML(waiting_html(r, scale, q.pending_timeout)),
                W.HTML(why_html(r), layout=W.Layout(max_width="460px")),
                cancel_button(r, can_change, cancel(r), say),
            ]
        )
    return grid(list(COLUMNS), lines)


def page(client: Any) -> W.VBox:
    """The whole Scheduler page below its header: every group's queue, refreshed after a cancel."""
    can_change = client.can_change

    def build(say: Say, refresh: Callable[[], None]) -> W.VBox:
        def cancel(row: QueueRow) -> Any:
            def run(_: Any) -> None:
                try:
                    answer = client.delete(f"/sessions/{quote(row.id, safe='')}")
                except ServiceError as e:
                    say(f"The labfleet service said: {e.message}", True)
                else:
                    status = (answer or {}).get("status", "CANCELLED")
                    say(
                        f"Cancelled session {session_label(row.user, row.name)} ({row.id}, position "
                        f"{row.position}): it is {status} now.",
                        False,
                    )
                refresh()

            return run

        now = datetime.now(timezone.utc)
        groups = client.get("/resource-groups")
        nodes = client.everything("/nodes")
        queues = [
            group_queue(g, client.get("/scheduler/queue", resource_group=g["name"]), nodes, now)
            for g in groups
        ]
        queues.sort(key=lambda q: (not q.rows, q.name))  # the queues where someone waits first
        waiting = sum(len(q.rows) for q in queues)
        parts: list[W.Widget] = [
            muted(
                f"{waiting} session{'' if waiting == 1 else 's'} waiting; {len(queues)} resource "
                f"group{'' if len(queues) == 1 else 's'} in reach. Positions count every session in a "
                "queue, also those you may not see."
            )
        ]
        if not can_change:
            parts.append(muted("Read only: a monitor changes nothing (the cancel buttons are disabled)."))
        if len(queues) > 1:  # one group's bar would only repeat its own heading
            parts.append(W.HTML(queues_chart_svg(queues)))
        for q in queues:
            bars = (
                f"; the bars span {fmt_duration(nice_scale(max(q.oldest, q.pending_timeout)))}"
                if q.rows
                else ""
            )
            parts.append(
                section(
                    f"Queue of {q.name}",
                    f"scheduler {q.scheduler}, placement {q.placement}, pending timeout: "
                    f"{fmt_timeout(q.pending_timeout)}; {len(q.rows)} waiting{bars}.",
                )
            )
            parts.append(queue_grid(q, can_change, cancel, say))
        return W.VBox(parts)

    return refreshable_page(build)
