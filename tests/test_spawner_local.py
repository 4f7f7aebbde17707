"""The labfleet spawner's local backend on a real Hub: spawn through the REST API with
user_options, reach JupyterLab through the proxy, the session RUNNING with its allocation in the
service, refusals with their reasons, the queue, stop, and a Hub restart with sessions running."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
import requests

from labfleet.spawner.homefolders import FOLDERS_ROOT
from tests.hubfixture import SESSION_NETWORK, session_address, spawner_state, start_hub

pytestmark = pytest.mark.hub

RESTARTABLE = "c.JupyterHub.cleanup_servers = False\nc.LabfleetSpawnerMixin.queue_poll_interval = 0.3\n"
# The deployment's own PyTorch allocator setting, which a fractional session's cap merges with.
DEPLOYMENT_ENV = "c.Spawner.environment = {'PYTORCH_CUDA_ALLOC_CONF': 'expandable_segments:True'}\n"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state = tmp_path_factory.mktemp("spawn")
    hub = start_hub(state, extra_config=RESTARTABLE + DEPLOYMENT_ENV)
    root = hub.wait_token("root")
    for method, path, body in [
        ("POST", "/domains", {"name": "acme"}),
        ("POST", "/projects", {"domain": "acme", "name": "ml", "total_resource_slots": {"gpu.shares": 2}}),
        ("POST", "/projects", {"domain": "acme", "name": "web"}),
        (
            "POST",
            "/users",
            {
                "username": "alice",
                "domain": "acme",
                "projects": ["ml", "web"],
                "password": "alice-password-1",
            },
        ),
        ("POST", "/users", {"username": "bob", "domain": "acme", "projects": ["ml"]}),
        ("POST", "/images", {"name": "web/only:1", "projects": ["acme/web"]}),
    ]:
        r = hub.api(method, path, root, json=body)
        assert r.status_code == 201, (path, r.text)
    tokens = {name: hub.wait_token(name) for name in ("alice", "bob")}
    yield hub, state, root, tokens
    for name in ("alice", "bob"):
        for server in ("", "a", "b", "q"):
            hub.hub_api("DELETE", f"/users/{name}/servers/{server}" if server else f"/users/{name}/server")
    hub.stop()


def _spawn(hub, name, server, options):
    path = f"/users/{name}/servers/{server}" if server else f"/users/{name}/server"
    return hub.hub_api("POST", path, json=options)


def _wait_ready(hub, name, server="", timeout=60):
    deadline = time.monotonic() + timeout
    model = None
    while time.monotonic() < deadline:
        model = hub.hub_api("GET", f"/users/{name}").json()["servers"].get(server)
        if model and model.get("ready"):
            return model
        if model is None or not model.get("pending"):
            if model is None and time.monotonic() > deadline - timeout + 5:
                break
        time.sleep(0.3)
    raise AssertionError(f"{name}/{server} never became ready: {model}\n{hub.log_text()[-4000:]}")


def _sessions(hub, token, **filters):
    return hub.api("GET", "/sessions", token, params=filters).json()


def _environ(pid: int) -> dict[str, str]:
    """The environment of the session's process (bwrap execs the server as its child)."""
    out = {}
    for p in [pid, *_children(pid)]:
        try:
            raw = Path(f"/proc/{p}/environ").read_bytes()
        except OSError:
            continue
        out = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
        if "JUPYTERHUB_USER" in out:
            return out
    return out


