"""labfleet.session: the session's activity reports to the labfleet service, "I'm still here", and the idle object
in ``labfleet/session``.

The server is pytest-jupyter's in-process ServerApp with the extension loaded (as in test_server_ext.py), its
kernels real ipykernels; the labfleet service is a small fake on 127.0.0.1 that records what it is sent and
answers what each test tells it to (the real service's answers are checked in test_server_ext_fleet.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

# Imported into this module only: see the comment in test_server_ext.py.
from pytest_jupyter.jupyter_server import *  # noqa: F403
from tornado import httpserver, netutil, web
from tornado.httpclient import HTTPClientError

from labfleet.session import fleet
from labfleet.session.activity import DEFAULT_INTERVAL, ActivityReporter, activity_interval, busy_kernels
from labfleet.session.calls import SessionCalls
from labfleet.session.runner import SessionEnv

SID = "5e55a1d0-0000-4000-8000-00000000000a"
TOKEN = "session-token"
WAIT = 30.0  # seconds: the most any wait in these tests may take
IDLE = {
    "idle_for": 120.0,
    "timeout": 3600.0,
    "reclaim_at": "2026-11-21T11:00:00+00:00",
    "checker": "policy:default",
    "reason": "no activity for 120s",
    "only_when_queue_waiting": False,
}


# -- a fake labfleet service -------------------------------------------------------------------------------


class FakeService:
    """Records every request; answers ``replies[(method, path)]`` = (status, JSON body), else 404."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.replies: dict[tuple[str, str], tuple[int, Any]] = {}
        self.url = ""

    def reports(self) -> list[dict[str, Any]]:
        """The bodies of the activity reports received, in order."""
        return [r["body"] for r in self.requests if r["method"] == "POST" and r["path"].endswith("/activity")]

    async def wait_report(self, check: Any, after: int = 0, timeout: float = WAIT) -> dict[str, Any]:
        """The first report from the ``after``-th on for which ``check(body)`` holds (bounded wait)."""
        deadline = time.monotonic() + timeout
        while True:
            for body in self.reports()[after:]:
                if check(body):
                    return body
            assert time.monotonic() < deadline, f"no such report in {timeout}s: {self.reports()[after:]}"
            await asyncio.sleep(0.05)


class _Handler(web.RequestHandler):
    def initialize(self, fake: FakeService) -> None:
        self.fake = fake

    def _any(self, path: str) -> None:
        body = json.loads(self.request.body) if self.request.body else None
        self.fake.requests.append(
            {
                "method": self.request.method,
                "path": "/" + path,
                "body": body,
                "auth": self.request.headers.get("Authorization"),
            }
        )
        status, reply = self.fake.replies.get((self.request.method or "", "/" + path), (404, None))
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(reply if reply is not None else {"message": f"no fake for /{path}"}))

    get = post = _any


@pytest.fixture
async def jp_asyncio_loop():
    """pytest-jupyter's server on pytest-asyncio's (module) loop, which must stay open (test_server_ext.py)."""
    return asyncio.get_running_loop()


@pytest.fixture
async def service() -> AsyncIterator[FakeService]:
    fake = FakeService()
    fake.replies[("POST", f"/sessions/{SID}/activity")] = (200, {"session": SID, "reported_at": "now"})
    sockets = netutil.bind_sockets(0, "127.0.0.1")
    app = web.Application([(r"/api/(.*)", _Handler, {"fake": fake})], log_function=lambda handler: None)
    server = httpserver.HTTPServer(app)
    server.add_sockets(sockets)
    fake.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}/api"
    yield fake
    server.stop()
    await server.close_all_connections()


@pytest.fixture
def session_env(request, monkeypatch, service):
    """The spawner's variables for this test's server (set before it is created). Parametrize indirectly
    with a dict of variables to set (a value of None removes one)."""
    for name in list(os.environ):
        if name.startswith(("LABFLEET_", "JUPYTERHUB_")):
            monkeypatch.delenv(name)
    env = {
        "LABFLEET_SESSION_ID": SID,
        "LABFLEET_SERVICE_URL": service.url,
        "JUPYTERHUB_API_TOKEN": TOKEN,
        "LABFLEET_ACTIVITY_INTERVAL": "1",
    }
    env.update(getattr(request, "param", {}))
    for name, value in env.items():
        if value is not None:
            monkeypatch.setenv(name, value)
    return env


