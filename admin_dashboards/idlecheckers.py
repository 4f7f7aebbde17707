"""The Resource policies page's idle checkers: the rules that reclaim idle sessions, and a preview.

A checker (``activity``: no activity for ``timeout`` seconds; ``utilization``: CPU, memory or GPU use
under thresholds over a ``window``) is bound to domains, projects and resource groups
(``/api/idle-checkers``); with the keypair policies' idle timeout they make each session's rules.
Superadmins change every checker, a domain admin those bound only to their domain and its projects,
monitors read; the service decides and its refusals show in its own words. The preview
(``/api/idle-checkers/preview``) says what the reclaimer would reclaim now, and why, changing
nothing. Pure helpers first (what a checker reads as, what the form sends), then the widgets.

The form has a field per option of the chosen kind (:data:`OPTION_FIELDS`, a table that
``tests/unit/test_admin_idlecheckers.py`` checks against :mod:`labfleet.reclaim.checkers`, the
service's own reading of the options, so the two cannot drift). It sends what the fields say; the
service judges it, and its refusal shows in its words. Delete asks first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import ipywidgets as W

from labfleet.console.console import FormError, ServiceError, confirm_first, message, table

KINDS = ("activity", "utilization")
SCOPES = ("domain", "project", "resource_group")


@dataclass(frozen=True)
class OptionField:
    """One option of a checker kind as the form shows it.

    ``type``: ``seconds`` (a number of seconds), ``percent`` (one of the ``thresholds``: a percent,
    blank when not judged), ``choice`` (one of ``choices``) or ``flag`` (true or false); ``default``:
    the service's own when the option is left out (None: the option is required, or a threshold);
    ``start``: what a new checker's field holds (an example the service accepts)."""

    name: str
    label: str
    type: str
    default: Any = None
    start: Any = None
    choices: tuple[str, ...] = ()
    hint: str = ""


CONTENTION = OptionField(
    "only_when_queue_waiting", "Only while sessions wait in the queue", "flag", False, False
)
# Each kind's options (labfleet.reclaim.checkers.parse_options reads them: names, types, defaults).
OPTION_FIELDS: dict[str, tuple[OptionField, ...]] = {
    "activity": (
        OptionField("timeout", "Timeout (s)", "seconds", None, 3600, hint="seconds without activity"),
        CONTENTION,
    ),
    "utilization": (
        OptionField("window", "Window (s)", "seconds", None, 1200, hint="seconds the use is averaged over"),
        OptionField("grace", "Grace (s)", "seconds", 0, 600, hint="seconds after the start not judged"),
        OptionField("thresholds.cpu_util", "CPU use under (%)", "percent", None, 10),
        OptionField("thresholds.mem", "Memory under (%)", "percent"),
        OptionField("thresholds.gpu_util", "GPU use under (%)", "percent", None, 5),
        OptionField("thresholds.gpu_mem", "GPU memory under (%)", "percent"),
        OptionField("combine", "Idle when", "choice", "and", "and", ("and", "or"), "and: all under; or: any"),
        CONTENTION,
    ),
}


def field_text(f: OptionField, value: Any) -> Any:
    """What a field holds for ``value`` (an option's value, None: the field's start): text for a
    number, the choice, or the flag."""
    value = f.start if value is None else value
    if f.type == "flag":
        return bool(value)
    if f.type == "choice":
        return str(value)
    if value is None:
        return ""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _number(text: Any) -> Any:
    """``"3600"`` -> 3600, ``"2.5"`` -> 2.5; anything else as typed, for the service to judge."""
    raw = str(text).strip()
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        return float(raw)
    except ValueError:
        return raw


