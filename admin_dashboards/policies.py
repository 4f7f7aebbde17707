"""The Resource policies page: keypair, user and project policies, listed, created, edited, deleted.

Policies are the limits the scheduler and the folder store enforce (``hub_ext/tenancy/policies.py``):

- a **keypair policy** caps what all of a keypair's sessions hold together (total slots, and whether
  a slot it does not name is forbidden or free), how many sessions run and wait at once, how long a
  session may idle or live, and the rights on storage hosts it grants;
- a **user policy** and a **project policy** cap folders: how many, how large one may be, and how
  much all of the owner's folders may hold together (the quota scope); and the owner's environments
  (their own images built from a recipe, "My Environments"): how many, and how many bytes their
  images may take together. A user policy also caps the keypairs its user may hold and their model
  serving endpoints.

Below them, each domain's list of the keypair policies its admins may give (:mod:`labfleet.console.domains`;
a superadmin edits it).

Everything goes through the labfleet service's ``/api/policies/...`` routes as the viewer: every
admin and monitor reads them, only a superadmin changes them (the service refuses anyone else, and
the page disables the form for them). The forms take text as people write it (``cpu=8, mem=32g``,
``2h``, ``10g``, one storage host per line); the pure parsers below turn it into the API's body
and leave the amounts' rules to the service, so a wrong amount (``mem=12zz``) is refused with the
service's own message and nothing changes. Only the fields that changed are sent.

The top half is pure (plain values in, plain values or HTML out) and unit-tested without a kernel;
:func:`page` at the bottom builds the widgets the one-cell notebook shows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import quote

import ipywidgets as W

from labfleet.console import domains, idlecheckers
from labfleet.console.console import FormError, ServiceError, guarded, message
from labfleet.console.resources import STYLE, form_label, muted, section
from labfleet.core.display import esc, fmt_bytes, sort_slots
from labfleet.core.slots import format_amount, parse_bytes

KINDS = ("keypair", "user", "project")
TITLES = {"keypair": "Keypair policies", "user": "User policies", "project": "Project policies"}
NOTES = {
    "keypair": "What a keypair's sessions may hold and for how long. Every user's main keypair (the one "
    "their browser sessions use) has one; new users get the policy named default.",
    "user": "How many folders a user may own, how large one may be, and what all of them may hold together; "
    "how many environments (own images) they may have and what their images may take; how many keypairs "
    "they may hold; how many model serving endpoints, of how many replicas.",
    "project": "The same limits for the folders and the environments a project owns.",
}
CHOICES = ("LIMITED", "UNLIMITED")
RIGHTS = (
    "create-vfolder",
    "mount-in-session",
    "upload-file",
    "download-file",
    "delete-vfolder",
    "invite-others",
)
NEW = ""  # the editor's "new policy" choice (no policy has an empty name)


@dataclass(frozen=True)
class Field:
    """One field of a policy: its API key, its label in the form, what it means, how it is written."""

    key: str
    label: str
    meaning: str
    kind: str  # slots | choice | count | seconds | idle | bytes | hosts


KEYPAIR_FIELDS = (
    Field(
        "total_resource_slots",
        "Total slots",
        "what all the keypair's sessions may hold together, e.g. cpu=8, mem=32g, gpu=1, gpu.shares=2.5",
        "slots",
    ),
    Field(
        "default_for_unspecified",
        "Unnamed slots",
        "LIMITED: a slot not named in the total is not allowed at all; UNLIMITED: it has no limit",
        "choice",
    ),
    Field("max_concurrent_sessions", "Max sessions", "sessions held at once; 0 = no limit", "count"),
    Field(
        "max_pending_sessions", "Max pending", "sessions waiting in a queue at once; 0 = no limit", "count"
    ),
    Field(
        "idle_timeout",
        "Idle timeout",
        "an idle session is reclaimed after this (30m, 2h, 1d or seconds); 0 = never, -1 = the fleet's default",
        "idle",
    ),
    Field(
        "max_session_lifetime",
        "Max lifetime",
        "a session is ended this long after it started (8h, 7d or seconds); 0 = no limit",
        "seconds",
    ),
    Field(
        "allowed_storage_hosts",
        "Storage hosts",
        "rights on storage hosts beyond each host's defaults, one host a line: HOST (every right) or "
        "HOST: right, right",
        "hosts",
    ),
)
FOLDER_FIELDS = (
    Field("max_vfolder_count", "Max folders", "folders the owner may have; 0 = no limit", "count"),
    Field(
        "max_quota_scope_size",
        "Storage quota",
        "what all the owner's folders may hold together (500m, 10g, 1t or bytes); 0 = no limit",
        "bytes",
    ),
    Field(
        "max_vfolder_size",
        "Max folder size",
        "what one folder may hold (500m, 10g or bytes); 0 = no limit",
        "bytes",
    ),
)
# The owner's environments (labfleet.compute.environments): user and project policies alike.
ENVIRONMENT_FIELDS = (
    Field(
        "max_environments",
        "Max environments",
        "environments (own images built from a recipe) the owner may have, failed ones included; "
        "0 = no limit (3 for an owner with no policy)",
        "count",
    ),
    Field(
        "max_environment_bytes",
        "Environment quota",
        "what all the owner's environment images may take together (500m, 10g or bytes); 0 = no limit",
        "bytes",
    ),
)
KEYPAIRS_FIELD = Field(
    "max_keypairs",
    "Max keypairs",
    "active keypairs the user may hold, the main one included; 0 = no limit (10 for a user with no policy)",
    "count",
)
SERVING_FIELDS = (
    Field(
        "max_endpoints", "Max endpoints", "model serving endpoints the user may have; 0 = no limit", "count"
    ),
    Field(
        "max_replicas_per_endpoint",
        "Max replicas",
        "replicas of one of the user's endpoints; 0 = no limit",
        "count",
    ),
)
FIELDS: dict[str, tuple[Field, ...]] = {
    "keypair": KEYPAIR_FIELDS,
    "user": (*FOLDER_FIELDS, *ENVIRONMENT_FIELDS, KEYPAIRS_FIELD, *SERVING_FIELDS),
    "project": (*FOLDER_FIELDS, *ENVIRONMENT_FIELDS),
}
# What a new policy's form starts with: the service's own defaults.
DEFAULTS: dict[str, dict[str, Any]] = {
    "keypair": {
        "total_resource_slots": {},
        "default_for_unspecified": "UNLIMITED",
        "max_concurrent_sessions": 0,
        "max_pending_sessions": 0,
        "idle_timeout": -1,
        "max_session_lifetime": 0,
        "allowed_storage_hosts": [],
    },
    "user": {
        "max_vfolder_count": 0,
        "max_quota_scope_size": 0,
        "max_vfolder_size": 0,
        "max_environments": 3,
        "max_environment_bytes": 0,
        "max_keypairs": 10,
        "max_endpoints": 0,
        "max_replicas_per_endpoint": 0,
    },
    "project": {
        "max_vfolder_count": 0,
        "max_quota_scope_size": 0,
        "max_vfolder_size": 0,
        "max_environments": 3,
        "max_environment_bytes": 0,
    },
}

# ---------------------------------------------------------------- reading the form (pure)

_TIME_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_TIME_PART = re.compile(r"([0-9]+)\s*([smhdw])", re.IGNORECASE)
_SLOT_SPLIT = re.compile(r"[,;\n]")
_WHOLE = re.compile(r"^-?[0-9]+$")


def parse_slots(text: str, field: str = "total_resource_slots") -> dict[str, int | str]:
    """``cpu=8, mem=32g, gpu.shares=2.5`` -> ``{"cpu": 8, "mem": "32g", "gpu.shares": "2.5"}``.

    Items are separated by commas, semicolons or new lines; each is ``NAME=AMOUNT``. Whole numbers
    become numbers, the rest stay text for the service to read (it knows each slot's unit and step,
    and says what is wrong with ``mem=12zz``). An empty text is no slots at all.
    """
    out: dict[str, int | str] = {}
    for part in _SLOT_SPLIT.split(text or ""):
        part = part.strip()
        if not part:
            continue
        name, sep, amount = part.partition("=")
        name, amount = name.strip(), amount.strip()
        if not sep or not name or not amount:
            raise FormError(f"{field}: cannot read {part!r}: write NAME=AMOUNT, e.g. cpu=8, mem=32g")
        if name in out:
            raise FormError(f"{field}: slot {name!r} is given twice")
        out[name] = int(amount) if _WHOLE.match(amount) else amount
    return out


def parse_size(text: str, field: str) -> int:
    """A size in a form: bytes, or with a binary unit (``500m``, ``10g``, ``1.5t``, ``10 GiB``)."""
    value = (text or "").strip()
    if not value:
        raise FormError(f"{field}: give a size such as 10g (0 = no limit)")
    if value.startswith("-") and _WHOLE.match(value):
        return int(value)  # the service says what the smallest is
    out = parse_bytes(value)
    if out is None:
        raise FormError(f"{field}: cannot read {value!r}: write bytes or a size such as 500m, 10g, 1.5t")
    return out


def parse_count(text: str, field: str) -> int:
    """A whole number in a form (the service checks its range)."""
    value = (text or "").strip()
    if not _WHOLE.match(value):
        raise FormError(f"{field}: {value!r} is not a whole number" if value else f"{field}: give a number")
    return int(value)


def parse_duration(text: str, field: str) -> int:
    """Seconds from ``3600``, ``90s``, ``30m``, ``2h``, ``1h30m``, ``7d`` or ``1w`` (and ``-1``)."""
    value = (text or "").strip().replace(" ", "")
    if not value:
        raise FormError(f"{field}: give a time such as 30m, 2h or 1d, or seconds")
    if _WHOLE.match(value):
        return int(value)
    parts = _TIME_PART.findall(value)
    if not parts or "".join(n + u for n, u in parts).lower() != value.lower():
        raise FormError(f"{field}: cannot read {value!r}: write e.g. 90s, 30m, 2h, 1h30m, 7d, or seconds")
    return sum(int(n) * _TIME_UNITS[u.lower()] for n, u in parts)


def parse_hosts(text: str, field: str = "allowed_storage_hosts") -> list[str] | dict[str, list[str]]:
    """Storage host grants, one host a line (or ``;`` between them).

    ``HOST`` alone grants every right there; ``HOST: right, right`` only those. All bare hosts give
    the API's list form (``["local", "nfs"]``); any line with rights gives the mapping form, where a
    bare host gets every right.
    """
    hosts: dict[str, list[str] | None] = {}
    for line in re.split(r"[\n;]", text or ""):
        line = line.strip()
        if not line:
            continue
        host, sep, rights = line.partition(":")
        host = host.strip()
        if not host or any(c.isspace() for c in host):
            raise FormError(f"{field}: cannot read {line!r}: write HOST or HOST: right, right")
        if host in hosts:
            raise FormError(f"{field}: host {host!r} is given twice")
        hosts[host] = [r for r in re.split(r"[,\s]+", rights.strip()) if r] if sep else None
    if all(r is None for r in hosts.values()):
        return list(hosts)
    return {h: list(RIGHTS) if r is None else r for h, r in hosts.items()}


# ---------------------------------------------------------------- writing the form (pure)


def fmt_size_text(value: Any) -> str:
    """Bytes as the form writes them: ``10g`` where exact, else the bytes."""
    n = parse_bytes(value)
    return str(value) if n is None else format_amount("mem", Decimal(n))


def fmt_slots_text(slots: Mapping[str, Any] | None) -> str:
    """``{"cpu": 8, "mem": 34359738368}`` -> ``cpu=8, mem=32g``: known slots first, then by name."""
    slots = dict(slots or {})
    names = sort_slots(slots)
    out = []
    for n in names:
        v = slots[n]
        if n.split(":", 1)[0] == "mem":
            text = fmt_size_text(v)
        elif isinstance(v, float) and v.is_integer():
            text = str(int(v))
        else:
            text = str(v)
        out.append(f"{n}={text}")
    return ", ".join(out)


def fmt_duration_text(seconds: Any) -> str:
    """Seconds as the form writes them: ``7d``, ``1h30m``, ``45s``; 0 and -1 as they are."""
    try:
        s = int(seconds)
    except (TypeError, ValueError):
        return str(seconds)
    if s <= 0:
        return str(s)
    out = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        n, s = divmod(s, size)
        if n:
            out.append(f"{n}{unit}")
    return "".join(out)


def fmt_hosts_text(value: Any) -> str:
    """Grants as the form writes them: one host a line, its rights after a colon unless it has all."""
    if isinstance(value, Mapping):
        lines = []
        for host, rights in value.items():
            rights = list(rights or ())
            every = sorted(rights) == sorted(RIGHTS)
            lines.append(str(host) if every else f"{host}: {', '.join(map(str, rights))}")
        return "\n".join(lines)
    return "\n".join(str(h) for h in value or ())


def form_values(kind: str, policy: Mapping[str, Any]) -> dict[str, str]:
    """The form's text for each field of ``policy`` (what :func:`policy_body` reads back)."""
    out: dict[str, str] = {}
    for f in FIELDS[kind]:
        v = policy.get(f.key, DEFAULTS[kind].get(f.key))
        if f.kind == "slots":
            out[f.key] = fmt_slots_text(v)
        elif f.kind in ("seconds", "idle"):
            out[f.key] = fmt_duration_text(v)
        elif f.kind == "bytes":
            out[f.key] = fmt_size_text(v)
        elif f.kind == "hosts":
            out[f.key] = fmt_hosts_text(v)
        else:
            out[f.key] = "" if v is None else str(v)
    return out


