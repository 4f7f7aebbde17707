"""Tenancy as admission and authentication read it, cached per process and checked by version.

Users (with their domain, projects and main keypair), projects (with their members) and keypairs
(with their resource policy) as frozen values, loaded once per version of the ``tenancy``
counter (:mod:`hub_ext.core.versions`): any change to tenancy bumps the counter in its own
transaction, and a reader that sees the new number loads afresh, so a change is never missed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, selectinload

from hub_ext.core import versions
from hub_ext.core.models import Domain, Keypair, Project, User
from hub_ext.core.slots import ResourceSlots


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
    return int(db.scalar(select(versions.subquery(versions.TENANCY))) or 0)


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


def user(db: Session, version: int, username: str) -> UserSnap | None:
    def load(db: Session) -> UserSnap | None:
        u = db.scalar(
            select(User)
            .where(User.username == username)
            .options(
                selectinload(User.domain),
                selectinload(User.projects),
                selectinload(User.keypairs).selectinload(Keypair.resource_policy),
            )
        )
        if u is None:
            return None
        main = u.main_keypair
        return UserSnap(
            id=u.id,
            username=u.username,
            role=u.role,
            is_active=u.is_active,
            domain_id=u.domain_id,
            domain=u.domain.name,
            domain_active=u.domain.is_active,
            domain_slots=u.domain.slots,
            project_ids=frozenset(p.id for p in u.projects),
            main_keypair=_keypair_snap(main) if main is not None else None,
        )

    return _cache.get(db, version, ("user", username), load)


def project(db: Session, version: int, domain: str, name: str) -> ProjectSnap | None:
    def load(db: Session) -> ProjectSnap | None:
        row = db.execute(
            select(
                Project.id,
                Project.name,
                Project.domain_id,
                Domain.name,
                Project.is_active,
                Project.total_resource_slots,
                Domain.is_active,
            )
            .join(Domain, Project.domain_id == Domain.id)
            .where(Domain.name == domain, Project.name == name)
        ).first()
        if row is None:
            return None
        pid, pname, did, dname, active, slots, _ = row
        return ProjectSnap(
            id=pid,
            name=pname,
            domain_id=did,
            domain=dname,
            is_active=active,
            slots=ResourceSlots.parse(slots),
        )

    return _cache.get(db, version, ("project", domain, name), load)


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
