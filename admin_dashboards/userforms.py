"""The admin console's Users page, its pure half: the fields of one user, the CSV import, the list
and the edits (no widgets, no service; :mod:`labfleet.console.users` is the page).

The CSV parser and the row checks behind the bulk import's preview (:func:`parse_csv`,
:func:`check_user`), the list's search and pages (:func:`matches`, :func:`page_label`), what an
edit changes (:func:`user_changes`). The checks are the service's own (``labfleet.core.validate``,
``labfleet.core.passwords``: pure modules, no DB), so the preview says what the service would say
about a malformed row, before anything is sent. :func:`matches` is the service's user search
(``GET /api/users?search=&role=&status=``) in Python: a test holds the two together.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from labfleet.core.errors import InvalidInput
from labfleet.core.passwords import check_password_strength
from labfleet.core.validate import check_choice, check_name, check_username, parse_project_ref

ROLES = ("superadmin", "admin", "user", "monitor")
STATUSES = ("active", "inactive")
# The bulk import's columns, in the order the template shows them; only ``username`` is required
# (``domain`` too, unless the page's "domain for rows without one" is set).
CSV_COLUMNS = (
    "username",
    "email",
    "full_name",
    "domain",
    "role",
    "projects",
    "password",
    "status",
    "resource_policy",
)
# What people write in a header for these columns (after lower-casing; spaces and '-' become '_').
COLUMN_ALIASES = {
    "user": "username",
    "user_name": "username",
    "login": "username",
    "e_mail": "email",
    "mail": "email",
    "name": "full_name",
    "fullname": "full_name",
    "project": "projects",
    "policy": "resource_policy",
}
ROLE_ALIASES = {"domain_admin": "admin", "domain admin": "admin", "domain-admin": "admin"}
MAX_CSV_ROWS = 1000
MAX_CSV_BYTES = 1_000_000
MAX_RATE_LIMIT = 10_000_000
DEFAULT_RATE_LIMIT = 10_000
EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+$")
PROJECT_SPLIT_RE = re.compile(r"[;,|\s]+")
PAGE_SIZES = (10, 20, 50, 100)
ANY = "(any)"
ALL = "(all)"
NONE = "(none)"


# ---------------------------------------------------------------- pure: one user's fields


def _problem(check: Callable[[], Any]) -> str | None:
    """The service's message for input ``check`` refuses, None when it passes."""
    try:
        check()
    except InvalidInput as e:
        return e.message
    return None


def split_projects(value: str | Iterable[str]) -> list[str]:
    """Project references from a cell (``ml; vision`` or ``acme/ml vision``) or a list."""
    items = PROJECT_SPLIT_RE.split(value) if isinstance(value, str) else list(value)
    return [p.strip() for p in items if p and p.strip()]


