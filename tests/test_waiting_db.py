"""Numbers that tell the truth, on a real SQLite DB: what one session could get now beside the quota
(launch options), why a queued session waits (its view), and what a request not yet sent would do
(preview: starts, waits or refused, changing nothing)."""

import pytest
from sqlalchemy import func, select

from labfleet.compute import nodes, sessions, waiting
from labfleet.compute.devices.base import NodeInfo
from labfleet.compute.devices.mock import MockPlugin
from labfleet.compute.launchoptions import launch_options
from labfleet.core import capacity, database
from labfleet.core.authz import Actor
from labfleet.core.errors import LabfleetError
from labfleet.core.models import AuditEntry, ComputeSession
from labfleet.tenancy import directory
from labfleet.tenancy.policies import ensure_default_keypair_policy
from tests.dbfixture import fresh_db

CLI = Actor.cli()
GIB = 2**30


def _world(tmp_path, monkeypatch):
    engine, factory = fresh_db(f"sqlite:///{tmp_path / 'lf.sqlite'}", tmp_path, monkeypatch)
    with database.session_scope(factory) as db:
        ensure_default_keypair_policy(db)
        group = nodes.ensure_default_group(db)
        group.pending_timeout = 600
        directory.create_domain(db, CLI, {"name": "acme"})
        directory.create_project(db, CLI, {"domain": "acme", "name": "ml", "total_resource_slots": {}})
        directory.create_user(db, CLI, {"username": "alice", "domain": "acme", "projects": ["ml"]})
        directory.create_user(db, CLI, {"username": "carol", "domain": "acme", "role": "admin"})
        devs = MockPlugin(devices=[{"model": "A100-80GB", "memory": "80g", "count": 2}], node="n1").discover()
        nodes.register_node(
            db, NodeInfo(name="n1", cpu=2, mem=8 * GIB, devices=devs, plugin="mock", reason=None)
        )
    return engine, factory


def _alice(db):
    user = directory.get_user(db, "alice")
    return Actor(name="alice", role="user", domain=user.domain.name)


def _admit(factory, **slots):
    with database.session_scope(factory) as db:
        return sessions.admit(db, CLI, {"project": "acme/ml", "username": "alice", "slots": slots}).id


def test_free_now_is_what_one_node_can_give_beside_the_quota(tmp_path, monkeypatch):
    engine, factory = _world(tmp_path, monkeypatch)
    _admit(factory, cpu=1, mem=GIB, **{"gpu.shares": 0.25})  # a quarter of device 0
    with database.session_scope(factory) as db:
        options = launch_options(db, directory.get_user(db, "alice"))
        carol = launch_options(db, directory.get_user(db, "carol"))
    [group] = options["resource_groups"]
    # One whole device is free (the other holds a quarter): a whole-GPU request gets 1, not 2.
    assert group["free_now"] == {
        "alive_nodes": 1,
        "nodes": 1,
        "cpu": 1.0,
        "mem": 7 * GIB,
        "gpu": 1,
        "gpu.shares": 1.0,
    }
    assert group["pending_timeout"] == 600
    assert options["role"] == "user" and options["project_admins"] == ["carol"]
    assert carol["projects"] == [] and carol["project_admins"] == ["carol"]
    engine.dispose()


def test_a_queued_session_says_why_it_waits_and_where(tmp_path, monkeypatch):
    engine, factory = _world(tmp_path, monkeypatch)
    _admit(factory, cpu=2, mem=GIB)
    queued = _admit(factory, cpu=1.5, mem=GIB)
    with database.session_scope(factory) as db:
        s = db.get(ComputeSession, queued)
        assert s.status == "PENDING"
        [view] = waiting.annotate(db, [sessions.session_view(s)])
    assert view["queue_position"] == 1
    assert view["waiting_for"] == (
        "short of CPU: asks 1.5 cores; at most 0 free on one node; it waits up to 10 min, then is cancelled"
    )
    engine.dispose()


def test_preview_starts_waits_or_refuses_and_changes_nothing(tmp_path, monkeypatch):
    engine, factory = _world(tmp_path, monkeypatch)
    _admit(factory, cpu=1.5, mem=GIB)
    with database.session_scope(factory) as db:
        before = (
            db.scalar(select(func.count(ComputeSession.id))),
            db.scalar(select(func.count(AuditEntry.id))),
        )
    body = {"project": "acme/ml", "slots": {"cpu": 0.5, "mem": GIB}}
    with database.session_scope(factory) as db:
        starts = waiting.preview(db, _alice(db), body)
        db.rollback()
    assert starts == {"outcome": "starts", "message": "starts now: fits on n1 now", "queue_ahead": 0}
    with database.session_scope(factory) as db:
        waits = waiting.preview(db, _alice(db), {**body, "slots": {"cpu": 1, "gpu": 2}})
        db.rollback()
    assert waits["outcome"] == "waits"
    assert waits["message"] == (
        "would wait: short of CPU: asks 1 core; at most 0.5 free on one node; it waits up to 10 min, then is cancelled"
    )
    with pytest.raises(LabfleetError) as refused, database.session_scope(factory) as db:
        waiting.preview(db, _alice(db), {**body, "slots": {"cpu": 64}})
    assert refused.value.status == 409 and "cpu" in refused.value.message  # as POST /api/sessions says it
    with database.session_scope(factory) as db:
        after = (
            db.scalar(select(func.count(ComputeSession.id))),
            db.scalar(select(func.count(AuditEntry.id))),
        )
    assert after == before
    engine.dispose()


def test_judge_reads_a_whole_gpu_request_against_whole_free_devices():
    node = {
        "name": "n1",
        "status": "ALIVE",
        "free": {"cpu": 8, "mem": 64 * GIB},
        "devices": [{"index": 0, "model": "A", "free": 0.75}, {"index": 1, "model": "A", "free": 0.75}],
    }
    # 1.5 GPUs' worth of shares are free, but no whole device: a whole-GPU request waits.
    assert capacity.free_now([node]).gpu == 0
    assert not capacity.judge({"gpu": 1}, [node]).fits
    assert capacity.judge({"gpu.shares": 0.5}, [node]).fits
    assert not capacity.judge({"cpu": 1}, [{**node, "schedulable": False}]).fits
