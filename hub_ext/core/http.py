"""One way to make an HTTP request, for every labfleet client (tornado's AsyncHTTPClient only).

The Hub calling the labfleet service (``labfleet.hub.client``), the service calling the Hub's REST API
(``labfleet.service.hubsync``), a session's server calling both (``labfleet.session.calls``) and the widgets
calling their session (``labfleet.widgets.client``) all go through :func:`request` and get an :class:`HTTPReply`.

:func:`request` never raises for an HTTP answer nor for an upstream that cannot be reached or does not
answer in time: the reply says so (``status`` 0). Each caller turns a reply into what its own layer
raises or answers. Nothing here logs; a caller that logs a URL logs :func:`loggable` of it, which
drops the query string. Tokens only ever go in the ``Authorization`` header.

Pure: no SQLAlchemy, no DB; the Hub process and the sessions import it.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.ioloop import IOLoop
from tornado.simple_httpclient import HTTPTimeoutError

JSON = "application/json"
# Requests in flight at once per event loop, labfleet's own: tornado's shared client allows 10, and
# in the Hub it is the proxy's and every spawner's too (100 queued spawns polling kept a stop's
# release waiting behind them for seconds).
MAX_CLIENTS = 100
_clients: weakref.WeakKeyDictionary[IOLoop, AsyncHTTPClient] = weakref.WeakKeyDictionary()
# Methods whose request carries a body: sent with an empty one when there is nothing to send.
_BODY_METHODS = ("POST", "PUT", "PATCH")
# The most of an upstream's plain-text error body a message repeats.
_TEXT_WORDS = 500


class ServiceError(Exception):
    """The labfleet service refused or failed: ``message`` in its own words, ``status`` its code
    (0 when there was no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


# Headers of an answer that a proxy of labfleet's (a session's Fleet API) passes on besides its
# content type: a build log's size, for a follower reading on from an offset.
PASSED_HEADERS = ("X-Log-Size",)


@dataclass(frozen=True)
class HTTPReply:
    """What an upstream answered, or why it did not.

    ``status`` is the HTTP status, 0 when there was no answer (``error`` says why, ``timed_out`` whether
    it was a timeout). ``data`` is the JSON body, parsed, when the content type says JSON (``is_json``);
    ``body`` is the body as it came; ``message`` is what went wrong, for people.
    """

    status: int
    data: Any = None
    body: bytes = field(default=b"", repr=False)
    content_type: str = ""
    reason: str = ""
    error: str = ""
    timed_out: bool = False
    is_json: bool = False
    # Who answered, as a message names it ("the labfleet service", "the Hub", ...).
    upstream: str = "the server"
    # The upstream's headers that a proxy passes on (PASSED_HEADERS), as it sent them.
    passed: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def code(self) -> int:
        """``status``, by the name the Hub's side uses (0: no answer)."""
        return self.status

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON whatever its content type says (None when empty); ValueError if it is not."""
        if self.is_json:
            return self.data
        return json.loads(self.body) if self.body.strip() else None

    @property
    def words(self) -> str:
        """The upstream's own words: the ``message`` of a JSON body, else a short plain-text error body."""
        if isinstance(self.data, Mapping) and self.data.get("message"):
            return str(self.data["message"])
        ctype = self.content_type.lower()
        if self.ok or not self.body or "html" in ctype or "json" in ctype:
            return ""
        try:
            text = self.body.decode("utf-8").strip()
        except UnicodeDecodeError:
            return ""
        return text[:_TEXT_WORDS]

    @property
    def message(self) -> str:
        """What went wrong, for people: the upstream's words, why it did not answer, or its status.

        Empty for a success without words.
        """
        words = self.words
        if words:
            return words
        if self.status == 0:
            if self.timed_out:
                return f"{self.upstream} did not answer: {self.error or 'timeout'}"
            return f"cannot reach {self.upstream}: {self.error or 'no answer'}"
        if self.ok:
            return ""
        return f"{self.upstream} answered {self.status}" + (f" {self.reason}" if self.reason else "")


def loggable(url: str) -> str:
    """``url`` as it may be logged: no query string, no fragment, no user or password."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _decode(body: bytes, content_type: str) -> tuple[Any, bool]:
    """(parsed body, whether it is JSON): JSON when the content type says so and the body parses."""
    if "json" not in content_type.lower():
        return None, False
    if not body.strip():
        return None, True
    try:
        return json.loads(body), True
    except (ValueError, UnicodeDecodeError):
        return None, False


def client() -> AsyncHTTPClient:
    """This event loop's labfleet HTTP client (its own, not tornado's shared one: see MAX_CLIENTS)."""
    loop = IOLoop.current()
    c = _clients.get(loop)
    if c is None:
        c = _clients[loop] = AsyncHTTPClient(force_instance=True, max_clients=MAX_CLIENTS)
    return c


async def request(
    method: str,
    url: str,
    *,
    token: str | None = None,
    json_body: Any = None,
    data: bytes | None = None,
    content_type: str | None = None,
    query: Mapping[str, str] | None = None,
    timeout: float = 20.0,
    connect_timeout: float | None = None,
    upstream: str = "the server",
) -> HTTPReply:
    """``method`` on ``url``: one request, one :class:`HTTPReply`; never raises for an answer or its absence.

    ``token`` goes in ``Authorization: token ...``. ``json_body`` is sent as JSON, ``data`` as it is (with
    ``content_type``, ``application/octet-stream`` if none); a POST, PUT or PATCH with neither sends an empty
    body. ``query`` is added to the URL, encoded. ``timeout`` bounds connecting (``connect_timeout`` if
    given) and the whole answer. Redirects are answered, not followed. ``upstream`` names who is called,
    in the reply's ``message``.
    """
    if query:
        url += ("&" if "?" in url else "?") + urlencode(query)
    headers = {"Accept": JSON}
    if token:
        headers["Authorization"] = f"token {token}"
    payload: bytes | None = None
    if data is not None:
        payload = data
        headers["Content-Type"] = content_type or "application/octet-stream"
    elif json_body is not None:
        payload = json.dumps(json_body).encode()
        headers["Content-Type"] = JSON
    elif method in _BODY_METHODS:
        payload = b""
    req = HTTPRequest(
        url,
        method=method,
        headers=headers,
        body=payload,
        allow_nonstandard_methods=True,  # a DELETE with a body (the Hub's group members)
        connect_timeout=timeout if connect_timeout is None else connect_timeout,
        request_timeout=timeout,
        follow_redirects=False,
    )
    try:
        response = await client().fetch(req, raise_error=False)
    except (HTTPClientError, OSError, ValueError) as e:
        # tornado names the URL in some errors (a bad scheme): never its query string
        cause = str(e).replace(url, loggable(url))
        return HTTPReply(0, error=cause, timed_out=isinstance(e, HTTPTimeoutError), upstream=upstream)
    if response.code == 599:  # no answer, as a client that does not raise for it reports it
        timed_out = isinstance(response.error, HTTPTimeoutError)
        return HTTPReply(0, error=str(response.error or "no answer"), timed_out=timed_out, upstream=upstream)
    body = response.body or b""
    ctype = response.headers.get("Content-Type", "")
    parsed, is_json = _decode(body, ctype)
    return HTTPReply(
        response.code,
        parsed,
        body,
        content_type=ctype,
        reason=response.reason or "",
        is_json=is_json,
        upstream=upstream,
        passed={k: v for k in PASSED_HEADERS if (v := response.headers.get(k)) is not None},
    )
