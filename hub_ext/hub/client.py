"""The Hub's side of talking to the labfleet service: one small async JSON client.

The authenticator and the spawners share it.  They call the service with the service's own API
token, which the service treats as the Hub (``Actor.hub``).  A call never raises for an HTTP
answer or an unreachable service; it returns a :class:`~labfleet.core.http.HTTPReply` (``code`` 0 when unreachable),
and never logs the token or a body.  The request itself is :func:`labfleet.core.http.request`.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from traitlets import Unicode, default
from traitlets.config import LoggingConfigurable

from labfleet.core import http

DEFAULT_SERVICE_URL = "http://127.0.0.1:10101/services/labfleet/api"
SERVICE_URL_ENV = "LABFLEET_SERVICE_API_URL"
SERVICE_TOKEN_ENV = "LABFLEET_SERVICE_TOKEN"
SERVICE = "the labfleet service"

# What the labfleet service answered: ``code`` (its ``status``) 0 when it could not be reached;
# ``data`` its JSON, ``message`` its words (or why there was no answer).


def default_service_url() -> str:
    return os.environ.get(SERVICE_URL_ENV) or DEFAULT_SERVICE_URL


def default_service_token() -> str:
    return os.environ.get(SERVICE_TOKEN_ENV, "")


async def service_call(
    url: str,
    token: str,
    method: str,
    path: str,
    body: Any = None,
    *,
    timeout: float = 10.0,
    log: logging.Logger | logging.LoggerAdapter | None = None,
) -> http.HTTPReply:
    """One request to the labfleet service at ``url`` (its API base) + ``path``."""
    log = log or logging.getLogger("labfleet")
    full = url.rstrip("/") + path
    where = http.loggable(full)
    if not token:
        log.error(
            "labfleet: no service token configured (set $%s or the service_token option); refusing %s %s",
            SERVICE_TOKEN_ENV,
            method,
            where,
        )
        return http.HTTPReply(0, error="no service token", upstream=SERVICE)
    reply = await http.request(method, full, token=token, json_body=body, timeout=timeout, upstream=SERVICE)
    if reply.code == 0:
        log.error("labfleet service unreachable: %s %s failed: %s", method, where, reply.error)
    elif reply.code == 401:
        log.error(
            "labfleet service rejected the Hub's token on %s %s (401): the service token the Hub"
            " uses is not the service's own API token",
            method,
            where,
        )
    elif reply.code >= 500:
        log.error("labfleet service answered %s to %s %s: %s", reply.code, method, where, reply.words or "-")
    return reply


class LabfleetServiceClient(LoggingConfigurable):
    """Where the Hub's labfleet parts (authenticator, spawners) find the service, and how they call it.

    ``c.LabfleetServiceClient.service_url`` / ``.service_token`` configure all of them at once.
    """

    service_url = Unicode(
        help="""Base URL of the labfleet service's REST API, as the Hub reaches it
        (e.g. http://127.0.0.1:10101/services/labfleet/api).

        Defaults to $LABFLEET_SERVICE_API_URL, else http://127.0.0.1:10101/services/labfleet/api.
        """,
    ).tag(config=True)

    @default("service_url")
    def _service_url_default(self) -> str:
        return default_service_url()

    service_token = Unicode(
        help="""The labfleet service's API token, shared by the Hub and the service.

        Sent as `Authorization: token ...`; the service treats such calls as the Hub. Keep it secret:
        it is never logged. Defaults to $LABFLEET_SERVICE_TOKEN.
        """,
    ).tag(config=True)

    @default("service_token")
    def _service_token_default(self) -> str:
        return default_service_token()

    async def service_request(
        self, method: str, path: str, body: Any = None, *, timeout: float
    ) -> http.HTTPReply:
        """One request to the service; never raises, never logs the token or the body."""
        return await service_call(
            self.service_url, self.service_token, method, path, body, timeout=timeout, log=self.log
        )
