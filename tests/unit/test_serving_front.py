"""A replica's authenticating front (labfleet.session.front): the request head's checks (pure), and a real
front on 127.0.0.1 in front of real servers: 401 without the credential, a wrong one or two of them;
what passes has the credential taken out and streams both ways (a body, server-sent events piece by
piece, a websocket); its own answers (the command down, the connect probe, bad heads); and how a
session learns its credential from the service."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
from typing import Any

import pytest
from tornado import web, websocket
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from labfleet.serving import credentials
from labfleet.session.front import (
    MAX_HEAD,
    UNAUTHORIZED,
    ReplicaFront,
    answer,
    authorized,
    closing_head,
    credential_source,
    forwarded_head,
    interim,
    parse_head,
    wants_probe,
)

CRED = credentials.credential(credentials.derive_key(b"front test"), "ep", 1)
OTHER = credentials.credential(credentials.derive_key(b"front test"), "ep", 2)
H = credentials.HEADER


def _head(*fields: str, line: str = "GET /v1/x?q=1 HTTP/1.1") -> bytes:
    return ("\r\n".join([line, *fields]) + "\r\n\r\n").encode()


# ---------------------------------------------------------------- pure


def test_the_credential_must_be_there_once_and_right():
    assert authorized(parse_head(_head("Host: x", f"{H}: {CRED}")), CRED)
    assert authorized(parse_head(_head(f"{H.lower()}:   {CRED}  ")), CRED)  # any case, spaces around
    for fields in (
        [],
        [f"{H}: {OTHER}"],
        [f"{H}: {CRED[:-1]}"],
        [f"{H}: "],
        [f"{H}: {CRED}", f"{H}: {CRED}"],
    ):
        assert not authorized(parse_head(_head("Host: x", *fields)), CRED), fields
    assert not authorized(parse_head(_head(f"Authorization: Bearer {CRED}")), CRED)  # not another field


@pytest.mark.parametrize(
    "raw",
    [
        b"\r\n\r\n",
        b"GET /\r\n\r\n",  # HTTP/0.9
        b"GET / HTTP/2\r\n\r\n",
        b"GET  / HTTP/1.1\r\n\r\n",
        b"G@T / HTTP/1.1\r\n\r\n",
        _head("Host x"),  # no colon
        _head("Host : x"),  # space before the colon (RFC 9112: refused)
        _head("Host: x", " folded"),  # an obsolete folded line
        _head(f"{H}\x00: {CRED}"),
    ],
)
def test_malformed_heads_are_refused(raw):
    assert parse_head(raw) is None


def test_what_the_model_gets():
    head = parse_head(
        _head(
            f"{H}: {CRED}",
            "Host: r",
            "Connection: keep-alive",
            "Keep-Alive: 5",
            "X-Labfleet-Replica-Probe: x",
        )
    )
    assert forwarded_head(head) == b"GET /v1/x?q=1 HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n"
    ws = parse_head(_head(f"{H}: {CRED}", "Connection: keep-alive, Upgrade", "Upgrade: websocket"))
    assert ws.upgrade and not head.upgrade
    assert forwarded_head(ws) == (
        b"GET /v1/x?q=1 HTTP/1.1\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n"
    )
    assert wants_probe(parse_head(_head("X-Labfleet-Replica-Probe: Connect"))) and not wants_probe(head)


def test_the_caller_hears_that_the_connection_closes():
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\n"
    assert closing_head(raw) == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n"
    assert interim(b"HTTP/1.1 100 Continue\r\n\r\n") and interim(b"HTTP/1.1 103 Early Hints\r\n\r\n")
    assert not interim(b"HTTP/1.1 101 Switching Protocols\r\n\r\n") and not interim(raw)


def test_the_fronts_own_answers():
    assert UNAUTHORIZED.startswith(b"HTTP/1.1 401 Unauthorized\r\n") and b"WWW-Authenticate: " in UNAUTHORIZED
    body = UNAUTHORIZED.split(b"\r\n\r\n", 1)[1]
    assert json.loads(body)["status"] == 401 and CRED.encode() not in UNAUTHORIZED
    assert answer(204) == b"HTTP/1.1 204 No Content\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n"
    assert repr(ReplicaFront(CRED, 1)).find(CRED) == -1  # never shown


# ---------------------------------------------------------------- a real front


class Echo(web.RequestHandler):
    """The model: answers what it got (headers, body); /events streams two events, the second once
    the caller has seen the first."""

    async def get(self, path):
        if path == "events":
            self.set_header("Content-Type", "text/event-stream")
            self.write("data: first\n\n")
            await self.flush()
            await self.settings["go"].wait()
            self.write("data: second\n\n")
            return
        self.finish({"path": path, "headers": dict(self.request.headers)})

    def post(self, path):
        self.finish({"path": path, "length": len(self.request.body), "headers": dict(self.request.headers)})


class WSEcho(websocket.WebSocketHandler):
    def on_message(self, message):
        self.write_message(f"echo:{message}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def replica():
    go = asyncio.Event()
    app = web.Application([(r"/ws", WSEcho), (r"/(.*)", Echo)], go=go)
    sockets = bind_sockets(0, "127.0.0.1")
    model = HTTPServer(app)
    model.add_sockets(sockets)
    front = ReplicaFront(CRED, sockets[0].getsockname()[1])
    await front.start("127.0.0.1", 0)
    port = front.server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", front, go, model
    front.close()
    model.stop()


async def _fetch(url: str, **kw: Any):
    return await AsyncHTTPClient().fetch(url, raise_error=False, **kw)


async def test_without_the_credential_nothing_reaches_the_model(replica):
    url, front, _, _ = replica
    for headers in ({}, {H: OTHER}, {"Authorization": f"Bearer {CRED}"}):
        r = await _fetch(url + "/x", headers=headers)
        assert r.code == 401 and r.headers["Content-Type"].startswith("application/json"), r.body
        assert json.loads(r.body)["message"].startswith("this is a replica of a model-serving endpoint")
    # A refused POST with a large body still gets its 401 (the body is read and dropped, not reset).
    r = await _fetch(url + "/x", method="POST", body=b"x" * (3 << 20))
    assert r.code == 401
    assert front.passed == 0 and front.refused == 4


async def test_with_it_requests_pass_without_the_credential(replica):
    url, front, _, _ = replica
    r = await _fetch(url + "/v1/models?q=1", headers={H: CRED, "X-Other": "kept"})
    assert r.code == 200, r.body
    got = json.loads(r.body)
    assert got["path"] == "v1/models" and got["headers"]["X-Other"] == "kept"
    assert not any(k.lower().startswith("x-labfleet-replica") for k in got["headers"])
    post = await _fetch(url + "/gen", method="POST", body=b"y" * 500_000, headers={H: CRED})
    assert post.code == 200 and json.loads(post.body)["length"] == 500_000
    assert front.passed == 2


async def test_a_keep_alive_caller_is_told_to_reconnect(replica):
    url, front, _, _ = replica
    host, port = url.removeprefix("http://").split(":")

    def calls() -> list[tuple[int, str | None]]:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        out = []
        for _ in range(3):  # http.client reconnects by itself once an answer says the connection closes
            conn.request("GET", "/x", headers={H: CRED, "Connection": "keep-alive"})
            r = conn.getresponse()
            r.read()
            out.append((r.status, r.getheader("Connection")))
        conn.close()
        return out

    assert await asyncio.to_thread(calls) == [(200, "close")] * 3
    assert front.passed == 3


async def test_server_sent_events_stream_through_in_pieces(replica):
    url, _, go, _ = replica
    seen: list[bytes] = []
    first = asyncio.Event()

    def chunk(data: bytes) -> None:
        seen.append(data)
        first.set()

    fetch = asyncio.ensure_future(_fetch(url + "/events", headers={H: CRED}, streaming_callback=chunk))
    await asyncio.wait_for(first.wait(), 10)
    assert b"".join(seen).endswith(b"data: first\n\n") and b"second" not in b"".join(seen)
    go.set()  # the model writes the second event only now: the front did not wait for the whole answer
    r = await asyncio.wait_for(fetch, 10)
    assert r.code == 200 and b"".join(seen).endswith(b"data: second\n\n")


async def test_websockets_pass_both_ways(replica):
    url, _, _, _ = replica
    ws_url = url.replace("http://", "ws://") + "/ws"
    conn = await websocket.websocket_connect(HTTPRequest(ws_url, headers={H: CRED}))
    for i in range(3):
        await conn.write_message(f"hi {i}")
        assert await asyncio.wait_for(conn.read_message(), 10) == f"echo:hi {i}"
    conn.close()
    with pytest.raises(Exception) as e:
        await websocket.websocket_connect(HTTPRequest(ws_url))
    assert getattr(e.value, "code", None) == 401


async def test_the_command_down_the_probe_and_bad_heads(replica):
    url, front, _, model = replica
    probe = {H: CRED, credentials.PROBE_HEADER: "connect"}
    assert (await _fetch(url + "/", headers=probe)).code == 204
    assert (await _fetch(url + "/", headers={credentials.PROBE_HEADER: "connect"})).code == 401
    model.stop()  # the command is gone
    await asyncio.sleep(0.1)
    for headers in (probe, {H: CRED}):
        r = await _fetch(url + "/x", headers=headers)
        assert r.code == 502 and r.headers[credentials.REFUSED_HEADER] == "1", r.body
    host, port = url.removeprefix("http://").split(":")
    for raw, status in (
        (b"NOT HTTP\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * MAX_HEAD + b"\r\n\r\n", b"431"),
    ):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(raw)
        line = await asyncio.wait_for(reader.readline(), 10)
        assert line.split(b" ")[1] == status, line
        writer.close()
    front.close()  # stops listening: a caller's connection is refused (the router tries another replica)
    with pytest.raises(OSError):
        await asyncio.open_connection(host, int(port))


# ---------------------------------------------------------------- the credential from the service


async def test_a_session_asks_the_service_for_its_credential():
    answers: list[tuple[int, dict]] = []
    asked: list[str] = []

    class Service(web.RequestHandler):
        def get(self, sid):
            asked.append(self.request.headers.get("Authorization", ""))
            status, body = answers.pop(0)
            self.set_status(status)
            self.finish(body)

    sockets = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(web.Application([(r"/api/sessions/([^/]+)/replica-credential", Service)]))
    server.add_sockets(sockets)
    env = {
        "LABFLEET_SESSION_ID": "s-1",
        "LABFLEET_SERVICE_URL": f"http://127.0.0.1:{sockets[0].getsockname()[1]}/api",
        "JUPYTERHUB_API_TOKEN": "session-token",
    }
    try:
        assert credential_source({}) is None and credential_source({"LABFLEET_SESSION_ID": "x"}) is None
        fetch = credential_source(env, timeout=5)
        answers[:] = [(200, {"replica": True, "credential": CRED})]
        assert await fetch() == CRED and asked == ["token session-token"]
        answers[:] = [(200, {"replica": False, "credential": None})]
        assert await fetch() is None  # a plain inference session
        # The service not answering (or not knowing the session yet): asked again; in the end, the
        # replica fails rather than run without its front.
        answers[:] = [
            (502, {}),
            (404, {"status": 404, "message": "no"}),
            (200, {"replica": True, "credential": CRED}),
        ]
        assert await fetch() == CRED
        answers[:] = [(503, {})] * 10
        with pytest.raises(RuntimeError, match="did not give this replica its credential"):
            await credential_source(env, timeout=1)()
    finally:
        server.stop()
