"""The DB-backed scheduler under random operations, and its per-process cluster cache.

Hypothesis drives random sequences of admissions (fractions of a device in 0.01 steps, whole
devices, CPU-only), stops, failures and node registrations, some rolled back, through two
engines on one SQLite file (two processes, each with its own cache), under random quotas,
keypair policies, placements and queue orders.  After every step: no device, node or quota is
over-committed, every session holds exactly what it asked, and each process's cached cluster,
when its version is current, equals one rebuilt from the DB.  Then threads on SQLite and
PostgreSQL race through the same invariants, and a signed keypair is charged its own policy.
"""

from __future__ import annotations

import random
import shutil
import sqlite3
import tempfile
import threading
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from labfleet.compute import clustercache, nodes, sessions
from labfleet.compute.devices.base import NodeInfo
from labfleet.compute.devices.mock import MockPlugin
from labfleet.compute.scheduler import admission
from labfleet.core import allocversions, database, unitofwork
from labfleet.core.authz import Actor
from labfleet.core.errors import Conflict, LabfleetError
from labfleet.core.models import (
    Allocation,
    ComputeSession,
    Domain,
    Keypair,
    Node,
    Project,
    ResourceGroup,
    User,
)
from labfleet.core.secretbox import ensure_key_file
from labfleet.core.slots import ResourceSlots, charged
from labfleet.core.vocab import HOLDING_STATUSES
from labfleet.tenancy import directory, keypairs, policies
from tests.postgres_server import fresh_database

CLI = Actor.cli()
GIB = 2**30
USERS = {"alice": ("acme", ["ml", "cv"]), "bob": ("acme", ["ml"]), "carol": ("beta", ["x"])}
PROJECTS = {"alice": ["acme/ml", "acme/cv"], "bob": ["acme/ml"], "carol": ["beta/x"]}
# Small nodes, so that requests compete: two 2-GPU nodes, a 1-GPU node and a CPU-only one.
NODES = {
    "n1": (16, 64 * GIB, 2),
    "n2": (8, 32 * GIB, 2),
    "n3": (8, 32 * GIB, 1),
    "n4": (4, 16 * GIB, 0),
}
LATE_NODE = ("n5", 12, 48 * GIB, 2)  # joins the group during a run


def _node_info(name: str, cpu: int, mem: int, gpus: int) -> NodeInfo:
    devs = MockPlugin(devices=[{"model": "A100-80GB", "memory": "80g", "count": gpus}], node=name).discover()
    return NodeInfo(name=name, cpu=cpu, mem=mem, devices=devs if gpus else [], plugin="mock", reason=None)


def _world(url: str, key_file: Path) -> None:
    """Tenants, users (alice also has a second keypair under policy "capped"), and the nodes."""
    ensure_key_file(key_file)
    engine = database.make_engine(url)
    database.upgrade(engine)
    factory = unitofwork.make_session_factory(engine)
    with database.session_scope(factory) as db:
        policies.ensure_default_keypair_policy(db)
        policies.create_policy(db, CLI, "keypair", {"name": "capped"})
        nodes.ensure_default_group(db)
        for domain, projects in (("acme", ["ml", "cv"]), ("beta", ["x"])):
            directory.create_domain(db, CLI, {"name": domain})
            for p in projects:
                directory.create_project(db, CLI, {"domain": domain, "name": p})
        for user, (domain, projects) in USERS.items():
            directory.create_user(db, CLI, {"username": user, "domain": domain, "projects": projects})
        keypairs.issue(db, CLI, {"username": "alice", "resource_policy": "capped"})
        for name, (cpu, mem, gpus) in NODES.items():
            nodes.register_node(db, _node_info(name, cpu, mem, gpus))
    engine.dispose()


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """One migrated world on disk; each example works on a copy of the file."""
    d = tmp_path_factory.mktemp("props")
    key = d / "key"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LABFLEET_SECRET_KEY_FILE", str(key))
        path = d / "template.sqlite"
        _world(f"sqlite:///{path}", key)
    with sqlite3.connect(path) as conn:  # everything in the main file, so one copy is enough
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