def check_user(
    fields: Mapping[str, Any], default_domain: str | None = None
) -> tuple[dict[str, Any], list[str]]:
    """(the POST /users body, the problems) for one new user's ``fields``.

    ``fields`` are what a person typed (a CSV row's cells or the form's values): strings, with
    ``projects`` a cell or a list. Empty optional fields are left out, so the service's defaults
    apply (role ``user``, status ``active``, no password: Hub login only). Each problem is a
    sentence naming the field, in the service's words where the service has a rule for it; the body
    is meant to be sent only when there is none. Whether the domain, projects or policy exist and
    whether the viewer may create users there is for the service to say."""
    problems: list[str] = []
    body: dict[str, Any] = {}

    def text(key: str) -> str:
        value = fields.get(key)
        return "" if value is None else str(value).strip()

    username = text("username")
    if not username:
        problems.append("username is missing")
    else:
        problems += filter(None, [_problem(lambda: check_username(username))])
        body["username"] = username

    domain = text("domain") or (default_domain or "")
    if not domain:
        problems.append("domain is missing (add a domain column, or choose a domain for rows without one)")
    else:
        problems += filter(None, [_problem(lambda: check_name(domain, "domain"))])
        body["domain"] = domain

    role = text("role").lower()
    if role:
        role = ROLE_ALIASES.get(role, role)
        problems += filter(None, [_problem(lambda: check_choice(role, "role", ROLES))])
        body["role"] = role

    status = text("status").lower()
    if status:
        problems += filter(None, [_problem(lambda: check_choice(status, "status", STATUSES))])
        body["status"] = status

    email = text("email")
    if email:
        if len(email) > 255:
            problems.append("email is longer than 255 characters")
        elif not EMAIL_RE.match(email):
            problems.append(f"email must look like name@example.org (got {email!r:.80})")
        body["email"] = email

    full_name = text("full_name")
    if full_name:
        if len(full_name) > 255:
            problems.append("full_name is longer than 255 characters")
        body["full_name"] = full_name

    raw_projects = fields.get("projects") or []
    projects: list[str] = []
    for ref in split_projects(raw_projects if not isinstance(raw_projects, str) else raw_projects.strip()):
        try:
            pdomain, pname = parse_project_ref(ref, domain or None)
        except InvalidInput as e:
            problems.append(e.message)
            continue
        if domain and pdomain != domain:
            problems.append(f"project {pdomain}/{pname} is not in the user's domain {domain!r}")
            continue
        full = f"{pdomain}/{pname}"
        if full not in projects:
            projects.append(full)
    if projects:
        body["projects"] = projects

    password = fields.get("password")
    if password:  # a password is taken as typed: spaces are characters too
        problem = check_password_strength(str(password))
        if problem:
            problems.append(problem)
        body["password"] = str(password)

    policy = text("resource_policy")
    if policy and policy != NONE:
        problems += filter(None, [_problem(lambda: check_name(policy, "resource_policy"))])
        body["resource_policy"] = policy
    return body, problems


# ---------------------------------------------------------------- pure: the CSV import


@dataclass
class CsvRow:
    """One data line of an import: where it is, what it would create, what is wrong with it."""

    line: int
    fields: dict[str, str]
    body: dict[str, Any]
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class CsvImport:
    """A parsed import: file-wide problems (nothing is created then) and its rows."""

    columns: list[str]
    rows: list[CsvRow]
    problems: list[str] = field(default_factory=list)

    @property
    def ready(self) -> list[CsvRow]:
        """The rows to create: none when the file itself is wrong."""
        return [] if self.problems else [r for r in self.rows if r.ok]

    def summary(self) -> str:
        if self.problems:
            return "Nothing can be created from this file: " + "; ".join(self.problems)
        bad = len(self.rows) - len(self.ready)
        text = f"{len(self.rows)} row(s): {len(self.ready)} ready"
        if bad:
            text += f", {bad} with problems (not created)"
        return text + "."


def column_name(raw: str) -> str:
    """A header cell as a column name: ``Full name`` -> ``full_name``, ``E-mail`` -> ``email``."""
    key = re.sub(r"[\s-]+", "_", raw.strip().lower())
    return COLUMN_ALIASES.get(key, key)


