"""Keypairs: issue, list, revoke; look-up for signed requests.

A keypair is an access key (20 chars, public) and a secret key (40 chars) that is
shown once, when issued, and stored only encrypted (see :mod:`labfleet.core.secretbox`).

A keypair's policy cannot be walked around:

- a keypair takes its user's main keypair's policy unless one is named, and whoever names one
  may name only a policy no looser than the main keypair's (every limit compared:
  :func:`labfleet.tenancy.policies.looser_limits`), except that a domain admin may also hand out
  the policies a superadmin allowed for the domain (``allowed_keypair_policies``), and a
  superadmin any (:func:`assign_refusal`);
- a user mints at most ``max_keypairs`` active keypairs, the main one included (their user
  policy says how many; :data:`DEFAULT_MAX_KEYPAIRS` without one); an admin of their domain
  may issue (or reactivate) past it, as for any change an admin makes on purpose;
- admission counts a keypair policy's sessions and slots over all of the user's keypairs
  (:mod:`labfleet.compute.tenants`), so a second keypair under the same policy adds nothing;
- when an admin changes the main keypair's policy, the user's other active keypairs that held the
  old one (they inherited it) follow to the new one; a keypair given another policy on purpose
  keeps it (:func:`inheritors`; the update's audit entry names the keypairs moved);
- a new user's main keypair takes the policy :func:`new_user_policy` says: a domain admin's new
  users are held to what a superadmin allowed the domain.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from labfleet.core import audit, authz
from labfleet.core.authz import Actor
from labfleet.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from labfleet.core.models import Keypair, KeypairResourcePolicy, User
from labfleet.core.secretbox import SecretBox
from labfleet.core.signing import new_access_key, new_secret_key
from labfleet.core.validate import check_bool, check_fields, check_int, check_name, check_username
from labfleet.tenancy.policies import looser_limits, policy_view

DEFAULT_RATE_LIMIT = 10_000
MAX_RATE_LIMIT = 10_000_000
# The keypair policy of a new user's main keypair when nobody names one (and the domain allows no
# list of its own: see new_user_policy).
DEFAULT_KEYPAIR_POLICY = "default"
# Active keypairs a user with no user resource policy may hold, the main one included (a user
# policy's ``max_keypairs`` says it for its users; its column defaults to the same).
DEFAULT_MAX_KEYPAIRS = 10


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


def assign_refusal(
    policy: str,
    looser: list[str] | None,
    *,
    superadmin: bool,
    domain_admin: bool,
    domain: str,
    allowed: list[str],
    base: str | None,
) -> str | None:
    """Why this actor may not give keypair policy ``policy`` to a user's keypair; None when they
    may.  Pure.  ``looser``: the limits in which it is looser than ``base`` (the user's main
    keypair's policy; for the main keypair itself, its present one), None when there is no base.
    ``allowed``: the policies a superadmin allowed domain ``domain``'s admins to hand out."""
    if superadmin or looser == []:
        return None
    if domain_admin and policy in allowed:
        return None
    if looser is None:
        within = f"there is no active main keypair of {base or 'the user'} to compare it with"
    else:
        within = f"it is looser than {base!r}, the main keypair's policy: {'; '.join(looser)}"
    if domain_admin:
        listed = ", ".join(allowed) if allowed else "none"
        return (
            f"keypair policy {policy!r} is not one that domain {domain}'s admins may hand out "
            f"(a superadmin allows those in the domain's allowed_keypair_policies: {listed}), "
            f"and {within}"
        )
    return f"keypair policy {policy!r} cannot be chosen: {within}; name one no looser, or none to inherit it"


def new_user_policy(named: str | None, *, superadmin: bool, domain: str, allowed: Sequence[str]) -> str:
    """The keypair policy of the main keypair of a user created in domain ``domain``.  Pure.

    ``named``: what the creator asked for (None: nothing).  ``allowed``: the domain's
    ``allowed_keypair_policies``, in the order a superadmin gave them.  A superadmin may name any
    policy, and their new user gets :data:`DEFAULT_KEYPAIR_POLICY` otherwise.  A domain admin may
    name one of ``allowed``, and their new user gets its first otherwise.  A domain with no list
    of its own is bounded by its caps only (its total_resource_slots, its projects'): its admins'
    new users get the unlimited :data:`DEFAULT_KEYPAIR_POLICY`, the one policy they may name then.
    Raises :class:`Forbidden` (saying what may be named) for a policy the creator may not give."""
    if superadmin:
        return DEFAULT_KEYPAIR_POLICY if named is None else named
    offered = list(allowed) or [DEFAULT_KEYPAIR_POLICY]
    if named is None:
        return offered[0]
    if named not in offered:
        listed = ", ".join(allowed) if allowed else f"none, so its new users get {DEFAULT_KEYPAIR_POLICY!r}"
        raise Forbidden(
            f"keypair_policy: {named!r} is not one that domain {domain}'s admins may give "
            f"(a superadmin allows those in the domain's allowed_keypair_policies: {listed})"
        )
    return named


def inheritors(old: str, keypairs: Iterable[Mapping[str, Any]]) -> list[str]:
    """The access keys of the keypairs that follow their main keypair from policy ``old`` to
    another: the active ones, not the main one, that hold ``old``.  One given another policy (by
    an admin, on purpose) keeps it; an inactive one stays as it is.  ``keypairs``:
    :func:`keypair_view` values (or any mappings with their keys).  Pure."""
    return [
        str(k["access_key"])
        for k in keypairs
        if k["is_active"] and not k["is_main"] and k["resource_policy"] == old
    ]


def _policy_named(db: Session, name: Any) -> KeypairResourcePolicy:
    name = check_name(name, "resource_policy")
    policy = db.scalar(select(KeypairResourcePolicy).where(KeypairResourcePolicy.name == name))
    if policy is None:
        raise InvalidInput(f"resource_policy: no keypair policy named {name!r}")
    return policy


def _check_assignable(
    actor: Actor, owner: User, policy: KeypairResourcePolicy, base: KeypairResourcePolicy | None
) -> None:
    """Raise 403 unless ``actor`` may give ``policy`` to a keypair of ``owner`` (see :func:`assign_refusal`)."""
    looser = looser_limits(policy_view("keypair", policy), policy_view("keypair", base)) if base else None
    refusal = assign_refusal(
        policy.name,
        looser,
        superadmin=actor.is_superadmin,
        domain_admin=actor.is_domain_admin_of(owner.domain.name),
        domain=owner.domain.name,
        allowed=list(owner.domain.allowed_keypair_policies or ()),
        base=base.name if base else owner.username,
    )
    if refusal is not None:
        raise Forbidden(refusal)


def keypair_limit(max_keypairs: int | None, held: int) -> str | None:
    """Why a user who holds ``held`` active keypairs may not have one more; None when they may.
    ``max_keypairs``: their user policy's (0: no limit), None without a user policy.  Pure."""
    limit = DEFAULT_MAX_KEYPAIRS if max_keypairs is None else max_keypairs
    if limit and held >= limit:
        whose = (
            "the user policy's max_keypairs"
            if max_keypairs is not None
            else "the limit for users with no user policy"
        )
        return f"already has {held} active keypairs, the most allowed ({whose}: {limit}): revoke one first"
    return None


def _check_room(db: Session, owner: User) -> None:
    """Raise 409 when ``owner`` may not hold one more active keypair (:func:`keypair_limit`).
    The user's row is locked first (PostgreSQL), so two issues at once cannot both take the
    last place."""
    db.execute(select(User.id).where(User.id == owner.id).with_for_update())
    held = db.scalar(
        select(func.count()).select_from(Keypair).where(Keypair.user_id == owner.id, Keypair.is_active)
    )
    policy = owner.resource_policy
    refusal = keypair_limit(policy.max_keypairs if policy is not None else None, held or 0)
    if refusal is not None:
        raise Conflict(f"{owner.username} {refusal}")


def issue(db: Session, actor: Actor, body: Any) -> tuple[Keypair, str]:
    """Issue a keypair.  Its policy is the owner's main keypair's unless the body names one (see
    the module docstring for who may name which); its rate limit the main keypair's unless an
    admin gives one."""
    body = check_fields(body, optional=["username", "resource_policy", "rate_limit"])
    username = check_username(body.get("username", actor.name), "username")
    owner = db.scalar(select(User).where(User.username == username))
    if owner is None or not authz.can_read_user(actor, owner.username, owner.domain.name):
        raise NotFound(f"no user {username!r}")
    if not authz.can_manage_keypairs_of(actor, owner.username, owner.domain.name):
        raise Forbidden(f"you cannot issue keypairs for {username!r}")
    admin = authz.can_manage_in_domain(actor, owner.domain.name)
    if "rate_limit" in body and not admin:
        raise Forbidden("only an admin can choose a keypair's rate limit")
    main = owner.main_keypair
    base = main.resource_policy if main is not None else None
    if "resource_policy" in body:
        policy = _policy_named(db, body["resource_policy"])
    elif base is not None:
        policy = base
    else:
        raise Conflict(
            f"{username!r} has no active main keypair to take a policy from: name a resource_policy"
        )
    default_rate = main.rate_limit if main is not None else DEFAULT_RATE_LIMIT
    rate = check_int(body.get("rate_limit", default_rate), "rate_limit", minimum=1, maximum=MAX_RATE_LIMIT)
    _check_assignable(actor, owner, policy, base)
    if not owner.is_active:
        raise Conflict(f"user {username!r} is inactive")
    if not admin:
        _check_room(db, owner)
    kp, secret = new_keypair(db, owner, policy, rate_limit=rate)
    audit.record(
        db,
        actor,
        "keypair.issue",
        kp.access_key,
        target_domain=owner.domain.name,
        details={"username": username, "resource_policy": policy.name, "rate_limit": rate},
    )
    return kp, secret


def update(db: Session, actor: Actor, access_key: str, body: Any) -> Keypair:
    """Change a keypair (admins).  A new policy for the main keypair is one for the keypairs
    that inherited its old one too (:func:`inheritors`): the audit entry's ``followed_by`` names
    them."""
    kp = _readable(db, actor, access_key)
    body = check_fields(body, optional=["resource_policy", "rate_limit", "is_active"])
    if not authz.can_manage_in_domain(actor, kp.user.domain.name):
        raise Forbidden("only an admin can change a keypair")
    policy = _policy_named(db, body["resource_policy"]) if "resource_policy" in body else None
    rate = (
        check_int(body["rate_limit"], "rate_limit", minimum=1, maximum=MAX_RATE_LIMIT)
        if "rate_limit" in body
        else None
    )
    active = check_bool(body["is_active"], "is_active") if "is_active" in body else None
    owner = kp.user
    main = owner.main_keypair
    if policy is not None and policy is not kp.resource_policy:
        # The main keypair is held to its own present policy; any other to the main keypair's.
        base = kp.resource_policy if kp.is_main or main is None else main.resource_policy
        _check_assignable(actor, owner, policy, base)
    details = dict(body)
    if policy is not None and policy is not kp.resource_policy and kp.is_main:
        # The keypairs that inherited the main keypair's policy follow it (inheritors).
        moved = set(inheritors(kp.resource_policy.name, map(keypair_view, owner.keypairs)))
        for other in owner.keypairs:
            if other.access_key in moved:
                other.resource_policy = policy
        details["followed_by"] = sorted(moved)
    if policy is not None:
        kp.resource_policy = policy
    if rate is not None:
        kp.rate_limit = rate
    if active is not None:
        kp.is_active = active
    audit.record(
        db, actor, "keypair.update", kp.access_key, target_domain=kp.user.domain.name, details=details
    )
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
