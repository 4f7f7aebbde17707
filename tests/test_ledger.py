"""The usage ledger (hub_ext/core/usage_ledger.py) against the sessions, on SQLite and a real PostgreSQL:
random sequences of admissions, releases, failures, cancels, queue service, pending timeouts,
deleted users and service restarts leave it equal to its recomputation; 200 racing admissions
against one domain cap; ``recalculate`` repairing an injected drift, through the logic, the CLI
(``labfleet maintenance recalc-usage``) and the API (``POST /api/maintenance/recalculate-usage``)."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, delete, func, insert, select, text, update
from sqlalchemy.engine import make_url

from labfleet.compute import clustercache, maintenance, nodes, sessions, tenants
from labfleet.compute.devices.base import NodeInfo
from labfleet.compute.devices.mock import MockPlugin
from labfleet.compute.reconcile import HubServer
from labfleet.compute.scheduler import admission
from labfleet.core import database, unitofwork, usage_ledger, vocab
from labfleet.core.authz import Actor
from labfleet.core.errors import Conflict, Forbidden, LabfleetError
from labfleet.core.models import (
    AuditEntry,
    ComputeSession,
    Domain,
    Keypair,
    ResourceGroup,
    UsageLedger,
)
from labfleet.core.secretbox import ensure_key_file
from labfleet.tenancy import directory, snapshot
from labfleet.tenancy.policies import ensure_default_keypair_policy
from tests.postgres_server import fresh_database

CLI = Actor.cli()
HUB = Actor.hub()
REPO = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------- the world, once per database

GIB = 2**30
NODE_CPU = 4
RACE_USERS = 10
RACE_CAP = 20  # sessions of 1 cpu the race domain's cap allows
USERS = {"alice": ("acme/ml", "acme/cv"), "bob": ("acme/ml",), "carol": ("beta/x",)}


def _build_world(url: str) -> None:
    """Tenants with caps, a node of 4 cores, 16g and two A100s, a pending timeout of an hour."""
    engine = database.make_engine(url)
    database.upgrade(engine)
    factory = unitofwork.make_session_factory(engine)
    with database.session_scope(factory) as db:
        ensure_default_keypair_policy(db)
        nodes.ensure_default_group(db)
        nodes.update_group(db, CLI, "default", {"pending_timeout": 3600})
        directory.create_domain(db, CLI, {"name": "acme", "total_resource_slots": {"cpu": 6}})
        directory.create_domain(db, CLI, {"name": "beta"})
        directory.create_domain(db, CLI, {"name": "race", "total_resource_slots": {"cpu": RACE_CAP}})
        directory.create_project(
            db, CLI, {"domain": "acme", "name": "ml", "total_resource_slots": {"gpu.shares": 1.5}}
        )
        directory.create_project(db, CLI, {"domain": "acme", "name": "cv"})
        directory.create_project(db, CLI, {"domain": "beta", "name": "x"})
        directory.create_project(db, CLI, {"domain": "race", "name": "p"})
        for name, projects in USERS.items():
            domain = projects[0].split("/")[0]
            directory.create_user(
                db,
                CLI,
                {"username": name, "domain": domain, "projects": [p.split("/")[1] for p in projects]},
            )
        for i in range(RACE_USERS):
            directory.create_user(db, CLI, {"username": f"r{i}", "domain": "race", "projects": ["p"]})
        devs = MockPlugin(devices=[{"model": "A100-80GB", "memory": "80g", "count": 2}], node="n1").discover()
        nodes.register_node(
            db, NodeInfo(name="n1", cpu=NODE_CPU, mem=16 * GIB, devices=devs, plugin="mock", reason=None)
        )
    engine.dispose()


class Template:
    """A built world on one database kind; ``clone()`` gives a fresh copy of it (a file copy on
    SQLite, CREATE DATABASE ... TEMPLATE on PostgreSQL)."""

    def __init__(self, kind: str, url: str, tmp: Path, admin_url: str | None = None) -> None:
        self.kind, self.url, self.tmp, self.admin_url = kind, url, tmp, admin_url
        self._n = 0
        self._lock = threading.Lock()

    def clone(self) -> str:
        with self._lock:
            self._n += 1
            n = self._n
        if self.kind == "sqlite":
            target = self.tmp / f"clone{n}.sqlite"
            src = sqlite3.connect(make_url(self.url).database)
            dst = sqlite3.connect(target)
            try:
                src.backup(dst)
            finally:
                src.close()
                dst.close()
            return f"sqlite:///{target}"
        assert self.admin_url is not None
        name = f"ledger_clone_{n}"
        template = make_url(self.url).database
        admin = create_engine(make_url(self.admin_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as c:
                c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
                c.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
        finally:
            admin.dispose()
        return make_url(self.url).set(database=name).render_as_string(hide_password=False)

    def drop(self, url: str) -> None:
        if self.kind == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                Path(make_url(url).database + suffix).unlink(missing_ok=True)
            return
        admin = create_engine(make_url(self.admin_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as c:
                c.execute(text(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)'))
        finally:
            admin.dispose()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def template(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"ledger_{request.param}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LABFLEET_SECRET_KEY_FILE", str(tmp / "key"))
        ensure_key_file(tmp / "key")
        if request.param == "sqlite":
            url = f"sqlite:///{tmp / 'template.sqlite'}"
            _build_world(url)
            yield Template("sqlite", url, tmp)
        else:
            admin = request.getfixturevalue("postgres_url")
            url = fresh_database(admin, "ledger_template")
            _build_world(url)
            yield Template("postgres", url, tmp, admin)


def clear_process_caches() -> None:
    """What a service restart forgets: the tenancy snapshot, the folder mounts, the cluster cache."""
    snapshot._cache.clear()
    tenants._mounts.clear()
    with clustercache._lock:
        clustercache._caches.clear()


class Fleet:
    """One fresh copy of the world and the engine the "service" uses on it (replaced by a restart)."""

    def __init__(self, template: Template) -> None:
        self.template = template
        self.url = template.clone()
        self._open()
        self.ids: list[str] = []

    def _open(self) -> None:
        kw = {"pool_size": 40, "max_overflow": 10} if self.template.kind == "postgres" else {}
        self.engine = database.make_engine(self.url, **kw)
        self.factory = unitofwork.make_session_factory(self.engine)

    def tx(self):
        return database.session_scope(self.factory)

    def restart(self) -> None:
        self.engine.dispose()
        clear_process_caches()
        self._open()

    def close(self) -> None:
        self.engine.dispose()
        self.template.drop(self.url)

    def drift(self) -> list[dict]:
        with self.tx() as db:
            return usage_ledger.drift(db)

    def statuses(self) -> dict[str, str]:
        with self.tx() as db:
            return dict(db.execute(select(ComputeSession.id, ComputeSession.status)).all())

    def admit(self, user: str, project: str, slots: dict) -> str:
        """The outcome: SCHEDULED, PENDING, or the refusal's code (or status)."""
        try:
            with self.tx() as db:
                s = sessions.admit(db, CLI, {"project": project, "username": user, "slots": slots})
                self.ids.append(s.id)
                return s.status
        except sessions.Refused as e:
            return e.code
        except LabfleetError as e:
            return f"error-{e.status}"


