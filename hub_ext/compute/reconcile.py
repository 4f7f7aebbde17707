"""Reconciling labfleet's sessions with the Hub's servers, after a restart and on the service's clock.

``plan_reconcile`` decides from plain values (what labfleet holds, what the Hub runs) and is pure;
``reconcile`` applies its fixes in one transaction, audits each, and serves the queues that got
capacity back. The service's ``reconcile`` job (hub_ext/service/jobs.py) reads the Hub around it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import select
from sqlalchemy.orm import Session

from labfleet.compute.sessions import lock_current, release, schedule_group, set_status
from labfleet.core import audit
from labfleet.core.authz import Actor
from labfleet.core.models import ComputeSession, ResourceGroup, User
from labfleet.core.vocab import FINAL_STATUSES, LIVE_STATUSES, STARTING_STATUSES

# What the Hub says of a server (``HubSync.servers``): "ready", or what it is pending ("spawn",
# "stop", ...); "unknown" where the Hub could not say (nothing is changed for it).
READY, STARTING, UNKNOWN = "ready", "spawn", "unknown"
RECONCILE_GRACE = 120.0


@dataclass(frozen=True)
class HubServer:
    """One server as the Hub's list tells it (``HubSync.server_list``): what it is (``ready`` or what it
    is pending), and when it started and was last active, as the Hub writes them (ISO 8601; None where
    the Hub did not say)."""

    state: str
    started: str | None = None
    last_activity: str | None = None


@dataclass(frozen=True)
class LiveSession:
    """A session that holds or waits for resources, as reconciling sees it (plain values)."""

    id: str
    user: str
    server: str
    status: str
    created: float  # when it was admitted (seconds, any epoch): the newest of a server's is its own
    age: float  # seconds since its last status change


@dataclass(frozen=True)
class Fix:
    """What reconciling changes of one session: its new status, and why."""

    session_id: str
    user: str
    server: str
    old: str
    status: str
    reason: str

    @property
    def releases(self) -> bool:
        return self.status in FINAL_STATUSES


def plan_reconcile(
    live: Iterable[LiveSession], servers: Mapping[tuple[str, str], str], grace: float = RECONCILE_GRACE
) -> list[Fix]:
    """Make labfleet's sessions agree with the Hub's servers (pure).

    ``servers``: (user, server name) -> what the Hub says of that server (``ready``, what it is pending,
    or ``unknown``); a server the Hub does not have is absent.  A server runs one session: the newest
    of its live sessions.  Statuses follow the Hub: a ready server's SCHEDULED or PREPARING session is
    RUNNING (the spawner's reports may have been lost), a starting server's SCHEDULED one PREPARING.
    A session with no server of its own (none on the Hub, or a newer session on it) gives its slots
    back once ``grace`` seconds have passed since its last status change: TERMINATED, or CANCELLED
    if it was still queued.  Statuses only move forward; a server being stopped is left to its spawner.
    """
    by_server: dict[tuple[str, str], list[LiveSession]] = defaultdict(list)
    for s in live:
        by_server[(s.user, s.server)].append(s)
    fixes = []
    for key, group in sorted(by_server.items()):
        state = servers.get(key)
        if state == UNKNOWN:
            continue
        user, server = key
        label = f"{user}/{server}" if server else f"{user}'s default server"
        group.sort(key=lambda s: (s.created, s.id), reverse=True)
        for i, s in enumerate(group):
            if state is not None and i == 0:
                if state == READY and s.status in STARTING_STATUSES:
                    fixes.append(
                        Fix(s.id, user, server, s.status, "RUNNING", f"the Hub reports {label} ready")
                    )
                elif state == STARTING and s.status == "SCHEDULED":
                    fixes.append(
                        Fix(s.id, user, server, s.status, "PREPARING", f"the Hub is starting {label}")
                    )
                continue
            if s.age < grace:
                continue  # its spawner may be about to start (or stop) the server: give it time
            why = f"the Hub has no server {label}" if state is None else f"{label} runs a newer session"
            status = "CANCELLED" if s.status == "PENDING" else "TERMINATED"
            fixes.append(
                Fix(
                    s.id,
                    user,
                    server,
                    s.status,
                    status,
                    f"{why} (checked {int(s.age)}s after its last change)",
                )
            )
    return fixes


def orphan_servers(
    live: Iterable[LiveSession], servers: Mapping[tuple[str, str], str]
) -> list[tuple[str, str]]:
    """Servers the Hub reports ready that run no live session of labfleet's (pure): their work
    holds resources nobody accounts for (a session ended in labfleet while its server ran on)."""
    held = {(s.user, s.server) for s in live}
    return sorted(key for key, state in servers.items() if state == READY and key not in held)


class OrphanWatch:
    """Since when each orphan server has been seen, so that one is stopped only once it has been an
    orphan for the grace period (its session may have just ended, and its stop be on the way)."""

    def __init__(self) -> None:
        self.since: dict[tuple[str, str], datetime] = {}

    def due(self, orphans: Iterable[tuple[str, str]], now: datetime, grace: float) -> list[tuple[str, str]]:
        """The orphans seen for ``grace`` seconds; one no longer an orphan is forgotten."""
        self.since = {key: self.since.get(key, now) for key in orphans}
        return sorted(key for key, seen in self.since.items() if (now - seen).total_seconds() >= grace)


def live_sessions(db: Session, now: datetime | None = None) -> list[LiveSession]:
    """Every session that holds or waits for resources, with its user, server and age."""
    now = now or datetime.now(timezone.utc)
    rows = db.execute(
        select(
            ComputeSession.id,
            User.username,
            ComputeSession.name,
            ComputeSession.status,
            ComputeSession.created_at,
            ComputeSession.status_changed_at,
        )
        .join(User, ComputeSession.user_id == User.id)
        .where(ComputeSession.status.in_(LIVE_STATUSES))
    )
    return [
        LiveSession(sid, user, name or "", status, created.timestamp(), (now - changed).total_seconds())
        for sid, user, name, status, created, changed in rows
    ]


def reconcile(
    db: Session,
    servers: Mapping[tuple[str, str], str],
    grace: float = RECONCILE_GRACE,
    now: datetime | None = None,
    release_users: Collection[str] | None = None,
) -> list[Fix]:
    """Apply :func:`plan_reconcile` to the DB: statuses set, slots given back, each change audited
    (``session.reconcile``); then the queues of groups that got slots back are served.

    ``release_users``: when given, only these users' sessions give slots back (the others' servers
    were not confirmed with the Hub). Returns the changes made."""
    done = []
    served = set()
    for fix in plan_reconcile(live_sessions(db, now), servers, grace):
        if fix.releases and release_users is not None and fix.user not in release_users:
            continue
        s = db.get(ComputeSession, fix.session_id)
        if s is not None:
            lock_current(db, s)  # read again under its group's lock: a concurrent stop wins
        if s is None or s.status != fix.old:
            continue
        done.append(fix)
        if fix.releases:
            release(db, s, fix.status, fix.reason)
            served.add(s.resource_group_id)
        else:
            set_status(s, fix.status, fix.reason)
        audit.record(
            db,
            Actor.cli(),
            "session.reconcile",
            s.id,
            target_domain=s.domain.name,
            details={
                "user": fix.user,
                "server": fix.server,
                "from": fix.old,
                "to": fix.status,
                "reason": fix.reason,
            },
        )
    for group_id in sorted(served):
        group = db.get(ResourceGroup, group_id)
        if group is not None:
            schedule_group(db, group)
    return done
