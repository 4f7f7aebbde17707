"""``/services/labfleet/metrics``: the Prometheus text exposition of the fleet (labfleet.usage.metrics).

Readers: monitors and superadmins (Hub token, Hub login or signed request, as everywhere in the
API) and a Prometheus server presenting ``LabfleetService.metrics_token`` as
``Authorization: Bearer <token>``. Anyone anonymous gets 401, anyone else (the Hub itself, domain
admins, users) 403, both as JSON like the rest of the API.
"""

from __future__ import annotations

import asyncio
import hmac

from prometheus_client import CONTENT_TYPE_LATEST

from labfleet.core.authz import Actor
from labfleet.core.errors import Forbidden
from labfleet.service.base import APIHandler

BEARER = "bearer "


def bearer_matches(header: str, token: str) -> bool:
    """Whether an ``Authorization`` header presents ``token`` as a bearer token (constant time)."""
    if not token or header[: len(BEARER)].lower() != BEARER:
        return False
    return hmac.compare_digest(header[len(BEARER) :].strip().encode(), token.encode())


class MetricsHandler(APIHandler):
    async def authenticate(self) -> Actor:
        if bearer_matches(self.request.headers.get("Authorization", ""), self.lf.metrics_token):
            return Actor(
                name="prometheus", role="monitor", kind="metrics", remote_addr=self.request.remote_ip or ""
            )
        # Anything else (a Hub token as "token" or "Bearer", a login, a signature) as the API takes it:
        # a bearer token that is neither the metrics token nor a Hub token answers 401.
        return await super().authenticate()

    async def get(self):
        if self.actor.kind == "hub" or not self.actor.reads_everything:
            raise Forbidden("the metrics are for monitors, superadmins and the configured Prometheus token")
        # Off the event loop: a scrape reads the DB and builds the text (tens of ms on a large fleet,
        # benchmarks/RESULTS.md), which would hold every API call and every served request meanwhile.
        body = await asyncio.to_thread(self.lf.metrics.exposition)
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(body)


def routes(prefix: str) -> list[tuple]:
    """The metrics, beside (not under) the API: ``<prefix>metrics``, where Prometheus looks."""
    return [(prefix + "metrics", MetricsHandler)]
