"""The DB-backed scheduler on SQLite and on a real PostgreSQL server: admit, queue,
release, quotas, and 200 concurrent admissions racing for one device; reconciling with the Hub's
servers; sessions started through the API (checked, holding nothing, then admitted by the spawner)."""

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
from sqlalchemy import func, select

from labfleet.compute import nodes, reconcile, sessions
from labfleet.compute.devices.base import NodeInfo
from labfleet.compute.devices.mock import MockPlugin
from labfleet.core import database
from labfleet.core.authz import Actor
from labfleet.core.errors import LabfleetError
from labfleet.core.models import Allocation, AuditEntry, ComputeSession
from labfleet.reclaim import reclaimer
from labfleet.service import jobs
from labfleet.tenancy import directory, keypairs, policies
from labfleet.tenancy.policies import ensure_default_keypair_policy
from tests.dbfixture import fresh_db
from tests.postgres_server import fresh_database

CLI = Actor.cli()


def _world(url, tmp_path, monkeypatch, gpus=1, project_cap=None):
    pool = {"pool_size": 40, "max_overflow": 10} if "postgresql" in url else {}
    engine, factory = fresh_db(url, tmp_path, monkeypatch, **pool)
    with database.session_scope(factory) as db:
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
    try:
        with database.session_scope(factory) as db:
            s = sessions.admit(db, CLI, {"project": "acme/ml", "username": user, "slots": slots})
            return s.id, s.status
    except sessions.Refused as e:  # rolled back: its audit entry goes in a unit of its own
        with database.session_scope(factory) as db:
            sessions.record_refusal(db, e)
        raise


def _held_centi(factory):
    with database.session_scope(factory) as db:
        return db.scalar(select(func.coalesce(func.sum(Allocation.shares_centi), 0)))


def test_admit_release_and_queue(world):
    a, status_a = _admit(world, **{"gpu.shares": 0.5, "cpu": 2})
    b, status_b = _admit(world, "bob", **{"gpu.shares": 0.5})
    c, status_c = _admit(world, **{"gpu.shares": 0.25})
    assert (status_a, status_b, status_c) == ("SCHEDULED", "SCHEDULED", "PENDING")
    assert _held_centi(world) == 100
    with database.session_scope(world) as db:
        view = sessions.session_view(db.get(ComputeSession, a))
        assert view["devices"][0]["shares"] == 0.5 and view["node"] == "n1"
        assert sessions.position_of(db, db.get(ComputeSession, c)) == 1
    # Stopping a returns its slots at once, and the queue is served: c is scheduled.
    with database.session_scope(world) as db:
        sessions.terminate(db, CLI, a)
    with database.session_scope(world) as db:
        assert db.get(ComputeSession, a).status == "TERMINATED"
        assert db.get(ComputeSession, c).status == "SCHEDULED"
        hist = [h["status"] for h in db.get(ComputeSession, c).status_history]
        assert hist == ["PENDING", "SCHEDULED"]
    assert _held_centi(world) == 75


def test_request_that_can_never_fit_is_refused(world):
    with pytest.raises(LabfleetError) as e:
        _admit(world, gpu=2)
    assert e.value.status == 409 and "could ever hold" in e.value.message
    with database.session_scope(world) as db:
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


def test_a_refusal_is_audited_and_holds_nothing(world):
    """The refused admission's transaction rolls back (its ledger charge with it), and the refusal's
    audit entry is written in a transaction of its own."""
    from labfleet.core import usage_ledger

    with database.session_scope(world) as db:
        alice = directory.get_user(db, "alice")
        alice.main_keypair.resource_policy.max_concurrent_sessions = 1
    assert _admit(world, cpu=1)[1] == "SCHEDULED"
    with database.session_scope(world) as db:
        before = usage_ledger.stored(db)
    with pytest.raises(sessions.Refused) as e:
        _admit(world, cpu=2)
    assert e.value.code == "too-many-sessions"
    with database.session_scope(world) as db:
        assert usage_ledger.stored(db) == before and usage_ledger.drift(db) == []
        assert db.scalar(select(func.count()).select_from(ComputeSession)) == 1
        (entry,) = db.scalars(select(AuditEntry).where(AuditEntry.action == "session.refuse"))
        assert entry.target == "alice" and not entry.success
        assert entry.details["code"] == "too-many-sessions" and entry.details["project"] == "acme/ml"


