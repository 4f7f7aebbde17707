"""Listing users: who may see whom, as one SQL query, one page at a time.

The WHERE clause is ``authz.can_read_user`` (superadmins, monitors, the Hub and the CLI see every
user; a domain admin their domain's users; anyone else themselves), so a page and its total are
counted in the database; the page's users come with what ``directory.user_view`` reads.
"""

from __future__ import annotations

from sqlalchemy import Select, or_, select
from sqlalchemy.orm import Session, joinedload, selectinload

from hub_ext.core.authz import Actor
from hub_ext.core.models import Domain, Project, User
from hub_ext.core.pages import Page, page_of
from hub_ext.tenancy.directory import readable_domain

# What user_view reads: the domain, the projects (and their domains), the resource policy.
VIEW_LOADS = (
    joinedload(User.domain),
    joinedload(User.resource_policy),
    selectinload(User.projects).joinedload(Project.domain),
)


def users_query(db: Session, actor: Actor, domain: str | None = None) -> Select:
    """The users ``actor`` may read (of ``domain``, which must be readable: else *not found*),
    by name."""
    q = select(User)
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


def page_users(db: Session, actor: Actor, domain: str | None, *, offset: int, limit: int) -> Page[User]:
    """One page of the users ``actor`` may read, ready for ``user_view``."""
    return page_of(db, users_query(db, actor, domain), offset, limit, options=VIEW_LOADS)


def all_users(db: Session, actor: Actor, domain: str | None = None) -> list[User]:
    return list(db.scalars(users_query(db, actor, domain).options(*VIEW_LOADS)).unique())
