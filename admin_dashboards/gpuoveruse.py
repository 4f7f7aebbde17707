"""The Resources page's "Sessions over their GPU share": each live fractional session whose GPU
memory, measured outside the session by the trusted sampler, is above its share of its device, and
what the service last did about it.

The figures come from the service, read as the viewer, so a domain admin sees only their domain's
sessions and a monitor reads everything: ``GET /api/sessions`` (each session's device, its share
and the device's memory, its status reason), ``GET /api/usage/live`` (the sampler's last reading
of each live session) and, only when a session is over, the ``session.gpu-overuse`` entries of
``GET /api/audit``. The service itself judges and acts (``labfleet.usage.overuse`` and
``enforce``: over the share plus a tolerance, 2 samples in a row, by the group's ``gpu_overuse``
policy); this page shows the measured state as it is now. Pure builders first, then the widgets.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import ipywidgets as W

from labfleet.console.console import ServiceError
from labfleet.console.resources import STYLE, section
from labfleet.core.display import esc, fmt_ago, fmt_bytes, number, trim
from labfleet.core.vocab import HOLDING_STATUSES

OVERUSE_AUDIT = "session.gpu-overuse"  # the audit action of each act on a session over its share


def last_overuse_action(entries: Iterable[Mapping[str, Any]], status_reason: Any, now: datetime) -> str:
    """What the service last did to a session over its share: its newest ``session.gpu-overuse``
    audit entry (``entries``, that session's, newest first) as ``kill, 2 min ago: killed 4242
    (python train.py, 30 GiB)`` (and which were not killed, and why); else its status reason when
    that is the backstop's; else ``none yet`` (a kill queued for a node's agent is audited once the
    agent reports it)."""
    for e in entries:
        d = e.get("details") or {}
        action = str(d.get("action") or "?")
        text = f"{action}, {fmt_ago(e.get('timestamp'), now)}"
        if d.get("wanted"):
            text += f" (wanted {d['wanted']}: {d.get('why_not') or 'not possible'})"
        killed = [
            f"{k.get('pid')} ({str(k.get('cmdline') or '')[:60]}, {fmt_bytes(k.get('mem_bytes'))})"
            for k in d.get("killed") or ()
        ]
        if killed:
            text += ": killed " + ", ".join(killed)
        missed = [
            f"{k.get('pid')} ({k.get('error') or 'no reason given'})" for k in d.get("not_killed") or ()
        ]
        if missed:
            text += ("; " if killed else ": ") + "not killed " + ", ".join(missed)
        return text
    reason = str(status_reason or "")
    if reason.startswith("gpu-overuse"):
        return reason if len(reason) <= 240 else reason[:239] + "…"
    return "none yet"


def overuse_rows(
    sessions: Iterable[Mapping[str, Any]],
    live: Iterable[Mapping[str, Any]],
    audit: Iterable[Mapping[str, Any]],
    now: datetime,
) -> list[dict[str, Any]]:
    """A row per live fractional session whose GPU memory, as the trusted sampler last measured it
    (``live``: ``GET /api/usage/live``), is above its share of its device (``shares`` x the device's
    memory, as ``sessions`` from ``GET /api/sessions`` say), most over first.

    A fraction is of one device only, so the session's GPU memory is what it holds on that device.
    Sessions holding whole devices, nothing now, or not measured are left out. ``audit`` holds
    ``session.gpu-overuse`` entries, newest first: each row's last action (:func:`last_overuse_action`).
    """
    readings = {str(r.get("session")): r for r in live}
    acts: dict[str, list[Mapping[str, Any]]] = {}
    for e in audit:
        if e.get("action") == OVERUSE_AUDIT:
            acts.setdefault(str(e.get("target")), []).append(e)
    rows: list[dict[str, Any]] = []
    for s in sessions:
        sid = str(s.get("id", ""))
        devices = s.get("devices") or []
        reading = readings.get(sid)
        if s.get("status") not in HOLDING_STATUSES or len(devices) != 1 or reading is None:
            continue
        d = devices[0]
        shares = number(d.get("shares"))
        if not 0 < shares < 1 or reading.get("gpu_mem") is None:
            continue
        held = int(number(reading.get("gpu_mem")))
        share_bytes = int(shares * number(d.get("memory")))
        if held <= share_bytes:
            continue
        rows.append(
            {
                "session": sid,
                "name": str(s.get("name") or ""),
                "user": str(s.get("user", "")),
                "project": str(s.get("project", "")),
                "group": str(s.get("resource_group") or ""),
                "node": str(s.get("node") or ""),
                "device": f"GPU {int(number(d.get('index')))} ({d.get('model') or '?'})",
                "uuid": str(d.get("uuid") or ""),
                "shares": shares,
                "share_bytes": share_bytes,
                "held_bytes": held,
                "measured": fmt_ago(reading.get("sampled_at"), now),
                "action": last_overuse_action(acts.get(sid, ()), s.get("status_reason"), now),
            }
        )
    rows.sort(key=lambda r: (r["share_bytes"] - r["held_bytes"], r["session"]))
    return rows


def overuse_html(rows: Sequence[Mapping[str, Any]]) -> str:
    """The sessions over their GPU share as an HTML table; ``none`` when no session is over."""
    if not rows:
        return (
            '<div class="lf-admin lf-overuse-none">none<span class="lf-muted">: no live fractional session '
            "in reach holds more GPU memory than its share.</span></div>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in ("user", "session", "node / device", "share", "held", "over by", "last action")
    )
    body = []
    for r in rows:
        over = r["held_bytes"] - r["share_bytes"]
        body.append(
            f"<tr class='lf-over' data-session='{esc(r['session'])}' data-user='{esc(r['user'])}' "
            f"data-share-bytes='{r['share_bytes']}' data-held-bytes='{r['held_bytes']}'>"
            f"<td><b>{esc(r['user'])}</b><div class='lf-muted'>{esc(r['project'])}</div></td>"
            f"<td>{esc(r['name'] or r['session'])}<div class='lf-muted'>{esc(r['session'])}</div></td>"
            f"<td>{esc(r['node'])} · {esc(r['device'])}<div class='lf-muted'>{esc(r['uuid'])}</div></td>"
            f"<td style='white-space: nowrap' title='{r['share_bytes']} bytes'>{esc(fmt_bytes(r['share_bytes']))}"
            f"<div class='lf-muted'>{esc(trim(r['shares']))} of the device</div></td>"
            f"<td style='white-space: nowrap' title='{r['held_bytes']} bytes'><span class='lf-badge lf-badge-bad'>"
            f"{esc(fmt_bytes(r['held_bytes']))}</span><div class='lf-muted'>measured {esc(r['measured'])}</div></td>"
            f"<td style='white-space: nowrap'>{esc(fmt_bytes(over))}</td>"
            f"<td>{esc(r['action'])}</td>"
            "</tr>"
        )
    return f'<div class="lf-admin"><table class="lf-table lf-overuse"><tr>{head}</tr>{"".join(body)}</table></div>'


def overuse_audit(client: Any) -> list[dict[str, Any]]:
    """The newest ``session.gpu-overuse`` audit entries the viewer may read (none when refused)."""
    try:
        return list(client.get("/audit", action=OVERUSE_AUDIT, limit=1000) or [])
    except ServiceError:
        return []


def overuse_section(client: Any, sessions: Sequence[Mapping[str, Any]], now: datetime) -> list[W.Widget]:
    """The section's heading and table, from ``sessions`` (those holding now, already read) and the
    service's live readings (and its audit, when a session is over)."""
    live = client.everything("/usage/live")
    rows = overuse_rows(sessions, live, (), now)
    if rows:  # what the service did about them
        rows = overuse_rows(sessions, live, overuse_audit(client), now)
    return [
        section(
            "Sessions over their GPU share",
            "GPU memory measured outside each fractional session; the service acts on one past its share "
            "plus a tolerance for 2 samples in a row, by its group's policy (below).",
        ),
        W.HTML(STYLE + overuse_html(rows)),
    ]
