"""The admin console's Domains & Projects page: the caps behind every quota, with what is held now.

Each domain and project has a total cap (``total_resource_slots``: cpu, mem, gpu, gpu.shares, per-model
slots); admission counts the slots of every live session of the domain and of the project against
them. This page lists the domains and projects in the viewer's reach, each cap with its current use
beside it (the service's ``in_use``: what the live sessions hold now, as admission counts it), and
lets the viewer change caps, create projects (and domains, for a superadmin) and add or remove a
project's members, one at a time: a name and Add, a Remove per member (asked twice).

Everything goes through the labfleet service as the viewer: a superadmin may do everything, a
domain admin sees and changes their own domain's projects only (its cap is a superadmin's), a
monitor reads everything and changes nothing (the controls are disabled; the service refuses them
anyway). Caps are written as on the Resource policies page (``cpu=8, mem=32g, gpu.shares=2.5``:
:func:`labfleet.console.policies.parse_slots`), and the service judges the amounts.

Pure helpers first (plain values in, plain values or HTML out, unit-tested without a kernel), then
the widgets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import ipywidgets as W

from labfleet.console.console import FormError, Say, ServiceError, confirm_first, refreshable_page
from labfleet.console.policies import canonical_slots, fmt_slots_text, parse_slots
from labfleet.console.resources import STYLE, form_label, meter_html, muted, section
from labfleet.core.display import esc, fmt_slot, number, sort_slots

DOMAIN_COLUMNS = ("domain", "cap and use now", "projects", "state")
PROJECT_COLUMNS = ("project", "cap and use now", "members", "state")
NO_CAP = "no cap"
CAP_MEANING = (
    "NAME=AMOUNT, comma-separated: cpu=8, mem=32g, gpu=2, gpu.shares=2.5 (per-model: gpu:A100=1); "
    "a slot not named has no cap; empty: no cap at all"
)
NOTES = {
    "domains": (
        "Every session of a domain counts against the domain's cap, whatever its project. "
        "In use: what the live sessions hold now (queued ones included), as admission counts it."
    ),
    "projects": (
        "Every session belongs to one project and counts against its cap, beside its domain's. "
        "A spawn that would pass a cap is refused or waits."
    ),
}

# ---------------------------------------------------------------- caps beside their use (pure)


def cap_lines(cap: Mapping[str, Any] | None, in_use: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """One line per slot that is capped or held, known slots first: ``slot``, ``used`` and ``cap``
    (None: no cap on that slot) as numbers, and ``text`` as people read it (``1.5 of 4``)."""
    cap, used = dict(cap or {}), dict(in_use or {})
    lines = []
    for slot in sort_slots(set(cap) | set(used)):
        amount = used.get(slot, 0)
        limit = cap.get(slot)
        held = fmt_slot(slot, amount)
        text = f"{held} (no cap)" if limit is None else f"{held} of {fmt_slot(slot, limit)}"
        lines.append(
            {
                "slot": slot,
                "used": number(amount),
                "cap": None if limit is None else number(limit),
                "text": text,
            }
        )
    return lines


def caps_html(cap: Mapping[str, Any] | None, in_use: Mapping[str, Any] | None) -> str:
    """A cell: a meter per capped slot (``gpu.shares [###  ] 1.5 of 4``), held slots with no cap
    beside them; "no cap" when nothing is capped or held."""
    lines = cap_lines(cap, in_use)
    if not lines:
        return f'<span class="lf-muted">{NO_CAP}</span>'
    out = []
    for ln in lines:
        bar = (
            meter_html(ln["used"], ln["cap"], ln["text"])
            if ln["cap"] is not None
            else f'<span class="lf-meter-text">{esc(ln["text"])}</span>'
        )
        out.append(f'<div class="lf-cap" data-slot="{esc(ln["slot"])}"><b>{esc(ln["slot"])}</b> {bar}</div>')
    return "".join(out)


def domain_rows(
    domains: Iterable[Mapping[str, Any]], projects: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """One row per domain: name, cap, in_use, how many of its projects are in reach, active."""
    counts: dict[str, int] = {}
    for p in projects:
        counts[str(p.get("domain"))] = counts.get(str(p.get("domain")), 0) + 1
    return [
        {
            "name": str(d.get("name", "")),
            "cap": dict(d.get("total_resource_slots") or {}),
            "in_use": dict(d.get("in_use") or {}),
            "projects": counts.get(str(d.get("name")), 0),
            "active": bool(d.get("is_active", True)),
        }
        for d in domains
    ]


def project_rows(projects: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per project, by domain then name: full name, cap, in_use, members, active."""
    rows = [
        {
            "domain": str(p.get("domain", "")),
            "name": str(p.get("name", "")),
            "full_name": str(p.get("full_name") or f"{p.get('domain')}/{p.get('name')}"),
            "cap": dict(p.get("total_resource_slots") or {}),
            "in_use": dict(p.get("in_use") or {}),
            "members": sorted(str(m) for m in p.get("members") or ()),
            "active": bool(p.get("is_active", True)),
        }
        for p in projects
    ]
    return sorted(rows, key=lambda r: (r["domain"], r["name"]))


def _state(active: bool) -> str:
    return "active" if active else "inactive"


def domains_html(rows: Sequence[Mapping[str, Any]]) -> str:
    """The domains' table; each row carries ``data-domain``."""
    if not rows:
        return '<div class="lf-admin lf-muted">No domain in your reach.</div>'
    head = "".join(f"<th>{esc(c)}</th>" for c in DOMAIN_COLUMNS)
    body = "".join(
        f'<tr data-domain="{esc(r["name"])}"><td><b>{esc(r["name"])}</b></td>'
        f"<td>{caps_html(r['cap'], r['in_use'])}</td><td>{r['projects']}</td><td>{_state(r['active'])}</td></tr>"
        for r in rows
    )
    return f'<div class="lf-admin"><table class="lf-table lf-domain-caps"><tr>{head}</tr>{body}</table></div>'


def projects_html(rows: Sequence[Mapping[str, Any]]) -> str:
    """The projects' table; each row carries ``data-project`` (DOMAIN/NAME)."""
    if not rows:
        return '<div class="lf-admin lf-muted">No project in your reach.</div>'
    head = "".join(f"<th>{esc(c)}</th>" for c in PROJECT_COLUMNS)
    body = "".join(
        f'<tr data-project="{esc(r["full_name"])}"><td><b>{esc(r["full_name"])}</b></td>'
        f"<td>{caps_html(r['cap'], r['in_use'])}</td>"
        f"<td>{esc(', '.join(r['members']) or 'none')}</td><td>{_state(r['active'])}</td></tr>"
        for r in rows
    )
    return (
        f'<div class="lf-admin"><table class="lf-table lf-project-caps"><tr>{head}</tr>{body}</table></div>'
    )


# ---------------------------------------------------------------- the forms' bodies (pure)


def cap_body(text: str, before: Mapping[str, Any]) -> dict[str, Any]:
    """The PATCH body for a cap written in the form: ``{"total_resource_slots": ...}``, or nothing
    when it says what the domain or project already has. Raises :class:`FormError` for a text that
    cannot be read (the amounts themselves are the service's to judge)."""
    slots = parse_slots(text)
    old = dict(before.get("total_resource_slots") or {})
    new_c, old_c = canonical_slots(slots), canonical_slots(old)
    if new_c is not None and new_c == old_c:
        return {}
    return {"total_resource_slots": slots}


def _name(text: str, what: str) -> str:
    name = (text or "").strip()
    if not name:
        raise FormError(f"write the {what}")
    return name


def new_project_body(domain: str, name: str, caps: str, description: str = "") -> dict[str, Any]:
    """The POST /projects body for the create form (the service checks the name)."""
    body: dict[str, Any] = {
        "domain": _name(domain, "project's domain"),
        "name": _name(name, "project's name"),
    }
    slots = parse_slots(caps)
    if slots:
        body["total_resource_slots"] = slots
    if description.strip():
        body["description"] = description.strip()
    return body


def new_domain_body(name: str, caps: str, description: str = "") -> dict[str, Any]:
    """The POST /domains body for the create form (a superadmin's)."""
    body: dict[str, Any] = {"name": _name(name, "domain's name")}
    slots = parse_slots(caps)
    if slots:
        body["total_resource_slots"] = slots
    if description.strip():
        body["description"] = description.strip()
    return body


def member_name(text: str, members: Iterable[str]) -> str:
    """The user name to add: one name, not already a member (the service says whether it exists)."""
    name = _name(text, "user name to add")
    if any(c.isspace() or c == "," for c in name):
        raise FormError("add one user at a time: write one user name")
    if name in set(members):
        raise FormError(f"{name} is already a member")
    return name


def read_only_reason(role: str, kind: str) -> str:
    """Why the viewer may not change this ``kind`` (``domain`` or ``project``); "" when they may."""
    if role == "monitor":
        return "Read only: a monitor changes nothing."
    if kind == "domain" and role != "superadmin":
        return "Read only: only a superadmin changes a domain's cap or creates domains."
    if role not in ("superadmin", "admin"):
        return "Read only."
    return ""


def domain_path(name: str) -> str:
    return f"/domains/{quote(name, safe='')}"


def project_path(domain: str, name: str) -> str:
    return f"/projects/{quote(domain, safe='')}/{quote(name, safe='')}"


def member_path(domain: str, name: str, username: str = "") -> str:
    tail = f"/{quote(username, safe='')}" if username else ""
    return f"{project_path(domain, name)}/members{tail}"


# ---------------------------------------------------------------- the widgets

DESC = {"description_width": "130px"}
PAGE_STYLE = """<style>
.lf-cap { white-space: nowrap; line-height: 1.6; }
.lf-cap b { display: inline-block; min-width: 84px; font-weight: 600; }
.lf-meaning { color: var(--jp-ui-font-color2, #757575); font-size: 0.85em; margin-left: 10px;
  font-family: var(--jp-ui-font-family, sans-serif); max-width: 520px; line-height: 1.3; }
.lf-form { border: 1px solid var(--jp-border-color2, #ddd); border-radius: 4px; padding: 6px 12px;
  margin: 6px 0; background: var(--jp-layout-color1, #fff); }
</style>"""


def _field(label: str, placeholder: str = "", width: str = "430px") -> W.Text:
    return W.Text(description=label, placeholder=placeholder, style=DESC, layout=W.Layout(width=width))


def _meaning(text: str) -> W.HTML:
    return W.HTML(f'<div class="lf-meaning">{esc(text)}</div>')


def _tag(widget: W.Widget, *classes: str) -> W.Widget:
    """``widget`` with CSS classes (what the browser tests find it by); buttons as wide as their text."""
    if isinstance(widget, W.Button):
        widget.layout.width = "auto"
    for c in classes:
        widget.add_class(c)
    return widget


def _attempt(say: Say, fn: Callable[[], Any]) -> bool:
    """``fn()``; a form that cannot be read or a service refusal is said, and False returned."""
    try:
        fn()
    except FormError as e:
        say(str(e), True)
        return False
    except ServiceError as e:
        say(f"The labfleet service said: {e.message}", True)
        return False
    return True


def domain_editor(
    client: Any, domains: Sequence[Mapping[str, Any]], say: Say, done: Callable[[], None]
) -> W.VBox:
    """A superadmin changes a domain's cap, or creates a domain (read only for anyone else)."""
    why = read_only_reason(client.role, "domain")
    if why and client.role != "monitor":  # a domain admin: no form to show disabled, only why
        return _tag(W.VBox([muted(why)]), "lf-domain-editor")
    by_name = {str(d.get("name")): d for d in domains}
    pick = _tag(
        W.Dropdown(options=list(by_name), description="Domain", style=DESC, layout=W.Layout(width="430px")),
        "lf-domain-pick",
    )
    cap = _tag(_field("Cap", NO_CAP), "lf-domain-cap")
    save = _tag(
        W.Button(description="Save domain cap", button_style="primary", icon="check"), "lf-domain-save"
    )
    new_name = _tag(_field("New domain", "name"), "lf-new-domain-name")
    new_cap = _tag(_field("Its cap", NO_CAP), "lf-new-domain-cap")
    create = _tag(W.Button(description="Create domain", icon="plus"), "lf-create-domain")

    def load(*_: Any) -> None:
        if pick.value in by_name:
            cap.value = fmt_slots_text(by_name[pick.value].get("total_resource_slots"))

    def do_save(_: Any) -> None:
        target = str(pick.value)
        body: dict[str, Any] = {}

        def send() -> None:
            body.update(cap_body(cap.value, by_name[target]))
            if body:
                client.patch(domain_path(target), body)

        if _attempt(say, send):
            if not body:
                say(f"Nothing to save: domain {target} already has that cap.", False)
                return
            say(
                f"Saved domain {target}: cap {fmt_slots_text(body['total_resource_slots']) or NO_CAP}.", False
            )
            done()

    def do_create(_: Any) -> None:
        def send() -> None:
            client.post("/domains", new_domain_body(new_name.value, new_cap.value))

        if _attempt(say, send):
            done()  # built anew first: the message shows once the new page is there
            say(f"Created domain {new_name.value.strip()}.", False)

    pick.observe(load, "value")
    save.on_click(do_save)
    create.on_click(do_create)
    load()
    for w in (pick, cap, save, new_name, new_cap, create):
        w.disabled = bool(why) and w is not pick
    rows: list[W.Widget] = []
    if why:
        rows.append(muted(why))
    if by_name:
        rows += [pick, W.HBox([cap, _meaning(CAP_MEANING)]), W.HBox([form_label(""), save])]
    rows += [W.HBox([new_name, new_cap]), W.HBox([form_label(""), create])]
    return _tag(W.VBox(rows), "lf-form", "lf-domain-editor")


def members_box(
    client: Any, project: Mapping[str, Any], can_change: bool, say: Say, done: Callable[[], None]
) -> W.VBox:
    """A project's members: a Remove button each (a second click confirms), and a name field + Add."""
    domain, name = str(project["domain"]), str(project["name"])
    full = f"{domain}/{name}"
    members = sorted(str(m) for m in project.get("members") or ())
    rows: list[W.Widget] = []
    for user in members:
        remove = W.Button(
            description="Remove",
            icon="user-times",
            tooltip=f"Remove {user} from {full}",
            disabled=not can_change,
            layout=W.Layout(width="170px"),
        )
        remove.add_class("lf-member-remove")

        def on_remove(user: str = user) -> bool:
            if not _attempt(say, lambda: client.delete(member_path(domain, name, user))):
                return False
            done()  # built anew first: the message shows once the new page is there
            say(f"Removed {user} from {full}.", False)
            return True

        confirm_first(
            remove, on_remove, f"Remove {user} from {full}? Their new sessions may not use it.", say
        )
        rows.append(
            _tag(
                W.HBox(
                    [form_label(""), W.HTML(f"<b>{esc(user)}</b>", layout=W.Layout(width="200px")), remove]
                ),
                "lf-member",
            )
        )
    if not members:
        rows.append(W.HBox([form_label(""), muted("No member yet.")]))
    who = _tag(_field("Add member", "user name (same domain)"), "lf-member-name")
    add = _tag(
        W.Button(description="Add", icon="user-plus", tooltip=f"Add a member to {full}"), "lf-member-add"
    )
    who.disabled = add.disabled = not can_change

    def on_add(_: Any) -> None:
        added: list[str] = []

        def send() -> None:
            added.append(member_name(who.value, members))
            client.post(member_path(domain, name), {"username": added[0]})

        if _attempt(say, send):
            done()  # built anew first: the message shows once the new page is there
            say(f"Added {added[0]} to {full}.", False)

    add.on_click(on_add)
    rows.append(W.HBox([who, add]))
    return _tag(W.VBox(rows), "lf-members")


def project_editor(
    client: Any,
    projects: Sequence[Mapping[str, Any]],
    state: dict[str, Any],
    say: Say,
    done: Callable[[], None],
) -> W.VBox:
    """Pick a project; change its cap, its members, or delete it (asked twice)."""
    why = read_only_reason(client.role, "project")
    by_full = {f"{p['domain']}/{p['name']}": p for p in projects}
    chosen = state.get("project") if state.get("project") in by_full else next(iter(by_full))
    pick = _tag(
        W.Dropdown(
            options=list(by_full),
            value=chosen,
            description="Project",
            style=DESC,
            layout=W.Layout(width="430px"),
        ),
        "lf-project-pick",
    )
    body = W.VBox()

    def show(*_: Any) -> None:
        state["project"] = pick.value
        p = by_full[pick.value]
        domain, name = str(p["domain"]), str(p["name"])
        cap = _tag(_field("Cap", NO_CAP), "lf-project-cap")
        cap.value = fmt_slots_text(p.get("total_resource_slots"))
        save = _tag(
            W.Button(description="Save project cap", button_style="primary", icon="check"), "lf-project-save"
        )
        delete = _tag(
            W.Button(description="Delete project", icon="trash", tooltip=f"Delete {pick.value}"),
            "lf-project-delete",
        )
        cap.disabled = save.disabled = delete.disabled = bool(why)

        def do_save(_: Any) -> None:
            sent: dict[str, Any] = {}

            def send() -> None:
                sent.update(cap_body(cap.value, p))
                if sent:
                    client.patch(project_path(domain, name), sent)

            if _attempt(say, send):
                if not sent:
                    say(f"Nothing to save: {domain}/{name} already has that cap.", False)
                    return
                text = fmt_slots_text(sent["total_resource_slots"]) or NO_CAP
                done()  # built anew first: the message shows once the new page is there
                say(f"Saved project {domain}/{name}: cap {text}.", False)

        def do_delete() -> bool:
            if not _attempt(say, lambda: client.delete(project_path(domain, name))):
                return False
            state["project"] = None
            done()  # built anew first: the message shows once the new page is there
            say(f"Deleted project {domain}/{name}.", False)
            return True

        save.on_click(do_save)
        confirm_first(
            delete,
            do_delete,
            f"Delete project {domain}/{name}? Its members leave it; this cannot be undone.",
            say,
        )
        body.children = [
            W.HBox([cap, _meaning(CAP_MEANING)]),
            W.HBox([form_label(""), save, delete]),
            W.HTML(f'{STYLE}<div class="lf-admin"><b>Members of {esc(pick.value)}</b></div>'),
            members_box(client, p, not why, say, done),
        ]

    pick.observe(show, "value")
    show()
    rows: list[W.Widget] = [muted(why)] if why else []
    return _tag(W.VBox([*rows, pick, body]), "lf-form", "lf-project-editor")


def project_creator(client: Any, domains: Sequence[str], say: Say, done: Callable[[], None]) -> W.VBox:
    """A new project in one of the domains in reach (a domain admin's is their own only)."""
    why = read_only_reason(client.role, "project")
    where = _tag(
        W.Dropdown(options=list(domains), description="Domain", style=DESC, layout=W.Layout(width="430px")),
        "lf-new-project-domain",
    )
    name = _tag(_field("New project", "name"), "lf-new-project-name")
    cap = _tag(_field("Its cap", NO_CAP), "lf-new-project-cap")
    create = _tag(W.Button(description="Create project", icon="plus"), "lf-create-project")
    for w in (where, name, cap, create):
        w.disabled = bool(why) or not domains

    def do_create(_: Any) -> None:
        def send() -> None:
            client.post("/projects", new_project_body(str(where.value or ""), name.value, cap.value))

        if _attempt(say, send):
            done()  # built anew first: the message shows once the new page is there
            say(f"Created project {where.value}/{name.value.strip()}.", False)

    create.on_click(do_create)
    return _tag(
        W.VBox([where, W.HBox([name, cap]), W.HBox([form_label(""), create])]),
        "lf-form",
        "lf-project-creator",
    )


def page(client: Any) -> W.VBox:
    """The whole page below its header: the two tables and their forms, built again after a change."""
    state: dict[str, Any] = {"project": None}

    def build(say: Say, refresh: Callable[[], None]) -> W.VBox:
        domains = client.get("/domains")
        projects = client.get("/projects")
        parts: list[W.Widget] = [
            W.HTML(STYLE + PAGE_STYLE),
            section("Domains", NOTES["domains"]),
            W.HTML(STYLE + PAGE_STYLE + domains_html(domain_rows(domains, projects))),
            domain_editor(client, domains, say, refresh),
            section("Projects", NOTES["projects"]),
            W.HTML(STYLE + PAGE_STYLE + projects_html(project_rows(projects))),
        ]
        if projects:
            parts.append(project_editor(client, projects, state, say, refresh))
        parts.append(section("New project"))
        parts.append(project_creator(client, [str(d.get("name")) for d in domains], say, refresh))
        return W.VBox(parts)

    return refreshable_page(build)
