"""REST API handlers, one module per context: parse, call the logic modules, render.

Routes are listed in ``routes()`` and described in ``openapi.yaml`` (a test checks both agree)."""

from __future__ import annotations

import json
from pathlib import Path

from tornado import web

from labfleet.compute.quota import me_view
from labfleet.core import audit
from labfleet.core.errors import NotFound
from labfleet.service.base import APIHandler, BaseHandler
from labfleet.service.handlers import (
    auth,
    compute,
    console,
    maintenance,
    metrics,
    reclaim,
    serving,
    storage,
    tenancy,
    usage,
)

SPEC_FILE = Path(__file__).parent.parent / "openapi.yaml"


# ---------------------------------------------------------------- me, audit, spec


class MeHandler(APIHandler):
    async def get(self):
        def op(db, actor):
            if actor.kind != "user":
                raise NotFound("/api/me answers for users; the Hub has no labfleet account")
            view = me_view(db, actor.name)
            if view is None:
                raise NotFound(f"no labfleet user {actor.name!r}")
            return view

        self.write_json(await self.run(op))


class AuditHandler(APIHandler):
    async def get(self):
        def op(db, actor):
            offset, limit = self.get_api_pagination()
            page = audit.page_entries(db, actor, offset=offset, limit=limit, action=self.query_arg("action"))
            return self.paginated_model(page.map(audit.entry_view))

        self.write_json(await self.run(op))


class SpecHandler(web.RequestHandler):
    """The OpenAPI description of this API; public, like the docs it is."""

    def get(self):
        self.set_header("Content-Type", "application/yaml; charset=utf-8")
        self.finish(SPEC_FILE.read_text())

    def write_error(self, status_code: int, **kwargs) -> None:
        # Errors as JSON like the rest of the API; a refused method says which one is allowed (RFC 9110).
        self.set_header("Content-Type", "application/json; charset=utf-8")
        if status_code == 405:
            self.set_header("Allow", "GET")
        self.finish(json.dumps({"status": status_code, "message": self._reason}))


# ---------------------------------------------------------------- pages


class HomeHandler(BaseHandler):
    """``/services/labfleet/``: a small page that logs the browser in (OAuth) and links the API."""

    @web.authenticated
    def get(self):
        user = self.get_current_user()
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(
            self.render_string("home.html", user=user, prefix=self.lf.prefix, xsrf=self.xsrf_token.decode())
        )


def routes(prefix: str) -> list[tuple]:
    """URL patterns under the service prefix (``/services/labfleet/``)."""
    api = prefix + "api"
    return [
        (prefix + r"?", HomeHandler),
        (api + r"/openapi\.yaml", SpecHandler),
        (api + r"/me", MeHandler),
        (api + r"/audit", AuditHandler),
        *metrics.routes(prefix),
        *tenancy.routes(api),
        *compute.routes(api),
        *storage.routes(api),
        *auth.routes(api),
        *maintenance.routes(api),
        *usage.routes(api),
        *reclaim.routes(api),
        *console.routes(api),
        *serving.routes(prefix),
    ]
