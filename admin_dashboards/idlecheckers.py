"""The Resource policies page's idle checkers: the rules that reclaim idle sessions, and a preview.

A checker (``activity``: no activity for ``timeout`` seconds; ``utilization``: CPU, memory or GPU use
under thresholds over a ``window``) is bound to domains, projects and resource groups
(``/api/idle-checkers``); with the keypair policies' idle timeout they make each session's rules.
Superadmins change every checker, a domain admin those bound only to their domain and its projects,
monitors read; the service decides and its refusals show in its own words. The preview
(``/api/idle-checkers/preview``) says what the reclaimer would reclaim now, and why, changing
nothing. Pure helpers first (what a checker reads as, what the form sends), then the widgets.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import quote

import ipywidgets as W

from labfleet.console.console import FormError, ServiceError, message, table

KINDS = ("activity", "utilization")
SCOPES = ("domain", "project", "resource_group")
# What the form starts with for each kind: an example the service accepts as it is.
EXAMPLES = {
    "activity": {"timeout": 3600},
    "utilization": {"window": 1200, "grace": 600, "thresholds": {"gpu_util": 5, "cpu_util": 10}},
}


def fmt_seconds(value: Any) -> str:
    """``3600`` -> ``1h``, ``90`` -> ``1m 30s``."""
    try:
        left = int(value)
    except (TypeError, ValueError):
        return str(value)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    if left or not parts:
        parts.append(f"{left}s")
    return " ".join(parts)


def options_text(kind: str, options: Mapping[str, Any]) -> str:
    """A checker's options as a person reads them."""
    contention = " (only while sessions wait in the queue)" if options.get("only_when_queue_waiting") else ""
    if kind == "activity":
        return f"no activity for {fmt_seconds(options.get('timeout'))}{contention}"
    thresholds = options.get("thresholds") or {}
    joined = f" {options.get('combine', 'and')} ".join(
        f"{name} under {value:g}%" for name, value in sorted(thresholds.items())
    )
    grace = options.get("grace") or 0
    return (
        f"{joined} over {fmt_seconds(options.get('window'))}"
        + (f", after a grace of {fmt_seconds(grace)}" if grace else "")
        + contention
    )


def bindings_text(bindings: Iterable[Mapping[str, Any]]) -> str:
    return ", ".join(f"{b.get('scope')}:{b.get('name')}" for b in bindings) or "nothing (it applies nowhere)"


def checker_rows(checkers: Iterable[Mapping[str, Any]]) -> list[list[str]]:
    """One row per checker: name, kind, what it judges, where it applies, whose it is."""
    return [
        [
            str(c.get("name", "")),
            str(c.get("kind", "")),
            options_text(str(c.get("kind", "")), c.get("options") or {}),
            bindings_text(c.get("bindings") or ()),
            str(c.get("owner_domain") or "the fleet"),
        ]
        for c in checkers
    ]


def parse_bindings(text: str) -> list[dict[str, str]]:
    """``domain:acme, resource_group:a100, project:acme/ml`` (commas or lines) as the API's bindings."""
    out = []
    for raw in text.replace("\n", ",").split(","):
        item = raw.strip()
        if not item:
            continue
        scope, sep, name = item.partition(":")
        if not sep or scope.strip() not in SCOPES or not name.strip():
            raise FormError(f"binding {item!r:.60} is not SCOPE:NAME with SCOPE one of {', '.join(SCOPES)}")
        out.append({"scope": scope.strip(), "name": name.strip()})
    return out