def test_pending_timeout_cancels(tmp_path, monkeypatch):
    engine, factory = _world(f"sqlite:///{tmp_path / 't.sqlite'}", tmp_path, monkeypatch)
    with database.session_scope(factory) as db:
        nodes.update_group(db, CLI, "default", {"pending_timeout": 1})
    _admit(factory, gpu=1)
    waiting, status = _admit(factory, **{"gpu.shares": 0.5})
    assert status == "PENDING"
    with database.session_scope(factory) as db:
        s = db.get(ComputeSession, waiting)
        s.created_at = s.created_at.replace(year=s.created_at.year - 1)
    with database.session_scope(factory) as db:
        sessions.schedule_group(db, nodes.get_group(db, CLI, "default"))
    with database.session_scope(factory) as db:
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
    with database.session_scope(world) as db:
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
    from labfleet.core import usage_ledger  # the usage ledger equals its recomputation from the sessions

    with database.session_scope(world) as db:
        assert usage_ledger.drift(db) == []


# ---------------------------------------------------------------- the service's clock (service/jobs.py)


def test_serve_queues_fires_a_pending_timeout_with_no_other_event(tmp_path, monkeypatch):
    engine, factory = _world(f"sqlite:///{tmp_path / 'j.sqlite'}", tmp_path, monkeypatch)
    with database.session_scope(factory) as db:
        nodes.update_group(db, CLI, "default", {"pending_timeout": 1})
    _admit(factory, gpu=1)
    waiting, status = _admit(factory, gpu=1)
    assert status == "PENDING"
    assert jobs.serve_queues(factory, logging.getLogger("test")) == []  # not timed out yet
    with database.session_scope(factory) as db:
        assert db.get(ComputeSession, waiting).status == "PENDING"
        s = db.get(ComputeSession, waiting)
        s.created_at = s.created_at.replace(year=s.created_at.year - 1)
    jobs.serve_queues(factory, logging.getLogger("test"))
    with database.session_scope(factory) as db:
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
    with database.session_scope(factory) as db:
        devs = MockPlugin(devices=[{"model": "A100-80GB", "memory": "80g", "count": 1}], node="n2").discover()
        nodes.register_node(
            db, NodeInfo(name="n2", cpu=64, mem=512 * 2**30, devices=devs, plugin="mock", reason=None)
        )
        assert db.get(ComputeSession, waiting).status == "PENDING"  # nothing served it yet
    assert jobs.serve_queues(factory, logging.getLogger("test")) == [waiting]
    with database.session_scope(factory) as db:
        assert sessions.session_view(db.get(ComputeSession, waiting))["node"] == "n2"
    engine.dispose()


async def test_the_lifetime_rule_audits_before_it_asks_the_hub_and_keeps_its_reason(tmp_path, monkeypatch):
    engine, factory = _world(f"sqlite:///{tmp_path / 'l.sqlite'}", tmp_path, monkeypatch)
    with database.session_scope(factory) as db:
        policies.update_policy(db, CLI, "keypair", "default", {"max_session_lifetime": 10})
    sid, _ = _admit(factory, **{"gpu.shares": 0.5})
    for status in ("PREPARING", "RUNNING"):
        with database.session_scope(factory) as db:
            sessions.update_status(db, Actor.hub(), sid, {"status": status})
    seen = []

    async def stop_server(user, server):
        # The Hub stops the server and the spawner releases it before this call returns: the audit
        # entry must already be there.
        with database.session_scope(factory) as db:
            seen.append(
                [
                    e.target
                    for e in db.scalars(select(AuditEntry).where(AuditEntry.action == "session.lifetime"))
                ]
            )
            sessions.update_status(db, Actor.hub(), sid, {"status": "TERMINATED", "reason": "stopped"})
        return True

    log = logging.getLogger("test")
    settings = reclaimer.Settings()
    assert await reclaimer.reclaim(factory, stop_server, settings, log) == []  # not expired yet
    later = datetime.now(timezone.utc) + timedelta(seconds=11)
    done = await reclaimer.reclaim(factory, stop_server, settings, log, now=later)
    assert [d.subject.id for d in done] == [sid] and done[0].judgment.reason == "lifetime"
    with factory() as db:
        ended = db.get(ComputeSession, sid)
        # The spawner's report of the stop keeps the reason the service gave
        assert ended.status == "TERMINATED" and ended.status_reason.startswith("lifetime: ran ")
    assert seen == [[sid]]
    engine.dispose()


# ---------------------------------------------------------------- reconciling with the Hub (service/jobs.py)


class FakeHub:
    """The Hub's servers as HubSync reads them: the list, and each user again before a release."""

    def __init__(self, servers, again=None):
        self.listed = servers  # None: the Hub could not be read
        self.again = again if again is not None else {}
        self.asked = []

    async def servers(self):
        return None if self.listed is None else dict(self.listed)

    async def user_servers(self, user):
        self.asked.append(user)
        if user in self.again:
            return self.again[user]
        return {name: state for (u, name), state in (self.listed or {}).items() if u == user}


def _admit_server(factory, server, user="alice", **slots):
    with database.session_scope(factory) as db:
        s = sessions.admit(
            db, Actor.hub(), {"project": "acme/ml", "username": user, "name": server, "slots": slots}
        )
        return s.id


