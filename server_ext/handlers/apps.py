"""The app services inside the Jupyter server: the image's ports handed to jupyter-server-proxy, and
``GET labfleet/apps``. What to offer is decided in ``labfleet.session.apps``; this only wires it in."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web
from traitlets.config import Config, LazyConfigValue

from ..apps import App, session_apps
from . import AUTH_RESOURCE


def configured_servers(config: Config) -> dict[str, Any]:
    """``c.ServerProxy.servers`` as the server's config holds it (a dict, or ``.update()``-style lazy)."""
    if "ServerProxy" not in config:  # checked first: reading a missing section would create it
        return {}
    servers = config.ServerProxy.get("servers", {})
    if isinstance(servers, LazyConfigValue):
        servers = servers.get_value({})
    return dict(servers) if isinstance(servers, Mapping) else {}


def link_apps(serverapp: Any, log: Any, environ: Mapping[str, str] | None = None) -> list[App]:
    """Add the image's service ports to ``c.ServerProxy.servers`` and return the session's apps.

    Runs while the server links its extensions: every extension is linked before any is loaded, so
    jupyter-server-proxy reads these servers when it loads, beside its entry-point launchers."""
    environ = os.environ if environ is None else environ
    configured = configured_servers(serverapp.config)
    apps, servers, problems = session_apps(environ, configured)
    for problem in problems:
        log.warning("labfleet: %s", problem)
    if servers:
        serverapp.update_config(Config({"ServerProxy": {"servers": {**configured, **servers}}}))
    log.info("labfleet: app services %s", ", ".join(f"{a.name} ({a.source})" for a in apps) or "none")
    return apps


class AppsHandler(APIHandler):
    """GET <base_url>labfleet/apps: the session's app services, for its owner."""

    auth_resource = AUTH_RESOURCE
    # Read by the sidebar while it is open: not activity of the session (see FleetHandler.update_api_activity).
    _track_activity = False

    def initialize(self, apps: list[App]) -> None:
        self.apps = apps

    @web.authenticated
    @authorized
    async def get(self) -> None:
        owner = os.environ.get("JUPYTERHUB_USER")
        if owner and getattr(self.current_user, "username", None) != owner:
            raise web.HTTPError(403, "only the owner of this session may list its apps")
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps([app.view(self.base_url) for app in self.apps]))