def options_body(kind: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The options the fields of ``kind`` say (``values``: field name -> what the field holds); a
    blank field is left out (the service's default, or its message when the option is required)."""
    out: dict[str, Any] = {}
    for f in OPTION_FIELDS.get(kind, ()):
        value = values.get(f.name)
        if f.type == "flag":
            out[f.name] = bool(value)
        elif f.type == "choice":
            out[f.name] = value
        elif value is not None and str(value).strip():
            top, _, sub = f.name.partition(".")
            if sub:
                out.setdefault(top, {})[sub] = _number(value)
            else:
                out[f.name] = _number(value)
    return out


def option_values(kind: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """A checker's ``options`` as the fields of ``kind`` hold them (what Load puts in the form)."""
    out = {}
    for f in OPTION_FIELDS.get(kind, ()):
        top, _, sub = f.name.partition(".")
        value = (options.get(top) or {}).get(sub) if sub else options.get(f.name)
        out[f.name] = "" if value is None and f.type in ("seconds", "percent") else field_text(f, value)
    return out


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


def create_body(
    name: str, kind: str, options: Mapping[str, Any], bindings: str, description: str
) -> dict[str, Any]:
    """What the form's Create sends (``options``: the fields' values, :func:`options_body`);
    FormError for what the form itself can tell is wrong."""
    if not name.strip():
        raise FormError("a checker needs a name")
    body: dict[str, Any] = {
        "name": name.strip(),
        "kind": kind,
        "options": options_body(kind, options),
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
        parts.append(_form(client, checkers, done))
        parts.append(_preview(client))
        return parts

    def done(text: str) -> None:
        said["text"] = text
        out.children = build()

    out.children = build()
    return out


# One label width for the whole form, so its fields line up.
FIELD_STYLE = {"description_width": "170px"}
FIELD_WIDTH = "360px"


def option_widget(f: OptionField, value: Any = None) -> W.Widget:
    """The field of one option (classes ``lf-idle-option`` and ``lf-option-<name>``)."""
    held = field_text(f, value)
    w: W.Widget
    if f.type == "flag":
        w = W.Checkbox(value=held, description=f.label, indent=False)
    elif f.type == "choice":
        w = W.Dropdown(
            options=list(f.choices), value=held, description=f.label, style=FIELD_STYLE,
            layout=W.Layout(width=FIELD_WIDTH),
        )  # fmt: skip
    else:
        w = W.Text(
            value=held,
            description=f.label,
            placeholder=f.hint or ("blank: not judged" if f.type == "percent" else ""),
            style=FIELD_STYLE,
            layout=W.Layout(width=FIELD_WIDTH),
        )
    w.add_class("lf-idle-option")
    w.add_class("lf-option-" + f.name.replace(".", "-").replace("_", "-"))
    return w


def _form(client: Any, checkers: list[Mapping[str, Any]], done: Callable[[str], None]) -> W.VBox:
    """Add a checker or change one (Load puts it in the form), delete one (asking first); a refusal
    shows under the form, which keeps what was typed."""
    can_change = client.can_change
    said = W.VBox()
    names = [str(c.get("name")) for c in checkers]

    def failed(text: str) -> None:
        said.children = [message(text, error=True)]

    wide = W.Layout(width="620px")
    name = W.Text(
        description="Name", placeholder="gpu-idle", style=FIELD_STYLE, layout=W.Layout(width=FIELD_WIDTH)
    )
    kind = W.Dropdown(
        options=KINDS,
        value="utilization",
        description="Kind",
        style=FIELD_STYLE,
        layout=W.Layout(width=FIELD_WIDTH),
    )
    fields = {k: {f.name: option_widget(f) for f in OPTION_FIELDS[k]} for k in KINDS}

    def lined_up(w: W.Widget) -> W.Widget:  # a checkbox under the fields' inputs, not their labels
        if not isinstance(w, W.Checkbox):
            return w
        return W.HBox([W.HTML("", layout=W.Layout(width="176px")), w])

    boxes = {k: W.VBox([lined_up(w) for w in fields[k].values()]) for k in KINDS}
    for k, box in boxes.items():
        box.add_class(f"lf-idle-options-{k}")
    options = W.VBox([boxes[kind.value]])
    options.add_class("lf-idle-options")
    bindings = W.Text(
        description="Applies to",
        placeholder="resource_group:a100, domain:acme",
        style=FIELD_STYLE,
        layout=wide,
    )
    description = W.Text(description="Description", style=FIELD_STYLE, layout=wide)
    create = W.Button(
        description="Create checker", icon="plus", button_style="primary", disabled=not can_change
    )
    create.add_class("lf-idle-create")
    save = W.Button(description="Save changes", icon="save", disabled=not (can_change and names))
    save.add_class("lf-idle-save")
    victim = W.Dropdown(
        options=names or [""], description="Checker", style=FIELD_STYLE, layout=W.Layout(width=FIELD_WIDTH)
    )
    load = W.Button(
        description="Load",
        icon="pencil",
        disabled=not names,
        tooltip="Put this checker in the form to change it",
    )
    load.add_class("lf-idle-load")
    delete = W.Button(
        description="Delete",
        icon="trash",
        disabled=not (can_change and names),
        layout=W.Layout(width="140px"),
    )
    delete.add_class("lf-idle-delete")

    def values() -> dict[str, Any]:
        return {n: w.value for n, w in fields[kind.value].items()}

    def kind_changed(change: Any) -> None:
        options.children = [boxes[change["new"]]]

    def do_create(_: Any) -> None:
        try:
            body = create_body(name.value, kind.value, values(), bindings.value, description.value)
            client.post("/idle-checkers", body)
        except FormError as e:
            failed(str(e))
            return
        except ServiceError as e:
            failed(f"The labfleet service said: {e.message}")
            return
        done(f"Created idle checker {body['name']}.")

    def do_load(_: Any) -> None:
        c = next((c for c in checkers if str(c.get("name")) == victim.value), None)
        if c is None:
            return
        name.value, kind.value = str(c.get("name")), str(c.get("kind"))
        for n, text in option_values(kind.value, c.get("options") or {}).items():
            fields[kind.value][n].value = text
        bindings.value = ", ".join(f"{b.get('scope')}:{b.get('name')}" for b in c.get("bindings") or ())
        description.value = str(c.get("description") or "")
        said.children = []

    def do_save(_: Any) -> None:
        target = name.value.strip()
        try:
            body = create_body(target, kind.value, values(), bindings.value, description.value)
            body = {k: v for k, v in body.items() if k not in ("name", "kind")}
            body.setdefault("description", "")
            client.patch(f"/idle-checkers/{quote(target, safe='')}", body)
        except FormError as e:
            failed(str(e))
            return
        except ServiceError as e:
            failed(f"The labfleet service said: {e.message}")
            return
        done(f"Saved idle checker {target}.")

    def do_delete() -> bool:
        try:
            client.delete(f"/idle-checkers/{quote(str(victim.value), safe='')}")
        except ServiceError as e:
            failed(f"The labfleet service said: {e.message}")
            return False
        done(f"Deleted idle checker {victim.value}.")
        return True

    def warn(text: str, error: bool) -> None:
        said.children = [message(text, error=error)]

    kind.observe(kind_changed, "value")
    create.on_click(do_create)
    save.on_click(do_save)
    load.on_click(do_load)
    confirm_first(
        delete,
        do_delete,
        lambda: f"Delete idle checker {victim.value}? The sessions it applies to are no longer judged by it.",
        warn,
    )
    rows: list[W.Widget] = [
        name,
        kind,
        options,
        bindings,
        description,
        W.HBox([W.HTML("", layout=W.Layout(width="176px")), create, save]),
        said,
        W.HBox([victim, load, delete]),
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