def _children(pid: int) -> list[int]:
    out = []
    for child in Path("/proc").iterdir():
        if child.name.isdigit():
            try:
                ppid = int((child / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                out += [int(child.name), *_children(int(child.name))]
    return out


def test_spawn_half_gpu_reach_lab_and_stop(env):
    hub, state, root, tokens = env
    r = _spawn(hub, "alice", "a", {"project": "ml", "cpu": 1, "mem": "1g", "gpu": 0.5})
    assert r.status_code in (201, 202), r.text
    _wait_ready(hub, "alice", "a")
    # JupyterLab answers through the proxy, with the user's token.
    lab = requests.get(
        f"{hub.url}/user/alice/a/api/status",
        headers={"Authorization": f"token {tokens['alice']}"},
        timeout=30,
    )
    assert lab.status_code == 200, lab.text
    (s,) = _sessions(hub, tokens["alice"], status="RUNNING")
    assert s["name"] == "a" and s["project"] == "acme/ml" and s["image"] == "local/host"
    assert [(d["shares"], d["model"]) for d in s["devices"]] == [(0.5, "A100-80GB")]
    assert [h["status"] for h in s["status_history"]] == ["SCHEDULED", "PREPARING", "RUNNING"]
    # The Hub keeps the session id (a restart finds the allocation again) and the process
    # sees its placement.
    st = spawner_state(state, "alice", "a")
    assert st["labfleet_session_id"] == s["id"]
    env_ = _environ(st["pid"])
    assert env_["LABFLEET_SESSION_ID"] == s["id"]
    assert env_["LABFLEET_GPU_SHARES"] == "0.5"
    assert env_["CUDA_VISIBLE_DEVICES"] == s["devices"][0]["uuid"]
    # No MPS here: the frameworks' own caps hold the share (PyTorch's among them).
    assert env_["LABFLEET_GPU_ENFORCEMENT"] == "caps"
    assert env_["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True,per_process_memory_fraction:0.5"
    assert env_["LABFLEET_CPU_LIMIT"] == "1" and env_["LABFLEET_MEM_LIMIT"] == str(2**30)
    # Stop: the allocation is freed at once.
    assert hub.hub_api("DELETE", "/users/alice/servers/a").status_code in (202, 204)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        after = hub.api("GET", f"/sessions/{s['id']}", tokens["alice"]).json()
        if after["status"] == "TERMINATED":
            break
        time.sleep(0.2)
    assert after["status"] == "TERMINATED" and after["devices"] == []
    nodes = hub.api("GET", "/nodes", root).json()
    assert all(d["allocated"] == 0 for d in nodes[0]["devices"])


@pytest.mark.parametrize(
    "options, status, words",
    [
        ({"project": "ml", "gpu": 3}, 409, "project acme/ml would use 3 of its 2 gpu.shares"),
        ({"project": "ml", "image": "web/only:1"}, 403, "web/only:1"),
        ({"project": "ml", "image": "not/registered:1"}, 403, "not registered"),
        ({"project": "nope"}, 403, "not a member"),
        ({"project": "ml", "colour": "blue"}, 400, "unknown option(s) colour"),
        ({"project": "ml", "cpu": -1}, 400, "cpu cannot be negative"),
        ({"project": "ml", "cpu": "lots"}, 400, "cpu must be a number"),
        ({"project": "ml", "gpu": 0.333}, 400, "gpu takes steps of 0.01"),
        ({"project": "ml", "mem": 10**18}, 400, "more than any node has"),
        ({"project": "ml", "type": "batch"}, 400, "a batch session needs a command"),
        ({"project": "ml", "type": "interactive", "command": "rm -rf /"}, 400, "takes no command"),
        ({"gpu": 1}, 400, "choose a project"),
    ],
)
def test_refused_spawns_say_why_and_start_nothing(env, options, status, words):
    hub, state, root, tokens = env
    before = len(_sessions(hub, root))
    # bob is in one project (taken when none is named); alice is in two, so she must choose.
    user = "bob" if "project" in options else "alice"
    r = _spawn(hub, user, "b", options)
    assert r.status_code == status, r.text
    assert words in r.json()["message"], r.text
    model = hub.hub_api("GET", f"/users/{user}").json()["servers"].get("b")
    assert model is None or not model.get("ready")
    # Nothing held: refused before admission, or admission said no and kept nothing.
    live = [s for s in _sessions(hub, root) if s["status"] not in ("TERMINATED", "CANCELLED", "ERROR")]
    assert live == [] and len(_sessions(hub, root)) == before


def test_queued_spawn_reports_position_and_starts_when_capacity_frees(env):
    hub, state, root, tokens = env
    assert _spawn(hub, "alice", "a", {"project": "ml", "gpu": 1}).status_code in (201, 202)
    _wait_ready(hub, "alice", "a")
    assert _spawn(hub, "alice", "b", {"project": "web", "gpu": 1}).status_code in (201, 202)
    _wait_ready(hub, "alice", "b")
    # Both devices are taken: bob's spawn waits in the queue, and the progress stream says so.
    r = _spawn(hub, "bob", "q", {"project": "ml", "gpu": 0.5})
    assert r.status_code == 202, r.text
    progress = requests.get(
        f"{hub.url}/hub/api/users/bob/servers/q/progress",
        headers={"Authorization": f"token {tokens['bob']}"},
        stream=True,
        timeout=30,
    )
    queued = None
    for line in progress.iter_lines(decode_unicode=True):
        if line.startswith("data:"):
            event = json.loads(line[5:])
            if "Queued" in event.get("message", ""):
                queued = event["message"]
                break
    progress.close()
    assert queued is not None and "position 1" in queued, queued
    (waiting,) = _sessions(hub, tokens["bob"], status="PENDING")
    # Capacity frees: bob's session is placed and its server starts.
    assert hub.hub_api("DELETE", "/users/alice/servers/a").status_code in (202, 204)
    _wait_ready(hub, "bob", "q")
    assert hub.api("GET", f"/sessions/{waiting['id']}", tokens["bob"]).json()["status"] == "RUNNING"
    for name, server in (("alice", "b"), ("bob", "q")):
        hub.hub_api("DELETE", f"/users/{name}/servers/{server}")


def test_hub_restart_keeps_running_sessions_and_their_allocations(env, tmp_path):
    hub, state, root, tokens = env
    assert _spawn(hub, "alice", "a", {"project": "ml", "gpu": 0.25}).status_code in (201, 202)
    _wait_ready(hub, "alice", "a")
    (s,) = _sessions(hub, tokens["alice"], status="RUNNING")
    pid = spawner_state(state, "alice", "a")["pid"]
    hub.stop()
    assert os.path.exists(f"/proc/{pid}"), "the session must survive the Hub's restart"
    again = start_hub(state, db_url=hub.db_url, do_seed=False, extra_config=RESTARTABLE, ports=hub.ports)
    env[0].__dict__.update(again.__dict__)  # later fixture teardown stops the new Hub
    root2 = again.wait_token("root")
    time.sleep(2)  # the service reconciles with the Hub's servers at start
    after = again.api("GET", f"/sessions/{s['id']}", root2).json()
    assert after["status"] == "RUNNING" and after["devices"][0]["shares"] == 0.25
    token = again.wait_token("alice")
    lab = requests.get(
        f"{again.url}/user/alice/a/api/status", headers={"Authorization": f"token {token}"}, timeout=30
    )
    assert lab.status_code == 200
    assert again.hub_api("DELETE", "/users/alice/servers/a").status_code in (202, 204)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if again.api("GET", f"/sessions/{s['id']}", root2).json()["status"] == "TERMINATED":
            break
        time.sleep(0.2)
    assert again.api("GET", f"/sessions/{s['id']}", root2).json()["status"] == "TERMINATED"
    assert not os.path.exists(f"/proc/{pid}") or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


def test_spawn_form_offers_the_users_choices_and_reports_errors(env):
    hub, state, root, tokens = env
    browser = hub.login("alice", "alice-password-1")
    assert browser.login_status == 302
    page = browser.get(f"{hub.url}/hub/spawn/alice/f", timeout=30)
    assert page.status_code == 200
    html = page.text
    # Only alice's projects, the images they may use, and the quota left.
    assert 'value="acme/ml"' in html and 'value="acme/web"' in html
    assert 'value="local/host"' in html and 'data-projects="acme/web"' in html  # web/only:1
    assert "What the quota of acme/ml leaves" in html and "Free now" in html
    xsrf = browser.cookies.get("_xsrf")
    bad = browser.post(
        f"{hub.url}/hub/spawn/alice/f",
        data={"project": "acme/ml", "gpu": "-1", "_xsrf": xsrf},
        timeout=30,
    )
    assert "gpu cannot be negative" in bad.text, bad.text[bad.text.find("<form") :][:3000]
    assert hub.hub_api("GET", "/users/alice").json()["servers"].get("f") is None or not hub.hub_api(
        "GET", "/users/alice"
    ).json()["servers"]["f"].get("ready")
    good = browser.post(
        f"{hub.url}/hub/spawn/alice/f",
        data={
            "project": "acme/ml",
            "image": "local/host",
            "cpu": "1",
            "mem": "1g",
            "gpu": "0.25",
            "_xsrf": xsrf,
        },
        timeout=60,
    )
    assert good.status_code == 200
    _wait_ready(hub, "alice", "f")
    (s,) = [x for x in _sessions(hub, tokens["alice"], status="RUNNING") if x["name"] == "f"]
    assert s["slots"]["gpu.shares"] == 0.25
    assert hub.hub_api("DELETE", "/users/alice/servers/f").status_code in (202, 204)


def _wait_session(hub, token, server, statuses, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [s for s in _sessions(hub, token) if s["name"] == server]
        if found and found[-1]["status"] in statuses:
            return found[-1]
        time.sleep(0.3)
    raise AssertionError(f"session {server} never reached {statuses}: {found}\n{hub.log_text()[-3000:]}")


def test_batch_session_records_its_exit_code_and_logs(env):
    hub, state, root, tokens = env
    options = {"project": "ml", "type": "batch", "command": "echo from-batch $LABFLEET_GPU_SHARES; exit 3"}
    options["gpu"] = 0.25
    assert _spawn(hub, "alice", "job", options).status_code in (201, 202)
    done = _wait_session(hub, tokens["alice"], "job", ("TERMINATED", "ERROR"))
    assert done["status"] == "TERMINATED" and done["exit_code"] == 3, done
    assert done["devices"] == []  # the allocation went back when the command ended
    logs = hub.api("GET", f"/sessions/{done['id']}/logs", tokens["alice"])
    assert "from-batch 0.25" in logs.text
    # The output is also in the session's home, where the Lab's file browser shows it.
    assert "from-batch 0.25" in (state / "homes" / "alice" / "labfleet-batch.log").read_text()
    assert hub.api("GET", f"/sessions/{done['id']}/logs", tokens["bob"]).status_code == 404


def test_inference_endpoint_through_the_proxy_shared_with_a_scoped_token(env):
    hub, state, root, tokens = env
    options = {
        "project": "ml",
        "type": "inference",
        "command": "python3 -m http.server {port} --bind 127.0.0.1 --directory .",
    }
    (state / "homes" / "alice").mkdir(parents=True, exist_ok=True)
    (state / "homes" / "alice" / "model.txt").write_text("prediction: 42\n")
    assert _spawn(hub, "alice", "infer", options).status_code in (201, 202)
    _wait_ready(hub, "alice", "infer")
    url = f"{hub.url}/user/alice/infer/labfleet/inference/model.txt"
    # A token scoped to this server alone, as alice would share it.
    r = hub.hub_api(
        "POST",
        "/users/alice/tokens",
        json={"scopes": ["access:servers!server=alice/infer"], "expires_in": 600},
    )
    assert r.status_code == 201, r.text
    shared = r.json()["token"]
    deadline = time.monotonic() + 30
    while True:
        answer = requests.get(url, headers={"Authorization": f"token {shared}"}, timeout=30)
        if answer.status_code != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.5)  # the command is still starting
    assert answer.status_code == 200 and answer.text == "prediction: 42\n", answer.text[:300]
    # bob's own token does not reach alice's endpoint.
    denied = requests.get(
        url, headers={"Authorization": f"token {tokens['bob']}"}, timeout=30, allow_redirects=False
    )
    assert denied.status_code in (302, 403), denied.status_code
    # A plain inference session is no endpoint's replica: the service says so to its owner (404 to anyone
    # else), and its command runs without a replica front, on the port it was given.
    (sid,) = [x["id"] for x in _sessions(hub, tokens["alice"], status="RUNNING") if x["name"] == "infer"]
    cred = hub.api("GET", f"/sessions/{sid}/replica-credential", tokens["alice"])
    assert cred.status_code == 200 and cred.json()["replica"] is False and cred.json()["credential"] is None
    assert hub.api("GET", f"/sessions/{sid}/replica-credential", tokens["bob"]).status_code == 404
    runner = requests.get(
        f"{hub.url}/user/alice/infer/labfleet/runner",
        headers={"Authorization": f"token {shared}"},
        timeout=30,
    ).json()
    assert "front" not in runner and runner["port"], runner
    if SESSION_NETWORK:
        # It listens on its session's loopback: not even the host reaches it at the session's address.
        with pytest.raises(OSError):
            socket.create_connection(
                (session_address(state, "alice", "infer"), runner["port"]), timeout=5
            ).close()
    assert hub.hub_api("DELETE", "/users/alice/servers/infer").status_code in (202, 204)


def _mounts(pid: int) -> dict[str, set[str]]:
    """Mount point -> its options, as the session's server process sees them."""
    out: dict[str, set[str]] = {}
    for p in [pid, *_children(pid)]:
        try:
            text = Path(f"/proc/{p}/mountinfo").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            fields = line.split()
            out[fields[4]] = set(fields[5].split(","))
    return out


def _contents(hub, token, server, path, method="GET", **kw):
    return requests.request(
        method,
        f"{hub.url}/user/alice/{server}/api/contents/{path}",
        headers={"Authorization": f"token {token}"},
        timeout=30,
        **kw,
    )


def test_vfolders_mounted_with_their_permission_and_shared_between_sessions(env):
    hub, state, root, tokens = env
    alice, bob = tokens["alice"], tokens["bob"]

    def made(token, body):
        r = hub.api("POST", "/vfolders", token, json=body)
        assert r.status_code == 201, r.text
        return r.json()

    work = made(alice, {"name": "work"})
    dot = made(alice, {"name": ".config-files"})
    bobs = made(bob, {"name": "bob-data"})
    assert hub.api("PUT", f"/vfolders/{bobs['id']}/files/given.txt", bob, data=b"from bob").status_code == 201
    inv = hub.api(
        "POST", f"/vfolders/{bobs['id']}/invitations", bob, json={"invitee": "alice", "permission": "ro"}
    )
    assert hub.api("POST", f"/vfolder-invitations/{inv.json()['id']}/accept", alice).status_code == 200
    # The form offers them (dot-folders as mounted automatically).
    offered = {v["name"]: v for v in hub.api("GET", "/users/alice/launch-options", alice).json()["vfolders"]}
    assert offered["bob-data"]["permission"] == "ro" and offered[".config-files"]["auto"] is True

    r = _spawn(hub, "alice", "a", {"project": "ml", "vfolders": ["work", "bob-data"]})
    assert r.status_code in (201, 202), r.text
    _wait_ready(hub, "alice", "a")
    (s,) = [x for x in _sessions(hub, alice, status="RUNNING") if x["name"] == "a"]
    assert {m["name"]: m["permission"] for m in s["mounts"]} == {
        "work": "wd",
        "bob-data": "ro",
        ".config-files": "wd",
    }
    home = state / "homes" / "alice"
    # Mounted in the sandbox's own folder root, which ~/vfolders links to: no mount point in the home.
    seen = _mounts(spawner_state(state, "alice", "a")["pid"])
    assert "ro" in seen[f"{FOLDERS_ROOT}/bob-data"]
    assert "rw" in seen[f"{FOLDERS_ROOT}/work"]
    assert "rw" in seen[f"{FOLDERS_ROOT}/.config-files"]
    assert os.readlink(home / "vfolders") == FOLDERS_ROOT
    # The storage root is not in the sandbox at all: only the session's own folders are mounted.
    assert not [
        m for m in seen if m == str(state / "vfolders") or m.startswith(str(state / "vfolders") + "/")
    ]

    # The Lab's file browser (the contents API) sees the folders like any other.
    listing = _contents(hub, alice, "a", "vfolders").json()
    assert {c["name"] for c in listing["content"]} >= {"work", "bob-data"}
    assert _contents(hub, alice, "a", "vfolders/bob-data/given.txt").json()["content"] == "from bob"
    # rw: the write lands in the folder (the API reads it back); ro: refused, nothing written.
    body = {"type": "file", "format": "text", "content": "from session a"}
    assert _contents(hub, alice, "a", "vfolders/work/note.txt", "PUT", json=body).status_code in (200, 201)
    got = hub.api("GET", f"/vfolders/{work['id']}/files/note.txt", alice)
    assert got.status_code == 200 and got.content == b"from session a"
    refused = _contents(hub, alice, "a", "vfolders/bob-data/new.txt", "PUT", json=body)
    assert refused.status_code >= 400
    assert hub.api("GET", f"/vfolders/{bobs['id']}/files/new.txt", bob).status_code == 404

    # A second session of the same folder reads what the first wrote.
    r = _spawn(hub, "alice", "b", {"project": "web", "vfolders": [work["id"]]})
    assert r.status_code in (201, 202), r.text
    _wait_ready(hub, "alice", "b")
    assert _contents(hub, alice, "b", "vfolders/work/note.txt").json()["content"] == "from session a"
    # A session that mounts no folder sees none: no empty, writable ~/vfolders/work that would keep
    # a file in the home instead of the folder (a split folder).
    r = _spawn(hub, "alice", "c", {"project": "ml"})
    assert r.status_code in (201, 202), r.text
    _wait_ready(hub, "alice", "c")
    assert _contents(hub, alice, "c", "vfolders/work").status_code == 404
    assert _contents(hub, alice, "c", "vfolders/work/x.txt", "PUT", json=body).status_code >= 400
    assert _contents(hub, alice, "c", "vfolders/x.txt", "PUT", json=body).status_code >= 400
    assert hub.api("GET", f"/vfolders/{work['id']}/files/x.txt", alice).status_code == 404
    assert hub.hub_api("DELETE", "/users/alice/servers/c").status_code in (202, 204)

    # A mounted folder cannot be purged; once the sessions stop, it can.
    assert hub.api("DELETE", f"/vfolders/{work['id']}", alice).status_code == 200
    r = hub.api("POST", f"/vfolders/{work['id']}/purge", alice)
    assert r.status_code == 409 and "mounted" in r.json()["message"]
    for server in ("a", "b"):
        assert hub.hub_api("DELETE", f"/users/alice/servers/{server}").status_code in (202, 204)
    # What the sessions wrote is counted when they end, not at the next periodic scan.
    deadline = time.monotonic() + 30
    while hub.api("GET", f"/vfolders/{work['id']}", alice).json()["usage"]["bytes"] != len("from session a"):
        assert time.monotonic() < deadline, hub.api("GET", f"/vfolders/{work['id']}", alice).text
        time.sleep(0.3)
    deadline = time.monotonic() + 30
    while hub.api("POST", f"/vfolders/{work['id']}/purge", alice).status_code != 200:
        assert time.monotonic() < deadline, "the folder stayed mounted after its sessions stopped"
        time.sleep(0.3)
    assert not (state / "vfolders" / work["id"]).exists()
    # The user's last session gone, nothing of the folders is left in the home.
    deadline = time.monotonic() + 30
    while os.path.lexists(home / "vfolders"):
        assert time.monotonic() < deadline, sorted(p.name for p in home.iterdir())
        time.sleep(0.3)
    # Asking for a folder one cannot reach is refused before anything starts.
    r = _spawn(hub, "bob", "b", {"vfolders": ["work"]})
    assert r.status_code == 404 and "work" in r.json()["message"], r.text
    assert dot["id"]