def _signed_key(db) -> str:
    return db.scalar(select(Keypair.access_key).join(User).where(User.username == "alice", ~Keypair.is_main))


def _actor(db, user: str, signed: bool) -> Actor:
    if not signed:
        return CLI
    u = db.scalar(select(User).where(User.username == user))
    return Actor(name=user, role="user", domain=u.domain.name, user_id=u.id, keypair=_signed_key(db))


# ---------------------------------------------------------------- invariants


def _over(used: ResourceSlots, cap: ResourceSlots, limited: bool = False) -> list[str]:
    bad = [f"{k}: {used.get_amount(k)} > {v}" for k, v in cap.items() if used.get_amount(k) > v]
    if limited:
        bad += [f"{k}: {v} used, not granted" for k, v in used.items() if v and k not in cap]
    return bad


def check_invariants(factory) -> None:
    """Nothing over-committed anywhere, and each session holds exactly what it asked."""
    with database.session_scope(factory) as db:
        for dev_id, centi in db.execute(
            select(Allocation.device_id, func.sum(Allocation.shares_centi))
            .where(Allocation.device_id.is_not(None))
            .group_by(Allocation.device_id)
        ):
            assert 0 < centi <= 100, f"device {dev_id} holds {centi} hundredths"
        for node in db.scalars(select(Node)):
            cpu, mem = db.execute(
                select(
                    func.coalesce(func.sum(Allocation.cpu_milli), 0),
                    func.coalesce(func.sum(Allocation.mem), 0),
                ).where(Allocation.node_id == node.id)
            ).one()
            assert cpu <= Decimal(node.cpu) * 1000 and mem <= node.mem, f"node {node.name} over-committed"
        live = list(
            db.scalars(
                select(ComputeSession).where(ComputeSession.status.in_((*HOLDING_STATUSES, "PENDING")))
            )
        )
        used: dict[tuple[str, Any], ResourceSlots] = defaultdict(ResourceSlots)
        count: dict[tuple[str, Any], int] = defaultdict(int)
        for s in live:
            for scope in (("kp", s.keypair_id), ("project", s.project_id), ("domain", s.domain_id)):
                used[scope] = used[scope] + charged(s.slots)
            count[("all", s.keypair_id)] += 1
            count[(s.status == "PENDING", s.keypair_id)] += 1
        for p in db.scalars(select(Project)):
            assert not _over(used[("project", p.id)], p.slots), f"project {p.full_name} over its cap"
        for d in db.scalars(select(Domain)):
            assert not _over(used[("domain", d.id)], d.slots), f"domain {d.name} over its cap"
        for kp in db.scalars(select(Keypair)):
            pol = kp.resource_policy
            limited = pol.default_for_unspecified == "LIMITED"
            assert not _over(used[("kp", kp.id)], pol.slots, limited), f"keypair {kp.access_key} over"
            if pol.max_concurrent_sessions:
                assert count[("all", kp.id)] <= pol.max_concurrent_sessions
            if pol.max_pending_sessions:
                assert count[(True, kp.id)] <= pol.max_pending_sessions
        for s in db.scalars(select(ComputeSession)):
            allocs = list(s.allocations)
            if s.status not in HOLDING_STATUSES:
                assert not allocs, f"{s.status} session {s.id} still holds an allocation"
                continue
            slots = s.slots
            assert allocs and len({a.node_id for a in allocs}) == 1 and s.node_id == allocs[0].node_id
            assert sum(a.cpu_milli for a in allocs) == slots.get_amount("cpu") * 1000
            assert sum(a.mem for a in allocs) == slots.get_amount("mem")
            shares = sorted(a.shares_centi for a in allocs if a.device_id is not None)
            whole, frac = int(slots.get_amount("gpu")), int(slots.get_amount("gpu.shares") * 100)
            if whole:
                assert shares == [100] * whole
            elif frac:
                # whole-gpu placement gives a fraction a device of its own
                assert shares in ([frac], [100]) and (
                    shares == [frac] or s.resource_group.placement == "whole-gpu"
                )
            else:
                assert shares == []


