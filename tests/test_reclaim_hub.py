"""Idle reclamation through a real Hub: real local sessions, the service's reclaimer on a 1-second
clock, the sessions' own activity reports, and the trusted samples.

- a session nobody touches is stopped within its timeout plus two intervals, its reason recorded
  in its status and audited, the reclaimed-sessions metric counting it;
- a session whose kernel computes with no client connected is kept;
- the utilization checker reclaims a session that only sleeps and keeps one burning CPU;
- the ``idle`` object counts down and "I'm still here" resets it, from the service and from inside
  the session (``labfleet/session``);
- contention only: an idle session is kept while nobody waits, reclaimed once a queued session
  needs its GPUs;
- bad checker definitions answer 400.

Each test binds its checker to a project of its own, so their rules do not meet.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from datetime import datetime, timezone

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from tests.hubfixture import start_hub

pytestmark = pytest.mark.hub
INTERVAL = 1.0
PROJECTS = ("idle", "busy", "util", "wait", "share")


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    state = tmp_path_factory.mktemp("reclaimhub")
    (state / "labfleet_service_config.py").write_text("c.LabfleetService.reconcile_grace = 3600\n")
    h = start_hub(
        state,
        env={
            "LABFLEET_IDLE_CHECK_INTERVAL": str(INTERVAL),
            "LABFLEET_ACTIVITY_INTERVAL": str(INTERVAL),
            "LABFLEET_SAMPLE_INTERVAL": str(INTERVAL),
        },
        extra_config="c.LabfleetSpawnerMixin.queue_poll_interval = 0.3\n",
    )
    try:
        root = h.wait_token("root")
        for path, body in [
            ("/domains", {"name": "acme"}),
            *(("/projects", {"domain": "acme", "name": p}) for p in PROJECTS),
            ("/users", {"username": "alice", "domain": "acme", "projects": list(PROJECTS)}),
        ]:
            r = h.api("POST", path, root, json=body)
            assert r.status_code == 201, r.text
        h.tokens = {"root": root, "alice": h.wait_token("alice")}
        # The service pushes alice's project groups to the Hub in the background; a spawn's own auth
        # refresh writing the same memberships at that moment can collide in the Hub's DB (a 500).
        wanted = {"domain:acme", *(f"project:acme/{p}" for p in PROJECTS)}
        deadline = time.monotonic() + 30
        while set(h.hub_api("GET", "/users/alice").json().get("groups", [])) != wanted:
            assert time.monotonic() < deadline, h.hub_api("GET", "/users/alice").json()
            time.sleep(0.3)
        yield h
    finally:
        for p in PROJECTS:
            h.hub_api("DELETE", f"/users/alice/servers/{p}")
            h.hub_api("DELETE", f"/users/alice/servers/{p}2")
        h.stop()


def _checker(hub, name, project, kind, **options):
    body = {
        "name": name,
        "kind": kind,
        "options": options,
        "bindings": [{"scope": "project", "name": f"acme/{project}"}],
    }
    r = hub.api("POST", "/idle-checkers", hub.tokens["root"], json=body)
    assert r.status_code == 201, r.text


def _spawn_ready(hub, server, options, timeout=90):
    r = hub.hub_api("POST", f"/users/alice/servers/{server}", json=options)
    if r.status_code not in (201, 202):
        # The Hub's traceback, whole: an assertion message would be cut short
        print(hub.log_text()[-12000:], file=sys.stderr)
    assert r.status_code in (201, 202), r.text
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        model = hub.hub_api("GET", "/users/alice").json()["servers"].get(server)
        if model and model.get("ready"):
            return _session(hub, server)
        time.sleep(0.3)
    raise AssertionError(f"{server} never became ready\n{hub.log_text()[-3000:]}")


def _session(hub, server) -> dict:
    rows = [s for s in hub.api("GET", "/sessions", hub.tokens["root"]).json() if s["name"] == server]
    return rows[-1]


def _detail(hub, sid) -> dict:
    r = hub.api("GET", f"/sessions/{sid}", hub.tokens["alice"])
    assert r.status_code == 200, r.text
    return r.json()


def _wait_gone(hub, server, timeout) -> float:
    """Seconds until the Hub no longer has the server (AssertionError after ``timeout``)."""
    start = time.monotonic()
    while hub.hub_api("GET", "/users/alice").json()["servers"].get(server):
        assert time.monotonic() - start < timeout, f"{server} was not reclaimed\n{hub.log_text()[-3000:]}"
        time.sleep(0.3)
    return time.monotonic() - start


def _running_since(detail) -> datetime:
    return datetime.fromisoformat(next(h["at"] for h in detail["status_history"] if h["status"] == "RUNNING"))


def _kernels(hub, server, method, kernel=""):
    """POST: start a kernel in alice's server (its id); GET: the first kernel's id; DELETE: stop ``kernel``."""
    url = f"{hub.url}/user/alice/{server}/api/kernels" + (f"/{kernel}" if kernel else "")
    r = requests.request(
        method,
        url,
        headers={"Authorization": f"token {hub.tokens['alice']}"},
        json={"name": "python3"},
        timeout=30,
    )
    assert r.status_code in (200, 201, 204), r.text
    return r.json()["id"] if method == "POST" else r.json()[0]["id"] if method == "GET" else ""


async def _busy_kernel(hub, server) -> str:
    """Start a kernel in alice's server, make it compute forever, and hang up: nobody is connected."""
    token = hub.tokens["alice"]
    base = f"/user/alice/{server}/api/kernels"
    kid = await asyncio.to_thread(_kernels, hub, server, "POST")
    url = hub.url.replace("http", "ws", 1) + f"{base}/{kid}/channels"
    conn = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {token}"}))
    msg_id = uuid.uuid4().hex
    header = {
        "msg_id": msg_id,
        "username": "alice",
        "session": uuid.uuid4().hex,
        "msg_type": "execute_request",
        "version": "5.3",
        "date": datetime.now(timezone.utc).isoformat(),
    }
    content = {
        "code": "while True: pass",
        "silent": False,
        "store_history": False,
        "user_expressions": {},
        "allow_stdin": False,
    }
    await conn.write_message(
        json.dumps(
            {
                "header": header,
                "parent_header": {},
                "metadata": {},
                "content": content,
                "channel": "shell",
                "buffers": [],
            }
        )
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until the kernel says it is busy with our request
        raw = await asyncio.wait_for(conn.read_message(), 30)
        assert raw is not None, "the kernel's websocket closed"
        msg = json.loads(raw) if isinstance(raw, str) else {}
        if (
            msg.get("msg_type") == "status"
            and msg.get("parent_header", {}).get("msg_id") == msg_id
            and msg.get("content", {}).get("execution_state") == "busy"
        ):
            break
    conn.close()
    return kid


def test_a_session_nobody_touches_is_reclaimed_with_its_reason(hub):
    timeout = 6
    _checker(hub, "idle-6s", "idle", "activity", timeout=timeout)
    session = _spawn_ready(hub, "idle", {"project": "idle", "cpu": 1})
    ready = datetime.now(timezone.utc)
    running = _running_since(_detail(hub, session["id"]))
    _wait_gone(hub, "idle", timeout + 60)
    ended = _detail(hub, session["id"])
    stopped = datetime.fromisoformat(ended["status_history"][-1]["at"])
    # Not before the timeout, and within the timeout plus two intervals of its last activity: its
    # server's start, which it reports once it answers (seconds after RUNNING on a loaded machine)
    assert (stopped - running).total_seconds() >= timeout, ended["status_history"]
    assert (stopped - ready).total_seconds() <= timeout + 2 * INTERVAL + 3, ended["status_history"]
    assert ended["status"] == "TERMINATED" and ended["status_reason"].startswith(
        "idle-timeout: no activity for "
    )
    assert "(checker idle-6s)" in ended["status_reason"]
    audit = hub.api("GET", "/audit", hub.tokens["root"], params={"limit": 1000}).json()
    entry = next(a for a in audit if a["action"] == "session.reclaim" and a["target"] == session["id"])
    assert entry["details"]["reason"] == "idle-timeout" and entry["details"]["checker"] == "idle-6s"
    text = requests.get(
        f"{hub.url}/services/labfleet/metrics",
        headers={"Authorization": f"token {hub.tokens['root']}"},
        timeout=30,
    ).text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    (count,) = [
        s.value
        for s in fams["labfleet_sessions_reclaimed"].samples
        if s.name == "labfleet_sessions_reclaimed_total" and s.labels == {"reason": "idle-timeout"}
    ]
    assert count >= 1


async def test_a_kernel_computing_with_nobody_connected_is_kept(hub):
    timeout = 5
    _checker(hub, "busy-5s", "busy", "activity", timeout=timeout)
    session = _spawn_ready(hub, "busy", {"project": "busy", "cpu": 1})
    await _busy_kernel(hub, "busy")
    await asyncio.sleep(timeout + 4 * INTERVAL + 3)
    detail = _detail(hub, session["id"])
    assert detail["status"] == "RUNNING", detail["status_reason"]
    assert (
        detail["idle"]["idle_for"] < 2 * INTERVAL + 1 and detail["idle"]["reason"] == "a kernel is computing"
    )
    # Once the kernel stops computing, the clock runs again and the session goes
    kid = await asyncio.to_thread(_kernels, hub, "busy", "GET")
    await asyncio.to_thread(_kernels, hub, "busy", "DELETE", kid)
    _wait_gone(hub, "busy", timeout + 30)
    assert _detail(hub, session["id"])["status_reason"].startswith("idle-timeout")


async def test_utilization_reclaims_the_sleeper_and_keeps_the_burner(hub):
    window = 4
    burner = _spawn_ready(hub, "util2", {"project": "util", "cpu": 1})
    await _busy_kernel(hub, "util2")  # about a whole core: 100 % of what it was given
    # The checker comes once the burner has burned for a whole window: a kernel that takes longer
    # to start than the window (a loaded machine) would otherwise be judged on its quiet start.
    await asyncio.sleep(window + 2 * INTERVAL)
    _checker(hub, "cpu-under-20", "util", "utilization", window=window, grace=3, thresholds={"cpu_util": 20})
    sleeper = _spawn_ready(hub, "util", {"project": "util", "cpu": 1})
    _wait_gone(hub, "util", 60)
    assert _detail(hub, sleeper["id"])["status_reason"].startswith(
        "idle-utilization: over the last 4 s: cpu_util "
    )
    await asyncio.sleep(6 * INTERVAL)
    detail = _detail(hub, burner["id"])
    assert detail["status"] == "RUNNING", detail["status_reason"]
    hub.hub_api("DELETE", "/users/alice/servers/util2")


def test_the_idle_object_counts_down_and_still_here_resets_it(hub):
    _checker(hub, "wait-120s", "wait", "activity", timeout=120)
    session = _spawn_ready(hub, "wait", {"project": "wait", "cpu": 0.5})
    sid = session["id"]
    # Its first activity report (the Hub's own requests while it started) may move the idle clock
    # once: read after it.
    time.sleep(3 * INTERVAL)
    first = _detail(hub, sid)["idle"]
    time.sleep(3)
    second = _detail(hub, sid)["idle"]
    assert second["checker"] == "wait-120s" and second["timeout"] == 120
    assert second["idle_for"] >= first["idle_for"] + 2 and second["reclaim_at"] == first["reclaim_at"]
    # From inside the session, as the sidebar reads it
    inside = requests.get(
        f"{hub.url}/user/alice/wait/labfleet/session",
        headers={"Authorization": f"token {hub.tokens['alice']}"},
        timeout=30,
    )
    assert inside.status_code == 200 and inside.json()["idle"]["checker"] == "wait-120s", inside.text
    r = hub.api("POST", f"/sessions/{sid}/still-here", hub.tokens["alice"])
    assert r.status_code == 200, r.text
    after = r.json()
    assert after["idle_for"] < 1.5 and after["reclaim_at"] > second["reclaim_at"]
    # Only its owner says so
    assert hub.api("POST", f"/sessions/{sid}/still-here", hub.tokens["root"]).status_code == 403
    audit = hub.api("GET", "/audit", hub.tokens["root"], params={"limit": 1000}).json()
    assert any(a["action"] == "session.still-here" and a["target"] == sid for a in audit)
    hub.hub_api("DELETE", "/users/alice/servers/wait")


def test_contention_only_reclaims_once_a_queued_session_needs_the_gpus(hub):
    _checker(hub, "share-gpus", "share", "activity", timeout=2, only_when_queue_waiting=True)
    holder = _spawn_ready(hub, "share", {"project": "share", "gpu": 2})  # both mock GPUs
    time.sleep(2 + 3 * INTERVAL)
    assert _detail(hub, holder["id"])["status"] == "RUNNING"  # idle, but nobody waits
    preview = hub.api("GET", "/idle-checkers/preview", hub.tokens["root"]).json()["sessions"]
    assert {(p["session"], p["would_reclaim"]) for p in preview} >= {(holder["id"], False)}
    r = hub.api(
        "POST",
        "/sessions",
        hub.service_token,
        json={"username": "alice", "project": "acme/share", "slots": {"gpu": 1}},
    )
    assert r.status_code == 201 and r.json()["status"] == "PENDING", r.text
    waiting = r.json()["id"]
    _wait_gone(hub, "share", 30)
    assert _detail(hub, holder["id"])["status_reason"].startswith("idle-timeout")
    deadline = time.monotonic() + 20
    while hub.api("GET", f"/sessions/{waiting}", hub.tokens["root"]).json()["status"] == "PENDING":
        assert time.monotonic() < deadline, "the waiting session did not start on the freed GPU"
        time.sleep(0.3)
    hub.api("DELETE", f"/sessions/{waiting}", hub.tokens["root"])


@pytest.mark.parametrize(
    "body, message",
    [
        ({"name": "b1", "kind": "sleepy", "options": {}}, "kind must be one of"),
        (
            {"name": "b2", "kind": "utilization", "options": {"window": -5, "thresholds": {"cpu_util": 5}}},
            "window must be from",
        ),
        (
            {"name": "b3", "kind": "utilization", "options": {"window": 60, "thresholds": {"gpu_util": 150}}},
            "percent from 0 to 100",
        ),
        (
            {
                "name": "b4",
                "kind": "activity",
                "options": {"timeout": 60},
                "bindings": [{"scope": "domain", "name": "nowhere"}],
            },
            "no domain 'nowhere'",
        ),
    ],
)
def test_bad_checker_definitions_answer_400(hub, body, message):
    r = hub.api("POST", "/idle-checkers", hub.tokens["root"], json=body)
    assert r.status_code == 400 and message in r.json()["message"], r.text
    assert hub.api("GET", f"/idle-checkers/{body['name']}", hub.tokens["root"]).status_code == 404
