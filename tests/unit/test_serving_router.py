"""The router's choice of replica (pure): round robin over those in rotation, least outstanding
requests, replicas that refused skipped while another is left, none twice for one request; and the
router in process in front of real replica fronts: each replica gets its own credential, a caller's
forged one is dropped, a front whose model is down sends the request to the next replica."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from types import SimpleNamespace
from typing import Any

from tornado import web
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.httputil import HTTPHeaders
from tornado.netutil import bind_sockets

from labfleet.serving import credentials
from labfleet.serving.controller import Entry, Replica, ServingController, backoff
from labfleet.serving.router import ServeHandler, _front_refused, _refused, choose, replica_url
from labfleet.session.front import ReplicaFront


def _reps(n):
    return [Replica(route_id=i, host="127.0.0.1", port=10000 + i) for i in range(1, n + 1)]


def test_round_robin_spreads_evenly():
    reps = _reps(3)
    pos, seen = 0, []
    for _ in range(6):
        r, pos = choose(reps, pos)
        seen.append(r.route_id)
    assert seen == [1, 2, 3, 1, 2, 3]


def test_least_outstanding_prefers_the_idle_one_and_rotates_ties():
    reps = _reps(3)
    reps[0].outstanding, reps[1].outstanding, reps[2].outstanding = 4, 1, 1
    picks = [choose(reps, p, how="least_outstanding")[0].route_id for p in range(4)]
    assert picks == [2, 3, 2, 3]


def test_down_replicas_are_skipped_while_another_is_left():
    reps = _reps(2)
    reps[0].down = True
    assert {choose(reps, p)[0].route_id for p in range(4)} == {2}
    reps[1].down = True  # all refused once: try them anyway (one may be back)
    assert choose(reps, 0)[0] is not None


def test_a_request_never_tries_a_replica_twice():
    reps = _reps(2)
    first, pos = choose(reps, 0)
    second, pos = choose(reps, pos, exclude={first.route_id})
    third, _ = choose(reps, pos, exclude={first.route_id, second.route_id})
    assert {first.route_id, second.route_id} == {1, 2} and third is None
    assert choose([], 5) == (None, 5)


def test_refusal_is_told_from_other_errors():
    assert _refused(ConnectionRefusedError(111, "refused"))
    assert not _refused(TimeoutError("slow"))
    assert not _refused(None)


def test_backoff_doubles_up_to_a_minute():
    assert [backoff(n) for n in (0, 1, 2, 3, 6, 7, 50)] == [0.0, 2.0, 4.0, 8.0, 60.0, 60.0, 60.0]


# ---------------------------------------------------------------- the router and replica fronts, in process


def test_the_fronts_refusal_is_told_from_the_models_own_502():
    assert _front_refused(HTTPHeaders({credentials.REFUSED_HEADER: "1"}), 502)
    assert not _front_refused(HTTPHeaders({}), 502)  # the model's own 502: passed on to the caller
    assert not _front_refused(HTTPHeaders({credentials.REFUSED_HEADER: "1"}), 200)
    assert not _front_refused(None, 502)


def test_replica_urls_bracket_ipv6_addresses():
    r = Replica(route_id=1, host="fd00::2", port=9000)
    assert replica_url("http", r, "v1/x", "?q=1") == "http://[fd00::2]:9000/v1/x?q=1"
    assert replica_url("ws", Replica(1, "10.216.0.5", 80), "", "") == "ws://10.216.0.5:80/"


async def _model(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A model that answers with the request head it got."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    body = json.dumps({"head": head}).encode()
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    writer.write(body)
    await writer.drain()
    writer.close()


def _port(server: Any) -> int:
    return server.sockets[0].getsockname()[1]


def _router(engine: ServingController) -> tuple[HTTPServer, str]:
    """The service's serving route on 127.0.0.1 with ``engine``: (its server, endpoint e's URL)."""
    lf = SimpleNamespace(
        serving=engine,
        log=logging.getLogger("test"),
        prefix="/services/labfleet/",
        metrics=SimpleNamespace(observe_serving=lambda *a: None),
    )
    app = web.Application([(r"/services/labfleet/serve/([^/]+)/(.*)", ServeHandler)], labfleet=lf)
    sockets = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(app)
    server.add_sockets(sockets)
    return server, f"http://127.0.0.1:{sockets[0].getsockname()[1]}/services/labfleet/serve/e/x"


async def test_the_router_sends_each_replica_its_credential_and_fails_over_when_the_front_refuses():
    engine = ServingController(None, None, logging.getLogger("test"), secret_key=b"router test")  # type: ignore[arg-type]
    model = await asyncio.start_server(_model, "127.0.0.1", 0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # nothing listens behind replica 1's front
    fronts = [
        ReplicaFront(engine.credential("ep", 1), dead),
        ReplicaFront(engine.credential("ep", 2), _port(model)),
    ]
    for f in fronts:
        await f.start("127.0.0.1", 0)
    replicas = [
        Replica(i + 1, "127.0.0.1", _port(f.server), credential=engine.credential("ep", i + 1))
        for i, f in enumerate(fronts)
    ]
    engine.table["e"] = Entry("ep", "e", True, replicas, {}, 2, "READY")
    server, url = _router(engine)
    try:
        client = AsyncHTTPClient()
        forged = {credentials.HEADER: "lfrc_forged", credentials.PROBE_HEADER: "connect"}
        for _ in range(3):
            r = await client.fetch(url, headers=forged, raise_error=False)
            assert r.code == 200, r.body
            head = json.loads(r.body)["head"].lower()
            # Replica 2's model answered; it saw neither the credential nor the caller's forged headers.
            assert head.startswith("get /x http/1.1") and "x-labfleet-replica" not in head
            assert "connection: close" in head and "x-forwarded-prefix: /services/labfleet/serve/e" in head
        assert replicas[0].down and not replicas[1].down  # replica 1 out of rotation
        assert fronts[0].refused == fronts[1].refused == 0  # both got their own credential
        # Directly, without the credential (or another replica's): 401 from both fronts, the model untouched.
        for f, other in ((fronts[0], 2), (fronts[1], 1)):
            for headers in ({}, {credentials.HEADER: engine.credential("ep", other)}):
                r = await client.fetch(
                    f"http://127.0.0.1:{_port(f.server)}/x", headers=headers, raise_error=False
                )
                assert r.code == 401 and json.loads(r.body)["message"].startswith("this is a replica"), r.body
        assert fronts[1].passed == 3 and fronts[1].refused == 2
    finally:
        server.stop()
        for f in fronts:
            f.close()
        model.close()


async def _dies_on_the_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A model killed while it takes a request: it reads the head and closes without a byte."""
    await reader.readuntil(b"\r\n\r\n")
    writer.close()


