"""QuotaMeter: used / left per resource slot for me (my keypair), this session's project and my domain."""

from __future__ import annotations

from typing import Any

import ipywidgets as W
from traitlets import Float

from labfleet.core.display import esc, fmt_slot, number, slot_name, sort_slots, used_of

from .base import FleetWidget
from .format import bar, level

SCOPES = ("keypair", "project", "domain")
SCOPE_LABELS = {"keypair": "Me", "project": "Project", "domain": "Domain"}


def quota_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """``GET labfleet/quota`` as one row per scope and slot (pure).

    A ``left`` of None means unlimited: the row has ``limit`` None and no bar. Where the service gave no
    ``left`` for a slot, the limit decides (a slot its policy does not name follows ``unspecified``).
    """
    rows = []
    for scope in SCOPES:
        r = data.get(scope) or {}
        limit, used = r.get("limit") or {}, r.get("used") or {}
        left = r.get("left") or {}
        unlimited_unspecified = (r.get("unspecified") or "UNLIMITED") == "UNLIMITED"
        for slot in sort_slots(set(limit) | set(used) | set(left)):
            if slot in left:
                cap = (
                    None
                    if left[slot] is None
                    else limit.get(slot, number(used.get(slot)) + number(left[slot]))
                )
            elif slot in limit:
                cap = limit[slot]
            else:
                cap = None if unlimited_unspecified else 0
            amount = used.get(slot, 0)
            rows.append(
                {
                    "scope": scope,
                    "scope_label": _scope_label(scope, data),
                    "slot": slot,
                    "used": amount,
                    "limit": cap,
                    "left": None if cap is None else max(number(cap) - number(amount), 0),
                    "level": level(amount, cap),
                    "text": used_of(slot, amount, cap),
                }
            )
    return rows


def _scope_label(scope: str, data: dict[str, Any]) -> str:
    name = data.get(f"{scope}_name") if scope in ("project", "domain") else None
    return f"{SCOPE_LABELS[scope]} {name}" if name else SCOPE_LABELS[scope]


class QuotaMeter(FleetWidget):
    """Quota bars for me, my project and my domain; a bar turns warning at 80 % and danger when full."""

    title = "Quota"
    refresh_interval = Float(10.0, help="Seconds between automatic refreshes (0: only the first load).")

    def __init__(self, client: Any = None, refresh_interval: float | None = None, **kwargs: Any) -> None:
        self.rows: list[dict[str, Any]] = []
        self.project_name: str | None = None
        # One set of controls per (scope, slot), kept across refreshes: only their traits change.
        self.bars: dict[tuple[str, str], W.FloatProgress] = {}
        self.labels: dict[tuple[str, str], W.HTML] = {}
        self._lines: dict[tuple[str, str], W.HBox] = {}
        self.table = W.VBox()
        super().__init__(client, refresh_interval, **kwargs)
        self.children = [self.header, self.table, self.error_box]

    async def fetch(self) -> dict[str, Any]:
        return await self.client.quota()

    def render(self, data: dict[str, Any]) -> None:
        rows = quota_rows(data)
        lines: list[W.Widget] = []
        scope = None
        for row in rows:
            key = (row["scope"], row["slot"])
            if row["scope"] != scope:
                scope = row["scope"]
                lines.append(W.HTML(f"<b>{esc(row['scope_label'])}</b>"))
            line = self._line(key)
            progress, label = self.bars[key], self.labels[key]
            line.children[0].value = esc(slot_name(row["slot"]))
            if row["limit"] is None:
                # Unlimited: no bar, the word says it.
                progress.layout.display = "none"
                label.value = f"{esc(fmt_slot(row['slot'], row['used']))} used &middot; <i>unlimited</i>"
            else:
                b = bar(row["used"], row["limit"])
                progress.max = b["max"]
                progress.value = b["value"]
                progress.bar_style = b["bar_style"]
                progress.layout.display = None
                label.value = esc(row["text"])
            lines.append(line)
        self.table.children = lines
        self.rows = rows
        self.project_name = data.get("project_name")

    def _line(self, key: tuple[str, str]) -> W.HBox:
        if key not in self._lines:
            self.bars[key] = W.FloatProgress(value=0.0, min=0.0, max=1.0, layout=W.Layout(width="220px"))
            self.labels[key] = W.HTML()
            self._lines[key] = W.HBox(
                [W.HTML(layout=W.Layout(width="110px")), self.bars[key], self.labels[key]]
            )
        return self._lines[key]

    def bar_for(self, scope: str, slot: str) -> W.FloatProgress | None:
        """The bar of one row, or None when that row is unlimited (it shows no bar)."""
        row = next((r for r in self.rows if r["scope"] == scope and r["slot"] == slot), None)
        if row is None or row["limit"] is None:
            return None
        return self.bars[(scope, slot)]
