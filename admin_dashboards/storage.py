"""The Storage page: storage hosts, the folders in reach, and quotas and usage by scope.

Three reads of the labfleet service, as the viewer:

- ``GET /api/storage-hosts``: each host with what its folders use against its capacity, its
  disk's free space, and the viewer's rights there (superadmins and monitors also see its path
  and default rights);
- ``GET /api/vfolders`` one page at a time (``offset``, ``limit``, and the total the service
  counts), every folder of the fleet for superadmins and monitors (``scope=all``) and of their
  domain for a domain admin (``scope=domain``): owner, host, usage and the owner's quota scope;
- ``GET /api/vfolders/usage?user=NAME``: a person's quota scopes (their own and each of their
  projects'), drawn as bars of what is used (and reserved by uploads in progress) against the
  policy's limit, with the folder counts against theirs.

The top half is pure (plain dicts in, text, HTML or SVG out) and unit-tested without a kernel;
:func:`page` builds the widgets. The page changes nothing: folders are their owners' (the Lab's
file browser and ``/api/vfolders``), quotas are the policies' (the Resource policies page).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ipywidgets as W

from labfleet.console.console import ServiceError, guarded, message
from labfleet.console.resources import STYLE, muted, section
from labfleet.core.display import esc, fmt_bytes, number, parse_time, trim

PAGE_SIZE = 20
STATUSES = (("all", ""), ("ready", "READY"), ("in the trash", "DELETE_PENDING"))
WARN_AT = 0.8  # a scope this full is drawn in the warning colour; at 1.0 in the error colour


# ---------------------------------------------------------------- hosts (pure)


def ratio(used: Any, total: Any) -> float | None:
    """``used / total`` between 0 and 1; None when there is no total (no limit)."""
    t = number(total)
    return None if t <= 0 else min(max(number(used) / t, 0.0), 1.0)


def meter_html(fraction: float | None, text: str) -> str:
    """A small bar (``lf-meter``, as on the Resources page) and its text; no bar without a total."""
    if fraction is None:
        return f'<span class="lf-meter-text">{esc(text)}</span>'
    cls = "lf-meter lf-over" if fraction >= 1 else ("lf-meter lf-warn" if fraction >= WARN_AT else "lf-meter")
    return (
        f'<span class="{cls}"><span style="width: {fraction * 100:.1f}%"></span></span>'
        f'<span class="lf-meter-text">{esc(text)}</span>'
    )


RIGHTS = (
    "create-vfolder",
    "mount-in-session",
    "upload-file",
    "download-file",
    "delete-vfolder",
    "invite-others",
)


def fmt_rights(rights: Iterable[str] | None) -> str:
    """``mount-in-session, download-file``; ``every right`` (all six); ``none``."""
    rights = list(rights or ())
    if set(RIGHTS) <= set(rights):
        return "every right"
    return ", ".join(rights) or "none"


@dataclass(frozen=True)
class HostRow:
    """A storage host as the table shows it."""

    name: str
    description: str
    active: bool
    path: str  # "" when the viewer may not see it
    used: int
    capacity: int
    disk_total: int | None
    disk_free: int | None
    rights: str
    defaults: str  # "" when the viewer may not see them

    @property
    def used_text(self) -> str:
        """``12 KiB of 1 TiB`` (capacity), or ``12 KiB, no cap``."""
        if self.capacity:
            return f"{fmt_bytes(self.used)} of {fmt_bytes(self.capacity)}"
        return f"{fmt_bytes(self.used)}, no cap"

    @property
    def disk_text(self) -> str:
        """``40 GiB free of 100 GiB``; ``unreadable`` when the service could not read the disk."""
        if self.disk_total is None or self.disk_free is None:
            return "unreadable"
        return f"{fmt_bytes(self.disk_free)} free of {fmt_bytes(self.disk_total)}"


def host_rows(hosts: Iterable[Mapping[str, Any]]) -> list[HostRow]:
    """``GET /api/storage-hosts`` as rows, by name."""
    rows = []
    for h in sorted(hosts, key=lambda h: str(h.get("name", ""))):
        disk = h.get("disk") if isinstance(h.get("disk"), Mapping) else None
        rows.append(
            HostRow(
                name=str(h.get("name", "")),
                description=str(h.get("description") or ""),
                active=bool(h.get("is_active", True)),
                path=str(h.get("path") or ""),
                used=int(number(h.get("used"))),
                capacity=int(number(h.get("capacity"))),
                disk_total=int(number(disk.get("total"))) if disk else None,
                disk_free=int(number(disk.get("free"))) if disk else None,
                rights=fmt_rights(h.get("rights")),
                defaults=fmt_rights(h.get("default_permissions")) if "default_permissions" in h else "",
            )
        )
    return rows


def hosts_html(rows: Sequence[HostRow]) -> str:
    """The hosts as a table (``tr[data-host]``), with bars of use against capacity and of the disk."""
    if not rows:
        return '<div class="lf-admin lf-muted">No storage host in reach.</div>'
    admin = any(r.path or r.defaults for r in rows)
    head = ["host", "status", "folders use", "disk", "your rights"]
    if admin:
        head[1:1] = ["path"]
        head.append("everyone's rights")
    body = []
    for r in rows:
        badge = (
            '<span class="lf-badge lf-badge-ok">active</span>'
            if r.active
            else ('<span class="lf-badge lf-badge-bad">inactive</span>')
        )
        disk_used = None
        if r.disk_total and r.disk_free is not None:
            disk_used = ratio(r.disk_total - r.disk_free, r.disk_total)
        cells = [
            f"<td><b>{esc(r.name)}</b><div class='lf-muted'>{esc(r.description)}</div></td>",
            f"<td>{badge}</td>",
            f'<td style="white-space: nowrap">{meter_html(ratio(r.used, r.capacity), r.used_text)}</td>',
            f'<td style="white-space: nowrap">{meter_html(disk_used, r.disk_text)}</td>',
            f"<td>{esc(r.rights)}</td>",
        ]
        if admin:
            cells[1:1] = [f"<td><code>{esc(r.path)}</code></td>"]
            cells.append(f"<td>{esc(r.defaults)}</td>")
        body.append(f'<tr data-host="{esc(r.name)}">{"".join(cells)}</tr>')
    head_html = "".join(f"<th>{esc(h)}</th>" for h in head)
    return f'<div class="lf-admin"><table class="lf-table lf-hosts"><tr>{head_html}</tr>{"".join(body)}</table></div>'


# ---------------------------------------------------------------- folders (pure)


def fmt_limit(value: Any) -> str:
    """A byte limit: ``no limit`` for 0."""
    return fmt_bytes(value) if number(value) > 0 else "no limit"


def fmt_scope(scope: Mapping[str, Any] | None) -> str:
    """A folder's quota scope in a line: ``user alice: 12 KiB of 1 GiB, 2 of 10 folders``."""
    if not scope:
        return "—"
    used = fmt_bytes(scope.get("used"))
    limit = number(scope.get("limit"))
    size = f"{used} of {fmt_bytes(limit)}" if limit > 0 else f"{used}, no limit"
    folders = int(number(scope.get("folders")))
    most = int(number(scope.get("max_folders")))
    count = f"{folders} of {most} folders" if most else f"{folders} folder{'' if folders == 1 else 's'}"
    return f"{scope.get('kind')} {scope.get('name')}: {size}, {count}"


