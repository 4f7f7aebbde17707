"""VFolderBrowser: my virtual folders and the ones shared with me, with permission and usage against each
folder's limit; upload files into one, create a new one.

Uploads go through the widget's comm, so they suit small files (configs, samples); big data goes in with
the Lab's file browser into ``~/vfolders/<name>`` or the service's resumable upload API.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as W
from traitlets import Float

from labfleet.core.display import esc, fmt_bytes, number
from labfleet.core.vocab import FOLDER_RIGHTS

from .base import FleetWidget, error_message
from .format import bar


def owner_text(owner: str, me: bool) -> str:
    kind, _, name = str(owner or "").partition(":")
    if me:
        return "mine"
    if kind == "project":
        return f"project {name}"
    if kind == "user":
        return f"shared by {name}"
    return str(owner or "")


def folder_rows(folders: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The service's folder views as the widget shows them (pure). A ``max_size`` of 0 means no limit."""
    rows = []
    for f in folders:
        usage = number((f.get("usage") or {}).get("bytes"))
        limit = number((f.get("limits") or {}).get("max_size")) or None
        b = bar(usage, limit) if limit else None
        rows.append(
            {
                "id": f["id"],
                "name": f.get("name"),
                "owner": owner_text(f.get("owner", ""), bool(f.get("is_owner"))),
                "permission": f.get("permission"),
                "writable": f.get("permission") in ("rw", "wd") and f.get("status", "READY") == "READY",
                "usage": int(usage),
                "limit": int(limit) if limit else None,
                "level": b["level"] if b else "ok",
                "text": f"{fmt_bytes(usage)} of {fmt_bytes(limit)}"
                if limit
                else f"{fmt_bytes(usage)} (no limit)",
            }
        )
    return rows


class VFolderBrowser(FleetWidget):
    """Folders with a usage bar each, an upload into the chosen folder, and a new-folder field."""

    title = "Virtual folders"
    refresh_interval = Float(30.0, help="Seconds between automatic refreshes (0: only the first load).")

    def __init__(self, client: Any = None, refresh_interval: float | None = None, **kwargs: Any) -> None:
        self.rows: list[dict[str, Any]] = []
        self.bars: dict[str, W.FloatProgress] = {}
        self._lines: dict[str, W.HBox] = {}
        self.table = W.VBox()
        self.target = W.Dropdown(description="Upload into", style={"description_width": "90px"})
        self.upload_button = W.FileUpload(description="Upload", multiple=True)
        self.new_name = W.Text(placeholder="new folder name", layout=W.Layout(width="200px"))
        self.create_button = W.Button(description="Create", icon="folder")
        super().__init__(client, refresh_interval, **kwargs)
        self.upload_button.observe(self._files_chosen, "value")
        self.create_button.on_click(lambda b: self.busy(b, lambda: self.create(self.new_name.value)))
        self.children = [
            self.header,
            self.table,
            W.HBox([self.target, self.upload_button]),
            W.HBox([self.new_name, self.create_button]),
            self.message_box,
            self.error_box,
        ]

    async def fetch(self) -> list[dict[str, Any]]:
        return await self.client.vfolders()

    def render(self, folders: list[dict[str, Any]]) -> None:
        rows = folder_rows(folders)
        lines = []
        for row in rows:
            line = self._line(row["id"])
            name, owner, progress, usage = line.children
            name.value = f"<b>{esc(row['name'])}</b>"
            permission = FOLDER_RIGHTS.get(str(row["permission"]), str(row["permission"] or "no access"))
            owner.value = f"{esc(row['owner'])} &middot; {esc(permission)}"
            if row["limit"]:
                b = bar(row["usage"], row["limit"])
                progress.max, progress.value, progress.bar_style = b["max"], b["value"], b["bar_style"]
                progress.layout.display = None
            else:
                progress.layout.display = "none"
            usage.value = esc(row["text"])
            lines.append(line)
        for gone in set(self._lines) - {r["id"] for r in rows}:
            line = self._lines.pop(gone)
            for child in line.children:
                child.close()
            line.close()
            self.bars.pop(gone, None)
        self.table.children = lines
        keep = self.target.value
        writable = [(str(r["name"]), str(r["id"])) for r in rows if r["writable"]]
        self.target.options = writable
        values = [v for _, v in writable]
        self.target.value = keep if keep in values else (values[0] if values else None)
        self.upload_button.disabled = not writable or self.upload_button in self.busy_buttons
        self.rows = rows

    def _line(self, folder_id: str) -> W.HBox:
        if folder_id not in self._lines:
            self.bars[folder_id] = W.FloatProgress(
                value=0.0, min=0.0, max=1.0, layout=W.Layout(width="180px")
            )
            self._lines[folder_id] = W.HBox(
                [
                    W.HTML(layout=W.Layout(width="160px")),
                    W.HTML(layout=W.Layout(width="260px")),
                    self.bars[folder_id],
                    W.HTML(),
                ]
            )
        return self._lines[folder_id]

    def _files_chosen(self, change: dict[str, Any]) -> None:
        files = [(str(f["name"]), bytes(f["content"])) for f in change["new"] or ()]
        if not files:
            return  # our own reset below
        folder = self.target.value
        self.upload_button.value = ()
        if not folder:
            self.show_message("no folder you may write to: choose one first", error=True)
            return
        self.busy(self.upload_button, lambda: self.upload(folder, files))

    async def upload(self, folder_id: str, files: list[tuple[str, bytes]]) -> bool:
        """Upload ``(name, content)`` pairs into the folder; the outcome shows in the widget."""
        name = next((r["name"] for r in self.rows if r["id"] == folder_id), folder_id)
        done = []
        try:
            for filename, content in files:
                await self.client.upload(folder_id, filename, content)
                done.append(filename)
        except Exception as e:
            self.show_message(f"could not upload into {name}: {error_message(e)}", error=True)
            await self.refresh()
            return False
        self.show_message(f"Uploaded {', '.join(done)} into {name}.")
        await self.refresh()
        return True

    async def create(self, name: str) -> dict[str, Any] | None:
        """Create my folder ``name``; the outcome shows in the widget."""
        name = (name or "").strip()
        if not name:
            self.show_message("give the new folder a name", error=True)
            return None
        try:
            folder = await self.client.create_vfolder(name)
        except Exception as e:
            self.show_message(f"could not create {name}: {error_message(e)}", error=True)
            return None
        self.new_name.value = ""
        self.show_message(f"Created folder {name}.")
        await self.refresh()
        return folder
