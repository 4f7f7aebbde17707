"""labfleet.session's labfleet endpoints in-process (pytest-jupyter's ``jp_fetch``), against the real labfleet
service of a real Hub: the server calls the service with alice's Hub token, as a session's server does.

The server's users come from a small IdentityProvider (a token per user), so the owner-only rule can be
checked with a second user; inside a real Hub session the same rule is checked in test_session_ext_hub.py.
"""

from __future__ import annotations

import json
import logging

import pytest
from jupyter_server.auth.identity import IdentityProvider, User
from pytest_jupyter.jupyter_server import *  # noqa: F403  (imported fixtures stay local, see test_server_ext)
from tornado.httpclient import HTTPClientError

from labfleet.session.activity import ActivityReporter
from labfleet.session.calls import SessionCalls
from tests.hubfixture import start_hub

pytestmark = pytest.mark.hub

GiB = 2**30
TOKENS = {"alice-secret": "alice", "bob-secret": "bob"}


class TokenUsers(IdentityProvider):
    """``Authorization: token <t>`` names one of two users; nothing else is logged in."""

    def get_user(self, handler):
        auth = handler.request.headers.get("Authorization", "")
        name = TOKENS.get(auth.removeprefix("token ").strip())
        if not name:
            return None
        handler._token_authenticated = True  # as the server's own token auth: no XSRF check for API calls
        return User(username=name)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """A real Hub and labfleet service; alice holds an admitted session (half a mock GPU, one folder)."""
    hub = start_hub(tmp_path_factory.mktemp("extfleet"))
    root = hub.wait_token("root")
    for path, body in [
        ("/domains", {"name": "acme"}),
        ("/projects", {"domain": "acme", "name": "ml", "total_resource_slots": {"gpu.shares": 2}}),
        ("/users", {"username": "alice", "domain": "acme", "projects": ["ml"]}),
    ]:
        r = hub.api("POST", path, root, json=body)
        assert r.status_code == 201, r.text
    alice = hub.wait_token("alice")
    folder = hub.api("POST", "/vfolders", alice, json={"name": "data"}).json()
    # Admitted as the Hub's spawner does (the service token, for alice): a bare allocation, no server.
    r = hub.api(
        "POST",
        "/sessions",
        hub.service_token,
        json={
            "project": "ml",
            "username": "alice",
            "name": "work",
            "slots": {"gpu.shares": 0.5, "cpu": 1},
            "vfolders": ["data"],
        },
    )
    assert r.status_code == 201, r.text
    yield hub, alice, r.json(), folder
    hub.stop()


@pytest.fixture
async def jp_asyncio_loop():
    import asyncio

    return asyncio.get_running_loop()


@pytest.fixture
def jp_server_config(service, monkeypatch):
    hub, alice, session, _ = service
    for name in ("LABFLEET_SESSION_TYPE", "LABFLEET_COMMAND", "LABFLEET_PID_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LABFLEET_SESSION_ID", session["id"])
    monkeypatch.setenv("LABFLEET_PROJECT", "acme/ml")
    monkeypatch.setenv("LABFLEET_SERVICE_URL", hub.url + "/services/labfleet/api")
    monkeypatch.setenv("JUPYTERHUB_API_URL", hub.url + "/hub/api")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", alice)
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    monkeypatch.setenv("JUPYTERHUB_SERVER_NAME", "work")
    return {
        "ServerApp": {
            "jpserver_extensions": {"labfleet.session": True},
            "identity_provider_class": TokenUsers,
        },
        "LabfleetExtension": {"exit_with_command": False},
    }


async def fetch(jp_fetch, path, user="alice", **kw):
    return await jp_fetch(
        "labfleet", *path.split("/"), headers={"Authorization": f"token {user}-secret"}, **kw
    )


async def test_session_answers_the_services_view(jp_fetch, service):
    hub, alice, session, _ = service
    s = json.loads((await fetch(jp_fetch, "session")).body)
    assert s["id"] == session["id"] and s["service"] == "ok"
    assert (s["project"], s["name"], s["user"]) == ("acme/ml", "work", "alice")
    assert s["devices"][0]["shares"] == 0.5 and s["devices"][0]["model"] == "A100-80GB"


