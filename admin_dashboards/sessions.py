"""The Sessions page: every session in the viewer's reach, filtered by status and user, and a Stop.

Sessions are named as people know them, ``user/server`` (the default server as ``user/(default)``),
with the id as a muted detail (its first 8 characters, the whole id in the title). A model-serving
endpoint's replica (an inference session the serving controller started as a named server of the
endpoint's owner; the service names the endpoint in the session's view, ``endpoint``) shows as
"replica of endpoint X" and has no Stop: the controller would only start it again; the Serving page scales the endpoint.
Stop asks first (:func:`labfleet.console.console.confirm_first`) and acts as the viewer
(``DELETE /api/sessions/{id}``); monitors read only.

Pure helpers first (plain dicts in, plain values and HTML out, unit-tested without a kernel);
:func:`page` at the bottom builds the widgets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import quote

import ipywidgets as W

from labfleet.console.console import (
    ServiceError,
    base_url,
    confirm_first,
    grid,
    guarded,
    message,
)
from labfleet.console.console import (
    client as current_client,
)
from labfleet.core.display import esc
from labfleet.core.vocab import FINAL_STATUSES, LIVE_STATUSES, SESSION_STATUSES

LIVE = "(live)"
STATUSES = (LIVE, *SESSION_STATUSES)
COLUMNS = ("session", "project", "group", "type", "status", "slots", "")
DEFAULT_SERVER = "(default)"
_MUTED = "color: var(--jp-ui-font-color2, #757575); font-size: 0.85em"


# ---------------------------------------------------------------- naming (pure)


def session_label(user: Any, name: Any) -> str:
    """``alice/train`` for alice's server ``train``; ``alice/(default)`` for her default server."""
    return f"{user}/{name or DEFAULT_SERVER}"


def session_html(sid: Any, user: Any, name: Any, replica_of: str | None = None) -> str:
    """A session's cell: ``user/server`` (the whole id in its title), the id's first 8 characters
    muted beside it, and under it which endpoint it is a replica of, if it is one."""
    sid = str(sid or "")
    label = session_label(user, name)
    replica = (
        f'<div class="lf-replica-of" style="{_MUTED}">replica of endpoint <b>{esc(replica_of)}</b></div>'
        if replica_of
        else ""
    )
    return (
        f'<span class="lf-session" data-session="{esc(sid)}" title="session {esc(sid)}">{esc(label)}</span> '
        f'<span class="lf-session-id" title="{esc(sid)}" style="{_MUTED}">{esc(sid[:8])}</span>{replica}'
    )


def live_only(items: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [s for s in items if s.get("status") in LIVE_STATUSES]


def slots_text(slots: Mapping[str, Any] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted((slots or {}).items()))


def stoppable(s: Mapping[str, Any]) -> bool:
    return s.get("status") not in FINAL_STATUSES


# ---------------------------------------------------------------- the page (widgets)


def serving_link(endpoint: str) -> W.HTML:
    """Where a replica's Stop would be: the Serving page, which scales its endpoint."""
    w = W.HTML(
        f'<span class="lf-replica-note" style="{_MUTED}">scale endpoint <b>{esc(endpoint)}</b> on the '
        f'<a href="{esc(base_url())}serving" style="color: var(--jp-brand-color1, #1976d2)">'
        "Serving page</a></span>"
    )
    return w


def stop_button(s: Mapping[str, Any], enabled: bool, act: Callable[[], Any], say: Any) -> W.Button:
    label = session_label(s.get("user"), s.get("name"))
    b = W.Button(
        description="Stop",
        button_style="danger",
        tooltip=f"Stop session {s.get('id')}",
        layout=W.Layout(width="120px"),
        disabled=not enabled,
    )
    b.add_class("lf-stop")
    warning = f"Stop {label}? Its server and kernels end, and what they hold is released."
    return confirm_first(b, act, warning, say)


def page(client: Any = None) -> W.VBox:
    """Filters (status, user), the message line, and the sessions' grid, built again on each change."""
    status = W.Dropdown(options=list(STATUSES), value=LIVE, description="Status")
    user = W.Text(description="User", placeholder="any")
    out = W.VBox()
    note = W.HTML()

    def say(text: str, error: bool) -> None:
        note.value = message(text, error=error).value

    def stop(s: Mapping[str, Any]) -> Callable[[], Any]:
        def run() -> None:
            c = client or current_client()
            label = session_label(s.get("user"), s.get("name"))
            try:
                c.delete(f"/sessions/{quote(str(s['id']), safe='')}")
                say(f"Stopped session {label} ({s['id']}).", False)
            except ServiceError as e:
                say(f"The labfleet service said: {e.message}", True)
            refresh()

        return run

    def rows() -> W.Widget:
        c = client or current_client()
        chosen = None if status.value == LIVE else status.value
        items: list[Mapping[str, Any]] = c.everything(
            "/sessions", status=chosen, user=user.value.strip() or None
        )
        if chosen is None:
            items = live_only(items)
        if not items:
            return message("No session matches.")
        lines = []
        for s in items:
            endpoint = s.get("endpoint")  # the service says whose replica a session is
            action: W.Widget = (
                serving_link(endpoint)
                if endpoint
                else stop_button(s, c.can_change and stoppable(s), stop(s), say)
            )
            lines.append(
                [
                    W.HTML(session_html(s.get("id"), s.get("user"), s.get("name"), endpoint)),
                    s.get("project", ""),
                    s.get("resource_group", ""),
                    s.get("type", ""),
                    s.get("status", ""),
                    slots_text(s.get("slots")),
                    action,
                ]
            )
        return grid(list(COLUMNS), lines)

    def refresh(*_: Any) -> None:
        out.children = [guarded(rows)]

    status.observe(refresh, "value")
    user.observe(refresh, "value")
    refresh()
    return W.VBox([W.HBox([status, user]), note, out])
