"""The session's labfleet endpoints (server_ext/ENDPOINTS.md) inside real sessions spawned by the real Hub:
the owner sees this session, its usage, folders, quota and other sessions, starts and stops a session
from inside; another user, even one the server is shared with, is refused; batch and inference sessions
show their command's state and endpoint while they run."""

from __future__ import annotations

import json
import time
from datetime import datetime

import pytest
import requests

from tests.hubfixture import start_hub

pytestmark = pytest.mark.hub

GiB = 2**30
ENDPOINTS = ("session", "usage", "vfolders", "quota", "sessions", "api/me")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state = tmp_path_factory.mktemp("sessext")
    usage_file = state / "homes" / "alice" / "mock-gpu-usage.json"
    extra = (
        # The test's admin may share servers (JupyterHub's sharing): alice's server with bob.
        "c.JupyterHub.load_roles.append({'name': 'sharer', 'scopes': ['shares'], 'services': ['test-admin']})\n"
        f"c.Spawner.environment = {{'LABFLEET_MOCK_GPU_USAGE': {str(usage_file)!r}}}\n"
        "c.LabfleetSpawnerMixin.queue_poll_interval = 0.3\n"
    )
    # The service checks lifetimes every second here (60 s by default).
    hub = start_hub(state, extra_config=extra, env={"LABFLEET_LIFETIME_CHECK_INTERVAL": "1"})
    root = hub.wait_token("root")
    for method, path, body in [
        ("POST", "/domains", {"name": "acme", "total_resource_slots": {"gpu.shares": 4}}),
        ("POST", "/projects", {"domain": "acme", "name": "ml", "total_resource_slots": {"gpu.shares": 2}}),
        ("POST", "/users", {"username": "alice", "domain": "acme", "projects": ["ml"]}),
        ("POST", "/users", {"username": "bob", "domain": "acme", "projects": ["ml"]}),
    ]:
        r = hub.api(method, path, root, json=body)
        assert r.status_code == 201, (path, r.text)
    r = hub.api("PATCH", "/policies/keypair/default", root, json={"max_session_lifetime": 86400})
    assert r.status_code == 200, r.text
    tokens = {name: hub.wait_token(name) for name in ("alice", "bob")}
    yield hub, state, tokens, usage_file
    for server in ("work", "second", "job", "infer", "brief"):
        hub.hub_api("DELETE", f"/users/alice/servers/{server}")
    hub.stop()


def _get(hub, token, server, path, method="GET", **kw):
    return requests.request(
        method,
        f"{hub.url}/user/alice/{server}/labfleet/{path}",
        headers={"Authorization": f"token {token}"},
        timeout=30,
        allow_redirects=False,
        **kw,
    )


def _spawn_ready(hub, server, options, timeout=60):
    r = hub.hub_api("POST", f"/users/alice/servers/{server}", json=options)
    assert r.status_code in (201, 202), r.text
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        model = hub.hub_api("GET", "/users/alice").json()["servers"].get(server)
        if model and model.get("ready"):
            return model
        time.sleep(0.3)
    raise AssertionError(f"{server} never became ready\n{hub.log_text()[-3000:]}")


@pytest.fixture(scope="module")
def work(env):
    """alice's session `work`: half a mock GPU, her folder `data` mounted."""
    hub, state, tokens, usage_file = env
    r = hub.api("POST", "/vfolders", tokens["alice"], json={"name": "data"})
    assert r.status_code == 201, r.text
    folder = r.json()
    put = hub.api("PUT", f"/vfolders/{folder['id']}/files/hello.txt", tokens["alice"], data=b"x" * 1000)
    assert put.status_code == 201, put.text
    _spawn_ready(hub, "work", {"project": "ml", "gpu": 0.5, "cpu": 1, "mem": "2g", "vfolders": ["data"]})
    # Shared with bob: he may reach the server; the labfleet endpoints must still refuse him.
    shared = hub.hub_api("POST", "/shares/alice/work", json={"user": "bob"})
    assert shared.status_code == 200, shared.text
    return folder


