"""The service's clock through a real Hub (configurable-http-proxy, the labfleet service, local
sessions): with nothing else happening, a queued spawn is cancelled when its group's pending
timeout passes, and a queued spawn starts when a node joins the fleet."""

from __future__ import annotations

import json
import time

import pytest
import requests

from labfleet.compute import nodes
from labfleet.compute.devices.base import NodeInfo
from labfleet.compute.devices.mock import MockPlugin
from labfleet.core import database, unitofwork
from tests.hubfixture import start_hub

pytestmark = pytest.mark.hub

SERVERS = ("a", "b", "q", "q2")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state = tmp_path_factory.mktemp("clock")
    # The default schedule interval (5 s): what a deployment gets.
    hub = start_hub(state, extra_config="c.LabfleetSpawnerMixin.queue_poll_interval = 0.3\n")
    root = hub.wait_token("root")
    for method, path, body in [
        ("POST", "/domains", {"name": "acme"}),
        ("POST", "/projects", {"domain": "acme", "name": "ml"}),
        ("POST", "/users", {"username": "alice", "domain": "acme", "projects": ["ml"]}),
    ]:
        r = hub.api(method, path, root, json=body)
        assert r.status_code == 201, (path, r.text)
    yield hub, root, hub.wait_token("alice")
    for server in SERVERS:
        hub.hub_api("DELETE", f"/users/alice/servers/{server}")
    hub.stop()


def _spawn(hub, server, options):
    r = hub.hub_api("POST", f"/users/alice/servers/{server}", json=options)
    assert r.status_code in (201, 202), r.text


def _server(hub, server):
    return hub.hub_api("GET", "/users/alice").json()["servers"].get(server)


def _wait(cond, what, timeout, hub):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.3)
    raise AssertionError(f"{what} not within {timeout}s\n{hub.log_text()[-3000:]}")


def _take_both_gpus(hub):
    for server in ("a", "b"):
        if not (_server(hub, server) or {}).get("ready"):
            _spawn(hub, server, {"project": "ml", "gpu": 1, "cpu": 0.5})
    for server in ("a", "b"):
        _wait(lambda s=server: (_server(hub, s) or {}).get("ready"), f"alice/{server} ready", 60, hub)


def _pending(hub, token):
    return hub.api("GET", "/sessions", token, params={"status": "PENDING"}).json()


def test_a_queued_spawn_fails_when_the_pending_timeout_passes_with_nothing_else_happening(env):
    hub, root, alice = env
    r = hub.api("PATCH", "/resource-groups/default", root, json={"pending_timeout": 8})
    assert r.status_code == 200, r.text
    _take_both_gpus(hub)
    t0 = time.monotonic()
    _spawn(hub, "q", {"project": "ml", "gpu": 1, "cpu": 0.5})
    # From here on nobody writes anything: only reads (the spawner's polls, this progress stream).
    progress = requests.get(
        f"{hub.url}/hub/api/users/alice/servers/q/progress",
        headers={"Authorization": f"token {alice}"},
        stream=True,
        timeout=(5, 60),
    )
    messages, failed = [], None
    for line in progress.iter_lines(decode_unicode=True):
        if line.startswith("data:"):
            event = json.loads(line[5:])
            messages.append(event.get("message", ""))
            if event.get("failed"):
                failed = event
                break
            if time.monotonic() - t0 > 60:
                break
    progress.close()
    elapsed = time.monotonic() - t0
    # The progress page says why it waits: no whole GPU is free, and for how long it will wait.
    assert any(
        "Queued in resource group default" in m
        and "short of GPUs: asks 1 whole GPU; none is free on any node" in m
        and "it waits up to 8 s, then is cancelled" in m
        for m in messages
    ), messages
    assert failed is not None, messages
    assert "pending timeout of 8s" in failed["message"], failed
    # On time: 8 s plus at most one tick of the clock (5 s) and the spawner's next look.
    assert 7 <= elapsed <= 20, elapsed
    _wait(lambda: not (_server(hub, "q") or {}).get("pending"), "the Hub to give up alice/q", 10, hub)
    assert not (_server(hub, "q") or {}).get("ready")
    # The service's row says why.
    (cancelled,) = [
        s
        for s in hub.api("GET", "/sessions", alice, params={"status": "CANCELLED"}).json()
        if s["name"] == "q"
    ]
    assert "waited longer than the pending timeout of 8s" in cancelled["status_reason"], cancelled
    assert _pending(hub, alice) == []


def test_a_queued_spawn_starts_by_itself_when_a_node_joins(env):
    hub, root, alice = env
    assert hub.api("PATCH", "/resource-groups/default", root, json={"pending_timeout": 0}).status_code == 200
    _take_both_gpus(hub)
    _spawn(hub, "q2", {"project": "ml", "gpu": 1, "cpu": 0.5})
    _wait(lambda: len(_pending(hub, alice)) == 1, "alice/q2 queued", 15, hub)
    (waiting,) = _pending(hub, alice)
    assert waiting["queue_position"] == 1
    assert waiting["waiting_for"] == (
        "short of GPUs: asks 1 whole GPU; none is free on any node; it waits until the capacity is free"
    )
    # Before it is sent, a second such request is flagged: it would wait, and why.
    ask = {"project": "acme/ml", "slots": {"gpu": 1, "cpu": 0.5}}
    r = hub.api("POST", "/sessions/preview", alice, json=ask)
    assert r.status_code == 200, r.text
    assert r.json()["outcome"] == "waits" and "short of GPUs" in r.json()["message"], r.json()
    r = hub.api(
        "GET", "/sessions/preview", alice, params={"request": json.dumps({**ask, "slots": {"cpu": 0.5}})}
    )
    assert r.json()["outcome"] == "starts", r.json()
    # A node joins, outside any request of the API (as a node agent or the CLI would write it).
    engine = database.make_engine(hub.db_url)
    try:
        with database.session_scope(unitofwork.make_session_factory(engine)) as db:
            devices = MockPlugin(devices=[{"model": "A100-80GB", "memory": "80g", "count": 1}], node="n2")
            nodes.register_node(
                db,
                NodeInfo(
                    name="n2", cpu=8, mem=32 * 2**30, devices=devices.discover(), plugin="mock", reason=None
                ),
            )
    finally:
        engine.dispose()
    t0 = time.monotonic()
    _wait(lambda: (_server(hub, "q2") or {}).get("ready"), "alice/q2 ready", 40, hub)
    placed = time.monotonic() - t0
    session = hub.api("GET", f"/sessions/{waiting['id']}", alice).json()
    assert session["status"] == "RUNNING" and session["node"] == "n2", session
    assert placed < 40
