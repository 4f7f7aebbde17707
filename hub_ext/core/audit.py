"""The audit log: who did what, when, from where. Written in the same transaction as the change."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, cast

from sqlalchemy import Select, Table, and_, func, insert, or_, select
from sqlalchemy.orm import Session

from labfleet.core.authz import Actor
from labfleet.core.database import Prepared
from labfleet.core.models import AuditEntry, User, utcnow
from labfleet.core.pages import Page, page_of

# Keys that must never reach the log, whatever a caller passes in details.
_SECRET_KEYS = {"password", "secret_key", "secret", "token", "api_token"}


COLUMNS = (
    "timestamp",
    "actor",
    "actor_domain",
    "target_domain",
    "action",
    "target",
    "details",
    "remote_addr",
    "success",
)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# Compiled once (an entry is written on hot paths, an admission among them).
_INSERT = Prepared(insert(cast(Table, AuditEntry.__table__)), COLUMNS)


def _scrub(details: dict[str, Any]) -> dict[str, Any]:
    return {k: ("***" if k in _SECRET_KEYS else v) for k, v in details.items()}


def entry(
    actor: Actor,
    action: str,
    target: str = "",
    *,
    target_domain: str | None = None,
    details: dict[str, Any] | None = None,
    success: bool = True,
) -> dict[str, Any]:
    """One entry as its row (every column of :data:`COLUMNS`), dated now, secrets scrubbed: for a
    caller that writes it in a statement of its own making (see :func:`record`)."""
    return {
        "timestamp": utcnow(),
        "actor": actor.name,
        "actor_domain": actor.domain,
        "target_domain": target_domain,
        "action": action,
        "target": target,
        "details": _scrub(details or {}),
        "remote_addr": actor.remote_addr or "",
        "success": success,
    }


def write(db: Session, row: dict[str, Any]) -> None:
    """Write an :func:`entry` in the caller's transaction (a plain INSERT: it is on hot paths)."""
    _INSERT.execute(db.connection(), row)


def record(
    db: Session,
    actor: Actor,
    action: str,
    target: str = "",
    *,
    target_domain: str | None = None,
    details: dict[str, Any] | None = None,
    success: bool = True,
) -> None:
    """Write one entry, now, in the caller's transaction."""
    write(db, entry(actor, action, target, target_domain=target_domain, details=details, success=success))


def entries_query(actor: Actor, action: str | None = None) -> Select:
    """The entries ``actor`` may read (authz.can_read_audit_entry, in SQL), newest first."""
    q = select(AuditEntry).order_by(AuditEntry.id.desc())
    if action:
        q = q.where(AuditEntry.action == action)
    if actor.reads_everything:
        return q
    mine = AuditEntry.actor == actor.name
    if actor.user_id is not None:
        # Entries under this name from before this user existed were someone else's: a name given
        # to someone new does not bring its history along
        since = select(User.created_at).where(User.id == actor.user_id).scalar_subquery()
        mine = and_(mine, AuditEntry.timestamp >= func.coalesce(since, EPOCH))
    if actor.role == "admin":
        if actor.domain is None:  # the rule compares with ==: None matches entries with no domain
            return q.where(or_(mine, AuditEntry.actor_domain.is_(None), AuditEntry.target_domain.is_(None)))
        return q.where(
            or_(mine, AuditEntry.actor_domain == actor.domain, AuditEntry.target_domain == actor.domain)
        )
    return q.where(mine)


def page_entries(
    db: Session, actor: Actor, *, offset: int = 0, limit: int = 200, action: str | None = None
) -> Page[AuditEntry]:
    """One page of the entries ``actor`` may read, newest first."""
    return page_of(db, entries_query(actor, action), offset, limit)


def list_entries(
    db: Session, actor: Actor, *, limit: int = 200, action: str | None = None
) -> list[AuditEntry]:
    """The newest ``limit`` entries ``actor`` may read (of ``action``)."""
    return list(db.scalars(entries_query(actor, action).limit(limit)))


def entry_view(e: AuditEntry) -> dict[str, Any]:
    return {
        "id": e.id,
        "timestamp": e.timestamp.isoformat() if e.timestamp else None,
        "actor": e.actor,
        "actor_domain": e.actor_domain,
        "action": e.action,
        "target": e.target,
        "target_domain": e.target_domain,
        "details": e.details,
        "remote_addr": e.remote_addr,
        "success": e.success,
    }
