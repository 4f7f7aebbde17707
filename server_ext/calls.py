"""Calls from inside a session to the labfleet service and to the Hub, with the session's own Hub token.

The spawner gives every session ``$JUPYTERHUB_API_TOKEN`` (scopes in ``c.Spawner.server_token_scopes``: the
labfleet configuration adds ``access:services!service=labfleet`` and ``servers!user``), ``$JUPYTERHUB_API_URL``
and ``$LABFLEET_SERVICE_URL`` (the service's REST API as the session reaches it). The token acts as the
server's owner: what the service answers is what that user may see, and nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote

from labfleet.core import http

# The methods the extension passes on to the service; anything else is refused before any call.
METHODS = ("GET", "POST", "PATCH", "PUT", "DELETE")

# An upstream answer (labfleet.core.http's reply): ``status``, ``ok``, ``message`` (what went wrong, in
# the upstream's words where it gave some), ``content_type``, and ``data``: the JSON body decoded, or
# else the body's bytes as they came (the service proxy passes them on). No answer is a 502 (504: timed
# out) with ``{"message": ...}``.


def _refused(status: int, message: str) -> http.HTTPReply:
    return http.HTTPReply(status, {"message": message}, content_type=http.JSON, is_json=True)


@dataclass(frozen=True)
class SessionCalls:
    """Where the service and the Hub are, and the token to call them with."""

    service_url: str
    hub_api_url: str
    token: str
    user: str
    timeout: float = 20.0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None, timeout: float = 20.0) -> SessionCalls:
        env = os.environ if environ is None else environ
        return cls(
            service_url=env.get("LABFLEET_SERVICE_URL", "").rstrip("/"),
            hub_api_url=env.get("JUPYTERHUB_API_URL", "").rstrip("/"),
            token=env.get("JUPYTERHUB_API_TOKEN", ""),
            user=env.get("JUPYTERHUB_USER", ""),
            timeout=timeout,
        )

    async def service(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        raw: bytes | None = None,
        content_type: str | None = None,
    ) -> http.HTTPReply:
        """``method`` on ``<service api>/<path>``; ``raw`` sends bytes as they are (file uploads)."""
        if not self.service_url:
            return _refused(503, "this session has no labfleet service (LABFLEET_SERVICE_URL)")
        return await self._call(
            "the labfleet service", self.service_url, method, path, body, query, raw, content_type
        )

    async def hub(self, method: str, path: str, body: Any = None) -> http.HTTPReply:
        if not self.hub_api_url:
            return _refused(503, "this session runs outside a Hub (no JUPYTERHUB_API_URL)")
        return await self._call("the Hub", self.hub_api_url, method, path, body, None, None, None)

    async def _call(
        self,
        what: str,
        base: str,
        method: str,
        path: str,
        body: Any,
        query: Mapping[str, str] | None,
        raw: bytes | None,
        content_type: str | None,
    ) -> http.HTTPReply:
        if method not in METHODS:
            return _refused(405, f"method {method} is not passed on")
        reply = await http.request(
            method,
            base + "/" + path.lstrip("/"),
            token=self.token,
            json_body=body,
            data=raw,
            content_type=content_type,
            query=query,
            timeout=self.timeout,
            connect_timeout=min(self.timeout, 10.0),
            upstream=what,
        )
        if reply.status == 0:
            return _refused(504 if reply.timed_out else 502, reply.message)
        if reply.is_json:
            return replace(reply, content_type=http.JSON)
        return replace(reply, data=reply.body, content_type=reply.content_type or "application/octet-stream")


def quoted(name: str) -> str:
    """A path segment (a server name, an id) as it goes into a URL."""
    return quote(name, safe="")