FOLDER_COLUMNS = (
    "folder",
    "owner",
    "host",
    "mode",
    "status",
    "used",
    "files",
    "folder limit",
    "quota scope",
    "created",
)


def folder_rows(folders: Iterable[Mapping[str, Any]]) -> list[list[str]]:
    """One row of text per folder, in :data:`FOLDER_COLUMNS` order."""
    rows = []
    for f in folders:
        usage: Mapping[str, Any] = f.get("usage") or {}
        limits: Mapping[str, Any] = f.get("limits") or {}
        when = parse_time(f.get("created_at"))
        trash = int(number(usage.get("trash_bytes")))
        used = fmt_bytes(usage.get("bytes")) + (f" ({fmt_bytes(trash)} in trash)" if trash else "")
        status = "in the trash" if f.get("status") == "DELETE_PENDING" else "ready"
        rows.append(
            [
                str(f.get("name", "")),
                str(f.get("owner", "")),
                str(f.get("host", "")),
                str(f.get("usage_mode") or "general"),
                status,
                used,
                str(int(number(usage.get("files")))),
                fmt_limit(limits.get("max_size")),
                fmt_scope(limits.get("scope")),
                when.strftime("%Y-%m-%d %H:%M") if when else "—",
            ]
        )
    return rows


def folders_html(rows: Sequence[Sequence[str]], ids: Sequence[str] = ()) -> str:
    """The folders as a table; each row carries ``data-folder`` (the name) and ``data-id``."""
    if not rows:
        return '<div class="lf-admin lf-muted">No folder here.</div>'
    head = "".join(f"<th>{esc(c)}</th>" for c in FOLDER_COLUMNS)
    body = []
    for i, r in enumerate(rows):
        fid = ids[i] if i < len(ids) else ""
        cells = f"<td><b>{esc(r[0])}</b></td>" + "".join(f"<td>{esc(v)}</td>" for v in r[1:])
        body.append(f'<tr data-folder="{esc(r[0])}" data-id="{esc(fid)}">{cells}</tr>')
    return f'<div class="lf-admin"><table class="lf-table lf-folders"><tr>{head}</tr>{"".join(body)}</table></div>'


