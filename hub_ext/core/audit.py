"""The audit log: who did what, when, from where. Written in the same transaction as the change."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from hub_ext.core.authz import Actor, can_read_audit_entry
from hub_ext.core.models import AuditEntry

# Keys that must never reach the log, whatever a caller passes in details.
_SECRET_KEYS = {"password", "secret_key", "secret", "token", "api_token"}


def _scrub(details: dict[str, Any]) -> dict[str, Any]:
    return {k: ("***" if k in _SECRET_KEYS else v) for k, v in details.items()}


def record(
    db: Session,
    actor: Actor,
    action: str,
    target: str = "",
    *,
    target_domain: str | None = None,
    details: dict[str, Any] | None = None,
    success: bool = True,
) -> AuditEntry:
    entry = AuditEntry(
        actor=actor.name,
        actor_domain=actor.domain,
        target_domain=target_domain,
        action=action,
        target=target,
        details=_scrub(details or {}),
        remote_addr=actor.remote_addr or "",
        success=success,
    )
    db.add(entry)
    return entry


def list_entries(
    db: Session, actor: Actor, *, limit: int = 100, action: str | None = None
) -> list[AuditEntry]:
    q = select(AuditEntry).order_by(AuditEntry.id.desc())
    if action:
        q = q.where(AuditEntry.action == action)
    out = []
    # Filter in Python with the same rule the tests check; the log is read rarely.
    for e in db.scalars(q.limit(limit * 20 if not actor.reads_everything else limit)):
        if can_read_audit_entry(actor, e.actor, e.actor_domain, e.target_domain):
            out.append(e)
            if len(out) >= limit:
                break
    return out


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
