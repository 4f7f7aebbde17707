"""The Resource policies page's domains: the keypair policies each domain's admins may give.

A superadmin chooses, per domain, the keypair policies its admins may give its users' keypairs
(``allowed_keypair_policies``, see ``hub_ext/tenancy/keypairs.py``): a domain admin may hand out
those beside any policy no looser than a user's main keypair's, and a user a domain admin creates
without naming one gets the first of them. A domain with no list is bounded by its caps only: its
admins' new users get ``default``.

Everything goes through the labfleet service's ``/api/domains`` routes as the viewer: each viewer
sees the domains in their reach, only a superadmin changes a domain (the service refuses anyone
else, and the form is disabled for them). The names are written as people write them (``gold,
silver``); the service judges them (an unknown policy is refused with its own message, and nothing
changes). Only a changed list is sent. Pure helpers first (plain values in, plain values or HTML
out, unit-tested without a kernel), then the widgets.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import ipywidgets as W

from labfleet.console.console import ServiceError, message
from labfleet.console.resources import STYLE, form_label, muted
from labfleet.core.display import esc, fmt_slots

COLUMNS = ("domain", "total cap", "keypair policies its admins may give", "state")
DEFAULT_POLICY = "default"  # what a domain admin's new users get in a domain with no list
NOTE = (
    "The keypair policies each domain's admins may give its users' keypairs, beside any no looser "
    "than a user's main keypair's; a user a domain admin creates without naming one gets the first. "
    "A domain with no list is bounded by its caps only: its admins' new users get default."
)

# ---------------------------------------------------------------- the form and the table (pure)


def parse_policy_names(text: str) -> list[str]:
    """``gold, silver`` (or one a line) -> ``["gold", "silver"]``: in order, each once; an empty
    text is no list. The names themselves are the service's to judge."""
    names = [n for n in re.split(r"[,;\s]+", text or "") if n]
    return list(dict.fromkeys(names))


def fmt_policy_names(names: Iterable[Any] | None) -> str:
    """The form's text for a list of policy names (what :func:`parse_policy_names` reads back)."""
    return ", ".join(str(n) for n in names or ())


def allowed_text(names: Sequence[Any] | None) -> str:
    """A domain's list as the table says it, with what a domain admin's new users get."""
    if not names:
        return f"none: bounded by its caps (new users get {DEFAULT_POLICY})"
    return f"{fmt_policy_names(names)} (new users get {names[0]})"


def domain_rows(domains: Iterable[Mapping[str, Any]]) -> list[list[str]]:
    """One row of text per domain, in :data:`COLUMNS` order."""
    return [
        [
            str(d.get("name", "")),
            fmt_slots(d["total_resource_slots"]) if d.get("total_resource_slots") else "no cap",
            allowed_text(list(d.get("allowed_keypair_policies") or ())),
            "active" if d.get("is_active", True) else "inactive",
        ]
        for d in domains
    ]


def domains_html(rows: Sequence[Sequence[str]]) -> str:
    """The domains as a table; each row carries ``data-domain``."""
    if not rows:
        return '<div class="lf-admin lf-muted">No domain in your reach.</div>'
    head = "".join(f"<th>{esc(c)}</th>" for c in COLUMNS)
    body = "".join(
        f'<tr data-domain="{esc(r[0])}"><td><b>{esc(r[0])}</b></td>'
        + "".join(f"<td>{esc(v)}</td>" for v in r[1:])
        + "</tr>"
        for r in rows
    )
    return f'<div class="lf-admin"><table class="lf-table lf-domains"><tr>{head}</tr>{body}</table></div>'


def domain_body(text: str, before: Mapping[str, Any]) -> dict[str, Any]:
    """The PATCH body for the form's text: the new list, or nothing when it is the same."""
    names = parse_policy_names(text)
    if names == [str(n) for n in before.get("allowed_keypair_policies") or ()]:
        return {}
    return {"allowed_keypair_policies": names}