def list_scope(role: str) -> str:
    """Which folders a viewer lists: all for superadmins and monitors, their domain's for admins."""
    return "all" if role in ("superadmin", "monitor") else ("domain" if role == "admin" else "mine")


def matches(folder: Mapping[str, Any], text: str) -> bool:
    """Does a search text (case-insensitive) occur in the folder's name, owner, host, domain or id?
    The service's ``GET /api/vfolders?search=`` in Python (a test holds the two together)."""
    needle = text.strip().lower()
    hay = " ".join(str(folder.get(k) or "") for k in ("name", "owner", "host", "domain", "id")).lower()
    return needle in hay


def page_text(offset: int, shown: int, total: int) -> str:
    """``21–40 of 57 folders``; ``no folder`` when there is none."""
    if total <= 0:
        return "no folder"
    return f"{offset + 1}–{offset + shown} of {total} folder{'' if total == 1 else 's'}"


def first_owner(folders: Iterable[Mapping[str, Any]]) -> str | None:
    """The user who owns the first user folder of a list (``user:alice`` -> ``alice``)."""
    for f in folders:
        owner = str(f.get("owner") or "")
        if f.get("owner_kind") == "user" and owner.startswith("user:"):
            return owner[5:]
    return None


# ---------------------------------------------------------------- quota scopes as bars (pure)


@dataclass(frozen=True)
class ScopeBar:
    """A quota scope: bytes used and reserved against its limit, folders against theirs."""

    kind: str
    name: str
    used: int
    reserved: int
    limit: int
    folders: int
    max_folders: int
    max_folder_size: int

    @property
    def fraction(self) -> float | None:
        """What is used and reserved, of the limit (may exceed 1); None without a limit."""
        return None if self.limit <= 0 else (self.used + self.reserved) / self.limit

    @property
    def text(self) -> str:
        """``12 KiB of 1 GiB (1 %), 2 of 10 folders`` with what uploads reserve."""
        held = fmt_bytes(self.used) + (f" + {fmt_bytes(self.reserved)} reserved" if self.reserved else "")
        if self.limit > 0:
            pct = (self.used + self.reserved) * 100 / self.limit
            share = "< 0.1" if 0 < pct < 0.1 else trim(pct, 1 if pct < 10 else 0)
            size = f"{held} of {fmt_bytes(self.limit)} ({share} %)"
        else:
            size = f"{held}, no limit"
        count = (
            f"{self.folders} of {self.max_folders} folders"
            if self.max_folders
            else f"{self.folders} folder{'' if self.folders == 1 else 's'}"
        )
        return f"{size}, {count}"


def scope_bars(usage: Mapping[str, Any]) -> list[ScopeBar]:
    """``GET /api/vfolders/usage`` as bars: the user's own scope first, then each project's."""
    out = []
    for s in usage.get("scopes") or ():
        out.append(
            ScopeBar(
                kind=str(s.get("kind", "")),
                name=str(s.get("name", "")),
                used=int(number(s.get("used"))),
                reserved=int(number(s.get("reserved"))),
                limit=int(number(s.get("limit"))),
                folders=int(number(s.get("folders"))),
                max_folders=int(number(s.get("max_folders"))),
                max_folder_size=int(number(s.get("max_folder_size"))),
            )
        )
    return out


LABEL_W = 230
BAR_W = 420
TEXT_W = 330
ROW_H = 32
BAR_H = 18


def scope_color(fraction: float | None) -> tuple[str, str]:
    """The bar's colour: the brand colour, the warning colour past 80 %, the error colour when full."""
    if fraction is not None and fraction >= 1:
        return ("--jp-error-color1", "#d32f2f")
    if fraction is not None and fraction >= WARN_AT:
        return ("--jp-warn-color1", "#f57c00")
    return ("--jp-brand-color1", "#1976d2")


