"""Database engine, sessions and migrations for labfleet's own DB.

SQLite by default, PostgreSQL by URL.  The schema is owned by Alembic: ``upgrade()``
brings any database (empty or older) to the current revision.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
import time
import urllib.parse
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, CursorResult, Engine, create_engine, event, exc, inspect
from sqlalchemy.orm import Session, sessionmaker

from labfleet.core.dburl import default_db_url, normalize_url

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def _sqlite_pragmas(dbapi_conn, _record, checkpointed: bool = False) -> None:
    # Let SQLAlchemy's "begin" event (below) open transactions, as BEGIN IMMEDIATE.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    # Several processes (Hub, service, CLI) open the file: wait for locks instead of failing.
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA journal_mode=WAL")
    # Under WAL, NORMAL syncs the log at checkpoints, not at every commit: the file stays consistent
    # after any crash, and a commit survives the process dying; only the last commits before a power
    # loss or an OS crash may be lost (SQLite's own advice for WAL). An admission's commit then
    # costs the writes of its pages (about 0.13 ms here) instead of those and an fsync (0.4 ms).
    # LABFLEET_SQLITE_SYNCHRONOUS=FULL syncs every commit.
    cur.execute(f"PRAGMA synchronous={sqlite_synchronous()}")
    if checkpointed:
        # The process's checkpointer (below) copies the log into the file off the request path; a
        # connection checkpoints by itself only past this safety net, should the checkpointer lag.
        cur.execute(f"PRAGMA wal_autocheckpoint={WAL_SAFETY_NET_PAGES}")
    cur.close()


SQLITE_SYNCHRONOUS_ENV = "LABFLEET_SQLITE_SYNCHRONOUS"


def sqlite_synchronous() -> str:
    """SQLite's ``synchronous`` setting for labfleet's connections: ``NORMAL`` unless
    ``$LABFLEET_SQLITE_SYNCHRONOUS`` says ``FULL`` (or ``EXTRA``)."""
    wanted = os.environ.get(SQLITE_SYNCHRONOUS_ENV, "NORMAL").strip().upper()
    if wanted not in ("NORMAL", "FULL", "EXTRA"):
        raise ValueError(f"{SQLITE_SYNCHRONOUS_ENV} must be NORMAL, FULL or EXTRA, not {wanted!r:.40}")
    return wanted


def _sqlite_begin_immediate(conn) -> None:
    # Take the write lock at the start of every transaction, so that a read-check-write
    # (an admission: read free capacity, then allocate) can never interleave with another
    # writer's; PostgreSQL gets the same guarantee from SELECT ... FOR UPDATE.
    conn.exec_driver_sql("BEGIN IMMEDIATE")


# ---------------------------------------------------------------- WAL checkpoints off the request path

# SQLite's own default: a checkpoint once the log holds 1,000 pages (4 MB).
CHECKPOINT_AT_BYTES = 1000 * 4096
WAL_SAFETY_NET_PAGES = 10_000  # about 40 MB: the checkpointer keeps the log far below it
CHECKPOINT_INTERVAL_S = 0.2


class _Checkpointer:
    """One daemon thread per process that checkpoints the write-ahead log of every SQLite file
    an engine of this process uses, once the log passes :data:`CHECKPOINT_AT_BYTES`.

    With SQLite's automatic checkpoint, the commit that crosses the threshold copies the log into
    the file and syncs both (5 ms and more on this machine, one commit in about fifty at 1,000
    admissions/s); here a thread of its own does that while requests go on.  PASSIVE: it never
    waits for, nor blocks, readers and writers (what it cannot copy now it copies next time).
    The thread keeps one connection per file, forgets files whose engines are gone, and ends
    when there are none left; it starts again with the next engine."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._engines: weakref.WeakKeyDictionary[Engine, str] = weakref.WeakKeyDictionary()
        self._thread: threading.Thread | None = None
        self._conns: dict[str, sqlite3.Connection] = {}
        self._orphans: list[sqlite3.Connection] = []  # a forked child must not close its parent's

    def add(self, engine: Engine) -> bool:
        """Checkpoint ``engine``'s file from now on; False (nothing done) for an in-memory or URI
        database, left to SQLite's own checkpoints."""
        path = engine.url.database
        if not path or path == ":memory:" or path.startswith("file:") or engine.url.query:
            return False
        with self._lock:
            self._engines[engine] = os.path.abspath(path)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="labfleet-wal-checkpoint", daemon=True)
                self._thread.start()
        return True

    def _run(self) -> None:
        while True:
            time.sleep(CHECKPOINT_INTERVAL_S)
            with self._lock:
                paths = set(self._engines.values())
                if not paths:
                    self._thread = None
            for gone in set(self._conns) - paths:
                self._conns.pop(gone).close()
            if not paths:
                return
            for path in paths:
                try:
                    self._checkpoint(path)
                except (OSError, sqlite3.Error):
                    bad = self._conns.pop(path, None)  # e.g. the file was removed: try afresh later
                    if bad is not None:
                        bad.close()

    def _checkpoint(self, path: str) -> None:
        try:
            if os.stat(path + "-wal").st_size < CHECKPOINT_AT_BYTES:
                return
        except FileNotFoundError:
            return
        conn = self._conns.get(path)
        if conn is None:
            uri = "file:" + urllib.parse.quote(path) + "?mode=rw"  # never creates a database
            conn = self._conns[path] = sqlite3.connect(uri, uri=True, isolation_level=None)
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._thread = None
        self._orphans.extend(self._conns.values())
        self._conns = {}


_checkpointer = _Checkpointer()
os.register_at_fork(after_in_child=_checkpointer.after_fork_in_child)


