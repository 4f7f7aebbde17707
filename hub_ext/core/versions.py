"""State version counters: how a process knows that what it cached is stale.

A row of ``state_versions`` per kind of state (``tenancy``: domains, projects, users,
memberships, keypairs, policies, resource groups and their grants, images, storage hosts;
``folders``: folders and their permissions).  A flush hook (:func:`bump_changed_kinds`) bumps the counter of every kind the
flush changes, in the same transaction, so a reader that sees version ``n`` sees exactly the
state of the transactions up to ``n``.  A cache tags what it read with the version read in the
same transaction and throws it away when the counter moves (see labfleet.tenancy.snapshot).

Columns that change all the time and that no cache reads (a keypair's ``last_used``, a user's
``last_login``, a group's ``alloc_version``, a folder's measured usage) do not bump.

A transaction that bumped a counter sees its own uncommitted state: it must not put what it
reads into a shared cache (:func:`bumped_here`), since it may still roll back.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Engine, inspect, select, update
from sqlalchemy.orm import Session

from labfleet.core.models import (
    Domain,
    Image,
    Keypair,
    KeypairResourcePolicy,
    Project,
    ProjectMember,
    ProjectResourcePolicy,
    ResourceGroup,
    ResourceGroupGrant,
    StateVersion,
    StorageHost,
    User,
    UserResourcePolicy,
    VFolder,
    VFolderPermission,
)

TENANCY = "tenancy"
FOLDERS = "folders"
NAMES = (TENANCY, FOLDERS)

_KINDS: dict[type, str] = {
    Domain: TENANCY,
    Project: TENANCY,
    User: TENANCY,
    ProjectMember: TENANCY,
    Keypair: TENANCY,
    KeypairResourcePolicy: TENANCY,
    UserResourcePolicy: TENANCY,
    ProjectResourcePolicy: TENANCY,
    ResourceGroup: TENANCY,
    ResourceGroupGrant: TENANCY,
    Image: TENANCY,
    StorageHost: TENANCY,
    VFolder: FOLDERS,
    VFolderPermission: FOLDERS,
}
# Columns whose change bumps nothing: volatile, and read by no cache.
_QUIET: dict[type, frozenset[str]] = {
    Keypair: frozenset({"last_used"}),
    User: frozenset({"last_login"}),
    ResourceGroup: frozenset({"alloc_version"}),
    VFolder: frozenset({"usage_bytes", "usage_files", "usage_scanned_at"}),
}
_INFO_KEY = "labfleet.versions.bumped"


def read(db: Session) -> dict[str, int]:
    """Every counter as this transaction sees it."""
    return {name: int(v) for name, v in db.execute(select(StateVersion.name, StateVersion.version))}


_SUBQUERIES: dict[str, Any] = {}
_READS: dict[str, Any] = {}


def subquery(name: str):
    """The counter ``name`` as a scalar subquery (to read it in another statement's RETURNING).

    Built once per name and shared: a statement object that is reused keeps its SQL cache key, so
    the hot paths that read a counter pay neither the construction nor the key again."""
    sub = _SUBQUERIES.get(name)
    if sub is None:
        sub = _SUBQUERIES[name] = (
            select(StateVersion.version).where(StateVersion.name == name).scalar_subquery()
        )
    return sub


def read_statement(name: str):
    """``SELECT (counter name)``, built once per name (see :func:`subquery`)."""
    stmt = _READS.get(name)
    if stmt is None:
        stmt = _READS[name] = select(subquery(name))
    return stmt


def read_on(engine: Engine, name: str) -> int:
    """Counter ``name`` in a short transaction of its own, without an ORM session (a hot path:
    every request checks that what it caches is still current)."""
    with engine.connect() as conn:
        return int(conn.execute(read_statement(name)).scalar() or 0)


def bump(db: Session, names: Iterable[str]) -> None:
    for name in sorted(set(names)):  # one order everywhere: no deadlock between bumpers
        db.execute(
            update(StateVersion)
            .where(StateVersion.name == name)
            .values(version=StateVersion.version + 1)
            .execution_options(synchronize_session=False)
        )
        db.info.setdefault(_INFO_KEY, set()).add(name)


def bumped_here(db: Session, name: str) -> bool:
    """Did this transaction bump ``name``? Then what it reads is not for a shared cache."""
    return name in db.info.get(_INFO_KEY, ())


def _changed(obj: Any) -> bool:
    quiet = _QUIET.get(type(obj), frozenset())
    state = inspect(obj)
    for attr in state.attrs:
        if attr.key in quiet:
            continue
        if attr.history.has_changes():
            return True
    return False


def bump_changed_kinds(session: Session, flush_context: Any, instances: Any) -> None:
    """before_flush (registered in labfleet.core.unitofwork): bump the kinds of state this flush changes."""
    names: set[str] = set()
    for obj in (*session.new, *session.deleted):
        kind = _KINDS.get(type(obj))
        if kind is not None:
            names.add(kind)
    for obj in session.dirty:
        kind = _KINDS.get(type(obj))
        if kind is not None and kind not in names and _changed(obj):
            names.add(kind)
    if names:
        with session.no_autoflush:
            bump(session, names)


def forget_bumps(session: Session, transaction: Any) -> None:
    """after_transaction_end: the next transaction starts with no bumps."""
    if transaction.parent is None and not transaction.nested:
        session.info.pop(_INFO_KEY, None)


# ---------------------------------------------------------------- a cache tagged with a version


class VersionedCache:
    """Values loaded at one version of counter ``name``, per engine; dropped when the counter moves.

    ``get(db, version, key, load)``: ``version`` is the counter as ``db``'s transaction read it
    (before loading anything), ``load(db)`` reads the value in that transaction.  A transaction
    that bumped the counter itself loads without caching; an older version than the cache's
    loads without caching too (it is finishing an older snapshot).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._per_engine: weakref.WeakKeyDictionary[Engine, tuple[int, dict[Any, Any]]] = (
            weakref.WeakKeyDictionary()
        )
        self.hits = 0
        self.misses = 0

    def get(self, db: Session, version: int, key: Any, load: Callable[[Session], Any]) -> Any:
        if bumped_here(db, self.name):
            return load(db)
        engine = engine_of(db)
        with self._lock:
            cached_version, values = self._per_engine.get(engine, (-1, {}))
            if version == cached_version and key in values:
                self.hits += 1
                return values[key]
        value = load(db)
        with self._lock:
            self.misses += 1
            cached_version, values = self._per_engine.get(engine, (-1, {}))
            if version > cached_version:
                self._per_engine[engine] = (version, {key: value})
            elif version == cached_version:
                values[key] = value
        return value

    def peek(self, engine: Engine, version: int, key: Any, default: Any = None) -> Any:
        """The value cached for ``key`` at ``version``, else ``default`` (no I/O, no transaction)."""
        with self._lock:
            cached_version, values = self._per_engine.get(engine, (-1, {}))
            if version == cached_version and key in values:
                self.hits += 1
                return values[key]
        return default

    def latest(self, db: Session) -> int | None:
        with self._lock:
            got = self._per_engine.get(engine_of(db))
        return got[0] if got is not None else None

    def clear(self) -> None:
        with self._lock:
            self._per_engine.clear()


def engine_of(db: Session) -> Engine:
    """The engine behind a session (caches are per engine: two databases never share one)."""
    bind = db.get_bind()
    return bind if isinstance(bind, Engine) else bind.engine
