"""Listing users: who may see whom, as one SQL query, one page at a time.

The WHERE clause is ``authz.can_read_user`` (superadmins, monitors, the Hub and the CLI see every
user; a domain admin their domain's users; anyone else themselves), so a page and its total are
counted in the database; the page's users come with what ``directory.user_view`` reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Select, or_, select
from sqlalchemy.orm import Session, joinedload, selectinload

from labfleet.core.authz import ROLES, Actor
from labfleet.core.models import Domain, Project, User
from labfleet.core.pages import Page, contains_text, page_of
from labfleet.core.validate import check_choice
from labfleet.tenancy.directory import readable_domain

# What user_view reads: the domain, the projects (and their domains), the resource policy.
VIEW_LOADS = (
    joinedload(User.domain),
    joinedload(User.resource_policy),
    selectinload(User.projects).joinedload(Project.domain),
)


USER_STATUSES = ("active", "inactive")


@dataclass(frozen=True)
class UserFilter:
    """What a list of users narrows to: a ``search`` whose every word is found (case-insensitive)
    in the name, full name or e-mail; one ``role``; one ``status``."""

    search: str = ""
    role: str | None = None
    status: str | None = None

    @classmethod
    def parse(cls, search: str | None, role: str | None, status: str | None) -> UserFilter:
        """From query arguments (None: absent); InvalidInput for an unknown role or status."""
        return cls(
            search=(search or "").strip(),
            role=None if role is None else check_choice(role, "role", ROLES),
            status=None if status is None else check_choice(status, "status", USER_STATUSES),
        )


def _narrowed(q: Select, wanted: UserFilter) -> Select:
    for word in wanted.search.split()[:20]:  # a bounded number of words: each is one condition
        q = q.where(or_(*(contains_text(c, word) for c in (User.username, User.full_name, User.email))))
    if wanted.role is not None:
        q = q.where(User.role == wanted.role)
    if wanted.status is not None:
        q = q.where(User.status == wanted.status)
    return q


def users_query(
    db: Session, actor: Actor, domain: str | None = None, wanted: UserFilter | None = None
) -> Select:
    """The users ``actor`` may read (of ``domain``, which must be readable: else *not found*),
    narrowed to ``wanted``, by name."""
    q = select(User) if wanted is None else _narrowed(select(User), wanted)
    if domain is not None:
        d = readable_domain(db, actor, domain)
        q = q.where(User.domain_id == d.id)
    if not actor.reads_everything:
        own = User.username == actor.name
        if actor.role == "admin" and actor.domain is not None:
            mine = select(Domain.id).where(Domain.name == actor.domain).scalar_subquery()
            q = q.where(or_(User.domain_id == mine, own))
        else:
            q = q.where(own)
    return q.order_by(User.username, User.id)


def page_users(
    db: Session,
    actor: Actor,
    domain: str | None,
    *,
    offset: int,
    limit: int,
    wanted: UserFilter | None = None,
) -> Page[User]:
    """One page of the users ``actor`` may read (narrowed to ``wanted``), ready for ``user_view``."""
    return page_of(db, users_query(db, actor, domain, wanted), offset, limit, options=VIEW_LOADS)


def all_users(db: Session, actor: Actor, domain: str | None = None) -> list[User]:
    return list(db.scalars(users_query(db, actor, domain).options(*VIEW_LOADS)).unique())
