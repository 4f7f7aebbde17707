"""The Maintenance page: the announcement banner, and recalculating the usage ledger.

Everything goes to the labfleet service as the viewer (:func:`labfleet.console.console.client`):

- **Announcement**: what shows now (``GET /api/announcement``), drawn as the Hub draws it; a form
  that publishes a new one (``PUT /api/announcement`` ``{"text", "level"}``) or takes it down
  (``DELETE``). It shows at once on the Hub's pages and, at its next refresh, in every Fleet sidebar.
- **Recalculate usage** (``POST /api/maintenance/recalculate-usage``): a dry run first, which lists
  every ledger row that differs from what the live sessions hold (the drift table) and the servers
  the Hub runs with no live session (what they hold is accounted nowhere); the repair, which rebuilds
  those rows and stops those servers, is offered only after a dry run found something.
- What the service does on its own clock (folder scans, trash purges, reconciling sessions with the
  Hub) has no button: the API has no such action; the Information page shows those jobs' runs.

Only a superadmin changes anything here; a domain admin and a monitor see why the buttons are
disabled, and the service refuses their requests anyway (403).

Pure helpers first (plain dicts in, HTML text out, unit-tested without a kernel); :func:`page`
builds the widgets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

import ipywidgets as W

from labfleet.console.console import ServiceError, guarded, message, table
from labfleet.console.resources import muted, section
from labfleet.core.display import esc, fmt_ago, number, parse_time, trim

LEVELS = ("info", "warning")
MAX_TEXT = 2000  # the service's own bound (labfleet.tenancy.announcements)
AUDITED = ("announcement.publish", "announcement.clear", "maintenance.recalculate-usage")
DRIFT_COLUMNS = ("scope", "kind", "slot", "ledger said", "sessions hold", "difference")
UNACCOUNTED_COLUMNS = ("user", "server", "started", "last active", "its last session")

# The Hub's alert colours (Bootstrap 5's alert-info and alert-warning), for the preview.
ALERT = {
    "info": ("#cff4fc", "#055160", "#9eeaf9"),
    "warning": ("#fff3cd", "#664d03", "#ffe69c"),
}

STYLE = """<style>
.lf-banner { border: 1px solid; border-radius: 6px; padding: 12px 16px; text-align: center;
  white-space: pre-line; font-family: var(--jp-ui-font-family, sans-serif); font-size: 14px; line-height: 1.5;
  max-width: 900px; overflow-wrap: anywhere; }
