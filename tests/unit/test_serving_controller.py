"""The serving controller's decisions on a real (SQLite) DB with a fake Hub: replicas started as inference
sessions, health, a crashed replica FAILED with its reason and replaced after the backoff, scale down,
destroy; replicas called at their session's address, with their credential (derived, one per replica),
health checks through a real replica front. The real-Hub test (tests/test_serving_hub.py) runs the same
against real servers."""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from labfleet.core.authz import Actor
from labfleet.core.database import session_scope
from labfleet.core.http import HTTPReply
from labfleet.core.models import ServingEndpoint
from labfleet.serving import credentials, endpoints
from labfleet.serving.controller import ServingController, _Probe, replica_address, replica_host, suspension
from labfleet.serving.definition import HealthCheck, parse_definition
from labfleet.session.front import ReplicaFront
from labfleet.tenancy import directory
from labfleet.tenancy.policies import ensure_default_keypair_policy
from tests.dbfixture import fresh_db

DEFINITION = "models:\n- service:\n    start_command: [python3, server.py, '8000']\n    port: 8000\n"


class FakeHub:
    api_url = "http://127.0.0.1:1/hub/api"
    token = "t"

    def __init__(self) -> None:
        self.servers: dict[str, str] = {}
        self.started: list[tuple[str, str, dict[str, Any]]] = []

    async def user_servers(self, user: str) -> dict[str, str] | None:
        return dict(self.servers)

    async def start_server(self, user: str, server: str, user_options: dict[str, Any]) -> HTTPReply:
        self.started.append((user, server, user_options))
        self.servers[server] = "spawn"
        return HTTPReply(202)


@pytest.fixture
def world(tmp_path, monkeypatch):
    engine, factory = fresh_db(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path, monkeypatch)
    cli = Actor.cli()
    with session_scope(factory) as db:
        ensure_default_keypair_policy(db)
        directory.create_domain(db, cli, {"name": "acme"})
        directory.create_project(db, cli, {"domain": "acme", "name": "ml"})
        user = directory.create_user(db, cli, {"username": "alice", "domain": "acme", "projects": ["ml"]})
        project = user.projects[0]
        db.add(
            ServingEndpoint(
                id=str(uuid.uuid4()),
                name="echo",
                user_id=user.id,
                project_id=project.id,
                domain_id=user.domain_id,
                vfolder_id=None,
                folder_name="model",
                slots={"cpu": 1, "gpu.shares": 0.25},
                env={},
                definition=parse_definition(DEFINITION).to_json(),
                replicas=2,
                open_to_public=False,
                status="PENDING",
                status_reason="",
                failure_streak=0,
                requests=0,
                errors=0,
                latency_ms_total=0.0,
            )
        )
    hub = FakeHub()
    eng = ServingController(factory, hub, logging.getLogger("test"), interval=0)  # checks at every tick
    healthy: set[int] = set()
    eng.probed = []  # (route id, host, credential) of every health check

    async def probe(route_id, host, port, hc, credential):
        eng.probed.append((route_id, host, credential))
        return _Probe(route_id, route_id in healthy, "" if route_id in healthy else "refused")

    async def stop(owner, server):
        hub.servers.pop(server, None)

    monkeypatch.setattr(eng, "_probe", probe)
    monkeypatch.setattr(eng, "_stop", stop)
    yield factory, hub, eng, healthy
    engine.dispose()


def _endpoint(factory) -> dict[str, Any]:
    with session_scope(factory) as db:
        return endpoints.view(endpoints.readable(db, Actor.cli(), "echo"))


async def _settle(eng):
    """A tick, and the start requests it made."""
    await eng.tick()
    for task in list(eng._starting.values()):
        await task


