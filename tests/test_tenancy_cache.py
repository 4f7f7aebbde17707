"""The per-process tenancy cache behind admission (labfleet.tenancy.snapshot) never misses a change.

Two engines on one database stand for two processes (the cache is per engine): one admits
sessions (the service), the other changes tenancy (the CLI, an admin through another service).
On SQLite and on a real PostgreSQL server.
"""

import pytest
from sqlalchemy import event, select

from labfleet.compute import sessions
from labfleet.core import database, unitofwork, versions
from labfleet.core.authz import Actor
from labfleet.core.errors import LabfleetError
from labfleet.core.models import Keypair, StateVersion
from labfleet.tenancy import directory, snapshot
from tests.postgres_server import fresh_database
from tests.test_scheduler_db import _world

CLI = Actor.cli()


@pytest.fixture(params=["sqlite", "postgres"])
def two_processes(request, tmp_path, monkeypatch):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'lf.sqlite'}"
    else:
        url = fresh_database(
            request.getfixturevalue("postgres_url"),
            "tcache_" + request.node.name[-12:].strip("[]-").replace("-", "_").lower(),
        )
    engine, service = _world(url, tmp_path, monkeypatch, gpus=4)
    other_engine = database.make_engine(url)
    yield service, unitofwork.make_session_factory(other_engine)
    other_engine.dispose()
    engine.dispose()


def _admit(factory, user="alice", **slots):
    with database.session_scope(factory) as db:
        return sessions.admit(db, CLI, {"project": "acme/ml", "username": user, "slots": slots}).status


def _version(factory):
    with database.session_scope(factory) as db:
        return db.scalar(select(StateVersion.version).where(StateVersion.name == versions.TENANCY))


def test_a_change_made_elsewhere_is_seen_by_the_next_admission(two_processes):
    service, other = two_processes
    assert _admit(service, cpu=1) == "SCHEDULED"  # the service has cached alice, acme/ml, the group
    with database.session_scope(other) as db:  # a domain cap lowered by another process
        directory.update_domain(db, CLI, "acme", {"total_resource_slots": {"cpu": 1}})
    with pytest.raises(sessions.Refused) as e:
        _admit(service, cpu=1)
    assert e.value.code == "domain-quota-exceeded"
    with database.session_scope(other) as db:  # bob leaves the project
        directory.update_domain(db, CLI, "acme", {"total_resource_slots": {}})
        directory.update_user(db, CLI, "bob", {"projects": []})
    with pytest.raises(LabfleetError, match="not a member"):
        _admit(service, "bob", cpu=1)
    with database.session_scope(other) as db:  # alice's main keypair policy: one session at a time
        alice = directory.get_user(db, "alice")
        policy = alice.main_keypair.resource_policy
        policy.max_concurrent_sessions = 1
    with pytest.raises(sessions.Refused) as e:
        _admit(service, cpu=1)
    assert e.value.code == "too-many-sessions"
    with database.session_scope(other) as db:  # alice deactivated
        directory.update_user(db, CLI, "alice", {"status": "inactive"})
    with pytest.raises(LabfleetError, match="no active user"):
        _admit(service, cpu=1)


def test_what_a_rolled_back_transaction_read_is_never_cached(two_processes):
    service, other = two_processes
    _admit(service, cpu=1)
    # In the service's process: a transaction creates carol and admits her, then rolls back.
    with pytest.raises(RuntimeError):
        with database.session_scope(service) as db:
            directory.create_user(db, CLI, {"username": "carol", "domain": "acme", "projects": ["ml"]})
            assert sessions.admit(db, CLI, {"project": "acme/ml", "username": "carol"}).status == "SCHEDULED"
            raise RuntimeError("roll back")
    # Another process makes carol for real, in no project: the same version number the
    # rolled-back transaction had, with other contents.
    with database.session_scope(other) as db:
        directory.create_user(db, CLI, {"username": "carol", "domain": "acme"})
    with pytest.raises(LabfleetError, match="not a member"):
        _admit(service, "carol")


def test_volatile_columns_do_not_bump_the_version(two_processes):
    service, other = two_processes
    before = _version(service)
    with database.session_scope(other) as db:
        kp = db.scalar(select(Keypair).limit(1))
        kp.last_used = kp.created_at  # what every signed request does
    assert _version(service) == before
    with database.session_scope(other) as db:
        directory.update_project(db, CLI, "acme", "ml", {"description": "changed"})
    assert _version(service) == before + 1


def test_admissions_read_tenancy_from_the_cache(two_processes):
    service, _ = two_processes
    _admit(service, cpu=1)
    engine = service.kw["bind"]
    seen = []

    def statement(conn, cursor, sql, *rest):
        seen.append(sql)

    event.listen(engine, "before_cursor_execute", statement)
    try:
        hits = snapshot.stats()["hits"]
        _admit(service, cpu=1)
    finally:
        event.remove(engine, "before_cursor_execute", statement)
    assert snapshot.stats()["hits"] > hits
    assert not any(" FROM users" in sql or " FROM projects" in sql for sql in seen), seen


def test_the_me_view_follows_tenancy_and_the_ledger(two_processes):
    """/api/me's tenancy part is cached by version, its quota read from the ledger every time."""
    from labfleet.compute import quota

    service, other = two_processes
    with database.session_scope(service) as db:
        first = quota.me_view(db, "alice")
    assert first["quota"]["domain"]["used"] == {}
    _admit(service, cpu=2)
    with database.session_scope(other) as db:
        directory.update_domain(db, CLI, "acme", {"total_resource_slots": {"cpu": 8}})
        directory.update_user(db, CLI, "alice", {"full_name": "Alice A."})
    with database.session_scope(service) as db:
        now = quota.me_view(db, "alice")
        assert quota.me_view(db, "nobody") is None
    assert now["full_name"] == "Alice A."
    assert now["quota"]["domain"] == {
        "limit": {"cpu": 8},
        "used": {"cpu": 2},
        "left": {"cpu": 6},
        "unspecified": "UNLIMITED",
    }
    assert now["quota"]["projects"]["acme/ml"]["used"] == {"cpu": 2}
