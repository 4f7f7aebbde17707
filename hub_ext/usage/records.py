"""Usage records: what each session held and used, in 15-minute buckets that outlive it.

:func:`accrue` runs on the service's clock (the ``usage`` job), in one transaction:

1. every session that holds slots, or ended since the last run, gets a row in
   ``usage_session_state`` (its names, what it holds per second, when it started holding), read
   from its status history, so a session that started and ended between two runs, or while the
   service was down, is accounted all the same;
2. each unfinished state row accrues its allocation up to now (or up to its end), cut at bucket
   boundaries, and the sampler's readings (:mod:`labfleet.usage.sampler`, measured outside the
   session) add what it used;
3. buckets older than the retention go (model serving's too, ``serving_usage``); the raw readings
   are kept a day (``usage_samples``), for the idle checkers' windows (labfleet.reclaim).

Buckets are added to with ``INSERT ... ON CONFLICT DO UPDATE`` (one statement for all of them);
only the service writes them. Between two runs, :func:`live_tail` tells the queries what the live
sessions held since their last accrual, so a running session's usage always reaches now.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import and_, delete, func, insert, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from labfleet.core.errors import InvalidInput
from labfleet.core.models import (
    Allocation,
    ComputeSession,
    Device,
    Domain,
    Node,
    Project,
    ResourceGroup,
    ServingUsage,
    StateVersion,
    UsageBucket,
    UsageDay,
    UsageSample,
    UsageSessionState,
    User,
)
from labfleet.core.validate import check_bool, check_fields, check_text
from labfleet.core.vocab import FINAL_STATUSES, HOLDING_STATUSES
from labfleet.usage import accrual
from labfleet.usage.sampler import GpuProcess, GpuReading, Reading, Target

log = logging.getLogger(__name__)

DEFAULT_RETENTION_DAYS = 400
SAMPLES_KEPT = timedelta(days=1)  # the raw readings, for the idle checkers' windows
WATERMARK = "usage.accrued"  # a state_versions row: the last accrual's time, in epoch milliseconds
# A session ended this long before the last run's start is still looked for (a commit that took long).
_LATE = timedelta(minutes=5)
_AMOUNTS = (*accrual.ALLOC_KEYS.values(), *accrual.USED_KEYS.values())
_PEAKS = tuple(accrual.PEAK_KEYS.values())

BucketKey = tuple[str, datetime]  # session id, bucket start


@dataclass
class Accrued:
    """What one :func:`accrue` did, for the log and the tests."""

    started: list[str] = field(default_factory=list)  # sessions accounted from now on
    finished: list[str] = field(default_factory=list)  # sessions fully accounted
    buckets: int = 0  # bucket rows written
    purged: int = 0  # bucket rows past the retention


def _epoch_ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def _from_epoch(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


def _watermark(db: Session) -> datetime | None:
    ms = db.scalar(select(StateVersion.version).where(StateVersion.name == WATERMARK))
    return _from_epoch(ms / 1000) if ms is not None else None


def _set_watermark(db: Session, t: datetime) -> None:
    row = db.get(StateVersion, WATERMARK)
    if row is None:
        db.add(StateVersion(name=WATERMARK, version=_epoch_ms(t)))
    else:
        row.version = _epoch_ms(t)


def _start_states(db: Session, now: datetime, since: datetime, out: Accrued) -> None:
    """A state row for each session that holds slots, or ended since ``since``, and has none yet."""
    s = ComputeSession
    rows = db.execute(
        select(
            s.id,
            s.status,
            s.status_history,
            s.status_changed_at,
            s.requested_slots,
            User.username,
            Domain.name,
            Project.name,
            ResourceGroup.name,
        )
        .join(User, User.id == s.user_id)
        .join(Domain, Domain.id == s.domain_id)
        .join(Project, Project.id == s.project_id)
        .join(ResourceGroup, ResourceGroup.id == s.resource_group_id)
        .outerjoin(UsageSessionState, UsageSessionState.session_id == s.id)
        .where(
            UsageSessionState.session_id.is_(None),
            or_(
                s.status.in_(HOLDING_STATUSES),
                and_(s.status.in_(FINAL_STATUSES), s.status_changed_at >= since),
            ),
        )
    ).all()
    for sid, status, history, changed_at, requested, user, domain, project, group in rows:
        held = accrual.held_interval(history, status, changed_at)
        if held is None:
            continue  # cancelled while queued: it never held anything
        rates = accrual.alloc_rates(requested)
        db.add(
            UsageSessionState(
                session_id=sid,
                user=user,
                project=f"{domain}/{project}",
                domain=domain,
                resource_group=group,
                alloc_cpu=rates["cpu"],
                alloc_mem=rates["mem"],
                alloc_gpu=rates["gpu.shares"],
                held_from=held[0],
                held_until=held[1],
                accrued_until=held[0],
                mem_peak=0.0,
                gpu_mem_peak=0.0,
                finished=False,
            )
        )
        out.started.append(sid)
    db.flush()


def _ends(db: Session, states: Sequence[UsageSessionState]) -> dict[str, datetime | None]:
    """When each unfinished state's session stopped holding (None: it still holds); a session
    deleted meanwhile (its user or project went) ends where its accounting stood."""
    ids = [st.session_id for st in states if st.held_until is None]
    found: dict[str, tuple[Any, str, datetime]] = {}
    for chunk in range(0, len(ids), 500):
        s = ComputeSession
        for sid, status, history, changed_at in db.execute(
            select(s.id, s.status, s.status_history, s.status_changed_at).where(
                s.id.in_(ids[chunk : chunk + 500])
            )
        ):
            found[sid] = (history, status, changed_at)
    ends: dict[str, datetime | None] = {}
    for st in states:
        if st.held_until is not None:
            ends[st.session_id] = st.held_until
        elif st.session_id not in found:
            ends[st.session_id] = max(st.accrued_until, st.sampled_at or st.accrued_until)
        else:
            held = accrual.held_interval(*found[st.session_id])
            ends[st.session_id] = held[1] if held is not None else st.accrued_until
    return ends


def _add(
    buckets: dict[BucketKey, dict[str, float]],
    sid: str,
    start: datetime,
    end: datetime,
    column: str,
    total: float,
) -> None:
    """Spread ``total`` of ``column`` over [start, end) in proportion to each bucket's seconds."""
    pieces = accrual.split(start, end)
    seconds = sum(s for _, s in pieces)
    if not pieces or not total:
        return
    for bucket, s in pieces:
        row = buckets[(sid, bucket)]
        row[column] = row.get(column, 0.0) + total * s / seconds