def read_only_reason(role: str) -> str:
    """Why the viewer may not change a domain's list ("" for a superadmin, who may)."""
    if role == "superadmin":
        return ""
    if role == "monitor":
        return "Read only: a monitor changes nothing."
    return "Read only: only a superadmin chooses the keypair policies a domain's admins may give."


def domain_path(name: str) -> str:
    return f"/domains/{quote(name, safe='')}"


# ---------------------------------------------------------------- the widgets

DESC = {"description_width": "130px"}


def section(client: Any, heading: Callable[[str, str], W.Widget]) -> W.VBox:
    """The domains' table and a form to change one's list; it redraws itself after a change.
    ``heading(title, note)`` draws the page's section titles."""
    out = W.VBox()
    state: dict[str, str] = {"said": "", "name": ""}

    def build() -> list[W.Widget]:
        try:
            domains = client.get("/domains")
        except ServiceError as e:
            return [message(f"The labfleet service said: {e.message}", error=True)]
        parts: list[W.Widget] = [
            heading("Domains", NOTE),
            W.HTML(STYLE + domains_html(domain_rows(domains))),
        ]
        if domains:
            parts.append(editor(domains, client, done, state["name"], state["said"]))
        state["said"] = ""
        return parts

    def done(text: str, name: str) -> None:
        state.update(said=text, name=name)
        out.children = build()

    out.children = build()
    return out


def editor(
    domains: Sequence[Mapping[str, Any]],
    client: Any,
    on_saved: Callable[[str, str], None],
    selected: str = "",
    said: str = "",
) -> W.VBox:
    """Pick a domain, change the keypair policies its admins may give, save. A refusal (an
    unknown policy, a viewer who is no superadmin) shows under the button and changes nothing."""
    why = read_only_reason(client.role)
    by_name = {str(d.get("name")): d for d in domains}
    pick = W.Dropdown(
        options=list(by_name),
        value=selected if selected in by_name else next(iter(by_name)),
        description="Domain",
        style=DESC,
        layout=W.Layout(width="430px"),
    )
    names = W.Text(
        description="Keypair policies",
        placeholder="none: bounded by its caps",
        style=DESC,
        layout=W.Layout(width="430px"),
    )
    save = W.Button(
        description="Save domain", button_style="primary", icon="check", layout=W.Layout(width="auto")
    )
    note = W.HTML(message(said).value if said else "")

    def load(*_: Any) -> None:
        names.value = fmt_policy_names(by_name[pick.value].get("allowed_keypair_policies"))

    def picked(*_: Any) -> None:
        note.value = ""
        load()

    def do_save(_: Any) -> None:
        target = str(pick.value)
        body = domain_body(names.value, by_name[target])
        if not body:
            note.value = muted("Nothing to save: the form says what the domain already has.").value
            return
        try:
            client.patch(domain_path(target), body)
        except ServiceError as e:
            note.value = message(f"The labfleet service said: {e.message}", error=True).value
            return
        listed = fmt_policy_names(body["allowed_keypair_policies"]) or "none"
        on_saved(f"Saved domain {target}: keypair policies its admins may give: {listed}.", target)

    pick.observe(picked, "value")
    save.on_click(do_save)
    load()
    names.disabled = save.disabled = bool(why)
    meaning = W.HTML(
        '<div class="lf-meaning">keypair policy names, comma-separated, in order: the first is what a '
        "domain admin's new users get; empty: none</div>"
    )
    rows: list[W.Widget] = [
        pick,
        W.HBox([names, meaning], layout=W.Layout(align_items="center")),
        W.HBox([form_label(""), save]),
        W.HBox([form_label(""), note]),
    ]
    if why:
        rows.insert(0, muted(why))
    box = W.VBox(rows)
    box.add_class("lf-form")
    box.add_class("lf-domain-form")
    return box