def parse_csv(text: str, default_domain: str | None = None, existing: Iterable[str] = ()) -> CsvImport:
    """Parse a users CSV (a header line naming :data:`CSV_COLUMNS`, then one user a line).

    Each row is checked on its own with :func:`check_user`, and against the rest of the file (a
    username twice) and ``existing`` (usernames known to exist already). A row with more values than
    the header has columns is malformed. Blank lines and lines starting with ``#`` are skipped.
    File-wide problems (no header, an unknown or repeated column, no username column, too many
    rows) leave nothing to create."""
    if len(text.encode("utf-8", "replace")) > MAX_CSV_BYTES:
        return CsvImport([], [], [f"the file is larger than {MAX_CSV_BYTES // 1000} kB"])
    text = text.lstrip("\ufeff")
    try:
        lines = list(csv.reader(io.StringIO(text), skipinitialspace=True, strict=True))
    except csv.Error as e:
        return CsvImport([], [], [f"this is not CSV: {e}"])
    numbered = [
        (n, cells)
        for n, cells in enumerate(lines, start=1)
        if any(c.strip() for c in cells) and not cells[0].lstrip().startswith("#")
    ]
    if not numbered:
        return CsvImport(
            [], [], ["the file is empty: the first line names the columns, e.g. " + ",".join(CSV_COLUMNS)]
        )
    (_, head), data = numbered[0], numbered[1:]
    columns = [column_name(c) for c in head]
    problems = []
    unknown = [h for h, c in zip(head, columns, strict=True) if c not in CSV_COLUMNS]
    if unknown:
        problems.append(
            f"unknown column(s) {', '.join(repr(u.strip()) for u in unknown)} on line 1; "
            f"the columns are: {', '.join(CSV_COLUMNS)}"
        )
    repeated = sorted({c for c in columns if columns.count(c) > 1 and c in CSV_COLUMNS})
    if repeated:
        problems.append(f"column(s) {', '.join(repeated)} named twice")
    if "username" not in columns:
        problems.append("there is no username column")
    if len(data) > MAX_CSV_ROWS:
        problems.append(f"{len(data)} rows: at most {MAX_CSV_ROWS} users at once")
    if problems:
        return CsvImport(columns, [], problems)

    known = set(existing)
    first_line: dict[str, int] = {}
    rows = []
    for n, cells in data:
        fields = {c: v.strip() if c != "password" else v for c, v in zip(columns, cells, strict=False)}
        body, row_problems = check_user(fields, default_domain)
        if len(cells) > len(columns):
            row_problems.insert(0, f"{len(cells)} values but the header names {len(columns)} columns")
        name = body.get("username")
        if name:
            if name in first_line:
                row_problems.append(f"username {name!r} is already on line {first_line[name]}")
            else:
                first_line[name] = n
            if name in known:
                row_problems.append(f"user {name!r} already exists")
        rows.append(CsvRow(n, fields, body, row_problems))
    return CsvImport(columns, rows)


# ---------------------------------------------------------------- pure: the list and the edits


def matches(
    user: Mapping[str, Any], search: str = "", role: str | None = None, status: str | None = None
) -> bool:
    """Whether ``user`` (a User of the service) is found by a search of its name, full name or
    e-mail (case-insensitive, every word must match) and has ``role`` and ``status`` (None: any)."""
    if role and user.get("role") != role:
        return False
    if status and user.get("status") != status:
        return False
    hay = " ".join(str(user.get(k) or "") for k in ("username", "full_name", "email")).lower()
    return all(word in hay for word in search.lower().split())


def page_label(offset: int, shown: int, total: int) -> str:
    """``21–40 of 57`` (or ``no users``) for a page of ``shown`` users from ``offset``."""
    if total == 0 or shown == 0:
        return "no users" if total == 0 else f"none here of {total}"
    return f"{offset + 1}–{offset + shown} of {total}"


def grantable_roles(viewer_role: str) -> tuple[str, ...]:
    """The roles a viewer may give (a domain admin: user and admin), as the service allows."""
    return ROLES if viewer_role in ("superadmin", "monitor") else ("user", "admin")


def user_changes(
    user: Mapping[str, Any],
    *,
    role: str,
    status: str,
    projects: Sequence[str],
    resource_policy: str | None,
    password: str = "",
) -> dict[str, Any]:
    """The PATCH /users/{name} body that turns ``user`` into these values: only what differs (a
    domain admin editing themselves may keep their role without being refused for sending it)."""
    body: dict[str, Any] = {}
    if role != user.get("role"):
        body["role"] = role
    if status != user.get("status"):
        body["status"] = status
    if sorted(projects) != sorted(user.get("projects") or []):
        body["projects"] = list(projects)
    policy = None if resource_policy in (None, "", NONE) else resource_policy
    if policy != user.get("resource_policy"):
        body["resource_policy"] = policy
    if password:
        body["password"] = password
    return body


def check_rate_limit(value: Any) -> str | None:
    """What is wrong with a keypair's rate limit (requests per 15 minutes), None when it is fine."""
    if isinstance(value, bool) or not isinstance(value, int):
        return "rate limit must be a whole number"
    if not 1 <= value <= MAX_RATE_LIMIT:
        return f"rate limit must be between 1 and {MAX_RATE_LIMIT} requests per 15 minutes (got {value})"
    return None