def scopes_svg(bars: Sequence[ScopeBar]) -> str:
    """The scopes as one SVG: a row each (``g.lf-scope`` with ``data-kind``, ``data-name``,
    ``data-used``, ``data-reserved``, ``data-limit``), the used part filled, what uploads reserve
    lighter, the rest of the limit grey. A scope with no limit is drawn against the largest use
    shown, dashed, and says "no limit"."""
    width = LABEL_W + BAR_W + TEXT_W
    height = ROW_H * max(len(bars), 1) + 8
    out = [
        f'<svg class="lf-scopes" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="quota scopes" '
        'style="font-family: var(--jp-ui-font-family, sans-serif); font-size: 12px; max-width: 100%;">'
    ]
    if not bars:
        out.append(
            f'<text x="{LABEL_W}" y="20" style="fill: var(--jp-ui-font-color2, #757575)">No quota scope.</text></svg>'
        )
        return "".join(out)
    biggest = max([b.used + b.reserved for b in bars if b.limit <= 0] + [1])
    for i, b in enumerate(bars):
        y = ROW_H * i + 4
        by = y + (ROW_H - BAR_H) / 2
        mid = by + BAR_H / 2 + 4
        frac = b.fraction
        scale = b.limit if b.limit > 0 else biggest
        used_w = BAR_W * min(b.used / scale, 1.0)
        if b.used > 0:
            used_w = max(used_w, 2.0)  # a little use still shows
        res_w = min(BAR_W * b.reserved / scale, BAR_W - used_w)
        var, fallback = scope_color(frac)
        dashed = ' stroke-dasharray="4 3"' if b.limit <= 0 else ""
        out.append(
            f'<g class="lf-scope" data-kind="{esc(b.kind)}" data-name="{esc(b.name)}" data-used="{b.used}" '
            f'data-reserved="{b.reserved}" data-limit="{b.limit}" data-folders="{b.folders}">'
            f"<title>{esc(b.kind)} {esc(b.name)}: {esc(b.text)}"
            + (f"; one folder may hold {esc(fmt_bytes(b.max_folder_size))}" if b.max_folder_size else "")
            + "</title>"
            f'<text x="{LABEL_W - 10}" y="{mid:.1f}" text-anchor="end" '
            f'style="fill: var(--jp-ui-font-color1, #212121)">{esc(b.kind)} {esc(b.name)}</text>'
            f'<rect x="{LABEL_W}" y="{by:.1f}" width="{BAR_W}" height="{BAR_H}" rx="3" '
            f'style="fill: var(--jp-layout-color2, #eeeeee); stroke: var(--jp-border-color2, #e0e0e0)"{dashed}/>'
            f'<rect class="lf-used" x="{LABEL_W}" y="{by:.1f}" width="{used_w:.1f}" height="{BAR_H}" rx="3" '
            f'style="fill: var({var}, {fallback})"/>'
            f'<rect class="lf-reserved" x="{LABEL_W + used_w:.1f}" y="{by:.1f}" width="{res_w:.1f}" '
            f'height="{BAR_H}" style="fill: var({var}, {fallback}); opacity: 0.4"/>'
            f'<text x="{LABEL_W + BAR_W + 10}" y="{mid:.1f}" '
            f'style="fill: var(--jp-ui-font-color2, #616161)">{esc(b.text)}</text>'
            "</g>"
        )
    out.append("</svg>")
    return "".join(out)


# ---------------------------------------------------------------- the page (widgets)


def quota_view(client: Any, default_user: str) -> W.VBox:
    """A person's quota scopes as bars, for a user the viewer names (their own by default)."""
    who = W.Text(
        value=default_user,
        continuous_update=False,
        description="User",
        placeholder="a user name",
        style={"description_width": "60px"},
        layout=W.Layout(width="260px"),
    )
    show = W.Button(description="Show quotas", icon="search", layout=W.Layout(width="130px"))
    out = W.HTML()

    def load(*_: Any) -> None:
        name = who.value.strip()
        if not name:
            out.value = message("Name a user.", error=True).value
            return
        try:
            usage = client.get("/vfolders/usage", user=name)
        except ServiceError as e:
            out.value = message(f"The labfleet service said: {e.message}", error=True).value
            return
        bars = scope_bars(usage)
        out.value = (
            f'{STYLE}<div class="lf-admin"><div class="lf-muted">Quota scopes of {esc(usage.get("user", name))}: '
            "their own folders, then each of their projects'. A limit comes from the owner's user or project "
            "policy.</div></div>"
            f'<div class="lf-scopes-wrap">{scopes_svg(bars)}</div>'
        )

    show.on_click(load)
    who.observe(load, "value")  # on Enter or leaving the field
    load()
    return W.VBox([W.HBox([who, show], layout=W.Layout(align_items="center")), out])