@pytest.fixture
def fleet(template):
    f = Fleet(template)
    yield f
    f.close()


# ---------------------------------------------------------------- random sequences (hypothesis)

SLOTS = st.builds(
    lambda cpu, mem, gpu: {"cpu": cpu, **mem, **gpu},
    st.sampled_from([0.25, 0.5, 1, 2]),
    st.sampled_from([{}, {"mem": "512m"}, {"mem": "1g"}, {"mem": "4g"}]),
    st.sampled_from(
        [{}, {"gpu.shares": 0.1}, {"gpu.shares": 0.25}, {"gpu.shares": 0.5}, {"gpu.shares": 0.75}, {"gpu": 1}]
    ),
)
ADMIT = st.tuples(
    st.just("admit"),
    st.sampled_from([(u, p) for u, ps in USERS.items() for p in ps]),
    SLOTS,
    st.booleans(),  # name the GPU model in the slot (gpu.shares:A100-80GB, gpu:A100-80GB)
)
WEIGHTED = [
    (10, ADMIT),
    (3, st.tuples(st.just("stop"), st.integers(0, 30))),
    (2, st.tuples(st.just("progress"), st.integers(0, 30))),
    (2, st.tuples(st.just("fail"), st.integers(0, 30), st.sampled_from(["ERROR", "TERMINATED"]))),
    (2, st.tuples(st.just("cancel"), st.integers(0, 30))),
    (2, st.tuples(st.just("serve"))),
    (1, st.tuples(st.just("timeout"), st.integers(0, 30))),
    (1, st.tuples(st.just("delete_user"), st.sampled_from(sorted(USERS)))),
    (1, st.tuples(st.just("delete_project"), st.just("acme/cv"))),
    (1, st.tuples(st.just("restart"))),
]
# Shrinks towards the first: admissions.
OPS = st.sampled_from([strategy for weight, strategy in WEIGHTED for _ in range(weight)]).flatmap(lambda s: s)


def _nth(items: list[str], i: int) -> str | None:
    return items[i % len(items)] if items else None