async def test_a_replica_that_dies_on_a_request_is_skipped_for_idempotent_methods_only():
    engine = ServingController(None, None, logging.getLogger("test"), secret_key=b"router test")  # type: ignore[arg-type]
    dying = await asyncio.start_server(_dies_on_the_request, "127.0.0.1", 0)
    model = await asyncio.start_server(_model, "127.0.0.1", 0)
    server, url = _router(engine)
    client = AsyncHTTPClient()

    def table() -> list[Replica]:
        reps = [Replica(1, "127.0.0.1", _port(dying)), Replica(2, "127.0.0.1", _port(model))]
        engine.table["e"] = Entry("ep", "e", True, reps, {}, 2, "READY")
        return reps

    try:
        reps = table()
        r = await client.fetch(url, raise_error=False)  # round robin starts at replica 1
        assert r.code == 200 and json.loads(r.body)["head"].startswith("GET /x"), r.body
        assert reps[0].down and not reps[1].down
        # A POST may have reached the model before it died: it is not sent twice.
        reps = table()
        r = await client.fetch(url, method="POST", body=b"{}", raise_error=False)
        assert r.code == 502 and "replica 1 of e did not answer" in json.loads(r.body)["message"], r.body
        assert not reps[0].down
    finally:
        server.stop()
        dying.close()
        model.close()
