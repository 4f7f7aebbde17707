"""The Environments page: the images sessions start from, registered, edited and removed.

An image (``/api/images``, ``hub_ext/compute/images.py``) is a container reference with what the
spawn form needs to know about it: a display name, the minimum resources a session of it must ask
(``cpu``, ``mem``, ``gpu``, ``gpu.shares``), the accelerators it supports, the apps it serves
(service ports ``name:protocol:port``), and which projects or domains may use it (none listed:
everyone). Registering can also **read the image's labels from Docker** (``"inspect": true``): its
``ai.labfleet.*`` labels fill every field the form leaves empty.

Superadmins change images; domain admins see the images their domain may use and monitors all of
them, read only (the service refuses their changes anyway). The forms take text as people write it
and the pure helpers below turn it into the API's body, leaving the values' rules to the service:
a wrong amount or port is refused with the service's own message and nothing changes.

Below the images, the page lists the users' environments (their own images, built from a base
and a recipe: "My Environments") with their owners, build status and sizes, and lets an admin
delete one (:mod:`labfleet.console.userenvs`).

The top half is pure and unit-tested without a kernel; :func:`page` builds the widgets.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import ipywidgets as W

from labfleet.console import userenvs
from labfleet.console.console import ServiceError, guarded, message
from labfleet.console.policies import (
    DESC,
    PAGE_STYLE,
    FormError,
    canonical_slots,
    fmt_slots_text,
    meaning,
    narrow,
    parse_slots,
)
from labfleet.console.resources import STYLE, form_label, muted, section
from labfleet.core.display import esc, fmt_bytes, parse_time, sort_slots

ACCELERATORS = ("cuda",)
LABEL_PREFIX = "ai.labfleet."
NEW = ""  # the editor's "register a new image" choice (no image has an empty name)
_LIST_SPLIT = re.compile(r"[,;\s]+")
_PORT = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}:(http|tcp|preopen):[0-9]{1,5}$", re.IGNORECASE)
# The form's fields, in order: (key, label, meaning)
MEANINGS = {
    "name": "the image reference the backend starts, e.g. labfleet/pytorch:2.5-cuda12",
    "inspect": "fill what the form leaves empty from the image's ai.labfleet.* labels (the Docker engine "
    "of the service's machine must have the image)",
    "display_name": "what the spawn form shows; empty: the reference",
    "min_resource_slots": "what a session of this image must ask at least, e.g. cpu=1, mem=2g, gpu.shares=0.25",
    "accelerators": "the accelerators the image supports (its sessions may ask for GPUs)",
    "service_ports": "apps the image serves, one name:protocol:port each (protocol http, tcp or preopen), "
    "e.g. tensorboard:http:6006",
    "projects": "DOMAIN/PROJECT names whose sessions may use it; with no project and no domain: everyone",
    "domains": "domains whose projects may all use it",
    "is_active": "an inactive image is not offered for new sessions; running ones keep running",
}


# ---------------------------------------------------------------- reading the form (pure)


def parse_names(text: str) -> list[str]:
    """``acme/ml, beta/web`` (commas, semicolons, spaces or new lines) -> ``["acme/ml", "beta/web"]``,
    each name once, in the order given."""
    out: list[str] = []
    for item in _LIST_SPLIT.split(text or ""):
        if item and item not in out:
            out.append(item)
    return out


def parse_ports(text: str) -> list[str]:
    """Service ports, one ``name:protocol:port`` each (separated by commas, spaces or new lines).

    The shape is checked here so a slip is named at once; the service checks the rest (ports in
    1-65535, names unique) and says so in its own words.
    """
    ports = parse_names(text)
    for p in ports:
        if not _PORT.match(p):
            raise FormError(
                f"service_ports: cannot read {p!r}: write name:protocol:port, e.g. tensorboard:http:6006 "
                "(protocol http, tcp or preopen)"
            )
    return ports


def fmt_ports_text(ports: Iterable[Any]) -> str:
    """The API's ports (``{"name", "protocol", "port"}`` objects or strings) as the form writes them."""
    out = []
    for p in ports or ():
        if isinstance(p, Mapping):
            out.append(f"{p.get('name')}:{p.get('protocol')}:{p.get('port')}")
        else:
            out.append(str(p))
    return ", ".join(out)


