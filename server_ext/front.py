"""The authenticating front of a model replica: the only way in to the model, for its router only.

A replica of a model-serving endpoint is an inference session whose command (the user's model server)
listens on the session's loopback (``$HOST`` 127.0.0.1, an inner ``$PORT``). This front listens on the
replica's own port, where the endpoint's router calls it (every address of the session by default), and
passes a connection on to the command only when its first request carries the replica's credential
(``X-Labfleet-Replica-Credential``, compared in constant time; see :mod:`labfleet.serving.credentials`).
Anything else gets ``401`` with a JSON message and never reaches the model.

Once a request is let in, the connection is spliced byte for byte, both ways, so an answer streams as
the model writes it (server-sent events) and a websocket upgrade works unchanged. The credential (and
the probe header) are taken out of the request first, and a plain request goes on with
``Connection: close``, its answer's head saying so to the caller: one request per connection, each
checked (the router opens one per request anyway). The front answers itself:

- ``502`` with ``X-Labfleet-Replica-Refused: 1`` when the command refuses the connection (not up yet,
  or gone): nothing was sent to the model, and the router tries another replica;
- ``204`` (``502`` as above) to a request with the credential and ``X-Labfleet-Replica-Probe: connect``:
  the engine's check of a replica whose definition has no ``health_check``;
- ``400``, ``408``, ``431`` for a request head that is malformed, too slow or too large.

It runs on the Jupyter server's event loop (asyncio streams, no tornado); what it adds to a call is
measured in benchmarks/RESULTS.md (a version on asyncio protocols measured the same: the simpler one
stays). The credential is held in memory only: never logged, never in the environment of the command,
never in the state file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from labfleet.serving.credentials import HEADER, PROBE_HEADER, REFUSED_HEADER, matches

MAX_HEAD = 64 * 1024  # a request head larger than this is refused (431)
HEAD_TIMEOUT = 30.0  # seconds a caller has to send its request head
CONNECT_TIMEOUT = 5.0  # seconds to connect to the command
_CHUNK = 256 * 1024
_DISCARD_BYTES = 4 << 20  # after a refusal: at most this much of the caller's body is read and dropped
_DISCARD_SECONDS = 2.0
_OWN = b"x-labfleet-replica-"  # the front's own headers: never passed on to the model
_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection"})
_REASONS = {
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
}


@dataclass(frozen=True)
class Head:
    """A request head: its request line and its header fields, as sent (bytes)."""

    request_line: bytes
    fields: tuple[tuple[bytes, bytes], ...]

    def values(self, name: bytes) -> list[bytes]:
        return [v for k, v in self.fields if k.lower() == name]

    @property
    def upgrade(self) -> bool:
        """A protocol upgrade (a websocket): ``Connection: upgrade`` with an ``Upgrade`` field."""
        tokens = {t.strip().lower() for v in self.values(b"connection") for t in v.split(b",")}
        return b"upgrade" in tokens and bool(self.values(b"upgrade"))


def parse_head(raw: bytes) -> Head | None:
    """The head of a request (up to and with its blank line); None when it is not HTTP/1.x as sent."""
    lines = raw.split(b"\r\n")
    while lines and not lines[-1]:
        lines.pop()
    if not lines:
        return None
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1] or not parts[2].startswith(b"HTTP/1."):
        return None
    fields = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        # No folded lines, no space before the colon, no empty or control-character names (RFC 9112).
        if not sep or not name or name != name.strip() or any(c <= 32 or c == 127 for c in name):
            return None
        fields.append((name, value.strip(b" \t")))
    return Head(lines[0], tuple(fields))


def authorized(head: Head, credential: str) -> bool:
    """Whether the request carries exactly one credential field, and it is this replica's."""
    given = head.values(HEADER.lower().encode())
    return len(given) == 1 and matches(given[0], credential)


def wants_probe(head: Head) -> bool:
    return any(v.strip().lower() == b"connect" for v in head.values(PROBE_HEADER.lower().encode()))


