"""Keypairs: issue, list, revoke; look-up for signed requests.

A keypair is an access key (20 chars, public) and a secret key (40 chars) that is
shown once, when issued, and stored only encrypted (see :mod:`hub_ext.core.secretbox`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from hub_ext.core import audit, authz
from hub_ext.core.authz import Actor
from hub_ext.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from hub_ext.core.models import Keypair, KeypairResourcePolicy, User
from hub_ext.core.secretbox import SecretBox
from hub_ext.core.signing import new_access_key, new_secret_key
from hub_ext.core.validate import check_bool, check_fields, check_int, check_name, check_username

DEFAULT_RATE_LIMIT = 10_000
MAX_RATE_LIMIT = 10_000_000


def new_keypair(
    db: Session,
    user: User,
    policy: KeypairResourcePolicy,
    *,
    is_main: bool = False,
    rate_limit: int = DEFAULT_RATE_LIMIT,
    box: SecretBox | None = None,
) -> tuple[Keypair, str]:
    """Create a keypair; returns it with its plain secret (to show once)."""
    secret = new_secret_key()
    kp = Keypair(
        access_key=new_access_key(),
        secret_key_encrypted=(box or SecretBox()).seal(secret),
        user=user,
        resource_policy=policy,
        is_main=is_main,
        is_active=True,
        rate_limit=rate_limit,
    )
    db.add(kp)
    db.flush()
    return kp, secret


def find_active(db: Session, access_key: str) -> Keypair | None:
    kp = db.scalar(select(Keypair).where(Keypair.access_key == access_key))
    if kp is None or not kp.is_active or not kp.user.is_active:
        return None
    return kp


def secret_of(kp: Keypair, box: SecretBox | None = None) -> str:
    return (box or SecretBox()).open(kp.secret_key_encrypted)


def _readable(db: Session, actor: Actor, access_key: str) -> Keypair:
    kp = (
        db.scalar(select(Keypair).where(Keypair.access_key == access_key))
        if isinstance(access_key, str)
        else None
    )
    if kp is None or not authz.can_read_keypairs_of(actor, kp.user.username, kp.user.domain.name):
        raise NotFound(f"no keypair {access_key!r:.30}")
    return kp


def issue(db: Session, actor: Actor, body: Any) -> tuple[Keypair, str]:
    body = check_fields(body, optional=["username", "resource_policy", "rate_limit"])
    username = check_username(body.get("username", actor.name), "username")
    owner = db.scalar(select(User).where(User.username == username))
    if owner is None or not authz.can_read_user(actor, owner.username, owner.domain.name):
        raise NotFound(f"no user {username!r}")
    if not authz.can_manage_keypairs_of(actor, owner.username, owner.domain.name):
        raise Forbidden(f"you cannot issue keypairs for {username!r}")
    admin = authz.can_manage_in_domain(actor, owner.domain.name)
    if ("resource_policy" in body or "rate_limit" in body) and not admin:
        raise Forbidden("only an admin can choose a keypair's resource policy or rate limit")
    policy_name = check_name(body.get("resource_policy", "default"), "resource_policy")
    policy = db.scalar(select(KeypairResourcePolicy).where(KeypairResourcePolicy.name == policy_name))
    if policy is None:
        raise InvalidInput(f"resource_policy: no keypair policy named {policy_name!r}")
    rate = check_int(
        body.get("rate_limit", DEFAULT_RATE_LIMIT), "rate_limit", minimum=1, maximum=MAX_RATE_LIMIT
    )
    if not owner.is_active:
        raise Conflict(f"user {username!r} is inactive")
    kp, secret = new_keypair(db, owner, policy, rate_limit=rate)
    audit.record(
        db,
        actor,
        "keypair.issue",
        kp.access_key,
        target_domain=owner.domain.name,
        details={"username": username, "resource_policy": policy_name, "rate_limit": rate},
    )
    return kp, secret


def update(db: Session, actor: Actor, access_key: str, body: Any) -> Keypair:
    kp = _readable(db, actor, access_key)
    body = check_fields(body, optional=["resource_policy", "rate_limit", "is_active"])
    if not authz.can_manage_in_domain(actor, kp.user.domain.name):
        raise Forbidden("only an admin can change a keypair")
    if "resource_policy" in body:
        name = check_name(body["resource_policy"], "resource_policy")
        policy = db.scalar(select(KeypairResourcePolicy).where(KeypairResourcePolicy.name == name))
        if policy is None:
            raise InvalidInput(f"resource_policy: no keypair policy named {name!r}")
        kp.resource_policy = policy
    if "rate_limit" in body:
        kp.rate_limit = check_int(body["rate_limit"], "rate_limit", minimum=1, maximum=MAX_RATE_LIMIT)
    if "is_active" in body:
        kp.is_active = check_bool(body["is_active"], "is_active")
    audit.record(db, actor, "keypair.update", kp.access_key, target_domain=kp.user.domain.name, details=body)
    return kp


def revoke(db: Session, actor: Actor, access_key: str) -> Keypair:
    kp = _readable(db, actor, access_key)
    if not authz.can_manage_keypairs_of(actor, kp.user.username, kp.user.domain.name):
        raise Forbidden("you cannot revoke this keypair")
    if kp.is_main:
        raise Conflict("the main keypair cannot be revoked: deactivate the user instead")
    kp.is_active = False
    audit.record(db, actor, "keypair.revoke", kp.access_key, target_domain=kp.user.domain.name)
    return kp


def get(db: Session, actor: Actor, access_key: str) -> Keypair:
    return _readable(db, actor, access_key)


def list_keypairs(db: Session, actor: Actor, username: str | None = None) -> list[Keypair]:
    q = select(Keypair).order_by(Keypair.id)
    if username is not None:
        q = q.join(User).where(User.username == username)
    return [
        kp for kp in db.scalars(q) if authz.can_read_keypairs_of(actor, kp.user.username, kp.user.domain.name)
    ]


def keypair_view(kp: Keypair, secret: str | None = None) -> dict[str, Any]:
    out = {
        "access_key": kp.access_key,
        "username": kp.user.username,
        "resource_policy": kp.resource_policy.name,
        "is_main": kp.is_main,
        "is_active": kp.is_active,
        "rate_limit": kp.rate_limit,
        "created_at": kp.created_at.isoformat() if kp.created_at else None,
        "last_used": kp.last_used.isoformat() if kp.last_used else None,
    }
    if secret is not None:
        out["secret_key"] = secret  # only in the answer to the issuing request
    return out