def form_values(image: Mapping[str, Any] | None) -> dict[str, Any]:
    """The form's values for ``image`` (None: an empty form for a new one)."""
    image = image or {}
    return {
        "name": str(image.get("name") or ""),
        "display_name": str(image.get("display_name") or ""),
        "min_resource_slots": fmt_slots_text(image.get("min_resource_slots")),
        "accelerators": [a for a in image.get("accelerators") or () if a in ACCELERATORS],
        "service_ports": fmt_ports_text(image.get("service_ports") or ()),
        "projects": ", ".join(image.get("projects") or ()),
        "domains": ", ".join(image.get("domains") or ()),
        "is_active": bool(image.get("is_active", True)),
    }


def _ports_key(ports: Iterable[Any]) -> list[str]:
    return sorted(s.lower() for s in parse_names(fmt_ports_text(ports)))


def register_body(form: Mapping[str, Any]) -> dict[str, Any]:
    """The body of ``POST /api/images`` from the form.

    With ``inspect`` (read labels from Docker), a field left empty is not sent, so the image's own
    label fills it; without it, empty means empty (the service's defaults: display name = the
    reference, no minimum, no apps, everyone may use it).
    """
    name = str(form.get("name") or "").strip()
    if not name:
        raise FormError("name: give the image's reference, e.g. labfleet/pytorch:2.5")
    inspect = bool(form.get("inspect"))
    body: dict[str, Any] = {"name": name}
    if inspect:
        body["inspect"] = True
    display = str(form.get("display_name") or "").strip()
    slots = parse_slots(str(form.get("min_resource_slots") or ""), "min_resource_slots")
    accelerators = list(form.get("accelerators") or ())
    ports = parse_ports(str(form.get("service_ports") or ""))
    projects = parse_names(str(form.get("projects") or ""))
    domains = parse_names(str(form.get("domains") or ""))
    if display:  # empty: the service names it after its reference (or its label does)
        body["display_name"] = display
    for key, value in (
        ("min_resource_slots", slots),
        ("accelerators", accelerators),
        ("service_ports", ports),
        ("projects", projects),
        ("domains", domains),
    ):
        if value or not inspect:
            body[key] = value
    if not form.get("is_active", True):
        body["is_active"] = False
    return body


def image_patch(before: Mapping[str, Any], form: Mapping[str, Any]) -> dict[str, Any]:
    """The body of ``PATCH /api/images/NAME``: only the fields the form changed."""
    body: dict[str, Any] = {}
    display = str(form.get("display_name") or "").strip()
    if display != str(before.get("display_name") or ""):
        body["display_name"] = display or str(before.get("name") or "")
    slots = parse_slots(str(form.get("min_resource_slots") or ""), "min_resource_slots")
    theirs = canonical_slots(slots)
    if theirs is None or theirs != canonical_slots(before.get("min_resource_slots")):
        body["min_resource_slots"] = slots
    accelerators = list(form.get("accelerators") or ())
    if sorted(accelerators) != sorted(before.get("accelerators") or ()):
        body["accelerators"] = accelerators
    ports = parse_ports(str(form.get("service_ports") or ""))
    if sorted(p.lower() for p in ports) != _ports_key(before.get("service_ports") or ()):
        body["service_ports"] = ports
    for key in ("projects", "domains"):
        names = parse_names(str(form.get(key) or ""))
        if sorted(names) != sorted(before.get(key) or ()):
            body[key] = names
    active = bool(form.get("is_active", True))
    if active != bool(before.get("is_active", True)):
        body["is_active"] = active
    return body


# ---------------------------------------------------------------- the table (pure)


