"""What ``labfleet init`` and the labfleet service both do before anything else.

Open the DB, bring its schema to the current revision (reporting where it was), and seed the
rows every deployment has: the ``default`` keypair policy and the public ``default`` resource
group. The secret key file is checked here too: a new key must never be made while the DB holds
keypairs sealed with an old one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from labfleet.core import database, secretbox, unitofwork
from labfleet.core.models import Keypair, KeypairResourcePolicy, ResourceGroup
from labfleet.core.vocab import SESSION_TYPES

DEFAULT_GROUP = "default"
# A resource group's answer to a session whose processes hold more of a device's memory than its share
# (labfleet.usage.overuse): auto is kill when another session shares the device, warn when alone.
GPU_OVERUSE_POLICIES = ("auto", "warn", "kill", "stop")


class SecretKeyLost(Exception):
    """The secret key is gone while the DB holds keypairs sealed with it."""


@dataclass
class Database:
    engine: Engine
    session_factory: sessionmaker[Session]
    revision_before: str | None  # None: the DB had no schema
    revision: str | None  # what this code expects (head)

    @property
    def state(self) -> str:
        """One line for people: created, upgraded or already current."""
        if self.revision_before is None:
            return f"created at schema revision {self.revision}"
        if self.revision_before != self.revision:
            return f"upgraded from schema revision {self.revision_before} to {self.revision}"
        return f"already at schema revision {self.revision}"


def schema_revisions(engine: Engine) -> tuple[str | None, str | None]:
    """(revision the database is at or None when it has no schema, revision this code expects)."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(database.alembic_config(engine)).get_current_head()
    if not database.is_initialized(engine):
        return None, head
    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    return current, head


def secret_key_present() -> bool:
    return bool(os.environ.get(secretbox.KEY_ENV)) or secretbox.key_file_path().exists()


def ensure_secret_key(engine: Engine) -> str:
    """Make the key file when there is none and nothing depends on an old one; its path."""
    if not secret_key_present() and database.is_initialized(engine):
        with database.session_scope(unitofwork.make_session_factory(engine)) as db:
            n = db.scalar(select(func.count()).select_from(Keypair))
        if n:
            raise SecretKeyLost(
                f"the secret key is missing ({secretbox.key_file_path()}) but the database holds {n} "
                f"keypair(s) sealed with it: restore the key file or set ${secretbox.KEY_ENV}; "
                "a new key would make them unusable"
            )
    return str(secretbox.ensure_key_file())


def open_database(url: str | None = None, *, upgrade: bool = True) -> Database:
    """An engine on ``url``, its schema brought to head (unless ``upgrade`` is off), defaults seeded."""
    engine = database.make_engine(url)
    before, head = schema_revisions(engine)
    if upgrade:
        database.upgrade(engine)
    factory = unitofwork.make_session_factory(engine)
    with database.session_scope(factory) as db:
        seed_defaults(db)
    return Database(engine, factory, before, head)


def seed_defaults(db: Session) -> None:
    ensure_default_keypair_policy(db)
    ensure_default_group(db)


def ensure_default_keypair_policy(db: Session) -> KeypairResourcePolicy:
    """The policy every new user's main keypair gets: UNLIMITED for slots it does not name,
    so a new user is bounded by their project's and domain's caps until an admin says otherwise."""
    obj = db.scalar(select(KeypairResourcePolicy).where(KeypairResourcePolicy.name == "default"))
    if obj is None:
        obj = KeypairResourcePolicy(
            name="default",
            total_resource_slots={},
            default_for_unspecified="UNLIMITED",
            max_concurrent_sessions=0,
            max_pending_sessions=0,
            max_session_lifetime=0,
            idle_timeout=-1,
            allowed_storage_hosts=[],
        )
        db.add(obj)
        db.flush()
    return obj


# A new group's queue wait, in seconds (admins change it per group): finite, so a request nothing can
# hold soon ends with its reason rather than a progress bar that never moves.
DEFAULT_PENDING_TIMEOUT = 600


def new_group(name: str, description: str = "", *, is_public: bool = False) -> ResourceGroup:
    """A group with the defaults: fifo queue, fgd placement, every session type, a queued session
    cancelled after ``DEFAULT_PENDING_TIMEOUT``."""
    return ResourceGroup(
        name=name,
        description=description,
        is_public=is_public,
        scheduler="fifo",
        placement="fgd",
        allowed_session_types=list(SESSION_TYPES),
        pending_timeout=DEFAULT_PENDING_TIMEOUT,
        gpu_overuse="auto",
    )


def ensure_default_group(db: Session) -> ResourceGroup:
    group = db.scalar(select(ResourceGroup).where(ResourceGroup.name == DEFAULT_GROUP))
    if group is None:
        group = new_group(
            DEFAULT_GROUP, "The Hub host and the nodes nobody assigned elsewhere", is_public=True
        )
        db.add(group)
        db.flush()
    return group