def _accrue_allocation(
    st: UsageSessionState, until: datetime, buckets: dict[BucketKey, dict[str, float]]
) -> None:
    if until <= st.accrued_until:
        return
    for bucket, seconds in accrual.split(st.accrued_until, until):
        row = buckets[(st.session_id, bucket)]
        row["alloc_cpu"] = row.get("alloc_cpu", 0.0) + st.alloc_cpu * seconds
        row["alloc_mem"] = row.get("alloc_mem", 0.0) + st.alloc_mem * seconds
        row["alloc_gpu"] = row.get("alloc_gpu", 0.0) + st.alloc_gpu * seconds
    st.accrued_until = until


def _accrue_reading(
    st: UsageSessionState, reading: Reading, max_gap: float, buckets: dict[BucketKey, dict[str, float]]
) -> None:
    if not reading.alive:
        st.cpu_now = st.mem_now = st.gpu_now = st.gpu_mem_now = None
        return
    at = _from_epoch(reading.at)
    used = accrual.used_amounts(
        at,
        reading.cpu_seconds,
        float(reading.mem_bytes) if reading.mem_bytes is not None else None,
        [g.util_percent for g in reading.gpus],
        [float(g.mem_bytes) if g.mem_bytes is not None else None for g in reading.gpus],
        prev_at=st.sampled_at,
        prev_cpu=st.cpu_total,
        held_from=st.held_from,
        max_gap=max_gap,
    )
    if used is None:
        return
    _add(buckets, st.session_id, used.cpu_from, at, "used_cpu", used.cpu)
    _add(buckets, st.session_id, used.rect_from, at, "used_mem", used.mem)
    _add(buckets, st.session_id, used.rect_from, at, "used_gpu", used.gpu)
    row = buckets[(st.session_id, accrual.floor_bucket(at - timedelta(microseconds=1)))]
    if used.mem_now is not None:
        row["mem_peak"] = max(row.get("mem_peak", 0.0), used.mem_now)
        st.mem_peak = max(st.mem_peak or 0.0, used.mem_now)
    if used.gpu_mem_now is not None:
        row["gpu_mem_peak"] = max(row.get("gpu_mem_peak", 0.0), used.gpu_mem_now)
        st.gpu_mem_peak = max(st.gpu_mem_peak or 0.0, used.gpu_mem_now)
    st.sampled_at = at
    if used.cpu_total is not None:
        st.cpu_total = used.cpu_total
    st.cpu_now, st.mem_now, st.gpu_now, st.gpu_mem_now = (
        used.cpu_now,
        used.mem_now,
        used.gpu_now,
        used.gpu_mem_now,
    )