def apply(f: Fleet, op: tuple) -> str:
    """Run one step; returns what happened (for the failure report)."""
    kind = op[0]
    if kind == "admit":
        _, (user, project), slots, named = op
        slots = dict(slots)
        for base in ("gpu", "gpu.shares"):
            if named and base in slots:
                slots[f"{base}:A100-80GB"] = slots.pop(base)
        return f"admit {user} {project} {slots}: {f.admit(user, project, slots)}"
    if kind == "restart":
        f.restart()
        return "restart"
    if kind == "serve":
        with f.tx() as db:
            served = [
                sessions.schedule_group(db, db.get(ResourceGroup, g)) for g in sessions.groups_with_queue(db)
            ]
        return f"serve: {served}"
    if kind == "delete_user":
        with f.tx() as db:
            user = directory.get_user(db, op[1])
            if user is None:
                return f"delete {op[1]}: gone already"
            live = db.scalars(
                select(ComputeSession.id).where(
                    ComputeSession.user_id == user.id, ComputeSession.status.in_(vocab.LIVE_STATUSES)
                )
            ).all()
        if live:
            # Refused while their sessions are not over (nothing changes); then what the refusal
            # asks for: stop them, and delete
            with pytest.raises(Conflict), f.tx() as db:
                directory.delete_user(db, CLI, op[1])
            for sid in live:
                with f.tx() as db:
                    sessions.terminate(db, CLI, sid)
        with f.tx() as db:
            directory.delete_user(db, CLI, op[1])
        return f"delete {op[1]}" + (f": after stopping {len(live)} session(s)" if live else "")
    if kind == "delete_project":
        domain, name = op[1].split("/")
        with f.tx() as db:
            if directory.get_project(db, domain, name) is None:
                return f"delete {op[1]}: gone already"
            directory.delete_project(db, CLI, domain, name)
        return f"delete {op[1]}"
    statuses = f.statuses()
    known = [i for i in f.ids if i in statuses]  # deleted with their user: gone
    if kind == "stop":
        sid = _nth(known, op[1])
        if sid is None:
            return "stop: none"
        with f.tx() as db:
            sessions.terminate(db, CLI, sid)
        return f"stop {sid[:8]} ({statuses[sid]})"
    if kind == "progress":
        sid = _nth([i for i in known if statuses[i] in ("SCHEDULED", "PREPARING")], op[1])
        if sid is None:
            return "progress: none"
        new = "PREPARING" if statuses[sid] == "SCHEDULED" else "RUNNING"
        with f.tx() as db:
            sessions.update_status(db, HUB, sid, {"status": new})
        return f"progress {sid[:8]} -> {new}"
    if kind == "fail":
        sid = _nth([i for i in known if statuses[i] in ("SCHEDULED", "PREPARING", "RUNNING")], op[1])
        if sid is None:
            return "fail: none"
        if statuses[sid] != "RUNNING":
            with f.tx() as db:
                sessions.update_status(db, HUB, sid, {"status": "RUNNING"})
        with f.tx() as db:
            sessions.update_status(db, HUB, sid, {"status": op[2], "reason": "the server died"})
        return f"fail {sid[:8]} -> {op[2]}"
    if kind == "end":  # the spawner reports the end straight away (no RUNNING first)
        sid = _nth([i for i in known if statuses[i] in ("SCHEDULED", "PREPARING", "RUNNING")], op[1])
        if sid is None:
            return "end: none"
        with f.tx() as db:
            sessions.update_status(db, HUB, sid, {"status": op[2]})
        return f"end {sid[:8]} -> {op[2]}"
    pending = [i for i in known if statuses[i] == "PENDING"]
    sid = _nth(pending, op[1])
    if sid is None:
        return f"{kind}: none pending"
    if kind == "cancel":
        with f.tx() as db:
            sessions.terminate(db, CLI, sid, "cancelled")
        return f"cancel {sid[:8]}"
    assert kind == "timeout"
    with f.tx() as db:
        s = db.get(ComputeSession, sid)
        s.created_at = s.created_at - timedelta(hours=2)
    with f.tx() as db:
        served = sessions.schedule_group(db, db.get(ResourceGroup, s.resource_group_id))
    return f"timeout {sid[:8]}: {served}"


def _label(step: str) -> str:
    """What kind of thing a step did, for hypothesis's statistics (--hypothesis-show-statistics)."""
    kind = step.split(" ", 1)[0].rstrip(":")
    if kind in ("serve", "timeout"):
        return f"{kind}: " + (
            "placed" if "scheduled=['" in step else "cancelled" if "cancelled=['" in step else "none"
        )
    return (
        f"{kind}: " + step.rsplit(": ", 1)[-1]
        if kind == "admit"
        else kind + (": none" if "none" in step else "")
    )