.lf-none { color: var(--jp-ui-font-color2, #757575); font-style: italic; }
.lf-admin .lf-muted { line-height: 1.45; }
table.lf-drift td.lf-num { text-align: right; font-variant-numeric: tabular-nums; }
.lf-maint-form .widget-label { min-width: 90px; }
</style>"""


# ---------------------------------------------------------------- pure


def read_only_reason(role: str) -> str:
    """Why the viewer may not run maintenance ("" for a superadmin, who may)."""
    if role == "superadmin":
        return ""
    if role == "monitor":
        return "Read only: a monitor changes nothing."
    return "Read only: only a superadmin publishes announcements and repairs the ledger."


def banner_html(announcement: Mapping[str, Any] | None) -> str:
    """The announcement as the Hub's pages show it (its alert colours), or a line saying there is none.

    The text is escaped: an announcement is plain text, whatever it contains."""
    if not announcement or not str(announcement.get("text") or "").strip():
        return f'{STYLE}<div class="lf-admin lf-none lf-banner-none">No announcement is shown now.</div>'
    level = str(announcement.get("level")) if announcement.get("level") in LEVELS else "info"
    bg, fg, edge = ALERT[level]
    who = announcement.get("published_by")
    at = parse_time(announcement.get("published_at"))
    since = at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if at else ""
    meta = "Published" + (f" by {esc(who)}" if who else "") + (f" on {since}" if since else "") + "."
    return (
        f'{STYLE}<div class="lf-admin"><div class="lf-banner" data-level="{esc(level)}" '
        f'style="background: {bg}; color: {fg}; border-color: {edge}">{esc(announcement.get("text"))}</div>'
        f'<div class="lf-muted" style="margin-top: 4px">{meta} It shows on the Hub\'s pages and at the '
        "top of every Fleet sidebar.</div></div>"
    )


def fmt_amount(slot: str, value: Any) -> str:
    """A ledger amount in the slot's unit, as people read it (memory in GiB, counts whole)."""
    x = number(value)
    if slot.split(":")[0] == "mem":
        return f"{trim(x / 2**30, 3)} GiB"
    if slot.startswith("@"):
        return str(int(x))
    return trim(x, 3)


def drift_rows(drift: Iterable[Mapping[str, Any]]) -> list[list[str]]:
    """The drift table's rows: scope, its kind, slot, what the ledger said, what the sessions hold,
    the difference (sessions minus ledger), in the slot's unit."""
    rows = []
    for d in drift:
        slot = str(d.get("slot", ""))
        stored, true = number(d.get("stored_amount")), number(d.get("true_amount"))
        diff = true - stored
        rows.append(
            [
                str(d.get("scope", "")),
                str(d.get("scope_kind", "")),
                slot,
                fmt_amount(slot, stored),
                fmt_amount(slot, true),
                ("+" if diff > 0 else "") + fmt_amount(slot, diff),
            ]
        )
    return rows


def drift_html(answer: Mapping[str, Any]) -> str:
    """The result of a recalculation (dry run or repair) as a summary line and the drift table."""
    drift = list(answer.get("drift") or ())
    dry = bool(answer.get("dry_run"))
    if not drift:
        return (
            f'{STYLE}<div class="lf-admin lf-ok lf-drift-none">No drift: the usage ledger matches what the '
            "live sessions hold.</div>"
        )
    n = len(drift)
    head = (
        f"Dry run: {n} ledger row{'' if n == 1 else 's'} differ{'s' if n == 1 else ''} from the live "
        "sessions. Nothing was changed."
        if dry
        else f"Repaired {answer.get('repaired', n)} ledger row{'' if n == 1 else 's'}; it matched the "
        "sessions again."
    )
    cols = "".join(f"<th>{esc(c)}</th>" for c in DRIFT_COLUMNS)
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=lf-num' if i >= 3 else ''}>{esc(v)}</td>" for i, v in enumerate(r))
        + "</tr>"
        for r in drift_rows(drift)
    )
    cls = "lf-error" if dry else "lf-ok"
    return (
        f'{STYLE}<div class="lf-admin"><div class="{cls}" style="margin-bottom: 4px">{esc(head)}</div>'
        f'<table class="lf-table lf-drift"><tr>{cols}</tr>{body}</table></div>'
    )


def unaccounted_rows(
    servers: Iterable[Mapping[str, Any]], now: datetime, repaired: bool = False
) -> list[list[str]]:
    """The table of Hub servers running no live session: user, server, when it started and was last
    active, its newest session's end (status: reason), and, after a repair, whether it was stopped."""
    rows = []
    for s in servers:
        last = s.get("last_session") if isinstance(s.get("last_session"), Mapping) else None
        ended = "none" if last is None else f"{last.get('status', '')}: {last.get('status_reason') or '-'}"
        row = [
            str(s.get("user", "")),
            str(s.get("server") or "(default)"),
            fmt_ago(s.get("started"), now),
            fmt_ago(s.get("last_activity"), now),
            ended,
        ]
        if repaired:
            row.append("stopped" if s.get("stopped") else "the Hub refused")
        rows.append(row)
    return rows


def unaccounted_html(answer: Mapping[str, Any], now: datetime) -> str:
    """What a recalculation says of the Hub's servers: none unaccounted, a table of those that are
    (a dry run) or were stopped (a repair), or that the Hub could not be read."""
    servers = answer.get("unaccounted_servers")
    if servers is None:
        return muted("The Hub's servers could not be read: they were not checked.").value
    if not servers:
        return (
            f'{STYLE}<div class="lf-admin lf-ok lf-unaccounted-none">Every server the Hub runs holds a '
            "live session.</div>"
        )
    n = len(servers)
    some = f"{n} server{'' if n == 1 else 's'}"
    dry = bool(answer.get("dry_run"))
    head = (
        f"The Hub runs {some} with no live session: what they hold is in no ledger row. "
        "The repair stops them."
        if dry
        else f"Asked the Hub to stop {some} that ran with no live session (audited as server.stop_orphan)."
    )
    cols = [*UNACCOUNTED_COLUMNS, *(["stop"] if not dry else [])]
    head_row = "".join(f"<th>{esc(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{esc(v)}</td>" for v in r) + "</tr>"
        for r in unaccounted_rows(servers, now, repaired=not dry)
    )
    cls = "lf-error" if dry else "lf-ok"
    return (
        f'{STYLE}<div class="lf-admin"><div class="{cls}" style="margin: 8px 0 4px">{esc(head)}</div>'
        f'<table class="lf-table lf-unaccounted"><tr>{head_row}</tr>{body}</table></div>'
    )


