"""The session's ``labfleet/...`` endpoints (server_ext/ENDPOINTS.md): thin handlers that check the
caller, ask the service or the Hub with the session's token, and answer what ``labfleet.session.fleet`` shapes.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web

from labfleet.core.http import HTTPReply
from labfleet.core.vocab import ACTIVE_STATUSES

from .. import fleet
from ..calls import SessionCalls, quoted
from ..runner import Runner, SessionEnv, port_is_listening
from ..usage import ProcessSampler, devices_from_env, session_usage
from . import AUTH_RESOURCE

# A Hub server name as the Hub takes it in a URL (JupyterHub forbids "/"); "~" names the default server.
_SERVER_NAME = re.compile(r"^[A-Za-z0-9._-]{1,255}$")
DEFAULT_SERVER = "~"


class FleetContext:
    """What every handler of one server shares: the session, how to call out, the samplers and caches."""

    def __init__(
        self, session: SessionEnv, calls: SessionCalls, runner: Runner | None, mount_dir: str
    ) -> None:
        self.session = session
        self.calls = calls
        self.runner = runner
        self.mount_dir = mount_dir
        self.sampler = ProcessSampler()
        self.plugins: dict[str, Any] = {}
        # The session's devices never change while it runs: asked once, then kept.
        self.devices: list[dict[str, Any]] | None = None
        self.server_name = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
        self.hub_prefix = os.environ.get("JUPYTERHUB_BASE_URL", "/")


class FleetHandler(APIHandler):
    """Owner only: these act with the owner's token, so a user the server is shared with gets 403."""

    auth_resource = AUTH_RESOURCE

    def initialize(self, fleet: FleetContext) -> None:
        self.fleet = fleet

    async def prepare(self) -> None:
        await super().prepare()
        user = self.current_user
        owner = self.fleet.calls.user
        name = getattr(user, "username", None)
        if user is not None and owner and name != owner:
            raise web.HTTPError(403, "only the owner of this session may use its labfleet endpoints")

    def update_api_activity(self) -> None:
        """Reading labfleet's endpoints is not using the session: the sidebar polls them while it is open,
        and counting that as jupyter-server activity (what the session reports to the service's idle
        checker) would reset the idle countdown it shows. What the user does through them (start or stop a
        session, "I'm still here", writes through the service proxy) counts, as any API call does."""
        if self.request.method not in ("GET", "HEAD"):
            super().update_api_activity()

    def answer(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))

    def fail(self, answer: HTTPReply, what: str) -> None:
        status = answer.status if 400 <= answer.status < 600 else 502
        self.answer({"message": f"{what}: {answer.message}"}, status)

    async def session_view(self) -> tuple[dict[str, Any] | None, str]:
        sid = self.fleet.session.session_id
        if not sid:
            return None, "this server was not started by a labfleet spawner"
        got = await self.fleet.calls.service("GET", f"sessions/{quoted(sid)}")
        if not got.ok:
            # The reply's own message names the service when it has no words of its own.
            return None, f"the labfleet service answered: {got.words}" if got.words else got.message
        return got.data, "ok"


