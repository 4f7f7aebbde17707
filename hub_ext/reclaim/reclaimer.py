"""The idle reclamation engine: which running sessions to reclaim now, and the ``idle`` object.

:func:`judge_all` reads every RUNNING session with what its rules need (in a handful of
statements whatever the fleet's size) and asks :mod:`labfleet.reclaim.checkers` for the judgments
of the rules that apply to it:

- the keypair policy's ``idle_timeout`` (0 never; negative: the service's default,
  ``LABFLEET_IDLE_TIMEOUT``, itself 0 by default), an activity checker named ``policy:<name>``;
- every checker bound to its domain, its project or its resource group;
- the policy's max session lifetime.

Batch and inference sessions are never reclaimed for idleness (they have no user to be idle),
only for their lifetime. A rule with ``only_when_queue_waiting`` reclaims only when a session
waiting in the group's queue could start on what the session would give back.

:func:`reclaim` is the service's ``idle`` job: for each session to reclaim it writes the audit entry
and the reason into the session's status (TERMINATING, the reason kept when the spawner reports
the end), then asks the Hub to stop the server.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from labfleet.compute import sessions
from labfleet.compute.reconcile import STARTING
from labfleet.core import audit, database
from labfleet.core.authz import Actor
from labfleet.core.errors import Conflict, Forbidden, InvalidInput
from labfleet.core.models import (
    Allocation,
    ComputeSession,
    Device,
    Domain,
    Keypair,
    KeypairResourcePolicy,
    Project,
    ResourceGroup,
    SessionActivity,
    UsageSample,
    User,
)
from labfleet.core.validate import check_fields, check_int
from labfleet.reclaim import rules as lfrules
from labfleet.reclaim.checkers import (
    Facts,
    Judgment,
    Sample,
    first_to_reclaim,
    judge_activity,
    judge_lifetime,
    judge_utilization,
)
from labfleet.usage import accrual

log = logging.getLogger(__name__)

IDLE_TYPES = ("interactive",)  # batch and inference sessions are not reclaimed for idleness


@dataclass(frozen=True)
class Settings:
    default_idle_timeout: float = 0.0  # seconds; 0: policies that defer to it never reclaim
    interval: float = 30.0  # the engine's period: samples and reports are this far apart
    report_interval: float = 60.0  # how often sessions report their activity

    @property
    def stale_after(self) -> float:
        """A session's report older than this no longer vouches for a busy kernel."""
        return 3 * self.report_interval + self.interval


@dataclass
class Subject:
    """A running session and what is judged of it."""

    id: str
    user: str
    server: str
    type: str
    domain: str
    project: str
    group: str
    facts: Facts
    judgments: list[Judgment] = field(default_factory=list)


def _running_since(history: Any, fallback: datetime) -> datetime:
    for h in history or ():
        if isinstance(h, dict) and h.get("status") == "RUNNING" and isinstance(h.get("at"), str):
            try:
                t = datetime.fromisoformat(h["at"])
            except ValueError:
                break
            return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
    return fallback


