"""What a user may launch: projects with the quota left, images, resource groups, folders.

The spawn form, the Lab sidebar and the launcher widget all ask this one question
(``GET /api/users/{name}/launch-options``), so they offer the same choices admission accepts.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from labfleet.compute import images, nodes, waiting
from labfleet.compute.environments import READY
from labfleet.compute.quota import allocated
from labfleet.core.envmodels import Environment
from labfleet.core.models import Image, User, UserStatus
from labfleet.core.slots import ResourceSlots
from labfleet.core.vocab import DEFAULT_SESSION_SLOTS, ENVIRONMENT_IMAGE_PREFIX, SESSION_TYPES, SLOT_NAMES
from labfleet.storage import vfolders


def _left(
    limit: ResourceSlots, used: ResourceSlots, unlimited_unspecified: bool
) -> dict[str, Decimal | None]:
    out: dict[str, Decimal | None] = {}
    for slot in SLOT_NAMES:
        if slot not in limit:
            out[slot] = None if unlimited_unspecified else Decimal(0)
        else:
            out[slot] = max(limit.get_amount(slot) - used.get_amount(slot), Decimal(0))
    return out


def _tightest(*lefts: dict[str, Decimal | None]) -> dict[str, Any]:
    """Slot by slot, the smallest amount left over every scope (None: no scope limits it)."""
    out: dict[str, Any] = {}
    for slot in SLOT_NAMES:
        amounts = [amount for left in lefts if (amount := left[slot]) is not None]
        if not amounts:
            out[slot] = None
            continue
        amount = min(amounts)
        out[slot] = ResourceSlots({slot: amount}).to_json()[slot] if amount else 0
    return out


def project_admins(db: Session, user: User) -> list[str]:
    """The names of those who may add ``user`` to a project: the admins of their domain, or, where
    it has none, the superadmins (active ones only)."""
    active = User.status == UserStatus.active.value
    names = db.scalars(
        select(User.username).where(User.domain_id == user.domain_id, User.role == "admin", active)
    ).all()
    if not names:
        names = db.scalars(select(User.username).where(User.role == "superadmin", active)).all()
    return sorted(names)


def environment_rows(db: Session, user: User, project_names: list[str]) -> list[dict[str, Any]]:
    """The user's READY environments as images to launch (``env:<id>``), each with the projects it
    may start in: a personal one wherever its base may run, a project one in its project (as
    admission decides, :func:`labfleet.compute.environments.session_image`)."""
    mine = [p for p in user.projects if p.full_name in project_names]
    envs = db.scalars(
        select(Environment)
        .where(
            Environment.status == READY,
            or_(Environment.user_id == user.id, Environment.project_id.in_([p.id for p in mine])),
        )
        .order_by(Environment.name)
    )
    rows = []
    for env in envs:
        base = images.find(db, env.base)
        if base is None:
            continue
        where = [env.project.full_name] if env.project is not None else project_names
        usable = [n for n in where if n in project_names and images.allowed_for(base, n)]
        if usable:
            whose = "my environment" if env.project is None else f"environment of {env.project.full_name}"
            rows.append(
                {
                    "name": ENVIRONMENT_IMAGE_PREFIX + env.id,
                    "display_name": f"{env.name} ({whose}, on {base.display_name or base.name})",
                    "min_slots": base.min_slots.to_json(),
                    "accelerators": list(base.accelerators or []),
                    "projects": usable,
                    "environment": {"id": env.id, "name": env.name, "base": env.base},
                }
            )
    return rows


def _keypair_left(db: Session, user: User) -> dict[str, Decimal | None]:
    kp = user.main_keypair
    policy = kp.resource_policy if kp else None
    if not (kp and policy):
        return dict.fromkeys(SLOT_NAMES, Decimal(0))
    return _left(policy.slots, allocated(db, keypair=kp.id), policy.default_for_unspecified == "UNLIMITED")


def quota_left(db: Session, user: User, project: Any = None) -> dict[str, Any]:
    """Slot by slot, what ``user`` may still take now (their keypair's policy and their domain's cap,
    and ``project``'s when given); None: nothing limits it. An environment's build is cut to this,
    and holds what it takes until it ends (:mod:`labfleet.compute.buildcharge`)."""
    lefts = [_keypair_left(db, user), _left(user.domain.slots, allocated(db, domain=user.domain_id), True)]
    if project is not None:
        lefts.append(_left(project.slots, allocated(db, project=project.id), True))
    return _tightest(*lefts)


def launch_options(db: Session, user: User) -> dict[str, Any]:
    kp_left = _keypair_left(db, user)
    domain_left = _left(user.domain.slots, allocated(db, domain=user.domain_id), True)
    projects = [
        {
            "name": p.full_name,
            "left": _tightest(kp_left, domain_left, _left(p.slots, allocated(db, project=p.id), True)),
        }
        for p in sorted(user.projects, key=lambda p: p.full_name)
        if p.is_active
    ]
    names = [str(p["name"]) for p in projects]
    image_rows = []
    for image in db.scalars(select(Image).where(Image.is_active.is_(True)).order_by(Image.name)):
        usable = [n for n in names if images.allowed_for(image, n)]
        if usable:
            image_rows.append(
                {
                    "name": image.name,
                    "display_name": image.display_name or image.name,
                    "min_slots": image.min_slots.to_json(),
                    "accelerators": list(image.accelerators or []),
                    "projects": usable,
                }
            )
    image_rows += environment_rows(db, user, names)
    my_groups = nodes.usable_groups(db, user)
    free = waiting.free_in(db, my_groups)
    groups = [
        {
            "name": g.name,
            "description": g.description,
            "session_types": list(g.allowed_session_types or SESSION_TYPES),
            # What one session could get there now (a quota says what one may still ask).
            "free_now": free[g.name],
            "pending_timeout": g.pending_timeout,
        }
        for g in my_groups
    ]
    folders = [
        {
            "id": v.id,
            "name": v.name,
            "owner": vfolders.owner_label(v),
            "permission": acc.permission,
            "usage_mode": v.usage_mode,
            "host": v.host.name,
            "auto": v.user_id == user.id and v.name.startswith("."),
            "mountable": can_mount,
        }
        for v, acc, can_mount in vfolders.mountable_for(db, user)
    ]
    return {
        "user": user.username,
        "role": user.role,
        # Who can add the user to a project: their domain's admins, else the superadmins.
        "project_admins": project_admins(db, user),
        "projects": projects,
        "defaults": dict(DEFAULT_SESSION_SLOTS),
        "images": image_rows,
        "resource_groups": groups,
        "vfolders": folders,
    }
