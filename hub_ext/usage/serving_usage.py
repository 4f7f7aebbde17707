"""Model serving's usage over time: requests, errors and latency per endpoint and per token.

The router counts every request in memory (``ServingController.count``); each tick the engine adds the
counts to its cumulative columns and, through :func:`record`, to the 15-minute rows of
``serving_usage`` (one per endpoint, token and bucket; token None for requests without one, to an
endpoint open to the public), so that "how many requests yesterday" has an answer. A tick's counts
go to the bucket of the tick that writes them: a request in the last seconds of a quarter may land in
the next one.

:func:`report` answers the ``serving`` part of ``GET /api/usage`` over the asked period and in its
buckets, scoped like the rest of the usage statistics (a user: the endpoints they own; a domain
admin: their domain's; monitors and superadmins: all); :func:`add_to_me` the ``serving`` parts of
``GET /api/usage/me``. A mean latency is the summed latency over the requests (None without one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from labfleet.core.authz import Actor
from labfleet.core.errors import InvalidInput
from labfleet.core.models import ServingEndpoint, ServingToken, ServingUsage
from labfleet.usage import accrual
from labfleet.usage.stats import MAX_ROWS, UsageQuery, bucket_expr, bucket_value, scope_filter


class Counted(Protocol):
    """What the engine counted of one endpoint or token since the last tick."""

    requests: int
    errors: int
    latency_ms: float


@dataclass
class Counts:
    requests: int = 0
    errors: int = 0
    latency_ms: float = 0.0


Key = tuple[str, int | None]  # endpoint id, token id (None: no token)


def split(
    endpoint_counts: Mapping[str, Counted],
    token_counts: Mapping[int, Counted],
    token_endpoint: Mapping[int, str],
) -> dict[Key, Counts]:
    """Per (endpoint, token) from the engine's two tallies: every request counts for its endpoint and,
    when it came with a token, for that token too, so what an endpoint has beyond its tokens' came
    without one. A token not in ``token_endpoint`` (gone from the DB) stays in its endpoint's rest."""
    rest = {eid: Counts(c.requests, c.errors, c.latency_ms) for eid, c in endpoint_counts.items()}
    out: dict[Key, Counts] = {}
    for tid, c in token_counts.items():
        eid = token_endpoint.get(tid)
        if eid is None or c.requests <= 0:
            continue
        out[(eid, tid)] = Counts(c.requests, c.errors, c.latency_ms)
        r = rest.get(eid)
        if r is not None:
            r.requests -= c.requests
            r.errors -= c.errors
            r.latency_ms -= c.latency_ms
    for eid, r in rest.items():
        if r.requests > 0:
            out[(eid, None)] = Counts(r.requests, max(0, r.errors), max(0.0, r.latency_ms))
    return out


def record(
    db: Session,
    endpoint_counts: Mapping[str, Counted],
    token_counts: Mapping[int, Counted],
    at: datetime,
) -> int:
    """Add one tick's counts to the rows of the 15-minute bucket of ``at``; the rows touched."""
    token_endpoint = {}
    if token_counts:
        token_endpoint = {
            tid: eid
            for tid, eid in db.execute(
                select(ServingToken.id, ServingToken.endpoint_id).where(
                    ServingToken.id.in_(list(token_counts))
                )
            )
        }
    rows = split(endpoint_counts, token_counts, token_endpoint)
    if not rows:
        return 0
    eids = sorted({eid for eid, _ in rows})
    endpoints = {e.id: e for e in db.scalars(select(ServingEndpoint).where(ServingEndpoint.id.in_(eids)))}
    start = accrual.floor_bucket(at)
    have = {
        (u.endpoint_id, u.token_id): u
        for u in db.scalars(
            select(ServingUsage).where(ServingUsage.bucket_start == start, ServingUsage.endpoint_id.in_(eids))
        )
    }
    n = 0
    for (eid, tid), c in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        e = endpoints.get(eid)
        if e is None:
            continue  # deleted since: nothing to name the row with
        u = have.get((eid, tid))
        if u is None:
            u = ServingUsage(
                endpoint_id=eid,
                endpoint=e.name,
                token_id=tid,
                bucket_start=start,
                user=e.user.username,
                project=f"{e.domain.name}/{e.project.name}",
                domain=e.domain.name,
                requests=0,
                errors=0,
                latency_ms_total=0.0,
            )
            db.add(u)
        u.requests += c.requests
        u.errors += c.errors
        u.latency_ms_total += c.latency_ms
        n += 1
    return n