def env(**variables):
    return pytest.mark.parametrize("session_env", [variables], indirect=True)


@pytest.fixture
def jp_server_config(session_env):
    return {
        "ServerApp": {"jpserver_extensions": {"labfleet.session": True}},
        "LabfleetExtension": {"exit_with_command": False},
    }


@pytest.fixture
async def app(jp_serverapp):
    """The server with its extensions started (as ServerApp does once its loop runs), stopped afterwards;
    its kernels shut down."""
    await jp_serverapp.extension_manager.start_all_extensions()
    yield jp_serverapp
    await jp_serverapp.extension_manager.stop_all_extensions()
    await jp_serverapp.kernel_manager.shutdown_all(now=True)


def extension(serverapp):
    (ext,) = serverapp.extension_manager.extension_apps["labfleet.session"]
    return ext


async def computing_kernel(serverapp):
    """A real kernel running ``while True: pass``: (kernel id, its client)."""
    km = serverapp.kernel_manager
    kid = await km.start_kernel()
    client = km.get_kernel(kid).client()
    client.start_channels()
    await client.wait_for_ready(timeout=WAIT)
    client.execute("while True: pass")
    return kid, client


def instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# -- the interval ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected", "warned"),
    [
        (None, DEFAULT_INTERVAL, False),
        ("", DEFAULT_INTERVAL, False),
        ("5", 5.0, False),
        (" 2.5 ", 2.5, False),
        ("1", 1.0, False),
        ("0.5", DEFAULT_INTERVAL, True),
        ("0", DEFAULT_INTERVAL, True),
        ("-3", DEFAULT_INTERVAL, True),
        ("soon", DEFAULT_INTERVAL, True),
        ("inf", DEFAULT_INTERVAL, True),
        ("nan", DEFAULT_INTERVAL, True),
    ],
)
def test_interval_from_the_environment(value, expected, warned, caplog):
    log = logging.getLogger("test.activity")
    environ = {} if value is None else {"LABFLEET_ACTIVITY_INTERVAL": value}
    with caplog.at_level(logging.WARNING, logger="test.activity"):
        assert activity_interval(environ, log) == expected
    assert bool(caplog.records) is warned
    if warned:
        assert "LABFLEET_ACTIVITY_INTERVAL" in caplog.text and repr(value) in caplog.text


@env(LABFLEET_ACTIVITY_INTERVAL="every minute")
async def test_a_bad_interval_in_the_session_falls_back_to_the_default(app):
    reporter = extension(app).activity
    assert reporter is not None and reporter.running and reporter.interval == DEFAULT_INTERVAL


# -- the reporter in the server ----------------------------------------------------------------------------


async def test_reports_busy_kernels_while_a_kernel_computes(app, service):
    """Every interval (1 s here): busy_kernels counts the kernel running ``while True: pass``; 0 again once
    it is interrupted; last_activity is jupyter-server's own."""
    idle = await service.wait_report(lambda b: True)
    assert idle["busy_kernels"] == 0
    assert instant(idle["last_activity"]) == app.web_app.last_activity().replace(tzinfo=timezone.utc)
    assert all(r["auth"] == f"token {TOKEN}" for r in service.requests)  # the session's own token

    kid, client = await computing_kernel(app)
    try:
        n = len(service.reports())
        busy = await service.wait_report(lambda b: b["busy_kernels"] == 1, after=n)
        # Still busy at the next report: the clock's reports keep saying so while it computes.
        n = service.reports().index(busy) + 1
        again = await service.wait_report(lambda b: True, after=n)
        assert again["busy_kernels"] == 1
        assert instant(again["last_activity"]) >= instant(idle["last_activity"])

        await app.kernel_manager.interrupt_kernel(kid)
        n = len(service.reports())
        await service.wait_report(lambda b: b["busy_kernels"] == 0, after=n)
    finally:
        client.stop_channels()


@env(LABFLEET_ACTIVITY_INTERVAL="600")
async def test_a_kernel_turning_busy_or_idle_is_reported_at_once(app, service):
    """With a 10-minute interval, nothing on the clock before the test ends: both reports come from the
    kernel's state changes."""
    kid, client = await computing_kernel(app)
    try:
        await service.wait_report(lambda b: b["busy_kernels"] == 1, timeout=15)
        n = len(service.reports())
        await app.kernel_manager.interrupt_kernel(kid)
        await service.wait_report(lambda b: b["busy_kernels"] == 0, after=n, timeout=15)
    finally:
        client.stop_channels()
    assert len(service.reports()) <= 4  # a report per change (gap of 2 s), not one per kernel message


