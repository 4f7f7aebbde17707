"""Listing compute sessions: who may see which, as one SQL query, one page at a time.

The WHERE clause is the rule of ``authz.can_read_user`` applied to a session's user and domain
(the Hub, the CLI, superadmins and monitors see every session; a domain admin their domain's
sessions and their own; anyone else their own), so a page and its total are counted in the
database and never filtered afterwards.  The page's rows come with everything
``sessions.session_view`` reads, loaded in a few statements whatever the page's size.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from sqlalchemy import Select, false, or_, select
from sqlalchemy.orm import Session, joinedload, selectinload
from sqlalchemy.orm.attributes import set_committed_value

from labfleet.core.authz import Actor
from labfleet.core.models import Allocation, ComputeSession, Domain, Project, User, VFolder, VFolderMount
from labfleet.core.pages import Page, page_of
from labfleet.core.vocab import HOLDING_STATUSES

# What session_view reads: user, project and its domain, domain, resource group, node,
# allocations and their devices, mounts and their folders (and the folder's host: mount_view).
VIEW_LOADS = (
    joinedload(ComputeSession.user),
    joinedload(ComputeSession.project).joinedload(Project.domain),
    joinedload(ComputeSession.domain),
    joinedload(ComputeSession.resource_group),
    joinedload(ComputeSession.node),
    selectinload(ComputeSession.allocations).joinedload(Allocation.device),
    selectinload(ComputeSession.mounts).joinedload(VFolderMount.vfolder).joinedload(VFolder.host),
)


def _domain_id(name: str):
    return select(Domain.id).where(Domain.name == name).scalar_subquery()


def readable_where(actor: Actor):
    """The sessions ``actor`` may read, as a WHERE clause (None: all of them)."""
    if actor.kind in ("hub", "cli") or actor.reads_everything:
        return None
    if actor.user_id is not None:
        own = ComputeSession.user_id == actor.user_id
    else:  # an actor made by hand: the same rule by name
        own = ComputeSession.user_id.in_(select(User.id).where(User.username == actor.name))
    if actor.role == "admin" and actor.domain is not None:
        return or_(ComputeSession.domain_id == _domain_id(actor.domain), own)
    return own


def sessions_query(actor: Actor, filters: Mapping[str, str | None]) -> Select:
    """The sessions ``actor`` may read that match ``filters`` (user, project "domain/name", domain,
    status; empty or missing: no filter), oldest first."""
    q = select(ComputeSession)
    where = readable_where(actor)
    if where is not None:
        q = q.where(where)
    if filters.get("status"):
        q = q.where(ComputeSession.status == filters["status"])
    if filters.get("user"):
        q = q.where(ComputeSession.user_id.in_(select(User.id).where(User.username == filters["user"])))
    if filters.get("domain"):
        q = q.where(ComputeSession.domain_id == _domain_id(str(filters["domain"])))
    project = filters.get("project")
    if project:
        dname, slash, pname = project.partition("/")
        if not slash:
            q = q.where(false())  # a project is always named domain/name
        else:
            q = q.where(
                ComputeSession.project_id.in_(
                    select(Project.id).join(Domain).where(Domain.name == dname, Project.name == pname)
                )
            )
    return q.order_by(ComputeSession.created_at, ComputeSession.id)


# The page's own query: the many-to-one relations joined in.  Allocations and mounts come after,
# by hand (see _load_collections): most sessions of a long list have ended and hold nothing, and
# SQLAlchemy's selectin loaders cost more to set up than the rows they bring.
PAGE_LOADS = VIEW_LOADS[:5]


def _load_collections(db: Session, page: list[ComputeSession]) -> None:
    """Fill each session's allocations (only holding sessions have any) and mounts, in at most
    two statements, without lazy loads afterwards."""
    if not page:
        return
    holding = [s.id for s in page if s.status in HOLDING_STATUSES]
    allocs: dict[str, list[Allocation]] = defaultdict(list)
    if holding:
        q = (
            select(Allocation)
            .where(Allocation.session_id.in_(holding))
            .options(joinedload(Allocation.device))
        )
        for a in db.scalars(q):
            allocs[a.session_id].append(a)
    mounts: dict[str, list[VFolderMount]] = defaultdict(list)
    q = (
        select(VFolderMount)
        .where(VFolderMount.session_id.in_([s.id for s in page]))
        .options(joinedload(VFolderMount.vfolder).joinedload(VFolder.host))
    )
    for m in db.scalars(q):
        mounts[m.session_id].append(m)
    for s in page:
        set_committed_value(s, "allocations", allocs.get(s.id, []))
        set_committed_value(s, "mounts", mounts.get(s.id, []))


def page_sessions(
    db: Session, actor: Actor, filters: Mapping[str, str | None], *, offset: int, limit: int
) -> Page[ComputeSession]:
    """One page of the sessions ``actor`` may read, ready for ``session_view``."""
    page = page_of(db, sessions_query(actor, filters), offset, limit, options=PAGE_LOADS)
    _load_collections(db, page.items)
    return page


def all_sessions(db: Session, actor: Actor, filters: Mapping[str, str | None]) -> list[ComputeSession]:
    """Every session ``actor`` may read that matches ``filters`` (the CLI, the queue view)."""
    return list(db.scalars(sessions_query(actor, filters).options(*VIEW_LOADS)).unique())


def readable_ids(db: Session, actor: Actor, filters: Mapping[str, str | None]) -> set[str]:
    """The ids of the sessions ``actor`` may read that match ``filters``."""
    return set(db.scalars(sessions_query(actor, filters).with_only_columns(ComputeSession.id)))
