"""REST API handlers, one module per context: parse, call the logic modules, render.

Routes are listed in ``routes()`` and described in ``openapi.yaml`` (a test checks both agree)."""

from __future__ import annotations

import hashlib
import json
import os
from functools import cache
from pathlib import Path

from tornado import web

from labfleet.compute.quota import me_view
from labfleet.core import audit
from labfleet.core.errors import NotFound
from labfleet.core.hubmap import console_wanted
from labfleet.service.base import APIHandler, BaseHandler, PathOnlyLogs
from labfleet.service.handlers import (
    auth,
    compute,
    console,
    environments,
    imports,
    maintenance,
    metrics,
    reclaim,
    serving,
    storage,
    tenancy,
    usage,
)

SPEC_FILE = Path(__file__).parent.parent / "openapi.yaml"
STATIC_DIR = Path(__file__).parent.parent / "static"  # the Fleet home's script and style


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


def hub_base_url(prefix: str, environ: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """The Hub's base URL (``/`` or ``/base/``): $JUPYTERHUB_BASE_URL, which the Hub gives its
    services, else what comes before ``services/`` in this service's prefix."""
    base = environ.get("JUPYTERHUB_BASE_URL") or (
        prefix.rsplit("services/", 1)[0] if "services/" in prefix else "/"
    )
    return base if base.endswith("/") else base + "/"


@cache
def static_version(name: str) -> str:
    """A short hash of a static file's content, for its URL (``?v=``: cached long, never stale)."""
    try:
        return hashlib.sha256((STATIC_DIR / name).read_bytes()).hexdigest()[:12]
    except OSError:
        return "0"


class HomeHandler(BaseHandler):
    """``/services/labfleet/``: the Fleet home, where people land after logging in to the Hub. The
    page is static; its script (static/fleethome.js) asks this service's API as the browser's
    Hub login, sending the page's XSRF token with every change."""

    template = "home.html"

    @web.authenticated
    def get(self):
        user = self.get_current_user()
        prefix = self.lf.prefix
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(
            self.render_string(
                self.template,
                user=user,
                prefix=prefix,
                hub=hub_base_url(prefix),
                console=console_wanted(os.environ),  # configure() tells the service
                xsrf=self.xsrf_token.decode(),
                version=static_version,
            )
        )


class ImportPageHandler(HomeHandler):
    """``/services/labfleet/import``: Import & Run (static/import.js), where ``/hub/labfleet/import``
    links land with their query; a browser not logged in comes back here, query and all, after
    the Hub's login."""

    template = "import.html"


class StaticHandler(PathOnlyLogs, web.StaticFileHandler):
    """The Fleet home's scripts and style (public, as the Hub's own static files are). A URL with
    ``?v=`` (the page's) is cached for long; the modules its script imports are asked again each
    time (a 304 while unchanged), so an upgrade never mixes old and new ones."""

    def initialize(self) -> None:  # type: ignore[override]
        super().initialize(str(STATIC_DIR))

    def set_extra_headers(self, path: str) -> None:
        if "v" not in self.request.arguments:
            self.set_header("Cache-Control", "no-cache")


PAGES = (
    HomeHandler,
    ImportPageHandler,
    StaticHandler,
)  # routes that are pages, not API (not in openapi.yaml)


def routes(prefix: str) -> list[tuple]:
    """URL patterns under the service prefix (``/services/labfleet/``)."""
    api = prefix + "api"
    return [
        (prefix + r"?", HomeHandler),
        (prefix + r"import", ImportPageHandler),
        (prefix + r"static/(.*)", StaticHandler),
        (api + r"/openapi\.yaml", SpecHandler),
        (api + r"/me", MeHandler),
        (api + r"/audit", AuditHandler),
        *metrics.routes(prefix),
        *tenancy.routes(api),
        *compute.routes(api),
        *storage.routes(api),
        *imports.routes(api),
        *environments.routes(api),
        *auth.routes(api),
        *maintenance.routes(api),
        *usage.routes(api),
        *reclaim.routes(api),
        *console.routes(api),
        *serving.routes(prefix),
    ]
