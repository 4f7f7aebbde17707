"""Migrations: upgrade from empty on SQLite and on a real PostgreSQL server, and the
migrations match the models (no autogenerate diff)."""

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, select
from sqlalchemy.exc import IntegrityError

from hub_ext.core import db as lfdb
from hub_ext.core.authz import Actor
from hub_ext.core.models import Base, Keypair
from hub_ext.tenancy import directory
from hub_ext.tenancy.policies import ensure_default_keypair_policy
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
}


def _check_upgrade(url, monkeypatch, tmp_path):
    monkeypatch.setenv("LABFLEET_SECRET_KEY_FILE", str(tmp_path / "key"))
    from hub_ext.core.secretbox import ensure_key_file

    ensure_key_file(tmp_path / "key")
    engine = lfdb.make_engine(url)
    assert not lfdb.is_initialized(engine)
    lfdb.upgrade(engine)
    assert TABLES <= set(inspect(engine).get_table_names())
    lfdb.upgrade(engine)  # a second upgrade is a no-op
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == [], f"models and migrations differ: {diff}"
    # The schema works: write a tenant and read it back; one main keypair per user is enforced.
    factory = lfdb.make_session_factory(engine)
    with lfdb.session_scope(factory) as db:
        ensure_default_keypair_policy(db)
        directory.create_domain(
            db, Actor.cli(), {"name": "acme", "total_resource_slots": {"gpu.shares": 0.3}}
        )
        directory.create_user(db, Actor.cli(), {"username": "ann", "domain": "acme"})
    with lfdb.session_scope(factory) as db:
        d = directory.get_domain(db, "acme")
        assert d.slots["gpu.shares"] == d.slots.parse({"gpu.shares": "0.1"}).get_amount("gpu.shares") * 3
        main = db.scalars(select(Keypair)).one()
        assert main.is_main
    with pytest.raises(IntegrityError):
        with lfdb.session_scope(factory) as db:
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
