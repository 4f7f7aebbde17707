"""The service's base handler: who is asking (Hub token, Hub OAuth cookie, keypair
signature, or the Hub itself), rate limits, replayed signatures, JSON in and out, errors as JSON.

Any LabfleetError raised in an APIHandler (prepare, a handler method, query parsing) answers
as JSON with its status and message, and is not logged as an exception.  Nothing here logs a
query string: it may carry a token (``?token=...``).
"""

from __future__ import annotations

import hmac
import json
import re
from dataclasses import replace
from datetime import datetime, timezone
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlencode

from jupyterhub.services.auth import HubOAuthenticated, UserNotAllowed
from tornado import iostream, web
from tornado.concurrent import Future
from tornado.httputil import HTTPServerRequest

from labfleet.core import authz, signing
from labfleet.core.authz import Actor
from labfleet.core.database import session_scope
from labfleet.core.errors import Forbidden, InvalidInput, LabfleetError, RateLimited, Unauthorized
from labfleet.core.pages import DEFAULT_LIMIT, MAX_LIMIT, Page
from labfleet.core.secretbox import SecretKeyMissing
from labfleet.core.validate import check_int
from labfleet.tenancy import keypairs, snapshot
from labfleet.tenancy.directory import actor_for, why_inactive

MAX_BODY = 1 << 20  # JSON bodies; file uploads (vfolders) have their own streaming handlers
# Like the Hub's REST API (jupyterhub/apihandlers/base.py): a client that sends this media type in
# Accept gets {"items": [...], "_pagination": {...}}; any other gets the page's items as an array.
PAGINATION_MEDIA_TYPE = "application/jupyterhub-pagination+json"
MAX_OFFSET = 2**31 - 1
MAX_JSON_DEPTH = 64  # nesting levels of a JSON body; no API body needs more than a few


def json_too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when ``value`` nests lists and objects more than ``limit`` levels deep
    (the value itself is level 1). Iterative, so any depth is safe to measure."""
    if not isinstance(value, (dict, list)):
        return False
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        children = v.values() if isinstance(v, dict) else v
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


class PathOnlyLogs:
    """tornado's exception logs with the request's path only: its own ones show the URI and
    ``%r`` of the request, query string included, and a query string may carry a token.
    Mix it in before the tornado handler class (any handler of this app may use it)."""

    request: HTTPServerRequest

    @property
    def log(self):
        return self.settings["labfleet"].log  # type: ignore[attr-defined]

    def _request_summary(self) -> str:
        # tornado's says request.uri: the query string may carry a token.
        return f"{self.request.method} {self.request.path} ({self.request.remote_ip})"

    def log_exception(
        self,
        typ: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """tornado's, with the path only; a LabfleetError is an answer, not something to log."""
        if isinstance(value, LabfleetError):
            return  # answered as JSON with its status; the request log has its line
        if isinstance(value, web.HTTPError):
            if value.log_message:
                self.log.warning(
                    "%d %s: " + value.log_message, value.status_code, self._request_summary(), *value.args
                )
            return
        self.log.error("Uncaught exception %s", self._request_summary(), exc_info=(typ, value, tb))


class ServiceHubAuth:
    """The service's own HubOAuth (``settings["hub_auth"]``, caching for ``token_cache_age``) in
    every handler. HubOAuthenticated's own is ``HubOAuth.instance()``, a process-wide one with the
    Hub's default cache of 300 s: a token revoked at the Hub went on working for five minutes."""

    settings: dict[str, Any]

    @property
    def hub_auth(self) -> Any:
        return self.settings["hub_auth"]


class BaseHandler(PathOnlyLogs, ServiceHubAuth, HubOAuthenticated, web.RequestHandler):
    _hub_auth_user_cache: dict | None  # set once resolved (absent before)

    async def prepare(self) -> None:
        await self.resolve_hub_user()

    async def resolve_hub_user(self) -> dict | None:
        """Resolve the Hub token or cookie without blocking the event loop.

        The Hub may call back into this service while it answers (the authenticator's
        refresh_user), so a blocking lookup here would stall both for a timeout.
        get_current_user() then answers from the cache set here.
        """
        if hasattr(self, "_hub_auth_user_cache"):
            return self._hub_auth_user_cache
        model = await self.hub_auth.get_user(self, sync=False)
        if model:
            try:
                model = self.check_hub_user(model)
            except UserNotAllowed:
                model = None
        self._hub_auth_user_cache = model
        return model

    @property
    def lf(self):
        """The LabfleetService application object (settings, session factory, limiter, hub sync)."""
        return self.settings["labfleet"]

    # ------------------------------------------------------------ methods

    def allowed_methods(self) -> list[str]:
        """The HTTP methods this handler class implements (for 405 answers' Allow header)."""
        cls = type(self)
        return [
            m
            for m in self.SUPPORTED_METHODS
            if getattr(cls, m.lower(), None) is not getattr(web.RequestHandler, m.lower(), None)
        ]

    def check_method(self) -> None:
        """405 (with Allow) for a method this route does not have, before anything else."""
        if self.request.method not in self.allowed_methods():
            raise web.HTTPError(405)