def fmt_min(slots: Mapping[str, Any] | None) -> str:
    """``cpu 1, mem 2 GiB, gpu.shares 0.25``; ``none`` when the image asks nothing."""
    slots = dict(slots or {})
    names = sort_slots(slots)
    out = []
    for n in names:
        v = slots[n]
        if n == "mem":
            out.append(f"mem {fmt_bytes(v)}")
        else:
            out.append(f"{n} {int(v) if isinstance(v, float) and v.is_integer() else v}")
    return ", ".join(out) or "none"


def fmt_allowed(image: Mapping[str, Any]) -> str:
    """Who may use the image: ``everyone``, or its projects and domains."""
    projects = list(image.get("projects") or ())
    domains = list(image.get("domains") or ())
    if not projects and not domains:
        return "everyone"
    parts = []
    if domains:
        parts.append("domains " + ", ".join(domains))
    if projects:
        parts.append("projects " + ", ".join(projects))
    return "; ".join(parts)


def own_labels(labels: Mapping[str, Any] | None) -> dict[str, str]:
    """The image's ``ai.labfleet.*`` labels (what registration reads), without the prefix."""
    return {
        k[len(LABEL_PREFIX) :]: str(v)
        for k, v in sorted((labels or {}).items())
        if k.startswith(LABEL_PREFIX)
    }


COLUMNS = (
    "image",
    "display name",
    "minimum",
    "accelerators",
    "apps",
    "who may use it",
    "status",
    "labels",
    "registered",
)


def image_rows(images: Iterable[Mapping[str, Any]]) -> list[list[str]]:
    """One row of text per image, in :data:`COLUMNS` order."""
    rows = []
    for i in images:
        labels = own_labels(i.get("labels"))
        when = parse_time(i.get("created_at"))
        rows.append(
            [
                str(i.get("name", "")),
                str(i.get("display_name") or ""),
                fmt_min(i.get("min_resource_slots")),
                ", ".join(i.get("accelerators") or ()) or "none",
                ", ".join(
                    f"{p.get('name')} ({p.get('protocol')} {p.get('port')})"
                    for p in i.get("service_ports") or ()
                    if isinstance(p, Mapping)
                )
                or "none",
                fmt_allowed(i),
                "active" if i.get("is_active", True) else "inactive",
                "; ".join(f"{k}={v}" for k, v in labels.items()) or "—",
                when.strftime("%Y-%m-%d %H:%M") if when else "—",
            ]
        )
    return rows


def images_html(rows: Sequence[Sequence[str]]) -> str:
    """The images as a table; each row carries ``data-image``."""
    if not rows:
        return '<div class="lf-admin lf-muted">No image in reach.</div>'
    head = "".join(f"<th>{esc(c)}</th>" for c in COLUMNS)
    body = []
    for r in rows:
        status = r[6]
        badge = "lf-badge-ok" if status == "active" else "lf-badge-bad"
        cells = [f"<td><b>{esc(r[0])}</b></td>"]
        cells += [f"<td>{esc(v)}</td>" for v in r[1:6]]
        cells.append(f'<td><span class="lf-badge {badge}">{esc(status)}</span></td>')
        cells += [f'<td class="lf-muted">{esc(r[7])}</td>', f"<td>{esc(r[8])}</td>"]
        body.append(f'<tr data-image="{esc(r[0])}">{"".join(cells)}</tr>')
    return f'<div class="lf-admin"><table class="lf-table lf-images"><tr>{head}</tr>{"".join(body)}</table></div>'


def read_only_reason(role: str) -> str:
    """Why the viewer may not change images ("" for a superadmin, who may)."""
    if role == "superadmin":
        return ""
    if role == "monitor":
        return "Read only: a monitor changes nothing."
    return "Read only: only a superadmin registers, changes and removes images. You see the images your domain may use."


def image_path(name: str = "") -> str:
    """``/images`` or ``/images/NAME`` (the reference quoted: it may hold ``/`` and ``:``)."""
    return f"/images/{quote(name, safe='')}" if name else "/images"


# ---------------------------------------------------------------- the page (widgets)