async def test_stopping_the_server_stops_the_reports(app, service):
    reporter = extension(app).activity
    await service.wait_report(lambda b: True)
    await asyncio.wait_for(app.extension_manager.stop_all_extensions(), WAIT)  # what the server's stop runs
    assert not reporter.running
    n = len(service.reports())
    await asyncio.sleep(2.5)  # more than two intervals
    assert len(service.reports()) == n


@env(LABFLEET_SESSION_TYPE="batch", LABFLEET_COMMAND="sleep 30")
async def test_batch_sessions_do_not_report(app, service):
    assert extension(app).runner is not None and extension(app).activity is None


@pytest.mark.parametrize(
    "session_env", [{"LABFLEET_SESSION_ID": None}, {"LABFLEET_SERVICE_URL": None}], indirect=True
)
async def test_no_reports_without_a_labfleet_session(app, service):
    assert extension(app).activity is None


# -- the reporter alone: what it logs, never raising -------------------------------------------------------


class _Kernel:
    def __init__(self, state: str) -> None:
        self.execution_state = state


class _Kernels:
    """A kernel manager as the reporter reads one (no traits: nothing to watch)."""

    def __init__(self, *states: str) -> None:
        self.kernels = {str(i): _Kernel(s) for i, s in enumerate(states)}

    def list_kernel_ids(self) -> list[str]:
        return list(self.kernels)

    def get_kernel(self, kid: str) -> _Kernel:
        return self.kernels[kid]


def test_busy_kernels_counts_busy_only():
    assert busy_kernels(_Kernels("busy", "idle", "busy", "starting")) == 2
    assert busy_kernels(_Kernels()) == 0 and busy_kernels(None) == 0


async def test_a_service_that_does_not_take_reports_is_logged_once(service, caplog):
    log = logging.getLogger("test.activity.reporter")
    naive = datetime(2026, 11, 21, 10, 0, 0)  # jupyter-server's utcnow() may be naive: UTC
    reporter = ActivityReporter(
        SessionCalls(service.url, "", TOKEN, "alice", timeout=5),
        SID,
        last_activity=lambda: naive,
        kernel_manager=_Kernels("busy", "idle"),
        interval=1,
        log=log,
    )
    path = ("POST", f"/sessions/{SID}/activity")

    def logged(level: int) -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == log.name and r.levelno == level]

    with caplog.at_level(logging.DEBUG, logger="test.activity.reporter"):
        service.replies[path] = (503, {"message": "down for maintenance"})
        assert [await reporter.report() for _ in range(3)] == [False] * 3
        warnings = logged(logging.WARNING)
        assert len(warnings) == 1 and "down for maintenance" in warnings[0].getMessage()

        service.replies[path] = (409, {"message": f"session {SID} is PREPARING, not RUNNING"})
        assert not await reporter.report() and not await reporter.report()
        infos = logged(logging.INFO)
        assert len(infos) == 1 and "not RUNNING" in infos[0].getMessage()

        service.replies[path] = (200, {"session": SID, "reported_at": "now"})
        assert await reporter.report() and await reporter.report()
        infos = logged(logging.INFO)
        assert len(infos) == 2 and "again" in infos[1].getMessage()
        assert reporter.reports == 2

    assert service.reports()[-1] == {"busy_kernels": 1, "last_activity": "2026-11-21T10:00:00Z"}

    # A service that cannot be reached at all (nothing listens there): False, no exception.
    gone = ActivityReporter(
        SessionCalls("http://127.0.0.1:9/api", "", TOKEN, "alice", timeout=2),
        SID,
        last_activity=lambda: None,
        kernel_manager=None,
        interval=1,
        log=log,
    )
    assert not await gone.report()

    # Nor when reading the server's activity fails.
    def broken() -> datetime:
        raise RuntimeError("no web app")

    reporter.last_activity = broken
    with caplog.at_level(logging.WARNING, logger="test.activity.reporter"):
        assert not await reporter.report()
    assert "no web app" in caplog.text


# -- labfleet/session's idle object, labfleet/session/still-here -------------------------------------------


