"""The one URL of every endpoint: ``/services/labfleet/serve/<endpoint>/<path>`` through the Hub's proxy.

A request is checked (``Authorization: Bearer <token>`` unless the endpoint is open to the public;
401 without it or with a wrong one; 429 past the token's requests per minute; 403 while the endpoint's
domain or owner is deactivated, see :func:`labfleet.serving.controller.suspension`), then passed to one of
the endpoint's healthy replicas, chosen round robin (``LABFLEET_SERVING_BALANCE=least_outstanding``:
the one with the fewest requests in flight). A replica that refuses the connection is taken out of
rotation and the request goes to the next one; the answer streams back as it comes (server-sent
events arrive piece by piece); a websocket is bridged to one replica's, message by message.
Requests, errors and latency are counted per endpoint and per token.

Every call to a replica carries that replica's credential (``X-Labfleet-Replica-Credential``, see
:mod:`labfleet.serving.credentials`): its front refuses anything else with 401, so the router is the only
way in. A caller's own ``X-Labfleet-Replica-*`` headers are dropped. The front's 502 that says its
command refused the connection (``X-Labfleet-Replica-Refused``) counts as a refused connection.

:func:`choose` is the pure part; :class:`ServeHandler` the tornado handler (the service's routes list
it). The routing table is the engine's (:mod:`labfleet.serving.controller`), rebuilt at every tick.
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from tornado import httputil, web, websocket
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.ioloop import IOLoop
from tornado.iostream import StreamClosedError
from tornado.simple_httpclient import HTTPStreamClosedError

from labfleet.core import passwords
from labfleet.core.database import session_scope
from labfleet.core.models import ServingToken
from labfleet.core.signing import RateLimiter
from labfleet.serving import credentials, endpoints
from labfleet.serving.controller import Entry, Replica, ServingController, token_key

POLICIES = ("round_robin", "least_outstanding")
# Not passed on, either way (RFC 9110 7.6.1), nor what the router sets itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
CONNECT_TIMEOUT = 5.0
REQUEST_TIMEOUT = 600.0
BAD_TOKEN_MEMORY = 30.0  # seconds a wrong token is answered 401 without hashing it again

_REPLICA_HEADERS = "x-labfleet-replica-"  # the router's own to the replica: never a caller's

_client: AsyncHTTPClient | None = None
_limiter = RateLimiter(window=60)
_bad_tokens: dict[str, float] = {}


def policy() -> str:
    p = os.environ.get("LABFLEET_SERVING_BALANCE", "round_robin")
    return p if p in POLICIES else "round_robin"


def choose(
    replicas: Sequence[Replica],
    position: int,
    *,
    how: str = "round_robin",
    exclude: frozenset[int] | set[int] = frozenset(),
) -> tuple[Replica | None, int]:
    """The replica for the next request, and the round robin's next position (pure).

    Replicas marked down (they refused a connection) are skipped while another is left; ``exclude``:
    those this request already tried."""
    fresh = [r for r in replicas if r.route_id not in exclude]
    up = [r for r in fresh if not r.down] or fresh
    if not up:
        return None, position
    if how == "least_outstanding":
        least = min(r.outstanding for r in up)
        tied = [r for r in up if r.outstanding == least]
        return tied[position % len(tied)], position + 1
    return up[position % len(up)], position + 1


def _refused(error: BaseException | None) -> bool:
    """Whether the replica refused the connection (nothing was sent: safe to retry elsewhere)."""
    real = getattr(error, "real_error", None) or error
    return isinstance(real, ConnectionRefusedError) or (
        isinstance(real, OSError) and real.errno == errno.ECONNREFUSED
    )


# RFC 9110 9.2.2: a client may repeat these when the connection fails before any answer came back.
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})


def _unanswered(error: BaseException | None) -> bool:
    """Whether the replica closed the connection before a byte of answer (it died while taking it)."""
    real = getattr(error, "real_error", None) or error
    return isinstance(real, (HTTPStreamClosedError, StreamClosedError, ConnectionResetError))


def _front_refused(headers: Any, status: int) -> bool:
    """Whether an answer is the replica front's "my command refused the connection" (nothing was sent
    to the model: safe to retry elsewhere, like a refused connection)."""
    return status == 502 and headers is not None and bool(headers.get(credentials.REFUSED_HEADER))


def replica_url(scheme: str, replica: Replica, path: str, query: str) -> str:
    host = f"[{replica.host}]" if ":" in replica.host else replica.host
    return f"{scheme}://{host}:{replica.port}/{path}{query}"


def _http_client() -> AsyncHTTPClient:
    global _client
    if _client is None:
        _client = AsyncHTTPClient(force_instance=True, max_clients=1000, max_body_size=1 << 40)
    return _client


def _token_candidate(session_factory: Any, entry: Entry, plain: str) -> tuple[int, str, str] | None:
    """(token id, secret, stored hash) of a token that names this endpoint and is in force."""
    parsed = endpoints.parse_token(plain)
    if parsed is None or parsed[0] not in entry.tokens:
        return None
    with session_scope(session_factory) as db:
        t = db.get(ServingToken, parsed[0])
        if t is None or t.endpoint_id != entry.id or t.revoked_at is not None:
            return None
        return t.id, parsed[1], t.token_hash


class ServeHandler(websocket.WebSocketHandler):
    """Plain HTTP is passed on by :meth:`serve`; a websocket upgrade (GET) is checked the same way, then
    bridged to a replica's websocket message by message."""

    upstream: websocket.WebSocketClientConnection | None = None
    _early: list[str | bytes] | None = None  # what the replica sent before the caller's handshake ended
    SUPPORTED_METHODS = ("GET", "HEAD", "POST", "DELETE", "PATCH", "PUT", "OPTIONS")

    # ------------------------------------------------------------ logs without query strings (tokens)

    def _request_summary(self) -> str:
        return f"{self.request.method} {self.request.path} ({self.request.remote_ip})"

    def log_exception(
        self, typ: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(value, web.HTTPError):
            return
        self.settings["labfleet"].log.error(
            "Uncaught exception %s", self._request_summary(), exc_info=(typ, value, tb)
        )

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Errors as JSON like the API's; a method this route lacks says which it has (RFC 9110)."""
        if status_code == 405:
            self.set_header("Allow", ", ".join(self.SUPPORTED_METHODS))
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps({"status": status_code, "message": self._reason}))

    def _answer(self, status: int, message: str, **headers: str) -> None:
        self.clear()
        self.set_status(status)
        self.set_header("Content-Type", "application/json; charset=utf-8")
        for k, v in headers.items():
            self.set_header(k.replace("_", "-"), v)
        self.finish(json.dumps({"status": status, "message": message}))

    # ------------------------------------------------------------ methods

    async def get(self, name: str, path: str) -> None:
        await self.serve(name, path)

    async def head(self, name: str, path: str) -> None:
        await self.serve(name, path)

    async def post(self, name: str, path: str) -> None:
        await self.serve(name, path)

    async def put(self, name: str, path: str) -> None:
        await self.serve(name, path)

    async def patch(self, name: str, path: str) -> None:
        await self.serve(name, path)

    async def delete(self, name: str, path: str) -> None:
        await self.serve(name, path)

    async def options(self, name: str, path: str) -> None:
        await self.serve(name, path)

    # ------------------------------------------------------------ the work

    async def _authorize(self, engine: ServingController, entry: Entry) -> tuple[bool, int | None]:
        """(allowed, token id); answers 401 or 429 itself when not allowed."""
        if entry.open_to_public:
            return True, None
        header = self.request.headers.get("Authorization", "")
        if not header.lower().startswith("bearer ") or not header[7:].strip():
            self._answer(
                401,
                f"endpoint {entry.name} needs a token: Authorization: Bearer <token>",
                WWW_Authenticate='Bearer realm="labfleet"',
            )
            return False, None
        plain = header[7:].strip()
        token_id, known = engine.check_token(entry, plain)
        if token_id is None and not known:
            key = token_key(plain)
            if _bad_tokens.get(key, 0) < time.monotonic():
                cand = _token_candidate(engine.session_factory, entry, plain)
                if cand is not None:
                    tid, secret, stored = cand
                    ok = await IOLoop.current().run_in_executor(
                        None, passwords.verify_password, secret, stored
                    )
                    if ok:
                        engine.token_cache[key] = (tid, entry.id)
                        token_id = tid
                if token_id is None:
                    if len(_bad_tokens) > 10_000:
                        _bad_tokens.clear()
                    _bad_tokens[key] = time.monotonic() + BAD_TOKEN_MEMORY
        tok = entry.tokens.get(token_id) if token_id is not None else None
        if tok is None:
            self._answer(
                401,
                f"the token is not valid for endpoint {entry.name}",
                WWW_Authenticate='Bearer error="invalid_token"',
            )
            return False, None
        if tok.rate_limit:
            decision = _limiter.hit(f"serve:{tok.id}", tok.rate_limit)
            if not decision.allowed:
                retry = max(1, int(decision.reset - time.time()))
                self._answer(
                    429, f"rate limit of {tok.rate_limit} requests per minute reached", Retry_After=str(retry)
                )
                return False, tok.id
        return True, tok.id

    def _upstream_headers(self, entry: Entry, name: str) -> httputil.HTTPHeaders:
        out = httputil.HTTPHeaders()
        for k, v in self.request.headers.get_all():
            lk = k.lower()
            if lk in HOP_BY_HOP or lk.startswith(_REPLICA_HEADERS):
                continue
            if lk == "authorization" and not entry.open_to_public:
                continue
            out.add(k, v)
        prior = self.request.headers.get("X-Forwarded-For")
        remote = self.request.remote_ip or ""
        out["X-Forwarded-For"] = f"{prior}, {remote}" if prior else remote
        out["X-Forwarded-Proto"] = self.request.headers.get("X-Forwarded-Proto", self.request.protocol)
        out["X-Forwarded-Host"] = self.request.headers.get("X-Forwarded-Host", self.request.host)
        out["X-Forwarded-Prefix"] = f"{self.settings['labfleet'].prefix}serve/{name}"
        return out

    async def serve(self, name: str, path: str) -> None:
        started = time.perf_counter()
        engine: ServingController | None = getattr(self.settings["labfleet"], "serving", None)
        entry = engine.table.get(name) if engine is not None else None
        if engine is None or entry is None:
            self._answer(404, f"no endpoint {name[:64]!r} serves here")
            return
        allowed, token_id = await self._authorize(engine, entry)
        if allowed and entry.suspended is not None:
            # After the token's check, so that only a caller with a valid token learns why.
            self._answer(403, f"endpoint {entry.name} is suspended: {entry.suspended}")
            allowed = False
        if not allowed:
            if token_id is not None:
                ms = (time.perf_counter() - started) * 1000
                engine.count(entry.id, token_id, ms, True)
                self.settings["labfleet"].metrics.observe_serving(entry.name, ms / 1000)
            return
        if self.request.method == "GET" and self.request.headers.get("Upgrade", "").lower() == "websocket":
            code = await self._bridge(engine, entry, name, path)
            ms = (time.perf_counter() - started) * 1000
            engine.count(entry.id, token_id, ms, code >= 500)
            self.settings["labfleet"].metrics.observe_serving(entry.name, ms / 1000)
            return
        code = await self._forward(engine, entry, name, path)
        ms = (time.perf_counter() - started) * 1000
        engine.count(entry.id, token_id, ms, code >= 500)
        self.settings["labfleet"].metrics.observe_serving(entry.name, ms / 1000)  # the latency histogram

    # ------------------------------------------------------------ websockets

    async def _bridge(self, engine: ServingController, entry: Entry, name: str, path: str) -> int:
        """Connect to a replica's websocket (the next one if it refuses), then accept the caller's."""
        headers = httputil.HTTPHeaders()
        for k, v in self._upstream_headers(entry, name).get_all():
            if not k.lower().startswith("sec-websocket-"):
                headers.add(k, v)
        offered = self.request.headers.get("Sec-WebSocket-Protocol")
        subprotocols = [p.strip() for p in offered.split(",") if p.strip()] if offered else None
        query = f"?{self.request.query}" if self.request.query else ""
        tried: set[int] = set()
        while True:
            replica, entry.rr = choose(entry.replicas, entry.rr, how=policy(), exclude=tried)
            if replica is None:
                self._answer(503, f"endpoint {name} has no healthy replica to answer", Retry_After="2")
                return 503
            tried.add(replica.route_id)
            attempt = headers.copy()  # each replica its own credential (and Host)
            attempt[credentials.HEADER] = replica.credential
            req = HTTPRequest(
                replica_url("ws", replica, path, query),
                headers=attempt,
                connect_timeout=CONNECT_TIMEOUT,
                request_timeout=CONNECT_TIMEOUT,
            )
            try:
                self.upstream = await websocket.websocket_connect(
                    req, on_message_callback=self._from_upstream, subprotocols=subprotocols
                )
                break
            except Exception as e:
                response = getattr(e, "response", None)
                if _refused(e) or (
                    response is not None and _front_refused(response.headers, getattr(e, "code", 0))
                ):
                    engine.refused(replica)
                    continue
                self._answer(502, f"replica {replica.route_id} of {name} refused the websocket: {e}")
                return 502
        await super().get(name, path)  # the handshake with the caller; open() and the messages follow
        return 101

    def open(self, *args: Any, **kwargs: Any) -> None:
        for message in self._early or []:
            self.write_message(message, binary=isinstance(message, bytes))
        self._early = None

    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        return self.upstream.selected_subprotocol if self.upstream is not None else None

    async def on_message(self, message: str | bytes) -> None:
        if self.upstream is not None:
            await self.upstream.write_message(message, binary=isinstance(message, bytes))

    def _from_upstream(self, message: str | bytes | None) -> None:
        if message is None:  # the replica closed it
            if self.ws_connection is not None:
                self.close()
            return
        if self.ws_connection is not None and self._early is None:
            self.write_message(message, binary=isinstance(message, bytes))
        else:
            self._early = [*(self._early or []), message]

    def on_close(self) -> None:
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None

    def _copy_headers(self, headers: list[tuple[str, str]], *, keep_length: bool) -> None:
        """The replica's headers on this answer, in place of tornado's defaults (Content-Type)."""
        self.clear()
        self.clear_header("Content-Type")
        seen: set[str] = set()
        for k, v in headers:
            lk = k.lower()
            if lk in HOP_BY_HOP and not (keep_length and lk == "content-length"):
                continue
            if lk in seen:
                self.add_header(k, v)
            else:
                self.set_header(k, v)
                seen.add(lk)

    async def _forward(self, engine: ServingController, entry: Entry, name: str, path: str) -> int:
        """Pass the request to a replica and stream its answer back; the status answered."""
        method = self.request.method or "GET"
        body = self.request.body if method in ("POST", "PUT", "PATCH") or self.request.body else None
        headers = self._upstream_headers(entry, name)
        query = f"?{self.request.query}" if self.request.query else ""
        tried: set[int] = set()
        state: dict[str, Any] = {"started": False, "status": 0}

        def on_header(line: str) -> None:
            if state["started"]:
                return
            if line.startswith("HTTP/"):
                start = httputil.parse_response_start_line(line.strip())
                if start.code < 200:
                    return  # 100 Continue and the like: the final answer follows
                state["status"], state["reason"], state["headers"] = start.code, start.reason, []
            elif line in ("\r\n", "\n"):
                if not state.get("headers") and state["status"] == 0:
                    return
                if _front_refused(httputil.HTTPHeaders(state["headers"]), state["status"]):
                    state["refused"] = True  # nothing reached the model: the next replica answers
                    return
                state["started"] = True
                self._copy_headers(state["headers"], keep_length=True)
                self.set_status(
                    state["status"], state["reason"] or httputil.responses.get(state["status"], "Unknown")
                )
            elif state["status"] and ":" in line:
                k, _, v = line.partition(":")
                state["headers"].append((k.strip(), v.strip()))

        def on_chunk(chunk: bytes) -> None:
            if state.get("refused"):
                return
            self.write(chunk)
            self.flush()

        last_error = ""
        while True:
            replica, entry.rr = choose(entry.replicas, entry.rr, how=policy(), exclude=tried)
            if replica is None:
                break
            tried.add(replica.route_id)
            attempt = headers.copy()  # each replica its own credential (and Host)
            attempt[credentials.HEADER] = replica.credential
            state.clear()
            state.update(started=False, status=0)
            req = HTTPRequest(
                replica_url("http", replica, path, query),
                method=method,
                headers=attempt,
                body=body,
                header_callback=on_header,
                streaming_callback=on_chunk,
                connect_timeout=CONNECT_TIMEOUT,
                request_timeout=REQUEST_TIMEOUT,
                follow_redirects=False,
                decompress_response=False,
                allow_nonstandard_methods=True,
            )
            replica.outstanding += 1
            error: BaseException | None = None
            try:
                resp = await _http_client().fetch(req, raise_error=False)
                if resp.code == 599:
                    error = resp.error
            except Exception as e:  # tornado raises what is not an HTTP answer (a refused connection)
                error = e
            finally:
                replica.outstanding -= 1
            if state["started"]:
                self.finish()
                return int(state["status"])
            if (error is not None and _refused(error)) or (
                error is None and (state.get("refused") or _front_refused(resp.headers, resp.code))
            ):
                engine.refused(replica)
                last_error = f"replica {replica.route_id} refused the connection"
                continue
            if error is not None and method in IDEMPOTENT and _unanswered(error):
                # Nginx's proxy_next_upstream does the same for idempotent requests; a POST may have
                # reached the model, so it is not sent twice.
                engine.refused(replica)
                last_error = f"replica {replica.route_id} closed the connection without an answer"
                continue
            if error is not None:
                self._answer(502, f"replica {replica.route_id} of {name} did not answer: {error}")
                return 502
            # An answer with no body: headers were seen but the blank line came through no callback.
            self._copy_headers(list(resp.headers.get_all()), keep_length=False)
            self.set_status(resp.code, resp.reason or None)
            self.finish()
            return resp.code
        healthy = len(entry.replicas)
        reason = f"; {last_error}" if last_error else ""
        self._answer(
            503,
            f"endpoint {name} has no healthy replica to answer ({healthy} of {entry.wanted} in rotation{reason})",
            Retry_After="2",
        )
        return 503
