"""Keypair request signing (HMAC-SHA256) and the per-keypair rate limit.

A signed request carries::

    X-Labfleet-Date: 2026-11-21T10:00:00Z
    Authorization: LABFLEET-HMAC-SHA256 AccessKey=AKxxxxxxxxxxxxxxxxxx, Signature=<hex>

where the signature is HMAC-SHA256(secret_key, canonical) over::

    METHOD \\n PATH?QUERY \\n X-Labfleet-Date \\n hex(SHA256(body))

The path is the one the service receives (``/services/labfleet/api/...``).  A date
more than 15 minutes away from the service's clock is refused, so a captured
request cannot be replayed later.  Pure module apart from the clock default.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import string
import time
from dataclasses import dataclass
from datetime import datetime, timezone

SCHEME = "LABFLEET-HMAC-SHA256"
DATE_HEADER = "X-Labfleet-Date"
MAX_SKEW_SECONDS = 15 * 60
RATE_WINDOW_SECONDS = 15 * 60

ACCESS_KEY_LEN = 20
SECRET_KEY_LEN = 40
_ACCESS_ALPHABET = string.ascii_uppercase + string.digits
_SECRET_ALPHABET = string.ascii_letters + string.digits

_AUTH_RE = re.compile(
    rf"^{SCHEME}\s+AccessKey=(?P<ak>[A-Z0-9]{{{ACCESS_KEY_LEN}}}),\s*Signature=(?P<sig>[0-9a-f]{{64}})$"
)


def new_access_key() -> str:
    # "AK" prefix makes a leaked key easy to recognise in logs and scanners.
    return "AK" + "".join(secrets.choice(_ACCESS_ALPHABET) for _ in range(ACCESS_KEY_LEN - 2))


def new_secret_key() -> str:
    return "".join(secrets.choice(_SECRET_ALPHABET) for _ in range(SECRET_KEY_LEN))


def format_date(ts: float | None = None) -> str:
    return datetime.fromtimestamp(ts if ts is not None else time.time(), timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


def canonical_request(method: str, path: str, date: str, body: bytes) -> bytes:
    return "\n".join([method.upper(), path, date, hashlib.sha256(body or b"").hexdigest()]).encode()


def sign(secret_key: str, method: str, path: str, date: str, body: bytes = b"") -> str:
    return hmac.new(
        secret_key.encode(), canonical_request(method, path, date, body), hashlib.sha256
    ).hexdigest()


def auth_header(access_key: str, signature: str) -> str:
    return f"{SCHEME} AccessKey={access_key}, Signature={signature}"


def signed_headers(
    access_key: str, secret_key: str, method: str, path: str, body: bytes = b"", now=None
) -> dict:
    """Headers for a signed request (used by the CLI client and the tests)."""
    date = format_date(now)
    return {
        DATE_HEADER: date,
        "Authorization": auth_header(access_key, sign(secret_key, method, path, date, body)),
    }


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
    secret_key: str, method: str, path: str, date: str, body: bytes, signature: str, now: float | None = None
) -> str | None:
    """None when the signature is good and fresh, else the reason it is refused."""
    ts = parse_date(date)
    if ts is None:
        return f"{DATE_HEADER} must be an ISO 8601 UTC time like 2026-11-21T10:00:00Z"
    now = time.time() if now is None else now
    if abs(now - ts) > MAX_SKEW_SECONDS:
        return f"request date is more than {MAX_SKEW_SECONDS // 60} minutes from the server's clock"
    expected = sign(secret_key, method, path, date, body)
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
        return {
            "X-RateLimit-Limit": str(self.limit),
            "X-RateLimit-Remaining": str(self.remaining),
            "X-RateLimit-Reset": str(self.reset),
        }


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