def forget_hub_user(hub_auth: Any, username: str) -> int:
    """Drop what ``hub_auth`` remembers of ``username``'s tokens and cookies (how many entries).

    Their Hub tokens die with the Hub user; without this, a remembered one would act for whoever
    gets the name next, until ``token_cache_age`` runs out."""
    cache = hub_auth.cache
    stale = [
        key
        for key, model in list(cache.values.items())
        if isinstance(model, dict) and model.get("name") == username
    ]
    for key in stale:
        cache.pop(key, None)
    return len(stale)


class NotFoundHandler(BaseHandler):
    async def prepare(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_status(404)
        self.finish(json.dumps({"status": 404, "message": f"no such endpoint: {self.request.path}"}))


class BodyTooLarge(LabfleetError):
    status = 413


@web.stream_request_body
class APIHandler(BaseHandler):
    """A JSON API handler. Its body is read only once the request's headers have passed what they
    can tell: a method this route has, a Content-Length within ``MAX_BODY`` (else 413) and some
    credential (else 401). Then the body (``MAX_BODY`` at most), then who is asking."""

    actor: Actor
    rate: signing.RateDecision | None = None
    _body: bytearray | None = None
    _body_overflow = False

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        if self.rate is not None:  # an error answer (clear()) keeps the rate limit headers
            for k, v in self.rate.headers().items():
                self.set_header(k, v)

    # ------------------------------------------------------------ authentication

    body: Any = None

    async def prepare(self) -> None:
        # A LabfleetError raised here answers as JSON (_handle_request_exception).
        self.check_method()
        self.check_headers()
        await self.receive_body()
        self.actor = await self.authenticate()
        if self.request.method in ("POST", "PATCH", "PUT"):
            self.body = self.json_body()

    def check_headers(self) -> None:
        """What the headers alone refuse: answered before the body is read (then dropped unread,
        see ``answer_before_body``)."""
        headers = self.request.headers
        if not (
            headers.get("Authorization")
            or self.get_cookie(self.hub_auth.cookie_name)
            or self.get_query_argument("token", None)
        ):
            raise Unauthorized("authentication required: a Hub token, a Hub login or a signed request")
        length = headers.get("Content-Length", "")
        if length.isdigit() and int(length) > MAX_BODY:
            raise BodyTooLarge(f"request body is larger than {MAX_BODY} bytes")

    async def receive_body(self) -> None:
        """Let the body in and wait for it (``data_received`` keeps ``MAX_BODY`` bytes of it);
        ``request.body`` then holds it, as for a handler that does not stream."""
        prepared = self._prepared_future
        if prepared is None:  # not a streamed request (a test calling prepare())
            return
        self._prepared_future = None  # tornado resolves it after prepare() unless it is gone
        self._body = bytearray()
        if not prepared.done():
            prepared.set_result(None)
        try:
            await self.request._body_future  # type: ignore[attr-defined]
        except iostream.StreamClosedError:
            raise web.Finish() from None  # the client went away: nobody to answer
        if self._body_overflow:
            raise BodyTooLarge(f"request body is larger than {MAX_BODY} bytes")
        self.request.body = bytes(self._body)
        self._body = None

    def _body_pending(self) -> Future | None:
        """The streamed body's future while the body is still to come (None once it is in)."""
        body = getattr(self.request, "_body_future", None)  # a streamed body: done once it is in
        return body if body is not None and not body.done() else None

    def answer_before_body(self, status: int, message: str, retry_after: int | None = None) -> None:
        """Answer now, before the body is read; end the answer once the body has come and been
        dropped (``data_received`` keeps nothing while ``_body`` is None).

        Ending it at once would make tornado close the connection with the body unread: the Hub's
        proxy, still sending that body, would then see a hang-up (503) instead of the answer."""
        body = self._body_pending()
        assert body is not None
        self._body = None
        # Nothing is built yet but what the refusal set on purpose (an upload's Upload-Offset)
        data = json.dumps({"status": status, "message": message}).encode()
        self._error_headers(status, retry_after)
        self.set_header("Content-Length", str(len(data)))
        self.write(data)
        self.flush()

        def end(_: Future) -> None:
            if not self._finished:
                try:
                    self.finish()
                except Exception:  # the client went away meanwhile
                    self.log.debug("Could not end an answer sent before its body", exc_info=True)

        body.add_done_callback(end)

    def _close_if_body_unread(self) -> None:
        """An error tornado answers before the body is read (an unknown method): it closes the
        connection after it; say so, or the Hub's proxy reuses the connection for its next request."""
        if self._body_pending() is not None:
            self.set_header("Connection", "close")

    def data_received(self, chunk: bytes) -> None:
        buf = self._body
        if buf is None or self._body_overflow:
            return
        if len(buf) + len(chunk) > MAX_BODY:  # a chunked body says no length up front
            self._body_overflow = True
            self._body = bytearray()
            return
        buf += chunk

    async def authenticate(self) -> Actor:
        header = self.request.headers.get("Authorization", "")
        remote = self.request.remote_ip or ""
        if signing.is_signed_request(header):
            return self._authenticate_signed(header, remote)
        token = header[len("token ") :].strip() if header.lower().startswith("token ") else ""
        if token and self.lf.service_token and hmac.compare_digest(token, self.lf.service_token):
            return Actor.hub(remote_addr=remote)
        model = await self.resolve_hub_user()
        if not model:
            raise Unauthorized("authentication required: a Hub token, a Hub login or a signed request")
        if model.get("kind") != "user":
            raise Forbidden(f"{model.get('kind')} {model.get('name')} is not a labfleet user")
        # From the tenancy cache: one statement (its version) when the user is known.
        user = snapshot.user_now(self.lf.engine, self.lf.session_factory, model["name"])
        if user is None:
            raise Forbidden(f"{model['name']} is not a labfleet user")
        refused = authz.inactive_reason(
            user.username, user.role, user.is_active, user.domain, user.domain_active
        )
        if refused:
            raise Forbidden(refused)
        main = user.main_keypair
        # Browser and token requests count against the user's main keypair.
        self._rate_limit(
            main.access_key if main else f"user:{user.username}", main.rate_limit if main else 10000
        )
        return Actor(
            name=user.username, role=user.role, domain=user.domain, user_id=user.id, remote_addr=remote
        )

    def _authenticate_signed(self, header: str, remote: str) -> Actor:
        parsed = signing.parse_auth_header(header)
        if parsed is None:
            raise Unauthorized(f"malformed {signing.SCHEME} Authorization header")
        access_key, signature = parsed
        date = self.request.headers.get(signing.DATE_HEADER, "")
        nonce = self.request.headers.get(signing.NONCE_HEADER)  # None: not sent
        with self.db() as db:
            kp = keypairs.find_active(db, access_key)
            if kp is None:
                raise Unauthorized("unknown or revoked access key")
            refused = why_inactive(kp.user)
            if refused:
                raise Forbidden(refused)
            try:
                secret = keypairs.secret_of(kp, self.lf.secretbox)
            except SecretKeyMissing as e:
                self.log.error("Cannot check a signed request: %s", e)
                raise Unauthorized("the service cannot check signatures right now") from None
            problem = signing.check_signature(
                secret,
                self.request.method or "",
                self.request.uri or "",
                date,
                self.request.body or b"",
                signature,
                nonce=nonce,
            )
            if problem:
                self.log.warning("Refused signed request for %s from %s: %s", access_key, remote, problem)
                raise Unauthorized(problem)
            self._rate_limit(kp.access_key, kp.rate_limit)
            if nonce is not None:
                try:
                    self.nonces.use(kp.access_key, nonce, signing.parse_date(date) or 0.0)
                except LabfleetError as e:
                    self.log.warning("Refused signed request for %s from %s: %s", access_key, remote, e)
                    raise
            kp.last_used = datetime.now(timezone.utc)
            # Sessions started with this signature are charged to this keypair and its policy.
            return replace(actor_for(kp.user, remote), keypair=kp.access_key)

    @property
    def nonces(self) -> signing.NonceCache:
        """The nonces of signed requests seen in the last 15 minutes (one memory per service)."""
        cache = getattr(self.lf, "nonces", None)
        if cache is None:
            cache = self.lf.nonces = signing.NonceCache()
        return cache

    def _rate_limit(self, key: str, limit: int) -> None:
        self.rate = self.lf.limiter.hit(key, limit)
        for k, v in self.rate.headers().items():
            self.set_header(k, v)
        if not self.rate.allowed:
            raise RateLimited(
                f"rate limit of {limit} requests per 15 minutes reached; retry after the reset time",
                retry_after=self.rate.retry_after(),
            )

    # ------------------------------------------------------------ helpers

    def db(self):
        """A unit of work: commits on success, rolls back on any error."""
        return session_scope(self.lf.session_factory)

    def json_body(self) -> Any:
        body = self.request.body or b""
        if len(body) > MAX_BODY:
            raise InvalidInput(f"request body is larger than {MAX_BODY} bytes")
        if not body.strip():
            return {}
        too_deep = f"request body is nested too deeply: at most {MAX_JSON_DEPTH} levels of lists and objects"
        try:
            value = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise InvalidInput(f"request body is not valid JSON: {e}") from None
        except RecursionError:
            raise InvalidInput(too_deep) from None
        if json_too_deep(value):
            raise InvalidInput(too_deep)
        return value

    def write_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(data))

    def send_error_json(self, status: int, message: str, retry_after: int | None = None) -> None:
        self.clear_header("Content-Type")
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self._error_headers(status, retry_after)
        self.finish(json.dumps({"status": status, "message": message}))

    def _error_headers(self, status: int, retry_after: int | None) -> None:
        """An error answer's status and what it says besides its body: how to authenticate (401),
        when to come back (429)."""
        self.set_status(status)
        if status == 401:
            self.set_header("WWW-Authenticate", f'token, {signing.SCHEME} realm="labfleet"')
        if retry_after is not None:
            self.set_header("Retry-After", str(retry_after))

    def _handle_request_exception(self, e: BaseException) -> None:
        """A LabfleetError from anywhere in the handler answers as JSON with its status and
        message, without a traceback in the log; anything else goes tornado's way."""
        if not isinstance(e, LabfleetError):
            super()._handle_request_exception(e)
        elif self._finished:
            return
        elif self._headers_written:  # too late for a status: end the answer, say why in the log
            self.log.warning("%s: %s, after the answer had started", self._request_summary(), e.message)
            try:
                self.finish()
            except Exception:
                self.log.warning("Could not end a partial answer", exc_info=True)
        elif self._body_pending() is not None:  # refused from the headers
            self.answer_before_body(e.status, e.message, getattr(e, "retry_after", None))
        else:
            self.clear()  # drop a half-built answer; default and rate limit headers stay
            self.send_error_json(e.status, e.message, getattr(e, "retry_after", None))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        message = self._reason
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, LabfleetError):
            self.set_status(exc.status)
            status_code, message = exc.status, exc.message
        elif isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        self._close_if_body_unread()
        if status_code == 405:
            self.set_header("Allow", ", ".join(self.allowed_methods()))
            message = (
                f"{self.request.method} is not allowed here; allowed: {', '.join(self.allowed_methods())}"
            )
        self.finish(json.dumps({"status": status_code, "message": message}))

    async def run(self, fn, *args, after_commit=None):
        """Run ``fn(db, actor, *args)`` in one unit of work and return its result; the handler answers.

        Once the unit commits, the service's after-commit hooks run (``self.lf.after_commit``: what
        the unit recorded for them, such as the Hub's groups), then ``after_commit``, when given.
        A LabfleetError rolls the unit back and goes up: it answers as JSON with its status
        (:meth:`_handle_request_exception`), as a ``web.HTTPError`` does in JupyterHub.
        """
        with self.db() as db:
            result = fn(db, self.actor, *args)
        await self.lf.after_commit(db, write=self.request.method != "GET")
        if after_commit is not None:
            await after_commit()
        return result

    async def reroute(self) -> None:
        """After a change of who may act (a domain or a user (de)activated): the serving router's
        table is rebuilt now, not at its next tick, so a suspended endpoint is refused at once."""
        serving = getattr(self.lf, "serving", None)
        if serving is not None:
            serving.rebuild()

    def query_arg(self, name: str) -> str | None:
        """A query argument, None when absent; InvalidInput (400) when it is not acceptable."""
        try:
            # Checked as sent (tornado strips whitespace by default: 300 carriage returns are not short)
            value = self.get_query_argument(name, None, strip=False)
        except web.HTTPError:  # not UTF-8
            raise InvalidInput(f"query argument {name} is not valid UTF-8") from None
        if value is not None and len(value) > 255:
            raise InvalidInput(f"query argument {name} is too long (at most 255 characters)")
        if value is not None and "\x00" in value:
            raise InvalidInput(f"query argument {name} must not contain NUL characters")
        return None if value is None else value.strip()

    # ------------------------------------------------------------ the request (JupyterHub's names)

    def get_json_body(self, *, required: bool = False) -> Any:
        """The request's JSON body, with numbers that have no fraction read as whole numbers.

        JSON (and openapi.yaml's ``integer``, JSON Schema 2020-12) does not tell ``3`` from ``3.0``;
        the logic modules check ``int``.  Walked without recursion: the body may nest deeply.

        ``required`` (openapi.yaml: ``requestBody.required``): an empty body reads as ``{}``, which is
        a valid (empty) change for the PATCH routes and a valid request for POST /keypairs; refuse
        it, so a client that forgot the body is told so.  Raises InvalidInput (400)."""
        if required and not (self.request.body or b"").strip():
            raise InvalidInput("a JSON object is required as the request body; send {} to change nothing")
        body = self.body
        if isinstance(body, float) and body.is_integer():
            return int(body)
        stack = [body]
        while stack:
            node = stack.pop()
            pairs = (
                node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
            )
            for key, value in list(pairs):
                if isinstance(value, float) and value.is_integer():
                    node[key] = int(value)
                elif isinstance(value, (dict, list)):
                    stack.append(value)
        return body

    def whole_number_arg(self, name: str, *, default: int, minimum: int, maximum: int) -> int:
        """An optional query argument that must be a whole number (ASCII digits) from minimum to maximum."""
        raw = self.query_arg(name)
        if raw is None:
            return default
        if not re.fullmatch(r"[0-9]{1,18}", raw):
            raise InvalidInput(f"{name} must be a whole number from {minimum} to {maximum}")
        return check_int(int(raw), name, minimum=minimum, maximum=maximum)

    # ------------------------------------------------------------ pages of the list endpoints

    def get_api_pagination(self) -> tuple[int, int]:
        """``(offset, limit)`` from the query: offset 0.. (default 0), limit 1..1000 (default 200);
        InvalidInput (400) for anything else."""
        offset = self.whole_number_arg("offset", default=0, minimum=0, maximum=MAX_OFFSET)
        limit = self.whole_number_arg("limit", default=DEFAULT_LIMIT, minimum=1, maximum=MAX_LIMIT)
        return offset, limit

    def accepts_pagination(self) -> bool:
        """Whether the request's Accept header names the pagination media type."""
        accept = self.request.headers.get("Accept", "")
        return PAGINATION_MEDIA_TYPE in {part.split(";")[0].strip().lower() for part in accept.split(",")}

    def page_url(self, offset: int, limit: int) -> str:
        """The path and query of the page at ``offset``: this request's, with offset and limit set
        (the Hub's ``next.url`` keeps the other query arguments the same way)."""
        query = parse_qs(self.request.query, keep_blank_values=True)
        query["offset"] = [str(offset)]
        query["limit"] = [str(limit)]
        return f"{self.request.path}?{urlencode(query, doseq=True)}"

    def paginated_model(self, page: Page[Any]) -> Any:
        """The body for one page of a list endpoint (its items already rendered); sets the ``Link``
        header to the next page, when there is one, and the pagination media type when asked for."""
        nxt = page.next_offset
        url = self.page_url(nxt, page.limit) if nxt is not None else None
        if url is not None:
            self.set_header("Link", f'<{url}>; rel="next"')
        if not self.accepts_pagination():
            return page.items
        self.set_header("Content-Type", f"{PAGINATION_MEDIA_TYPE}; charset=utf-8")
        return {
            "items": page.items,
            "_pagination": {
                "offset": page.offset,
                "limit": page.limit,
                "total": page.total,
                "next": None if url is None else {"offset": nxt, "limit": page.limit, "url": url},
            },
        }


def needs_hub(actor: Actor) -> None:
    if actor.kind != "hub":
        raise Forbidden("only the Hub may call this endpoint")
