"""What an import may fetch, and what an archive may write: the pure checks behind Import & Run.

An import takes a URL a user gives (a notebook, a git repository, a ``.zip`` or ``.tar.gz``) and
writes what it fetches into a virtual folder. Both ends are untrusted:

- **the URL**: only ``https``, ``http`` and ``git``; no credentials in it (a token belongs in the
  user's stored credentials, never in a URL that logs and pages may show); and the host must not
  resolve to loopback, link-local, private, multicast or otherwise non-public addresses, unless a
  superadmin lists it (``LABFLEET_IMPORT_ALLOWED_HOSTS``: host names or CIDRs, comma-separated).
  Every address the name resolves to is checked, not just the first, so a name with a public and a
  private address is refused.
- **an archive's members**: relative paths only, no ``..``, no links, no device files or FIFOs;
  each member's path is where it lands in the folder.

Pure: a resolver is passed in (``socket.getaddrinfo`` by default), plain values in and out, and a
refusal is an ``InvalidInput`` (400) or ``Forbidden`` (403) whose message says why.
"""

from __future__ import annotations

import ipaddress
import posixpath
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from labfleet.core.errors import Forbidden, InvalidInput

ALLOWED_SCHEMES = ("https", "http", "git")
ALLOWED_HOSTS_ENV = "LABFLEET_IMPORT_ALLOWED_HOSTS"
MAX_URL = 2048
NOTEBOOK_SUFFIXES = (".ipynb",)
ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz", ".tar")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str], Iterable[str]]


@dataclass(frozen=True)
class AllowList:
    """Hosts (lower-case names or literal addresses) and networks a superadmin allows although
    they are not public."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = ()

    def allows(self, host: str, address: Address) -> bool:
        return host in self.hosts or any(address in n for n in self.networks)


def parse_allowed(text: str | None) -> AllowList:
    """``"git.lab.internal, 10.1.0.0/16"`` as an :class:`AllowList`; a bad entry is refused by name."""
    hosts: set[str] = set()
    networks: list[Network] = []
    for raw in (text or "").split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if "/" in entry:
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                raise InvalidInput(
                    f"{ALLOWED_HOSTS_ENV}: {entry!r} is not a network (e.g. 10.1.0.0/16)"
                ) from None
        elif entry.replace(".", "").replace("-", "").replace(":", "").isalnum():
            hosts.add(entry)
        else:
            raise InvalidInput(f"{ALLOWED_HOSTS_ENV}: {entry!r} is not a host name, an address or a network")
    return AllowList(frozenset(hosts), tuple(networks))


def resolve(host: str) -> list[str]:
    """Every address ``host`` resolves to (the default resolver)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError as e:
        raise InvalidInput(f"cannot resolve {host}: {e.strerror or e}") from None
    return sorted({str(info[4][0]) for info in infos})


