"""Migrations: upgrade from empty on SQLite and on a real PostgreSQL server, and the
migrations match the models (no autogenerate diff)."""

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import func, inspect, select
from sqlalchemy.exc import IntegrityError

from labfleet.core import database, unitofwork
from labfleet.core.authz import Actor
from labfleet.core.models import Base, Keypair
from labfleet.tenancy import directory
from labfleet.tenancy.policies import ensure_default_keypair_policy
from tests.postgres_server import fresh_database

TABLES = {
    "domains",
    "projects",
    "users",
    "project_members",
    "keypairs",
    "keypair_resource_policies",
    "user_resource_policies",
    "project_resource_policies",
    "audit_log",
    "alembic_version",
    "resource_groups",
    "resource_group_grants",
    "nodes",
    "devices",
    "sessions",
    "allocations",
    "images",
    "storage_hosts",
    "vfolders",
    "vfolder_permissions",
    "vfolder_invitations",
    "vfolder_uploads",
    "vfolder_mounts",
    "usage_ledger",
    "state_versions",
    "serving_usage",
}


def _check_upgrade(url, monkeypatch, tmp_path):
    monkeypatch.setenv("LABFLEET_SECRET_KEY_FILE", str(tmp_path / "key"))
    from labfleet.core.secretbox import ensure_key_file

    ensure_key_file(tmp_path / "key")
    engine = database.make_engine(url)
    assert not database.is_initialized(engine)
    database.upgrade(engine)
    assert TABLES <= set(inspect(engine).get_table_names())
    database.upgrade(engine)  # a second upgrade is a no-op
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == [], f"models and migrations differ: {diff}"
    # The schema works: write a tenant and read it back; one main keypair per user is enforced.
    factory = unitofwork.make_session_factory(engine)
    with database.session_scope(factory) as db:
        ensure_default_keypair_policy(db)
        directory.create_domain(
            db, Actor.cli(), {"name": "acme", "total_resource_slots": {"gpu.shares": 0.3}}
        )
        directory.create_user(db, Actor.cli(), {"username": "ann", "domain": "acme"})
    with database.session_scope(factory) as db:
        d = directory.get_domain(db, "acme")
        assert d.slots["gpu.shares"] == d.slots.parse({"gpu.shares": "0.1"}).get_amount("gpu.shares") * 3
        main = db.scalars(select(Keypair)).one()
        assert main.is_main
    with pytest.raises(IntegrityError):
        with database.session_scope(factory) as db:
            user = directory.get_user(db, "ann")
            policy = user.keypairs[0].resource_policy
            second = Keypair(access_key="A" * 20, secret_key_encrypted="x", user=user, resource_policy=policy)
            second.is_main, second.is_active = True, True
            db.add(second)
    engine.dispose()


def test_upgrade_sqlite(tmp_path, monkeypatch):
    _check_upgrade(f"sqlite:///{tmp_path / 'lf.sqlite'}", monkeypatch, tmp_path)


@pytest.mark.postgres
def test_upgrade_postgres(postgres_url, tmp_path, monkeypatch):
    _check_upgrade(fresh_database(postgres_url, "migrations_test"), monkeypatch, tmp_path)


def test_upgrade_to_0006_builds_the_ledger_from_the_live_sessions(tmp_path):
    """A database at 0005 with sessions (live and ended) gets a ledger that equals them."""
    from sqlalchemy import insert

    from labfleet.core import usage_ledger
    from labfleet.core.models import (
        ComputeSession,
        Domain,
        KeypairResourcePolicy,
        Project,
        ResourceGroup,
        UsageLedger,
        User,
    )

    engine = database.make_engine(f"sqlite:///{tmp_path / 'old.sqlite'}")
    database.upgrade(engine, "0005")
    with engine.begin() as conn:  # plain inserts: the ORM's flush hooks need tables 0006 makes
        conn.execute(insert(Domain.__table__), {"id": 1, "name": "acme"})
        conn.execute(insert(Project.__table__), {"id": 1, "domain_id": 1, "name": "ml"})
        conn.execute(insert(User.__table__), {"id": 1, "username": "ann", "domain_id": 1})
        conn.execute(insert(KeypairResourcePolicy.__table__), {"id": 1, "name": "default"})
        conn.execute(
            insert(Keypair.__table__),
            {
                "id": 1,
                "access_key": "A" * 20,
                "secret_key_encrypted": "x",
                "user_id": 1,
                "resource_policy_id": 1,
            },
        )
        conn.execute(insert(ResourceGroup.__table__), {"id": 1, "name": "default"})
        for i, (status, slots) in enumerate(
            (
                ("RUNNING", {"cpu": "2", "gpu": "1"}),
                ("PENDING", {"gpu.shares:A100": "0.5"}),
                ("TERMINATED", {"cpu": "64"}),
            )
        ):
            conn.execute(
                insert(ComputeSession.__table__),
                {
                    "id": f"s{i}",
                    "user_id": 1,
                    "keypair_id": 1,
                    "project_id": 1,
                    "domain_id": 1,
                    "resource_group_id": 1,
                    "requested_slots": slots,
                    "status": status,
                },
            )
    database.upgrade(engine)
    factory = unitofwork.make_session_factory(engine)
    with database.session_scope(factory) as db:
        assert usage_ledger.drift(db) == []
        rows = usage_ledger.read(db, [("domain", 1)])[("domain", 1)]
        assert rows == {
            "cpu": 2000,
            "gpu": 1,
            "gpu.shares": 100,  # the whole device counts as a share
            "gpu.shares:A100": 50,
            "gpu.shares:*": 50,
            "@sessions": 2,
            "@pending": 1,
        }
        assert db.scalar(select(func.count()).select_from(UsageLedger)) == 5 * len(rows)
    engine.dispose()
