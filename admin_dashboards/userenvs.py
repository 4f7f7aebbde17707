"""The Environments page's "Users' environments": the images users and projects built for themselves.

An environment (My Environments, ``hub_ext/compute/environments.py``) is a registered base image
plus a recipe, built by the service's build queue into an image of its owner's: a user
(``user:NAME``) or a project (``project:DOMAIN/PROJECT``). ``GET /api/environments`` as the viewer
lists those the viewer may see (a superadmin and a monitor: every one; a domain admin: their
domain's), each with its base, its build's status (QUEUED, BUILDING, READY or FAILED, and why) and
the size of its image once built. The section shows them as a table, and the bytes of each owner's
images as bars.

A superadmin and a domain admin may delete one (``DELETE /api/environments/{id}``: a build that
runs stops, and its image is taken off the engine when no other environment has it); each row's
Delete asks for a second click (:func:`labfleet.console.console.confirm_first`). A superadmin may
also promote a READY one to a registered image for everyone (``POST /api/environments/{id}/image``,
asked first too): the page is built anew, so the images table above lists it, and it is edited or
removed there like any image. A monitor gets no button. The service decides in the end: a refusal
(a domain admin's promotion, an image registered already) shows as its message.

The top half is pure (plain values in, text or HTML out) and unit-tested without a kernel;
:func:`section` builds the widgets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import ipywidgets as W

from labfleet.console.console import Say, ServiceError, confirm_first, grid, message
from labfleet.console.resources import STYLE, muted
from labfleet.core.display import esc, fmt_bytes, number, parse_time
from labfleet.core.vocab import BUILD_PENDING_STATUSES, ENVIRONMENT_STATUSES

STATUSES = ENVIRONMENT_STATUSES
QUEUED, BUILDING, READY, FAILED = ENVIRONMENT_STATUSES
BADGES = {READY: "lf-badge-ok", FAILED: "lf-badge-bad", QUEUED: "lf-badge-wait", BUILDING: "lf-badge-wait"}
COLUMNS = ("environment", "owner", "base", "status", "image size", "created", "")
REASON_CHARS = 160  # a longer reason (a build's error) is cut in the table; its whole text is the tooltip
MAX_BARS = 15  # owners drawn; the rest are summed up in a line under the bars
ENV_STYLE = """<style>
.lf-badge-wait { background: var(--md-amber-100, #ffecb3); color: var(--md-amber-900, #e65100); }
.lf-env-reason { color: var(--jp-ui-font-color2, #757575); font-size: 0.88em; max-width: 340px;
  white-space: normal; line-height: 1.3; font-family: var(--jp-ui-font-family, sans-serif); }
.lf-envs-grid { margin: 4px 0 8px 0; }
.lf-envs-grid > .widget-html, .lf-envs-grid > .widget-box { margin: 0; padding: 3px 10px;
  border-bottom: 1px solid var(--jp-border-color2, #ddd); }
.lf-envs-grid .widget-html-content { font-family: var(--jp-ui-font-family, sans-serif); font-size: 0.92em;
  line-height: 1.5; padding: 3px 0; }
</style>"""


# ---------------------------------------------------------------- the rows (pure)


@dataclass(frozen=True)
class EnvRow:
    """One environment as the table shows it."""

    id: str
    name: str
    owner: str  # user:NAME or project:DOMAIN/PROJECT
    base: str
    status: str
    reason: str
    size_bytes: int
    created: str
    image: str = ""  # the built image's reference ("" before the build made it)
    registered: bool = False  # its image is a registered image (promoted)

    @property
    def label(self) -> str:
        """``user:alice/numpy``: the environment by its owner (as the audit log names it)."""
        return f"{self.owner}/{self.name}"

    @property
    def size(self) -> str:
        """The image's size; ``—`` while there is no image (queued, building, failed)."""
        return fmt_bytes(self.size_bytes) if self.status == READY or self.size_bytes else "—"


def items_of(answer: Any) -> list[Mapping[str, Any]]:
    """``GET /api/environments``'s items (``{"items": [...]}``; a plain list is taken as it is)."""
    if isinstance(answer, Mapping):
        answer = answer.get("items")
    return [e for e in answer or () if isinstance(e, Mapping)]


def env_rows(items: Iterable[Mapping[str, Any]]) -> list[EnvRow]:
    """A row per environment, in the service's order (newest first)."""
    rows = []
    for e in items:
        when = parse_time(e.get("created_at"))
        rows.append(
            EnvRow(
                id=str(e.get("id", "")),
                name=str(e.get("name", "")),
                owner=str(e.get("owner") or "—"),
                base=str(e.get("base") or "—"),
                status=str(e.get("status") or "—"),
                reason=str(e.get("status_reason") or ""),
                size_bytes=int(number(e.get("size_bytes"))),
                created=when.strftime("%Y-%m-%d %H:%M") if when else "—",
                image=str(e.get("image") or ""),
                registered=e.get("registered") is True,
            )
        )
    return rows


def short(text: str, most: int = REASON_CHARS) -> str:
    """``text`` on one line, cut to ``most`` characters (``…`` where cut)."""
    line = " ".join(text.split())
    return line if len(line) <= most else line[: most - 1].rstrip() + "…"


def status_html(row: EnvRow) -> str:
    """The status as a badge, and why under it (cut; the whole reason is its tooltip)."""
    badge = BADGES.get(row.status, "")
    out = f'<span class="lf-badge {badge} lf-env-status" data-environment="{esc(row.id)}">{esc(row.status)}</span>'
    if row.registered:
        out += f' <span class="lf-badge lf-env-registered" title="{esc(row.image)}">registered image</span>'
    if row.reason:
        out += f'<div class="lf-env-reason" title="{esc(row.reason)}">{esc(short(row.reason))}</div>'
    return out


def summary(rows: Sequence[EnvRow], role: str) -> str:
    """``3 environments in the fleet: 1 ready, 1 queued or building, 1 failed; their images take 2 GiB.``"""
    where = "of your domain" if role == "admin" else "in the fleet"
    if not rows:
        return (
            f"No environment {where} yet: users build them from a base image and a recipe (My Environments)."
        )
    count: dict[str, int] = {}
    for r in rows:
        count[r.status] = count.get(r.status, 0) + 1
    waiting = sum(count.get(status, 0) for status in BUILD_PENDING_STATUSES)
    total = sum(r.size_bytes for r in rows)
    n = len(rows)
    return (
        f"{n} environment{'' if n == 1 else 's'} {where}: {count.get('READY', 0)} ready, "
        f"{waiting} queued or building, {count.get('FAILED', 0)} failed; "
        f"their images take {fmt_bytes(total)}."
    )


def read_only_reason(role: str) -> str:
    """Why the viewer has no Delete buttons ("" for a superadmin or a domain admin, who may delete)."""
    if role in ("superadmin", "admin"):
        return ""
    if role == "monitor":
        return "Read only: a monitor changes nothing."
    return "Read only: only an admin deletes other people's environments here."


def can_promote(role: str, row: EnvRow) -> bool:
    """Does the viewer get a Promote button on ``row``? A superadmin's, on a READY environment whose
    image is not registered yet."""
    return role == "superadmin" and row.status == READY and not row.registered


def env_path(env_id: str) -> str:
    return f"/environments/{quote(env_id, safe='')}"


def promote_path(env_id: str) -> str:
    """``POST`` here registers the environment's image for everyone."""
    return env_path(env_id) + "/image"


def promote_warning(row: EnvRow) -> str:
    """What the first click of Promote says."""
    return (
        f"Register image {row.image or row.label} for everyone? Environment {row.label} becomes a "
        "registered image with its base's minimum resources and apps: every project may start "
        "sessions from it, and it stays on the engine while it is registered (edit or remove it "
        "among the images above)."
    )


# ---------------------------------------------------------------- the bars (pure)


@dataclass(frozen=True)
class OwnerSize:
    """What one owner's environments take: bytes of their images, how many, how many built."""

    owner: str
    bytes: int
    count: int
    ready: int

    @property
    def text(self) -> str:
        """``1.5 GiB, 3 environments (1 not built)``."""
        unbuilt = self.count - self.ready
        return f"{fmt_bytes(self.bytes)}, {self.count} environment{'' if self.count == 1 else 's'}" + (
            f" ({unbuilt} not built)" if unbuilt else ""
        )


def owner_sizes(rows: Iterable[EnvRow]) -> list[OwnerSize]:
    """Each owner's environments summed up, the largest images first (then the most, then by name)."""
    sums: dict[str, list[int]] = {}
    for r in rows:
        s = sums.setdefault(r.owner, [0, 0, 0])
        s[0] += r.size_bytes
        s[1] += 1
        s[2] += r.status == READY
    out = [OwnerSize(o, b, n, ready) for o, (b, n, ready) in sums.items()]
    return sorted(out, key=lambda o: (-o.bytes, -o.count, o.owner))


LABEL_W = 230
BAR_W = 420
TEXT_W = 330
ROW_H = 28
BAR_H = 16


def sizes_svg(owners: Sequence[OwnerSize], most: int = MAX_BARS) -> str:
    """The owners' image bytes as bars (``g.lf-env-owner`` with ``data-owner``, ``data-bytes``,
    ``data-count``), scaled to the largest; at most ``most`` bars and a line for the rest."""
    shown, rest = list(owners[:most]), list(owners[most:])
    width = LABEL_W + BAR_W + TEXT_W
    height = ROW_H * (max(len(shown), 1) + (1 if rest else 0)) + 8
    out = [
        f'<svg class="lf-env-sizes" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="image size per owner" '
        'style="font-family: var(--jp-ui-font-family, sans-serif); font-size: 12px; max-width: 100%;">'
    ]
    if not shown:
        out.append(
            f'<text x="{LABEL_W}" y="20" style="fill: var(--jp-ui-font-color2, #757575)">No environment.</text></svg>'
        )
        return "".join(out)
    biggest = max([o.bytes for o in owners] + [1])
    for i, o in enumerate(shown):
        y = ROW_H * i + 4
        by = y + (ROW_H - BAR_H) / 2
        mid = by + BAR_H / 2 + 4
        w = BAR_W * o.bytes / biggest
        if o.bytes > 0:
            w = max(w, 2.0)  # a small image still shows
        out.append(
            f'<g class="lf-env-owner" data-owner="{esc(o.owner)}" data-bytes="{o.bytes}" data-count="{o.count}">'
            f"<title>{esc(o.owner)}: {esc(o.text)}</title>"
            f'<text x="{LABEL_W - 10}" y="{mid:.1f}" text-anchor="end" '
            f'style="fill: var(--jp-ui-font-color1, #212121)">{esc(short(o.owner, 34))}</text>'
            f'<rect x="{LABEL_W}" y="{by:.1f}" width="{BAR_W}" height="{BAR_H}" rx="3" '
            'style="fill: var(--jp-layout-color2, #eeeeee); stroke: var(--jp-border-color2, #e0e0e0)"/>'
            f'<rect class="lf-used" x="{LABEL_W}" y="{by:.1f}" width="{w:.1f}" height="{BAR_H}" rx="3" '
            'style="fill: var(--jp-brand-color1, #1976d2)"/>'
            f'<text x="{LABEL_W + BAR_W + 10}" y="{mid:.1f}" '
            f'style="fill: var(--jp-ui-font-color2, #616161)">{esc(o.text)}</text>'
            "</g>"
        )
    if rest:
        more = sum(o.bytes for o in rest)
        more_y = ROW_H * len(shown) + 4 + ROW_H / 2 + 4
        out.append(
            f'<text class="lf-env-more" x="{LABEL_W}" y="{more_y:.1f}" style="fill: var(--jp-ui-font-color2, #757575)">'
            f"and {len(rest)} more owner{'' if len(rest) == 1 else 's'}: {esc(fmt_bytes(more))}</text>"
        )
    out.append("</svg>")
    return "".join(out)


# ---------------------------------------------------------------- the section (widgets)


def _cell(html: str) -> W.HTML:
    return W.HTML(html)


def delete_button(client: Any, row: EnvRow, say: Say, done: Callable[[], None]) -> W.Button:
    """Delete ``row``'s environment, asked first; the page is built anew, then the message said."""
    b = W.Button(
        description="Delete",
        icon="trash",
        tooltip=f"Delete environment {row.label}",
        layout=W.Layout(width="auto"),
    )
    b.add_class("lf-env-delete")

    def act() -> bool:
        try:
            client.delete(env_path(row.id))
        except ServiceError as e:
            say(f"The labfleet service said: {e.message}", True)
            return False
        done()  # built anew first: the message shows once the new page is there
        say(f"Deleted environment {row.label}.", False)
        return True

    stops = " Its build stops." if row.status in BUILD_PENDING_STATUSES else ""
    warning = (
        f"Delete environment {row.label}? New sessions can no longer start from it; its image is "
        f"removed when no other environment uses it.{stops}"
    )
    return confirm_first(b, act, warning, say)


def promote_button(client: Any, row: EnvRow, say: Say, done: Callable[[], None]) -> W.Button:
    """Promote ``row``'s environment to a registered image, asked first; the page is built anew (its
    images table lists the new image), then the message said."""
    b = W.Button(
        description="Promote",
        icon="arrow-up",
        tooltip=f"Promote environment {row.label} to a registered image",
        layout=W.Layout(width="auto"),
    )
    b.add_class("lf-env-promote")

    def act() -> bool:
        try:
            view = client.post(promote_path(row.id))
        except ServiceError as e:
            say(f"The labfleet service said: {e.message}", True)
            return False
        done()  # built anew first: the images table shows the new image when the message shows
        name = str(view.get("name") or "") if isinstance(view, Mapping) else ""
        say(f"Promoted environment {row.label} to registered image {name or row.image or row.label}.", False)
        return True

    return confirm_first(b, act, promote_warning(row), say)


def env_grid(client: Any, rows: Sequence[EnvRow], say: Say, done: Callable[[], None]) -> W.GridBox:
    """The environments, a row each; a Delete button each for those who may delete, and a Promote
    button on each READY one for a superadmin."""
    can_delete = not read_only_reason(client.role)
    lines = []
    for r in rows:
        line: list[Any] = [
            _cell(f'<b class="lf-env" data-environment="{esc(r.id)}" title="{esc(r.id)}">{esc(r.name)}</b>'),
            _cell(f'<span class="lf-env-owner" data-environment="{esc(r.id)}">{esc(r.owner)}</span>'),
            r.base,
            _cell(status_html(r)),
            _cell(f'<span class="lf-env-size" data-environment="{esc(r.id)}">{esc(r.size)}</span>'),
            r.created,
        ]
        if can_delete:  # in a box: the cell draws the row's line, the buttons keep their look
            buttons = [delete_button(client, r, say, done)]
            if can_promote(client.role, r):
                buttons.insert(0, promote_button(client, r, say, done))
            line.append(W.HBox(buttons))
        lines.append(line)
    columns = list(COLUMNS) if can_delete else list(COLUMNS[:-1])
    table = grid(columns, lines)
    table.layout.grid_gap = "0px"  # the cells' padding spaces them, as a table's (their lines meet)
    table.add_class("lf-envs-grid")
    return table


def section(
    client: Any, heading: Callable[[str, str], W.Widget], note: W.Widget, say: Say, done: Callable[[], None]
) -> W.VBox:
    """The "Users' environments" section: a summary, ``note`` (the section's message line, kept by
    the page across rebuilds), the bars of image size per owner, and the table. A refusal of the
    service shows as its message in place of the rest."""
    parts: list[W.Widget] = [
        W.HTML(STYLE + ENV_STYLE),
        heading(
            "Users' environments",
            "Images users and projects built for themselves from a registered base and a recipe "
            "(My Environments); each counts against its owner's policy (max_environments, "
            "max_environment_bytes).",
        ),
    ]
    try:
        rows = env_rows(items_of(client.get("/environments")))
    except ServiceError as e:
        parts.append(message(f"The labfleet service said: {e.message}", error=True))
        return _tagged(W.VBox(parts))
    parts.append(muted(summary(rows, client.role)))
    why = read_only_reason(client.role)
    if why and rows:
        parts.append(muted(why))
    parts.append(note)
    if rows:
        parts += [
            W.HTML(f'{STYLE}<div class="lf-admin"><b>Image size per owner</b></div>'),
            W.HTML(f'<div class="lf-env-sizes-wrap">{sizes_svg(owner_sizes(rows))}</div>'),
            env_grid(client, rows, say, done),
        ]
    return _tagged(W.VBox(parts))


def _tagged(box: W.VBox) -> W.VBox:
    box.add_class("lf-user-envs")
    return box
