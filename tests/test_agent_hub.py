"""A real `labfleet agent` process for a second node beside a real Hub and its labfleet service
(local backend, same machine, 127.0.0.1): the node shows ALIVE with its mock GPUs, a session is placed
there, the agent is SIGKILLed and the node goes LOST (1 s heartbeats, LOST after 3) with the session's
allocation freed and the ledger right, the agent restarts and the node is ALIVE again; drain through
the API; bad input to the token and agent APIs answers 4xx and changes nothing.  A third agent's node
whose sessions share one mock GPU (per-process readings from ``$LABFLEET_MOCK_GPU_USAGE``): the
service's backstop hands a kill to the agent, which kills the real offending process and reports;
a report for a kill never queued is ignored."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import requests
from sqlalchemy import text

from labfleet.compute.devices.mock import USAGE_ENV, mock_uuid
from labfleet.core import database, unitofwork, usage_ledger
from tests.hubfixture import REPO, free_port, start_hub

pytestmark = pytest.mark.hub

NODE = "agent-n2"
PW = "alice-password-1"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = start_hub(
        tmp_path_factory.mktemp("hub"),
        env={
            "LABFLEET_AGENT_HEARTBEAT": "1",
            "LABFLEET_NODE_LOST_AFTER": "3",
            "LABFLEET_SAMPLE_INTERVAL": "1",
        },
    )
    yield h
    h.hub_api("DELETE", "/users/alice/servers/gpu")
    h.stop()


@pytest.fixture(scope="module")
def root(hub):
    return hub.wait_token("root")


@pytest.fixture(scope="module")
def fleet(hub, root):
    for path, body in (
        ("/resource-groups", {"name": "edge", "is_public": True}),
        ("/domains", {"name": "acme"}),
        ("/projects", {"domain": "acme", "name": "ml"}),
        ("/users", {"username": "alice", "domain": "acme", "password": PW, "projects": ["ml"]}),
    ):
        r = hub.api("POST", path, root, json=body)
        assert r.status_code == 201, r.text
    return hub.wait_token("alice")


class Agent:
    def __init__(self, hub, token_file, log, node=NODE, devices=2, env=None):
        self.hub, self.token_file, self.log = hub, token_file, log
        self.node, self.devices, self.env = node, devices, env or {}
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO), **self.env)
        args = [
            *("--service-url", self.hub.api_url, "--token-file", str(self.token_file)),
            *("--node-name", self.node, "--mock-devices", str(self.devices), "--address", "127.0.0.1"),
        ]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "labfleet.cli", "agent", *args],
            env=env,
            stdout=open(self.log, "a"),
            stderr=subprocess.STDOUT,
        )

    def stop(self, sig=signal.SIGTERM) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        return self.proc.wait(30)


def _nodes(hub, token) -> dict:
    r = hub.api("GET", "/nodes", token)
    assert r.status_code == 200, r.text
    return {n["name"]: n for n in r.json()}


def _wait(what, check, timeout=90.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def _spawn_ready(hub, user, server, options, timeout=90):
    r = hub.hub_api("POST", f"/users/{user}/servers/{server}", json=options)
    assert r.status_code in (201, 202), r.text
    _wait(
        f"server {server} ready",
        lambda: (hub.hub_api("GET", f"/users/{user}").json()["servers"].get(server) or {}).get("ready"),
        timeout,
    )


def _sampled(hub, session_id):
    """When the usage records last took a reading of the session (the agent's, on its node)."""
    engine = database.make_engine(hub.db_url)
    try:
        with engine.connect() as conn:
            return conn.execute(
                text("SELECT sampled_at FROM usage_session_state WHERE session_id = :id"), {"id": session_id}
            ).scalar()
    finally:
        engine.dispose()


def _state(hub, root):
    """What bad requests must not change: the nodes, the tokens, the sessions."""
    sessions = hub.api("GET", "/sessions", root).json()
    return (
        sorted((n["name"], n["status"], n["schedulable"]) for n in _nodes(hub, root).values()),
        hub.api("GET", "/node-tokens", root).json(),
        sorted((s["id"], s["status"]) for s in sessions),
    )


def _admit_half_gpu(hub, name: str, group: str):
    """The Hub's spawner asking for alice's session ``name`` of one core and half a GPU in ``group``."""
    return hub.api(
        "POST",
        "/sessions",
        hub.service_token,
        json={
            "username": "alice",
            "project": "acme/ml",
            "resource_group": group,
            "name": name,
            "slots": {"cpu": 1, "gpu.shares": 0.5},
        },
    )


def test_bad_token_and_agent_requests_change_nothing(hub, root, fleet):
    before = _state(hub, root)
    alice = fleet
    for token, method, path, body, status in (
        (alice, "POST", "/node-tokens", {}, 403),
        (alice, "GET", "/node-tokens", None, 403),
        (root, "POST", "/node-tokens", {"bogus": 1}, 400),
        (root, "POST", "/node-tokens", {"node": "no such/name"}, 400),
        (root, "POST", "/node-tokens", {"resource_group": "nope"}, 404),
        (root, "DELETE", "/node-tokens/abc", None, 400),
        (root, "DELETE", "/node-tokens/999", None, 404),
        (None, "POST", "/agent/register", {"node": NODE}, 401),
        (root, "POST", "/agent/register", {"node": NODE, "cpu": 1, "mem": 1}, 403),
        (hub.service_token, "POST", "/agent/heartbeat", {"node": NODE}, 403),
        ("lfnode_1_" + "x" * 43, "POST", "/agent/heartbeat", {"node": NODE}, 401),
        (root, "PATCH", f"/nodes/{NODE}", {"schedulable": False}, 404),
    ):
        r = hub.api(method, path, token, json=body) if body is not None else hub.api(method, path, token)
        assert r.status_code == status, (method, path, r.status_code, r.text)
        assert r.json()["message"]
    assert _state(hub, root) == before


def test_the_services_own_node_heartbeats_like_an_agents(hub, root):
    # The node the service registered for its own machine: not one of this file's agents.
    (own,) = [n for n in _nodes(hub, root).values() if not n["name"].startswith("agent-")]
    first = own["last_seen"]
    _wait(
        "a newer last_seen of the service's own node (1 s heartbeats)",
        lambda: _nodes(hub, root)[own["name"]]["last_seen"] > first,
        10,
    )
    assert _nodes(hub, root)[own["name"]]["status"] == "ALIVE"


def test_agent_node_alive_lost_and_back(hub, root, fleet, tmp_path):
    made = hub.api(
        "POST", "/node-tokens", root, json={"node": NODE, "resource_group": "edge", "note": "test"}
    )
    assert made.status_code == 201, made.text
    token = made.json()["token"]
    token_file = tmp_path / "node-token"
    token_file.write_text(token + "\n")
    # A token for the node refuses other names and bad bodies: 4xx, nothing changed.
    before = _state(hub, root)
    for body, status in (
        ({"node": "other", "cpu": 2, "mem": 2**30}, 403),
        ({"node": NODE, "cpu": "many", "mem": 2**30}, 400),
        ({"node": NODE, "cpu": 2, "mem": 2**30, "labels": {"a": 1}}, 400),
        ({"node": NODE, "cpu": 2, "mem": 2**30, "devices": [{"uuid": "x"}]}, 400),
        ({"node": NODE, "cpu": 2, "mem": 2**30, "mps": {"state": "on"}}, 400),
        ([], 400),
    ):
        r = hub.api("POST", "/agent/register", token, json=body)
        assert r.status_code == status, (body, r.text)
    r = hub.api("POST", "/agent/heartbeat", token, json={"node": NODE})
    assert r.status_code == 404, r.text  # not registered yet
    assert _state(hub, root) == before

    agent = Agent(hub, token_file, tmp_path / "agent.log")
    try:
        agent.start()
        node = _wait("the agent's node", lambda: _nodes(hub, root).get(NODE))
        assert node["status"] == "ALIVE" and node["agent"] is True and node["resource_group"] == "edge"
        assert len(node["devices"]) == 2 and {d["model"] for d in node["devices"]} == {"A100-80GB"}
        assert node["labels"] == {"address": "127.0.0.1"} and node["schedulable"] is True
        # Mock devices only: no MPS daemon, and the node says why.
        assert node["mps"] == {
            "state": "off",
            "reason": "the node does not use the nvidia device plugin",
            "pipe_dir": None,
        }

        # The Hub's spawner asks for a session in group edge: it lands on the agent's node.
        r = _admit_half_gpu(hub, "edge1", "edge")
        assert r.status_code == 201, r.text
        session = r.json()
        assert session["status"] == "SCHEDULED" and session["node"] == NODE
        assert _nodes(hub, root)[NODE]["allocated"]["gpu.shares"] == 0.5
        # A real Hub server in group edge runs on the agent's node; the agent samples it (its
        # readings reach the usage records) and the node's heartbeats keep it ALIVE.
        _spawn_ready(hub, "alice", "gpu", {"project": "ml", "resource_group": "edge", "gpu": 0.25, "cpu": 1})
        real = next(
            x
            for x in hub.api("GET", "/sessions", root, params={"user": "alice"}).json()
            if x["name"] == "gpu"
        )
        assert real["node"] == NODE and real["status"] == "RUNNING", real
        _wait("the agent's readings of the real session", lambda: _sampled(hub, real["id"]), 60)
        assert _nodes(hub, root)[NODE]["status"] == "ALIVE"
        assert _nodes(hub, root)[NODE]["allocated"]["gpu.shares"] == 0.75

        # Drain and undrain through the API (superadmin only).
        assert hub.api("PATCH", f"/nodes/{NODE}", fleet, json={"schedulable": False}).status_code == 403
        assert hub.api("PATCH", f"/nodes/{NODE}", root, json={"schedulable": "no"}).status_code == 400
        r = hub.api("PATCH", f"/nodes/{NODE}", root, json={"schedulable": False})
        assert r.status_code == 200 and r.json()["schedulable"] is False
        assert hub.api("PATCH", f"/nodes/{NODE}", root, json={"schedulable": True}).json()["schedulable"]

        # SIGKILL: no heartbeat; after 3 missed ones the node is LOST and the session's slots come back.
        agent.stop(signal.SIGKILL)
        lost = _wait("the node LOST", lambda: _nodes(hub, root)[NODE]["status"] == "LOST" or None, 60)
        assert lost
        view = _nodes(hub, root)[NODE]
        assert view["allocated"]["gpu.shares"] == 0 and view["allocated"]["cpu"] == 0
        s = hub.api("GET", f"/sessions/{session['id']}", root).json()
        assert s["status"] == "ERROR" and s["status_reason"].startswith("node lost"), s
        s = hub.api("GET", f"/sessions/{real['id']}", root).json()
        assert s["status"] == "ERROR" and s["status_reason"].startswith("node lost"), s
        # ... and the Hub was asked to stop its server.
        _wait(
            "the Hub server stopped",
            lambda: "gpu" not in hub.hub_api("GET", "/users/alice").json()["servers"],
            60,
        )
        audit = hub.api("GET", "/audit?action=node.lost", root).json()
        assert [e["target"] for e in audit] == [NODE]
        engine = database.make_engine(hub.db_url)
        try:
            with database.session_scope(unitofwork.make_session_factory(engine)) as db:
                assert usage_ledger.drift(db) == []
        finally:
            engine.dispose()

        # The agent comes back: ALIVE again.
        agent.start()
        _wait("the node ALIVE again", lambda: _nodes(hub, root)[NODE]["status"] == "ALIVE" or None, 60)
        assert agent.stop(signal.SIGTERM) == 0  # a clean exit
    finally:
        agent.stop(signal.SIGKILL)
    log = (tmp_path / "agent.log").read_text()
    assert "Registered node agent-n2" in log and token not in log


def _two_sleeps(procs) -> tuple[int, list[int]]:
    """A real process tree standing for a session's server: (its root pid, its two ``sleep 600``,
    the older first)."""
    root = subprocess.Popen(["sh", "-c", "sleep 600 & sleep 0.2; sleep 600 & wait"], start_new_session=True)
    procs.append(root)

    def kids():
        out = []
        for k in psutil.Process(root.pid).children():
            try:
                if k.cmdline() == ["sleep", "600"]:
                    out.append(k)
            except psutil.Error:
                continue
        return sorted(out, key=lambda k: k.create_time()) if len(out) == 2 else None

    return root.pid, [k.pid for k in _wait("the session's processes", kids, 10)]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _overuse_audits(hub, root, sid):
    audit = hub.api("GET", "/audit", root, params={"action": "session.gpu-overuse", "limit": 1000}).json()
    return [e["details"] for e in audit if e["target"] == sid]


def test_a_kill_on_an_agent_s_node_is_done_by_its_agent(hub, root, fleet, tmp_path):
    node = "agent-k3"
    for path, body in (
        ("/resource-groups", {"name": "edge-kill", "is_public": True, "gpu_overuse": "kill"}),
        ("/node-tokens", {"node": node, "resource_group": "edge-kill"}),
    ):
        r = hub.api("POST", path, root, json=body)
        assert r.status_code == 201, r.text
    token = r.json()["token"]
    (tmp_path / "node-token").write_text(token)
    usage = tmp_path / "gpu-usage.json"
    usage.write_text("{}")
    agent = Agent(hub, tmp_path / "node-token", tmp_path / "agent.log", node, 1, {USAGE_ENV: str(usage)})
    procs: list[subprocess.Popen] = []
    ids: list[str] = []
    try:
        agent.start()
        _wait("the agent's node", lambda: (_nodes(hub, root).get(node) or {}).get("status") == "ALIVE")
        # Two sessions of half the one device each, their servers real processes (as the spawner
        # reports them: RUNNING, with the root pid)
        pids = []
        for name in ("k1", "k2"):
            r = _admit_half_gpu(hub, name, "edge-kill")
            assert r.status_code == 201 and r.json()["node"] == node, r.text
            ids.append(r.json()["id"])
            root_pid, kids = _two_sleeps(procs)
            pids.append(kids)
            r = hub.api(
                "PATCH",
                f"/sessions/{ids[-1]}",
                hub.service_token,
                json={"status": "RUNNING", "runtime": {"pid": root_pid}},
            )
            assert r.status_code == 200, r.text
        (a, b), ((a_old, a_new), (b_old, b_new)) = ids, pids
        # a holds 30 + 20 GiB of the 80 GiB device (its share: 40, +2 tolerance); b 10 of its 40
        rows = [(a_old, 30), (a_new, 20), (b_old, 10)]
        usage.write_text(
            json.dumps(
                {mock_uuid(node, 0): {"processes": [{"pid": p, "mem_used": g * 2**30} for p, g in rows]}}
            )
        )
        (entry,) = _wait("the kill written up", lambda: _overuse_audits(hub, root, a), 60)
        assert _gone(a_new), "the agent did not kill the newest process"
        assert not any(_gone(p) for p in (a_old, b_old, b_new))  # the rest runs on, the other untouched
        assert entry["action"] == "kill" and entry["node"] == node and entry["used_bytes"] == 50 * 2**30
        assert entry["killed"] == [{"pid": a_new, "cmdline": "sleep 600", "mem_bytes": 20 * 2**30}]
        assert entry["not_killed"] == []
        s = hub.api("GET", f"/sessions/{a}", root).json()
        assert s["status"] == "RUNNING" and s["status_reason"].startswith("gpu-overuse kill:"), s
        assert f"{a_new} (sleep 600" in s["status_reason"]
        text = requests.get(
            f"{hub.url}/services/labfleet/metrics",
            headers={"Authorization": f"token {root}"},
            timeout=30,
        ).text
        assert 'labfleet_gpu_overuse_total{action="kill",resource_group="edge-kill"} 1.0' in text

        # A report for a kill never queued (a forged one for b's process) is ignored: 200, nothing
        # written, nothing killed; a malformed one is a 400
        forged = {
            "session": b,
            "pid": b_old,
            "create_time": psutil.Process(b_old).create_time(),
            "killed": True,
        }
        r = hub.api("POST", "/agent/heartbeat", token, json={"node": node, "kill_reports": [forged]})
        assert r.status_code == 200 and r.json()["kill"] == [], r.text
        r = hub.api(
            "POST", "/agent/heartbeat", token, json={"node": node, "kill_reports": [{**forged, "pid": "x"}]}
        )
        assert r.status_code == 400 and "kill_reports[0].pid" in r.json()["message"], r.text
        time.sleep(2)  # a few more ticks and heartbeats
        assert _overuse_audits(hub, root, b) == [] and len(_overuse_audits(hub, root, a)) == 1
        assert hub.api("GET", f"/sessions/{b}", root).json()["status_reason"] == ""
        assert not _gone(b_old) and not _gone(a_old)
        assert agent.proc is not None and agent.proc.poll() is None
    finally:
        for sid in ids:
            hub.api("PATCH", f"/sessions/{sid}", hub.service_token, json={"status": "TERMINATED"})
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.wait(timeout=10)
        agent.stop(signal.SIGTERM)
        agent.stop(signal.SIGKILL)
    log = (tmp_path / "agent.log").read_text()
    assert f"Killed process {a_new} (sleep 600) of session {a}" in log and token not in log


def test_the_agent_retries_while_the_service_is_down_and_exits_cleanly(tmp_path):
    token_file = tmp_path / "node-token"
    token_file.write_text("lfnode_1_" + "x" * 43)
    log = tmp_path / "agent.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "labfleet.cli",
            "agent",
            "--service-url",
            f"http://127.0.0.1:{free_port()}/api",
        ]
        + ["--token-file", str(token_file), "--node-name", "down-n3", "--mock-devices", "1"],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
    )
    try:
        _wait("two retries", lambda: log.read_text().count("unreachable") >= 2, 60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "x" * 43 not in log.read_text()
