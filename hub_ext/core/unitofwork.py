"""labfleet's unit of work: the session class every labfleet session factory makes, and its hooks.

Every SQLAlchemy event hook labfleet has is listed in :data:`HOOKS`, here, and registered on
:class:`LabfleetSession` alone: not on SQLAlchemy's ``Session``, which other code in the same
process shares (JupyterHub's ORM, MLflow), and not by importing some module for its side effect.
A session from :func:`make_session_factory` always carries them; a plain ``Session`` carries none.

The hooks keep what every writer must keep, whoever it is (the service, the CLI, a test):

- the state version counters (:mod:`labfleet.core.versions`), which tell caches they are stale;
- each resource group's ``alloc_version`` (:mod:`labfleet.core.allocversions`), which tells the
  schedulers' cached placement states they are stale;
- the usage ledger's part in deletions (:mod:`labfleet.core.usage_ledger`).

A context above ``core`` that keeps something per transaction (the cluster cache) joins the
transaction as a :class:`Participant` (:func:`participant`): it hears how the transaction ended
through the three outcome hooks here, without a hook of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast

from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, sessionmaker

from labfleet.core import allocversions, usage_ledger, versions


class LabfleetSession(Session):
    """A session of labfleet's DB; the hooks in :data:`HOOKS` are registered on this class."""


class Participant(Protocol):
    """Something kept per transaction that must learn how the transaction ended."""

    def committed(self) -> None:
        """The outermost transaction committed: what it changed is real."""

    def rolled_back(self) -> None:
        """A savepoint inside the transaction rolled back; the transaction goes on."""

    def ended(self) -> None:
        """The outermost transaction is over: committed (after :meth:`committed`), rolled back or
        closed. The participant is dropped; the next transaction makes a new one."""


_PARTICIPANTS = "labfleet.participants"
P = TypeVar("P", bound=Participant)


def participant(db: Session, key: str, make: Callable[[], P]) -> P:
    """This transaction's participant ``key``, made by ``make()`` on first use."""
    joined: dict[str, Any] = db.info.setdefault(_PARTICIPANTS, {})
    found = joined.get(key)
    if found is None:
        found = joined[key] = make()
    return found


def _participants_committed(session: Session) -> None:
    # Savepoints fire after_commit too; only the outermost commit makes the changes real.
    if session.get_nested_transaction() is not None:
        return
    for p in session.info.get(_PARTICIPANTS, {}).values():
        p.committed()


def _participants_rolled_back(session: Session, previous_transaction: Any) -> None:
    for p in session.info.get(_PARTICIPANTS, {}).values():
        p.rolled_back()


def _participants_ended(session: Session, transaction: Any) -> None:
    if transaction.parent is not None or transaction.nested:
        return
    for p in session.info.pop(_PARTICIPANTS, {}).values():
        p.ended()


# Every hook, in the order SQLAlchemy calls those of one event.  The before_flush hooks write with
# Core statements only (no ORM object is added or changed), so they do not depend on each other.
HOOKS: tuple[tuple[str, Callable[..., None]], ...] = (
    ("before_flush", versions.bump_changed_kinds),
    ("before_flush", usage_ledger.release_deleted_scopes),
    ("before_flush", allocversions.bump_changed_groups),
    ("after_flush", allocversions.forget_expected),
    ("after_commit", _participants_committed),
    ("after_soft_rollback", _participants_rolled_back),
    ("after_transaction_end", _participants_ended),
    ("after_transaction_end", versions.forget_bumps),
    ("after_transaction_end", allocversions.forget_bumps),
)

for _event_name, _hook in HOOKS:
    event.listen(LabfleetSession, _event_name, _hook)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions of labfleet's DB on ``engine``, with labfleet's hooks (each a :class:`LabfleetSession`)."""
    # Typed as plain Sessions: the subclass adds no API, only the hooks, and code takes a Session.
    return cast(
        "sessionmaker[Session]", sessionmaker(bind=engine, class_=LabfleetSession, expire_on_commit=False)
    )
