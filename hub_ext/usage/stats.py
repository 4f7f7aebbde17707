"""Usage statistics: ``GET /api/usage`` and ``GET /api/usage/me`` (and ``labfleet usage``).

:func:`parse_query` turns the query arguments into a :class:`UsageQuery` (400 for anything it
cannot take); :func:`report` sums the 15-minute buckets of :mod:`labfleet.usage.records` in SQL,
grouped by user, project, domain, resource group or session and by 15 minutes, hour, day or not at
all, scoped to what the caller may read, and adds what live sessions held since their last accrual
(so a running session's figures reach now). :func:`as_csv` writes the same rows for chargeback.

Amounts are slot-seconds (see :mod:`labfleet.usage.accrual`); a range is widened to whole
15-minute buckets.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import Select, func, select, union_all
from sqlalchemy.orm import Session

from labfleet.core.authz import Actor
from labfleet.core.errors import InvalidInput, NotFound
from labfleet.core.models import UsageBucket, UsageDay, UsageSessionState
from labfleet.core.vocab import CHARGED_SLOTS
from labfleet.usage import accrual, records

GROUPS = ("user", "project", "domain", "resource_group", "session")
BUCKETS = {"15m": accrual.BUCKET_SECONDS, "hour": 3600, "day": 86400, "none": 0}
FORMATS = ("json", "csv")
PARAMS = ("group_by", "start", "end", "bucket", "format")
MAX_RANGE = timedelta(days=400)
MAX_BUCKETS = 3000  # per group: 31 days of 15-minute buckets
MAX_ROWS = 100_000
DEFAULT_RANGE = timedelta(days=30)
_USED = ("cpu", "mem", "mem_peak", "gpu.shares", "gpu_mem_peak")


@dataclass(frozen=True)
class UsageQuery:
    group_by: str
    start: datetime
    end: datetime
    bucket: str
    format: str = "json"


def _time(value: str, name: str) -> datetime:
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(
            f"{name} must be an ISO 8601 time such as 2026-11-01T00:00:00Z, not {value[:40]!r}"
        ) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    try:
        t = t.astimezone(timezone.utc)
    except (OverflowError, ValueError):
        raise InvalidInput(f"{name} is out of range") from None
    if t.year < 2000 or t.year > 9000:
        raise InvalidInput(f"{name} must be between the years 2000 and 9000, not {t.year}")
    return t


def _choice(args: Mapping[str, str | None], name: str, choices: tuple[str, ...], default: str) -> str:
    """A query argument that names one of ``choices``; ``default`` when absent (an empty one is wrong)."""
    value = args.get(name)
    if value is None:
        return default
    if value not in choices:
        raise InvalidInput(f"{name} must be one of {', '.join(choices)}, not {value[:40]!r}")
    return value


def parse_query(args: Mapping[str, str | None], now: datetime) -> UsageQuery:
    """The query of ``GET /api/usage`` from its arguments; InvalidInput (400) with a message otherwise."""
    unknown = sorted(k for k in args if k not in PARAMS)
    if unknown:
        raise InvalidInput(
            f"unknown query argument(s) {', '.join(unknown)[:100]}; known: {', '.join(PARAMS)}"
        )
    group_by = _choice(args, "group_by", GROUPS, "user")
    bucket = _choice(args, "bucket", tuple(BUCKETS), "none")
    fmt = _choice(args, "format", FORMATS, "json")
    end_arg, start_arg = args.get("end"), args.get("start")
    end = _time(end_arg, "end") if end_arg is not None else now
    start = _time(start_arg, "start") if start_arg is not None else end - DEFAULT_RANGE
    if end <= start:
        raise InvalidInput("end must be after start")
    if end - start > MAX_RANGE:
        raise InvalidInput(f"a range covers at most {MAX_RANGE.days} days; ask for several")
    width = BUCKETS[bucket]
    if width and (end - start).total_seconds() / width > MAX_BUCKETS:
        raise InvalidInput(
            f"{bucket} buckets over this range make more than {MAX_BUCKETS} per group: "
            "use a larger bucket or a shorter range"
        )
    return UsageQuery(group_by, start, end, bucket, fmt)


def scope_filter(actor: Actor, model: Any = UsageBucket) -> list[Any]:
    """What ``actor`` may read of the records (``model``: a bucket table or the sessions' state):
    everything (monitors, superadmins, the Hub, the CLI), their domain (a domain admin), their own
    sessions (anyone else)."""
    if actor.reads_everything or actor.kind in ("hub", "cli"):
        return []
    if actor.role == "admin" and actor.domain:
        return [model.domain == actor.domain]
    return [model.user == actor.name]


# group_by -> the bucket tables' column; the figures summed, and those whose largest is kept
_KEYS = {
    "user": "user",
    "project": "project",
    "domain": "domain",
    "resource_group": "resource_group",
    "session": "session_id",
}
_SUMS = ("alloc_cpu", "alloc_mem", "alloc_gpu", "used_cpu", "used_mem", "used_gpu")
_MAXES = ("mem_peak", "gpu_mem_peak")


def bucket_expr(dialect: str, bucket: str, col: Any) -> Any:
    if bucket == "15m":
        return col
    if dialect == "postgresql":
        return func.date_trunc(bucket, func.timezone("UTC", col))
    # SQLite keeps times as 'YYYY-MM-DD HH:MM:SS[.ffffff]' in UTC
    return func.substr(col, 1, 13 if bucket == "hour" else 10)


def _part(
    model: Any,
    q: UsageQuery,
    actor: Actor,
    dialect: str,
    start: datetime,
    end: datetime,
    sessions: Any = None,
) -> Any:
    """The rows of one bucket table in [start, end) that ``actor`` may read (of ``sessions`` only,
    when given), with the group's key."""
    cols = [getattr(model, _KEYS[q.group_by]).label("k")]
    if q.bucket != "none":
        cols.append(bucket_expr(dialect, q.bucket, model.bucket_start).label("b"))
    cols += [model.session_id.label("sid"), *(getattr(model, c).label(c) for c in (*_SUMS, *_MAXES))]
    where = [model.bucket_start >= start, model.bucket_start < end, *scope_filter(actor, model)]
    if sessions is not None:
        where.append(model.session_id.in_(sessions))
    return select(*cols).where(*where)


def _parts(q: UsageQuery, actor: Actor, dialect: str, start: datetime, sessions: Any = None) -> list[Any]:
    """Whole UTC days from the daily table where the bucket allows it (day, none), the 15-minute
    table for the rest of the range."""
    first_day = accrual.floor_bucket(start + accrual.DAY - accrual.BUCKET, accrual.DAY_SECONDS)
    last_day = accrual.floor_bucket(q.end, accrual.DAY_SECONDS)
    if q.bucket not in ("day", "none") or first_day >= last_day:
        return [_part(UsageBucket, q, actor, dialect, start, q.end, sessions)]
    parts = [_part(UsageDay, q, actor, dialect, first_day, last_day, sessions)]
    if start < first_day:
        parts.append(_part(UsageBucket, q, actor, dialect, start, first_day, sessions))
    if last_day < q.end:
        parts.append(_part(UsageBucket, q, actor, dialect, last_day, q.end, sessions))
    return parts


def _union(parts: list[Any]) -> Any:
    source: Any = union_all(*parts) if len(parts) > 1 else parts[0]
    return source.subquery()


def bucket_value(value: Any, bucket: str) -> datetime | None:
    if bucket == "none" or value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(
            value + (":00" if bucket == "hour" else "") if len(value) > 10 else value
        )
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def _floor(t: datetime, bucket: str) -> datetime | None:
    width = BUCKETS[bucket]
    return accrual.floor_bucket(t, width) if width else None


@dataclass
class _Row:
    sessions: int
    allocated: dict[str, float]
    used: dict[str, float]


def _empty() -> _Row:
    return _Row(0, dict.fromkeys(CHARGED_SLOTS, 0.0), dict.fromkeys(_USED, 0.0))


def report(db: Session, actor: Actor, q: UsageQuery, now: datetime | None = None) -> dict[str, Any]:
    """The rows of ``q`` that ``actor`` may read (see the module's doc)."""
    now = now or datetime.now(timezone.utc)
    start = accrual.floor_bucket(q.start)
    dialect = db.get_bind().dialect.name
    u = _union(_parts(q, actor, dialect, start))
    group: list[Any] = [u.c.k]
    if q.bucket != "none":
        group.append(u.c.b)
    stmt = (
        select(
            *group,
            func.count(func.distinct(u.c.sid)),
            *(func.sum(u.c[c]) for c in _SUMS),
            *(func.max(u.c[c]) for c in _MAXES),
        )
        .group_by(*group)
        .limit(MAX_ROWS + 1)
    )
    rows: dict[tuple[str, datetime | None], _Row] = {}
    n = len(group)
    for r in db.execute(stmt):
        k = (r[0], bucket_value(r[1], q.bucket) if n > 1 else None)
        sessions, ac, am, ag, uc, um, ug, mp, gmp = r[n:]
        rows[k] = _Row(
            int(sessions),
            {"cpu": ac or 0.0, "mem": am or 0.0, "gpu.shares": ag or 0.0},
            {
                "cpu": uc or 0.0,
                "mem": um or 0.0,
                "mem_peak": mp or 0.0,
                "gpu.shares": ug or 0.0,
                "gpu_mem_peak": gmp or 0.0,
            },
        )
    if len(rows) > MAX_ROWS:
        raise InvalidInput(
            f"more than {MAX_ROWS} rows: use a larger bucket, a shorter range or another group_by"
        )
    _add_tails(db, actor, q, start, min(q.end, now), rows, dialect)
    return {
        "group_by": q.group_by,
        "start": start.isoformat(),
        "end": q.end.isoformat(),
        "bucket": q.bucket,
        "rows": [_render(q.group_by, k, row) for k, row in sorted(rows.items(), key=_order)],
    }


def _order(item: tuple[tuple[str, datetime | None], _Row]) -> tuple[str, str]:
    (name, bucket), _ = item
    return (name, bucket.isoformat() if bucket else "")


def _add_tails(
    db: Session,
    actor: Actor,
    q: UsageQuery,
    start: datetime,
    end: datetime,
    rows: dict[tuple[str, datetime | None], _Row],
    dialect: str,
) -> None:
    """What live sessions held since their last accrual, into ``rows`` (a session counted once per row)."""
    tails = [t for t in records.live_tail(db, scope_filter(actor, UsageSessionState)) if t.since < end]
    if not tails:
        return
    # Which rows already count each of these sessions
    u = _union(_parts(q, actor, dialect, start, sessions=[t.session_id for t in tails]))
    keyed = [u.c.sid, u.c.k, *([u.c.b] if q.bucket != "none" else [])]
    counted: set[tuple[str, str, datetime | None]] = {
        (sid, k, bucket_value(rest[0], q.bucket) if rest else None)
        for sid, k, *rest in db.execute(select(*keyed).distinct())
    }
    for t in tails:
        name = {
            "user": t.user,
            "project": t.project,
            "domain": t.domain,
            "resource_group": t.resource_group,
            "session": t.session_id,
        }[q.group_by]
        for piece_start, seconds in accrual.split(max(t.since, start), end):
            k = (name, _floor(piece_start, q.bucket))
            row = rows.get(k)
            if row is None:
                row = rows[k] = _empty()
            for slot in CHARGED_SLOTS:
                row.allocated[slot] += t.rates[slot] * seconds
            if (t.session_id, name, k[1]) not in counted:
                counted.add((t.session_id, name, k[1]))
                row.sessions += 1


def _num(x: float) -> float:
    return round(float(x), 3)


def _render(group_by: str, k: tuple[str, datetime | None], row: _Row) -> dict[str, Any]:
    allocated = {s: _num(v) for s, v in row.allocated.items()}
    used = {s: _num(v) for s, v in row.used.items()}
    eff = accrual.efficiency(row.allocated, {s: row.used[s] for s in CHARGED_SLOTS})
    return {
        group_by: k[0],
        "bucket": k[1].isoformat() if k[1] else None,
        "sessions": row.sessions,
        "allocated": allocated,
        "used": used,
        "efficiency": {s: (round(v, 4) if v is not None else None) for s, v in eff.items()},
    }


CSV_COLUMNS = (
    "bucket",
    "sessions",
    *(f"allocated_{s}" for s in CHARGED_SLOTS),
    *(f"used_{s}" for s in _USED),
    *(f"efficiency_{s}" for s in CHARGED_SLOTS),
)


def as_csv(answer: Mapping[str, Any]) -> str:
    """The rows of :func:`report` as CSV with a header row (units: slot-seconds and bytes)."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\r\n")
    group_by = answer["group_by"]
    w.writerow([group_by, *(c.replace("gpu.shares", "gpu_shares") for c in CSV_COLUMNS)])
    for row in answer["rows"]:
        eff = row["efficiency"]
        w.writerow(
            [
                row[group_by],
                row["bucket"] or "",
                row["sessions"],
                *(row["allocated"][s] for s in CHARGED_SLOTS),
                *(row["used"][s] for s in _USED),
                *("" if eff[s] is None else eff[s] for s in CHARGED_SLOTS),
            ]
        )
    return out.getvalue()


# ---------------------------------------------------------------- /api/usage/me


def _month_label(t: datetime) -> str:
    return t.strftime("%B %Y")


def me(db: Session, actor: Actor, now: datetime | None = None) -> dict[str, Any]:
    """The caller's own usage: this month, the last 7 and 30 days, and the last 30 days day by day."""
    if actor.kind != "user":
        raise NotFound("/api/usage/me answers for users; the Hub has no labfleet account")
    now = now or datetime.now(timezone.utc)
    mine = Actor(name=actor.name, role="user", domain=actor.domain, kind="user")
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    periods = []
    for key, label, start in (
        ("7d", "last 7 days", now - timedelta(days=7)),
        ("30d", "last 30 days", now - timedelta(days=30)),
        ("month", _month_label(now), month_start),
    ):
        rows = report(db, mine, UsageQuery("user", start, now, "none"), now)["rows"] if start < now else []
        row = rows[0] if rows else _render("user", (actor.name, None), _empty())
        periods.append(
            {
                "key": key,
                "label": label,
                "start": start.isoformat(),
                "end": now.isoformat(),
                "sessions": row["sessions"],
                "allocated": row["allocated"],
                "used": row["used"],
                "efficiency": row["efficiency"],
            }
        )
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    first = today - timedelta(days=29)
    by_day = {r["bucket"]: r for r in report(db, mine, UsageQuery("user", first, now, "day"), now)["rows"]}
    daily = []
    for i in range(30):
        day = (first + timedelta(days=i)).isoformat()
        r = by_day.get(day) or _render("user", (actor.name, None), _empty())
        daily.append(
            {
                "bucket": day,
                "sessions": r["sessions"],
                "allocated": r["allocated"],
                "used": r["used"],
                "efficiency": r["efficiency"],
            }
        )
    return {"user": actor.name, "now": now.isoformat(), "periods": periods, "daily": daily}


def live_query(actor: Actor) -> Select:
    """The usage state of the sessions still holding what they were given and sampled at least once
    (as ``records.live_figures``), those ``actor`` may read (as ``GET /api/usage``), by session id."""
    st = UsageSessionState
    return (
        select(st)
        .where(st.finished.is_(False), st.held_until.is_(None), st.sampled_at.is_not(None))
        .where(*scope_filter(actor, st))
        .order_by(st.session_id)
    )


def live_view(st: UsageSessionState) -> dict[str, Any]:
    """One live session's last trusted reading: cores, bytes, devices' worth of busy time, GPU bytes
    (each None when the sampler could not tell)."""
    return {
        "session": st.session_id,
        "user": st.user,
        "project": st.project,
        "domain": st.domain,
        "resource_group": st.resource_group,
        "sampled_at": st.sampled_at.isoformat() if st.sampled_at else None,
        "cpu": st.cpu_now,
        "mem": st.mem_now,
        "gpu": st.gpu_now,
        "gpu_mem": st.gpu_mem_now,
    }