async def test_replicas_start_become_healthy_fail_and_are_replaced(world):
    factory, hub, eng, healthy = world
    await _settle(eng)
    assert [s for _, s, _ in hub.started] == ["echo-r1", "echo-r2"]
    user, server, options = hub.started[0]
    assert user == "alice" and options["type"] == "inference" and options["project"] == "acme/ml"
    assert options["gpu"] == "0.25" and options["cpu"] == "1"
    port = _endpoint(factory)["routes"][0]["address"].rsplit(":", 1)[1]
    # The command listens on the session's loopback at the port its runner puts in place of {port};
    # the replica's port (the runner's front, where the router calls) is the session's `port`.
    assert "export HOST=127.0.0.1\n" in options["command"]
    assert options["port"] == int(port)
    assert options["command"].endswith("exec python3 server.py {port}")
    # No credential in what the Hub is given (user_options show in its admin page and API).
    assert "lfrc_" not in str(options) and credentials.HEADER not in str(options)
    assert _endpoint(factory)["status"] == "DEPLOYING"

    hub.servers = {"echo-r1": "ready", "echo-r2": "ready"}
    healthy.update({1, 2})
    await _settle(eng)  # RUNNING (checked from the next tick on)
    await _settle(eng)
    ep = _endpoint(factory)
    assert (ep["status"], ep["status_reason"], ep["healthy_replicas"]) == (
        "READY",
        "2 of 2 replicas healthy",
        2,
    )
    assert [r.route_id for r in eng.table["echo"].replicas] == [1, 2]
    # Every replica has its own credential; the health checks and the router's table carry it.
    creds = {r.route_id: r.credential for r in eng.table["echo"].replicas}
    assert len(set(creds.values())) == 2 and all(c.startswith("lfrc_") for c in creds.values())
    assert {(rid, c) for rid, _h, c in eng.probed} == set(creds.items())

    # r1's server goes away: FAILED with the reason, out of the table; the replacement waits for the backoff.
    del hub.servers["echo-r1"]
    await _settle(eng)
    ep = _endpoint(factory)
    failed = next(r for r in ep["routes"] if r["server"] == "echo-r1")
    assert failed["status"] == "FAILED" and "never became a session" in failed["last_error"]
    assert ep["status"] == "READY" and ep["status_reason"] == "1 of 2 replicas healthy"
    assert [r.route_id for r in eng.table["echo"].replicas] == [2]
    assert len(hub.started) == 2
    with session_scope(factory) as db:
        e = endpoints.find(db, "echo")
        assert e.failure_streak == 1 and e.next_start_at > datetime.now(timezone.utc)
        e.next_start_at = datetime.now(timezone.utc) - timedelta(seconds=1)  # the backoff is over
    await _settle(eng)
    assert [s for _, s, _ in hub.started][-1] == "echo-r3"


async def test_unhealthy_replica_is_replaced_scale_down_and_destroy(world):
    factory, hub, eng, healthy = world
    await _settle(eng)
    hub.servers = {"echo-r1": "ready", "echo-r2": "ready"}
    healthy.add(1)  # r2 never answers: more than 3 failed connects in a row and it is replaced
    for _ in range(6):
        await _settle(eng)
    ep = _endpoint(factory)
    r2 = next(r for r in ep["routes"] if r["server"] == "echo-r2")
    assert r2["status"] == "FAILED" and r2["last_error"].startswith("unhealthy after 4 failed checks")
    assert "echo-r2" not in hub.servers  # stopped

    with session_scope(factory) as db:
        endpoints.update(db, Actor.cli(), "echo", {"replicas": 1})
    with session_scope(factory) as db:
        endpoints.find(db, "echo").next_start_at = None
    await _settle(eng)
    ep = _endpoint(factory)
    assert ep["active_replicas"] == 1 and ep["healthy_replicas"] == 1
    # The healthy one stays; any other (a replacement still starting) goes.
    assert [r["server"] for r in ep["routes"] if r["status"] == "RUNNING"] == ["echo-r1"]

    with session_scope(factory) as db:
        endpoints.destroy(db, Actor.cli(), "echo")
    await _settle(eng)
    await _settle(eng)
    ep = _endpoint(factory)
    assert ep["status"] == "DESTROYED" and ep["active_replicas"] == 0
    assert not hub.servers and "echo" not in eng.table


@pytest.mark.parametrize(
    "labels, host",
    [
        (None, "127.0.0.1"),  # a session with no node, or the local backend's node
        ({}, "127.0.0.1"),
        ({"address": "10.77.0.2", "swarm.node_id": "x"}, "10.77.0.2"),  # a Swarm node
        ({"address": "node-2.example"}, "node-2.example"),
        ({"address": "bad host/x"}, "127.0.0.1"),  # neither: not routed to
        ({"address": 7}, "127.0.0.1"),
    ],
)
def test_a_replica_is_called_at_its_nodes_address(labels, host):
    assert replica_host(labels) == host


@pytest.mark.parametrize(
    "runtime, labels, host",
    [
        ({"pid": 7, "address": "10.216.0.5"}, None, "10.216.0.5"),  # a local session's own network
        ({"container": "ab" * 6, "address": "10.0.3.4"}, {"address": "10.77.0.2"}, "10.0.3.4"),
        ({"pid": 7}, {"address": "10.77.0.2"}, "10.77.0.2"),  # none of its own: its node's
        ({"pid": 7}, None, "127.0.0.1"),  # the host's network
        ({"pid": 7, "address": "not an address"}, None, "127.0.0.1"),
        (None, None, "127.0.0.1"),
    ],
)
def test_a_replica_is_called_at_its_sessions_address(runtime, labels, host):
    assert replica_address(runtime, labels) == host