_UPSERTS: dict[tuple[str, str], Any] = {}


def _upsert(dialect: str, model: type[UsageBucket] | type[UsageDay]) -> Any:
    """Add to a bucket, creating it: sums add, peaks keep the larger."""
    stmt = _UPSERTS.get((dialect, model.__tablename__))
    if stmt is None:
        table = model.__table__
        ins = (postgresql if dialect == "postgresql" else sqlite).insert(table)
        sets: dict[str, Any] = {c: table.c[c] + ins.excluded[c] for c in _AMOUNTS}
        for c in _PEAKS:
            sets[c] = (func.greatest if dialect == "postgresql" else func.max)(table.c[c], ins.excluded[c])
        stmt = ins.on_conflict_do_update(index_elements=["session_id", "bucket_start"], set_=sets)
        _UPSERTS[(dialect, model.__tablename__)] = stmt
    return stmt


def _by_day(buckets: Mapping[BucketKey, dict[str, float]]) -> dict[BucketKey, dict[str, float]]:
    """The 15-minute amounts summed per UTC day (peaks: the largest)."""
    days: dict[BucketKey, dict[str, float]] = defaultdict(dict)
    for (sid, start), amounts in buckets.items():
        day = days[(sid, accrual.floor_bucket(start, accrual.DAY_SECONDS))]
        for c, v in amounts.items():
            day[c] = max(day.get(c, 0.0), v) if c in _PEAKS else day.get(c, 0.0) + v
    return days


def write(db: Session, states: Mapping[str, Any], buckets: Mapping[BucketKey, dict[str, float]]) -> int:
    """Add ``buckets`` (session id, bucket start -> column -> amount) to the 15-minute buckets and to
    their days; ``states[session id]`` has the names (``user``, ``project``, ``domain``,
    ``resource_group``). The number of 15-minute rows written."""
    conn = db.connection()
    for model, rows in ((UsageBucket, buckets), (UsageDay, _by_day(buckets))):
        values = []
        for (sid, start), amounts in sorted(rows.items()):
            st = states[sid]
            row: dict[str, Any] = {c: amounts.get(c, 0.0) for c in (*_AMOUNTS, *_PEAKS)}
            row.update(
                session_id=sid,
                bucket_start=start,
                user=st.user,
                project=st.project,
                domain=st.domain,
                resource_group=st.resource_group,
            )
            values.append(row)
        for chunk in range(0, len(values), 1000):
            conn.execute(_upsert(conn.dialect.name, model), values[chunk : chunk + 1000])
    return len(buckets)


def accrue(
    db: Session,
    readings: Iterable[Reading] = (),
    now: datetime | None = None,
    *,
    max_gap: float = 30.0,
    retention_days: int = DEFAULT_RETENTION_DAYS,
) -> Accrued:
    """Account every session up to ``now`` with these sampler readings (see the module's doc).

    ``max_gap``: the most seconds one memory or GPU reading stands for (twice the sampling interval:
    a missed tick still counts, a service that was down does not invent use).
    """
    now = now or datetime.now(timezone.utc)
    out = Accrued()
    mark = _watermark(db)
    since = (mark - _LATE) if mark is not None else now - timedelta(days=retention_days)
    _start_states(db, now, since, out)
    states = {
        st.session_id: st
        for st in db.scalars(select(UsageSessionState).where(UsageSessionState.finished.is_(False)))
    }
    ends = _ends(db, list(states.values()))
    by_session = {r.session_id: r for r in readings}
    buckets: dict[BucketKey, dict[str, float]] = defaultdict(dict)
    samples = []
    for sid, st in states.items():
        end = ends[sid]
        reading = by_session.get(sid)
        if reading is not None and (end is None or _from_epoch(reading.at) <= end):
            _accrue_reading(st, reading, max_gap, buckets)
            if reading.alive:
                samples.append(_sample_row(reading))
        _accrue_allocation(st, min(now, end) if end is not None else now, buckets)
        if end is not None:
            st.held_until = end
            if st.accrued_until >= end:
                st.finished = True
                st.cpu_now = st.mem_now = st.gpu_now = st.gpu_mem_now = None
                out.finished.append(sid)
    db.flush()
    out.buckets = write(db, states, buckets)
    if samples:
        db.execute(insert(UsageSample), samples)
    db.execute(delete(UsageSample).where(UsageSample.at < now - SAMPLES_KEPT))
    out.purged = purge(db, now - timedelta(days=retention_days))
    _set_watermark(db, now)
    return out


