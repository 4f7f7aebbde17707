"""labfleet.core.http, the request helper every labfleet HTTP client uses, against a real tornado server
on 127.0.0.1 (a free port): JSON and text answers, errors with the upstream's words, an upstream that
is not there and one that does not answer in time."""

from __future__ import annotations

import asyncio
import json

import pytest
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from labfleet.core import http
from labfleet.core.http import HTTPReply, loggable, request

TOKEN = "s3cret-token"


class _Upstream(web.RequestHandler):
    seen: list[dict] = []
    release: asyncio.Event | None = None

    async def _any(self, path: str) -> None:
        self.seen.append(
            {
                "method": self.request.method,
                "path": path,
                "query": self.request.query,
                "auth": self.request.headers.get("Authorization"),
                "type": self.request.headers.get("Content-Type"),
                "length": self.request.headers.get("Content-Length"),
                "body": self.request.body,
            }
        )
        if path == "json":
            self.finish({"hello": "world"})
        elif path == "text":
            self.set_header("Content-Type", "text/plain")
            self.finish("just words")
        elif path == "html-json":  # tornado's default content type for finish(str)
            self.finish(json.dumps([1, 2]))
        elif path == "missing":
            self.set_status(404)
            self.finish({"message": "no folder named data"})
        elif path == "plain-error":
            self.set_status(409)
            self.set_header("Content-Type", "text/plain")
            self.finish("  busy, try later \n")
        elif path == "broken":
            self.set_status(502)
            self.finish("<html>bad gateway</html>")
        elif path == "bad-json":
            self.set_header("Content-Type", "application/json")
            self.finish("{not json")
        elif path == "empty":
            self.set_status(204)
            self.finish()
        elif path == "moved":
            self.redirect("/elsewhere")
        elif path == "slow":
            assert self.release is not None
            await self.release.wait()
            self.finish({"late": True})
        else:
            self.finish({"method": self.request.method})

    get = post = put = patch = delete = _any


@pytest.fixture
async def upstream():
    sock, port = bind_unused_port()
    srv = HTTPServer(web.Application([(r"/api/(.*)", _Upstream)]))
    srv.add_sockets([sock])
    _Upstream.seen = []
    _Upstream.release = asyncio.Event()
    yield f"http://127.0.0.1:{port}/api"
    _Upstream.release.set()
    srv.stop()


def _closed_port_url() -> str:
    sock, port = bind_unused_port()
    sock.close()  # nobody listens there
    return f"http://127.0.0.1:{port}/api"


async def test_a_json_answer(upstream):
    reply = await request(
        "GET", f"{upstream}/json", token=TOKEN, query={"user": "a b", "x": "1"}, upstream="the test server"
    )
    assert (reply.status, reply.code, reply.ok, reply.is_json) == (200, 200, True, True)
    assert reply.data == {"hello": "world"} and reply.json() == {"hello": "world"}
    assert reply.message == "" and reply.reason == "OK" and reply.content_type.startswith("application/json")
    seen = _Upstream.seen[-1]
    assert seen["auth"] == f"token {TOKEN}" and seen["query"] == "user=a+b&x=1" and seen["body"] == b""
    # the query joins one the URL already has
    await request("GET", f"{upstream}/json?state=active", query={"limit": "5"})
    assert _Upstream.seen[-1]["query"] == "state=active&limit=5" and _Upstream.seen[-1]["auth"] is None


async def test_what_is_sent(upstream):
    await request("POST", f"{upstream}/echo", token=TOKEN, json_body={"users": ["alice"]})
    await request("PUT", f"{upstream}/echo", data=b"12345", content_type="text/csv")
    await request("PUT", f"{upstream}/echo", data=b"\x00\x01")
    await request("POST", f"{upstream}/echo")
    reply = await request("DELETE", f"{upstream}/echo", json_body={"users": ["bob"]})
    assert reply.data == {"method": "DELETE"}
    posted, csv, octets, bare, deleted = _Upstream.seen
    assert posted["type"] == "application/json" and json.loads(posted["body"]) == {"users": ["alice"]}
    assert (csv["type"], csv["length"], csv["body"]) == ("text/csv", "5", b"12345")
    assert octets["type"] == "application/octet-stream" and octets["body"] == b"\x00\x01"
    assert bare["length"] == "0" and bare["body"] == b""
    assert deleted["method"] == "DELETE" and json.loads(deleted["body"]) == {"users": ["bob"]}