def test_session_shows_project_resources_device_and_time_left(env, work):
    hub, state, tokens, _ = env
    r = _get(hub, tokens["alice"], "work", "session")
    assert r.status_code == 200, r.text
    s = r.json()
    assert s["service"] == "ok", s
    assert (s["user"], s["name"], s["project"], s["domain"], s["type"]) == (
        "alice",
        "work",
        "acme/ml",
        "acme",
        "interactive",
    )
    assert s["status"] == "RUNNING" and s["id"]
    assert s["slots"]["gpu.shares"] == 0.5 and s["slots"]["cpu"] == 1 and s["slots"]["mem"] == 2 * GiB
    (device,) = s["devices"]
    assert device["shares"] == 0.5 and device["model"] == "A100-80GB" and device["memory"] == 80 * GiB
    assert s["max_lifetime"] == 86400
    assert 86400 - 120 < s["time_left"] <= 86400 and 0 <= s["uptime"] < 120
    assert s["urls"]["lab"] == "/user/alice/work/lab"
    assert [m["name"] for m in s["mounts"]] == ["data"]
    assert s["runner"] is None and s["inference"] is None
    # The service's own view of the session agrees (same id, same device).
    view = hub.api("GET", f"/sessions/{s['id']}", tokens["alice"]).json()
    assert view["devices"][0]["uuid"] == device["uuid"]


def test_usage_of_the_sessions_processes_and_its_mock_gpu(env, work):
    hub, state, tokens, usage_file = env
    first = _get(hub, tokens["alice"], "work", "usage").json()
    assert first["memory"]["limit"] == 2 * GiB and first["cpu"]["limit"] == 1.0
    # The server and its children: a JupyterLab server uses tens of MB at least.
    assert first["memory"]["used"] > 20 * 2**20
    (gpu,) = first["gpus"]
    assert gpu["source"] == "mock" and gpu["shares"] == 0.5
    assert gpu["memory_total"] == 80 * GiB and gpu["memory_limit"] == 40 * GiB
    assert gpu["utilization"] == 0 and gpu["memory_used"] == 0  # an idle mock device
    # What the device plugin reports reaches the endpoint: the mock reads its readings file.
    usage_file.write_text(json.dumps({gpu["uuid"]: {"gpu_util": 55, "mem_used": 3 * GiB, "processes": []}}))
    now = _get(hub, tokens["alice"], "work", "usage").json()["gpus"][0]
    # The local sandbox has its own PID namespace: the driver's pids cannot be matched to the session's,
    # so a shared device shows the device's numbers and says so.
    assert (now["utilization"], now["memory_used"], now["scope"]) == (55, 3 * GiB, "device")


def test_vfolders_mounted_with_permission_and_usage(env, work):
    hub, state, tokens, _ = env
    (folder,) = _get(hub, tokens["alice"], "work", "vfolders").json()
    assert folder["id"] == work["id"] and folder["name"] == "data"
    assert folder["permission"] == "wd" and folder["path"] == "vfolders/data"
    assert folder["usage_bytes"] == 1000 and folder["owner"] == "user:alice"
    # The path is where the Lab's file browser finds it.
    listing = requests.get(
        f"{hub.url}/user/alice/work/api/contents/{folder['path']}",
        headers={"Authorization": f"token {tokens['alice']}"},
        timeout=30,
    ).json()
    assert [c["name"] for c in listing["content"]] == ["hello.txt"]


def test_quota_for_me_my_project_and_my_domain(env, work):
    hub, state, tokens, _ = env
    q = _get(hub, tokens["alice"], "work", "quota").json()
    assert q["project_name"] == "acme/ml" and q["domain_name"] == "acme"
    assert q["project"]["used"]["gpu.shares"] == 0.5 and q["project"]["left"]["gpu.shares"] == 1.5
    assert q["domain"]["left"]["gpu.shares"] == 3.5
    assert q["keypair"]["unspecified"] == "UNLIMITED"