def is_public(address: Address) -> bool:
    """Whether an address is on the public internet (not loopback, link-local, private, shared,
    multicast, reserved or unspecified; an IPv4-mapped IPv6 address is judged as its IPv4)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


@dataclass(frozen=True)
class Source:
    """A URL an import may fetch: what it is (``notebook``, ``archive`` or ``repository``), the URL
    as given, its host and the addresses it was checked against."""

    url: str
    kind: str
    host: str
    addresses: tuple[str, ...]
    name: str  # a folder name it suggests: the repository's or the file's, without its suffix


def kind_of(path: str) -> str:
    lower = path.lower()
    if lower.endswith(NOTEBOOK_SUFFIXES):
        return "notebook"
    if lower.endswith(ARCHIVE_SUFFIXES):
        return "archive"
    return "repository"


def suggested_name(path: str) -> str:
    """``/jupyter/notebook.git`` -> ``notebook``; ``/a/data.tar.gz`` -> ``data``; ``""`` -> ``import``."""
    base = posixpath.basename(path.rstrip("/"))
    for suffix in (".git", *NOTEBOOK_SUFFIXES, *ARCHIVE_SUFFIXES):
        if base.lower().endswith(suffix):
            base = base[: -len(suffix)]
            break
    cleaned = "".join(c if c.isalnum() or c in "-_." else "-" for c in base).strip("-.")
    return cleaned[:64] or "import"


def check_url(url: Any, allowed: AllowList = AllowList(), resolver: Resolver = resolve) -> Source:
    """The URL an import may fetch, or a refusal that says why (400 for a URL that is not one an
    import takes, 403 for a host that is not public and not allowed)."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidInput("url: give the address of a notebook, a git repository or an archive")
    url = url.strip()
    if len(url) > MAX_URL:
        raise InvalidInput(f"url is longer than {MAX_URL} characters")
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise InvalidInput("url contains spaces or control characters")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ALLOWED_SCHEMES:
        raise InvalidInput(
            f"url: {scheme or 'no'} scheme; an import fetches only {', '.join(ALLOWED_SCHEMES)} URLs"
        )
    if parts.username is not None or parts.password is not None:
        raise InvalidInput(
            "url carries a user name or token: store a credential for the host instead, so that it "
            "never shows in a link, a log or a page"
        )
    host = (parts.hostname or "").lower()
    if not host:
        raise InvalidInput("url has no host")
    try:
        parts.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError:
        raise InvalidInput("url has a port that is not a number") from None
    try:
        literal: Address | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    found = [str(literal)] if literal is not None else list(resolver(host))
    if not found:
        raise InvalidInput(f"cannot resolve {host}")
    for text in found:
        address = ipaddress.ip_address(text)
        if not is_public(address) and not allowed.allows(host, address):
            where = (
                f"{host} is not a public address"
                if literal is not None
                else f"{host} is at {address}, which is not a public address"
            )
            raise Forbidden(
                f"{where}: an import fetches from there only if a superadmin allows it ({ALLOWED_HOSTS_ENV})"
            )
    return Source(
        url=url,
        kind=kind_of(parts.path),
        host=host,
        addresses=tuple(found),
        name=suggested_name(parts.path),
    )


def host_matches(host: str, pattern: str) -> bool:
    """``pattern`` is a host name (that host) or ``*.example.org`` (its subdomains)."""
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == pattern


def check_domain_hosts(host: str, rules: Any, domain: str) -> None:
    """A domain's own rules (``{"allow": [...], "deny": [...]}``, set by a superadmin) on the host an
    import fetches from: a denied host, or one not allowed when there is an allow list, is refused (403)."""
    rules = rules if isinstance(rules, dict) else {}
    if any(host_matches(host, p) for p in rules.get("deny", ())):
        raise Forbidden(f"domain {domain} does not import from {host}")
    allow = rules.get("allow") or ()
    if allow and not any(host_matches(host, p) for p in allow):
        raise Forbidden(f"domain {domain} imports only from {', '.join(allow[:10])}; not from {host}")


# ---------------------------------------------------------------- archive members


@dataclass(frozen=True)
class Member:
    """One entry of an archive as the unpacker sees it: its name, and what it is (``file``, ``dir``,
    ``symlink``, ``hardlink``, ``device``, ``fifo``)."""

    name: str
    type: str = "file"


def member_path(m: Member) -> str | None:
    """Where a member lands in the folder (a relative POSIX path), None for a directory entry that
    adds nothing (``./``), or a refusal (400) that names the member and why."""
    if m.type not in ("file", "dir"):
        raise InvalidInput(
            f"archive member {m.name[:200]!r} is a {m.type}: an import writes files and folders only"
        )
    name = m.name.replace("\\", "/")
    if "\x00" in name:
        raise InvalidInput("archive member name contains a NUL character")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise InvalidInput(f"archive member {m.name[:200]!r} has an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidInput(f"archive member {m.name[:200]!r} points outside the folder (..)")
    return "/".join(parts) or None


def check_members(members: Iterable[Member]) -> list[str]:
    """Every member's path, in order, or the first refusal: nothing is written unless all pass."""
    return [p for p in (member_path(m) for m in members) if p is not None]