def test_session_summary_passes_the_idle_object_through():
    env = SessionEnv.from_environ({"LABFLEET_SESSION_ID": SID})
    now = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)
    kw = {"now": now, "user": "alice", "server_name": "work", "base_url": "/user/alice/work/"}
    running = {"id": SID, "status": "RUNNING", "idle": IDLE}
    assert fleet.session_summary(env, running, **kw)["idle"] == IDLE
    assert fleet.session_summary(env, {"id": SID, "status": "PENDING"}, **kw)["idle"] is None
    assert fleet.session_summary(env, None, **kw)["idle"] is None
    assert fleet.session_summary(env, {"id": SID, "idle": "soon"}, **kw)["idle"] is None  # not an object


async def test_session_endpoint_answers_the_services_idle_object(jp_fetch, service):
    started = (datetime.now(timezone.utc) - timedelta(minutes=5)).isoformat()
    view = {"id": SID, "status": "RUNNING", "type": "interactive", "started_at": started, "idle": IDLE}
    service.replies[("GET", f"/sessions/{SID}")] = (200, view)
    s = json.loads((await jp_fetch("labfleet", "session")).body)
    assert s["idle"] == IDLE and s["service"] == "ok" and s["status"] == "RUNNING"


async def test_still_here_passes_through(jp_fetch, service):
    path = ("POST", f"/sessions/{SID}/still-here")
    reset = dict(IDLE, idle_for=0.0, reason=None)
    service.replies[path] = (200, reset)
    r = await jp_fetch("labfleet", "session", "still-here", method="POST", body=b"")
    assert r.code == 200 and json.loads(r.body) == reset
    (call,) = [q for q in service.requests if q["path"].endswith("/still-here")]
    assert call["method"] == "POST" and call["auth"] == f"token {TOKEN}"

    # The service's refusal, its status and words passed on.
    service.replies[path] = (409, {"message": f"session {SID} is TERMINATED, not RUNNING"})
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("labfleet", "session", "still-here", method="POST", body=b"")
    assert e.value.code == 409
    assert "not RUNNING" in json.loads(e.value.response.body)["message"]


async def test_still_here_refusals(jp_fetch, service, http_server_client, jp_base_url):
    # No credentials at all: refused by the server before any call to the service.
    r = await http_server_client.fetch(
        f"{jp_base_url}labfleet/session/still-here", method="POST", body=b"", raise_error=False
    )
    assert r.code == 403
    # Only POST.
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("labfleet", "session", "still-here")
    assert e.value.code == 405
    assert not [q for q in service.requests if q["path"].endswith("/still-here")]


@env(LABFLEET_SERVICE_URL="http://127.0.0.1:9/api")
async def test_still_here_when_the_service_is_unreachable(jp_fetch):
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("labfleet", "session", "still-here", method="POST", body=b"")
    assert (
        e.value.code == 502 and "cannot reset the idle timer" in json.loads(e.value.response.body)["message"]
    )


@env(LABFLEET_SESSION_ID=None)
async def test_still_here_outside_a_labfleet_session(jp_fetch, service):
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("labfleet", "session", "still-here", method="POST", body=b"")
    assert e.value.code == 409 and "labfleet spawner" in json.loads(e.value.response.body)["message"]
    assert not service.requests


async def test_reading_labfleet_endpoints_is_not_activity(jp_fetch, jp_serverapp, service):
    """The sidebar polls labfleet/...: that must not reset the idle countdown it shows; using the server
    (here the contents API) and saying "still here" do count."""
    settings = jp_serverapp.web_app.settings
    long_ago = datetime(2020, 1, 1, tzinfo=timezone.utc)
    service.replies[("GET", f"/sessions/{SID}")] = (200, {"id": SID, "status": "RUNNING", "idle": IDLE})
    service.replies[("POST", f"/sessions/{SID}/still-here")] = (200, IDLE)
    for parts in (("labfleet", "session"), ("labfleet", "runner"), ("labfleet", "apps")):
        settings["api_last_activity"] = long_ago
        await jp_fetch(*parts)
        assert settings["api_last_activity"] == long_ago, parts
    await jp_fetch("labfleet", "session", "still-here", method="POST", body=b"")
    assert settings["api_last_activity"] > long_ago
    settings["api_last_activity"] = long_ago
    await jp_fetch("api", "contents")
    assert settings["api_last_activity"] > long_ago