def image_editor(
    images: Sequence[Mapping[str, Any]],
    client: Any,
    on_saved: Callable[[str, str], None],
    selected: str | None = None,
    said: str = "",
) -> W.VBox:
    """A form to register a new image, or change or remove a registered one (superadmins).

    Save sends only what changed (:func:`image_patch`); Register sends the form
    (:func:`register_body`). A form that cannot be read, or the service's refusal, shows its message
    under the buttons and changes nothing. Remove asks for a second click. ``on_saved(text, name)``
    runs after a change (the page rebuilds and shows this editor on ``name`` with ``text``).
    """
    why = read_only_reason(client.role)
    editable = not why
    by_name = {str(i.get("name")): i for i in images}
    options = [(n, n) for n in by_name] + ([("(register a new image)", NEW)] if editable else [])
    start = selected if selected in by_name else (next(iter(by_name), NEW))
    pick = W.Dropdown(options=options, value=start, description="Image", style=DESC, layout=narrow())
    name = W.Text(description="Reference", placeholder="repo/name:tag", style=DESC, layout=narrow())
    inspect = W.Checkbox(description="read labels from Docker", indent=False, layout=W.Layout(width="292px"))
    display = W.Text(description="Display name", style=DESC, layout=narrow())
    slots = W.Text(description="Minimum", placeholder="none", style=DESC, layout=narrow())
    accs = {a: W.Checkbox(description=a, indent=False, layout=W.Layout(width="110px")) for a in ACCELERATORS}
    ports = W.Textarea(
        description="Apps",
        placeholder="none",
        style=DESC,
        layout=W.Layout(width="430px", height="48px"),
    )
    projects = W.Text(description="Projects", placeholder="none", style=DESC, layout=narrow())
    domains = W.Text(description="Domains", placeholder="none", style=DESC, layout=narrow())
    active = W.Checkbox(description="active", indent=False, layout=W.Layout(width="292px"))
    labels = W.HTML()
    save = W.Button(
        description="Save changes", button_style="primary", icon="check", layout=W.Layout(width="auto")
    )
    remove = W.Button(description="Remove", icon="trash", layout=W.Layout(width="auto"))
    note = W.HTML(message(said).value if said else "")
    armed: dict[str, str | None] = {"remove": None}

    def row(w: W.Widget, key: str, label: str | None = None) -> W.HBox:
        parts = [form_label(label), w] if label is not None else [w]
        return W.HBox([*parts, meaning(MEANINGS[key])], layout=W.Layout(align_items="center"))

    name_row = row(name, "name")
    inspect_row = row(inspect, "inspect", "Labels")
    accs_row = row(
        W.HBox(list(accs.values()), layout=W.Layout(width="292px")), "accelerators", "Accelerators"
    )

    def disarm() -> None:
        armed["remove"] = None
        remove.description, remove.button_style = "Remove", ""

    def load(*_: Any) -> None:
        new = pick.value == NEW
        image = None if new else by_name[pick.value]
        values = form_values(image)
        name.value = values["name"]
        inspect.value = False
        display.value = values["display_name"]
        slots.value = values["min_resource_slots"]
        for a, box in accs.items():
            box.value = a in values["accelerators"]
        ports.value = values["service_ports"]
        projects.value = values["projects"]
        domains.value = values["domains"]
        active.value = values["is_active"]
        name_row.layout.display = "" if new else "none"
        inspect_row.layout.display = "" if new else "none"
        own = own_labels((image or {}).get("labels"))
        labels.value = (
            muted("Its ai.labfleet.* labels: " + "; ".join(f"{k}={v}" for k, v in own.items())).value
            if own
            else ""
        )
        save.description = "Register image" if new else "Save changes"
        save.icon = "plus" if new else "check"
        remove.disabled = new or not editable
        disarm()

    def form() -> dict[str, Any]:
        return {
            "name": name.value,
            "inspect": inspect.value,
            "display_name": display.value,
            "min_resource_slots": slots.value,
            "accelerators": [a for a, box in accs.items() if box.value],
            "service_ports": ports.value,
            "projects": projects.value,
            "domains": domains.value,
            "is_active": active.value,
        }

    def do_save(_: Any) -> None:
        disarm()
        new = pick.value == NEW
        try:
            body = register_body(form()) if new else image_patch(by_name[pick.value], form())
        except FormError as e:
            note.value = message(str(e), error=True).value
            return
        if not new and not body:
            note.value = muted("Nothing to save: the form says what the image already has.").value
            return
        target = body["name"] if new else str(pick.value)
        try:
            if new:
                client.post(image_path(), body)
            else:
                client.patch(image_path(target), body)
        except ServiceError as e:
            note.value = message(f"The labfleet service said: {e.message}", error=True).value
            return
        if new:
            text = f"Registered image {target}" + (
                " with its labels from Docker." if body.get("inspect") else "."
            )
        else:
            text = f"Saved image {target}: {', '.join(sorted(body))}."
        on_saved(text, target)

    def do_remove(_: Any) -> None:
        target = str(pick.value)
        if armed["remove"] != target:
            armed["remove"] = target
            remove.description, remove.button_style = "Really remove?", "danger"
            note.value = muted(
                f"Click again to remove {target} from the registry (running sessions keep running)."
            ).value
            return
        disarm()
        try:
            client.delete(image_path(target))
        except ServiceError as e:
            note.value = message(f"The labfleet service said: {e.message}", error=True).value
            return
        on_saved(f"Removed image {target}.", "")

    def picked(*_: Any) -> None:
        note.value = ""
        load()

    pick.observe(picked, "value")
    save.on_click(do_save)
    remove.on_click(do_remove)
    load()
    for w in [name, inspect, display, slots, *accs.values(), ports, projects, domains, active, save]:
        w.disabled = not editable
    rows: list[W.Widget] = [
        pick,
        name_row,
        inspect_row,
        row(display, "display_name"),
        row(slots, "min_resource_slots"),
        accs_row,
        row(ports, "service_ports"),
        row(projects, "projects"),
        row(domains, "domains"),
        row(active, "is_active", "Status"),
        W.HBox([form_label(""), labels]),
        W.HBox([form_label(""), save, remove]),
        W.HBox([form_label(""), note]),
    ]
    if why:
        rows.insert(0, muted(why))
    box = W.VBox(rows)
    box.add_class("lf-form")
    box.add_class("lf-image-form")
    return box