def test_start_and_stop_another_session_from_inside(env, work):
    hub, state, tokens, _ = env
    alice = tokens["alice"]
    mine = _get(hub, alice, "work", "sessions").json()
    assert [(s["name"], s["status"], s["current"]) for s in mine] == [("work", "RUNNING", True)]
    assert mine[0]["url"] == "/user/alice/work/lab"
    # Refused options come back with the spawner's reason, and nothing starts.
    bad = _get(hub, alice, "work", "sessions/second", "POST", json={"project": "ml", "gpu": "lots"})
    assert bad.status_code == 400 and "gpu" in bad.json()["message"], bad.text
    too_much = _get(hub, alice, "work", "sessions/second", "POST", json={"project": "ml", "gpu": 1.75})
    assert too_much.status_code >= 400 and "gpu" in too_much.json()["message"], too_much.text
    assert _get(hub, alice, "work", "sessions/no%20spaces", "POST", json={}).status_code == 400
    assert [s["name"] for s in _get(hub, alice, "work", "sessions").json()] == ["work"]

    r = _get(hub, alice, "work", "sessions/second", "POST", json={"project": "ml", "gpu": 0.25})
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 60
    while True:
        rows = {s["name"]: s for s in _get(hub, alice, "work", "sessions").json()}
        if rows.get("second", {}).get("status") == "RUNNING":
            break
        assert time.monotonic() < deadline, rows
        time.sleep(0.5)
    assert rows["second"]["current"] is False and rows["second"]["slots"]["gpu.shares"] == 0.25
    assert _get(hub, alice, "work", "quota").json()["project"]["used"]["gpu.shares"] == 0.75
    assert _get(hub, alice, "work", "sessions/second", "DELETE").status_code == 202
    deadline = time.monotonic() + 60
    while "second" in {s["name"] for s in _get(hub, alice, "work", "sessions").json()}:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert _get(hub, alice, "work", "quota").json()["project"]["used"]["gpu.shares"] == 0.5


def test_service_api_through_the_session_as_the_owner(env, work):
    hub, state, tokens, _ = env
    me = _get(hub, tokens["alice"], "work", "api/me")
    assert me.status_code == 200 and me.json()["username"] == "alice"
    made = _get(hub, tokens["alice"], "work", "api/vfolders", "POST", json={"name": "made-inside"})
    assert made.status_code == 201, made.text
    names = {f["name"] for f in _get(hub, tokens["alice"], "work", "api/vfolders").json()}
    assert {"data", "made-inside"} <= names
    # Files come back as they are (bytes, not JSON).
    got = _get(hub, tokens["alice"], "work", f"api/vfolders/{work['id']}/files/hello.txt")
    assert got.status_code == 200 and got.content == b"x" * 1000
    # The service's refusals pass through with its status and words.
    missing = _get(hub, tokens["alice"], "work", "api/vfolders/no-such-folder")
    assert missing.status_code == 404 and missing.json()["message"]
    # A path that climbs out of the API (sent encoded, so no client tidies it up) is refused.
    climb = _get(hub, tokens["alice"], "work", "api/vfolders/%2e%2e/%2e%2e/hub/api/user")
    assert climb.status_code in (400, 404) and '"kind"' not in climb.text, climb.text[:300]


@pytest.mark.parametrize("path", ENDPOINTS)
def test_another_user_is_refused_even_with_access_to_the_server(env, work, path):
    hub, state, tokens, _ = env
    bob = tokens["bob"]
    # bob may reach the server (it is shared with him) ...
    status = requests.get(
        f"{hub.url}/user/alice/work/api/status", headers={"Authorization": f"token {bob}"}, timeout=30
    )
    assert status.status_code == 200
    # ... but not alice's labfleet data through it.
    r = _get(hub, bob, "work", path)
    assert r.status_code == 403, (path, r.status_code, r.text[:200])
    assert "alice" not in r.text.replace("/user/alice/", "")
    # Nobody without access reaches it at all; without a token the Hub asks for a login.
    assert _get(hub, "not-a-token", "work", path).status_code in (302, 403)
    assert requests.get(
        f"{hub.url}/user/alice/work/labfleet/{path}", timeout=30, allow_redirects=False
    ).status_code in (302, 403)
    assert _get(hub, bob, "work", "sessions/work", "DELETE").status_code == 403