def check_cache(engine, factory) -> bool:
    """The engine's cached cluster, where current, equals one rebuilt from the DB; True if compared."""
    with database.session_scope(factory) as db:
        gid = db.scalar(select(ResourceGroup.id).where(ResourceGroup.name == nodes.DEFAULT_GROUP))
        current = allocversions.version(db, gid)
        entry = clustercache.peek(engine, gid)
        if entry is None:
            return False
        assert entry.version <= current, "a cached cluster is ahead of the DB (a rollback kept it)"
        assert entry.owner is None, "a committed transaction still owns a cached cluster"
        if entry.version != current:
            return False
        fresh = clustercache.build(db, gid, current)
        assert entry.cluster.to_dicts() == fresh.cluster.to_dicts()
        assert entry.devices == fresh.devices and entry.nodes == fresh.nodes
        return True


# ---------------------------------------------------------------- operations


def _slots(cpu: str, mem: str, gpu: tuple[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if cpu != "0":
        out["cpu"] = cpu
    if mem != "0":
        out["mem"] = mem
    kind, n = gpu
    if kind == "shares":
        out["gpu.shares"] = str(Decimal(n) / 100)
    elif kind == "gpu":
        out["gpu"] = n
    return out


gpu_parts = st.one_of(
    st.just(("none", 0)),
    st.tuples(st.just("shares"), st.integers(1, 100)),
    st.tuples(st.just("shares"), st.sampled_from([10, 25, 33, 50, 75])),
    st.tuples(st.just("gpu"), st.integers(1, 3)),
)
slot_requests = st.builds(
    _slots,
    st.sampled_from(["0", "0.5", "1", "2", "4", "9"]),
    st.sampled_from(["0", "1g", "8g", "20g"]),
    gpu_parts,
)
engine_ids = st.sampled_from([0, 0, 0, 1])  # mostly one process, so its cache is reused
admits = st.tuples(
    st.just("admit"),
    engine_ids,
    st.sampled_from(sorted(USERS)),
    st.integers(0, 1),  # which of the user's projects
    slot_requests,
    st.booleans(),  # signed with alice's second keypair (others: their main one)
    st.integers(0, 9),  # 0: the transaction rolls back after the admission
)
changes = st.tuples(st.sampled_from(["terminate", "run", "fail"]), engine_ids, st.integers(0, 50))
nodes_join = st.tuples(st.just("node"), engine_ids, st.sampled_from(["heartbeat", "join"]))
ops = st.one_of(admits, admits, admits, changes, changes, nodes_join)  # node changes: rarely
caps = st.one_of(
    st.just({}),
    st.fixed_dictionaries(
        {},
        optional={
            "cpu": st.sampled_from([4, 12, 30]),
            "mem": st.sampled_from(["16g", "64g"]),
            "gpu.shares": st.sampled_from([0.5, 1, 1.75, 2.5, 4]),
            "gpu": st.sampled_from([1, 2]),
        },
    ),
)
worlds = st.fixed_dictionaries(
    {
        "placement": st.sampled_from(nodes.PLACEMENTS),
        "scheduler": st.sampled_from(nodes.SCHEDULERS),
        "projects": st.fixed_dictionaries({"acme/ml": caps, "acme/cv": caps, "beta/x": caps}),
        "domains": st.fixed_dictionaries({"acme": caps, "beta": caps}),
        "keypair": st.fixed_dictionaries(
            {
                "total_resource_slots": caps,
                "default_for_unspecified": st.sampled_from(["UNLIMITED", "LIMITED"]),
                "max_concurrent_sessions": st.integers(0, 4),
                "max_pending_sessions": st.integers(0, 2),
            }
        ),
        "default_keypair": st.fixed_dictionaries(
            {"total_resource_slots": caps, "max_concurrent_sessions": st.integers(0, 6)}
        ),
    }
)


class Rollback(Exception):
    pass


def _session_ids(db) -> list[str]:
    return list(db.scalars(select(ComputeSession.id).order_by(ComputeSession.created_at, ComputeSession.id)))


def run_op(factory, op: tuple) -> None:
    kind = op[0]
    try:
        with database.session_scope(factory) as db:
            if kind == "admit":
                _, _, user, project, slots, signed, rollback = op
                signed = signed and user == "alice"
                projects = PROJECTS[user]
                body = {"project": projects[project % len(projects)], "slots": slots}
                if not signed:
                    body["username"] = user
                sessions.admit(db, _actor(db, user, signed), body)
                if rollback == 0:
                    raise Rollback
            elif kind == "node":
                name, cpu, mem, gpus = LATE_NODE if op[2] == "join" else ("n2", *NODES["n2"])
                nodes.register_node(db, _node_info(name, cpu, mem, gpus))
            else:
                ids = _session_ids(db)
                if not ids:
                    return
                sid = ids[op[2] % len(ids)]
                status = db.get(ComputeSession, sid).status
                if kind == "terminate":
                    sessions.terminate(db, CLI, sid)
                elif kind == "run" and status in ("SCHEDULED", "PREPARING"):
                    sessions.update_status(db, CLI, sid, {"status": "RUNNING"})
                elif kind == "fail" and status in HOLDING_STATUSES:
                    sessions.update_status(db, CLI, sid, {"status": "ERROR", "reason": "crashed"})
    except Rollback:
        pass
    except LabfleetError as e:
        assert e.status in (403, 409), e.message  # refused: quota, concurrency, never fits


def _configure(factory, world: dict[str, Any]) -> None:
    with database.session_scope(factory) as db:
        nodes.update_group(
            db, CLI, nodes.DEFAULT_GROUP, {"placement": world["placement"], "scheduler": world["scheduler"]}
        )
        for full, cap in world["projects"].items():
            d, p = full.split("/")
            directory.update_project(db, CLI, d, p, {"total_resource_slots": cap})
        for d, cap in world["domains"].items():
            directory.update_domain(db, CLI, d, {"total_resource_slots": cap})
        policies.update_policy(db, CLI, "keypair", "capped", world["keypair"])
        policies.update_policy(db, CLI, "keypair", "default", world["default_keypair"])


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(world=worlds, steps=st.lists(ops, min_size=8, max_size=40))
def test_random_operations_keep_every_invariant(template, world, steps):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "lf.sqlite"
        shutil.copy(template, path)
        # Two engines on one file: two processes, each with its own cache.
        engines = [database.make_engine(f"sqlite:///{path}") for _ in range(2)]
        factories = [unitofwork.make_session_factory(e) for e in engines]
        try:
            _configure(factories[0], world)
            for op in steps:
                run_op(factories[op[1]], op)
                check_invariants(factories[0])
                for e, f in zip(engines, factories, strict=True):
                    check_cache(e, f)
            # Stop everything: every allocation comes back, and the caches agree with the DB.
            with database.session_scope(factories[0]) as db:
                for sid in _session_ids(db):
                    sessions.terminate(db, CLI, sid)
            with database.session_scope(factories[1]) as db:
                assert db.scalar(select(func.count()).select_from(Allocation)) == 0
                assert not db.scalars(
                    select(ComputeSession).where(ComputeSession.status.in_((*HOLDING_STATUSES, "PENDING")))
                ).all()
                gid = db.scalar(select(ResourceGroup.id).where(ResourceGroup.name == nodes.DEFAULT_GROUP))
                entry = clustercache.get(db, gid)
            for e, f in zip(engines, factories, strict=True):
                check_cache(e, f)
            for n in entry.cluster.to_dicts():
                assert n["cpu_allocated"] == "0" and n["mem_allocated"] == 0
                assert all(dev["allocated"] == "0" for dev in n["devices"])
        finally:
            for e in engines:
                e.dispose()


# ---------------------------------------------------------------- targeted cases


@pytest.fixture
def world_copy(template, tmp_path):
    path = tmp_path / "lf.sqlite"
    shutil.copy(template, path)
    engine = database.make_engine(f"sqlite:///{path}")
    yield engine, unitofwork.make_session_factory(engine)
    engine.dispose()


def _admit(factory, actor=CLI, **body) -> tuple[str, str]:
    with database.session_scope(factory) as db:
        s = sessions.admit(db, actor, body)
        return s.id, s.status


def _group_id(db) -> int:
    return db.scalar(select(ResourceGroup.id).where(ResourceGroup.name == nodes.DEFAULT_GROUP))


def _group_id_of(factory) -> int:
    with database.session_scope(factory) as db:
        return _group_id(db)


def test_cache_is_reused_bumped_and_dropped_on_rollback(world_copy):
    engine, factory = world_copy
    clustercache.reset_stats()
    one = {"project": "acme/ml", "username": "alice", "slots": {"gpu.shares": "0.5"}}
    _admit(factory, **one)
    _admit(factory, **one)
    assert clustercache.stats()["hits"] == 1 and clustercache.stats()["rebuilds"] == 1
    with database.session_scope(factory) as db:
        before = allocversions.version(db, _group_id(db))
    assert clustercache.peek(engine, _group_id_of(factory)).version == before
    # A rolled-back admission leaves the DB's version alone and drops the changed cache entry.
    with pytest.raises(Rollback):
        with database.session_scope(factory) as db:
            sessions.admit(db, CLI, one)
            assert clustercache.peek(engine, _group_id(db)).version == before + 1
            raise Rollback
    with database.session_scope(factory) as db:
        assert allocversions.version(db, _group_id(db)) == before
    assert clustercache.peek(engine, _group_id_of(factory)) is None and clustercache.stats()["dropped"] == 1
    _admit(factory, **one)
    assert check_cache(engine, factory)


def test_other_writers_bump_the_version(world_copy):
    """Node registration, and a session stopped so that its user can be deleted."""
    engine, factory = world_copy
    sid, status = _admit(factory, project="beta/x", username="carol", slots={"gpu": 1, "cpu": 2})
    assert status == "SCHEDULED" and check_cache(engine, factory)
    with database.session_scope(factory) as db:
        v = allocversions.version(db, _group_id(db))
        nodes.register_node(db, _node_info(*LATE_NODE))
        v2 = allocversions.version(db, _group_id(db))
        assert v2 > v
    assert clustercache.peek(engine, _group_id_of(factory)).version < v2
    with database.session_scope(factory) as db:
        # Refused while carol's session lives (it would drop its rows while it runs on)
        with pytest.raises(Conflict):
            directory.delete_user(db, CLI, "carol")
    with database.session_scope(factory) as db:
        sessions.terminate(db, CLI, sid)  # what the refusal asks for: its allocations go
        assert allocversions.version(db, _group_id(db)) > v2
        directory.delete_user(db, CLI, "carol")
    with database.session_scope(factory) as db:
        assert db.scalar(select(func.count()).select_from(Allocation)) == 0
        entry = clustercache.get(db, _group_id(db))
        assert LATE_NODE[0] in entry.cluster.nodes
        assert all(d["allocated"] == "0" for n in entry.cluster.to_dicts() for d in n["devices"])


def test_a_change_behind_the_caches_back_in_the_same_transaction(world_copy):
    """An allocation edited after a placement, in the same transaction: the flush hook bumps again."""
    engine, factory = world_copy
    with database.session_scope(factory) as db:
        s = sessions.admit(
            db, CLI, {"project": "acme/ml", "username": "alice", "slots": {"gpu.shares": "0.5"}}
        )
        s.allocations[0].shares_centi = 25
        uuid = s.allocations[0].device.uuid
    check_cache(engine, factory)
    with database.session_scope(factory) as db:
        entry = clustercache.get(db, _group_id(db))
        held = {d["id"]: d["allocated"] for n in entry.cluster.to_dicts() for d in n["devices"]}
        assert held[uuid] == "0.25"


def test_signed_keypair_is_charged_to_its_own_policy(world_copy):
    _, factory = world_copy
    with database.session_scope(factory) as db:
        policies.update_policy(
            db,
            CLI,
            "keypair",
            "capped",
            {"total_resource_slots": {"gpu.shares": 0.5}, "max_concurrent_sessions": 0},
        )
        signed = _actor(db, "alice", True)
        bob_main = db.scalar(select(Keypair.access_key).join(User).where(User.username == "bob"))
    sid, status = _admit(factory, signed, project="ml", slots={"gpu.shares": "0.5"})
    assert status == "SCHEDULED"
    with database.session_scope(factory) as db:
        s = db.get(ComputeSession, sid)
        assert s.keypair.access_key == signed.keypair and not s.keypair.is_main
    # The signed keypair's policy is used up; alice's main keypair (default policy) is not.
    with pytest.raises(sessions.Refused) as e:
        _admit(factory, signed, project="ml", slots={"gpu.shares": "0.25"})
    assert e.value.code == admission.KEYPAIR_QUOTA and signed.keypair in e.value.message
    assert (
        _admit(
            factory,
            Actor(name="alice", role="user", domain="acme"),
            project="ml",
            slots={"gpu.shares": "0.25"},
        )[1]
        == "SCHEDULED"
    )
    # Someone else's keypair, or a revoked one, is refused.
    with pytest.raises(LabfleetError) as e:
        _admit(factory, Actor(name="alice", role="user", domain="acme", keypair=bob_main), project="ml")
    assert e.value.status == 403 and "does not belong" in e.value.message
    with database.session_scope(factory) as db:
        keypairs.revoke(db, CLI, signed.keypair)
    with pytest.raises(LabfleetError) as e:
        _admit(factory, signed, project="ml")
    assert e.value.status == 403 and "not active" in e.value.message


# ---------------------------------------------------------------- threads and processes


def _race(url: str, threads: int = 6, steps: int = 25) -> None:
    """Threads over two engines (two processes' caches) admit, stop and fail sessions at once."""
    engines = [
        database.make_engine(
            url, **({"pool_size": threads, "max_overflow": 2} if "postgresql" in url else {})
        )
        for _ in range(2)
    ]
    factories = [unitofwork.make_session_factory(e) for e in engines]
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            for _ in range(steps):
                f = factories[rnd.randrange(2)]
                r = rnd.random()
                if r < 0.6:
                    user = rnd.choice(sorted(USERS))
                    gpu = rnd.choice([("shares", rnd.randint(1, 100)), ("gpu", 1), ("none", 0)])
                    slots = _slots(rnd.choice(["0", "1", "2"]), rnd.choice(["0", "4g"]), gpu)
                    run_op(f, ("admit", 0, user, rnd.randrange(2), slots, False, rnd.randrange(10)))
                else:
                    run_op(f, (rnd.choice(["terminate", "terminate", "fail"]), 0, rnd.randrange(100)))
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    try:
        pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        assert not errors, errors
        check_invariants(factories[0])
        for e, f in zip(engines, factories, strict=True):
            with database.session_scope(f) as db:
                clustercache.get(db, _group_id(db))  # bring each process's cache up to date
            assert check_cache(e, f)
    finally:
        for e in engines:
            e.dispose()


def test_threads_and_processes_sqlite(world_copy):
    engine, _ = world_copy
    _race(engine.url.render_as_string())


@pytest.mark.postgres
def test_threads_and_processes_postgres(postgres_url, tmp_path, monkeypatch):
    url = fresh_database(postgres_url, "sched_props_race")
    monkeypatch.setenv("LABFLEET_SECRET_KEY_FILE", str(tmp_path / "key"))
    _world(url, tmp_path / "key")
    _race(url)
