"""Checks for untrusted input (REST bodies, CLI arguments): names, fields, numbers.

Every function raises :class:`~labfleet.core.errors.InvalidInput` with a message that
names the field and says what is expected.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from labfleet.core.errors import InvalidInput
from labfleet.core.slots import ResourceSlots, SlotError

# Domain, project and policy names: lower-case, DNS-label-like, so they fit Hub group names.
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9_-]{0,62}[a-z0-9])?$")
# Hub user names: what JupyterHub accepts in URLs; e-mail-like names allowed.
USERNAME_RE = re.compile(r"^[a-z0-9][a-z0-9._@+-]{0,127}$")
MAX_TEXT = 1000
MAX_INT = 2**31 - 1


def check_name(value: Any, field: str = "name") -> str:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise InvalidInput(
            f"{field} must be 1-64 lower-case letters, digits, '-' or '_', starting and ending "
            f"with a letter or digit (got {value!r:.80})"
        )
    return value


def check_username(value: Any, field: str = "username") -> str:
    if not isinstance(value, str) or not USERNAME_RE.match(value):
        raise InvalidInput(
            f"{field} must be 1-128 lower-case letters, digits or . _ @ + -, "
            f"starting with a letter or digit (got {value!r:.80})"
        )
    return value


def check_text(value: Any, field: str, max_len: int = MAX_TEXT) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"{field} must be a string")
    if len(value) > max_len:
        raise InvalidInput(f"{field} is longer than {max_len} characters")
    if "\x00" in value:
        raise InvalidInput(f"{field} must not contain NUL characters")
    return value


def check_session_id(value: Any, field: str) -> str:
    """A session id as a caller sends it: a string of 1-64 characters, no NUL."""
    if not isinstance(value, str) or not 1 <= len(value) <= 64 or "\x00" in value:
        raise InvalidInput(f"{field} must be a session id (a string of 1-64 characters)")
    return value


def check_bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(f"{field} must be true or false")
    return value


def check_int(value: Any, field: str, *, minimum: int = 0, maximum: int = MAX_INT) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{field} must be a whole number")
    if value < minimum:
        raise InvalidInput(f"{field} must be at least {minimum} (got {value})")
    if value > maximum:
        raise InvalidInput(f"{field} must be at most {maximum} (got {value})")
    return value


def check_choice(value: Any, field: str, choices: Iterable[str]) -> str:
    choices = list(choices)
    if value not in choices:
        raise InvalidInput(f"{field} must be one of {', '.join(choices)} (got {value!r:.40})")
    return value


def check_slots(value: Any, field: str = "total_resource_slots") -> ResourceSlots:
    try:
        return ResourceSlots.parse(value)
    except SlotError as e:
        raise InvalidInput(f"{field}: {e}") from None


def check_string_list(value: Any, field: str, item_check=None) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidInput(f"{field} must be a list of strings")
    if len(value) > 1000:
        raise InvalidInput(f"{field} has too many items")
    return [item_check(v, field) if item_check else v for v in value]


def check_fields(
    body: Any, *, required: Iterable[str] = (), optional: Iterable[str] = (), what: str = "request body"
) -> dict[str, Any]:
    """The body must be a JSON object with exactly the allowed keys."""
    if not isinstance(body, Mapping):
        raise InvalidInput(f"{what} must be a JSON object")
    required = list(required)
    allowed = set(required) | set(optional)
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidInput(
            f"unknown field(s) in {what}: {', '.join(map(str, unknown))}; allowed: {', '.join(sorted(allowed))}"
        )
    missing = [k for k in required if k not in body]
    if missing:
        raise InvalidInput(f"missing field(s) in {what}: {', '.join(missing)}")
    return dict(body)


HOST_PATTERN_RE = re.compile(
    r"^(\*\.)?[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)
MAX_HOST_PATTERNS = 200


def check_host_rules(value: Any, field: str = "import_hosts") -> dict[str, list[str]]:
    """``{"allow": [...], "deny": [...]}`` of host names, ``*.example.org`` for its subdomains (either
    list may be left out): which hosts a domain's imports may fetch from."""
    if not isinstance(value, Mapping):
        raise InvalidInput(f'{field} must be {{"allow": [hosts], "deny": [hosts]}}')
    extra = set(value) - {"allow", "deny"}
    if extra:
        raise InvalidInput(f"{field}: unknown key {sorted(extra)[0]!r} (allow, deny)")
    out: dict[str, list[str]] = {}
    for key in ("allow", "deny"):
        items = value.get(key, [])
        if not isinstance(items, list) or len(items) > MAX_HOST_PATTERNS:
            raise InvalidInput(f"{field}.{key} must be a list of at most {MAX_HOST_PATTERNS} host names")
        hosts = []
        for item in items:
            host = item.strip().lower() if isinstance(item, str) else item
            if not isinstance(host, str) or len(host) > 253 or not HOST_PATTERN_RE.match(host):
                raise InvalidInput(
                    f"{field}.{key}: {str(item)[:80]!r} is not a host name (or *.domain for its subdomains)"
                )
            hosts.append(host)
        if hosts:
            out[key] = list(dict.fromkeys(hosts))
    return out


def parse_project_ref(value: Any, default_domain: str | None = None) -> tuple[str, str]:
    """``DOMAIN/PROJECT`` -> (domain, project); a bare name uses ``default_domain``."""
    if not isinstance(value, str):
        raise InvalidInput("project must be written DOMAIN/PROJECT")
    domain, sep, name = value.partition("/")
    if not sep:
        if default_domain is None:
            raise InvalidInput(f"project must be written DOMAIN/PROJECT (got {value!r:.80})")
        domain, name = default_domain, value
    return check_name(domain, "domain"), check_name(name, "project")
