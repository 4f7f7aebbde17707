"""Database engine, sessions and migrations for labfleet's own DB.

SQLite by default, PostgreSQL by URL.  The schema is owned by Alembic: ``upgrade()``
brings any database (empty or older) to the current revision.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.orm import Session, sessionmaker

# Flush hooks every process that writes must have: state versions (caches learn of changes) and
# the usage ledger's part in deletions. Imported here, where every session factory comes from.
from hub_ext.core import ledger as _ledger  # noqa: E402,F401
from hub_ext.core import versions as _versions  # noqa: E402,F401
from hub_ext.core.dburl import default_db_url, normalize_url

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    # Let SQLAlchemy's "begin" event (below) open transactions, as BEGIN IMMEDIATE.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    # Several processes (Hub, service, CLI) open the file: wait for locks instead of failing.
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.close()


def _sqlite_begin_immediate(conn) -> None:
    # Take the write lock at the start of every transaction, so that a read-check-write
    # (an admission: read free capacity, then allocate) can never interleave with another
    # writer's; PostgreSQL gets the same guarantee from SELECT ... FOR UPDATE.
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_engine(url: str | None = None, **kwargs) -> Engine:
    url = normalize_url(url or default_db_url())
    if url.startswith("sqlite"):
        kwargs.setdefault("connect_args", {"check_same_thread": False})
        engine = create_engine(url, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin_immediate)
    else:
        kwargs.setdefault("pool_pre_ping", True)
        engine = create_engine(url, **kwargs)
    return engine


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A unit of work: commit on success, roll back on any error (then write, in a unit of its own,
    what the error says must outlive the rollback: ``LabfleetError.after_rollback``)."""
    db = factory()
    try:
        yield db
        db.commit()
    except BaseException as e:
        db.rollback()
        follow = getattr(e, "after_rollback", None)
        if follow is not None:
            e.after_rollback = None  # once, even if the error passes another scope
            with session_scope(factory) as record:
                follow(record)
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
