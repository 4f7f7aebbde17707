"""Resource policies: keypair (slots, concurrency, lifetimes), user and project (folders, storage,
environments)."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from labfleet.core import audit, authz
from labfleet.core.authz import Actor
from labfleet.core.bootstrap import ensure_default_keypair_policy  # noqa: F401 (re-exported)
from labfleet.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from labfleet.core.models import (
    Domain,
    Keypair,
    KeypairResourcePolicy,
    Project,
    ProjectResourcePolicy,
    User,
    UserResourcePolicy,
)
from labfleet.core.rights import RIGHTS, check_host_grants
from labfleet.core.slots import ResourceSlots, base_slot, format_amount
from labfleet.core.validate import check_choice, check_fields, check_int, check_name, check_slots

MAX_SECONDS = 10 * 365 * 24 * 3600
MAX_BYTES = 2**62

KINDS: dict[str, type] = {
    "keypair": KeypairResourcePolicy,
    "user": UserResourcePolicy,
    "project": ProjectResourcePolicy,
}

# field -> checker, per kind
_KEYPAIR_FIELDS = {
    "total_resource_slots": lambda v: check_slots(v).to_db(),
    "default_for_unspecified": lambda v: check_choice(v, "default_for_unspecified", ("LIMITED", "UNLIMITED")),
    "max_concurrent_sessions": lambda v: check_int(v, "max_concurrent_sessions", maximum=100_000),
    "max_pending_sessions": lambda v: check_int(v, "max_pending_sessions", maximum=100_000),
    "max_session_lifetime": lambda v: check_int(v, "max_session_lifetime", maximum=MAX_SECONDS),
    "idle_timeout": lambda v: check_int(v, "idle_timeout", minimum=-1, maximum=MAX_SECONDS),
    "allowed_storage_hosts": lambda v: check_host_grants(v, "allowed_storage_hosts"),
}
_FOLDER_FIELDS = {
    "max_vfolder_count": lambda v: check_int(v, "max_vfolder_count", maximum=1_000_000),
    "max_quota_scope_size": lambda v: check_int(v, "max_quota_scope_size", maximum=MAX_BYTES),
    "max_vfolder_size": lambda v: check_int(v, "max_vfolder_size", maximum=MAX_BYTES),
    # The owner's own environment images (labfleet.compute.environments): how many, how many bytes.
    "max_environments": lambda v: check_int(v, "max_environments", maximum=100_000),
    "max_environment_bytes": lambda v: check_int(v, "max_environment_bytes", maximum=MAX_BYTES),
}
# A user policy also limits model serving (labfleet.serving): endpoints, and replicas of one endpoint;
# and the keypairs its user may hold (labfleet.tenancy.keypairs).
_USER_FIELDS = {
    **_FOLDER_FIELDS,
    "max_keypairs": lambda v: check_int(v, "max_keypairs", maximum=100_000),
    "max_endpoints": lambda v: check_int(v, "max_endpoints", maximum=100_000),
    "max_replicas_per_endpoint": lambda v: check_int(v, "max_replicas_per_endpoint", maximum=100_000),
}
FIELDS = {"keypair": _KEYPAIR_FIELDS, "user": _USER_FIELDS, "project": _FOLDER_FIELDS}


def _kind(kind: str) -> type:
    if kind not in KINDS:
        raise NotFound(f"no policy kind {kind!r}: use keypair, user or project")
    return KINDS[kind]


def _checked(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    checkers = FIELDS[kind]
    return {k: checkers[k](v) for k, v in body.items() if k in checkers}


def get_policy(db: Session, actor: Actor, kind: str, name: str):
    model = _kind(kind)
    if not authz.can_read_policies(actor):
        raise Forbidden("you cannot read resource policies")
    obj = db.scalar(select(model).where(model.name == name))
    if obj is None:
        raise NotFound(f"no {kind} resource policy {name!r}")
    return obj


def list_policies(db: Session, actor: Actor, kind: str) -> list:
    model = _kind(kind)
    if not authz.can_read_policies(actor):
        raise Forbidden("you cannot read resource policies")
    return list(db.scalars(select(model).order_by(model.name)))


def create_policy(db: Session, actor: Actor, kind: str, body: Any):
    model = _kind(kind)
    body = check_fields(body, required=["name"], optional=FIELDS[kind])
    name = check_name(body["name"], "policy name")
    values = _checked(kind, body)
    if not authz.can_manage_policies(actor):
        raise Forbidden("only a superadmin can create resource policies")
    if db.scalar(select(model).where(model.name == name)):
        raise Conflict(f"{kind} resource policy {name!r} already exists")
    obj = model(name=name, **values)
    db.add(obj)
    db.flush()
    audit.record(db, actor, f"policy.{kind}.create", name, details=body)
    return obj


def update_policy(db: Session, actor: Actor, kind: str, name: str, body: Any):
    obj = get_policy(db, actor, kind, name)
    body = check_fields(body, optional=FIELDS[kind])
    values = _checked(kind, body)
    if not authz.can_manage_policies(actor):
        raise Forbidden("only a superadmin can change resource policies")
    for k, v in values.items():
        setattr(obj, k, v)
    audit.record(db, actor, f"policy.{kind}.update", name, details=body)
    return obj


def delete_policy(db: Session, actor: Actor, kind: str, name: str) -> None:
    obj = get_policy(db, actor, kind, name)
    if not authz.can_manage_policies(actor):
        raise Forbidden("only a superadmin can delete resource policies")
    if kind == "keypair" and name == "default":
        raise Conflict("the default keypair policy cannot be deleted: every new user's main keypair uses it")
    ref_model, column = {
        "keypair": (Keypair, Keypair.resource_policy_id),
        "user": (User, User.resource_policy_id),
        "project": (Project, Project.resource_policy_id),
    }[kind]
    used = db.scalar(select(func.count()).select_from(ref_model).where(column == obj.id))
    if used:
        raise Conflict(f"{kind} resource policy {name!r} is used by {used} {ref_model.__tablename__}")
    if kind == "keypair":
        allowing = sorted(
            d.name for d in db.scalars(select(Domain)) if name in (d.allowed_keypair_policies or ())
        )
        if allowing:
            raise Conflict(
                f"keypair resource policy {name!r} is in the allowed_keypair_policies of domain "
                f"{', '.join(allowing)}: take it off first"
            )
    db.delete(obj)
    audit.record(db, actor, f"policy.{kind}.delete", name)


def policy_view(kind: str, obj) -> dict[str, Any]:
    if kind == "keypair":
        return {
            "name": obj.name,
            "total_resource_slots": obj.slots.to_json(),
            "default_for_unspecified": obj.default_for_unspecified,
            "max_concurrent_sessions": obj.max_concurrent_sessions,
            "max_pending_sessions": obj.max_pending_sessions,
            "max_session_lifetime": obj.max_session_lifetime,
            "idle_timeout": obj.idle_timeout,
            "allowed_storage_hosts": obj.allowed_storage_hosts or [],
        }
    view = {
        "name": obj.name,
        "max_vfolder_count": obj.max_vfolder_count,
        "max_quota_scope_size": obj.max_quota_scope_size,
        "max_vfolder_size": obj.max_vfolder_size,
        "max_environments": obj.max_environments,
        "max_environment_bytes": obj.max_environment_bytes,
    }
    if kind == "user":
        view["max_endpoints"] = obj.max_endpoints
        view["max_replicas_per_endpoint"] = obj.max_replicas_per_endpoint
        view["max_keypairs"] = obj.max_keypairs
    return view


def parse_kind(kind: str) -> str:
    if kind not in KINDS:
        raise InvalidInput(f"policy kind must be keypair, user or project (got {kind!r:.20})")
    return kind


# ---------------------------------------------------------------- one keypair policy against another


def _cap(slots: ResourceSlots, unlimited: bool, name: str) -> Decimal | None:
    """What a policy allows of slot ``name`` in all (None: no limit), as admission counts it
    (:func:`labfleet.compute.scheduler.admission.quota_view`): a per-model slot is held to its own
    cap and to its base slot's; a slot the policy names neither way follows the policy's rule."""
    caps = [slots.get_amount(n) for n in {name, base_slot(name)} if n in slots]
    if caps:
        return min(caps)
    return None if unlimited else Decimal(0)


def _count(limit: int) -> str:
    return "no limit" if limit == 0 else str(limit)


def _idle(value: int) -> str:
    return {0: "never", -1: "the fleet's default"}.get(value, f"{value} s")


def _host_rights(grants: Any) -> dict[str, frozenset[str]]:
    if isinstance(grants, Mapping):
        return {h: frozenset(r or ()) for h, r in grants.items()}
    return {h: frozenset(RIGHTS) for h in grants or ()}


def looser_limits(candidate: Mapping[str, Any], base: Mapping[str, Any]) -> list[str]:
    """Every limit in which keypair policy ``candidate`` allows more than ``base``, said for
    people; empty when it is no looser.  Both are :func:`policy_view` values.  Pure.

    Counts and the lifetime: 0 is no limit.  Idle timeout: 0 is never reclaimed (the loosest),
    -1 the fleet's default, which only -1 or a base that never reclaims is sure to match.
    Storage hosts: a grant the base does not give is looser."""
    out: list[str] = []
    c_slots = ResourceSlots.parse(candidate["total_resource_slots"])
    b_slots = ResourceSlots.parse(base["total_resource_slots"])
    c_unl = candidate["default_for_unspecified"] == "UNLIMITED"
    b_unl = base["default_for_unspecified"] == "UNLIMITED"
    if c_unl and not b_unl:
        out.append("slots it does not name are UNLIMITED (LIMITED in the other)")
    for name in sorted(set(c_slots) | set(b_slots)):
        c, b = _cap(c_slots, c_unl, name), _cap(b_slots, b_unl, name)
        if b is not None and (c is None or c > b):
            have = "no limit" if c is None else format_amount(name, c)
            out.append(f"{name}: {have} (at most {format_amount(name, b)})")
    for field in ("max_concurrent_sessions", "max_pending_sessions", "max_session_lifetime"):
        mine, theirs = int(candidate[field]), int(base[field])
        if theirs != 0 and (mine == 0 or mine > theirs):
            out.append(f"{field}: {_count(mine)} (at most {theirs})")
    c_idle, b_idle = int(candidate["idle_timeout"]), int(base["idle_timeout"])
    if b_idle != 0 and c_idle != b_idle and (b_idle < 0 or c_idle <= 0 or c_idle > b_idle):
        out.append(f"idle_timeout: {_idle(c_idle)} (at most {_idle(b_idle)})")
    b_hosts = _host_rights(base["allowed_storage_hosts"])
    for host, rights in sorted(_host_rights(candidate["allowed_storage_hosts"]).items()):
        extra = rights - b_hosts.get(host, frozenset())
        if extra:
            out.append(f"allowed_storage_hosts: {', '.join(sorted(extra))} on {host}")
    return out


def policy_no_looser(candidate: Mapping[str, Any], base: Mapping[str, Any]) -> bool:
    """Does keypair policy ``candidate`` allow nothing that ``base`` does not?  (Pure; both are
    :func:`policy_view` values; see :func:`looser_limits`.)"""
    return not looser_limits(candidate, base)