def _statuses(factory):
    with database.session_scope(factory) as db:
        return {s.id: s.status for s in db.scalars(select(ComputeSession))}


async def test_reconcile_follows_the_hub_and_releases_after_the_grace_period(world):
    log = logging.getLogger("test")
    ready = _admit_server(world, "ready", **{"gpu.shares": 0.25})
    starting = _admit_server(world, "starting", **{"gpu.shares": 0.25})
    gone = _admit_server(world, "gone", **{"gpu.shares": 0.25})
    moved = _admit_server(world, "moved", user="bob", **{"gpu.shares": 0.25})
    assert _held_centi(world) == 100
    # bob's server was missed by the list (paging): asked again, it is there.
    hub = FakeHub(
        {("alice", "ready"): "ready", ("alice", "starting"): "spawn"}, again={"bob": {"moved": "ready"}}
    )
    fixes = await jobs.reconcile_sessions(world, hub, log)
    assert {f.session_id: f.status for f in fixes} == {ready: "RUNNING", starting: "PREPARING"}
    assert _statuses(world)[gone] == "SCHEDULED"  # within the grace period: kept
    later = datetime.now(timezone.utc) + timedelta(seconds=121)
    fixes = await jobs.reconcile_sessions(world, hub, log, now=later)
    assert {f.session_id: f.status for f in fixes} == {gone: "TERMINATED", moved: "RUNNING"}
    assert sorted(hub.asked) == ["alice", "bob"]
    statuses = _statuses(world)
    assert (statuses[ready], statuses[starting], statuses[gone], statuses[moved]) == (
        "RUNNING",
        "PREPARING",
        "TERMINATED",
        "RUNNING",
    )
    assert _held_centi(world) == 75
    with database.session_scope(world) as db:
        entries = list(db.scalars(select(AuditEntry).where(AuditEntry.action == "session.reconcile")))
        gone_entry = next(e for e in entries if e.target == gone)
        assert (
            gone_entry.details["to"] == "TERMINATED"
            and "no server alice/gone" in gone_entry.details["reason"]
        )
        assert len(entries) == 4
        s = db.get(ComputeSession, gone)
        assert s.allocations == [] and "the Hub has no server alice/gone" in s.status_reason
    # Nothing more to do.
    assert await jobs.reconcile_sessions(world, hub, log, now=later) == []


async def test_reconcile_changes_nothing_when_the_hub_cannot_tell(world):
    log = logging.getLogger("test")
    sid = _admit_server(world, "a", **{"gpu.shares": 0.5})
    later = datetime.now(timezone.utc) + timedelta(days=1)
    assert await jobs.reconcile_sessions(world, FakeHub(None), log, now=later) is None
    # The list says nothing of alice and the Hub cannot be asked about her again: she keeps it.
    assert await jobs.reconcile_sessions(world, FakeHub({}, again={"alice": None}), log, now=later) == []
    assert _statuses(world)[sid] == "SCHEDULED" and _held_centi(world) == 50


async def test_a_hub_server_running_no_live_session_is_stopped_after_the_grace_period(world):
    """A session ended in labfleet while its server ran on: the server holds what nobody accounts
    for, so reconciling stops it (once it has been an orphan for the grace period), and audits it."""
    log = logging.getLogger("test")
    kept = _admit_server(world, "kept", **{"gpu.shares": 0.5})
    hub = FakeHub({("alice", "kept"): "ready", ("alice", "stray"): "ready"})
    stopped = []

    async def stop_server(user, server):
        stopped.append((user, server))
        return True

    watch = reconcile.OrphanWatch()
    now = datetime.now(timezone.utc)
    await jobs.reconcile_sessions(world, hub, log, now=now, stop_orphans=(stop_server, watch))
    assert stopped == []  # just seen: its session may have ended a moment ago, its stop on the way
    later = now + timedelta(seconds=121)
    await jobs.reconcile_sessions(world, hub, log, now=later, stop_orphans=(stop_server, watch))
    assert stopped == [("alice", "stray")]  # never the server of a live session
    assert _statuses(world)[kept] == "RUNNING"
    with database.session_scope(world) as db:
        (entry,) = db.scalars(select(AuditEntry).where(AuditEntry.action == "server.stop_orphan"))
        assert entry.target == "alice/stray" and entry.success and entry.details["user"] == "alice"


async def test_a_release_by_reconcile_serves_the_queue(world):
    log = logging.getLogger("test")
    gone = _admit_server(world, "gone", gpu=1)
    waiting = _admit_server(world, "waiting", user="bob", gpu=1)
    assert _statuses(world)[waiting] == "PENDING"
    later = datetime.now(timezone.utc) + timedelta(seconds=200)
    hub = FakeHub({("bob", "waiting"): "spawn"})
    fixes = await jobs.reconcile_sessions(world, hub, log, now=later)
    assert [(f.session_id, f.status) for f in fixes] == [(gone, "TERMINATED")]
    assert _statuses(world)[waiting] == "SCHEDULED"


