"""The Information page: a status board of the fleet's parts, and their versions.

One request, ``GET /api/info`` (admins and monitors), checked when it is asked: the DB (a query's
round trip, its server's version, the schema revision), the Hub's REST API as the labfleet service
reaches it (its version, whether it takes the service's token), the service itself (uptime, its
periodic jobs with their runs and failures), and the nodes in the viewer's reach (status, last
heard from). The board's cards are green, amber or red; the tables under it say the details.

Pure helpers first (the answer in, HTML text out, unit-tested without a kernel); :func:`page`
builds the widgets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import ipywidgets as W

from labfleet.console.console import guarded
from labfleet.console.resources import muted, section
from labfleet.core.display import esc, fmt_ago, fmt_duration, number, trim

# The versions people ask about first, in this order; the rest follow by name.
FIRST = ("labfleet", "JupyterHub", "JupyterLab", "Voila", "SQLAlchemy", "Alembic", "Python")
TONE = {
    "ok": "ok",
    "ALIVE": "ok",
    "degraded": "warn",
    "not configured": "warn",
    "DISABLED": "warn",
    "failed": "bad",
    "LOST": "bad",
}

STYLE = """<style>
.lf-board { display: flex; flex-wrap: wrap; gap: 12px; margin: 10px 0 4px 0;
  font-family: var(--jp-ui-font-family, sans-serif); line-height: 1.4; }