# ---------------------------------------------------------------- the API body (pure)


def canonical_slots(slots: Any) -> dict[str, Decimal] | None:
    """Slots in one form to compare (memory in bytes); None when an amount cannot be read here."""
    out: dict[str, Decimal] = {}
    for name, v in dict(slots or {}).items():
        try:
            if name.split(":", 1)[0] == "mem":
                b = parse_bytes(v)
                if b is None:
                    return None
                amount = Decimal(b)
            else:
                amount = Decimal(str(v))
        except (InvalidOperation, ValueError):
            return None
        if amount != 0:
            out[name] = amount.normalize()
    return out


def _canonical_hosts(value: Any) -> dict[str, tuple[str, ...]]:
    """Grants as ``{host: sorted rights}`` (a host list grants every right)."""
    if isinstance(value, Mapping):
        return {str(h): tuple(sorted(map(str, r or ()))) for h, r in value.items()}
    return {str(h): tuple(sorted(RIGHTS)) for h in value or ()}


def _same(f: Field, new: Any, old: Any) -> bool:
    if f.kind == "slots":
        a, b = canonical_slots(new), canonical_slots(old)
        return a is not None and a == b
    if f.kind == "hosts":
        return _canonical_hosts(new) == _canonical_hosts(old) and isinstance(new, Mapping) == isinstance(
            old, Mapping
        )
    return new == old


