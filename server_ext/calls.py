"""Calls from inside a session to the labfleet service and to the Hub, with the session's own Hub token.

The spawner gives every session ``$JUPYTERHUB_API_TOKEN`` (scopes in ``c.Spawner.server_token_scopes``: the
labfleet configuration adds ``access:services!service=labfleet`` and ``servers!user``), ``$JUPYTERHUB_API_URL``
and ``$LABFLEET_SERVICE_URL`` (the service's REST API as the session reaches it). The token acts as the
server's owner: what the service answers is what that user may see, and nothing else.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

# The methods the extension passes on to the service; anything else is refused before any call.
METHODS = ("GET", "POST", "PATCH", "PUT", "DELETE")


@dataclass(frozen=True)
class Answer:
    """An upstream answer: its HTTP status and its body (JSON decoded; bytes otherwise)."""

    status: int
    data: Any
    content_type: str = "application/json"

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def message(self) -> str:
        """What went wrong, in the upstream's words where it gave some."""
        if isinstance(self.data, Mapping) and self.data.get("message"):
            return str(self.data["message"])
        if isinstance(self.data, bytes):
            text = self.data.decode("utf-8", "replace").strip()
            if text and "html" not in self.content_type:
                return text[:500]
        return f"HTTP {self.status}"


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
    ) -> Answer:
        """``method`` on ``<service api>/<path>``; ``raw`` sends bytes as they are (file uploads)."""
        if not self.service_url:
            return Answer(503, {"message": "this session has no labfleet service (LABFLEET_SERVICE_URL)"})
        return await self._call(
            "the labfleet service", self.service_url, method, path, body, query, raw, content_type
        )

    async def hub(self, method: str, path: str, body: Any = None) -> Answer:
        if not self.hub_api_url:
            return Answer(503, {"message": "this session runs outside a Hub (no JUPYTERHUB_API_URL)"})
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
    ) -> Answer:
        if method not in METHODS:
            return Answer(405, {"message": f"method {method} is not passed on"})
        url = base + "/" + path.lstrip("/")
        if query:
            url += "?" + urlencode(query)
        headers = {"Authorization": f"token {self.token}", "Accept": "application/json"}
        payload: bytes | None = None
        if raw is not None:
            payload = raw
            headers["Content-Type"] = content_type or "application/octet-stream"
        elif body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        elif method in ("POST", "PUT", "PATCH"):
            payload = b""
        request = HTTPRequest(
            url,
            method=method,
            headers=headers,
            body=payload,
            request_timeout=self.timeout,
            connect_timeout=min(self.timeout, 10.0),
            follow_redirects=False,
        )
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except HTTPClientError as e:  # raised for timeouts even with raise_error=False
            return Answer(504, {"message": f"{what} did not answer: {e}"})
        except OSError as e:
            return Answer(502, {"message": f"{what} cannot be reached: {e}"})
        if response.code == 599:
            return Answer(504, {"message": f"{what} did not answer: {response.error}"})
        ctype = response.headers.get("Content-Type", "")
        text = response.body or b""
        if "json" in ctype:
            try:
                return Answer(response.code, json.loads(text or b"null"), "application/json")
            except ValueError:
                pass
        return Answer(response.code, text, ctype or "application/octet-stream")


def quoted(name: str) -> str:
    """A path segment (a server name, an id) as it goes into a URL."""
    return quote(name, safe="")
