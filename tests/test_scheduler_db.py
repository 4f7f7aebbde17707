"""The DB-backed scheduler on SQLite and on a real PostgreSQL server: admit, queue,
release, quotas, and 200 concurrent admissions racing for one device."""

import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
from sqlalchemy import func, select

from hub_ext.compute import nodes, sessions
from hub_ext.compute.devices.base import NodeInfo
from hub_ext.compute.devices.mock import MockPlugin
from hub_ext.core import db as lfdb
from hub_ext.core.authz import Actor
from hub_ext.core.errors import LabfleetError
from hub_ext.core.models import Allocation, AuditEntry, ComputeSession
from hub_ext.core.secretbox import ensure_key_file
from hub_ext.service import jobs
from hub_ext.tenancy import directory, policies
from hub_ext.tenancy.policies import ensure_default_keypair_policy
from tests.postgres_server import fresh_database

CLI = Actor.cli()


def _world(url, tmp_path, monkeypatch, gpus=1, project_cap=None):
    monkeypatch.setenv("LABFLEET_SECRET_KEY_FILE", str(tmp_path / "key"))
    ensure_key_file(tmp_path / "key")
    engine = (
        lfdb.make_engine(url, pool_size=40, max_overflow=10) if "postgresql" in url else lfdb.make_engine(url)
    )
    lfdb.upgrade(engine)
    factory = lfdb.make_session_factory(engine)
    with lfdb.session_scope(factory) as db:
        ensure_default_keypair_policy(db)
        nodes.ensure_default_group(db)
        directory.create_domain(db, CLI, {"name": "acme"})
        directory.create_project(
            db, CLI, {"domain": "acme", "name": "ml", "total_resource_slots": project_cap or {}}
        )
        directory.create_user(db, CLI, {"username": "alice", "domain": "acme", "projects": ["ml"]})
        directory.create_user(db, CLI, {"username": "bob", "domain": "acme", "projects": ["ml"]})
        devs = MockPlugin(
            devices=[{"model": "A100-80GB", "memory": "80g", "count": gpus}], node="n1"
        ).discover()
        nodes.register_node(
            db, NodeInfo(name="n1", cpu=64, mem=512 * 2**30, devices=devs, plugin="mock", reason=None)
        )
    return engine, factory


@pytest.fixture(params=["sqlite", "postgres"])
def world(request, tmp_path, monkeypatch):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'lf.sqlite'}"
    else:
        url = fresh_database(
            request.getfixturevalue("postgres_url"),
            "sched_" + request.node.name[-12:].strip("[]-").replace("-", "_").lower(),
        )
    engine, factory = _world(url, tmp_path, monkeypatch)
    yield factory
    engine.dispose()


def _admit(factory, user="alice", **slots):
    with lfdb.session_scope(factory) as db:
        s = sessions.admit(db, CLI, {"project": "acme/ml", "username": user, "slots": slots})
        return s.id, s.status


def _held_centi(factory):
    with lfdb.session_scope(factory) as db:
        return db.scalar(select(func.coalesce(func.sum(Allocation.shares_centi), 0)))


def test_admit_release_and_queue(world):
    a, status_a = _admit(world, **{"gpu.shares": 0.5, "cpu": 2})
    b, status_b = _admit(world, "bob", **{"gpu.shares": 0.5})
    c, status_c = _admit(world, **{"gpu.shares": 0.25})
    assert (status_a, status_b, status_c) == ("SCHEDULED", "SCHEDULED", "PENDING")
    assert _held_centi(world) == 100
    with lfdb.session_scope(world) as db:
        view = sessions.session_view(db.get(ComputeSession, a))
        assert view["devices"][0]["shares"] == 0.5 and view["node"] == "n1"
        assert sessions.position_of(db, db.get(ComputeSession, c)) == 1
    # Stopping a returns its slots at once, and the queue is served: c is scheduled.
    with lfdb.session_scope(world) as db:
        sessions.terminate(db, CLI, a)
    with lfdb.session_scope(world) as db:
        assert db.get(ComputeSession, a).status == "TERMINATED"
        assert db.get(ComputeSession, c).status == "SCHEDULED"
        hist = [h["status"] for h in db.get(ComputeSession, c).status_history]
        assert hist == ["PENDING", "PENDING", "SCHEDULED"]
    assert _held_centi(world) == 75


def test_request_that_can_never_fit_is_refused(world):
    with pytest.raises(LabfleetError) as e:
        _admit(world, gpu=2)
    assert e.value.status == 409 and "could ever hold" in e.value.message
    with lfdb.session_scope(world) as db:
        assert db.scalar(select(func.count()).select_from(ComputeSession)) == 0


def test_project_quota_refusal_has_a_clear_reason(tmp_path, monkeypatch):
    engine, factory = _world(
        f"sqlite:///{tmp_path / 'q.sqlite'}", tmp_path, monkeypatch, gpus=4, project_cap={"gpu.shares": 2}
    )
    assert _admit(factory, gpu=1)[1] == "SCHEDULED"
    assert _admit(factory, **{"gpu.shares": 0.75})[1] == "SCHEDULED"
    with pytest.raises(LabfleetError) as e:
        _admit(factory, **{"gpu.shares": 0.5})
    assert "acme/ml" in e.value.message and "2.25" in e.value.message and "2" in e.value.message
    # Exact decimals: 0.1 + 0.15 fits what is left (0.25) exactly.
    assert _admit(factory, **{"gpu.shares": 0.1})[1] == "SCHEDULED"
    assert _admit(factory, **{"gpu.shares": 0.15})[1] == "SCHEDULED"
    engine.dispose()