def _subjects(db: Session, where: Iterable[Any] = ()) -> list[tuple[Subject, int, int]]:
    """RUNNING sessions (those matching ``where``) with their names, allocation, activity and policy:
    (subject, policy idle_timeout, policy max lifetime)."""
    s = ComputeSession
    rows = db.execute(
        select(
            s.id,
            s.name,
            s.type,
            s.status_history,
            s.status_changed_at,
            s.requested_slots,
            User.username,
            Domain.name,
            Project.name,
            ResourceGroup.name,
            KeypairResourcePolicy.idle_timeout,
            KeypairResourcePolicy.max_session_lifetime,
            SessionActivity.last_activity,
            SessionActivity.busy_kernels,
            SessionActivity.reported_at,
            SessionActivity.still_here_at,
        )
        .join(User, User.id == s.user_id)
        .join(Domain, Domain.id == s.domain_id)
        .join(Project, Project.id == s.project_id)
        .join(ResourceGroup, ResourceGroup.id == s.resource_group_id)
        .join(Keypair, Keypair.id == s.keypair_id)
        .outerjoin(KeypairResourcePolicy, KeypairResourcePolicy.id == Keypair.resource_policy_id)
        .outerjoin(SessionActivity, SessionActivity.session_id == s.id)
        .where(s.status == "RUNNING", *where)
    ).all()
    ids = [r[0] for r in rows]
    gpu_mem: dict[str, float] = defaultdict(float)
    for chunk in range(0, len(ids), 500):
        for sid, mem in db.execute(
            select(Allocation.session_id, func.sum(Allocation.shares_centi * Device.memory_bytes))
            .join(Device, Device.id == Allocation.device_id)
            .where(Allocation.session_id.in_(ids[chunk : chunk + 500]))
            .group_by(Allocation.session_id)
        ):
            gpu_mem[sid] = float(mem or 0) / 100
    out = []
    for (
        sid,
        name,
        type_,
        history,
        changed,
        requested,
        user,
        domain,
        project,
        group,
        idle_timeout,
        lifetime,
        *act,
    ) in rows:
        alloc = dict(accrual.alloc_rates(requested))
        alloc["gpu_mem"] = gpu_mem.get(sid, 0.0)
        last, busy, reported, still = act
        facts = Facts(
            running_since=_running_since(history, changed),
            last_activity=last,
            busy_kernels=int(busy or 0),
            reported_at=reported,
            still_here_at=still,
            alloc=alloc,
            lifetime=float(lifetime) if lifetime else None,
        )
        subject = Subject(sid, user, name, type_, domain, f"{domain}/{project}", group, facts)
        out.append((subject, int(idle_timeout if idle_timeout is not None else -1), int(lifetime or 0)))
    return out


def _samples(db: Session, ids: list[str], since: datetime) -> dict[str, list[Sample]]:
    found: dict[str, list[Sample]] = defaultdict(list)
    for chunk in range(0, len(ids), 500):
        u = UsageSample
        for sid, at, cpu, mem, gpu, gpu_mem in db.execute(
            select(u.session_id, u.at, u.cpu_total, u.mem, u.gpu, u.gpu_mem)
            .where(u.session_id.in_(ids[chunk : chunk + 500]), u.at >= since)
            .order_by(u.session_id, u.at)
        ):
            found[sid].append(Sample(at, cpu, mem, gpu, gpu_mem))
    return found


def judge_all(db: Session, now: datetime, settings: Settings, where: Iterable[Any] = ()) -> list[Subject]:
    """Every RUNNING session (matching ``where``) with the judgments of the rules that apply to it."""
    subjects = _subjects(db, where)
    all_rules = lfrules.all_rules(db)
    by_id: dict[str, list[lfrules.Rule]] = {}
    longest = 0.0
    for subject, _, _ in subjects:
        if subject.type in IDLE_TYPES:
            rules = lfrules.applicable(all_rules, subject.domain, subject.project, subject.group)
            by_id[subject.id] = rules
            longest = max(
                [longest, *(float(r.options.get("window", 0)) for r in rules if r.kind == "utilization")]
            )
    need = [sid for sid, rules in by_id.items() if any(r.kind == "utilization" for r in rules)]
    samples = _samples(db, need, now - timedelta(seconds=longest + 2 * settings.interval)) if need else {}
    out = []
    for subject, idle_timeout, _ in subjects:
        f = subject.facts
        if subject.id in samples:
            f = subject.facts = Facts(**{**f.__dict__, "samples": tuple(samples[subject.id])})
        if subject.type in IDLE_TYPES:
            timeout = settings.default_idle_timeout if idle_timeout < 0 else float(idle_timeout)
            if timeout > 0:
                subject.judgments.append(
                    judge_activity("policy", f, now, timeout, stale_after=settings.stale_after)
                )
            for rule in by_id.get(subject.id, []):
                if rule.kind == "activity":
                    subject.judgments.append(
                        judge_activity(
                            rule.name,
                            f,
                            now,
                            float(rule.options["timeout"]),
                            stale_after=settings.stale_after,
                            contention=bool(rule.options.get("only_when_queue_waiting")),
                        )
                    )
                else:
                    subject.judgments.append(
                        judge_utilization(rule.name, f, now, rule.options, interval=settings.interval)
                    )
        lifetime = judge_lifetime(f, now)
        if lifetime is not None:
            subject.judgments.append(lifetime)
        out.append(subject)
    return out


@dataclass(frozen=True)
class Decision:
    subject: Subject
    judgment: Judgment
    waiting: str | None = None  # the queued session its release lets start (contention-only rules)


