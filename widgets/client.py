"""The widgets' data source: an async client of the session's own labfleet endpoints.

Every labfleet session answers ``<base_url>labfleet/...`` (server_ext/ENDPOINTS.md); a kernel runs
next to that server, so it asks its own server, with the session's Hub token, and the server asks the
labfleet service as the session's owner. Non-blocking: tornado's AsyncHTTPClient on the kernel's
running loop, so a refresh never holds up the kernel.

:class:`labfleet.widgets.fake.FakeFleet` has the same coroutine methods, for tests and demos without a Hub.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from labfleet.core import http

DEFAULT_TIMEOUT = 30.0
# Hosts a server binds to that nobody connects to: the kernel reaches its server on the loopback.
_ANY_HOSTS = {"", "0.0.0.0", "::", "[::]", "*"}


class FleetError(Exception):
    """A request the session or the labfleet service refused or could not answer; ``message`` says why."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def connectable(url: str) -> str:
    """The server's bind URL as a URL to connect to: ``0.0.0.0`` (or no host) becomes ``127.0.0.1``,
    and the path ends with a slash."""
    parts = urlsplit(url)
    if not parts.scheme:
        raise FleetError(f"the session's URL {url!r} has no scheme (http:// or https://)")
    host = parts.hostname or ""
    netloc = parts.netloc
    if host in _ANY_HOSTS or f"[{host}]" in _ANY_HOSTS:
        netloc = "127.0.0.1" + (f":{parts.port}" if parts.port else "")
    path = parts.path if parts.path.endswith("/") else parts.path + "/"
    return urlunsplit((parts.scheme, netloc, path, "", ""))


def iso_time(value: datetime | str) -> str:
    """A time for the service's ``start``/``end``: a datetime as ISO 8601 (a naive one taken as UTC), a
    string as it is (the service parses and checks it)."""
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).isoformat()
    return str(value)


def server_path(name: str) -> str:
    """A server name in ``labfleet/sessions/<name>``: the default server ``""`` is ``~``."""
    return quote(name, safe="") if name else "~"


class FleetClient:
    """The labfleet endpoints of one session server, at ``base_url`` with ``token``.

    ``FleetClient.from_env()`` reads ``$JUPYTERHUB_SERVICE_URL`` and ``$JUPYTERHUB_API_TOKEN``, which a
    kernel of a session under a Hub has. From outside a session (tests, scripts) give both: e.g.
    ``FleetClient("http://127.0.0.1:8000/user/alice/work/", token)`` through the Hub's proxy.
    """

    def __init__(
        self, base_url: str, token: str | None, *, user: str | None = None, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        self.base_url = connectable(base_url)
        self.token = token
        self.timeout = timeout
        self._user = user

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> FleetClient:
        env = os.environ if environ is None else environ
        url = env.get("JUPYTERHUB_SERVICE_URL")
        token = env.get("JUPYTERHUB_API_TOKEN")
        if not url or not token:
            raise FleetError(
                "not inside a labfleet session ($JUPYTERHUB_SERVICE_URL and $JUPYTERHUB_API_TOKEN are not"
                " set): pass client=FleetClient(url, token), or labfleet.widgets.fake.FakeFleet() for a demo"
            )
        return cls(url, token, user=env.get("JUPYTERHUB_USER") or None)

    def __repr__(self) -> str:
        return f"FleetClient({self.base_url!r})"

    # -- HTTP ------------------------------------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        data: bytes | None = None,
        query: dict[str, str] | None = None,
    ) -> Any:
        """``method`` on ``<base_url><path>``; JSON ``body`` or raw ``data``; the answer's JSON (or None).

        Raises :class:`FleetError` with the service's own message on a 4xx/5xx, and with the cause when
        the server cannot be reached.
        """
        reply = await http.request(
            method,
            self.base_url + path.lstrip("/"),
            token=self.token,
            json_body=body,
            data=data,
            query=query,
            timeout=self.timeout,
            upstream=f"the session server at {self.base_url}",
        )
        if reply.status == 0:
            raise FleetError(reply.message, 504 if reply.timed_out else 502)
        if reply.status >= 300:
            raise FleetError(reply.message, reply.status)
        try:
            return reply.json()
        except ValueError:  # UnicodeDecodeError too
            raise FleetError(f"{method} {path} did not answer JSON", 502) from None

    # -- the endpoints the widgets use -------------------------------------------------------------------

    async def session(self) -> dict[str, Any]:
        return await self.request("GET", "labfleet/session")

    async def user(self) -> str:
        """The session's owner (the one the labfleet/api calls act as)."""
        if not self._user:
            self._user = str((await self.session())["user"])
        return self._user

    async def usage(self) -> dict[str, Any]:
        return await self.request("GET", "labfleet/usage")

    async def quota(self) -> dict[str, Any]:
        return await self.request("GET", "labfleet/quota")

    async def sessions(self) -> list[dict[str, Any]]:
        return await self.request("GET", "labfleet/sessions")

    async def start_session(self, name: str, options: dict[str, Any]) -> dict[str, Any]:
        return await self.request("POST", f"labfleet/sessions/{server_path(name)}", options)

    async def stop_session(self, name: str) -> Any:
        return await self.request("DELETE", f"labfleet/sessions/{server_path(name)}")

    async def launch_options(self) -> dict[str, Any]:
        user = quote(await self.user(), safe="")
        return await self.request("GET", f"labfleet/api/users/{user}/launch-options")

    async def vfolders(self) -> list[dict[str, Any]]:
        """My folders, those shared with me and my projects' folders (not the trashed ones): the
        first 1,000 by name, the service's largest page (folder counts are capped by policy)."""
        return await self.request("GET", "labfleet/api/vfolders", query={"status": "READY", "limit": "1000"})

    async def create_vfolder(self, name: str, **fields: Any) -> dict[str, Any]:
        return await self.request("POST", "labfleet/api/vfolders", {"name": name, **fields})

    async def upload(self, folder_id: str, path: str, data: bytes) -> dict[str, Any]:
        """Write ``data`` to ``path`` in the folder (a whole-file PUT, sent with its Content-Length)."""
        target = quote(path.lstrip("/"), safe="/")
        return await self.request(
            "PUT", f"labfleet/api/vfolders/{quote(folder_id, safe='')}/files/{target}", data=bytes(data)
        )

    async def my_usage(self) -> dict[str, Any]:
        """My usage (``GET /api/usage/me``): allocated and used slot-seconds over the last 7 and 30 days and
        this month (``periods``), and the last 30 days one by one (``daily``, oldest first)."""
        return await self.request("GET", "labfleet/api/usage/me")

    async def usage_report(
        self,
        group_by: str = "user",
        start: datetime | str | None = None,
        end: datetime | str | None = None,
        bucket: str = "none",
    ) -> dict[str, Any]:
        """Usage rows (``GET /api/usage``) per ``group_by`` (user, project, domain, resource_group, session)
        and ``bucket`` (15m, hour, day or none) between ``start`` and ``end`` (the service's defaults where
        None). A user sees their own rows; an admin those of the users they administer."""
        query = {"group_by": group_by, "bucket": bucket, "format": "json"}
        if start is not None:
            query["start"] = iso_time(start)
        if end is not None:
            query["end"] = iso_time(end)
        return await self.request("GET", "labfleet/api/usage", query=query)