def test_pending_timeout_cancels(tmp_path, monkeypatch):
    engine, factory = _world(f"sqlite:///{tmp_path / 't.sqlite'}", tmp_path, monkeypatch)
    with lfdb.session_scope(factory) as db:
        nodes.update_group(db, CLI, "default", {"pending_timeout": 1})
    _admit(factory, gpu=1)
    waiting, status = _admit(factory, **{"gpu.shares": 0.5})
    assert status == "PENDING"
    with lfdb.session_scope(factory) as db:
        s = db.get(ComputeSession, waiting)
        s.created_at = s.created_at.replace(year=s.created_at.year - 1)
    with lfdb.session_scope(factory) as db:
        sessions.schedule_group(db, nodes.get_group(db, CLI, "default"))
    with lfdb.session_scope(factory) as db:
        s = db.get(ComputeSession, waiting)
        assert s.status == "CANCELLED" and "pending timeout" in s.status_reason
    engine.dispose()


def test_200_concurrent_admissions_for_10_shares(world):
    """200 requests of 0.1 of the one device, at once: exactly 10 are scheduled."""

    def one(_):
        return _admit(world, **{"gpu.shares": 0.1})[1]

    with ThreadPoolExecutor(max_workers=32) as pool:
        statuses = list(pool.map(one, range(200)))
    assert statuses.count("SCHEDULED") == 10
    assert statuses.count("PENDING") == 190
    assert _held_centi(world) == 100
    with lfdb.session_scope(world) as db:
        per_device = db.execute(
            select(Allocation.device_id, func.sum(Allocation.shares_centi)).group_by(Allocation.device_id)
        ).all()
        assert all(total <= 100 for _, total in per_device)
        assert (
            db.scalar(
                select(func.count()).select_from(ComputeSession).where(ComputeSession.status == "SCHEDULED")
            )
            == 10
        )
    assert Decimal(_held_centi(world)) / 100 == 1


# ---------------------------------------------------------------- the service's clock (service/jobs.py)


def test_serve_queues_fires_a_pending_timeout_with_no_other_event(tmp_path, monkeypatch):
    engine, factory = _world(f"sqlite:///{tmp_path / 'j.sqlite'}", tmp_path, monkeypatch)
    with lfdb.session_scope(factory) as db:
        nodes.update_group(db, CLI, "default", {"pending_timeout": 1})
    _admit(factory, gpu=1)
    waiting, status = _admit(factory, gpu=1)
    assert status == "PENDING"
    assert jobs.serve_queues(factory, logging.getLogger("test")) == []  # not timed out yet
    with lfdb.session_scope(factory) as db:
        assert db.get(ComputeSession, waiting).status == "PENDING"
        s = db.get(ComputeSession, waiting)
        s.created_at = s.created_at.replace(year=s.created_at.year - 1)
    jobs.serve_queues(factory, logging.getLogger("test"))
    with lfdb.session_scope(factory) as db:
        s = db.get(ComputeSession, waiting)
        assert s.status == "CANCELLED" and "pending timeout of 1s" in s.status_reason
        assert sessions.groups_with_queue(db) == []
    engine.dispose()


def test_serve_queues_starts_a_queued_session_when_a_node_joins(tmp_path, monkeypatch):
    engine, factory = _world(f"sqlite:///{tmp_path / 'n.sqlite'}", tmp_path, monkeypatch)
    _admit(factory, gpu=1)
    waiting, status = _admit(factory, "bob", gpu=1)
    assert status == "PENDING"
    # A second node registers outside any request (as `labfleet agent` or the CLI would).
    with lfdb.session_scope(factory) as db:
        devs = MockPlugin(devices=[{"model": "A100-80GB", "memory": "80g", "count": 1}], node="n2").discover()
        nodes.register_node(
            db, NodeInfo(name="n2", cpu=64, mem=512 * 2**30, devices=devs, plugin="mock", reason=None)
        )
        assert db.get(ComputeSession, waiting).status == "PENDING"  # nothing served it yet
    assert jobs.serve_queues(factory, logging.getLogger("test")) == [waiting]
    with lfdb.session_scope(factory) as db:
        assert sessions.session_view(db.get(ComputeSession, waiting))["node"] == "n2"
    engine.dispose()


async def test_the_lifetime_job_audits_before_it_asks_the_hub(tmp_path, monkeypatch):
    engine, factory = _world(f"sqlite:///{tmp_path / 'l.sqlite'}", tmp_path, monkeypatch)
    with lfdb.session_scope(factory) as db:
        policies.update_policy(db, CLI, "keypair", "default", {"max_session_lifetime": 10})
    sid, _ = _admit(factory, **{"gpu.shares": 0.5})
    for status in ("PREPARING", "RUNNING"):
        with lfdb.session_scope(factory) as db:
            sessions.update_status(db, Actor.hub(), sid, {"status": status})
    seen = []

    async def stop_server(user, server):
        # The Hub stops the server and the spawner releases it before this call returns: the audit
        # entry must already be there.
        with lfdb.session_scope(factory) as db:
            seen.append(
                [
                    e.target
                    for e in db.scalars(select(AuditEntry).where(AuditEntry.action == "session.lifetime"))
                ]
            )
            sessions.update_status(db, Actor.hub(), sid, {"status": "TERMINATED", "reason": "stopped"})
        return True

    log = logging.getLogger("test")
    assert await jobs.stop_expired_sessions(factory, stop_server, log) == []  # not expired yet
    later = datetime.now(timezone.utc) + timedelta(seconds=11)
    assert await jobs.stop_expired_sessions(factory, stop_server, log, now=later) == [sid]
    assert seen == [[sid]]
    engine.dispose()