def read_field(f: Field, text: str) -> Any:
    """One field's form text as its API value (FormError when it cannot be read)."""
    if f.kind == "slots":
        return parse_slots(text, f.key)
    if f.kind == "choice":
        value = (text or "").strip().upper()
        if value not in CHOICES:
            raise FormError(f"{f.key}: choose LIMITED or UNLIMITED")
        return value
    if f.kind == "count":
        return parse_count(text, f.key)
    if f.kind in ("seconds", "idle"):
        return parse_duration(text, f.key)
    if f.kind == "bytes":
        return parse_size(text, f.key)
    if f.kind == "hosts":
        return parse_hosts(text, f.key)
    raise FormError(f"{f.key}: unknown field")


def policy_body(
    kind: str, form: Mapping[str, str], before: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The JSON body of a create (``before`` None: every field) or a PATCH (only what changed).

    ``form`` maps each field's key to its text (:func:`form_values` writes them). Raises
    :class:`FormError` with the first field that cannot be read; nothing is sent then.
    """
    if kind not in FIELDS:
        raise FormError(f"no policy kind {kind!r}: use keypair, user or project")
    body: dict[str, Any] = {}
    for f in FIELDS[kind]:
        if f.key not in form:
            continue
        value = read_field(f, form[f.key])
        if before is None or not _same(f, value, before.get(f.key, DEFAULTS[kind].get(f.key))):
            body[f.key] = value
    return body


# ---------------------------------------------------------------- the tables (pure)


def fmt_count(value: Any) -> str:
    """``0`` -> ``no limit``."""
    return "no limit" if not value else str(value)


def fmt_seconds(value: Any) -> str:
    """``5400`` -> ``1 h 30 min``: exact, largest units first."""
    try:
        s = int(value)
    except (TypeError, ValueError):
        return str(value)
    if s <= 0:
        return "0 s"
    out = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        n, s = divmod(s, size)
        if n:
            out.append(f"{n} {unit}")
    return " ".join(out)


def fmt_idle(value: Any) -> str:
    """An idle timeout: ``-1`` the fleet's default, ``0`` never."""
    try:
        s = int(value)
    except (TypeError, ValueError):
        return str(value)
    if s < 0:
        return "fleet default"
    return "never" if s == 0 else fmt_seconds(s)


def fmt_lifetime(value: Any) -> str:
    return "no limit" if not value else fmt_seconds(value)


def fmt_size(value: Any) -> str:
    return "no limit" if not value else fmt_bytes(value)


def fmt_slots(slots: Mapping[str, Any] | None, unnamed: str | None = None) -> str:
    """``cpu 8, mem 32 GiB, gpu.shares 2.5``, and what a slot not named allows."""
    slots = dict(slots or {})
    names = sort_slots(slots)
    parts = []
    for n in names:
        v = slots[n]
        if n.split(":", 1)[0] == "mem":
            parts.append(f"{n} {fmt_bytes(v)}")
        else:
            parts.append(f"{n} {int(v) if isinstance(v, float) and v.is_integer() else v}")
    text = ", ".join(parts) or "none named"
    if unnamed == "LIMITED":
        text += "; others: none"
    elif unnamed == "UNLIMITED":
        text += "; others: no limit"
    return text


def fmt_hosts(value: Any) -> str:
    """``local (every right); nfs (mount-in-session, download-file)``; ``host defaults only``."""
    grants = _canonical_hosts(value)
    if not grants:
        return "host defaults only"
    parts = []
    for host, rights in grants.items():
        every = tuple(sorted(RIGHTS)) == rights
        ordered = [r for r in RIGHTS if r in rights] + [r for r in rights if r not in RIGHTS]
        parts.append(f"{host} ({'every right' if every else ', '.join(ordered) or 'no right'})")
    return "; ".join(parts)


COLUMNS = {
    "keypair": (
        "policy",
        "total slots",
        "sessions",
        "pending",
        "idle timeout",
        "lifetime",
        "storage hosts",
        "used by",
    ),
    "user": (
        "policy",
        "folders",
        "storage quota",
        "folder size",
        "environments",
        "env. quota",
        "keypairs",
        "endpoints",
        "replicas",
        "used by",
    ),
    "project": (
        "policy",
        "folders",
        "storage quota",
        "folder size",
        "environments",
        "env. quota",
        "used by",
    ),
}


def policy_rows(
    kind: str, policies: Iterable[Mapping[str, Any]], used: Mapping[str, int] | None
) -> list[list[str]]:
    """One row of text per policy, in :data:`COLUMNS` order (``used``: None when not counted)."""
    rows = []
    for p in policies:
        name = str(p.get("name", ""))
        n = None if used is None else int(used.get(name, 0))
        # a keypair policy is used by keypairs, a user policy by users, a project policy by projects
        used_by = "—" if n is None else ("nobody" if n == 0 else f"{n} {kind}{'' if n == 1 else 's'}")
        if kind == "keypair":
            rows.append(
                [
                    name,
                    fmt_slots(p.get("total_resource_slots"), p.get("default_for_unspecified")),
                    fmt_count(p.get("max_concurrent_sessions")),
                    fmt_count(p.get("max_pending_sessions")),
                    fmt_idle(p.get("idle_timeout")),
                    fmt_lifetime(p.get("max_session_lifetime")),
                    fmt_hosts(p.get("allowed_storage_hosts")),
                    used_by,
                ]
            )
        else:
            per_user = (
                [
                    fmt_count(p.get("max_keypairs")),
                    fmt_count(p.get("max_endpoints")),
                    fmt_count(p.get("max_replicas_per_endpoint")),
                ]
                if kind == "user"
                else []
            )
            rows.append(
                [
                    name,
                    fmt_count(p.get("max_vfolder_count")),
                    fmt_size(p.get("max_quota_scope_size")),
                    fmt_size(p.get("max_vfolder_size")),
                    fmt_count(p.get("max_environments", DEFAULTS[kind]["max_environments"])),
                    fmt_size(p.get("max_environment_bytes")),
                    *per_user,
                    used_by,
                ]
            )
    return rows


def usage_counts(items: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """How many of ``items`` (keypairs, users or projects) name each policy in ``resource_policy``."""
    out: dict[str, int] = {}
    for item in items:
        name = item.get("resource_policy")
        if name:
            out[str(name)] = out.get(str(name), 0) + 1
    return out


def policies_html(kind: str, rows: Sequence[Sequence[str]]) -> str:
    """The policies of one kind as a table; each row carries ``data-kind`` and ``data-policy``."""
    if not rows:
        return f'<div class="lf-admin lf-muted">No {kind} policy yet.</div>'
    head = "".join(f"<th>{esc(c)}</th>" for c in COLUMNS[kind])
    body = "".join(
        f'<tr data-kind="{esc(kind)}" data-policy="{esc(r[0])}"><td><b>{esc(r[0])}</b></td>'
        + "".join(f"<td>{esc(v)}</td>" for v in r[1:])
        + "</tr>"
        for r in rows
    )
    return f'<div class="lf-admin"><table class="lf-table lf-policies"><tr>{head}</tr>{body}</table></div>'


def read_only_reason(role: str) -> str:
    """Why the viewer may not change policies ("" for a superadmin, who may)."""
    if role == "superadmin":
        return ""
    if role == "monitor":
        return "Read only: a monitor changes nothing."
    return "Read only: only a superadmin changes resource policies."


def policy_path(kind: str, name: str = "") -> str:
    """``/policies/keypair`` or ``/policies/user/NAME`` (the name quoted)."""
    base = f"/policies/{kind}"
    return f"{base}/{quote(name, safe='')}" if name else base


# ---------------------------------------------------------------- the page (widgets)

PAGE_STYLE = """<style>
.lf-policy-form .widget-label { min-width: 130px; }
.lf-meaning { color: var(--jp-ui-font-color2, #757575); font-size: 0.88em; padding-left: 8px;
  font-family: var(--jp-ui-font-family, sans-serif); max-width: 620px; line-height: 1.3; }
</style>"""
DESC = {"description_width": "130px"}


def narrow() -> W.Layout:
    """A form field's layout: a new one each time, as the editor hides and shows fields one by one
    (a Layout shared by several widgets would hide them all)."""
    return W.Layout(width="430px")


def meaning(text: str) -> W.HTML:
    """A field's meaning, beside it in the form."""
    return W.HTML(f'{PAGE_STYLE}<div class="lf-meaning">{esc(text)}</div>')


def field_widget(f: Field) -> W.Widget:
    """The input for one field: a choice is a dropdown, host grants a text area, the rest a line."""
    if f.kind == "choice":
        return W.Dropdown(options=CHOICES, description=f.label, style=DESC, layout=narrow())
    if f.kind == "hosts":
        return W.Textarea(
            description=f.label,
            placeholder="none: the hosts' defaults only",
            style=DESC,
            layout=W.Layout(width="430px", height="56px"),
        )
    # An empty field's placeholder says what empty means (the meaning beside it gives examples).
    placeholder = {"slots": "none named", "count": "0", "bytes": "0"}.get(f.kind, "0")
    return W.Text(description=f.label, placeholder=placeholder, style=DESC, layout=narrow())


def policy_editor(
    kind: str,
    policies: Sequence[Mapping[str, Any]],
    client: Any,
    on_saved: Callable[[str, str, str], None],
    selected: str | None = None,
    said: str = "",
) -> W.VBox:
    """A form for one kind: pick a policy (or a new one), change its fields, save, or delete it.

    Save sends only what changed (:func:`policy_body`); Create sends every field with the name.
    A form that cannot be read, or the service's refusal, shows its message under the buttons and
    changes nothing. Delete asks for a second click. ``on_saved(text, kind, name)`` runs after a
    change (the page rebuilds itself, then shows this editor on ``name`` with ``text``).
    """
    why = read_only_reason(client.role)
    editable = not why
    by_name = {str(p.get("name")): p for p in policies}
    options = [(n, n) for n in by_name] + ([("(new policy)", NEW)] if editable else [])
    start = selected if selected in by_name else (next(iter(by_name), NEW))
    pick = W.Dropdown(options=options, value=start, description="Policy", style=DESC, layout=narrow())
    name = W.Text(description="Name", placeholder="a new policy's name", style=DESC, layout=narrow())
    inputs = {f.key: field_widget(f) for f in FIELDS[kind]}
    save = W.Button(
        description="Save changes", button_style="primary", icon="check", layout=W.Layout(width="auto")
    )
    delete = W.Button(description="Delete", icon="trash", layout=W.Layout(width="auto"))
    note = W.HTML(message(said).value if said else "")
    armed: dict[str, str | None] = {"delete": None}

    def disarm() -> None:
        armed["delete"] = None
        delete.description, delete.button_style = "Delete", ""

    def load(*_: Any) -> None:
        new = pick.value == NEW
        values = form_values(kind, DEFAULTS[kind] if new else by_name[pick.value])
        for key, w in inputs.items():
            w.value = values[key]
        name.value = ""
        name.layout.display = "" if new else "none"
        save.description = f"Create {kind} policy" if new else "Save changes"
        save.icon = "plus" if new else "check"
        delete.disabled = new or not editable
        disarm()

    def do_save(_: Any) -> None:
        disarm()
        form = {key: w.value for key, w in inputs.items()}
        new = pick.value == NEW
        try:
            body = policy_body(kind, form, None if new else by_name[pick.value])
        except FormError as e:
            note.value = message(str(e), error=True).value
            return
        target = name.value.strip() if new else str(pick.value)
        if new and not target:
            note.value = message("Give the new policy a name.", error=True).value
            return
        if not new and not body:
            note.value = muted("Nothing to save: the form says what the policy already has.").value
            return
        try:
            if new:
                client.post(policy_path(kind), {"name": target, **body})
            else:
                client.patch(policy_path(kind, target), body)
        except ServiceError as e:
            note.value = message(f"The labfleet service said: {e.message}", error=True).value
            return
        did = "Created" if new else "Saved"
        on_saved(f"{did} {kind} policy {target}: {', '.join(sorted(body)) or 'defaults'}.", kind, target)

    def do_delete(_: Any) -> None:
        target = str(pick.value)
        if armed["delete"] != target:
            armed["delete"] = target
            delete.description, delete.button_style = f"Really delete {target}?", "danger"
            note.value = muted("Click again to delete it; choosing another policy cancels.").value
            return
        disarm()
        try:
            client.delete(policy_path(kind, target))
        except ServiceError as e:
            note.value = message(f"The labfleet service said: {e.message}", error=True).value
            return
        on_saved(f"Deleted {kind} policy {target}.", kind, "")

    def picked(*_: Any) -> None:
        note.value = ""
        load()

    pick.observe(picked, "value")
    save.on_click(do_save)
    delete.on_click(do_delete)
    load()
    for w in [name, *inputs.values(), save]:
        w.disabled = not editable
    rows: list[W.Widget] = [pick, name]
    rows += [
        W.HBox([inputs[f.key], meaning(f.meaning)], layout=W.Layout(align_items="center"))
        for f in FIELDS[kind]
    ]
    rows += [W.HBox([form_label(""), save, delete]), W.HBox([form_label(""), note])]
    if why:
        rows.insert(0, muted(why))
    box = W.VBox(rows)
    box.add_class("lf-form")
    box.add_class("lf-policy-form")
    box.add_class(f"lf-policy-{kind}")
    return box


def counts(client: Any) -> dict[str, dict[str, int] | None]:
    """Per kind, how many keypairs, users and projects in the viewer's reach use each policy."""

    def attempt(fn: Callable[[], Any]) -> dict[str, int] | None:
        try:
            return usage_counts(fn())
        except ServiceError:
            return None

    return {
        "keypair": attempt(lambda: client.get("/keypairs")),
        "user": attempt(lambda: client.everything("/users")),
        "project": attempt(lambda: client.get("/projects")),
    }


def page(client: Any) -> W.VBox:
    """The whole Resource policies page below its header: it rebuilds itself after a change."""
    out = W.VBox()
    refresh_button = W.Button(description="Refresh", icon="refresh", layout=W.Layout(width="110px"))
    state: dict[str, Any] = {"kind": None, "name": None, "said": ""}

    def build() -> W.VBox:
        used = counts(client)
        superadmin = client.role == "superadmin"
        parts: list[W.Widget] = [W.HTML(STYLE + PAGE_STYLE)]
        if not superadmin:
            parts.append(muted("The counts of use are of the keypairs, users and projects you can see."))
        for kind in KINDS:
            policies = client.get(policy_path(kind))
            mine = state["kind"] == kind
            parts += [
                section(TITLES[kind], NOTES[kind]),
                W.HTML(STYLE + policies_html(kind, policy_rows(kind, policies, used[kind]))),
            ]
            if policies or superadmin:  # a read-only form of no policy would show nothing
                parts.append(
                    policy_editor(
                        kind,
                        policies,
                        client,
                        saved,
                        state["name"] if mine else None,
                        state["said"] if mine else "",
                    )
                )
        parts.append(domains.section(client, section))  # the keypair policies each domain's admins may give
        parts.append(idlecheckers.section(client, section))
        state.update(kind=None, said="")
        return W.VBox(parts)

    def refresh(*_: Any) -> None:
        out.children = [guarded(build)]

    def saved(text: str, kind: str, name: str) -> None:
        state.update(kind=kind, name=name, said=text)
        refresh()

    refresh_button.on_click(refresh)
    refresh()
    return W.VBox([refresh_button, out])