def decide(db: Session, subjects: Iterable[Subject]) -> list[Decision]:
    """The sessions to reclaim now: the first judgment that reclaims, contention-only ones only when
    a waiting session could start on what the session gives back."""
    out = []
    for subject in subjects:
        for j in sorted((j for j in subject.judgments if j.reclaim), key=_earliest):
            if not j.only_when_queue_waiting:
                out.append(Decision(subject, j))
                break
            s = db.get(ComputeSession, subject.id)
            waiting = sessions.would_start_if_released(db, s) if s is not None else None
            if waiting is not None:
                out.append(Decision(subject, j, waiting))
                break
    return out


def _earliest(j: Judgment) -> tuple[datetime, bool]:
    """The rule whose time came first; the lifetime first of those whose time came together."""
    return (j.reclaim_at or datetime.max.replace(tzinfo=timezone.utc), j.reason != "lifetime")


def status_reason(j: Judgment) -> str:
    """What the session's status says once reclaimed: the reason first (``idle-timeout: ...``)."""
    return f"{j.reason}: {j.detail} (checker {j.checker})"[:1000]


async def reclaim(
    session_factory: sessionmaker[Session],
    stop_server: Callable[[str, str], Awaitable[bool]],
    settings: Settings,
    log: logging.Logger,
    observe: Callable[[str], None] | None = None,
    now: datetime | None = None,
    server_state: Callable[[str, str], Awaitable[str | None]] | None = None,
) -> list[Decision]:
    """One tick: reclaim what :func:`decide` picks; each one audited, its reason in its status, then
    stopped through the Hub. ``observe`` hears each reason (the reclaimed-sessions metric).

    ``server_state``: what the Hub says of a session's server ("spawn" while it starts; None when
    the Hub cannot tell). A server still starting is left to the next tick: stopping it would
    interrupt its spawn, and the Hub would answer that spawn's request with a 500."""
    now = now or datetime.now(timezone.utc)
    with database.session_scope(session_factory) as db:
        decisions = decide(db, judge_all(db, now, settings))
    done = []
    for d in decisions:
        subject, j = d.subject, d.judgment
        if server_state is not None and await server_state(subject.user, subject.server) == STARTING:
            log.debug("Session %s is to be reclaimed, but its server is still starting", subject.id)
            continue
        with database.session_scope(session_factory) as db:
            s = db.get(ComputeSession, subject.id)
            if s is None or s.status != "RUNNING":
                continue  # ended meanwhile
            sessions.lock_current(db, s)
            if s.status != "RUNNING":
                continue
            sessions.set_status(s, "TERMINATING", status_reason(j))
            details = {
                "reason": j.reason,
                "checker": j.checker,
                "detail": j.detail,
                "user": subject.user,
                "server": subject.server,
            }
            if d.waiting:
                details["lets_start"] = d.waiting
            action = "session.lifetime" if j.reason == "lifetime" else "session.reclaim"
            audit.record(db, Actor.cli(), action, subject.id, target_domain=subject.domain, details=details)
        log.info(
            "Reclaiming session %s (%s/%s): %s", subject.id, subject.user, subject.server, status_reason(j)
        )
        if await stop_server(subject.user, subject.server):
            done.append(d)
            if observe is not None:
                observe(j.reason)
        else:
            # Still running: back to RUNNING, so the next tick tries again (reconciling leaves a
            # TERMINATING session alone while its server lives).
            log.warning("Session %s is to be reclaimed, but the Hub did not stop it", subject.id)
            with database.session_scope(session_factory) as db:
                s = db.get(ComputeSession, subject.id)
                if s is not None and s.status == "TERMINATING" and s.status_reason == status_reason(j):
                    sessions.set_status(s, "RUNNING", "the Hub did not stop it when it was to be reclaimed")
    return done


# ---------------------------------------------------------------- what the API shows


