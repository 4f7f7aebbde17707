"""Node agents at the DB level (SQLite and a real PostgreSQL server): node tokens, registration, heartbeats, a node marked LOST
freeing its sessions' allocations (the ledger equal to a recomputation), drained and LOST nodes out
of placement, agent readings, and the token CLI. Bad input changes nothing."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from sqlalchemy import func, select

from labfleet.compute import agents, nodes, sessions
from labfleet.compute.devices.base import NodeInfo
from labfleet.compute.devices.mock import MockPlugin
from labfleet.core import database, usage_ledger
from labfleet.core.authz import Actor
from labfleet.core.errors import LabfleetError
from labfleet.core.models import Allocation, AuditEntry, ComputeSession, Node, NodeToken, utcnow
from labfleet.service import jobs
from labfleet.tenancy import directory
from labfleet.tenancy.policies import ensure_default_keypair_policy
from labfleet.usage import records
from tests.dbfixture import fresh_db
from tests.postgres_server import fresh_database

CLI = Actor.cli()
MONITOR = Actor(name="mo", role="monitor", domain="acme")
GiB = 2**30


def _devices(node: str, count: int = 2) -> list[dict]:
    devs = MockPlugin(devices=[{"model": "A100-80GB", "memory": "80g", "count": count}], node=node).discover()
    return [d.to_dict() for d in devs]


def _body(node: str = "n2", **over) -> dict:
    return {"node": node, "cpu": 16, "mem": 64 * GiB, "devices": _devices(node), "plugin": "mock", **over}


@pytest.fixture(params=["sqlite", "postgres"])
def world(request, tmp_path, monkeypatch):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'lf.sqlite'}"
    else:
        name = "nodes_" + hashlib.sha256(request.node.name.encode()).hexdigest()[:12]
        url = fresh_database(request.getfixturevalue("postgres_url"), name)
    engine, factory = fresh_db(url, tmp_path, monkeypatch)
    factory.url = url  # type: ignore[attr-defined]  # for the CLI
    with database.session_scope(factory) as db:
        ensure_default_keypair_policy(db)
        nodes.ensure_default_group(db)
        nodes.create_group(db, CLI, {"name": "edge", "is_public": True})
        directory.create_domain(db, CLI, {"name": "acme"})
        directory.create_project(db, CLI, {"domain": "acme", "name": "ml"})
        directory.create_user(db, CLI, {"username": "alice", "domain": "acme", "projects": ["ml"]})
        devs = MockPlugin(devices=[{"model": "A100-80GB", "memory": "80g", "count": 1}], node="n1").discover()
        nodes.register_node(db, NodeInfo(name="n1", cpu=8, mem=64 * GiB, devices=devs, plugin="mock"))
    yield factory
    engine.dispose()


def _token(factory, **body) -> tuple[int, str]:
    with database.session_scope(factory) as db:
        token, plain = agents.create_token(db, CLI, body)
        return token.id, plain


def _register(factory, plain: str, body: dict) -> str:
    with database.session_scope(factory) as db:
        return agents.register(db, agents.authenticate(db, plain), body).name


def _admit(factory, group="edge", **slots) -> tuple[str, str, str | None]:
    with database.session_scope(factory) as db:
        s = sessions.admit(
            db, CLI, {"project": "acme/ml", "username": "alice", "resource_group": group, "slots": slots}
        )
        return s.id, s.status, s.node.name if s.node else None


def _node(factory, name: str) -> dict:
    with database.session_scope(factory) as db:
        node = db.scalar(select(Node).where(Node.name == name))
        return nodes.node_view(db, node)


def _counts(factory) -> tuple[int, int, int]:
    with database.session_scope(factory) as db:
        return (
            db.scalar(select(func.count()).select_from(Node)),
            db.scalar(select(func.count()).select_from(NodeToken)),
            db.scalar(select(func.count()).select_from(Allocation)),
        )


def _ledger_matches(factory) -> None:
    with database.session_scope(factory) as db:
        assert usage_ledger.drift(db) == []


def _refused(factory, fn, status: int, words: str = "") -> None:
    before = _counts(factory)
    with pytest.raises(LabfleetError) as e:
        with database.session_scope(factory) as db:
            fn(db)
    assert e.value.status == status, e.value.message
    assert words in e.value.message
    assert _counts(factory) == before


# ---------------------------------------------------------------- tokens


def test_tokens_are_shown_once_stored_hashed_audited_and_revocable(world):
    token_id, plain = _token(world, node="n2", resource_group="edge", note="rack 4")
    assert plain.startswith(f"lfnode_{token_id}_")
    with database.session_scope(world) as db:
        row = db.get(NodeToken, token_id)
        assert plain not in row.token_hash and row.token_hash.startswith("pbkdf2_sha256$")
        assert agents.authenticate(db, plain).id == token_id
        views = [agents.token_view(db, t) for t in agents.list_tokens(db, MONITOR)]
        assert views[0]["node"] == "n2" and views[0]["revoked"] is False and "token" not in views[0]
        actions = [e.action for e in db.scalars(select(AuditEntry))]
        assert "node_token.create" in actions
    for bad in (
        "",
        "lfnode_",
        f"lfnode_{token_id}_" + "x" * 43,
        f"lfnode_99_{plain.split('_', 2)[2]}",
        "token",
    ):
        with database.session_scope(world) as db, pytest.raises(LabfleetError) as e:
            agents.authenticate(db, bad)
        assert e.value.status == 401
    with database.session_scope(world) as db:
        agents.revoke_token(db, CLI, str(token_id))
    with database.session_scope(world) as db, pytest.raises(LabfleetError) as e:
        agents.authenticate(db, plain)
    assert e.value.status == 401


def test_bad_token_requests_change_nothing(world):
    _refused(world, lambda db: agents.create_token(db, MONITOR, {}), 403, "superadmin")
    _refused(world, lambda db: agents.create_token(db, CLI, {"resource_group": "nope"}), 404, "nope")
    _refused(world, lambda db: agents.create_token(db, CLI, {"node": "bad name!"}), 400, "host name")
    _refused(world, lambda db: agents.create_token(db, CLI, {"bogus": 1}), 400, "unknown field")
    _refused(world, lambda db: agents.create_token(db, CLI, []), 400)
    _refused(world, lambda db: agents.revoke_token(db, CLI, "12x"), 400)
    _refused(world, lambda db: agents.revoke_token(db, CLI, 4242), 404)
    _refused(world, lambda db: agents.list_tokens(db, Actor(name="u", role="user", domain="acme")), 403)


# ---------------------------------------------------------------- register, heartbeat


def test_register_makes_an_alive_node_with_its_devices_and_labels(world):
    _, plain = _token(world, resource_group="edge")
    labels = {"swarm.node_id": "abc123", "address": "10.77.0.2"}
    assert _register(world, plain, _body(labels=labels)) == "n2"
    view = _node(world, "n2")
    assert view["status"] == "ALIVE" and view["agent"] is True and view["schedulable"] is True
    assert view["labels"] == labels and view["resource_group"] == "edge"
    assert [d["uuid"] for d in view["devices"]] == [d["uuid"] for d in _devices("n2")]
    assert _node(world, "n1")["agent"] is False
    # A session for group edge lands on n2, and its placement node carries the labels.
    sid, status, node = _admit(world, **{"gpu.shares": 0.5})
    assert (status, node) == ("SCHEDULED", "n2")
    _ledger_matches(world)


def test_register_refuses_what_the_token_may_not_do(world):
    _, bound = _token(world, node="n2")
    _, free = _token(world)
    _, other = _token(world)
    with database.session_scope(world) as db:
        tok = agents.authenticate(db, bound)
    _refused(world, lambda db: agents.register(db, db.merge(tok), _body("n3")), 403, "n2")
    _refused(
        world, lambda db: agents.register(db, agents.authenticate(db, free), _body("n1")), 409, "service"
    )
    _register(world, free, _body("n3"))
    _refused(
        world, lambda db: agents.register(db, agents.authenticate(db, other), _body("n3")), 409, "another"
    )
    # A device another node has.
    stolen = _body("n4", devices=_devices("n3"))
    _refused(
        world, lambda db: agents.register(db, agents.authenticate(db, other), stolen), 409, "another node"
    )
    for bad in (
        {"node": "n4"},
        _body("n4", cpu=-1),
        _body("n4", cpu="lots"),
        _body("n4", mem="8g"),
        _body("n4", labels={"a": 1}),
        _body("n4", labels=["a"]),
        _body("n4", devices=[{"uuid": "x"}]),
        _body("n4", devices=[{"uuid": "x", "index": 0, "model": "m", "memory_bytes": 1, "kind": "tpu"}]),
        _body("n4", devices="none"),
        _body("bad/name"),
        _body("n4", resource_group="Nope!"),
        {**_body("n4"), "extra": True},
    ):
        _refused(world, lambda db, bad=bad: agents.register(db, agents.authenticate(db, other), bad), 400)
    _refused(
        world,
        lambda db: agents.register(db, agents.authenticate(db, other), _body("n4", resource_group="x")),
        400,
    )
    assert _counts(world)[0] == 2  # n1 and n3


def _beat(factory, plain, body):
    beat, raw = agents.parse_heartbeat(body)
    readings = records.parse_agent_readings(raw, time.time())
    with database.session_scope(factory) as db:
        result = agents.heartbeat(db, agents.authenticate(db, plain), beat)
        targets = records.targets_on(db, beat.node)
        return result.stop, result.released, records.accept_agent_readings(readings, targets)


def test_heartbeats_release_ended_sessions_of_their_own_node_only(world):
    _, plain = _token(world, resource_group="edge")
    _register(world, plain, _body())
    mine, _, _ = _admit(world, **{"gpu.shares": 0.5})
    theirs, _, node = _admit(world, group="default", **{"gpu.shares": 0.5})
    assert node == "n1"
    with database.session_scope(world) as db:
        for sid, pid in ((mine, 111), (theirs, 222)):
            db.get(ComputeSession, sid).runtime = {"pid": pid}
    reading = {"session_id": mine, "at": time.time(), "alive": True, "cpu_seconds": 3.5, "mem_bytes": 1000}
    foreign = {**reading, "session_id": theirs}
    stop, released, accepted = _beat(
        world, plain, {"node": "n2", "running": [mine, "ghost"], "readings": [reading, foreign]}
    )
    assert stop == ["ghost"] and released == []
    assert [r.session_id for r in accepted] == [mine]  # the other node's session is not this agent's word
    # Ended: the other node's session is ignored; this node's is released.
    _, released, _ = _beat(
        world,
        plain,
        {"node": "n2", "ended": [{"session": theirs, "exit_code": 1}, {"session": mine, "exit_code": 3}]},
    )
    assert released == [mine]
    with database.session_scope(world) as db:
        s = db.get(ComputeSession, mine)
        assert (s.status, s.exit_code) == ("ERROR", 3) and "ended on node n2" in s.status_reason
        assert db.get(ComputeSession, theirs).status == "SCHEDULED"
    _ledger_matches(world)
    stop, _, _ = _beat(world, plain, {"node": "n2", "running": [mine]})
    assert stop == [mine]  # released: the agent is to stop it


def test_the_nodes_mps_state_reaches_the_node_and_its_sessions(world):
    _, plain = _token(world, resource_group="edge")
    pipe = "/run/labfleet/mps"
    _register(world, plain, _body(mps={"state": "on", "reason": None, "pipe_dir": pipe}))
    assert _node(world, "n2")["mps"] == {"state": "on", "reason": None, "pipe_dir": pipe}
    assert _node(world, "n1")["mps"] == {"state": "off", "reason": None, "pipe_dir": None}  # never reported
    sid, _, node = _admit(world, **{"gpu.shares": 0.5})
    with database.session_scope(world) as db:
        view = sessions.session_view(db.get(ComputeSession, sid))
    assert node == "n2" and view["node_mps"] == {"state": "on", "reason": None, "pipe_dir": pipe}
    # The daemon died and could not restart: the next heartbeat says so, and no pipe is offered.
    died = {"state": "failed", "reason": "the MPS daemon died; retrying in 2 s", "pipe_dir": pipe}
    _beat(world, plain, {"node": "n2", "mps": died})
    assert _node(world, "n2")["mps"] == {**died, "pipe_dir": None}
    _beat(world, plain, {"node": "n2"})  # a heartbeat without a report changes nothing
    assert _node(world, "n2")["mps"]["state"] == "failed"
    for bad in (
        {"state": "yes"},
        {"state": "on"},  # on without its pipe directory
        {"state": "on", "pipe_dir": "relative/pipe"},
        {"state": "off", "reason": 3},
        {"state": "off", "surprise": 1},
        "on",
    ):
        with pytest.raises(LabfleetError) as e:
            _beat(world, plain, {"node": "n2", "mps": bad})
        assert e.value.status == 400, bad
        with pytest.raises(LabfleetError) as e:
            _register(world, plain, _body(mps=bad))
        assert e.value.status == 400, bad
    assert _node(world, "n2")["mps"]["state"] == "failed"


def test_bad_heartbeats_are_refused_and_change_nothing(world):
    _, plain = _token(world, resource_group="edge")
    _, other = _token(world)
    _register(world, plain, _body())
    with database.session_scope(world) as db:
        seen = db.scalar(select(Node.last_seen).where(Node.name == "n2"))
    now = time.time()
    for bad in (
        [],
        {"running": []},
        {"node": "n2", "running": "all"},
        {"node": "n2", "running": [1]},
        {"node": "n2", "ended": [{"session": "x", "exit_code": "0"}]},
        {"node": "n2", "ended": [{"exit_code": 0}]},
        {"node": "n2", "readings": [{"session_id": "x"}]},
        {"node": "n2", "readings": [{"session_id": "x", "at": now - 86400, "alive": True}]},
        {"node": "n2", "readings": [{"session_id": "x", "at": now, "alive": True, "cpu_seconds": -1}]},
        {"node": "n2", "readings": [{"session_id": "x", "at": now, "alive": "yes"}]},
        {
            "node": "n2",
            "readings": [
                {"session_id": "x", "at": now, "alive": True, "gpus": [{"uuid": "u", "util_percent": 400}]}
            ],
        },
        {"node": "n2", "readings": "none"},
        {"node": "n2", "surprise": 1},
    ):
        with pytest.raises(LabfleetError) as e:
            _beat(world, plain, bad)
        assert e.value.status == 400, bad
    with pytest.raises(LabfleetError) as e:
        _beat(world, other, {"node": "n2"})  # not this token's node
    assert e.value.status == 403
    with pytest.raises(LabfleetError) as e:
        _beat(world, plain, {"node": "n9"})
    assert e.value.status == 404
    with database.session_scope(world) as db:
        assert db.scalar(select(Node.last_seen).where(Node.name == "n2")) == seen


# ---------------------------------------------------------------- the lifecycle


def test_a_node_that_misses_heartbeats_is_lost_and_frees_its_sessions(world):
    _, plain = _token(world, resource_group="edge")
    _register(world, plain, _body())
    held = [_admit(world, **{"gpu.shares": 0.5})[0] for _ in range(3)]
    queued, status, _ = _admit(world, gpu=2)
    assert status == "PENDING"
    assert _node(world, "n2")["allocated"]["gpu.shares"] == 1.5
    stopped: list[tuple[str, str]] = []

    async def stop_server(user, server):
        stopped.append((user, server))
        return True

    log = logging.getLogger("test")
    # Not yet: within the heartbeats allowed.
    assert asyncio.run(jobs.watch_nodes(world, stop_server, log, heartbeat=10, lost_after=3)) == {}
    later = utcnow() + timedelta(seconds=31)
    # Heartbeats missed while the service was down do not count.
    assert (
        asyncio.run(
            jobs.watch_nodes(world, stop_server, log, heartbeat=10, lost_after=3, since=later, now=later)
        )
        == {}
    )
    lost = asyncio.run(jobs.watch_nodes(world, stop_server, log, heartbeat=10, lost_after=3, now=later))
    assert sorted(s.id for s in lost["n2"]) == sorted(held)
    assert len(stopped) == 3 and {u for u, _ in stopped} == {"alice"}
    view = _node(world, "n2")
    assert view["status"] == "LOST" and view["allocated"]["gpu.shares"] == 0
    with database.session_scope(world) as db:
        for sid in held:
            s = db.get(ComputeSession, sid)
            assert s.status == "ERROR" and s.status_reason.startswith("node lost")
        assert db.scalar(select(func.count()).select_from(Allocation)) == 0
        assert db.get(ComputeSession, queued).status == "PENDING"  # a LOST node takes nothing new
        actions = [e.action for e in db.scalars(select(AuditEntry))]
        assert actions.count("session.node-lost") == 3 and "node.lost" in actions
    _ledger_matches(world)
    # A LOST node gets no new placement; a request it could hold waits for it (it may come back),
    # one no node of the group could ever hold is refused.
    late, status, node = _admit(world, **{"gpu.shares": 0.25})
    assert (status, node) == ("PENDING", None)
    with pytest.raises(LabfleetError) as e:
        _admit(world, gpu=9)
    assert e.value.status == 409 and "could ever hold" in e.value.message
    # The agent comes back: ALIVE, and the queue is served.
    stop, _, _ = _beat(world, plain, {"node": "n2", "running": held})
    assert sorted(stop) == sorted(held)
    assert _node(world, "n2")["status"] == "ALIVE"
    with database.session_scope(world) as db:
        for group in ("edge",):
            sessions.schedule_group(db, nodes.get_group(db, CLI, group))
    with database.session_scope(world) as db:
        assert db.get(ComputeSession, queued).status == "SCHEDULED"
        assert db.get(ComputeSession, late).status == "PENDING"  # both GPUs went to the first in line
    _ledger_matches(world)


def test_the_service_node_is_never_lost(world):
    with database.session_scope(world) as db:
        beats = agents.node_beats(db)
    far = utcnow() + timedelta(days=1)
    assert agents.judge(beats, far, 10, 3) == []


def test_drained_nodes_get_no_new_placement_and_keep_what_runs(world):
    _, plain = _token(world)  # group default, beside the service's own node n1 (1 GPU)
    _register(world, plain, _body())
    assert _node(world, "n2")["resource_group"] == "default"
    _refused(world, lambda db: agents.set_schedulable(db, MONITOR, "n2", {"schedulable": False}), 403)
    _refused(world, lambda db: agents.set_schedulable(db, CLI, "n2", {"schedulable": "no"}), 400)
    _refused(world, lambda db: agents.set_schedulable(db, CLI, "n2", {}), 400)
    _refused(world, lambda db: agents.set_schedulable(db, CLI, "n9", {"schedulable": False}), 404)
    with database.session_scope(world) as db:
        agents.set_schedulable(db, CLI, "n1", {"schedulable": False})
    running, _, node = _admit(world, "default", **{"gpu.shares": 0.5})
    assert node == "n2"
    with database.session_scope(world) as db:
        agents.set_schedulable(db, CLI, "n1", {"schedulable": True})
        assert agents.set_schedulable(db, CLI, "n2", {"schedulable": False}).schedulable is False
    assert _node(world, "n2")["schedulable"] is False
    # New sessions go to n1 only; once it is full they wait, though n2 has room.
    placed = [_admit(world, "default", **{"gpu.shares": 0.5}) for _ in range(3)]
    assert [(st, n) for _, st, n in placed] == [("SCHEDULED", "n1"), ("SCHEDULED", "n1"), ("PENDING", None)]
    with database.session_scope(world) as db:
        assert db.get(ComputeSession, running).status == "SCHEDULED"  # what ran there stays
        agents.set_schedulable(db, CLI, "n2", {"schedulable": True})
    with database.session_scope(world) as db:
        sessions.schedule_group(db, nodes.get_group(db, CLI, "default"))
    with database.session_scope(world) as db:
        waiting = db.get(ComputeSession, placed[2][0])
        assert waiting.status == "SCHEDULED" and waiting.node.name == "n2"
        actions = [e.action for e in db.scalars(select(AuditEntry))]
        assert "node.drain" in actions and "node.undrain" in actions
        # Every node drained: a new request waits for one to be undrained, it is not refused
        for name in ("n1", "n2"):
            agents.set_schedulable(db, CLI, name, {"schedulable": False})
    _, status, node = _admit(world, "default", cpu=0.1)
    assert (status, node) == ("PENDING", None)
    _ledger_matches(world)


def test_agent_readings_are_accounted_like_the_services_own(world):
    _, plain = _token(world, resource_group="edge")
    _register(world, plain, _body())
    sid, _, _ = _admit(world, **{"gpu.shares": 0.5})
    with database.session_scope(world) as db:
        s = db.get(ComputeSession, sid)
        s.runtime = {"pid": 4242}
        sessions.set_status(s, "RUNNING")
    for cpu in (10.0, 12.5):
        time.sleep(0.3)  # readings after the session started holding
        body = {
            "node": "n2",
            "running": [sid],
            "readings": [
                {
                    "session_id": sid,
                    "at": time.time(),
                    "alive": True,
                    "cpu_seconds": cpu,
                    "mem_bytes": 5000,
                }
            ],
        }
        _, _, accepted = _beat(world, plain, body)
        assert len(accepted) == 1
        with database.session_scope(world) as db:
            records.accrue(db, accepted, max_gap=30)
    with database.session_scope(world) as db:
        figures = {st.session_id: st for st in records.live_figures(db)}
        assert figures[sid].cpu_total == 12.5 and figures[sid].mem_now == 5000


# ---------------------------------------------------------------- the CLI


def _cli(url, *args):
    return subprocess.run(
        [sys.executable, "-m", "labfleet.cli", *args, "--db-url", url],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_token_and_node_cli(world):
    url = world.url
    made = _cli(url, "node", "token", "create", "--node", "n2", "--resource-group", "edge", "--note", "rack")
    assert made.returncode == 0, made.stderr
    plain = made.stdout.strip().splitlines()[-1]
    assert plain.startswith("lfnode_")
    listed = _cli(url, "node", "token", "list")
    assert listed.returncode == 0 and "n2" in listed.stdout and plain not in listed.stdout
    _register(
        world, plain, _body(mps={"state": "failed", "reason": "nvidia-cuda-mps-control is not on PATH"})
    )
    nodes_out = _cli(url, "node", "list")
    assert nodes_out.returncode == 0 and "n2" in nodes_out.stdout and "agent" in nodes_out.stdout
    assert "failed (nvidia-cuda-mps-control is not on PATH)" in nodes_out.stdout  # the node's MPS, and why
    assert _cli(url, "node", "drain", "n2").returncode == 0
    assert _node(world, "n2")["schedulable"] is False
    assert _cli(url, "node", "undrain", "n2").returncode == 0
    assert _node(world, "n2")["schedulable"] is True
    before = _counts(world)
    for bad in (
        ("node", "token", "create", "--resource-group", "nope"),
        ("node", "token", "create", "--node", "bad name"),
        ("node", "token", "revoke", "abc"),
        ("node", "token", "revoke", "999"),
        ("node", "drain", "n9"),
        ("node", "token", "create", "--bogus"),
    ):
        p = _cli(url, *bad)
        assert p.returncode != 0 and p.stderr.startswith("labfleet: error:"), (bad, p.stderr)
    assert _counts(world) == before
    assert _cli(url, "node", "token", "revoke", plain.split("_")[1]).returncode == 0
    with database.session_scope(world) as db, pytest.raises(LabfleetError):
        agents.authenticate(db, plain)