def history_rows(entries: Iterable[Mapping[str, Any]], now: datetime, limit: int = 8) -> list[list[str]]:
    """The newest maintenance entries of the audit log: when, who, what, and a word on it."""

    def word(e: Mapping[str, Any]) -> str:
        d = e.get("details") or {}
        action = e.get("action")
        if action == "announcement.publish":
            text = str(d.get("text") or "")
            return f"{d.get('level', '')}: {text[:60]}{'…' if len(text) > 60 else ''}"
        if action == "announcement.clear":
            return "taken down" if d.get("id") else "nothing to take down"
        if action == "maintenance.recalculate-usage":
            said = f"{'dry run, ' if d.get('dry_run') else ''}{d.get('drift', 0)} row(s) of drift"
            if "unaccounted_servers" in d:
                said += f", {d['unaccounted_servers']} server(s) with no live session"
            return said
        return ""

    ordered = sorted(entries, key=lambda e: str(e.get("timestamp") or ""), reverse=True)[:limit]
    return [
        [fmt_ago(e.get("timestamp"), now), str(e.get("actor", "")), str(e.get("action", "")), word(e)]
        for e in ordered
    ]


# ---------------------------------------------------------------- the page (widgets)


def announcement_box(client: Any, said: Callable[[str, bool], None]) -> W.VBox:
    """The announcement in force, and the form that replaces it or takes it down."""
    why = read_only_reason(client.role)
    current = (client.get("/announcement") or {}).get("announcement")
    shown = W.HTML(banner_html(current))
    text = W.Textarea(
        value=str(current.get("text") or "") if current else "",
        placeholder="e.g. Maintenance on Friday 18:00-20:00 UTC: sessions will be stopped. Save your work.",
        description="Text",
        layout=W.Layout(width="640px", height="84px"),
        disabled=bool(why),
    )
    text.add_class("lf-announcement-text")
    level = W.Dropdown(
        options=LEVELS,
        value=current.get("level") if current and current.get("level") in LEVELS else "info",
        description="Level",
        layout=W.Layout(width="220px"),
        disabled=bool(why),
    )
    publish = W.Button(
        description="Publish",
        button_style="primary",
        icon="bullhorn",
        disabled=bool(why),
        tooltip="Show this text on the Hub's pages and in every Fleet sidebar",
    )
    clear = W.Button(
        description="Clear",
        icon="times",
        disabled=bool(why) or not current,
        tooltip="Take the announcement down",
    )

    def do_publish(_: Any) -> None:
        try:
            client.request("PUT", "/announcement", json={"text": text.value, "level": level.value})
        except ServiceError as e:
            said(f"The labfleet service said: {e.message}", True)
            return
        said(
            "Published: the announcement shows on the Hub's pages now, and in each Fleet sidebar at its next refresh.",
            False,
        )

    def do_clear(_: Any) -> None:
        try:
            client.delete("/announcement")
        except ServiceError as e:
            said(f"The labfleet service said: {e.message}", True)
            return
        said("Cleared: no announcement is shown any more.", False)

    publish.on_click(do_publish)
    clear.on_click(do_clear)
    parts: list[W.Widget] = [shown]
    if why:
        parts.append(muted(why))
    form = W.VBox(
        [
            text,
            W.HBox([level, publish, clear], layout=W.Layout(align_items="center", grid_gap="8px")),
            muted(f"Plain text (no HTML), at most {MAX_TEXT} characters; line breaks are kept."),
        ]
    )
    form.add_class("lf-maint-form")
    return W.VBox([*parts, form])