def page(client: Any) -> W.VBox:
    """The whole Environments page below its header: the registered images and their editor, then
    the users' environments (:mod:`labfleet.console.userenvs`); it rebuilds itself after a change."""
    out = W.VBox()
    refresh_button = W.Button(description="Refresh", icon="refresh", layout=W.Layout(width="110px"))
    state: dict[str, Any] = {"name": None, "said": ""}
    env_note = W.HTML()  # the users' environments' message line, kept across rebuilds

    def build() -> W.VBox:
        images = client.get(image_path())
        said, state["said"] = state["said"], ""
        active = sum(1 for i in images if i.get("is_active", True))
        parts: list[W.Widget] = [
            W.HTML(STYLE + PAGE_STYLE),
            section(
                "Images",
                f"{len(images)} image{'' if len(images) == 1 else 's'} in reach, {active} active. "
                "The spawn form offers a project the active images it may use.",
            ),
            W.HTML(STYLE + images_html(image_rows(images))),
        ]
        if client.role == "superadmin":
            parts.append(section("Register or edit an image"))
        elif images:
            parts.append(section("An image in detail"))
        if client.role == "superadmin" or images:  # a read-only form of no image would show nothing
            parts.append(image_editor(images, client, saved, state["name"], said))
        parts.append(userenvs.section(client, section, env_note, say, refresh))
        return W.VBox(parts)

    def say(text: str, error: bool) -> None:
        env_note.value = message(text, error=error).value

    def refresh(*_: Any) -> None:
        env_note.value = ""
        out.children = [guarded(build)]

    def saved(text: str, name: str) -> None:
        state.update(name=name, said=text)
        refresh()

    refresh_button.on_click(refresh)
    refresh()
    return W.VBox([refresh_button, out])