async def test_a_text_answer(upstream):
    reply = await request("GET", f"{upstream}/text")
    assert reply.ok and not reply.is_json and reply.data is None
    assert reply.text == "just words" and reply.body == b"just words" and reply.message == ""
    with pytest.raises(ValueError):
        reply.json()
    # JSON sent as tornado's default text/html: not `data`, but json() reads it
    html = await request("GET", f"{upstream}/html-json")
    assert html.data is None and not html.is_json and html.json() == [1, 2]
    # a body that says it is JSON and is not
    bad = await request("GET", f"{upstream}/bad-json")
    assert bad.ok and bad.data is None and not bad.is_json and bad.text == "{not json"
    empty = await request("DELETE", f"{upstream}/empty")
    assert (empty.status, empty.data, empty.body, empty.json()) == (204, None, b"", None)


async def test_errors_carry_the_upstreams_words(upstream):
    missing = await request("GET", f"{upstream}/missing", upstream="the labfleet service")
    assert (missing.status, missing.ok) == (404, False)
    assert missing.message == missing.words == "no folder named data"
    plain = await request("GET", f"{upstream}/plain-error", upstream="the labfleet service")
    assert plain.status == 409 and plain.message == "busy, try later"
    broken = await request("GET", f"{upstream}/broken", upstream="the labfleet service")
    assert broken.words == ""  # an HTML page is no message
    assert broken.message == "the labfleet service answered 502 Bad Gateway"
    moved = await request("GET", f"{upstream}/moved")
    assert moved.status == 302  # answered, not followed
    assert [s["path"] for s in _Upstream.seen] == ["missing", "plain-error", "broken", "moved"]


async def test_an_upstream_that_is_not_there():
    url = _closed_port_url()
    reply = await request("GET", f"{url}/json?token=leak", token=TOKEN, timeout=5, upstream="the Hub")
    assert (reply.status, reply.code, reply.ok, reply.timed_out) == (0, 0, False, False)
    assert reply.error and reply.message.startswith("cannot reach the Hub: ")
    assert TOKEN not in repr(reply) and "leak" not in repr(reply)


async def test_an_upstream_that_does_not_answer_in_time(upstream):
    reply = await request("GET", f"{upstream}/slow", timeout=0.3, upstream="the labfleet service")
    assert (reply.status, reply.timed_out) == (0, True)
    assert reply.message.startswith("the labfleet service did not answer: ")
    assert _Upstream.seen[-1]["path"] == "slow"  # it was asked


async def test_a_bad_url_is_a_reply_and_never_shows_its_query():
    reply = await request("GET", "ftp://127.0.0.1:1/x?token=leak")
    assert reply.status == 0 and "leak" not in reply.error and "leak" not in reply.message


def test_loggable_urls_drop_query_and_credentials():
    assert (
        loggable("http://u:p@127.0.0.1:8/hub/api/users?state=active#x") == "http://127.0.0.1:8/hub/api/users"
    )
    assert loggable("/users?state=active&limit=10") == "/users"
    assert loggable("http://127.0.0.1:8/api/") == "http://127.0.0.1:8/api/"


def test_a_reply_built_by_hand():
    # the Hub side builds replies in tests as HTTPReply(status, data)
    made = HTTPReply(201, {"id": "s1"})
    assert made.ok and made.code == 201 and made.data == {"id": "s1"} and made.message == ""
    said = HTTPReply(503, {"message": "no service here"}, content_type=http.JSON, is_json=True)
    assert said.message == "no service here"
    assert HTTPReply(500).message == "the server answered 500"
    assert HTTPReply(0, error="no service token", upstream="the labfleet service").message == (
        "cannot reach the labfleet service: no service token"
    )
