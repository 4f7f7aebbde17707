"""The idle reclamation engine and its rules (labfleet.reclaim) on a real database.

Sessions are admitted and moved to RUNNING with the real ``sessions`` module; their start is then
moved to a fixed time, so each judgment's figures can be written down exactly.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import insert, select
from sqlalchemy.orm.attributes import flag_modified

from labfleet.compute import nodes, sessions
from labfleet.compute.devices.base import DeviceInfo, NodeInfo
from labfleet.core import database
from labfleet.core.authz import Actor
from labfleet.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from labfleet.core.models import AuditEntry, ComputeSession, SessionActivity, UsageSample
from labfleet.reclaim import reclaimer, rules
from labfleet.tenancy import directory, policies
from labfleet.tenancy.policies import ensure_default_keypair_policy
from tests.dbfixture import fresh_db

CLI = Actor.cli()
HUB = Actor.hub()
GiB = 2**30
T0 = datetime(2026, 11, 24, 9, 0, tzinfo=timezone.utc)
SETTINGS = reclaimer.Settings(default_idle_timeout=0, interval=15, report_interval=60)
ALICE = Actor(name="alice", role="user", domain="acme")
CAROL = Actor(name="carol", role="admin", domain="acme")
DAVE = Actor(name="dave", role="admin", domain="beta")
MONA = Actor(name="mona", role="monitor", domain="acme")


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


@pytest.fixture
def factory(tmp_path, monkeypatch):
    eng, factory = fresh_db(f"sqlite:///{tmp_path / 'lf.sqlite'}", tmp_path, monkeypatch)
    with database.session_scope(factory) as db:
        ensure_default_keypair_policy(db)
        nodes.ensure_default_group(db)
        directory.create_domain(db, CLI, {"name": "acme"})
        directory.create_domain(db, CLI, {"name": "beta"})
        directory.create_project(db, CLI, {"domain": "acme", "name": "ml"})
        directory.create_project(db, CLI, {"domain": "beta", "name": "web"})
        for name, domain, project, role in [
            ("alice", "acme", "ml", "user"),
            ("bob", "acme", "ml", "user"),
            ("carol", "acme", None, "admin"),
            ("erin", "beta", "web", "user"),
            ("dave", "beta", None, "admin"),
            ("mona", "acme", None, "monitor"),
        ]:
            directory.create_user(
                db,
                CLI,
                {"username": name, "domain": domain, "role": role, "projects": [project] if project else []},
            )
        dev = DeviceInfo("GPU-mock-0", 0, "A100-80GB", 80 * GiB)
        nodes.register_node(
            db, NodeInfo(name="n1", cpu=8, mem=64 * GiB, devices=[dev], plugin="mock", reason=None)
        )
    yield factory
    eng.dispose()


def running(factory, user="alice", project="acme/ml", since=0.0, type_="interactive", **slots) -> str:
    """Admit a session, move it to RUNNING, and date its start ``since`` seconds after T0, when its
    server also made its first report (as a session's server does once it answers)."""
    body = {
        "project": project,
        "username": user,
        "slots": slots or {"cpu": 1},
        "type": type_,
        "name": f"s{since}",
    }
    if type_ != "interactive":
        body["command"] = "sleep 1000"
    with database.session_scope(factory) as db:
        s = sessions.admit(db, CLI, body)
        assert s.status == "SCHEDULED", s.status_reason
        sid = s.id
    with database.session_scope(factory) as db:
        sessions.update_status(db, HUB, sid, {"status": "RUNNING"})
    with database.session_scope(factory) as db:
        s = db.get(ComputeSession, sid)
        s.status_history = [{**h, "at": at(since).isoformat()} for h in s.status_history]
        flag_modified(s, "status_history")
        db.add(
            SessionActivity(session_id=sid, last_activity=at(since), reported_at=at(since), busy_kernels=0)
        )
    return sid


def judged(factory, now: float, settings=SETTINGS) -> dict[str, reclaimer.Subject]:
    with factory() as db:
        return {s.id: s for s in reclaimer.judge_all(db, at(now), settings)}


def to_reclaim(factory, now: float, settings=SETTINGS) -> dict[str, reclaimer.Decision]:
    with factory() as db:
        return {d.subject.id: d for d in reclaimer.decide(db, reclaimer.judge_all(db, at(now), settings))}


def set_policy(factory, **fields):
    with database.session_scope(factory) as db:
        policies.update_policy(db, CLI, "keypair", "default", fields)


def checker(factory, actor=CLI, **body):
    with database.session_scope(factory) as db:
        return rules.view(rules.create(db, actor, body))


def test_the_policy_idle_timeout_and_the_global_default(factory):
    sid = running(factory)
    assert judged(factory, 10_000)[sid].judgments == []  # default policy: -1, global default 0: never
    later = reclaimer.Settings(default_idle_timeout=300, interval=15, report_interval=60)
    (j,) = judged(factory, 299, later)[sid].judgments
    assert (j.checker, j.reason, j.reclaim, j.reclaim_at) == ("policy", "idle-timeout", False, at(300))
    assert sid in to_reclaim(factory, 300, later)
    set_policy(factory, idle_timeout=600)  # the policy's own timeout wins over the global default
    assert sid not in to_reclaim(factory, 300, later) and sid in to_reclaim(factory, 600, later)
    set_policy(factory, idle_timeout=0)  # never
    assert judged(factory, 10_000, later)[sid].judgments == []


def test_activity_reports_and_still_here_keep_a_session(factory):
    set_policy(factory, idle_timeout=600)
    sid = running(factory)
    with database.session_scope(factory) as db:
        reclaimer.report_activity(
            db, ALICE, sid, {"last_activity": at(500).isoformat(), "busy_kernels": 0}, at(550)
        )
    assert sid not in to_reclaim(factory, 900)
    assert sid in to_reclaim(factory, 1100)
    with database.session_scope(factory) as db:
        idle = reclaimer.still_here(db, ALICE, sid, at(1050), SETTINGS)
    assert (
        idle["idle_for"] == 0 and idle["reclaim_at"] == at(1650).isoformat() and idle["checker"] == "policy"
    )
    assert sid not in to_reclaim(factory, 1100)
    with factory() as db:
        assert (
            "session.still-here"
            in db.scalars(select(AuditEntry.action).where(AuditEntry.target == sid)).all()
        )
    # A busy kernel, freshly reported, is activity now
    with database.session_scope(factory) as db:
        reclaimer.report_activity(db, ALICE, sid, {"busy_kernels": 2}, at(5000))
    assert sid not in to_reclaim(factory, 5010)
    assert sid in to_reclaim(factory, 5000 + SETTINGS.stale_after + 1)  # it stopped reporting


def test_reports_come_from_the_owner_only_and_are_checked(factory):
    sid = running(factory)
    with database.session_scope(factory) as db:
        with pytest.raises(NotFound):
            reclaimer.report_activity(db, Actor(name="bob", role="user", domain="acme"), sid, {}, at(1))
        with pytest.raises(Forbidden):
            reclaimer.report_activity(db, CAROL, sid, {}, at(1))  # an admin reads it, but it is not theirs
        with pytest.raises(InvalidInput):
            reclaimer.report_activity(db, ALICE, sid, {"last_activity": "noon"}, at(1))
        with pytest.raises(InvalidInput):
            reclaimer.report_activity(db, ALICE, sid, {"busy_kernels": -1}, at(1))
        with pytest.raises(InvalidInput):
            reclaimer.report_activity(db, ALICE, sid, {"cpu": 1}, at(1))
        # A report from the future counts as now, no later
        reclaimer.report_activity(db, ALICE, sid, {"last_activity": at(99_999).isoformat()}, at(10))
    assert judged(factory, 10, reclaimer.Settings(default_idle_timeout=100))[sid].judgments[
        0
    ].reclaim_at == at(110)
    with database.session_scope(factory) as db:
        sessions.terminate(db, CLI, sid)
    with database.session_scope(factory) as db:
        with pytest.raises(Conflict):
            reclaimer.report_activity(db, ALICE, sid, {}, at(20))


def test_bound_checkers_apply_where_bound_and_the_strictest_reclaims_first(factory):
    checker(
        factory,
        name="lenient",
        kind="activity",
        options={"timeout": 3600},
        bindings=[{"scope": "domain", "name": "acme"}],
    )
    checker(
        factory,
        name="gpu-strict",
        kind="activity",
        options={"timeout": 120},
        bindings=[{"scope": "resource_group", "name": "default"}],
    )
    checker(
        factory,
        name="web-only",
        kind="activity",
        options={"timeout": 10},
        bindings=[{"scope": "project", "name": "beta/web"}],
    )
    a = running(factory)
    e = running(factory, user="erin", project="beta/web", since=1)
    seen = judged(factory, 100)
    assert {j.checker for j in seen[a].judgments} == {"lenient", "gpu-strict"}
    assert {j.checker for j in seen[e].judgments} == {"gpu-strict", "web-only"}
    with factory() as db:
        idle = reclaimer.idle_of(db, a, at(100), SETTINGS)
    assert (idle["checker"], idle["timeout"], idle["reclaim_at"]) == (
        "gpu-strict",
        120.0,
        at(120).isoformat(),
    )
    picked = to_reclaim(factory, 121)
    assert picked[a].judgment.checker == "gpu-strict" and picked[e].judgment.checker == "web-only"


def test_batch_sessions_are_never_reclaimed_for_idleness(factory):
    set_policy(factory, idle_timeout=60, max_session_lifetime=7200)
    checker(
        factory,
        name="strict",
        kind="activity",
        options={"timeout": 30},
        bindings=[{"scope": "domain", "name": "acme"}],
    )
    b = running(factory, type_="batch")
    i = running(factory, since=0.5)
    seen = judged(factory, 3600)
    assert [j.reason for j in seen[b].judgments] == ["lifetime"]
    assert sid_reason(to_reclaim(factory, 3600), i) == "idle-timeout" and b not in to_reclaim(factory, 3600)
    assert sid_reason(to_reclaim(factory, 7200), b) == "lifetime"


def sid_reason(picked, sid):
    return picked[sid].judgment.reason if sid in picked else None


def test_contention_only_reclaims_when_a_waiting_session_needs_the_share(factory):
    checker(
        factory,
        name="share-when-needed",
        kind="activity",
        options={"timeout": 60, "only_when_queue_waiting": True},
        bindings=[{"scope": "project", "name": "acme/ml"}],
    )
    holder = running(factory, gpu=1)
    running(factory, user="erin", project="beta/web", cpu=8, since=0.5)  # every core, not bound
    assert holder not in to_reclaim(factory, 600)  # idle, but nobody waits
    with factory() as db:
        row = reclaimer.preview(db, CLI, at(600), SETTINGS)["sessions"]
    assert [(r["session"], r["would_reclaim"]) for r in row] == [(holder, False)]
    with database.session_scope(factory) as db:
        small = sessions.admit(db, CLI, {"project": "acme/ml", "username": "bob", "slots": {"cpu": 1}})
        assert small.status == "PENDING"  # waits for a core: the holder's release gives none
    assert holder not in to_reclaim(factory, 600)
    with database.session_scope(factory) as db:
        waiting = sessions.admit(db, CLI, {"project": "acme/ml", "username": "bob", "slots": {"gpu": 1}})
        assert waiting.status == "PENDING"
        wid = waiting.id
    picked = to_reclaim(factory, 600)
    assert picked[holder].waiting == wid
    with factory() as db:
        assert db.get(ComputeSession, holder).status == "RUNNING"  # deciding changed nothing


def test_utilization_reads_the_trusted_samples(factory):
    checker(
        factory,
        name="cpu-idle",
        kind="utilization",
        options={"window": 300, "grace": 60, "thresholds": {"cpu_util": 10}},
        bindings=[{"scope": "domain", "name": "acme"}],
    )
    sleeper = running(factory, cpu=2)
    burner = running(factory, user="bob", cpu=2, since=0.5)
    rows = []
    for t in range(0, 901, 15):
        rows.append({"session_id": sleeper, "at": at(t), "cpu_total": 0.01 * t, "mem": 1e8})
        rows.append({"session_id": burner, "at": at(t), "cpu_total": 1.5 * t, "mem": 1e8})
    with database.session_scope(factory) as db:
        db.execute(insert(UsageSample), rows)
    picked = to_reclaim(factory, 900)
    assert sid_reason(picked, sleeper) == "idle-utilization" and burner not in picked
    assert "cpu_util 0.5 % < 10 %" in picked[sleeper].judgment.detail


async def test_reclaim_audits_keeps_its_reason_and_counts(factory):
    set_policy(factory, idle_timeout=60)
    sid = running(factory)
    asked, counted = [], []

    async def stop_server(user, server):
        asked.append((user, server))
        with database.session_scope(factory) as db:  # the spawner's report of the stop
            sessions.update_status(db, HUB, sid, {"status": "TERMINATED", "reason": "stopped"})
        return True

    log = logging.getLogger("test")
    assert await reclaimer.reclaim(factory, stop_server, SETTINGS, log, counted.append, now=at(30)) == []
    done = await reclaimer.reclaim(factory, stop_server, SETTINGS, log, counted.append, now=at(61))
    assert (
        [d.subject.id for d in done] == [sid] and asked == [("alice", "s0.0")] and counted == ["idle-timeout"]
    )
    with factory() as db:
        s = db.get(ComputeSession, sid)
        assert s.status == "TERMINATED" and s.status_reason.startswith("idle-timeout: no activity for 61 s")
        entry = db.scalars(select(AuditEntry).where(AuditEntry.action == "session.reclaim")).one()
        assert entry.target == sid and entry.details["checker"] == "policy" and entry.target_domain == "acme"
    assert await reclaimer.reclaim(factory, stop_server, SETTINGS, log, counted.append, now=at(200)) == []


async def test_a_stop_the_hub_refuses_is_tried_again(factory):
    set_policy(factory, idle_timeout=60)
    sid = running(factory)
    answers = [False, True]

    async def stop_server(user, server):
        return answers.pop(0)

    log = logging.getLogger("test")
    assert await reclaimer.reclaim(factory, stop_server, SETTINGS, log, now=at(61)) == []
    with factory() as db:
        assert db.get(ComputeSession, sid).status == "RUNNING"  # not left TERMINATING for ever
    done = await reclaimer.reclaim(factory, stop_server, SETTINGS, log, now=at(62))
    assert [d.subject.id for d in done] == [sid] and answers == []


async def test_a_server_still_starting_is_not_interrupted(factory):
    """The Hub says the session's server is still starting (its spawn pending): stopping it would
    interrupt the spawn (the Hub answers its request 500); the next tick, once it is up, reclaims."""
    set_policy(factory, idle_timeout=60)
    sid = running(factory)
    states = ["spawn", "ready"]
    stopped = []

    async def server_state(user, server):
        return states.pop(0)

    async def stop_server(user, server):
        stopped.append((user, server))
        return True

    log = logging.getLogger("test")
    assert (
        await reclaimer.reclaim(factory, stop_server, SETTINGS, log, now=at(61), server_state=server_state)
        == []
    )
    with factory() as db:
        assert db.get(ComputeSession, sid).status == "RUNNING" and stopped == []
    done = await reclaimer.reclaim(factory, stop_server, SETTINGS, log, now=at(62), server_state=server_state)
    assert [d.subject.id for d in done] == [sid] and stopped == [("alice", "s0.0")] and states == []


def test_who_may_define_checkers_and_bad_definitions(factory):
    act = {"kind": "activity", "options": {"timeout": 60}}
    made = checker(
        factory, CAROL, name="acme-rule", bindings=[{"scope": "project", "name": "acme/ml"}], **act
    )
    assert made["owner_domain"] == "acme"
    with database.session_scope(factory) as db:
        for actor, body, error in [
            (
                CAROL,
                {"name": "x1", "bindings": [{"scope": "resource_group", "name": "default"}], **act},
                Forbidden,
            ),
            (CAROL, {"name": "x2", "bindings": [{"scope": "domain", "name": "beta"}], **act}, Forbidden),
            (MONA, {"name": "x3", **act}, Forbidden),
            (ALICE, {"name": "x4", **act}, Forbidden),
            (CLI, {"name": "acme-rule", **act}, Conflict),
            (CLI, {"name": "x5", "bindings": [{"scope": "domain", "name": "nowhere"}], **act}, InvalidInput),
            (CLI, {"name": "x6", "bindings": [{"scope": "galaxy", "name": "a"}], **act}, InvalidInput),
            (
                CLI,
                {
                    "name": "x7",
                    "kind": "utilization",
                    "options": {"window": -1, "thresholds": {"cpu_util": 5}},
                },
                InvalidInput,
            ),
            (
                CLI,
                {
                    "name": "x8",
                    "kind": "utilization",
                    "options": {"window": 60, "thresholds": {"gpu_util": 101}},
                },
                InvalidInput,
            ),
            (CLI, {"name": "x9", "kind": "sleepy", "options": {}}, InvalidInput),
        ]:
            with pytest.raises(error):
                rules.create(db, actor, body)
        with pytest.raises(Forbidden):
            rules.update(db, DAVE, "acme-rule", {"description": "mine now"})
        with pytest.raises(Forbidden):
            rules.list_checkers(db, ALICE)
        assert [c.name for c in rules.list_checkers(db, MONA)] == ["acme-rule"]
        rules.update(db, CAROL, "acme-rule", {"options": {"timeout": 90}})
        assert rules.get_checker(db, DAVE, "acme-rule").options["timeout"] == 90.0
        rules.delete(db, CAROL, "acme-rule")
    with factory() as db:
        actions = list(db.scalars(select(AuditEntry.action).where(AuditEntry.action.like("idle-checker.%"))))
        assert actions == ["idle-checker.create", "idle-checker.update", "idle-checker.delete"]


def test_the_preview_is_scoped_to_a_domain_admins_domain(factory):
    set_policy(factory, idle_timeout=60)
    a = running(factory)
    e = running(factory, user="erin", project="beta/web", since=0.5)
    with factory() as db:
        everything = {r["session"] for r in reclaimer.preview(db, MONA, at(100), SETTINGS)["sessions"]}
        theirs = {r["session"] for r in reclaimer.preview(db, DAVE, at(100), SETTINGS)["sessions"]}
        with pytest.raises(Forbidden):
            reclaimer.preview(db, ALICE, at(100), SETTINGS)
    assert everything == {a, e} and theirs == {e}


def test_the_cli_makes_lists_previews_and_deletes_checkers(factory, capsys, monkeypatch):
    from labfleet.cli.app import main

    url = str(factory.kw["bind"].url)
    monkeypatch.setenv("LABFLEET_IDLE_TIMEOUT", "0")
    a = running(factory, since=-86400)  # a day before T0: in the past whatever the clock says
    main(
        [
            "idle-checker", "create", "acme-1s", "--kind", "activity", "--options", '{"timeout": 1}',
            "--bind", "domain:acme", "--db-url", url,
        ]
    )  # fmt: skip
    assert capsys.readouterr().out == "Made idle checker acme-1s (activity, 1 binding(s)).\n"
    main(["idle-checker", "list", "--json", "--db-url", url])
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["bindings"] == [{"scope": "domain", "name": "acme"}] and listed["options"]["timeout"] == 1.0
    main(["idle-checker", "preview", "--json", "--db-url", url])
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["session"], row["checker"], row["would_reclaim"]) == (a, "acme-1s", True)
    for bad, message in [
        (["--kind", "activity", "--options", "{timeout}"], "--options: not JSON"),
        (["--kind", "activity", "--options", '{"timeout": 1}', "--bind", "acme"], "SCOPE:NAME"),
        (
            ["--kind", "utilization", "--options", '{"window": 60, "thresholds": {"mem": 400}}'],
            "percent from 0 to 100",
        ),
    ]:
        with pytest.raises(SystemExit) as e:
            main(["idle-checker", "create", "bad", *bad, "--db-url", url])
        assert e.value.code == 2 and message in capsys.readouterr().err
    main(["idle-checker", "delete", "acme-1s", "--db-url", url])
    assert capsys.readouterr().out == "Deleted idle checker acme-1s.\n"
    with factory() as db:
        assert rules.list_checkers(db, CLI) == []
