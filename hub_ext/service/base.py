"""The service's base handler: who is asking (Hub token, Hub OAuth cookie, keypair
signature, or the Hub itself), rate limits, JSON in and out, errors as JSON."""

from __future__ import annotations

import hmac
import json
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from jupyterhub.services.auth import HubOAuthenticated, UserNotAllowed
from tornado import web

from hub_ext.core import signing
from hub_ext.core.authz import Actor
from hub_ext.core.db import session_scope
from hub_ext.core.errors import Forbidden, InvalidInput, LabfleetError, RateLimited, Unauthorized
from hub_ext.core.secretbox import SecretKeyMissing
from hub_ext.tenancy import keypairs
from hub_ext.tenancy.directory import actor_for, get_user

MAX_BODY = 1 << 20  # JSON bodies; file uploads (vfolders) have their own streaming handlers


class BaseHandler(HubOAuthenticated, web.RequestHandler):
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

    @property
    def log(self):
        return self.lf.log


class NotFoundHandler(BaseHandler):
    def prepare(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_status(404)
        self.finish(json.dumps({"status": 404, "message": f"no such endpoint: {self.request.path}"}))


class APIHandler(BaseHandler):
    actor: Actor
    rate: signing.RateDecision | None = None

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")

    # ------------------------------------------------------------ authentication

    body: Any = None

    async def prepare(self) -> None:
        try:
            self.actor = await self.authenticate()
            if self.request.method in ("POST", "PATCH", "PUT"):
                self.body = self.json_body()
        except LabfleetError as e:
            self.send_error_json(e.status, e.message)

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
        with self.db() as db:
            user = get_user(db, model["name"])
            if user is None:
                raise Forbidden(f"{model['name']} is not a labfleet user")
            if not user.is_active:
                raise Forbidden(f"user {user.username} is inactive")
            actor = actor_for(user, remote)
            main = user.main_keypair
            # Browser and token requests count against the user's main keypair.
            self._rate_limit(
                main.access_key if main else f"user:{user.username}", main.rate_limit if main else 10000
            )
        return actor

    def _authenticate_signed(self, header: str, remote: str) -> Actor:
        parsed = signing.parse_auth_header(header)
        if parsed is None:
            raise Unauthorized(f"malformed {signing.SCHEME} Authorization header")
        access_key, signature = parsed
        date = self.request.headers.get(signing.DATE_HEADER, "")
        with self.db() as db:
            kp = keypairs.find_active(db, access_key)
            if kp is None:
                raise Unauthorized("unknown or revoked access key")
            try:
                secret = keypairs.secret_of(kp, self.lf.secretbox)
            except SecretKeyMissing as e:
                self.log.error("Cannot check a signed request: %s", e)
                raise Unauthorized("the service cannot check signatures right now") from None
            problem = signing.check_signature(
                secret, self.request.method, self.request.uri, date, self.request.body or b"", signature
            )
            if problem:
                self.log.warning("Refused signed request for %s from %s: %s", access_key, remote, problem)
                raise Unauthorized(problem)
            self._rate_limit(kp.access_key, kp.rate_limit)
            kp.last_used = datetime.now(timezone.utc)
            # Sessions started with this signature are charged to this keypair and its policy.
            return replace(actor_for(kp.user, remote), keypair=kp.access_key)

    def _rate_limit(self, key: str, limit: int) -> None:
        self.rate = self.lf.limiter.hit(key, limit)
        for k, v in self.rate.headers().items():
            self.set_header(k, v)
        if not self.rate.allowed:
            raise RateLimited(
                f"rate limit of {limit} requests per 15 minutes reached; retry after the reset time"
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
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise InvalidInput(f"request body is not valid JSON: {e}") from None

    def write_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(data))

    def send_error_json(self, status: int, message: str) -> None:
        self.clear_header("Content-Type")
        self.set_header("Content-Type", "application/json; charset=utf-8")
        if status == 401:
            self.set_header("WWW-Authenticate", f'token, {signing.SCHEME} realm="labfleet"')
        self.set_status(status)
        self.finish(json.dumps({"status": status, "message": message}))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        message = self._reason
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        self.finish(json.dumps({"status": status_code, "message": message}))

    async def run(self, fn, *args, status: int = 200, after_commit=None):
        """Run ``fn(db, actor, *args)`` in one transaction; answer its result or its error.

        ``after_commit``, when given, is awaited once the change is committed, before the answer.
        """
        try:
            with self.db() as db:
                result, after = fn(db, self.actor, *args)
        except LabfleetError as e:
            self.send_error_json(e.status, e.message)
            return
        if self.request.method != "GET":
            # Any committed write may have made room (a limit raised, a node, a release): serve the queues.
            self.lf.jobs.poke("schedule")
        if after is not None:
            # After commit: tell the Hub (groups follow tenancy); never fails the request.
            await self.lf.hub_sync.apply(after)
        if after_commit is not None:
            await after_commit()
        self.write_json(result, status)

    def query_arg(self, name: str) -> str | None:
        value = self.get_query_argument(name, None)
        if value is not None and (len(value) > 255 or "\x00" in value):
            raise InvalidInput(f"query argument {name} is not acceptable")
        return value


def needs_hub(actor: Actor) -> None:
    if actor.kind != "hub":
        raise Forbidden("only the Hub may call this endpoint")