def forwarded_head(head: Head) -> bytes:
    """The head the command gets: the front's own fields taken out; a plain request with
    ``Connection: close`` (one request per connection, each one checked here)."""
    upgrade = head.upgrade
    out = [head.request_line]
    for name, value in head.fields:
        low = name.lower()
        if low.startswith(_OWN) or (not upgrade and low in _HOP):
            continue
        out.append(name + b": " + value)
    if not upgrade:
        out.append(b"Connection: close")
    return b"\r\n".join(out) + b"\r\n\r\n"


def closing_head(raw: bytes) -> bytes:
    """A final answer's head as the caller gets it: with ``Connection: close`` in place of any
    ``Connection`` or ``Keep-Alive`` field, since the command closes the connection after it (the
    front asked it to): a keep-alive caller must not send its next request there."""
    lines = raw.split(b"\r\n")
    while lines and not lines[-1]:
        lines.pop()
    kept = [lines[0]] + [line for line in lines[1:] if line.partition(b":")[0].strip().lower() not in _HOP]
    return b"\r\n".join([*kept, b"Connection: close"]) + b"\r\n\r\n"


def interim(raw: bytes) -> bool:
    """A 1xx answer other than 101 (100 Continue, 103 Early Hints): the final one follows it."""
    parts = raw.split(b" ", 2)
    return len(parts) >= 2 and parts[1].startswith(b"1") and parts[1] != b"101"