async def test_the_route_takes_the_address_its_session_reported(world, monkeypatch):
    factory, hub, eng, healthy = world
    await _settle(eng)
    sessions = {
        "echo-r1": SimpleNamespace(id="s-1", runtime={"pid": 9, "address": "10.216.0.5"}, node=None),
        "echo-r2": SimpleNamespace(id="s-2", runtime={"pid": 10}, node=None),
    }
    monkeypatch.setattr(eng, "_session", lambda db, e, r: sessions[r.server])
    hub.servers = {"echo-r1": "ready", "echo-r2": "ready"}
    healthy.update({1, 2})
    await _settle(eng)
    await _settle(eng)
    routes = {r["server"]: r for r in _endpoint(factory)["routes"]}
    assert routes["echo-r1"]["address"].startswith("10.216.0.5:") and routes["echo-r1"]["session_id"] == "s-1"
    assert routes["echo-r2"]["address"].startswith("127.0.0.1:")
    assert {r.route_id: r.host for r in eng.table["echo"].replicas} == {1: "10.216.0.5", 2: "127.0.0.1"}
    assert {h for rid, h, _c in eng.probed if rid == 1} == {"10.216.0.5"}


def test_credentials_are_derived_one_per_replica_and_key():
    key = credentials.derive_key(b"k" * 44)
    a = credentials.credential(key, "ep-1", 1)
    assert a == credentials.credential(key, "ep-1", 1)  # derived again, the same: nothing stored
    assert len({a, credentials.credential(key, "ep-1", 2), credentials.credential(key, "ep-2", 1)}) == 3
    assert a != credentials.credential(credentials.derive_key(b"x" * 44), "ep-1", 1)  # another service key
    assert a.startswith("lfrc_") and len(a) == len("lfrc_") + 43  # 256 bits, URL-safe base64
    assert credentials.matches(a, a) and credentials.matches(a.encode(), a)
    assert not credentials.matches(a[:-1], a) and not credentials.matches(None, a)
    assert not credentials.matches("", a)
    with pytest.raises(ValueError):
        credentials.derive_key(b"")


def test_the_engine_derives_from_the_services_secret_key(world):
    factory, hub, eng, healthy = world
    other = ServingController(factory, hub, logging.getLogger("test"), secret_key=b"another key")
    assert eng.credential("ep", 1) == ServingController(factory, hub, logging.getLogger("t")).credential(
        "ep", 1
    )
    assert eng.credential("ep", 1) != other.credential("ep", 1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_health_checks_go_through_the_replica_front_with_the_credential(world):
    factory, hub, _eng, _ = world
    eng = ServingController(factory, hub, logging.getLogger("test"))  # the real _probe
    cred = eng.credential("ep", 1)
    inner = _free_port()
    front = ReplicaFront(cred, inner)
    await front.start("127.0.0.1", 0)
    assert front.server is not None
    port = front.server.sockets[0].getsockname()[1]
    hc = HealthCheck(path="/health", max_wait_time=3.0)
    try:
        # Nothing behind the front: both kinds of check fail, saying so.
        no_hc = await eng._probe(1, "127.0.0.1", port, None, cred)
        assert not no_hc.ok and "nothing accepts connections behind the replica's front" in no_hc.error
        assert not (await eng._probe(1, "127.0.0.1", port, hc, cred)).ok

        async def model(reader, writer):
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:  # the front's connect check: connected, and gone
                writer.close()
                return
            ok = head.startswith(b"GET /health ") and credentials.HEADER.lower().encode() not in head.lower()
            writer.write(
                b"HTTP/1.1 %d X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n" % (200 if ok else 500)
            )
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(model, "127.0.0.1", inner)
        try:
            assert (await eng._probe(1, "127.0.0.1", port, None, cred)).ok  # the front's connect check
            assert (await eng._probe(1, "127.0.0.1", port, hc, cred)).ok  # the model's own, stripped
            wrong = await eng._probe(1, "127.0.0.1", port, hc, eng.credential("ep", 2))
            assert not wrong.ok and "refused its credential (401)" in wrong.error
        finally:
            server.close()
    finally:
        front.close()
    gone = await eng._probe(1, "127.0.0.1", port, hc, cred)
    assert not gone.ok and "failed" in gone.error  # the front closed: the connection is refused


def test_a_deactivated_domain_or_owner_suspends_an_endpoint():
    assert suspension("acme", True, "alice", True) is None
    assert suspension("acme", False, "alice", True) == "domain acme is inactive"
    # The domain says first: reactivating the owner alone does not serve a deactivated domain's endpoint.
    assert suspension("acme", False, "alice", False) == "domain acme is inactive"
    assert suspension("acme", True, "alice", False) == "its owner alice is inactive"