def _sample_row(r: Reading) -> dict[str, Any]:
    utils = [g.util_percent for g in r.gpus if g.util_percent is not None]
    mems = [g.mem_bytes for g in r.gpus if g.mem_bytes is not None]
    return {
        "session_id": r.session_id,
        "at": _from_epoch(r.at),
        "cpu_total": r.cpu_seconds,
        "mem": float(r.mem_bytes) if r.mem_bytes is not None else None,
        "gpu": sum(utils) / 100 if utils else None,
        "gpu_mem": float(sum(mems)) if mems else None,
    }


def purge(db: Session, before: datetime) -> int:
    """Forget buckets that start before ``before`` (days: that end before it), and finished sessions
    that ended before it; the number of 15-minute buckets forgotten."""
    result: Any = db.execute(delete(UsageBucket).where(UsageBucket.bucket_start < before))
    gone = result.rowcount or 0
    db.execute(delete(UsageDay).where(UsageDay.bucket_start < before - accrual.DAY))
    db.execute(delete(ServingUsage).where(ServingUsage.bucket_start < before))  # labfleet.usage.serving_usage
    db.execute(
        delete(UsageSessionState).where(
            UsageSessionState.finished.is_(True), UsageSessionState.held_until < before
        )
    )
    return int(gone)


# ---------------------------------------------------------------- what the sampler measures


def targets_on(db: Session, node_name: str) -> list[Target]:
    """The sessions holding slots on ``node_name`` whose spawner said where they run, with the
    UUIDs of the devices they hold, as the sampler takes them."""
    s = ComputeSession
    rows = db.execute(
        select(s.id, s.runtime)
        .join(Node, Node.id == s.node_id)
        .where(Node.name == node_name, s.status.in_(HOLDING_STATUSES), s.runtime.is_not(None))
    ).all()
    if not rows:
        return []
    devices: dict[str, list[str]] = defaultdict(list)
    for sid, uuid in db.execute(
        select(Allocation.session_id, Device.uuid)
        .join(Device, Device.id == Allocation.device_id)
        .where(Allocation.session_id.in_([r[0] for r in rows]))
    ):
        devices[sid].append(uuid)
    out = []
    for sid, runtime in rows:
        pid = runtime.get("pid") if isinstance(runtime, dict) else None
        container = runtime.get("container") if isinstance(runtime, dict) else None
        if isinstance(pid, int) or isinstance(container, str):
            out.append(
                Target(
                    sid,
                    pid=pid if isinstance(pid, int) else None,
                    container=container if isinstance(container, str) else None,
                    devices=tuple(sorted(devices[sid])),
                )
            )
    return out


# ---------------------------------------------------------------- readings from node agents

MAX_AGENT_READINGS = 10_000  # one heartbeat's readings
MAX_READING_GPUS = 64
MAX_GPU_PROCESSES = 1024  # of one session on one device
READING_SKEW = 600.0  # seconds a reading's time may lie before the service's clock (60 after it)


