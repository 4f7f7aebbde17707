"""GPUMonitor: live GPU utilization and memory of this session, one row per GPU, plus CPU and memory."""

from __future__ import annotations

from typing import Any

import ipywidgets as W
from traitlets import Float

from labfleet.core.display import esc, fmt_bytes, fmt_percent, fmt_slot, number

from .base import FleetWidget
from .format import bar


def usage_rows(usage: dict[str, Any]) -> list[dict[str, Any]]:
    """``GET labfleet/usage`` as rows (pure): CPU, memory, then each GPU with its share of the device.

    A GPU's memory bar is against the session's limit on it (its share of the device), or the device's
    total where no limit applies; a utilization of None (the driver cannot tell) shows as n/a.
    """
    cpu = usage.get("cpu") or {}
    mem = usage.get("memory") or {}
    cores = number(cpu.get("limit")) or None
    rows: list[dict[str, Any]] = [
        {
            "kind": "cpu",
            "label": "CPU",
            "percent": cpu.get("percent"),
            "max_percent": 100.0 * cores if cores else None,
            "text": f"{fmt_percent(cpu.get('percent'))} of one core"
            + (f" (limit: {fmt_slot('cpu', cores)} core{'' if cores == 1 else 's'})" if cores else ""),
        },
        {
            "kind": "memory",
            "label": "Memory",
            "used": mem.get("used"),
            "limit": mem.get("limit"),
            "text": f"{fmt_bytes(mem.get('used'))} of {fmt_bytes(mem['limit'])}"
            if mem.get("limit")
            else f"{fmt_bytes(mem.get('used'))} (no limit)",
        },
    ]
    for g in usage.get("gpus") or []:
        limit = g.get("memory_limit") or g.get("memory_total")
        share = number(g.get("shares"))
        rows.append(
            {
                "kind": "gpu",
                "label": f"GPU {g.get('index', '?')}",
                "uuid": g.get("uuid"),
                "index": g.get("index"),
                "model": g.get("model"),
                "shares": g.get("shares"),
                "source": g.get("source"),
                "utilization": g.get("utilization"),
                "memory_used": g.get("memory_used"),
                "memory_limit": limit,
                "text": f"{g.get('model') or 'GPU'}, "
                + ("whole device" if share >= 1 else f"{fmt_slot('gpu.shares', share)} of the device")
                + (" (mock)" if g.get("source") == "mock" else ""),
            }
        )
    return rows


class GPUMonitor(FleetWidget):
    """This session's GPUs (utilization and memory), CPU and memory, refreshed every couple of seconds."""

    title = "This session's resources"
    refresh_interval = Float(2.0, help="Seconds between automatic refreshes (0: only the first load).")

    def __init__(self, client: Any = None, refresh_interval: float | None = None, **kwargs: Any) -> None:
        self.rows: list[dict[str, Any]] = []
        self.at: str | None = None
        self.bars: dict[str, W.FloatProgress] = {}  # "cpu", "memory", "gpu:<uuid>:util", "gpu:<uuid>:mem"
        self.labels: dict[str, W.HTML] = {}
        self._lines: dict[str, W.HBox] = {}
        self._heads: dict[str, W.HTML] = {}
        self.table = W.VBox()
        self.no_gpu = W.HTML("")
        super().__init__(client, refresh_interval, **kwargs)
        self.children = [self.header, self.table, self.no_gpu, self.error_box]

    async def fetch(self) -> dict[str, Any]:
        return await self.client.usage()

    def render(self, usage: dict[str, Any]) -> None:
        rows = usage_rows(usage)
        lines = []
        for row in rows:
            if row["kind"] == "cpu":
                max_percent = row["max_percent"] or 100.0
                lines.append(
                    self._bar_line("cpu", "CPU", row["percent"], max_percent, row["text"], neutral=True)
                )
            elif row["kind"] == "memory":
                lines.append(self._bar_line("memory", "Memory", row["used"], row["limit"], row["text"]))
            else:
                key = f"gpu:{row['uuid']}"
                head = self._heads.setdefault(key, W.HTML())
                head.value = f"<b>{esc(row['label'])}</b> &middot; {esc(row['text'])}"
                lines.append(head)
                util = row["utilization"]
                lines.append(
                    self._bar_line(key + ":util", "utilization", util, 100.0, fmt_percent(util), neutral=True)
                )
                used, limit = row["memory_used"], row["memory_limit"]
                mem_text = f"{fmt_bytes(used)} of {fmt_bytes(limit)}" if limit else fmt_bytes(used)
                lines.append(self._bar_line(key + ":mem", "memory", used, limit, mem_text))
        self.table.children = lines
        self.no_gpu.value = "" if usage.get("gpus") else "<i>No GPU in this session.</i>"
        self.rows = rows
        self.at = usage.get("at")

    def _bar_line(
        self, key: str, label: str, used: Any, limit: Any, words: str, neutral: bool = False
    ) -> W.HBox:
        """One labelled bar, reused across refreshes. Utilization near 100 % is no fault, so those bars
        stay neutral; memory bars warn near their limit (past it the process is killed)."""
        if key not in self._lines:
            self.bars[key] = W.FloatProgress(value=0.0, min=0.0, max=1.0, layout=W.Layout(width="220px"))
            self.labels[key] = W.HTML()
            self._lines[key] = W.HBox(
                [W.HTML(layout=W.Layout(width="110px")), self.bars[key], self.labels[key]]
            )
        line, progress = self._lines[key], self.bars[key]
        line.children[0].value = esc(label)
        self.labels[key].value = esc(words)
        if limit:
            b = bar(used, limit)
            progress.max, progress.value = b["max"], b["value"]
            progress.bar_style = "info" if neutral else b["bar_style"]
            progress.layout.display = None
        else:
            progress.layout.display = "none"
        return line