.lf-tile { border: 1px solid var(--jp-border-color2, #e0e0e0); border-left-width: 6px; border-radius: 4px;
  padding: 8px 14px; min-width: 200px; max-width: 300px; background: var(--jp-layout-color1, #fff);
  color: var(--jp-ui-font-color1, #212121); }
.lf-tile.lf-tone-ok { border-left-color: var(--jp-success-color1, #388e3c); }
.lf-tile.lf-tone-warn { border-left-color: var(--jp-warn-color1, #f57c00); }
.lf-tile.lf-tone-bad { border-left-color: var(--jp-error-color1, #d32f2f); }
.lf-tile .lf-tile-name { font-weight: 600; }
.lf-tile .lf-tile-state { font-size: 1.35em; font-weight: 600; margin: 2px 0; }
.lf-tone-ok .lf-tile-state { color: var(--jp-success-color1, #388e3c); }
.lf-tone-warn .lf-tile-state { color: var(--jp-warn-color1, #f57c00); }
.lf-tone-bad .lf-tile-state { color: var(--jp-error-color1, #d32f2f); }
.lf-tile .lf-tile-line { color: var(--jp-ui-font-color2, #616161); font-size: 0.9em; overflow-wrap: anywhere; }
.lf-pill { padding: 1px 8px; border-radius: 9px; font-size: 0.85em; font-weight: 600; }
.lf-pill-ok { background: var(--md-green-100, #c8e6c9); color: var(--md-green-900, #1b5e20); }
.lf-pill-warn { background: var(--md-orange-100, #ffe0b2); color: var(--md-orange-900, #e65100); }
.lf-pill-bad { background: var(--md-red-100, #ffcdd2); color: var(--md-red-900, #b71c1c); }
.lf-admin .lf-muted { color: var(--jp-ui-font-color2, #757575); font-size: 0.9em; line-height: 1.45; }
</style>"""


# ---------------------------------------------------------------- pure


def tone(status: Any) -> str:
    """``ok``, ``warn`` or ``bad`` for a status word of the service's answer."""
    return TONE.get(str(status), "warn")


def pill(status: Any) -> str:
    return f'<span class="lf-pill lf-pill-{tone(status)}">{esc(status)}</span>'


def fmt_ms(value: Any) -> str:
    return "—" if value is None else f"{trim(number(value), 1)} ms"


def tiles(info: Mapping[str, Any], now: datetime) -> list[tuple[str, str, str, list[str]]]:
    """The board: (part, its status word, its tone, lines) for the fleet, the service, the DB, the
    Hub's API and the nodes."""
    db = info.get("database") or {}
    hub = info.get("hub") or {}
    svc = info.get("service") or {}
    node_list = list(info.get("nodes") or ())
    alive = sum(1 for n in node_list if n.get("status") == "ALIVE")
    failing = [j for j in svc.get("jobs") or () if j.get("failures")]
    nodes_status = "ok" if node_list and alive == len(node_list) else ("failed" if not alive else "degraded")
    out = [
        (
            "Fleet",
            str(info.get("status", "")),
            tone(info.get("status")),
            [f"checked {fmt_ago(info.get('checked_at'), now)}"],
        ),
        (
            "labfleet service",
            str(svc.get("status", "")),
            tone(svc.get("status")) if not failing else "warn",
            [
                f"up {fmt_duration(svc.get('uptime'))} on {svc.get('node', '')} (pid {svc.get('pid', '')})",
                f"{len(svc.get('jobs') or ())} jobs"
                + (f"; {len(failing)} with failures" if failing else ", none failing"),
            ],
        ),
        (
            "Database",
            str(db.get("status", "")),
            tone(db.get("status")),
            [
                str(db.get("server_version") or db.get("dialect") or ""),
                f"round trip {fmt_ms(db.get('round_trip_ms'))}",
                f"schema {db.get('schema_revision')}"
                + (
                    ""
                    if db.get("schema_revision") == db.get("schema_head")
                    else f" (code wants {db.get('schema_head')})"
                ),
            ],
        ),
        (
            "Hub API",
            str(hub.get("status", "")),
            tone(hub.get("status")),
            [
                f"JupyterHub {hub.get('version')}" if hub.get("version") else "version unknown",
                f"round trip {fmt_ms(hub.get('round_trip_ms'))}",
                *([str(hub.get("message"))] if hub.get("status") != "ok" else []),
            ],
        ),
        (
            "Nodes",
            f"{alive} of {len(node_list)} alive",
            tone(nodes_status),
            [f"{sum(int(number(n.get('devices'))) for n in node_list)} devices in reach"],
        ),
    ]
    return out


def board_html(info: Mapping[str, Any], now: datetime) -> str:
    cards = []
    for name, state, t, lines in tiles(info, now):
        body = "".join(f'<div class="lf-tile-line">{esc(line)}</div>' for line in lines if line)
        cards.append(
            f'<div class="lf-tile lf-tone-{t}" data-part="{esc(name)}" data-tone="{t}">'
            f'<div class="lf-tile-name">{esc(name)}</div><div class="lf-tile-state">{esc(state)}</div>{body}</div>'
        )
    return f'{STYLE}<div class="lf-board">{"".join(cards)}</div>'


def version_rows(info: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(component, version): the packages first in FIRST's order, the running Hub and the DB server."""
    versions = dict(info.get("versions") or {})
    order = [k for k in FIRST if k in versions] + sorted(k for k in versions if k not in FIRST)
    rows = [(k, versions[k] or "not installed") for k in order]
    hub = (info.get("hub") or {}).get("version")
    rows.insert(2 if len(rows) >= 2 else len(rows), ("JupyterHub (the running Hub)", hub or "unknown"))
    db = info.get("database") or {}
    rows.append(("DB server", str(db.get("server_version") or "unknown")))
    rows.append(("DB driver", f"{db.get('dialect', '')}+{db.get('driver', '')}"))
    rows.append(("DB schema", f"{db.get('schema_revision')} (this code: {db.get('schema_head')})"))
    return rows


def table_html(columns: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "", raw: int = -1) -> str:
    """A table; column ``raw`` holds HTML already (a pill), the rest is escaped."""
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{v if i == raw else esc(v)}</td>" for i, v in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f'{STYLE}<div class="lf-admin"><table class="lf-table {cls}"><tr>{head}</tr>{body}</table></div>'


def node_rows(info: Mapping[str, Any], now: datetime) -> list[list[str]]:
    return [
        [
            str(n.get("name", "")),
            str(n.get("resource_group", "")),
            pill(n.get("status")),
            str(n.get("plugin") or "—"),
            str(n.get("devices", 0)),
            fmt_ago(n.get("last_seen"), now),
        ]
        for n in info.get("nodes") or ()
    ]


def job_rows(info: Mapping[str, Any]) -> list[list[str]]:
    out = []
    for j in (info.get("service") or {}).get("jobs") or ():
        every = number(j.get("interval"))
        out.append(
            [
                str(j.get("name", "")),
                f"every {fmt_duration(every)}" if every else "when poked",
                str(j.get("runs", 0)) + (" (running)" if j.get("running") else ""),
                str(j.get("failures", 0)),
                str(j.get("last_error") or "—"),
            ]
        )
    return out


# ---------------------------------------------------------------- the page (widgets)


def page(client: Any) -> W.VBox:
    """The whole Information page below its header, with a refresh button."""
    out = W.VBox()
    refresh_button = W.Button(description="Check again", icon="refresh", layout=W.Layout(width="130px"))

    def build() -> W.VBox:
        now = datetime.now(timezone.utc)
        info = client.get("/info")
        return W.VBox(
            [
                W.HTML(board_html(info, now)),
                section("Versions", "What the labfleet service runs with, the Hub it talks to, and its DB."),
                W.HTML(table_html(["component", "version"], version_rows(info), "lf-versions")),
                section(
                    "Nodes",
                    "As the fleet records them: status, and when each registered or last reported (the "
                    "service registers its own node when it starts; node agents report on their clock).",
                ),
                W.HTML(
                    table_html(
                        ["node", "resource group", "status", "device plugin", "devices", "last heard from"],
                        node_rows(info, now),
                        "lf-nodes",
                        raw=2,
                    )
                    if info.get("nodes")
                    else muted("No node in reach.").value
                ),
                section("The service's jobs", "What the labfleet service runs on its own clock."),
                W.HTML(
                    table_html(["job", "every", "runs", "failures", "last error"], job_rows(info), "lf-jobs")
                ),
                muted(
                    f"Database: {(info.get('database') or {}).get('message', '')}. "
                    f"Hub API: {(info.get('hub') or {}).get('message', '')}."
                ),
            ]
        )

    def refresh(*_: Any) -> None:
        out.children = [guarded(build)]

    refresh_button.on_click(refresh)
    refresh()
    return W.VBox([refresh_button, out])