def make_engine(url: str | None = None, **kwargs) -> Engine:
    url = normalize_url(url or default_db_url())
    if url.startswith("sqlite"):
        kwargs.setdefault("connect_args", {"check_same_thread": False})
        engine = create_engine(url, **kwargs)
        checkpointed = _checkpointer.add(engine)
        event.listen(engine, "connect", functools.partial(_sqlite_pragmas, checkpointed=checkpointed))
        event.listen(engine, "begin", _sqlite_begin_immediate)
    else:
        engine = create_engine(url, **kwargs)
        if "pool_pre_ping" not in kwargs:  # asked for explicitly: SQLAlchemy's, at every checkout
            _ping_when_idle(engine)
    return engine


# A pooled connection used this recently is taken as alive; one idle longer is pinged first.
PING_AFTER_IDLE_S = 5.0
_LAST_USED = "labfleet.last_used"


def _ping_when_idle(engine: Engine) -> None:
    """Ping a pooled connection before use only if it sat idle for :data:`PING_AFTER_IDLE_S`.

    SQLAlchemy's ``pool_pre_ping`` pings at every checkout: a round trip to the server per
    transaction (about 0.1-0.2 ms here, where an admission's whole transaction takes 2).  A
    connection that did work a moment ago is almost surely alive; if the server went away in
    that moment, the statement fails with a disconnect error, SQLAlchemy drops every pooled
    connection, and the next transaction connects afresh: one failed request per server
    restart, not one per pooled connection."""

    def stamp(dbapi_conn: Any, record: Any, *_: Any) -> None:
        record.info[_LAST_USED] = time.monotonic()

    def checkout(dbapi_conn: Any, record: Any, proxy: Any) -> None:
        last = record.info.get(_LAST_USED)
        if last is not None and time.monotonic() - last < PING_AFTER_IDLE_S:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_conn)
        except Exception as e:  # the driver's own error type: any of them means "not usable"
            raise exc.DisconnectionError(f"the pooled connection did not answer a ping: {e}") from e
        if not alive:
            raise exc.DisconnectionError("the pooled connection did not answer a ping")

    event.listen(engine, "connect", stamp)
    event.listen(engine, "checkin", stamp)
    event.listen(engine, "checkout", checkout)


# ---------------------------------------------------------------- prepared statements for hot paths

_MISSING: Any = object()


class Prepared:
    """A Core statement compiled once per dialect and run as driver SQL (``exec_driver_sql``).

    ``Connection.execute`` spends more time around a small statement than SQLite spends in it
    (measured in an admission: 30 to 70 µs of cache key, compiled-cache lookup and execution
    context per statement, against 10 to 50 µs in SQLite).  A hot path that runs the same few
    statements every time compiles each one once; its parameters still go through the columns'
    type processors (JSON, datetimes) and the engine's events still see the statement (statement
    counters, logging).  The result is the driver's (no result processing): use it for
    statements that return numbers and strings.

    ``keys``: for an INSERT, the column keys its parameters name (each execution names them all).
    """

    def __init__(self, statement: Any, keys: Iterable[str] = ()) -> None:
        self.statement = statement
        self.keys = tuple(keys)
        self._by_dialect: weakref.WeakKeyDictionary[Any, tuple[str, bool, tuple[Any, ...]]] = (
            weakref.WeakKeyDictionary()
        )
        self._last: tuple[Any, tuple[str, bool, tuple[Any, ...]]] | None = None

    def _compiled(self, dialect: Any) -> tuple[str, bool, tuple[Any, ...]]:
        last = self._last
        if last is not None and last[0] is dialect:
            return last[1]  # the usual case: one engine (a weak dictionary's look-up costs more)
        got = self._by_dialect.get(dialect)
        if got is None:
            compiled = self.statement.compile(dialect=dialect, column_keys=list(self.keys) or None)
            positional = bool(compiled.positional)
            names = compiled.positiontup if positional else dict.fromkeys(compiled.bind_names.values())
            binds = []
            for name in names or ():
                bind = compiled.binds[name]
                default = _MISSING if bind.required else bind.effective_value
                binds.append((name, default, bind.type.dialect_impl(dialect).bind_processor(dialect)))
            got = self._by_dialect[dialect] = (compiled.string, positional, tuple(binds))
        self._last = (dialect, got)
        return got

    def execute(self, conn: Connection, params: Mapping[str, Any] | None = None) -> CursorResult[Any]:
        """Run it once with ``params`` (every required parameter named)."""
        sql, positional, binds = self._compiled(conn.dialect)
        return conn.exec_driver_sql(sql, self._args(positional, binds, params or {}))

    def execute_many(self, conn: Connection, rows: Iterable[Mapping[str, Any]]) -> CursorResult[Any]:
        """Run it once per row (the driver's executemany)."""
        sql, positional, binds = self._compiled(conn.dialect)
        return conn.exec_driver_sql(sql, [self._args(positional, binds, p) for p in rows])

    @staticmethod
    def _args(positional: bool, binds: tuple[Any, ...], params: Mapping[str, Any]) -> Any:
        values = []
        for name, default, process in binds:
            value = params.get(name, default)
            if value is _MISSING:
                raise KeyError(f"no value for parameter {name!r}")
            values.append(process(value) if process is not None else value)
        if positional:
            return tuple(values)
        return {name: value for (name, _, _), value in zip(binds, values, strict=True)}


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A unit of work: commit on success, roll back on any error."""
    db = factory()
    try:
        yield db
        db.commit()
    except BaseException:
        db.rollback()
        raise
    finally:
        db.close()


def alembic_config(engine: Engine):
    from alembic.config import Config  # imported late: the CLI's --help need not pay for it

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Create or upgrade the schema to ``revision``."""
    from alembic import command

    cfg = alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def is_initialized(engine: Engine) -> bool:
    return inspect(engine).has_table("alembic_version")
