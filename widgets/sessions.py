"""Sessions: my sessions in every project, with their status (a queued one shows its position), a link to
open each one and a button to stop it."""

from __future__ import annotations

from typing import Any

import ipywidgets as W
from traitlets import Float

from labfleet.core.display import esc, fmt_slot, sort_slots

from .base import FleetWidget, error_message

_STATUS_COLOURS = {"RUNNING": "#1b7f3b", "PENDING": "#a86400", "ERROR": "#b00020"}


def status_text(s: dict[str, Any]) -> str:
    """``RUNNING``; ``PENDING (queue position 2): short of CPU ...`` (why it waits now); the reason
    where the service gives one (pure)."""
    out = str(s.get("status") or "?")
    if out == "PENDING" and s.get("queue_position"):
        out += f" (queue position {s['queue_position']})"
    why = (s.get("waiting_for") if out.startswith("PENDING") else None) or s.get("status_reason")
    if why and out != "RUNNING":
        out += f": {why}"
    return out


def slots_text(slots: dict[str, Any] | None) -> str:
    slots = slots or {}
    return ", ".join(f"{k} {fmt_slot(k, slots[k])}" for k in sort_slots(slots)) or "-"


def session_rows(sessions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The list as the widget shows it (pure): this session first, then by name."""
    rows = [
        {
            "id": s.get("id"),
            "name": s.get("name") or "",
            "label": s.get("name") or "(default)",
            "project": s.get("project"),
            "type": s.get("type") or "interactive",
            "status": s.get("status"),
            "status_text": status_text(s),
            "queue_position": s.get("queue_position"),
            "slots": slots_text(s.get("slots")),
            "url": s.get("url"),
            "current": bool(s.get("current")),
        }
        for s in sessions
    ]
    return sorted(rows, key=lambda r: (not r["current"], r["name"]))


class Sessions(FleetWidget):
    """My sessions with their status, an open link and a stop button each.

    The session the notebook runs in is marked and its stop button is disabled: stopping it from inside
    would end this kernel too (stop it from the Hub's home page).
    """

    title = "My sessions"
    refresh_interval = Float(5.0, help="Seconds between automatic refreshes (0: only the first load).")

    def __init__(self, client: Any = None, refresh_interval: float | None = None, **kwargs: Any) -> None:
        self.rows: list[dict[str, Any]] = []
        self.stop_buttons: dict[str, W.Button] = {}
        self._lines: dict[str, W.HBox] = {}
        self.table = W.VBox()
        self.empty = W.HTML("")
        super().__init__(client, refresh_interval, **kwargs)
        self.children = [self.header, self.table, self.empty, self.message_box, self.error_box]

    async def fetch(self) -> list[dict[str, Any]]:
        return await self.client.sessions()

    def render(self, sessions: list[dict[str, Any]]) -> None:
        rows = session_rows(sessions)
        lines = []
        for row in rows:
            line = self._line(row["name"])
            name, project, status, slots, _ = line.children
            label = esc(row["label"]) + (" <i>(this one)</i>" if row["current"] else "")
            if row["url"]:
                label = f'<a href="{esc(row["url"])}" target="_blank" rel="noopener">{label}</a>'
            name.value = label
            project.value = f"{esc(row['project'])} &middot; {esc(row['type'])}"
            colour = _STATUS_COLOURS.get(str(row["status"]), "inherit")
            status.value = f'<span style="color: {colour}">{esc(row["status_text"])}</span>'
            slots.value = esc(row["slots"])
            button = self.stop_buttons[row["name"]]
            if row["current"]:
                button.disabled = True
                button.tooltip = "this notebook runs in it: stop it from the Hub's home page"
            lines.append(line)
        gone = set(self._lines) - {r["name"] for r in rows}
        for name in gone:
            line = self._lines.pop(name)
            for child in line.children:
                child.close()
            line.close()
            self.stop_buttons.pop(name)
        self.table.children = lines
        self.empty.value = "" if rows else "<i>No sessions.</i>"
        self.rows = rows

    def _line(self, name: str) -> W.HBox:
        if name not in self._lines:
            button = W.Button(
                description="Stop", icon="stop", button_style="danger", layout=W.Layout(width="80px")
            )
            button.on_click(lambda b, name=name: self.busy(b, lambda: self.stop(name)))
            self.stop_buttons[name] = button
            self._lines[name] = W.HBox(
                [
                    W.HTML(layout=W.Layout(width="150px")),
                    W.HTML(layout=W.Layout(width="190px")),
                    W.HTML(layout=W.Layout(width="260px")),
                    W.HTML(layout=W.Layout(width="230px")),
                    button,
                ]
            )
        return self._lines[name]

    async def stop(self, name: str) -> bool:
        """Stop my session ``name`` (``""``: the default server); the outcome shows in the widget."""
        label = name or "(default)"
        try:
            await self.client.stop_session(name)
        except Exception as e:
            self.show_message(f"could not stop {label}: {error_message(e)}", error=True)
            return False
        self.show_message(f"Stopped session {label}.")
        await self.refresh()
        return True
