"""What a user may use and what is left: keypair, project and domain limits.

``used`` is what admission counts: the slots charged to every admitted session that
has not ended (queued ones included), whole devices counted as shares too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, joinedload, selectinload

from labfleet.core import usage_ledger
from labfleet.core.models import Keypair, Project, User
from labfleet.core.slots import ResourceSlots
from labfleet.tenancy import snapshot
from labfleet.tenancy.policies import policy_view


def allocated(db: Session, **scope: Any) -> ResourceSlots:
    """Slots charged to live sessions in one scope: keypair=, user=, project= or domain= (an id),
    as the usage ledger holds them."""
    ((kind, ident),) = scope.items()
    return usage_ledger.used(usage_ledger.read(db, [(kind, ident)])[(kind, ident)])


def _left(limit: ResourceSlots, used: ResourceSlots, unlimited_unspecified: bool) -> dict[str, Any]:
    left: dict[str, Any] = {}
    for name in sorted(set(limit) | set(used)):
        if name not in limit:
            left[name] = None if unlimited_unspecified else 0
            continue
        rest = limit.get_amount(name) - used.get_amount(name)
        left[name] = ResourceSlots({name: max(rest, 0)}).to_json()[name]
    return left


def scope_report(limit: ResourceSlots, used: ResourceSlots, *, unlimited_unspecified: bool) -> dict[str, Any]:
    """``left`` maps each slot to the amount left; ``null`` means unlimited."""
    return {
        "limit": limit.to_json(),
        "used": used.to_json(),
        "left": _left(limit, used, unlimited_unspecified),
        "unspecified": "UNLIMITED" if unlimited_unspecified else "LIMITED",
    }


# What me_view reads of a user, loaded with it in a few statements.
ME_LOADS = (
    joinedload(User.domain),
    joinedload(User.resource_policy),
    selectinload(User.keypairs).joinedload(Keypair.resource_policy),
    selectinload(User.projects).joinedload(Project.domain),
)


def me_of(db: Session, username: str) -> User | None:
    return db.scalar(select(User).where(User.username == username).options(*ME_LOADS))


@dataclass(frozen=True)
class _MeStatic:
    """What /api/me shows that only tenancy changes (cached per tenancy version), and the scopes
    whose use it adds from the ledger: (section, name, scope, limit, unspecified is unlimited)."""

    report: dict[str, Any]
    limits: tuple[tuple[str, str, tuple[str, int], ResourceSlots, bool], ...]


def _me_static(db: Session, username: str) -> _MeStatic | None:
    user = me_of(db, username)
    if user is None:
        return None
    kp = user.main_keypair
    kp_policy = kp.resource_policy if kp else None
    domain = user.domain
    report: dict[str, Any] = {
        "username": user.username,
        "email": user.email,
        "full_name": user.full_name,
        "role": user.role,
        "status": user.status,
        "domain": {"name": domain.name, "total_resource_slots": domain.slots.to_json()},
        # Who can add the user to a project (the Fleet home names them to a user with none).
        "domain_admins": sorted(
            u.username
            for u in db.scalars(
                select(User).where(User.domain_id == domain.id, User.role == "admin", User.status == "active")
            )
        ),
        "projects": [
            {
                "name": p.name,
                "full_name": p.full_name,
                "description": p.description,
                "total_resource_slots": p.slots.to_json(),
            }
            for p in user.projects
        ],
        "main_access_key": kp.access_key if kp else None,
        "policies": {
            "keypair": policy_view("keypair", kp_policy) if kp_policy else None,
            "user": policy_view("user", user.resource_policy) if user.resource_policy else None,
        },
    }
    # Domain and project caps: slots they do not name are unlimited.
    limits = [("domain", "", ("domain", domain.id), domain.slots, True)]
    limits += [("projects", p.full_name, ("project", p.id), p.slots, True) for p in user.projects]
    if kp_policy and kp is not None:
        unlimited = kp_policy.default_for_unspecified == "UNLIMITED"
        # Admission holds the keypair policy to the user's sessions, all their keypairs together.
        limits.append(("keypair", "", ("user", user.id), kp_policy.slots, unlimited))
    return _MeStatic(report, tuple(limits))


def me_view(db: Session, username: str) -> dict[str, Any] | None:
    """``/api/me``: who the user is, their domain, projects and policies (from the tenancy cache)
    and what each of their quotas has left (one read of the ledger); None for no such user."""
    static = snapshot.cached(db, snapshot.current(db), ("me", username), lambda db: _me_static(db, username))
    if static is None:
        return None
    held = usage_ledger.read(db, [scope for _, _, scope, _, _ in static.limits])
    quota: dict[str, Any] = {"projects": {}}
    for section, name, scope, limit, unlimited in static.limits:
        report = scope_report(limit, usage_ledger.used(held[scope]), unlimited_unspecified=unlimited)
        if section == "projects":
            quota["projects"][name] = report
        else:
            quota[section] = report
    return {**static.report, "quota": quota}
