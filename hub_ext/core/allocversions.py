"""Each resource group's ``alloc_version``: how a process knows its cached placement state is stale.

Every transaction that changes a group's allocations, nodes or devices bumps the group's
``alloc_version`` (a column of ``resource_groups``) in the same transaction: the scheduler does it
itself (:func:`bump`, before it changes anything), and a flush hook (:func:`bump_changed_groups`)
does it for every other write, including the database's own cascades (a user deleted with its
sessions).  On PostgreSQL the bump's UPDATE takes the group row's lock until commit, the lock
decisions take; on SQLite every transaction holds the write lock.

This is the database's side, which every process that writes needs; the in-process cache of
placement states that reads the version is :mod:`labfleet.compute.clustercache`.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from sqlalchemy import inspect, or_, select, update
from sqlalchemy.orm import Session

from labfleet.core.models import (
    Allocation,
    ComputeSession,
    Device,
    Domain,
    Keypair,
    Node,
    Project,
    ResourceGroup,
    User,
)

_INFO_KEY = "labfleet.allocversions"


class _Bumps:
    """This transaction's bumps, and the rows whose change the scheduler applies to its cache itself."""

    __slots__ = ("groups", "expected")

    def __init__(self) -> None:
        self.groups: set[int] = set()
        self.expected: weakref.WeakSet[Any] = weakref.WeakSet()


def _bumps(db: Session) -> _Bumps:
    found = db.info.get(_INFO_KEY)
    if found is None:
        found = db.info[_INFO_KEY] = _Bumps()
    return found


def version(db: Session, group_id: int) -> int:
    """The group's alloc_version as this transaction sees it (read after the group lock)."""
    return int(db.scalar(select(ResourceGroup.alloc_version).where(ResourceGroup.id == group_id)) or 0)


def bump(db: Session, group_id: int) -> int:
    """Bump the group's alloc_version before changing its allocations, nodes or devices.

    Returns the new version.  On PostgreSQL the UPDATE locks the group's row until commit.
    """
    stmt = (
        update(ResourceGroup)
        .where(ResourceGroup.id == group_id)
        .values(alloc_version=ResourceGroup.alloc_version + 1)
        .returning(ResourceGroup.alloc_version)
        .execution_options(synchronize_session=False)
    )
    new = int(db.execute(stmt).scalar_one())
    _bumps(db).groups.add(group_id)
    return new


def note_bumped(db: Session, group_id: int) -> None:
    """The caller bumped the group in a statement of its own (the scheduler's lock-and-read)."""
    _bumps(db).groups.add(group_id)


def bumped_here(db: Session, group_id: int) -> bool:
    """Did this transaction bump the group? Then what it reads of the group is not yet committed."""
    found = db.info.get(_INFO_KEY)
    return found is not None and group_id in found.groups


def expect(db: Session, rows: Iterable[Any]) -> None:
    """Allocation rows whose change the caller has bumped and applies to the cached cluster itself,
    until they are flushed; the flush hook bumps the group again for any other change."""
    _bumps(db).expected.update(rows)


# ---------------------------------------------------------------- hooks (registered in labfleet.core.unitofwork)


def _node_groups(session: Session, node_ids: set[int]) -> set[int]:
    if not node_ids:
        return set()
    return set(session.scalars(select(Node.resource_group_id).where(Node.id.in_(node_ids))))


def bump_changed_groups(session: Session, flush_context: Any, instances: Any) -> None:
    """before_flush: bump the groups whose allocations, nodes or devices this flush changes.

    Rows the scheduler placed or released itself (:func:`expect`) are skipped; everything else is
    bumped, including node registration (which also bumps first, for the lock) and the database's
    own cascades (a user deleted with its sessions): a cached cluster at the version before is
    then stale.
    """
    groups: set[int] = set()
    node_ids: set[int] = set()
    parents: dict[Any, set[Any]] = defaultdict(set)  # session column -> ids of deleted parents
    found = session.info.get(_INFO_KEY)
    expected = found.expected if found is not None else ()
    for obj in (*session.new, *session.dirty, *session.deleted):
        if obj in expected:
            continue
        if isinstance(obj, Node):
            if obj.resource_group_id is not None:
                groups.add(obj.resource_group_id)
            elif obj.resource_group is not None and obj.resource_group.id is not None:
                groups.add(obj.resource_group.id)
            history = inspect(obj).attrs.resource_group_id.history
            groups.update(g for g in history.deleted if g is not None)
        elif isinstance(obj, (Device, Allocation)):
            if obj.node_id is not None:
                node_ids.add(obj.node_id)
            elif obj.node is not None and obj.node.id is not None:
                node_ids.add(obj.node.id)
    for obj in session.deleted:
        for model, column in (
            (User, ComputeSession.user_id),
            (Project, ComputeSession.project_id),
            (Keypair, ComputeSession.keypair_id),
            (Domain, ComputeSession.domain_id),
            (ComputeSession, ComputeSession.id),
        ):
            if isinstance(obj, model):
                parents[column].add(obj.id)
    if not (groups or node_ids or parents):
        return
    with session.no_autoflush:
        groups |= _node_groups(session, node_ids)
        if parents:
            held = (
                select(ComputeSession.resource_group_id)
                .join(Allocation, Allocation.session_id == ComputeSession.id)
                .where(or_(*(column.in_(ids) for column, ids in parents.items())))
                .distinct()
            )
            groups.update(session.scalars(held))
        for group_id in sorted(groups):  # one order everywhere: no deadlock between bumpers
            bump(session, group_id)


def forget_expected(session: Session, flush_context: Any) -> None:
    """after_flush: what was expected is written now; a later change to the same rows is someone else's."""
    found = session.info.get(_INFO_KEY)
    if found is not None and found.expected:
        for obj in (*session.new, *session.dirty, *session.deleted):
            found.expected.discard(obj)


def forget_bumps(session: Session, transaction: Any) -> None:
    """after_transaction_end: the next transaction starts with no bumps."""
    if transaction.parent is None and not transaction.nested:
        session.info.pop(_INFO_KEY, None)