def parse_options(text: str) -> dict[str, Any]:
    """The options box: a JSON object (the service checks what it holds)."""
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError as e:
        raise FormError(f"options are not JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    if not isinstance(value, dict):
        raise FormError('options must be a JSON object, like {"timeout": 3600}')
    return value


def create_body(name: str, kind: str, options: str, bindings: str, description: str) -> dict[str, Any]:
    """What the form's Create sends; FormError for what the form itself can tell is wrong."""
    if not name.strip():
        raise FormError("a checker needs a name")
    body: dict[str, Any] = {
        "name": name.strip(),
        "kind": kind,
        "options": parse_options(options),
        "bindings": parse_bindings(bindings),
    }
    if description.strip():
        body["description"] = description.strip()
    return body


def preview_rows(preview: Mapping[str, Any]) -> list[list[str]]:
    """The preview's sessions: who, where, which checker, why, and whether it would go now."""
    return [
        [
            str(s.get("session", ""))[:8],
            str(s.get("user", "")),
            str(s.get("project", "")),
            str(s.get("resource_group", "")),
            str(s.get("checker", "")),
            f"{s.get('reason', '')}: {s.get('detail', '')}",
            fmt_seconds(s.get("idle_for", 0)),
            "reclaimed now" if s.get("would_reclaim") else "kept (nobody waits)",
        ]
        for s in preview.get("sessions") or ()
    ]


# ---------------------------------------------------------------- the widgets


def section(client: Any, heading: Callable[[str, str], W.Widget]) -> W.VBox:
    """The idle checkers: their table, a form to add one, delete, and the preview. It redraws
    itself after a change; ``heading(title, note)`` draws the page's section titles."""
    out = W.VBox()
    said: dict[str, str] = {"text": ""}

    def build() -> list[W.Widget]:
        try:
            checkers = client.get("/idle-checkers")
        except ServiceError as e:
            return [message(f"The labfleet service said: {e.message}", error=True)]
        parts: list[W.Widget] = [
            heading(
                "Idle checkers",
                "What reclaims idle sessions, beside each keypair policy's idle timeout. Every rule that "
                "applies to a session is judged; the strictest wins.",
            ),
            table(["checker", "kind", "judges", "applies to", "whose"], checker_rows(checkers))
            if checkers
            else message("No idle checker yet: only the keypair policies' idle timeouts reclaim."),
        ]
        if said["text"]:
            parts.append(message(said["text"]))
        said["text"] = ""
        parts.append(_form(client, [str(c.get("name")) for c in checkers], done))
        parts.append(_preview(client))
        return parts

    def done(text: str) -> None:
        said["text"] = text
        out.children = build()

    out.children = build()
    return out


def _form(client: Any, names: list[str], done: Callable[[str], None]) -> W.VBox:
    """Add a checker, delete one; a refusal shows under the form, which keeps what was typed."""
    can_change = client.can_change
    said = W.VBox()

    def failed(text: str) -> None:
        said.children = [message(text, error=True)]

    name = W.Text(description="Name", placeholder="gpu-idle")
    kind = W.Dropdown(options=KINDS, value="utilization", description="Kind")
    options = W.Textarea(
        value=json.dumps(EXAMPLES["utilization"]), description="Options", layout=W.Layout(width="520px")
    )
    bindings = W.Text(
        description="Applies to",
        placeholder="resource_group:a100, domain:acme",
        layout=W.Layout(width="520px"),
    )
    description = W.Text(description="Description", layout=W.Layout(width="520px"))
    create = W.Button(
        description="Create checker", icon="plus", button_style="primary", disabled=not can_change
    )
    create.add_class("lf-idle-create")
    victim = W.Dropdown(options=names or [""], description="Checker")
    delete = W.Button(description="Delete", icon="trash", disabled=not (can_change and names))
    delete.add_class("lf-idle-delete")

    def kind_changed(change: Any) -> None:
        options.value = json.dumps(EXAMPLES[change["new"]])

    def do_create(_: Any) -> None:
        try:
            body = create_body(name.value, kind.value, options.value, bindings.value, description.value)
            client.post("/idle-checkers", body)
        except FormError as e:
            failed(str(e))
            return
        except ServiceError as e:
            failed(f"The labfleet service said: {e.message}")
            return
        done(f"Created idle checker {body['name']}.")

    def do_delete(_: Any) -> None:
        try:
            client.delete(f"/idle-checkers/{quote(str(victim.value), safe='')}")
        except ServiceError as e:
            failed(f"The labfleet service said: {e.message}")
            return
        done(f"Deleted idle checker {victim.value}.")

    kind.observe(kind_changed, "value")
    create.on_click(do_create)
    delete.on_click(do_delete)
    rows: list[W.Widget] = [
        name,
        kind,
        options,
        bindings,
        description,
        create,
        said,
        W.HBox([victim, delete]),
    ]
    if not can_change:
        rows.insert(0, message("Read only: a monitor changes nothing."))
    box = W.VBox(rows)
    box.add_class("lf-idle-form")
    return box


def _preview(client: Any) -> W.VBox:
    button = W.Button(description="Preview reclamation", icon="eye", layout=W.Layout(width="200px"))
    button.add_class("lf-idle-preview")
    shown = W.VBox()

    def show(_: Any) -> None:
        try:
            rows = preview_rows(client.get("/idle-checkers/preview"))
        except ServiceError as e:
            shown.children = [message(f"The labfleet service said: {e.message}", error=True)]
            return
        columns = ["session", "user", "project", "group", "checker", "why", "idle for", "now"]
        shown.children = [table(columns, rows) if rows else message("Nothing would be reclaimed now.")]

    button.on_click(show)
    return W.VBox([button, shown])