# ---------------------------------------------------------------- sessions started through the API


def _alice(db, keypair=None):
    user = directory.get_user(db, "alice")
    actor = directory.actor_for(user)
    return replace(actor, keypair=keypair) if keypair else actor


def test_an_api_session_is_checked_as_admission_would_and_holds_nothing(world):
    with database.session_scope(world) as db:
        launch = sessions.prepare_launch(
            db,
            _alice(db),
            {
                "project": "ml",
                "slots": {"cpu": 2, "mem": "8g", "gpu.shares": 0.5},
                "type": "batch",
                "command": "python train.py",
                "vfolders": [],
            },
        )
        db.rollback()
    assert launch.username == "alice" and launch.server.startswith("api-") and len(launch.server) == 12
    assert launch.user_options == {
        "project": "ml",
        "type": "batch",
        "cpu": "2",
        "mem": 8 * 2**30,
        "gpu": "0.5",
        "command": "python train.py",
    }
    assert launch.keypair is None
    with database.session_scope(world) as db:
        assert db.scalar(select(func.count()).select_from(ComputeSession)) == 0
    assert _held_centi(world) == 0
    for body, status, words in [
        ({"project": "ml", "slots": {"gpu": 2}}, 409, "could ever hold"),
        ({"project": "ml", "slots": {"gpu.shares": 1.5}}, 400, ""),
        ({"project": "ml", "type": "batch"}, 400, "needs a command"),
        ({"project": "ml", "command": "ls"}, 400, "takes no command"),
        ({"project": "ml", "name": "../x"}, 400, "not a server name"),
        ({"project": "ml", "username": "bob"}, 403, "only for yourself"),
        ({"project": "nope"}, 403, "not a member"),
    ]:
        with pytest.raises(LabfleetError) as e, database.session_scope(world) as db:
            sessions.prepare_launch(db, _alice(db), body)
        assert e.value.status == status and words in e.value.message, (body, e.value.message)
    # A live session on the server named is a conflict.
    _admit_server(world, "work", **{"gpu.shares": 0.5})
    with pytest.raises(LabfleetError) as e, database.session_scope(world) as db:
        sessions.prepare_launch(db, _alice(db), {"project": "ml", "name": "work"})
    assert e.value.status == 409 and "server 'work'" in e.value.message


def test_the_spawners_admission_of_an_api_session_takes_its_slots_and_keypair(world):
    with database.session_scope(world) as db:
        alice = directory.get_user(db, "alice")
        kp, _ = keypairs.new_keypair(db, alice, alice.main_keypair.resource_policy)
        access_key = kp.access_key
    with database.session_scope(world) as db:
        body = {"project": "acme/ml", "name": "m", "slots": {"gpu.shares:A100-80GB": 0.5}}
        launch = sessions.prepare_launch(db, _alice(db, access_key), body)
        db.rollback()
    assert launch.keypair == access_key and launch.user_options["gpu"] == "0.5"
    # What the spawner sends, from those options (its own slot names).
    spawner_body = {
        "project": "acme/ml",
        "username": "alice",
        "name": "m",
        "type": "interactive",
        "slots": {"gpu.shares": "0.5"},
    }
    assert launch.matches(spawner_body)
    assert not launch.matches({**spawner_body, "name": "other"})
    with database.session_scope(world) as db:
        s = sessions.admit(db, Actor.hub(), spawner_body, launch=launch)
        assert s.keypair.access_key == access_key and s.requested_slots == {"gpu.shares:A100-80GB": "0.5"}
        assert s.gpu_models == [] and s.status == "SCHEDULED"


def test_grants_set_again_with_the_same_entries_are_kept(tmp_path, monkeypatch):
    # Found by the fuzzer: a PATCH repeating an existing grant hit the UNIQUE constraint (500).
    engine, factory = _world(f"sqlite:///{tmp_path / 'g.sqlite'}", tmp_path, monkeypatch)
    with database.session_scope(factory) as db:
        nodes.create_group(db, CLI, {"name": "a100", "grants": [{"kind": "domain", "target": "acme"}]})
    for grants in (
        [{"kind": "domain", "target": "acme"}],
        [{"kind": "domain", "target": "acme"}, {"kind": "user", "target": "bob"}],
        [{"kind": "user", "target": "bob"}],
    ):
        with database.session_scope(factory) as db:
            nodes.update_group(db, CLI, "a100", {"grants": grants})
        with database.session_scope(factory) as db:
            got = {(g.kind, g.target) for g in nodes.get_group(db, CLI, "a100").grants}
            assert got == {(g["kind"], g["target"]) for g in grants}
    engine.dispose()