def answer(status: int, message: str = "", *extra: str) -> bytes:
    """A whole answer of the front itself (JSON ``{"status", "message"}``; none for 204)."""
    lines = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
        "Connection: close",
        "Cache-Control: no-store",
    ]
    lines += extra
    body = b""
    if status != 204:
        body = json.dumps({"status": status, "message": message}).encode()
        lines += ["Content-Type: application/json; charset=utf-8", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


UNAUTHORIZED = answer(
    401,
    "this is a replica of a model-serving endpoint: call the endpoint's URL "
    "(/services/labfleet/serve/<endpoint>/) with an endpoint token",
    f'WWW-Authenticate: LabfleetReplica realm="labfleet", header="{HEADER}"',
)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until the end of ``reader``, then end ``writer``'s side (half-close)."""
    try:
        while True:
            data = await reader.read(_CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError, RuntimeError):
        pass  # the other side went away: the connection ends


def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.close()


async def _discard(reader: asyncio.StreamReader, left: int) -> None:
    while left > 0 and (chunk := await reader.read(min(left, _CHUNK))):
        left -= len(chunk)


async def _refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> None:
    """Answer and end the connection; what the caller still sends (a body) is read and dropped for a
    moment, so that closing does not reset the connection before the caller has read the answer."""
    try:
        writer.write(data)
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        await asyncio.wait_for(_discard(reader, _DISCARD_BYTES), _DISCARD_SECONDS)
    except (ConnectionError, OSError, RuntimeError, asyncio.TimeoutError):
        pass


class ReplicaFront:
    """Listens on ``host:port`` for the replica; passes checked connections to ``inner_host:inner_port``."""

    def __init__(
        self,
        credential: str,
        inner_port: int,
        *,
        inner_host: str = "127.0.0.1",
        log: logging.Logger | None = None,
    ) -> None:
        if not credential:
            raise ValueError("a replica front needs a credential")
        self._credential = credential
        self.inner_host, self.inner_port = inner_host, inner_port
        self.log = log or logging.getLogger("labfleet.front")
        self.server: asyncio.AbstractServer | None = None
        self.refused = 0  # calls answered 401
        self.passed = 0  # connections let in

    def __repr__(self) -> str:  # never the credential
        return f"ReplicaFront(inner={self.inner_host}:{self.inner_port}, listening={self.server is not None})"

    async def start(self, host: str, port: int) -> None:
        """Listen (OSError when the port is taken)."""
        self.server = await asyncio.start_server(self._handle, host, port, limit=MAX_HEAD, reuse_address=True)

    def close(self) -> None:
        """Stop listening: new connections are refused (the router tries another replica); those in
        flight go on."""
        if self.server is not None:
            self.server.close()
            self.server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve(reader, writer)
        except Exception:  # never let one connection's trouble reach the loop's handler
            self.log.debug("labfleet front: connection failed", exc_info=True)
        finally:
            _close(writer)

    async def _answer_head(self, inner: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Pass the command's answer head on with ``Connection: close`` (interim 1xx answers as they are);
        anything that is no answer head is passed on untouched by the splice that follows."""
        while True:
            try:
                raw = await inner.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as e:
                writer.write(e.partial)  # cut short: what came goes on as it is
                return
            except asyncio.LimitOverrunError:
                return  # no head we can read: the bytes go on as they are
            if not raw.startswith(b"HTTP/1."):
                writer.write(raw)
                return
            if interim(raw):
                writer.write(raw)
                continue
            writer.write(closing_head(raw))
            return

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        except asyncio.IncompleteReadError:
            return  # closed before a whole head: nothing to answer
        except asyncio.LimitOverrunError:
            await _refuse(reader, writer, answer(431, f"the request head is larger than {MAX_HEAD} bytes"))
            return
        except asyncio.TimeoutError:
            writer.write(answer(408, f"no request head within {HEAD_TIMEOUT:g} s"))
            return
        head = parse_head(raw)
        if head is None:
            await _refuse(reader, writer, answer(400, "not an HTTP/1.x request"))
            return
        if not authorized(head, self._credential):
            self.refused += 1
            peer = writer.get_extra_info("peername")
            self.log.debug("labfleet front: refused a call without the replica's credential from %s", peer)
            await _refuse(reader, writer, UNAUTHORIZED)
            return
        try:
            inner_reader, inner_writer = await asyncio.wait_for(
                asyncio.open_connection(self.inner_host, self.inner_port, limit=_CHUNK), CONNECT_TIMEOUT
            )
        except (OSError, asyncio.TimeoutError) as e:
            message = (
                f"the model does not accept connections on {self.inner_host}:{self.inner_port} "
                f"(not started yet, or gone): {e.__class__.__name__}"
            )
            await _refuse(reader, writer, answer(502, message, f"{REFUSED_HEADER}: 1"))
            return
        if wants_probe(head):
            _close(inner_writer)
            await _refuse(reader, writer, answer(204))
            return
        self.passed += 1
        try:
            inner_writer.write(forwarded_head(head))
            # What the caller sent after the head (a body, websocket frames) is still in the reader.
            up = asyncio.ensure_future(_pipe(reader, inner_writer))
            if not head.upgrade:
                await self._answer_head(inner_reader, writer)
            await _pipe(inner_reader, writer)  # the answer, as it comes, until the command ends it
            up.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await up
        finally:
            _close(inner_writer)


# ---------------------------------------------------------------- the credential, from the service

CredentialSource = Callable[[], Awaitable[str | None]]


def credential_source(
    environ: Any = None, *, timeout: float = 90.0, log: logging.Logger | None = None
) -> CredentialSource | None:
    """How this session gets its replica credential: ``GET sessions/<id>/replica-credential`` on the
    labfleet service with the session's own Hub token. None outside a labfleet session (no session id or
    no service URL): such a session is nobody's replica.

    The call answers the credential (a replica), None (``"replica": false``: a plain inference session), or raises
    RuntimeError after ``timeout`` seconds of failed tries (the service did not answer): a replica must
    not start without its front."""
    env = os.environ if environ is None else environ
    session_id = env.get("LABFLEET_SESSION_ID", "").strip()
    if not session_id or not env.get("LABFLEET_SERVICE_URL", "").strip():
        return None

    async def fetch() -> str | None:
        from .calls import SessionCalls, quoted  # tornado's HTTP client: only when it is needed

        calls = SessionCalls.from_environ(env, timeout=20.0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        delay = 0.5
        while True:
            got = await calls.service("GET", f"sessions/{quoted(session_id)}/replica-credential")
            data = got.data if isinstance(got.data, dict) else {}
            if got.status == 200 and data.get("replica") is True and isinstance(data.get("credential"), str):
                return str(data["credential"])
            if got.status == 200 and data.get("replica") is False:
                return None  # the service says: not a replica
            problem = f"{got.status or 'no answer'}: {got.message}"
            if loop.time() + delay > deadline:
                raise RuntimeError(
                    f"the labfleet service did not give this replica its credential ({problem})"
                )
            (log or logging.getLogger("labfleet.front")).info(
                "labfleet: asking for the replica credential again in %.1fs (%s)", delay, problem
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    return fetch