# A sequence that surely takes every path at least once (hypothesis adds random ones).
EVERY_PATH = [
    ("admit", ("alice", "acme/ml"), {"cpu": 1, "gpu.shares": 0.75}, False),  # SCHEDULED
    ("admit", ("bob", "acme/ml"), {"cpu": 1, "gpu": 1}, False),  # project cap 1.5 shares: refused
    ("admit", ("bob", "acme/ml"), {"cpu": 1, "gpu.shares": 0.5}, True),  # per-model slot
    ("admit", ("alice", "acme/cv"), {"cpu": 2, "mem": "4g"}, False),  # node full of cpu after this
    ("admit", ("carol", "beta/x"), {"cpu": 1, "gpu": 1}, False),  # PENDING
    ("admit", ("carol", "beta/x"), {"cpu": 0.5}, False),  # PENDING
    ("admit", ("alice", "acme/cv"), {"cpu": 2}, False),  # PENDING (domain acme: 6 cpu)
    ("admit", ("bob", "acme/ml"), {"cpu": 2}, False),  # domain cap: refused
    ("progress", 1),  # bob's
    ("progress", 1),
    ("fail", 1, "ERROR"),  # RUNNING -> ERROR: serves the queue
    ("cancel", 0),
    ("timeout", 0),
    ("restart",),
    ("serve",),
    ("delete_user", "alice"),  # with live sessions: refused, stopped, deleted
    ("admit", ("alice", "acme/ml"), {"cpu": 1}, False),  # no such user any more
    ("stop", 1),
    ("serve",),
    ("restart",),
    ("admit", ("carol", "beta/x"), {"cpu": 1, "gpu.shares": 0.25}, False),
]