async def test_usage_quota_folders_and_sessions(jp_fetch, service, tmp_path, monkeypatch):
    hub, alice, session, folder = service
    uuid = session["devices"][0]["uuid"]
    # This server shares the test's PID namespace: on a shared device only its own processes count.
    readings = tmp_path / "gpu.json"
    import os

    readings.write_text(
        json.dumps(
            {
                uuid: {
                    "gpu_util": 90,
                    "mem_used": 30 * GiB,
                    "processes": [
                        {"pid": os.getpid(), "mem_used": 2 * GiB, "gpu_util": 20},
                        {"pid": 999999999, "mem_used": 28 * GiB, "gpu_util": 70},
                    ],
                }
            }
        )
    )
    monkeypatch.setenv("LABFLEET_MOCK_GPU_USAGE", str(readings))
    usage = json.loads((await fetch(jp_fetch, "usage")).body)
    (gpu,) = usage["gpus"]
    assert (gpu["utilization"], gpu["memory_used"], gpu["scope"]) == (20, 2 * GiB, "session")
    assert gpu["memory_limit"] == 40 * GiB and usage["memory"]["used"] > 0

    quota = json.loads((await fetch(jp_fetch, "quota")).body)
    assert quota["project"]["used"]["gpu.shares"] == 0.5 and quota["project_name"] == "acme/ml"
    (mounted,) = json.loads((await fetch(jp_fetch, "vfolders")).body)
    assert (mounted["id"], mounted["name"], mounted["permission"]) == (folder["id"], "data", "wd")
    (mine,) = json.loads((await fetch(jp_fetch, "sessions")).body)
    assert mine["id"] == session["id"] and mine["current"] is True


@pytest.mark.parametrize("path", ["session", "usage", "vfolders", "quota", "sessions", "api/me"])
async def test_only_the_owner(jp_fetch, service, path):
    assert (await fetch(jp_fetch, path)).code == 200
    with pytest.raises(HTTPClientError) as e:
        await fetch(jp_fetch, path, user="bob")
    assert e.value.code == 403
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("labfleet", *path.split("/"), headers={"Authorization": "token nobody"})
    assert e.value.code == 403


async def test_bad_input_is_refused_before_any_call(jp_fetch, service):
    for path, body, words in [
        ("sessions/bad name", "{}", "server name"),
        ("sessions/new", "not json", "JSON"),
        ("sessions/new", "[1]", "object"),
    ]:
        with pytest.raises(HTTPClientError) as e:
            await fetch(jp_fetch, path, method="POST", body=body)
        assert e.value.code == 400 and words in json.loads(e.value.response.body)["message"]
    with pytest.raises(HTTPClientError) as e:
        await fetch(jp_fetch, "api/vfolders/../me")
    assert e.value.code == 400


async def test_idle_activity_and_still_here_against_the_service(jp_fetch, jp_serverapp, service):
    """Against the real service: no idle object, no report taken, no "still here" until the session runs;
    then all three. Last in this module: it marks the shared session RUNNING."""
    hub, alice, session, _ = service
    reporter = ActivityReporter(
        SessionCalls.from_environ(timeout=10),
        session["id"],
        last_activity=jp_serverapp.web_app.last_activity,
        kernel_manager=jp_serverapp.kernel_manager,
        interval=60,
        log=logging.getLogger("test.activity"),
    )
    s = json.loads((await fetch(jp_fetch, "session")).body)
    assert s["status"] == "SCHEDULED" and s["idle"] is None
    assert not await reporter.report()  # 409: not RUNNING
    with pytest.raises(HTTPClientError) as e:
        await fetch(jp_fetch, "session/still-here", method="POST", body=b"")
    assert e.value.code == 409 and "not RUNNING" in json.loads(e.value.response.body)["message"]

    # The spawner's report that the server is up (the Hub's service token).
    r = hub.api("PATCH", f"/sessions/{session['id']}", hub.service_token, json={"status": "RUNNING"})
    assert r.status_code == 200, r.text

    assert await reporter.report()  # the report's format is the service's
    s = json.loads((await fetch(jp_fetch, "session")).body)
    assert set(s["idle"]) >= {"idle_for", "timeout", "reclaim_at", "checker", "reason"}
    idle = json.loads((await fetch(jp_fetch, "session/still-here", method="POST", body=b"")).body)
    assert 0 <= idle["idle_for"] < 60 and set(idle) >= {"timeout", "reclaim_at"}
    with pytest.raises(HTTPClientError) as e:
        await fetch(jp_fetch, "session/still-here", user="bob", method="POST", body=b"")
    assert e.value.code == 403
