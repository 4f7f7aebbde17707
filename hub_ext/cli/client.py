"""Commands that call the labfleet service's REST API as a person, rather than work on the DB.

Most ``labfleet`` commands are an admin's, on the database itself (:mod:`labfleet.cli.base`).
Some things only the running service can do (an import runs as one of its jobs), and they are a
user's, not the admin's: those commands are :class:`ApiCommand` and call the API over HTTP,
through :class:`ServiceClient`.

Where: ``--service-url``, else ``$LABFLEET_SERVICE_URL``, else the Hub that ``scripts/up`` starts
(``http://$LABFLEET_IP:$LABFLEET_PORT/services/labfleet/api``).

Who: a keypair, ``$LABFLEET_ACCESS_KEY`` and ``$LABFLEET_SECRET_ACCESS_KEY`` (``labfleet keypair
issue USER`` prints one), every request signed with HMAC-SHA256 and a fresh nonce
(:func:`labfleet.core.signing.signed_headers`); else a Hub API token, ``$LABFLEET_API_TOKEN`` or
``$JUPYTERHUB_API_TOKEN`` (a session's own). Credentials come from the environment only, never
from an option: a command line shows in ``ps`` and in shell history.

The service's refusal is the command's error, in the service's words: exit 2 for bad input (400),
1 for anything else refused or failed.
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

from labfleet.cli.base import DEBUG_OPTION, CliError, Command, Option, UsageError

SERVICE_PATH = "/services/labfleet/api"
ACCESS_KEY_ENV = "LABFLEET_ACCESS_KEY"
SECRET_KEY_ENV = "LABFLEET_SECRET_ACCESS_KEY"
TOKEN_ENVS = ("LABFLEET_API_TOKEN", "JUPYTERHUB_API_TOKEN")
SERVICE_URL_ENV = "LABFLEET_SERVICE_URL"
TIMEOUT = 30.0
_MAX_ANSWER = 16 << 20  # the most of an answer read (a list of imports is far less)

SERVICE_URL_OPTION = Option(
    "--service-url",
    f"""The labfleet service's API, e.g. https://hub.example.org{SERVICE_PATH}. Default:
    ${SERVICE_URL_ENV}, else the local Hub's ($LABFLEET_IP, $LABFLEET_PORT). Credentials come
    from the environment: ${ACCESS_KEY_ENV} and ${SECRET_KEY_ENV} (a keypair), or
    ${TOKEN_ENVS[0]} (a Hub API token).""",
    metavar="URL",
)


def default_service_url() -> str:
    """``$LABFLEET_SERVICE_URL``, else the API of the Hub ``scripts/up`` starts."""
    given = os.environ.get(SERVICE_URL_ENV, "").strip()
    if given:
        return given
    ip = os.environ.get("LABFLEET_IP") or "127.0.0.1"
    host = "127.0.0.1" if ip in ("0.0.0.0", "*") else ip
    return f"http://{host}:{os.environ.get('LABFLEET_PORT') or 8000}{SERVICE_PATH}"


def check_service_url(url: str) -> str:
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(
            f"--service-url must be an http(s) URL such as http://HUB{SERVICE_PATH} (got {url!r:.80})"
        )
    if parts.query or parts.fragment or "@" in parts.netloc:
        raise UsageError(
            "--service-url takes no query, fragment or credentials (credentials come from the environment)"
        )
    return url.strip().rstrip("/")


@dataclass(frozen=True)
class Credentials:
    """A keypair (signed requests) or a Hub API token; never printed (``repr`` hides them)."""

    access_key: str = ""
    secret_key: str = field(default="", repr=False)
    token: str = field(default="", repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Credentials:
        ak, sk = env.get(ACCESS_KEY_ENV, "").strip(), env.get(SECRET_KEY_ENV, "").strip()
        if ak or sk:
            if not (ak and sk):
                missing = SECRET_KEY_ENV if ak else ACCESS_KEY_ENV
                raise UsageError(
                    f"${missing} is not set: a keypair needs both its access key and its secret key"
                )
            return cls(access_key=ak, secret_key=sk)
        for name in TOKEN_ENVS:
            token = env.get(name, "").strip()
            if token:
                return cls(token=token)
        raise UsageError(
            f"no credentials for the labfleet service: set ${ACCESS_KEY_ENV} and ${SECRET_KEY_ENV} "
            f"(a keypair: `labfleet keypair issue USER`), or ${TOKEN_ENVS[0]} (a Hub API token)"
        )

    def headers(self, method: str, path: str, body: bytes) -> dict[str, str]:
        if self.token:
            return {"Authorization": f"token {self.token}"}
        from labfleet.core import signing

        return signing.signed_headers(self.access_key, self.secret_key, method, path, body, nonce=True)


@dataclass(frozen=True)
class Reply:
    status: int
    data: Any
    headers: Mapping[str, str]


class ServiceUnreachable(CliError):
    """No answer, or an answer that is not the service's (a 5xx, a page that is not JSON)."""


