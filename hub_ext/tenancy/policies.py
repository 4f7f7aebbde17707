"""Resource policies: keypair (slots, concurrency, lifetimes), user and project (folders, storage)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hub_ext.core import audit, authz
from hub_ext.core.authz import Actor
from hub_ext.core.bootstrap import ensure_default_keypair_policy  # noqa: F401 (re-exported)
from hub_ext.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from hub_ext.core.models import (
    Keypair,
    KeypairResourcePolicy,
    Project,
    ProjectResourcePolicy,
    User,
    UserResourcePolicy,
)
from hub_ext.core.rights import check_host_grants
from hub_ext.core.validate import check_choice, check_fields, check_int, check_name, check_slots

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
}
# A user policy also limits model serving (hub_ext.serving): endpoints, and replicas of one endpoint.
_USER_FIELDS = {
    **_FOLDER_FIELDS,
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
    }
    if kind == "user":
        view["max_endpoints"] = obj.max_endpoints
        view["max_replicas_per_endpoint"] = obj.max_replicas_per_endpoint
    return view


def parse_kind(kind: str) -> str:
    if kind not in KINDS:
        raise InvalidInput(f"policy kind must be keypair, user or project (got {kind!r:.20})")
    return kind
