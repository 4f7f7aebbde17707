"""The credential of a replica: what the router sends with every call to it, and what the replica's
front (:mod:`labfleet.session.front`) demands before it passes a byte on to the model (pure).

A replica's port can be reached by more than its router: anyone on the host, and other sessions where
sessions share the host's network (Docker or Swarm host networking, a local Hub that is not root).
So each replica answers only calls that carry ``X-Labfleet-Replica-Credential: <its credential>``:

- derived, never stored: ``HMAC-SHA256(K, "<endpoint id>/<route id>")`` where ``K`` is itself an HMAC
  of the service's secret key (:mod:`labfleet.core.secretbox`) for this one use; the service (router,
  health checks) computes it when it needs it, and no row or migration holds it;
- one per replica: a credential leaked from one replica opens no other;
- delivered to the replica's session by a call the session makes with its own Hub token,
  ``GET /api/sessions/<id>/replica-credential`` (the session's owner and the Hub only; 404 to anyone
  else and for a session that is not a replica), never through the spawn options, the environment,
  a log or a page.

The front strips the header (and :data:`PROBE_HEADER`) before the model sees the request.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

HEADER = "X-Labfleet-Replica-Credential"
# With the credential, asks the front whether its command accepts connections (204, else 502): the
# engine's health check of a replica whose definition has no health_check (a TCP connect to the front
# itself would always succeed).
PROBE_HEADER = "X-Labfleet-Replica-Probe"
# On the front's own 502 when its command refused the connection: nothing reached the model, so the
# router tries the next replica as if the replica had refused the connection itself.
REFUSED_HEADER = "X-Labfleet-Replica-Refused"
PREFIX = "lfrc_"
_PURPOSE = b"labfleet serving: replica credentials v1"


def derive_key(secret_key: bytes) -> bytes:
    """The key of replica credentials, from the service's secret key (one key, one use)."""
    if not secret_key:
        raise ValueError("no secret key to derive replica credentials from")
    return hmac.new(secret_key, _PURPOSE, hashlib.sha256).digest()


def credential(key: bytes, endpoint_id: str, route_id: int) -> str:
    """The credential of replica ``route_id`` of endpoint ``endpoint_id`` (``key`` from :func:`derive_key`)."""
    mac = hmac.new(key, f"{endpoint_id}/{int(route_id)}".encode(), hashlib.sha256).digest()
    return PREFIX + base64.urlsafe_b64encode(mac).rstrip(b"=").decode("ascii")


def matches(given: str | bytes | None, expected: str | bytes) -> bool:
    """Whether ``given`` is ``expected``, in time that does not depend on where they differ."""
    if given is None:
        return False
    a = given.encode("latin-1", "replace") if isinstance(given, str) else given
    b = expected.encode("latin-1", "replace") if isinstance(expected, str) else expected
    return hmac.compare_digest(a.strip(), b)
