"""The serving engine's decisions on a real (SQLite) DB with a fake Hub: replicas started as inference
sessions, health, a crashed replica FAILED with its reason and replaced after the backoff, scale down,
destroy. The real-Hub test (tests/test_serving_hub.py) runs the same against real servers."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from hub_ext.core.authz import Actor
from hub_ext.core.db import session_scope
from hub_ext.core.http import HTTPReply
from hub_ext.core.models import ServingEndpoint
from hub_ext.serving import endpoints
from hub_ext.serving.definition import parse_definition
from hub_ext.serving.engine import ServingEngine, _Probe, replica_host
from hub_ext.tenancy import directory
from hub_ext.tenancy.policies import ensure_default_keypair_policy
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
    eng = ServingEngine(factory, hub, logging.getLogger("test"), interval=0)  # checks at every tick
    healthy: set[int] = set()

    async def probe(route_id, host, port, hc):
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
    assert f'export PORT={port} HOST="${{LABFLEET_INFERENCE_HOST:-127.0.0.1}}"' in options["command"]
    assert options["port"] == int(port)  # the session's runner and its inference page use the same port
    assert options["command"].endswith(f"exec python3 server.py {port}")
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
