"""Tenancy as admission and authentication read it, cached per process and checked by version.

Users (with their domain, projects and main keypair), projects (with their members) and keypairs
(with their resource policy) as frozen values, loaded once per version of the ``tenancy``
counter (:mod:`labfleet.core.versions`): any change to tenancy bumps the counter in its own
transaction, and a reader that sees the new number loads afresh, so a change is never missed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine, and_, bindparam, select
from sqlalchemy.orm import Session, selectinload

from labfleet.core import versions
from labfleet.core.models import (
    Domain,
    Keypair,
    KeypairResourcePolicy,
    Project,
    ProjectMember,
    User,
    UserStatus,
)
from labfleet.core.slots import ResourceSlots


@dataclass(frozen=True)
class PolicySnap:
    name: str
    slots: ResourceSlots
    unlimited_unspecified: bool
    max_concurrent_sessions: int
    max_pending_sessions: int
    max_session_lifetime: int


@dataclass(frozen=True)
class KeypairSnap:
    id: int
    access_key: str
    user_id: int
    is_active: bool
    rate_limit: int
    policy: PolicySnap


@dataclass(frozen=True)
class UserSnap:
    id: int
    username: str
    role: str
    is_active: bool
    domain_id: int
    domain: str
    domain_active: bool
    domain_slots: ResourceSlots
    project_ids: frozenset[int]
    main_keypair: KeypairSnap | None


@dataclass(frozen=True)
class ProjectSnap:
    id: int
    name: str
    domain_id: int
    domain: str
    is_active: bool
    slots: ResourceSlots

    @property
    def full_name(self) -> str:
        return f"{self.domain}/{self.name}"


_cache = versions.VersionedCache(versions.TENANCY)


_MISSING = object()


def user_now(engine: Engine, factory: Callable[[], Session], username: str) -> UserSnap | None:
    """The user as of now: the version read in its own short transaction, the user from the
    cache when it holds that version (no ORM session at all), else loaded."""
    version = versions.read_on(engine, versions.TENANCY)
    got = _cache.peek(engine, version, ("user", username), _MISSING)
    if got is not _MISSING:
        return got
    db = factory()
    try:
        return user(db, version, username)
    finally:
        db.rollback()
        db.close()


def latest(db: Session) -> int | None:
    """The newest tenancy version this process has read for ``db``'s database, if any (no I/O)."""
    return _cache.latest(db)


def current(db: Session) -> int:
    """The tenancy counter as this transaction sees it (one statement)."""
    return int(db.scalar(versions.read_statement(versions.TENANCY)) or 0)


def _keypair_snap(kp: Keypair) -> KeypairSnap:
    p = kp.resource_policy
    return KeypairSnap(
        id=kp.id,
        access_key=kp.access_key,
        user_id=kp.user_id,
        is_active=kp.is_active,
        rate_limit=kp.rate_limit,
        policy=PolicySnap(
            name=p.name,
            slots=p.slots,
            unlimited_unspecified=p.default_for_unspecified == "UNLIMITED",
            max_concurrent_sessions=p.max_concurrent_sessions,
            max_pending_sessions=p.max_pending_sessions,
            max_session_lifetime=p.max_session_lifetime,
        ),
    )


_Policy = KeypairResourcePolicy
# The statements of a cold load, built once: a service meets each user and project once per
# tenancy version, so a fleet of a few thousand users loads them all in its first minutes.
_USER = (
    select(
        User.id,
        User.username,
        User.role,
        User.status,
        User.domain_id,
        Domain.name,
        Domain.is_active,
        Domain.total_resource_slots,
        Keypair.id,
        Keypair.access_key,
        Keypair.is_active,
        Keypair.rate_limit,
        _Policy.name,
        _Policy.total_resource_slots,
        _Policy.default_for_unspecified,
        _Policy.max_concurrent_sessions,
        _Policy.max_pending_sessions,
        _Policy.max_session_lifetime,
    )
    .join(Domain, User.domain_id == Domain.id)
    # User.main_keypair: the active main one (the database allows one at most).
    .outerjoin(
        Keypair, and_(Keypair.user_id == User.id, Keypair.is_main.is_(True), Keypair.is_active.is_(True))
    )
    .outerjoin(_Policy, Keypair.resource_policy_id == _Policy.id)
    .where(User.username == bindparam("username"))
    .order_by(Keypair.id)
    .limit(1)
)
_USER_PROJECTS = select(ProjectMember.project_id).where(ProjectMember.user_id == bindparam("user_id"))
_PROJECT = (
    select(
        Project.id,
        Project.name,
        Project.domain_id,
        Domain.name,
        Project.is_active,
        Project.total_resource_slots,
    )
    .join(Domain, Project.domain_id == Domain.id)
    .where(Domain.name == bindparam("domain"), Project.name == bindparam("name"))
)


def user(db: Session, version: int, username: str) -> UserSnap | None:
    def load(db: Session) -> UserSnap | None:
        # Core statements (two), not ORM objects: this is what a first admission of a user waits on.
        conn = db.connection()
        row = conn.execute(_USER, {"username": username}).first()
        if row is None:
            return None
        (uid, name, role, status, domain_id, domain, domain_active, domain_slots, kp_id, access_key) = row[
            :10
        ]
        kp_active, rate_limit, policy, policy_slots, unspecified, concurrent, pending, lifetime = row[10:]
        main = None
        if kp_id is not None:
            main = KeypairSnap(
                id=kp_id,
                access_key=access_key,
                user_id=uid,
                is_active=bool(kp_active),
                rate_limit=rate_limit,
                policy=PolicySnap(
                    name=policy,
                    slots=ResourceSlots.parse(policy_slots),
                    unlimited_unspecified=unspecified == "UNLIMITED",
                    max_concurrent_sessions=concurrent,
                    max_pending_sessions=pending,
                    max_session_lifetime=lifetime,
                ),
            )
        return UserSnap(
            id=uid,
            username=name,
            role=role,
            is_active=status == UserStatus.active.value,
            domain_id=domain_id,
            domain=domain,
            domain_active=bool(domain_active),
            domain_slots=ResourceSlots.parse(domain_slots),
            project_ids=frozenset(conn.execute(_USER_PROJECTS, {"user_id": uid}).scalars()),
            main_keypair=main,
        )

    return _cache.get(db, version, ("user", username), load)  # type: ignore[no-any-return]


def project(db: Session, version: int, domain: str, name: str) -> ProjectSnap | None:
    def load(db: Session) -> ProjectSnap | None:
        row = db.connection().execute(_PROJECT, {"domain": domain, "name": name}).first()
        if row is None:
            return None
        pid, pname, did, dname, active, slots = row
        return ProjectSnap(
            id=pid,
            name=pname,
            domain_id=did,
            domain=dname,
            is_active=bool(active),
            slots=ResourceSlots.parse(slots),
        )

    return _cache.get(db, version, ("project", domain, name), load)  # type: ignore[no-any-return]


def keypair(db: Session, version: int, access_key: str) -> KeypairSnap | None:
    def load(db: Session) -> KeypairSnap | None:
        kp = db.scalar(
            select(Keypair)
            .where(Keypair.access_key == access_key)
            .options(selectinload(Keypair.resource_policy))
        )
        return _keypair_snap(kp) if kp is not None else None

    return _cache.get(db, version, ("keypair", access_key), load)


def cached(db: Session, version: int, key: tuple, load):
    """Any other value read from tenancy (a resource group, an image) under the same counter."""
    return _cache.get(db, version, key, load)


def stats() -> dict[str, int]:
    return {"hits": _cache.hits, "misses": _cache.misses}