@settings(
    max_examples=int(os.environ.get("LABFLEET_LEDGER_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(ops=st.lists(OPS, min_size=10, max_size=int(os.environ.get("LABFLEET_LEDGER_STEPS", "25"))))
@example(ops=EVERY_PATH)
def test_the_ledger_equals_its_recomputation_after_any_sequence(template, ops):
    f = Fleet(template)
    try:
        done = []
        for op in ops:
            done.append(apply(f, op))
            event(_label(done[-1]))
            assert f.drift() == [], "after:\n  " + "\n  ".join(done)
        with f.tx() as db:
            assert usage_ledger.recalculate(db) == []
    finally:
        f.close()


def test_every_path_is_taken(fleet):
    """The hand-written sequence above reaches what it says it does (else it tests less than it claims)."""
    log = [apply(fleet, op) for op in EVERY_PATH[:8]]
    outcomes = [line.rsplit(": ", 1)[1] for line in log]
    assert outcomes == [
        "SCHEDULED",
        admission.PROJECT_QUOTA,
        "SCHEDULED",
        "SCHEDULED",
        "PENDING",
        "PENDING",
        "PENDING",
        admission.DOMAIN_QUOTA,
    ]
    for op in EVERY_PATH[8:]:
        apply(fleet, op)
    statuses = sorted(fleet.statuses().values())
    assert "ERROR" in statuses and "CANCELLED" in statuses and "SCHEDULED" in statuses
    with fleet.tx() as db:
        assert directory.get_user(db, "alice") is None
        assert usage_ledger.drift(db) == []


# ---------------------------------------------------------------- racing admissions


def test_200_concurrent_admissions_against_one_domain_cap(fleet):
    """20 sessions of 1 cpu fit the race domain's cap: of 200 at once, exactly 20 are admitted."""

    def one(i):
        return fleet.admit(f"r{i % RACE_USERS}", "race/p", {"cpu": 1})

    with ThreadPoolExecutor(max_workers=32) as pool:
        outcomes = list(pool.map(one, range(200)))
    admitted = [o for o in outcomes if o in ("SCHEDULED", "PENDING")]
    assert len(admitted) == RACE_CAP, sorted(set(outcomes))
    assert outcomes.count("SCHEDULED") == NODE_CPU
    assert outcomes.count(admission.DOMAIN_QUOTA) == 200 - RACE_CAP
    with fleet.tx() as db:
        assert usage_ledger.drift(db) == []
        race = directory.get_domain(db, "race")
        assert usage_ledger.read(db, [("domain", race.id)])[("domain", race.id)]["cpu"] == RACE_CAP * 1000


def test_concurrent_admissions_releases_and_failures_keep_the_ledger(fleet):
    """300 steps of every kind on 16 threads at once (each its own transactions): no error but the
    refusals and conflicts a race may give, and the ledger equals the sessions at the end."""
    rnd = random.Random(20261123)
    pairs = [(u, p) for u, ps in USERS.items() for p in ps]
    ops: list[tuple] = []
    for _ in range(300):
        r = rnd.random()
        if r < 0.5:
            gpu = rnd.choice([{}, {"gpu.shares": 0.25}, {"gpu": 1}])
            ops.append(
                ("admit", rnd.choice(pairs), {"cpu": rnd.choice([0.25, 0.5, 1]), **gpu}, rnd.random() < 0.3)
            )
        elif r < 0.7:
            ops.append(("stop", rnd.randrange(30)))
        elif r < 0.8:
            ops.append(("end", rnd.randrange(30), rnd.choice(["ERROR", "TERMINATED"])))
        elif r < 0.85:
            ops.append(("cancel", rnd.randrange(30)))
        elif r < 0.93:
            ops.append(("progress", rnd.randrange(30)))
        else:
            ops.append(("serve",))

    def one(op):
        try:
            return apply(fleet, op)
        except LabfleetError as e:  # a concurrent step got there first (409), or a refusal
            assert e.status in (403, 404, 409), e.message
            return f"{op[0]}: {e.status}"

    with ThreadPoolExecutor(max_workers=16) as pool:
        done = list(pool.map(one, ops))
    assert any(d.endswith("SCHEDULED") for d in done) and any(d.endswith("PENDING") for d in done)
    assert fleet.drift() == []


def test_a_status_report_racing_a_stop_leaves_the_session_stopped(fleet):
    """The spawner's report (PATCH /sessions/{id} RUNNING) read the session before the user's stop
    committed: the stop wins (TERMINATED, its slots given back once) and the late report is a
    conflict, not a resurrection.  Without the lock and re-read in update_status, the report wrote
    RUNNING back over the stop and the ledger drifted (every scope negative after the next ERROR)."""
    if fleet.template.kind == "sqlite":
        pytest.skip("SQLite runs write transactions one at a time (BEGIN IMMEDIATE): no such interleaving")
    assert fleet.admit("alice", "acme/cv", {"cpu": 1}) == "SCHEDULED"
    (sid,) = fleet.ids
    report = fleet.factory()
    try:
        assert report.get(ComputeSession, sid).status == "SCHEDULED"  # read before the stop
        with fleet.tx() as db:  # the user's DELETE /sessions/{id}, committed first
            sessions.terminate(db, CLI, sid)
        with pytest.raises(LabfleetError) as e:
            sessions.update_status(report, HUB, sid, {"status": "RUNNING"})
        assert e.value.status == 409 and "TERMINATED" in e.value.message
        report.rollback()
    finally:
        report.close()
    with fleet.tx() as db:
        status = db.get(ComputeSession, sid).status
        drift = usage_ledger.drift(db)
    assert (status, drift) == ("TERMINATED", [])


def test_a_status_report_in_flight_holds_off_a_stop(fleet):
    """The other order: the report holds its group's lock when the stop comes; the stop waits for
    it, then ends the session it reported RUNNING."""
    if fleet.template.kind == "sqlite":
        pytest.skip("SQLite runs write transactions one at a time (BEGIN IMMEDIATE): no such interleaving")
    assert fleet.admit("alice", "acme/cv", {"cpu": 1}) == "SCHEDULED"
    (sid,) = fleet.ids
    report = fleet.factory()
    with ThreadPoolExecutor(max_workers=1) as pool:
        try:
            sessions.update_status(report, HUB, sid, {"status": "RUNNING"})

            def stop():
                with fleet.tx() as db:
                    return sessions.terminate(db, CLI, sid).status

            stopping = pool.submit(stop)
            time.sleep(0.3)
            assert not stopping.done()  # it waits for the report's lock
            report.commit()
        finally:
            report.close()
        assert stopping.result(timeout=30) == "TERMINATED"
    with fleet.tx() as db:
        assert usage_ledger.drift(db) == []


# ---------------------------------------------------------------- recalculate: logic, CLI, API


def _ids(db):
    alice = directory.get_user(db, "alice")
    bob = directory.get_user(db, "bob")
    ml = directory.get_project(db, "acme", "ml")
    kp = db.scalar(select(Keypair).where(Keypair.user_id == bob.id))
    return alice, bob, ml, kp


def _inject_drift(fleet: Fleet) -> list[dict]:
    """Two sessions, then four wrong rows; returns the drift expected (in ledger order)."""
    assert fleet.admit("alice", "acme/ml", {"cpu": 1, "gpu.shares": 0.5}) == "SCHEDULED"
    assert fleet.admit("bob", "acme/ml", {"cpu": 0.5, "mem": "1g"}) == "SCHEDULED"
    with fleet.tx() as db:
        alice, bob, ml, kp = _ids(db)
        db.execute(
            update(UsageLedger)
            .where(
                UsageLedger.scope_kind == "user", UsageLedger.scope_id == alice.id, UsageLedger.slot == "cpu"
            )
            .values(amount=UsageLedger.amount + 1500)
        )
        db.execute(
            delete(UsageLedger).where(
                UsageLedger.scope_kind == "project",
                UsageLedger.scope_id == ml.id,
                UsageLedger.slot == "gpu.shares",
            )
        )
        db.execute(
            insert(UsageLedger),
            [
                {"scope_kind": "keypair", "scope_id": kp.id, "slot": "gpu", "amount": 3},
                {"scope_kind": "user", "scope_id": 99999, "slot": "mem", "amount": GIB},
            ],
        )
        return [
            {"scope_kind": "project", "scope_id": ml.id, "scope": "acme/ml", "slot": "gpu.shares",
             "stored": 0, "true": 50, "stored_amount": 0, "true_amount": 0.5},
            {"scope_kind": "user", "scope_id": alice.id, "scope": "alice", "slot": "cpu",
             "stored": 2500, "true": 1000, "stored_amount": 2.5, "true_amount": 1},
            {"scope_kind": "user", "scope_id": 99999, "scope": "#99999 (gone)", "slot": "mem",
             "stored": GIB, "true": 0, "stored_amount": GIB, "true_amount": 0},
            {"scope_kind": "keypair", "scope_id": kp.id, "scope": kp.access_key, "slot": "gpu",
             "stored": 3, "true": 0, "stored_amount": 3, "true_amount": 0},
        ]  # fmt: skip


def _audits(fleet: Fleet) -> list[dict]:
    with fleet.tx() as db:
        return [
            e.details
            for e in db.scalars(
                select(AuditEntry).where(AuditEntry.action == maintenance.ACTION).order_by(AuditEntry.id)
            )
        ]


def test_recalculate_repairs_an_injected_drift_and_reports_it(fleet):
    want = _inject_drift(fleet)
    with fleet.tx() as db:
        dry = maintenance.recalculate_usage(db, CLI, dry_run=True)
    # No Hub here: its servers are not checked (None), and the audit says nothing of them
    assert dry == {"drift": want, "repaired": 0, "dry_run": True, "unaccounted_servers": None}
    assert len(fleet.drift()) == 4  # a dry run repairs nothing
    with fleet.tx() as db:
        done = maintenance.recalculate_usage(db, CLI)
    assert done == {"drift": want, "repaired": 4, "dry_run": False, "unaccounted_servers": None}
    assert fleet.drift() == []
    with fleet.tx() as db:
        assert maintenance.recalculate_usage(db, CLI) == {
            "drift": [],
            "repaired": 0,
            "dry_run": False,
            "unaccounted_servers": None,
        }
        assert (
            db.scalar(select(func.count()).select_from(UsageLedger).where(UsageLedger.scope_id == 99999)) == 0
        )
    assert _audits(fleet) == [
        {"drift": 4, "dry_run": True},
        {"drift": 4, "dry_run": False},
        {"drift": 0, "dry_run": False},
    ]
    # Admission after the repair sees the true amounts.
    assert fleet.admit("bob", "acme/ml", {"cpu": 0.5, "gpu.shares": 1}) == "SCHEDULED"
    assert fleet.drift() == []


@pytest.mark.parametrize(
    "actor",
    [
        Actor(name="carol", role="admin", domain="acme"),
        Actor(name="mo", role="monitor", domain="acme"),
        Actor(name="alice", role="user", domain="acme"),
        HUB,
    ],
    ids=["domain-admin", "monitor", "user", "hub"],
)
def test_only_a_superadmin_or_the_cli_may_recalculate(fleet, actor):
    _inject_drift(fleet)
    with pytest.raises(Forbidden), fleet.tx() as db:
        maintenance.recalculate_usage(db, actor)
    assert len(fleet.drift()) == 4 and _audits(fleet) == []
    with fleet.tx() as db:
        root = Actor(name="root", role="superadmin", kind="user")
        assert maintenance.recalculate_usage(db, root)["repaired"] == 4
    assert fleet.drift() == []


def _admit_server(fleet: Fleet, user: str, name: str, slots: dict) -> str:
    with fleet.tx() as db:
        body = {"project": "acme/ml", "username": user, "name": name, "slots": slots}
        return sessions.admit(db, CLI, body).id


def test_recalculate_lists_the_hub_servers_that_run_no_live_session(fleet):
    """What the Hub runs that no live session accounts for (issue 27): the reconcile job's rule (a
    ready server with no live session), with what the Hub says of it and the newest session it ran.
    A dry run and a real run list the same; stopping them is the caller's (it can reach the Hub)."""
    live = _admit_server(fleet, "alice", "work", {"cpu": 1})
    first = _admit_server(fleet, "bob", "old", {"cpu": 0.5})
    with fleet.tx() as db:
        sessions.terminate(db, CLI, first)
    newest = _admit_server(fleet, "bob", "old", {"cpu": 0.5})
    with fleet.tx() as db:
        sessions.update_status(db, CLI, newest, {"status": "ERROR", "reason": "the server crashed"})
    started, active = "2026-11-24T09:00:00.123456Z", "2026-11-24T10:30:00.000000Z"
    hub = {
        ("alice", "work"): HubServer("ready", started, active),  # runs its live session
        ("bob", "old"): HubServer("ready", started, active),  # its sessions are over
        ("carol", ""): HubServer("ready"),  # never ran one; the Hub said nothing of its times
        ("bob", "next"): HubServer("spawn"),  # starting: not ready, not judged
    }
    with fleet.tx() as db:
        dry = maintenance.recalculate_usage(db, CLI, dry_run=True, hub_servers=hub)
        s = db.get(ComputeSession, newest)
        last = {
            "id": newest,
            "status": "ERROR",
            "status_reason": "the server crashed",
            "status_changed_at": s.status_changed_at.isoformat(),
        }
    want = [
        {"user": "bob", "server": "old", "started": started, "last_activity": active,
         "last_session": last, "stopped": False},
        {"user": "carol", "server": "", "started": None, "last_activity": None,
         "last_session": None, "stopped": False},
    ]  # fmt: skip
    assert dry == {"drift": [], "repaired": 0, "dry_run": True, "unaccounted_servers": want}
    with fleet.tx() as db:
        done = maintenance.recalculate_usage(db, CLI, hub_servers=hub)
    assert done == {"drift": [], "repaired": 0, "dry_run": False, "unaccounted_servers": want}
    with fleet.tx() as db:
        assert maintenance.recalculate_usage(db, CLI, hub_servers={})["unaccounted_servers"] == []
    assert fleet.statuses()[live] == "SCHEDULED" and fleet.drift() == []
    assert _audits(fleet) == [
        {"drift": 0, "dry_run": True, "unaccounted_servers": 2},
        {"drift": 0, "dry_run": False, "unaccounted_servers": 2},
        {"drift": 0, "dry_run": False, "unaccounted_servers": 0},
    ]


def test_the_cli_reports_and_repairs(fleet, capsys):
    from labfleet.cli.app import main

    want = _inject_drift(fleet)
    args = ["maintenance", "recalc-usage", "--db-url", fleet.url]
    main([*args, "--dry-run"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["SCOPE", "SLOT", "STORED", "TRUE"]
    rows = [line.split() for line in out[1:-1]]
    assert rows == [
        ["project", "acme/ml", "gpu.shares", "0", "0.5"],
        ["user", "alice", "cpu", "2.5", "1"],
        ["user", "#99999", "(gone)", "mem", "1g", "0"],
        ["keypair", want[3]["scope"], "gpu", "3", "0"],
    ]
    assert out[-1] == "Found 4 rows that differed; dry run: nothing repaired."
    main([*args, "--dry-run", "--json"])
    said = capsys.readouterr()
    assert json.loads(said.out) == want
    # It reads the DB only: it says the Hub's servers were not checked, and where they are (stderr)
    assert said.err.startswith("note: the Hub's servers were not checked") and said.err.count("\n") == 1
    assert "POST /services/labfleet/api/maintenance/recalculate-usage" in said.err
    assert len(fleet.drift()) == 4
    main(args)
    assert capsys.readouterr().out.splitlines()[-1] == "Repaired 4 rows."
    assert fleet.drift() == []
    main(args)
    assert capsys.readouterr().out == "The ledger matched the sessions: nothing to repair.\n"
    main([*args, "--json"])
    assert json.loads(capsys.readouterr().out) == []
    assert [a["dry_run"] for a in _audits(fleet)] == [True, True, False, False, False]


def test_the_labfleet_command(template, tmp_path):
    """The real entry point as a process: exit 0 with or without drift, 2 for bad arguments."""
    if template.kind != "sqlite":
        pytest.skip("the process runs once, on SQLite; the in-process CLI test covers PostgreSQL")
    fleet = Fleet(template)
    try:
        _inject_drift(fleet)
        env = {k: v for k, v in os.environ.items() if not k.startswith("LABFLEET_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env["LABFLEET_DB_URL"] = fleet.url

        def run(*args):
            return subprocess.run(
                [sys.executable, "-m", "labfleet.cli", "maintenance", *args],
                cwd=tmp_path,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=120,
            )

        p = run("recalc-usage")
        assert p.returncode == 0 and p.stdout.splitlines()[-1] == "Repaired 4 rows.", p.stderr
        p = run("recalc-usage")
        assert p.returncode == 0 and "ledger matched the sessions" in p.stdout, p.stderr
        for bad in (["recalc-usage", "--bogus"], ["recalc-usage", "extra"], ["recalc"], []):
            p = run(*bad)
            assert p.returncode == 2, (bad, p.stdout, p.stderr)
            assert p.stderr.startswith("labfleet: error: ") and len(p.stderr.splitlines()) == 1
        p = run("recalc-usage", "--dry-run", "--dry-run")
        assert p.returncode == 0  # a flag twice is still the flag
    finally:
        fleet.close()


# ---------------------------------------------------------------- the API, on a real Hub and service


@pytest.mark.hub
def test_the_api_recalculates_for_a_superadmin_only(hub):
    root = hub.wait_token("root")
    for body in (
        {"name": "acme"},
        {"username": "dana", "domain": "acme", "role": "admin"},
        {"username": "mona", "domain": "acme", "role": "monitor"},
        {"username": "ursa", "domain": "acme"},
    ):
        path = "/domains" if "name" in body else "/users"
        r = hub.api("POST", path, root, json=body)
        assert r.status_code == 201, r.text
    path = "/maintenance/recalculate-usage"
    for name in ("dana", "mona", "ursa"):
        r = hub.api("POST", path, hub.wait_token(name), json={"dry_run": True})
        assert r.status_code == 403, (name, r.text)
        assert r.json()["status"] == 403
    r = hub.api("POST", path, hub.service_token, json={})
    assert r.status_code == 403, r.text  # the Hub's own token: no
    assert hub.api("POST", path, json={}).status_code == 401
    for bad in ({"dry_run": "yes"}, {"dry": True}, [], "x"):
        r = hub.api("POST", path, root, json=bad)
        assert r.status_code == 400, (bad, r.text)
    assert hub.api("POST", path, root, data="{not json").status_code == 400

    # Drift injected behind the service's back: two rows for scopes that hold nothing.
    engine = database.make_engine(hub.db_url)
    try:
        factory = unitofwork.make_session_factory(engine)
        with database.session_scope(factory) as db:
            ursa = directory.get_user(db, "ursa")
            acme = db.scalar(select(Domain).where(Domain.name == "acme"))
            db.execute(
                insert(UsageLedger),
                [
                    {"scope_kind": "user", "scope_id": ursa.id, "slot": "cpu", "amount": 1500},
                    {"scope_kind": "domain", "scope_id": acme.id, "slot": "@sessions", "amount": 2},
                ],
            )
            want = [
                {"scope_kind": "domain", "scope_id": acme.id, "scope": "acme", "slot": "@sessions",
                 "stored": 2, "true": 0, "stored_amount": 2, "true_amount": 0},
                {"scope_kind": "user", "scope_id": ursa.id, "scope": "ursa", "slot": "cpu",
                 "stored": 1500, "true": 0, "stored_amount": 1.5, "true_amount": 0},
            ]  # fmt: skip
        # The service reads the Hub's servers too: none runs here, so none is unaccounted
        r = hub.api("POST", path, root, json={"dry_run": True})
        assert r.status_code == 200, r.text
        assert r.json() == {"drift": want, "repaired": 0, "dry_run": True, "unaccounted_servers": []}
        r = hub.api("POST", path, root)  # no body: a repair
        assert r.status_code == 200, r.text
        assert r.json() == {"drift": want, "repaired": 2, "dry_run": False, "unaccounted_servers": []}
        r = hub.api("POST", path, root, json={"dry_run": False})
        assert r.json() == {"drift": [], "repaired": 0, "dry_run": False, "unaccounted_servers": []}
        with database.session_scope(factory) as db:
            assert usage_ledger.drift(db) == [] and usage_ledger.stored(db) == {}
    finally:
        engine.dispose()
    entries = hub.api("GET", f"/audit?action={maintenance.ACTION}", root).json()
    assert [(e["actor"], e["details"], e["success"]) for e in reversed(entries)] == [
        ("root", {"drift": 2, "dry_run": True, "unaccounted_servers": 0}, True),
        ("root", {"drift": 2, "dry_run": False, "unaccounted_servers": 0}, True),
        ("root", {"drift": 0, "dry_run": False, "unaccounted_servers": 0}, True),
    ]
