"""Maintenance of the fleet's bookkeeping: rebuilding the usage ledger from the sessions, and
finding what runs unaccounted (Hub servers with no live session).

Used by ``labfleet maintenance recalc-usage`` and ``POST /api/maintenance/recalculate-usage``.
The DB part is here; the caller reads the Hub's servers before (the REST handler, through
``HubSync``) and stops the unaccounted ones after the commit (the CLI cannot reach the Hub).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from labfleet.compute import reconcile
from labfleet.compute.reconcile import HubServer
from labfleet.core import audit, authz, usage_ledger
from labfleet.core.authz import Actor
from labfleet.core.errors import Forbidden
from labfleet.core.models import ComputeSession, Domain, Keypair, Project, ResourceGroup, User
from labfleet.core.slots import quantum_of

ACTION = "maintenance.recalculate-usage"


def amount_of(slot: str, quanta: int) -> Decimal:
    """A ledger amount (``quanta`` of ``slot``) in the slot's own unit: cpu in cores, mem in bytes,
    gpu in devices, gpu.shares in devices; ``@sessions`` and ``@pending`` are counts."""
    if slot.startswith("@"):
        return Decimal(quanta)
    return (quantum_of(slot) * quanta).normalize()


def _number(amount: Decimal) -> int | float:
    return int(amount) if amount == amount.to_integral_value() else float(amount)


def scope_names(db: Session, scopes: set[tuple[str, int]]) -> dict[tuple[str, int], str]:
    """Readable names of ledger scopes: domain ``acme``, project ``acme/ml``, user ``alice``,
    keypair ``AK...``, resource group ``default``; ``#ID (gone)`` for one that no longer exists."""
    ids: dict[str, set[int]] = defaultdict(set)
    for kind, ident in scopes:
        ids[kind].add(ident)
    names: dict[tuple[str, int], str] = {}
    queries = {
        "domain": lambda wanted: select(Domain.id, Domain.name).where(Domain.id.in_(wanted)),
        "project": lambda wanted: (
            select(Project.id, Domain.name + "/" + Project.name)
            .join(Domain, Project.domain_id == Domain.id)
            .where(Project.id.in_(wanted))
        ),
        "user": lambda wanted: select(User.id, User.username).where(User.id.in_(wanted)),
        "keypair": lambda wanted: select(Keypair.id, Keypair.access_key).where(Keypair.id.in_(wanted)),
        "resource_group": lambda wanted: select(ResourceGroup.id, ResourceGroup.name).where(
            ResourceGroup.id.in_(wanted)
        ),
    }
    for kind, wanted in ids.items():
        query = queries.get(kind)
        if query is None:
            continue
        for ident, name in db.execute(query(sorted(wanted))):
            names[(kind, ident)] = name
    return {scope: names.get(scope, f"#{scope[1]} (gone)") for scope in scopes}


def drift_view(db: Session, found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ledger.drift()'s rows with a readable scope, and the amounts in the slot's unit too
    (``stored`` and ``true`` stay the ledger's integer quanta)."""
    names = scope_names(db, {(d["scope_kind"], d["scope_id"]) for d in found})
    return [
        {
            "scope_kind": d["scope_kind"],
            "scope_id": d["scope_id"],
            "scope": names[(d["scope_kind"], d["scope_id"])],
            "slot": d["slot"],
            "stored": d["stored"],
            "true": d["true"],
            "stored_amount": _number(amount_of(d["slot"], d["stored"])),
            "true_amount": _number(amount_of(d["slot"], d["true"])),
        }
        for d in found
    ]


def check_may_recalculate(actor: Actor) -> None:
    """Forbidden unless ``actor`` may recalculate usage (a superadmin, or the CLI)."""
    if not authz.can_run_maintenance(actor):
        raise Forbidden("only a superadmin may recalculate usage")


def _last_session(db: Session, user: str, server: str) -> dict[str, Any] | None:
    """The newest labfleet session of one Hub server (a user's server name): how it ended."""
    s = db.scalar(
        select(ComputeSession)
        .join(User, ComputeSession.user_id == User.id)
        .where(User.username == user, ComputeSession.name == server)
        .order_by(ComputeSession.created_at.desc(), ComputeSession.id.desc())
        .limit(1)
    )
    if s is None:
        return None
    return {
        "id": s.id,
        "status": s.status,
        "status_reason": s.status_reason,
        "status_changed_at": s.status_changed_at.isoformat() if s.status_changed_at else None,
    }


def unaccounted_servers(
    db: Session, servers: Mapping[tuple[str, str], HubServer], now: datetime | None = None
) -> list[dict[str, Any]]:
    """The Hub servers that run with no live labfleet session: nobody accounts for what they hold.

    The reconcile job's rule (:func:`reconcile.orphan_servers`) on ``servers``, what the Hub runs
    (read before this, so a session admitted since is live here). Each: the user, the server name
    (``""``: the default server), when it started and was last active as the Hub says, the newest
    labfleet session it ran (None if it never ran one) and ``stopped`` (False: set by the caller
    that stops it)."""
    states = {key: server.state for key, server in servers.items()}
    return [
        {
            "user": user,
            "server": name,
            "started": servers[(user, name)].started,
            "last_activity": servers[(user, name)].last_activity,
            "last_session": _last_session(db, user, name),
            "stopped": False,
        }
        for user, name in reconcile.orphan_servers(reconcile.live_sessions(db, now), states)
    ]


def recalculate_usage(
    db: Session,
    actor: Actor,
    dry_run: bool = False,
    hub_servers: Mapping[tuple[str, str], HubServer] | None = None,
) -> dict[str, Any]:
    """Rebuild the usage ledger from the live sessions (``dry_run``: only say what differs).

    Answers ``{"drift": [...], "repaired": n, "dry_run": b, "unaccounted_servers": [...] or None}``:
    each row where the ledger differed from the sessions (see :func:`drift_view`), how many were
    repaired, and the Hub servers in ``hub_servers`` (what the Hub runs) that run no live session
    (see :func:`unaccounted_servers`); None when the Hub's servers were not given (not checked).
    Audited, with how many servers were unaccounted when they were checked.
    """
    check_may_recalculate(actor)
    if dry_run:
        # The same locked, consistent look as a repair, rolled back: nothing changes.
        nested = db.begin_nested()
        try:
            found = usage_ledger.recalculate(db)
        finally:
            nested.rollback()
    else:
        found = usage_ledger.recalculate(db)
    view = drift_view(db, found)
    unaccounted = None if hub_servers is None else unaccounted_servers(db, hub_servers)
    details: dict[str, Any] = {"drift": len(found), "dry_run": dry_run}
    if unaccounted is not None:
        details["unaccounted_servers"] = len(unaccounted)
    audit.record(db, actor, ACTION, "usage_ledger", details=details)
    return {
        "drift": view,
        "repaired": 0 if dry_run else len(found),
        "dry_run": dry_run,
        "unaccounted_servers": unaccounted,
    }
