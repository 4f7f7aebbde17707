"""The Hub's proxy error pages, as JSON for calls to labfleet's API.

When the proxy cannot reach a target (the labfleet service restarting, say), it asks the Hub for an
error page (``/hub/error/<code>?url=<path>``) and passes on the page and its Content-Type. The Hub's
own page is HTML; an API client would get HTML where it expects ``{"status", "message"}``. For a path
under the service's API this answers that JSON instead; any other path gets the Hub's page. (The
proxy passes on only the page's Content-Type and Content-Encoding: no Retry-After.) The authenticator registers it (its handlers come before the Hub's own).
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from jupyterhub.handlers.pages import ProxyErrorHandler
from jupyterhub.utils import url_path_join

from labfleet.core.hubmap import SERVICE_NAME


def api_prefix(base_url: str) -> str:
    """Where the service's API starts, below the Hub's base URL."""
    return url_path_join(base_url, "services", SERVICE_NAME, "api") + "/"


def is_api_call(url: str, base_url: str) -> bool:
    """Whether ``url`` (the path and query the proxy could not serve) is a call to the service's API."""
    path = urlsplit(url).path
    prefix = api_prefix(base_url)
    return path == prefix.rstrip("/") or path.startswith(prefix)


def api_error_body(status: int, reason: str) -> dict[str, object]:
    message = (
        "the labfleet service is not answering (it may be restarting); retry shortly"
        if status in (502, 503)
        else reason
    )
    return {"status": status, "message": message}


class LabfleetProxyErrorHandler(ProxyErrorHandler):
    async def get(self, status_code_s: str) -> None:
        status = int(status_code_s)
        if not is_api_call(self.get_argument("url", ""), self.base_url):
            await super().get(status_code_s)
            return
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.write(json.dumps(api_error_body(status, self._reason)))


def handlers() -> list[tuple[str, type]]:
    """Routes that answer before the Hub's own (relative to the Hub's prefix)."""
    return [(r"/error/(\d+)", LabfleetProxyErrorHandler)]
