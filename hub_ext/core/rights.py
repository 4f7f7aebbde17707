"""Storage-host rights: their names, how grants are written, and what a set of grants gives (pure).

Grants are ``{host: [rights]}``; a keypair policy may also list host names, which grants every
right there. Tenancy checks grants with these; storage decides with them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from labfleet.core.errors import InvalidInput
from labfleet.core.validate import check_name

RIGHTS = (
    "create-vfolder",
    "mount-in-session",
    "upload-file",
    "download-file",
    "delete-vfolder",
    "invite-others",
)


def check_rights(value: Any, field: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or len(value) > 1000:
        raise InvalidInput(f"{field} must be a list of rights (at most 1000): {', '.join(RIGHTS)}")
    unknown = sorted(set(value) - set(RIGHTS))
    if unknown:
        raise InvalidInput(f"{field}: unknown right(s) {', '.join(unknown)}; known: {', '.join(RIGHTS)}")
    return sorted(set(value), key=RIGHTS.index)


def check_host_grants(value: Any, field: str) -> dict[str, list[str]] | list[str]:
    """``{host: [rights]}``; a list of host names (keypair policies, as before) means every right."""
    if isinstance(value, list):
        if not all(isinstance(v, str) for v in value) or len(value) > 1000:
            raise InvalidInput(f"{field} must be a list of storage host names or {{host: [rights]}}")
        return [check_name(v, f"{field} host") for v in value]
    if not isinstance(value, Mapping) or len(value) > 1000:
        raise InvalidInput(f"{field} must be {{storage host: [rights]}}")
    return {check_name(k, f"{field} host"): check_rights(v, f"{field}[{k}]") for k, v in value.items()}


def _grants(value: Any, host: str) -> Iterable[str]:
    if isinstance(value, list):
        return RIGHTS if host in value else ()
    if isinstance(value, Mapping):
        return value.get(host) or ()
    return ()


def rights_union(host: str, default: Iterable[str], *grants: Any) -> frozenset[str]:
    """Every right on ``host`` that the default or any grant gives (pure)."""
    out = set(default)
    for g in grants:
        out.update(_grants(g, host))
    return frozenset(out) & frozenset(RIGHTS)