class RateLimited(CliError):
    """429: the keypair's requests per window are spent; ``retry_after`` seconds until they are not."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is answered, not followed (the Hub sends a stranger to its login page)."""

    def redirect_request(
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> None:
        return None


class ServiceClient:
    """Calls the labfleet service's API at ``base_url`` (…/services/labfleet/api) as ``credentials``."""

    def __init__(self, base_url: str, credentials: Credentials, timeout: float = TIMEOUT) -> None:
        self.base_url = base_url.rstrip("/")
        self.credentials = credentials
        self.timeout = timeout
        self._opener = urllib.request.build_opener(_NoRedirect)

    def call(self, method: str, path: str, body: Any = None) -> Reply:
        """``method`` on ``path`` (under the API, e.g. ``/imports``); the service's answer when it is a
        success. A refusal raises :class:`CliError` in the service's words (exit 2 for a 400);
        no answer, or one that is not the service's, :class:`ServiceUnreachable`."""
        url = self.base_url + path
        payload = b"" if body is None else json.dumps(body).encode()
        headers = {
            "Accept": "application/json",
            **self.credentials.headers(method, urlsplit(url).path, payload),
        }
        if body is not None:
            headers["Content-Type"] = "application/json"
        data = payload if method in ("POST", "PUT", "PATCH") else None
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with self._opener.open(request, timeout=self.timeout) as answer:
                return Reply(
                    answer.status, self._json(answer.read(_MAX_ANSWER), answer.status), dict(answer.headers)
                )
        except urllib.error.HTTPError as e:
            try:
                raw = e.read(_MAX_ANSWER)
            except (OSError, AttributeError, ValueError):
                raw = b""
            finally:
                e.close()
            refusal = self._refusal(e.code, str(e.reason or ""), raw)
            if e.code == 429:
                refusal = RateLimited(refusal.message, _seconds(e.headers.get("Retry-After")))
            raise refusal from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", None) or e
            raise ServiceUnreachable(
                f"cannot reach the labfleet service at {self.base_url}: {reason}"
            ) from None

    def _json(self, raw: bytes, status: int) -> Any:
        try:
            return json.loads(raw) if raw.strip() else None
        except (ValueError, UnicodeDecodeError):
            raise ServiceUnreachable(
                f"{self.base_url} answered {status} with something that is not the labfleet service's "
                f"JSON: is it the service's API (…{SERVICE_PATH})?"
            ) from None

    def _refusal(self, status: int, reason: str, raw: bytes) -> CliError:
        try:
            data = json.loads(raw) if raw.strip() else None
        except (ValueError, UnicodeDecodeError):
            data = None
        message = str(data.get("message") or "") if isinstance(data, dict) else ""
        if 300 <= status < 400:
            return ServiceUnreachable(
                f"{self.base_url} answered {status} (a redirect, to "
                f"{urlsplit(self.base_url).netloc}'s login?): is it the service's API (…{SERVICE_PATH})?"
            )
        if status >= 500 or not message:
            what = message or f"answered {status} {reason}".strip()
            return ServiceUnreachable(f"the labfleet service at {self.base_url}: {what}")
        return CliError(message, 2 if status == 400 else 1)


def _seconds(value: str | None, default: float = 1.0) -> float:
    try:
        return max(1.0, float(value)) if value else default
    except ValueError:
        return default


def path_part(value: str, what: str, example: str) -> str:
    """``value`` as one segment of an API path; anything that would need quoting is refused here
    (a signed request signs the path as sent, so it must reach the service as it was written)."""
    if not value or quote(value, safe=":@") != value or value in (".", ".."):
        raise UsageError(f"{what} must be {example} (got {value!r:.80})")
    return value


class ApiCommand(Command):
    """A command that calls the labfleet service (no database: no ``--db-url``)."""

    def __init__(self, args: Sequence[str], opts: argparse.Namespace) -> None:
        self.args = list(args)
        self.opts = opts

    @classmethod
    def all_options(cls) -> tuple[Option, ...]:
        return (*cls.options, SERVICE_URL_OPTION, DEBUG_OPTION)

    _client: ServiceClient | None = None

    @property
    def client(self) -> ServiceClient:
        if self._client is None:
            url = check_service_url(self.opts.service_url or default_service_url())
            self._client = ServiceClient(url, Credentials.from_env(os.environ))
        return self._client
