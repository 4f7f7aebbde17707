"""Keypair request signing (HMAC-SHA256), replay protection and the per-keypair rate limit.

A signed request carries::

    X-Labfleet-Date: 2026-11-21T10:00:00Z
    X-Labfleet-Nonce: 3q2-7wE_ZkR9yT0uVbXc1A      (optional: 16 to 128 of A-Z a-z 0-9 - _)
    Authorization: LABFLEET-HMAC-SHA256 AccessKey=AKxxxxxxxxxxxxxxxxxx, Signature=<hex>

where the signature is HMAC-SHA256(secret_key, canonical) over::

    METHOD \\n PATH?QUERY \\n X-Labfleet-Date \\n hex(SHA256(body))

or, with a nonce, over::

    METHOD \\n PATH?QUERY \\n X-Labfleet-Date \\n X-Labfleet-Nonce \\n hex(SHA256(body))

The path is the one the service receives (``/services/labfleet/api/...``).  A date
more than 15 minutes away from the service's clock is refused, so a captured
request cannot be replayed later.  A nonce is accepted once per access key while
its request's date is within that window (``NonceCache``), so a request that
carries one cannot be replayed at all.  Pure module apart from the clock default.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import math
import re
import secrets
import string
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from labfleet.core.errors import LabfleetError, RateLimited, Unauthorized

SCHEME = "LABFLEET-HMAC-SHA256"
DATE_HEADER = "X-Labfleet-Date"
NONCE_HEADER = "X-Labfleet-Nonce"
NONCE_MIN_LEN = 16
NONCE_MAX_LEN = 128
MAX_SKEW_SECONDS = 15 * 60
RATE_WINDOW_SECONDS = 15 * 60

ACCESS_KEY_LEN = 20
SECRET_KEY_LEN = 40
_ACCESS_ALPHABET = string.ascii_uppercase + string.digits
_SECRET_ALPHABET = string.ascii_letters + string.digits

_NONCE_RE = re.compile(rf"[A-Za-z0-9_-]{{{NONCE_MIN_LEN},{NONCE_MAX_LEN}}}")
_AUTH_RE = re.compile(
    rf"^{SCHEME}\s+AccessKey=(?P<ak>[A-Z0-9]{{{ACCESS_KEY_LEN}}}),\s*Signature=(?P<sig>[0-9a-f]{{64}})$"
)


def new_access_key() -> str:
    # "AK" prefix makes a leaked key easy to recognise in logs and scanners.
    return "AK" + "".join(secrets.choice(_ACCESS_ALPHABET) for _ in range(ACCESS_KEY_LEN - 2))


def new_secret_key() -> str:
    return "".join(secrets.choice(_SECRET_ALPHABET) for _ in range(SECRET_KEY_LEN))


def new_nonce() -> str:
    """A fresh nonce: 32 URL-safe characters (192 random bits)."""
    return secrets.token_urlsafe(24)


def nonce_problem(nonce: str) -> str | None:
    """None when ``nonce`` has the right form, else what is wrong with it."""
    if _NONCE_RE.fullmatch(nonce):
        return None
    return (
        f"{NONCE_HEADER} must be {NONCE_MIN_LEN} to {NONCE_MAX_LEN} URL-safe characters "
        "(A-Z, a-z, 0-9, '-' and '_')"
    )


def format_date(ts: float | None = None) -> str:
    return datetime.fromtimestamp(ts if ts is not None else time.time(), timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


def canonical_request(method: str, path: str, date: str, body: bytes, nonce: str | None = None) -> bytes:
    """What is signed; the nonce line is there only when the request carries a nonce (so
    requests signed before nonces existed still check, and a nonce cannot be stripped)."""
    lines = [method.upper(), path, date]
    if nonce is not None:
        lines.append(nonce)
    lines.append(hashlib.sha256(body or b"").hexdigest())
    return "\n".join(lines).encode()


def sign(
    secret_key: str, method: str, path: str, date: str, body: bytes = b"", nonce: str | None = None
) -> str:
    return hmac.new(
        secret_key.encode(), canonical_request(method, path, date, body, nonce), hashlib.sha256
    ).hexdigest()


def auth_header(access_key: str, signature: str) -> str:
    return f"{SCHEME} AccessKey={access_key}, Signature={signature}"


def signed_headers(
    access_key: str,
    secret_key: str,
    method: str,
    path: str,
    body: bytes = b"",
    now=None,
    nonce: str | bool | None = None,
) -> dict:
    """Headers for a signed request (used by the CLI client and the tests).

    ``nonce=True`` signs with a fresh nonce (``new_nonce()``), a string signs with that one;
    the service then refuses the same request a second time.  Without a nonce the request
    may be sent again while its date is within 15 minutes of the service's clock.
    """
    date = format_date(now)
    value = new_nonce() if nonce is True else (nonce or None)
    headers = {DATE_HEADER: date}
    if value is not None:
        headers[NONCE_HEADER] = value
    headers["Authorization"] = auth_header(access_key, sign(secret_key, method, path, date, body, value))
    return headers


def parse_auth_header(value: str) -> tuple[str, str] | None:
    """(access_key, signature) from an Authorization header, None if it is not ours."""
    m = _AUTH_RE.match(value.strip())
    return (m.group("ak"), m.group("sig")) if m else None


def is_signed_request(authorization: str | None) -> bool:
    return authorization is not None and authorization.strip().startswith(SCHEME)


def parse_date(value: str) -> float | None:
    try:
        dt = datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except (TypeError, ValueError):
        return None
    return dt.timestamp()


def check_signature(
    secret_key: str,
    method: str,
    path: str,
    date: str,
    body: bytes,
    signature: str,
    now: float | None = None,
    *,
    nonce: str | None = None,
) -> str | None:
    """None when the signature is good and fresh, else the reason it is refused.

    ``nonce`` is the request's X-Labfleet-Nonce (None when it has none); whether it was
    used before is ``NonceCache``'s business, once the signature is known to be good.
    """
    ts = parse_date(date)
    if ts is None:
        return f"{DATE_HEADER} must be an ISO 8601 UTC time like 2026-11-21T10:00:00Z"
    if nonce is not None and (problem := nonce_problem(nonce)):
        return problem
    now = time.time() if now is None else now
    if abs(now - ts) > MAX_SKEW_SECONDS:
        return f"request date is more than {MAX_SKEW_SECONDS // 60} minutes from the server's clock"
    expected = sign(secret_key, method, path, date, body, nonce)
    if not hmac.compare_digest(expected, signature):
        return "signature does not match"
    return None


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    limit: int
    remaining: int
    reset: int  # epoch seconds when the window ends

    def headers(self) -> dict[str, str]:
        out = {
            "X-RateLimit-Limit": str(self.limit),
            "X-RateLimit-Remaining": str(self.remaining),
            "X-RateLimit-Reset": str(self.reset),
        }
        if not self.allowed:
            out["Retry-After"] = str(self.retry_after())
        return out

    def retry_after(self, now: float | None = None) -> int:
        """Whole seconds until the window resets (at least 1)."""
        now = time.time() if now is None else now
        return max(1, math.ceil(self.reset - now))


class RateLimiter:
    """Fixed 15-minute windows per access key, in the service's memory.

    The service is the single process that answers API calls, so memory is the
    right place; a restart starts fresh windows, which only ever errs in the user's favour.
    """

    def __init__(self, window: int = RATE_WINDOW_SECONDS) -> None:
        self.window = window
        self._counts: dict[str, tuple[int, int]] = {}

    def hit(self, key: str, limit: int, now: float | None = None) -> RateDecision:
        now = time.time() if now is None else now
        window_id = int(now // self.window)
        reset = (window_id + 1) * self.window
        wid, count = self._counts.get(key, (window_id, 0))
        if wid != window_id:
            count = 0
        if count >= limit:
            self._counts[key] = (window_id, count)
            return RateDecision(False, limit, 0, reset)
        count += 1
        self._counts[key] = (window_id, count)
        if len(self._counts) > 100_000:  # drop stale windows; bounded memory
            self._counts = {k: v for k, v in self._counts.items() if v[0] == window_id}
        return RateDecision(True, limit, limit - count, reset)


class NonceCache:
    """Nonces of signed requests, remembered per access key while their request could still
    be accepted (its date within ``window`` seconds of the clock), in the service's memory.

    Memory is bounded: at most ``max_per_key`` live nonces per access key (past that, that
    key's requests with a nonce get 429 until older ones expire) and ``max_entries`` in all
    (past that, 503).  It never forgets a live nonce to make room, so a replay is always caught
    while the service runs; a restart forgets them (a request from before it could then be sent
    once more, within its 15 minutes, as without a nonce).
    """

    def __init__(
        self, window: int = MAX_SKEW_SECONDS, max_entries: int = 100_000, max_per_key: int = 10_000
    ) -> None:
        self.window = window
        self.max_entries = max_entries
        self.max_per_key = max_per_key
        self._expiry: dict[tuple[str, str], float] = {}
        self._heap: list[tuple[float, str, str]] = []  # (expiry, key, nonce), soonest first
        self._per_key: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._expiry)

    def _forget_expired(self, now: float) -> None:
        while self._heap and self._heap[0][0] < now:
            _, key, nonce = heapq.heappop(self._heap)
            del self._expiry[(key, nonce)]
            left = self._per_key[key] - 1
            if left:
                self._per_key[key] = left
            else:
                del self._per_key[key]

    def use(self, key: str, nonce: str, date_ts: float, now: float | None = None) -> None:
        """Record that ``key`` used ``nonce`` on a request dated ``date_ts`` (epoch seconds).

        Raises Unauthorized when it was used before (a replay), RateLimited when this key holds
        too many live nonces, LabfleetError (503) when the memory is full.
        """
        now = time.time() if now is None else now
        self._forget_expired(now)
        if (key, nonce) in self._expiry:
            raise Unauthorized(
                f"replayed request: this {NONCE_HEADER} was already used with this access key; "
                "sign every request with a new nonce"
            )
        if self._per_key.get(key, 0) >= self.max_per_key:
            oldest = min(t for (k, _), t in self._expiry.items() if k == key)
            raise RateLimited(
                f"this access key sent more than {self.max_per_key} requests with a nonce in "
                f"{self.window // 60} minutes; retry later",
                retry_after=math.ceil(oldest - now),
            )
        if len(self._expiry) >= self.max_entries:
            raise LabfleetError(
                "the service remembers too many recent nonces to accept another; retry later", status=503
            )
        # The request's signature is accepted until date + window: remember the nonce that long.
        expiry = max(date_ts + self.window, now)
        self._expiry[(key, nonce)] = expiry
        self._per_key[key] = self._per_key.get(key, 0) + 1
        heapq.heappush(self._heap, (expiry, key, nonce))