def recalc_box(client: Any, done: Callable[[], None]) -> W.VBox:
    """Recalculate usage: a dry run shows the drift; the repair comes after it, when there is any.
    ``done()`` runs after each answer (the page's history follows)."""
    why = read_only_reason(client.role)
    result = W.HTML()
    dry = W.Button(
        description="Check for drift (dry run)",
        icon="search",
        disabled=bool(why),
        layout=W.Layout(width="230px"),
        tooltip="Compare the ledger with the live sessions; change nothing",
    )
    repair = W.Button(
        description="Repair the ledger",
        icon="wrench",
        disabled=True,
        layout=W.Layout(width="180px"),
        tooltip="Rebuild the ledger rows that differ and stop the Hub's servers that run no live session "
        "(after a dry run)",
    )

    def run(dry_run: bool) -> None:
        try:
            answer = client.post("/maintenance/recalculate-usage", {"dry_run": dry_run})
        except ServiceError as e:
            result.value = message(f"The labfleet service said: {e.message}", error=True).value
            repair.disabled, repair.button_style = True, ""
            return
        result.value = drift_html(answer) + unaccounted_html(answer, datetime.now(timezone.utc))
        # Offered only after a dry run that found something; coloured only when it can be pressed.
        repair.disabled = not (dry_run and (answer.get("drift") or answer.get("unaccounted_servers")))
        repair.button_style = "" if repair.disabled else "warning"
        done()

    dry.on_click(lambda _: run(True))
    repair.on_click(lambda _: run(False))
    parts: list[W.Widget] = [
        muted(
            "The ledger holds what every domain, project, user, keypair and resource group has in use; "
            "admission checks quotas against it. A dry run compares it with the live sessions, lists "
            "the servers the Hub runs with no live session, and changes nothing; the repair rebuilds "
            "the rows that differ and stops those servers (audited)."
        ),
        W.HBox([dry, repair], layout=W.Layout(grid_gap="8px")),
        result,
    ]
    if why:
        parts.insert(1, muted(why))
    return W.VBox(parts)


def history_box(client: Any) -> W.Widget:
    now = datetime.now(timezone.utc)
    entries: list[Mapping[str, Any]] = []
    for action in AUDITED:
        entries += client.get("/audit", action=action, limit=8) or []
    rows = history_rows(entries, now)
    if not rows:
        return muted("Nothing yet (of the entries you may read).")
    return table(["when", "who", "action", "what"], rows)


def page(client: Any) -> W.VBox:
    """The whole Maintenance page below its header; it rebuilds itself after a change."""
    out = W.VBox()
    flash = W.HTML()
    history = W.VBox()

    def reload_history() -> None:
        history.children = [guarded(lambda: history_box(client))]

    refresh_button = W.Button(description="Refresh", icon="refresh", layout=W.Layout(width="110px"))

    def said(text: str, error: bool) -> None:
        flash.value = message(text, error=error).value if text else ""
        if text and not error:
            refresh(keep=True)

    def build() -> W.VBox:
        return W.VBox(
            [
                section(
                    "Announcement",
                    "A banner on the Hub's pages (home, spawn, token, admin, ...) and at the top of the "
                    "Fleet sidebar in every JupyterLab session.",
                ),
                announcement_box(client, said),
                section("Recalculate usage", "Rebuild the usage ledger from the live sessions."),
                recalc_box(client, reload_history),
                section(
                    "On the service's clock",
                    "Folder scans and trash purges (housekeeping), reconciling sessions with the Hub's "
                    "servers, queue service and usage sampling run by themselves; the API has no button "
                    "for them. Their runs and failures are on the Information page.",
                ),
                section("Recent maintenance", "From the audit log, newest first."),
                history,
            ]
        )

    def refresh(*_: Any, keep: bool = False) -> None:
        if not keep:
            flash.value = ""
        out.children = [guarded(build)]
        reload_history()

    refresh_button.on_click(refresh)
    refresh()
    return W.VBox([refresh_button, flash, out])