# ---------------------------------------------------------------- GET /api/usage


def _mean(total_ms: float, requests: int) -> float | None:
    return round(total_ms / requests, 3) if requests else None


def _figures(requests: Any, errors: Any, latency: Any) -> dict[str, Any]:
    n = int(requests or 0)
    return {"requests": n, "errors": int(errors or 0), "latency_ms_mean": _mean(float(latency or 0.0), n)}


def report(db: Session, actor: Actor, q: UsageQuery) -> dict[str, Any]:
    """Serving over ``q``'s period (widened to whole 15-minute buckets) in its buckets: the totals,
    per endpoint (with its owner, project and domain) and per token, what ``actor`` may read."""
    su = ServingUsage
    start = accrual.floor_bucket(q.start)
    where = [su.bucket_start >= start, su.bucket_start < q.end, *scope_filter(actor, su)]
    sums = (func.sum(su.requests), func.sum(su.errors), func.sum(su.latency_ms_total))
    b = [bucket_expr(db.get_bind().dialect.name, q.bucket, su.bucket_start)] if q.bucket != "none" else []
    total = db.execute(select(*sums).where(*where)).one()
    per_endpoint = [su.endpoint_id, su.endpoint, su.user, su.project, su.domain, *b]
    per_token = [su.endpoint_id, su.endpoint, su.token_id, *b]
    endpoints = list(
        db.execute(select(*per_endpoint, *sums).where(*where).group_by(*per_endpoint).limit(MAX_ROWS + 1))
    )
    tokens = list(
        db.execute(
            select(*per_token, *sums)
            .where(*where, su.token_id.is_not(None))
            .group_by(*per_token)
            .limit(MAX_ROWS + 1)
        )
    )
    if len(endpoints) > MAX_ROWS or len(tokens) > MAX_ROWS:
        raise InvalidInput(f"more than {MAX_ROWS} serving rows: use a larger bucket or a shorter range")

    def when(row: Any, n: int) -> str | None:
        t = bucket_value(row[n], q.bucket) if b else None
        return t.isoformat() if t else None

    out_e = [
        {
            "endpoint": r[1],
            "endpoint_id": r[0],
            "user": r[2],
            "project": r[3],
            "domain": r[4],
            "bucket": when(r, 5),
            **_figures(*r[5 + len(b) :]),
        }
        for r in endpoints
    ]
    out_t = [
        {
            "token_id": r[2],
            "endpoint": r[1],
            "endpoint_id": r[0],
            "bucket": when(r, 3),
            **_figures(*r[3 + len(b) :]),
        }
        for r in tokens
    ]
    out_e.sort(key=lambda r: (r["endpoint"], r["endpoint_id"], r["bucket"] or ""))
    out_t.sort(key=lambda r: (r["endpoint"], r["token_id"], r["bucket"] or ""))
    return {**_figures(*total), "endpoints": out_e, "tokens": out_t}


def _none() -> dict[str, Any]:
    return {**_figures(0, 0, 0), "endpoints": [], "tokens": []}


def add_to_me(db: Session, actor: Actor, answer: dict[str, Any]) -> dict[str, Any]:
    """``answer`` (:func:`labfleet.usage.stats.me`) with serving: per period the caller's endpoints'
    totals, per endpoint and per token; per day the totals."""
    mine = Actor(name=actor.name, role="user", domain=actor.domain, kind="user")
    now = datetime.fromisoformat(answer["now"])
    for period in answer["periods"]:
        start = datetime.fromisoformat(period["start"])
        period["serving"] = (
            report(db, mine, UsageQuery("user", start, now, "none")) if start < now else _none()
        )
    days = answer["daily"]
    if not days:
        return answer
    su = ServingUsage
    b = bucket_expr(db.get_bind().dialect.name, "day", su.bucket_start)
    rows = db.execute(
        select(b, func.sum(su.requests), func.sum(su.errors), func.sum(su.latency_ms_total))
        .where(
            su.bucket_start >= datetime.fromisoformat(days[0]["bucket"]),
            su.bucket_start < now,
            *scope_filter(mine, su),
        )
        .group_by(b)
    )
    by_day = {}
    for day, *figures in rows:
        t = bucket_value(day, "day")
        if t is not None:
            by_day[t.isoformat()] = _figures(*figures)
    for d in days:
        d["serving"] = by_day.get(d["bucket"]) or _figures(0, 0, 0)
    return answer