class SessionInfoHandler(FleetHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        view, service = await self.session_view()
        runner = self.fleet.runner
        ready = None
        if runner is not None and runner.type == "inference" and runner.port:
            ready = await port_is_listening(runner.port)
        self.answer(
            fleet.session_summary(
                self.fleet.session,
                view,
                now=datetime.now(timezone.utc),
                user=self.fleet.calls.user,
                server_name=self.fleet.server_name,
                base_url=self.base_url,
                runner=runner.snapshot(tail=True) if runner is not None else None,
                inference_ready=ready,
                service=service,
            )
        )


class StillHereHandler(FleetHandler):
    """``POST labfleet/session/still-here``: the user says "I'm still here": the service resets this
    session's idle timer and answers its idle object after the reset."""

    @web.authenticated
    @authorized
    async def post(self) -> None:
        sid = self.fleet.session.session_id
        if not sid:
            self.answer(
                {"message": "this server was not started by a labfleet spawner: it has no idle timer"}, 409
            )
            return
        got = await self.fleet.calls.service("POST", f"sessions/{quoted(sid)}/still-here")
        if not got.ok:
            self.fail(got, "cannot reset the idle timer")
            return
        self.answer(got.data)


class UsageHandler(FleetHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        if self.fleet.devices is None:
            view, _ = await self.session_view()
            if view is not None:
                self.fleet.devices = list(view.get("devices") or [])
        devices = self.fleet.devices if self.fleet.devices is not None else devices_from_env()
        # /proc and NVML block: off the event loop.
        self.answer(
            await asyncio.to_thread(session_usage, self.fleet.sampler, devices, None, self.fleet.plugins)
        )


class MountedFoldersHandler(FleetHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        view, service = await self.session_view()
        if view is None:
            self.answer({"message": f"cannot list this session's folders: {service}"}, 502)
            return
        mounts = list(view.get("mounts") or [])
        answers = await asyncio.gather(
            *(self.fleet.calls.service("GET", f"vfolders/{quoted(str(m.get('vfolder')))}") for m in mounts)
        )
        folders = {
            str(m.get("vfolder")): (a.data if a.ok else None) for m, a in zip(mounts, answers, strict=True)
        }
        self.answer(fleet.mounted_folders(mounts, folders, self.fleet.mount_dir))


class QuotaHandler(FleetHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        me = await self.fleet.calls.service("GET", "me")
        if not me.ok:
            self.fail(me, "cannot read the quota")
            return
        self.answer(fleet.quota_summary(me.data, self.fleet.session.project or None))


SESSION_PAGE = 1000  # the service's largest page


class SessionListHandler(FleetHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        user = self.fleet.calls.user
        # Only live sessions are shown, and the service answers pages, oldest first: ask for each live
        # status, one page of up to 1,000 each (a user's policy keeps far fewer live), not every ended one.
        answers = await asyncio.gather(
            *(
                self.fleet.calls.service(
                    "GET", "sessions", query={"user": user, "status": status, "limit": str(SESSION_PAGE)}
                )
                for status in ACTIVE_STATUSES
            )
        )
        failed = next((a for a in answers if not a.ok), None)
        if failed is not None:
            self.fail(failed, "cannot list the sessions")
            return
        views = sorted(
            (v for a in answers for v in (a.data or [])),
            key=lambda v: (str(v.get("created_at") or ""), str(v.get("id"))),
        )
        # The queue position is only in each session's own view: ask for the pending ones.
        pending = [v for v in views if v.get("status") == "PENDING"]
        details = await asyncio.gather(
            *(self.fleet.calls.service("GET", f"sessions/{quoted(str(v['id']))}") for v in pending)
        )
        for v, d in zip(pending, details, strict=True):
            if d.ok:
                v["queue_position"] = d.data.get("queue_position")
        self.answer(
            fleet.my_sessions(
                views, user=user, current_id=self.fleet.session.session_id, hub_prefix=self.fleet.hub_prefix
            )
        )


class ServerHandler(FleetHandler):
    """Start (POST, the body is the spawn options) or stop (DELETE) one of my servers through the Hub."""

    def _hub_path(self, name: str) -> str | None:
        user = quoted(self.fleet.calls.user)
        if name == DEFAULT_SERVER:
            return f"users/{user}/server"
        if not _SERVER_NAME.match(name):
            return None
        return f"users/{user}/servers/{quoted(name)}"

    @web.authenticated
    @authorized
    async def post(self, name: str) -> None:
        path = self._hub_path(name)
        if path is None:
            self.answer({"message": f"{name[:80]!r} is not a server name (letters, digits, . _ -)"}, 400)
            return
        try:
            options = json.loads(self.request.body or b"{}")
        except ValueError:
            self.answer({"message": "the body must be JSON: the new session's options"}, 400)
            return
        if not isinstance(options, dict):
            self.answer({"message": "the body must be a JSON object: the new session's options"}, 400)
            return
        got = await self.fleet.calls.hub("POST", path, options)
        if not got.ok:
            self.fail(got, "the session did not start")
            return
        self.answer({"name": "" if name == DEFAULT_SERVER else name, "status": got.status}, 202)

    @web.authenticated
    @authorized
    async def delete(self, name: str) -> None:
        path = self._hub_path(name)
        if path is None:
            self.answer({"message": f"{name[:80]!r} is not a server name"}, 400)
            return
        got = await self.fleet.calls.hub("DELETE", path)
        if not got.ok:
            self.fail(got, "the session did not stop")
            return
        self.answer({"name": "" if name == DEFAULT_SERVER else name, "status": got.status}, 202)


class ServiceProxyHandler(FleetHandler):
    """``labfleet/api/<path>``: the labfleet service's REST API, as the owner (the session's token)."""

    async def _pass(self, path: str) -> None:
        if ".." in path.split("/"):
            self.answer({"message": "bad path"}, 400)
            return
        query = {k: self.get_query_argument(k) for k in self.request.query_arguments}
        ctype = self.request.headers.get("Content-Type", "")
        raw = None
        if self.request.method in ("POST", "PUT", "PATCH"):
            raw = self.request.body or b""
        # tornado gave the path decoded: encode it again, or a name with a space, "%", "#" or "?" would
        # reach the service as a broken request line.
        got = await self.fleet.calls.service(
            self.request.method or "GET",
            quote(path, safe="/"),
            query=query,
            raw=raw,
            content_type=ctype or None,
        )
        self.set_status(got.status if 100 <= got.status < 600 else 502)
        for name, value in got.passed.items():
            self.set_header(name, value)
        if got.content_type.startswith("application/json"):
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(got.data))
        else:
            self.set_header("Content-Type", got.content_type)
            self.finish(got.data if isinstance(got.data, bytes) else b"")

    @web.authenticated
    @authorized
    async def _any(self, path: str) -> None:
        await self._pass(path)

    get = post = patch = put = delete = _any


def fleet_handlers(context: FleetContext) -> list[tuple[str, Any, dict[str, Any]]]:
    """The routes, relative (ExtensionApp prefixes the server's base URL)."""
    kw = {"fleet": context}
    return [
        (r"/labfleet/session", SessionInfoHandler, kw),
        (r"/labfleet/session/still-here", StillHereHandler, kw),
        (r"/labfleet/usage", UsageHandler, kw),
        (r"/labfleet/vfolders", MountedFoldersHandler, kw),
        (r"/labfleet/quota", QuotaHandler, kw),
        (r"/labfleet/sessions", SessionListHandler, kw),
        (r"/labfleet/sessions/([^/]+)", ServerHandler, kw),
        (r"/labfleet/api/(.*)", ServiceProxyHandler, kw),
    ]