def test_batch_output_and_state_while_it_runs(env):
    hub, state, tokens, _ = env
    home = state / "homes" / "alice"
    (home / "go").unlink(missing_ok=True)
    command = "echo first-line; while [ ! -f go ]; do sleep 0.2; done; echo last-line; exit 4"
    _spawn_ready(hub, "job", {"project": "ml", "type": "batch", "command": command})
    deadline = time.monotonic() + 30
    while True:
        s = _get(hub, tokens["alice"], "job", "session").json()
        if "first-line" in (s["runner"] or {}).get("output_tail", ""):
            break
        assert time.monotonic() < deadline, s
        time.sleep(0.3)
    assert s["type"] == "batch" and s["runner"]["state"] == "running" and s["runner"]["exit_code"] is None
    assert s["runner"]["command"] == command and s["status"] == "RUNNING"
    (home / "go").write_text("")
    deadline = time.monotonic() + 30
    last = s
    while True:
        r = _get(hub, tokens["alice"], "job", "session")
        if r.status_code != 200:
            break  # the server has stopped with the command
        last = r.json()
        if last["runner"]["state"] != "running":
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    if last["runner"]["state"] != "running":
        assert last["runner"]["exit_code"] == 4 and "last-line" in last["runner"]["output_tail"]
    # Whether or not the final state was caught before the server exited, the service has it.
    deadline = time.monotonic() + 60
    while True:
        (view,) = [v for v in hub.api("GET", "/sessions", tokens["alice"]).json() if v["name"] == "job"]
        if view["status"] == "TERMINATED":
            break
        assert time.monotonic() < deadline, view
        time.sleep(0.3)
    assert view["exit_code"] == 4


def test_inference_endpoint_and_how_to_call_it(env):
    hub, state, tokens, _ = env
    home = state / "homes" / "alice"
    home.mkdir(parents=True, exist_ok=True)
    (home / "answer.txt").write_text("42\n")
    command = "python3 -m http.server {port} --bind 127.0.0.1 --directory ."
    _spawn_ready(hub, "infer", {"project": "ml", "type": "inference", "command": command})
    deadline = time.monotonic() + 30
    while True:
        s = _get(hub, tokens["alice"], "infer", "session").json()
        if s["inference"]["ready"]:
            break
        assert time.monotonic() < deadline, s
        time.sleep(0.3)
    assert s["type"] == "inference" and s["runner"]["state"] == "running"
    assert s["inference"]["url"] == "/user/alice/infer/labfleet/inference/"
    assert s["inference"]["url"] in s["inference"]["example"]
    # The endpoint it names answers, through the Hub's proxy.
    r = requests.get(
        hub.url + s["inference"]["url"] + "answer.txt",
        headers={"Authorization": f"token {tokens['alice']}"},
        timeout=30,
    )
    assert r.status_code == 200 and r.text == "42\n"
    assert hub.hub_api("DELETE", "/users/alice/servers/infer").status_code in (202, 204)


def test_a_session_past_its_max_lifetime_is_stopped(env):
    hub, state, tokens, _ = env
    root = hub.wait_token("root")
    r = hub.api("POST", "/policies/keypair", root, json={"name": "brief", "max_session_lifetime": 10})
    assert r.status_code == 201, r.text
    key = hub.api("GET", "/me", tokens["bob"]).json()["main_access_key"]
    assert hub.api("PATCH", f"/keypairs/{key}", root, json={"resource_policy": "brief"}).status_code == 200
    r = hub.hub_api("POST", "/users/bob/servers/brief", json={"project": "ml"})
    assert r.status_code in (201, 202), r.text
    deadline = time.monotonic() + 60
    while True:
        rows = [v for v in hub.api("GET", "/sessions", tokens["bob"]).json() if v["name"] == "brief"]
        if rows and rows[-1]["status"] in ("TERMINATED", "ERROR"):
            break
        assert time.monotonic() < deadline, rows
        time.sleep(0.3)
    assert rows[-1]["status"] == "TERMINATED"
    ran = next(h for h in rows[-1]["status_history"] if h["status"] == "RUNNING")
    ended = rows[-1]["status_history"][-1]
    started, stopped = (datetime.fromisoformat(x["at"]) for x in (ran, ended))
    assert (stopped - started).total_seconds() >= 10
    audit = hub.api("GET", "/audit", root).json()
    assert any(a["action"] == "session.lifetime" and a["target"] == rows[-1]["id"] for a in audit)
    assert hub.hub_api("GET", "/users/bob").json()["servers"].get("brief", {}).get("ready") is not True