def idle_object(subject: Subject | None, now: datetime) -> dict[str, Any]:
    """The ``idle`` object of a session: how long it has been idle by the rule that reclaims it
    first, that rule's timeout and when it will reclaim it (null: none will)."""
    j = first_to_reclaim([j for j in (subject.judgments if subject else []) if j.reason != "lifetime"])
    if j is None:
        idle_for = 0.0
        if subject is not None:
            f = subject.facts
            last = max(t for t in (f.running_since, f.last_activity, f.still_here_at) if t is not None)
            idle_for = max((now - last).total_seconds(), 0.0)
        return {
            "idle_for": round(idle_for, 1),
            "timeout": None,
            "reclaim_at": None,
            "checker": None,
            "reason": None,
            "only_when_queue_waiting": False,
        }
    return {
        "idle_for": round(j.idle_for, 1),
        "timeout": j.timeout,
        "reclaim_at": j.reclaim_at.isoformat() if j.reclaim_at else None,
        "checker": j.checker,
        "reason": j.detail,
        "only_when_queue_waiting": j.only_when_queue_waiting,
    }


def idle_of(db: Session, session_id: str, now: datetime, settings: Settings) -> dict[str, Any]:
    found = judge_all(db, now, settings, [ComputeSession.id == session_id])
    return idle_object(found[0] if found else None, now)


def preview(db: Session, actor: Actor, now: datetime, settings: Settings) -> dict[str, Any]:
    """What would be reclaimed now, and why (nothing changes); a domain admin sees their domain."""
    if not lfrules.can_read(actor):
        raise Forbidden("only admins and monitors preview idle reclamation")
    where = [] if actor.reads_everything or actor.kind in ("hub", "cli") else [Domain.name == actor.domain]
    subjects = judge_all(db, now, settings, where)
    picked = {d.subject.id: d for d in decide(db, subjects)}
    rows = []
    for subject in subjects:
        d = picked.get(subject.id)
        contention_kept = (
            [j for j in subject.judgments if j.reclaim and j.only_when_queue_waiting] if d is None else []
        )
        if d is None and not contention_kept:
            continue
        j = d.judgment if d is not None else contention_kept[0]
        rows.append(
            {
                "session": subject.id,
                "user": subject.user,
                "server": subject.server,
                "domain": subject.domain,
                "project": subject.project,
                "resource_group": subject.group,
                "checker": j.checker,
                "reason": j.reason,
                "detail": j.detail,
                "idle_for": round(j.idle_for, 1),
                "would_reclaim": d is not None,
                "lets_start": d.waiting if d is not None else None,
            }
        )
    return {"now": now.isoformat(), "sessions": rows}


# ---------------------------------------------------------------- what the session reports


def report_activity(db: Session, actor: Actor, session_id: str, body: Any, now: datetime) -> dict[str, Any]:
    """The session's own report (its server extension, with its owner's token): jupyter-server's
    last activity and its busy kernels. Self-reported, so it only ever keeps the session alive."""
    s = _owned(db, actor, session_id)
    b = check_fields(body, optional=["last_activity", "busy_kernels"])
    row = db.get(SessionActivity, s.id) or SessionActivity(session_id=s.id, busy_kernels=0)
    if b.get("last_activity") is not None:
        row.last_activity = min(_time(b["last_activity"], "last_activity"), now)  # never in the future
    if "busy_kernels" in b:
        row.busy_kernels = check_int(b["busy_kernels"], "busy_kernels", minimum=0, maximum=10_000)
    row.reported_at = now
    db.add(row)
    return {"session": s.id, "reported_at": now.isoformat()}


def still_here(
    db: Session, actor: Actor, session_id: str, now: datetime, settings: Settings
) -> dict[str, Any]:
    """The user says "I'm still here": activity now, audited; the idle object after it."""
    s = _owned(db, actor, session_id)
    row = db.get(SessionActivity, s.id) or SessionActivity(session_id=s.id, busy_kernels=0)
    row.still_here_at = now
    db.add(row)
    db.flush()
    audit.record(db, actor, "session.still-here", s.id, target_domain=s.domain.name)
    return idle_of(db, s.id, now, settings)


def _owned(db: Session, actor: Actor, session_id: str) -> ComputeSession:
    s = sessions.readable(db, actor, session_id)
    if not (actor.kind == "hub" or (actor.kind == "user" and actor.name == s.user.username)):
        raise Forbidden("only the session's owner reports its activity")
    if s.status != "RUNNING":
        raise Conflict(f"session {s.id} is {s.status}, not RUNNING")
    return s


def _time(value: Any, name: str) -> datetime:
    if not isinstance(value, str) or len(value) > 64:
        raise InvalidInput(f"{name} must be an ISO 8601 time")
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(f"{name} must be an ISO 8601 time, not {value!r:.40}") from None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