def folder_browser(client: Any) -> W.VBox:
    """The folders in reach, a page at a time, filtered by status and searched by name or owner.

    Without a search each page is one request (``offset``, ``limit``; the service counts the total).
    A search reads every folder in reach and filters them here, as the service has no search.
    """
    scope = list_scope(client.role)
    status = W.Dropdown(options=STATUSES, value="", description="Status", layout=W.Layout(width="220px"))
    search = W.Text(
        placeholder="search name, owner, host", continuous_update=False, layout=W.Layout(width="260px")
    )
    go = W.Button(description="Search", icon="search", layout=W.Layout(width="100px"))
    prev = W.Button(description="Previous", icon="chevron-left", layout=W.Layout(width="110px"))
    nxt = W.Button(description="Next", icon="chevron-right", layout=W.Layout(width="110px"))
    where = W.HTML()
    table_out = W.HTML()
    state = {"offset": 0}

    def load(*_: Any) -> None:
        params: dict[str, Any] = {"scope": scope}
        if status.value:
            params["status"] = status.value
        try:
            if search.value.strip():
                params["search"] = search.value.strip()
            answer = client.request(
                "GET",
                "/vfolders",
                params={**params, "offset": state["offset"], "limit": PAGE_SIZE},
                pages=True,
            )
            items, total = answer["items"], int(answer["_pagination"]["total"])
            if not items and state["offset"] and total:  # the last page emptied: go back one
                state["offset"] = max(total - 1, 0) // PAGE_SIZE * PAGE_SIZE
                load()
                return
        except ServiceError as e:
            table_out.value = message(f"The labfleet service said: {e.message}", error=True).value
            return
        where.value = muted(page_text(state["offset"], len(items), total)).value
        prev.disabled = state["offset"] <= 0
        nxt.disabled = state["offset"] + len(items) >= total
        table_out.value = STYLE + folders_html(folder_rows(items), [str(f.get("id", "")) for f in items])

    def restart(*_: Any) -> None:
        state["offset"] = 0
        load()

    def step(delta: int) -> Any:
        def run(_: Any) -> None:
            state["offset"] = max(state["offset"] + delta, 0)
            load()

        return run

    status.observe(restart, "value")
    go.on_click(restart)
    search.observe(restart, "value")  # on Enter or leaving the field
    prev.on_click(step(-PAGE_SIZE))
    nxt.on_click(step(PAGE_SIZE))
    load()
    controls = W.HBox([status, search, go], layout=W.Layout(align_items="center"))
    paging = W.HBox([prev, nxt, where], layout=W.Layout(align_items="center"))
    box = W.VBox([controls, table_out, paging])
    box.add_class("lf-folder-browser")
    return box


SCOPE_NOTES = {
    "all": "Every folder of the fleet.",
    "domain": "Every folder of your domain.",
    "mine": "Your folders, those shared with you and your projects'.",
}


def page(client: Any) -> W.VBox:
    """The whole Storage page below its header (read only for everyone: it changes nothing)."""
    out = W.VBox()
    refresh_button = W.Button(description="Refresh", icon="refresh", layout=W.Layout(width="110px"))

    def build() -> W.VBox:
        hosts = client.get("/storage-hosts")
        scope = list_scope(client.role)
        first = client.request("GET", "/vfolders", params={"scope": scope, "limit": 50}, pages=True)
        default_user = first_owner(first["items"]) or client.viewer
        return W.VBox(
            [
                W.HTML(STYLE),
                section(
                    "Storage hosts",
                    "Where folders live: what their folders use against each host's capacity, the disk "
                    "under it, and the rights people have there.",
                ),
                W.HTML(STYLE + hosts_html(host_rows(hosts))),
                section(
                    "Quotas and usage by scope",
                    "A quota scope is a user's own folders, or a project's. Bars: used (and reserved by uploads "
                    "in progress) against the policy's limit; dashed when there is no limit.",
                ),
                quota_view(client, default_user),
                section(
                    "Folders",
                    f"{SCOPE_NOTES[scope]} {int(first['_pagination']['total'])} in all; usage as last scanned, "
                    "plus what the API wrote since.",
                ),
                folder_browser(client),
            ]
        )

    def refresh(*_: Any) -> None:
        out.children = [guarded(build)]

    refresh_button.on_click(refresh)
    refresh()
    return W.VBox([refresh_button, out])
