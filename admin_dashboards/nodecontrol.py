"""The Resources page's node switches: let new sessions land on a node, or drain it.

A drained node takes no new session; the ones running there stay until they end (``PATCH
/api/nodes/{name}`` with ``{"schedulable": false}``, a superadmin's action, audited by the service
with the viewer as the actor). A LOST node takes nothing whatever its switch says: its agent stopped
answering. Pure helpers first (what a node's state reads as, what a click sends), then the widgets.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import quote

import ipywidgets as W

from labfleet.console.console import STYLE, ServiceError, message


def placement_state(node: Mapping[str, Any]) -> str:
    """``takes sessions``, ``drained`` or ``takes nothing (LOST)``: whether placement may pick it."""
    status = str(node.get("status") or "")
    if status != "ALIVE":
        return f"takes nothing ({status or 'unknown'})"
    return "takes sessions" if node.get("schedulable", True) else "drained"


def switch_body(node: Mapping[str, Any]) -> dict[str, bool]:
    """What a click on the node's switch sends: the opposite of its ``schedulable`` now."""
    return {"schedulable": not bool(node.get("schedulable", True))}


def switch_text(node: Mapping[str, Any]) -> str:
    """The button's words: what it will do."""
    return "Undrain" if not node.get("schedulable", True) else "Drain"


def done_text(name: str, schedulable: bool) -> str:
    if schedulable:
        return f"Node {name} takes new sessions again."
    return f"Node {name} is drained: no new session lands there; running ones stay until they end."


def _row(node: Mapping[str, Any], can_change: bool, on_click: Callable[[Any], None]) -> W.HBox:
    name = str(node.get("name", ""))
    state = placement_state(node)
    badge = "lf-badge-ok" if state == "takes sessions" else "lf-badge-bad"
    label = W.HTML(
        f'{STYLE}<div class="lf-admin"><b>{html.escape(name)}</b> '
        f'<span class="lf-badge {badge} lf-node-state">{html.escape(state)}</span></div>',
        layout=W.Layout(width="420px"),
    )
    button = W.Button(
        description=switch_text(node),
        icon="pause" if node.get("schedulable", True) else "play",
        disabled=not can_change,
        tooltip="" if can_change else "Only a superadmin drains nodes",
        layout=W.Layout(width="120px"),
    )
    button.add_class(f"lf-node-switch-{name}")
    button.on_click(on_click)
    return W.HBox([label, button])


def node_switches(client: Any, nodes: Iterable[Mapping[str, Any]], done: Callable[[str], None]) -> W.VBox:
    """A row per node with its switch; ``done(text)`` after the service took a change (the page
    redraws itself with ``text``). Disabled for anyone but a superadmin; the service refuses
    others anyway, and its refusal shows here in its own words."""
    said = W.VBox()
    can_change = client.role == "superadmin"
    rows = []
    for node in nodes:

        def click(_: Any, node: Mapping[str, Any] = node) -> None:
            name = str(node.get("name", ""))
            body = switch_body(node)
            try:
                client.patch(f"/nodes/{quote(name, safe='')}", body)
            except ServiceError as e:
                said.children = [message(f"The labfleet service said: {e.message}", error=True)]
                return
            done(done_text(name, body["schedulable"]))

        rows.append(_row(node, can_change, click))
    if not rows:
        return W.VBox([message("No node in reach.")])
    return W.VBox([*rows, said])
