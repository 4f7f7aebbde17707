"""Thin tornado handlers: the runner's state, and the proxy to the inference command.

The logic lives in ``labfleet.session.runner``; these only authenticate, read it and answer.
"""

from __future__ import annotations

import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server_proxy.handlers import ProxyHandler
from tornado import web

from ..runner import Runner
from . import AUTH_RESOURCE


class RunnerStateHandler(APIHandler):
    """GET <base_url>labfleet/runner: what the session's command is doing, with the end of its output."""

    auth_resource = AUTH_RESOURCE
    # Read by the sidebar while it is open: not activity of the session (see FleetHandler.update_api_activity).
    _track_activity = False

    def initialize(self, runner: Runner | None) -> None:
        self.runner = runner

    @web.authenticated
    @authorized
    async def get(self) -> None:
        if self.runner is None:
            self.finish(json.dumps({"type": "interactive", "state": "none"}))
            return
        self.finish(json.dumps(self.runner.snapshot(tail=True)))


class InferenceProxyHandler(ProxyHandler):
    """<base_url>labfleet/inference/<path> -> http://127.0.0.1:<port>/<path> of the inference command.

    jupyter-server-proxy's handler does the proxying (every HTTP method, websockets, streaming, redirects)
    and enforces the server's authentication on every request, so whoever may use this server (its owner,
    or a Hub token with ``access:servers!server=<user>/<server>`` shared with someone) may call the model,
    and nobody else. What this class adds: a port known only at run time, and a clear 503 while the
    command is not (or no longer) listening instead of a hanging or opaque 5xx.
    """

    # Only the command's own loopback port is ever proxied.
    host = "127.0.0.1"

    def initialize(self, runner: Runner) -> None:
        self.runner = runner
        # The prefix the backend sees in X-Forwarded-Prefix and that redirects (Location) are rewritten to.
        self.proxy_base = "labfleet/inference"

    async def prepare(self, *args: Any, **kwargs: Any) -> None:
        # Authentication first (the parent's prepare): an unauthenticated caller learns nothing, not even
        # whether the model is up.
        await super().prepare(*args, **kwargs)
        if self._finished:
            return
        problem = await self.runner.not_ready_reason()
        if problem:
            self.set_status(503)
            self.set_header("Content-Type", "application/json")
            self.set_header("Retry-After", "2")
            self.finish(json.dumps({"message": problem, "runner": self.runner.snapshot(tail=False)}))

    # One captured group, the path below the prefix; every method goes to the command's port.

    async def http_get(self, path: str) -> Any:
        return await self.proxy(self.host, self.runner.port, path)

    async def open(self, path: str) -> Any:
        return await self.proxy_open(self.host, self.runner.port, path)

    def post(self, path: str) -> Any:
        return self.proxy(self.host, self.runner.port, path)

    def put(self, path: str) -> Any:
        return self.proxy(self.host, self.runner.port, path)

    def delete(self, path: str) -> Any:
        return self.proxy(self.host, self.runner.port, path)

    def head(self, path: str) -> Any:
        return self.proxy(self.host, self.runner.port, path)

    def patch(self, path: str) -> Any:
        return self.proxy(self.host, self.runner.port, path)

    def options(self, path: str) -> Any:
        return self.proxy(self.host, self.runner.port, path)