def _number(value: Any, field: str, maximum: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= maximum:
        raise InvalidInput(f"{field} must be null or a number from 0 to {maximum:g}")
    return float(value)


def _whole(value: Any, field: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2**60:
        raise InvalidInput(f"{field} must be null or a whole number of bytes")
    return value


def _gpu_processes(raw: Any, where: str) -> tuple[GpuProcess, ...]:
    """A reading's processes on a device (an older agent sends none)."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_GPU_PROCESSES:
        raise InvalidInput(f"{where} must be a list of at most {MAX_GPU_PROCESSES} processes")
    out = []
    for k, p in enumerate(raw):
        p = check_fields(p, required=["pid"], optional=["mem_bytes", "started"], what=f"{where}[{k}]")
        pid = p["pid"]
        if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < 2**31:
            raise InvalidInput(f"{where}[{k}].pid must be a process id")
        started = _number(p.get("started"), f"{where}[{k}].started", 1e11)
        out.append(GpuProcess(pid, _whole(p.get("mem_bytes"), f"{where}[{k}].mem_bytes"), started))
    return tuple(out)


def parse_agent_readings(raw: Any, now: float) -> list[Reading]:
    """A node agent's readings (the sampler's :class:`Reading` as JSON), checked whole: InvalidInput
    for anything malformed. Which of them count is :func:`accept_agent_readings`' call."""
    if not isinstance(raw, list) or len(raw) > MAX_AGENT_READINGS:
        raise InvalidInput(f"readings must be a list of at most {MAX_AGENT_READINGS} readings")
    out = []
    for i, item in enumerate(raw):
        where = f"readings[{i}]"
        r = check_fields(
            item,
            required=["session_id", "at", "alive"],
            optional=["cpu_seconds", "mem_bytes", "gpus", "error"],
            what=where,
        )
        sid = r["session_id"]
        if not isinstance(sid, str) or not 1 <= len(sid) <= 64:
            raise InvalidInput(f"{where}.session_id must be a session id")
        at = _number(r["at"], f"{where}.at", 1e11)
        if at is None or not now - READING_SKEW <= at <= now + 60:
            raise InvalidInput(
                f"{where}.at must be the reading's time (epoch seconds), within minutes of now"
            )
        gpus_raw = r.get("gpus") or []
        if not isinstance(gpus_raw, list) or len(gpus_raw) > MAX_READING_GPUS:
            raise InvalidInput(f"{where}.gpus must be a list of at most {MAX_READING_GPUS} devices")
        gpus = []
        for j, g in enumerate(gpus_raw):
            g = check_fields(
                g,
                required=["uuid"],
                optional=["util_percent", "mem_bytes", "processes"],
                what=f"{where}.gpus[{j}]",
            )
            gpus.append(
                GpuReading(
                    uuid=check_text(g["uuid"], f"{where}.gpus[{j}].uuid", 128),
                    util_percent=_number(g.get("util_percent"), f"{where}.gpus[{j}].util_percent", 100),
                    mem_bytes=_whole(g.get("mem_bytes"), f"{where}.gpus[{j}].mem_bytes"),
                    processes=_gpu_processes(g.get("processes"), f"{where}.gpus[{j}].processes"),
                )
            )
        error = r.get("error")
        out.append(
            Reading(
                session_id=sid,
                at=at,
                alive=check_bool(r["alive"], f"{where}.alive"),
                cpu_seconds=_number(r.get("cpu_seconds"), f"{where}.cpu_seconds", 1e12),
                mem_bytes=_whole(r.get("mem_bytes"), f"{where}.mem_bytes"),
                gpus=tuple(gpus),
                error=check_text(error, f"{where}.error", 1000) if error is not None else None,
            )
        )
    return out


def accept_agent_readings(readings: Iterable[Reading], targets: Iterable[Target]) -> list[Reading]:
    """The readings of sessions the service lists on the agent's node (``targets``), with only the
    devices each holds; the rest is dropped (the agent's word is not trusted beyond its own node)."""
    held = {t.session_id: set(t.devices) for t in targets}
    out = []
    for r in readings:
        devices = held.get(r.session_id)
        if devices is None:
            continue
        gpus = tuple(g for g in r.gpus if g.uuid in devices)
        out.append(r if len(gpus) == len(r.gpus) else replace(r, gpus=gpus))
    return out


# ---------------------------------------------------------------- what the queries add


@dataclass(frozen=True)
class Tail:
    """What a live session held since its last accrual: per-second rates from ``since``."""

    session_id: str
    user: str
    project: str
    domain: str
    resource_group: str
    since: datetime
    rates: Mapping[str, float]


def live_tail(db: Session, where: Iterable[Any] = ()) -> list[Tail]:
    """Unfinished sessions still holding (no end known): their allocation since the last accrual."""
    st = UsageSessionState
    rows = db.scalars(select(st).where(st.finished.is_(False), st.held_until.is_(None), *where))
    return [
        Tail(
            r.session_id,
            r.user,
            r.project,
            r.domain,
            r.resource_group,
            r.accrued_until,
            {"cpu": r.alloc_cpu, "mem": r.alloc_mem, "gpu.shares": r.alloc_gpu},
        )
        for r in rows
    ]


def live_figures(db: Session) -> list[UsageSessionState]:
    """The last sampled figures of the sessions still holding (for the metrics)."""
    st = UsageSessionState
    return list(
        db.scalars(
            select(st).where(st.finished.is_(False), st.held_until.is_(None), st.sampled_at.is_not(None))
        )
    )
