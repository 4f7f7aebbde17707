"""The GPU share backstop at the edge (labfleet.usage.enforce), with the service's real pieces: a
real database, real processes measured by the trusted sampler through the mock device plugin
(``$LABFLEET_MOCK_GPU_USAGE`` names the per-process readings), the service's usage tick
(``jobs.account_usage``), real SIGKILLs.  The Hub's stop is a stand-in that records the call; a
node agent's side of a kill (labfleet.agent.app) is called in-process here, and a real agent under a
real Hub in tests/test_agent_hub.py."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterator

import psutil
import pytest
from sqlalchemy import select

from labfleet.agent.app import gpu_processes, kill_owned
from labfleet.compute import nodes, sessions
from labfleet.compute.devices.base import NodeInfo
from labfleet.compute.devices.mock import USAGE_ENV, MockPlugin
from labfleet.core import database
from labfleet.core.authz import Actor
from labfleet.core.errors import InvalidInput
from labfleet.core.models import AuditEntry, ComputeSession, Node, ResourceGroup
from labfleet.service import jobs
from labfleet.tenancy import directory
from labfleet.tenancy.policies import ensure_default_keypair_policy
from labfleet.usage import enforce, overuse, records
from labfleet.usage.sampler import GpuProcess, Sampler
from tests.dbfixture import fresh_db

CLI = Actor.cli()
GiB = 2**30
NODE = "gpu-node"
log = logging.getLogger("test-gpu-overuse")


@pytest.fixture
def world(tmp_path, monkeypatch):
    engine, factory = fresh_db(f"sqlite:///{tmp_path / 'lf.sqlite'}", tmp_path, monkeypatch)
    plugin = MockPlugin(devices=[{"model": "A100-80GB", "memory": "80g"}], node=NODE)
    with database.session_scope(factory) as db:
        ensure_default_keypair_policy(db)
        nodes.ensure_default_group(db)
        directory.create_domain(db, CLI, {"name": "acme"})
        directory.create_project(db, CLI, {"domain": "acme", "name": "ml"})
        for name in ("alice", "bob"):
            directory.create_user(db, CLI, {"username": name, "domain": "acme", "projects": ["ml"]})
        nodes.register_node(
            db, NodeInfo(name=NODE, cpu=16, mem=64 * GiB, devices=plugin.discover(), plugin="mock")
        )
    monkeypatch.setenv(USAGE_ENV, str(tmp_path / "usage.json"))
    yield factory, plugin, tmp_path / "usage.json"
    engine.dispose()


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        p.wait(timeout=10)


def sleeps(pid: int) -> list[psutil.Process]:
    """The ``sleep 600`` children of ``pid`` (the ``sleep 0.2`` between them comes and goes)."""
    out = []
    for k in psutil.Process(pid).children():
        try:
            if k.cmdline() == ["sleep", "600"]:
                out.append(k)
        except psutil.Error:
            continue
    return out


def session(factory, procs, user: str, name: str) -> tuple[str, list[int]]:
    """A RUNNING session of half the device whose server is a real process tree: (id, its two
    sleeps, the older first)."""
    with database.session_scope(factory) as db:
        s = sessions.admit(
            db, CLI, {"project": "acme/ml", "username": user, "name": name, "slots": {"gpu.shares": 0.5}}
        )
        assert s.status == "SCHEDULED", s.status_reason
        sid = s.id
    root = subprocess.Popen(["sh", "-c", "sleep 600 & sleep 0.2; sleep 600 & wait"], start_new_session=True)
    procs.append(root)
    deadline = time.monotonic() + 10
    while len(kids := sleeps(root.pid)) < 2:
        assert time.monotonic() < deadline, "the session's processes did not start"
        time.sleep(0.05)
    kids = sorted(kids, key=lambda k: k.create_time())
    with database.session_scope(factory) as db:
        s = db.get(ComputeSession, sid)
        sessions.set_status(s, "RUNNING", "")
        s.runtime = {"pid": root.pid}
    return sid, [k.pid for k in kids]


def readings(path, plugin, rows: list[tuple[int, int]]) -> None:
    (dev,) = plugin.discover()
    path.write_text(
        json.dumps({dev.uuid: {"processes": [{"pid": pid, "mem_used": mem} for pid, mem in rows]}})
    )


class Service:
    """The service's usage tick with its backstop, the Hub's stop recorded."""

    def __init__(self, factory, plugin, hub: bool = True, agent_kills=None) -> None:
        self.factory, self.sampler, self.watch = factory, Sampler([plugin]), overuse.Watch()
        self.agent_kills = agent_kills
        self.stopped: list[tuple[str, str]] = []
        self.counted: list[tuple[str, str]] = []
        self.acted: list[tuple[str, str]] = []
        self.hub = hub

    async def stop_server(self, user: str, server: str) -> bool:
        self.stopped.append((user, server))
        return True

    async def _enforce(self, got) -> None:
        self.acted += await enforce.enforce(
            self.factory,
            got,
            self.watch,
            node_name=NODE,
            stop_server=self.stop_server if self.hub else None,
            log=log,
            observe=lambda action, group: self.counted.append((action, group)),
            agent_kills=self.agent_kills,
        )

    async def tick(self, agent_readings=()) -> list[tuple[str, str]]:
        before = len(self.acted)
        await jobs.account_usage(
            self.factory,
            self.sampler,
            NODE,
            log,
            max_gap=30,
            retention_days=1,
            agent_readings=agent_readings,
            enforce=self._enforce,
        )
        return self.acted[before:]


def audits(factory, sid: str) -> list[dict]:
    with factory() as db:
        rows = db.scalars(
            select(AuditEntry).where(AuditEntry.action == enforce.AUDIT_ACTION, AuditEntry.target == sid)
        ).all()
        return [dict(r.details or {}) for r in rows]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def reason(factory, sid: str) -> tuple[str, str]:
    with factory() as db:
        s = db.get(ComputeSession, sid)
        return s.status, s.status_reason


async def test_over_its_share_on_a_shared_device_its_newest_process_is_killed(world, procs):
    factory, plugin, usage = world
    a, (a_old, a_new) = session(factory, procs, "alice", "big")
    b, (b_old, _) = session(factory, procs, "bob", "small")
    # a's share: 40 GiB (+2 GiB tolerance); it holds 30 + 20. b holds 10 of its 40.
    readings(usage, plugin, [(a_old, 30 * GiB), (a_new, 20 * GiB), (b_old, 10 * GiB)])
    svc = Service(factory, plugin)
    assert await svc.tick() == []  # one sample over: not yet
    assert await svc.tick() == [(a, "kill")]
    deadline = time.monotonic() + 10
    while not gone(a_new):
        assert time.monotonic() < deadline, "the newest process was not killed"
        await asyncio.sleep(0.05)
    assert not gone(a_old) and not gone(b_old)  # the rest of the session runs on, the other untouched
    (entry,) = audits(factory, a)
    assert entry["action"] == "kill" and entry["used_bytes"] == 50 * GiB
    assert entry["share_bytes"] == 40 * GiB and entry["shared_device"] is True
    assert entry["killed"] == [{"pid": a_new, "cmdline": "sleep 600", "mem_bytes": 20 * GiB}]
    status, why = reason(factory, a)
    assert status == "RUNNING" and why.startswith("gpu-overuse kill:") and f"{a_new} (sleep 600" in why
    assert svc.counted == [("kill", "default")]
    # Once per episode: the next tick (still reading the dead pid) does nothing more
    assert await svc.tick() == []
    readings(usage, plugin, [(a_old, 30 * GiB), (b_old, 10 * GiB)])
    assert await svc.tick() == [] and audits(factory, b) == [] and reason(factory, b) == ("RUNNING", "")


async def test_stop_policy_stops_the_session_through_the_hub_with_the_reason(world, procs):
    factory, plugin, usage = world
    with database.session_scope(factory) as db:
        nodes.update_group(db, CLI, "default", {"gpu_overuse": "stop"})
    a, (a_old, a_new) = session(factory, procs, "alice", "big")
    readings(usage, plugin, [(a_old, 30 * GiB), (a_new, 20 * GiB)])
    svc = Service(factory, plugin)
    await svc.tick()
    assert await svc.tick() == [(a, "stop")]
    assert svc.stopped == [("alice", "big")]
    status, why = reason(factory, a)
    assert status == "TERMINATING" and why.startswith("gpu-overuse:") and "stopped" in why
    assert not gone(a_new)  # stop goes through the Hub; nothing is killed here
    (entry,) = audits(factory, a)
    assert entry["action"] == "stop" and entry["policy"] == "stop"
    assert svc.counted == [("stop", "default")]


async def test_stop_policy_without_a_hub_warns_and_says_why(world, procs):
    factory, plugin, usage = world
    with database.session_scope(factory) as db:
        nodes.update_group(db, CLI, "default", {"gpu_overuse": "stop"})
    a, (a_old, a_new) = session(factory, procs, "alice", "big")
    readings(usage, plugin, [(a_old, 30 * GiB), (a_new, 20 * GiB)])
    svc = Service(factory, plugin, hub=False)
    await svc.tick()
    assert await svc.tick() == [(a, "warn")] and svc.stopped == []
    (entry,) = audits(factory, a)
    assert entry["wanted"] == "stop" and "no Hub" in entry["why_not"]
    assert reason(factory, a)[0] == "RUNNING"


async def test_alone_on_its_device_it_is_warned_not_touched(world, procs):
    factory, plugin, usage = world
    a, (a_old, a_new) = session(factory, procs, "alice", "big")
    readings(usage, plugin, [(a_old, 30 * GiB), (a_new, 20 * GiB)])
    svc = Service(factory, plugin)
    await svc.tick()
    assert await svc.tick() == [(a, "warn")]
    assert not gone(a_old) and not gone(a_new) and svc.stopped == []
    status, why = reason(factory, a)
    assert status == "RUNNING" and why.startswith("gpu-overuse warning:")
    (entry,) = audits(factory, a)
    assert entry["action"] == "warn" and entry["used_bytes"] == 50 * GiB and "wanted" not in entry
    assert svc.counted == [("warn", "default")]
    # A warning is no reason the session's end keeps (only the service's stop is)
    with database.session_scope(factory) as db:
        sessions.update_status(db, CLI, a, {"status": "TERMINATED", "reason": "the user stopped it"})
    assert reason(factory, a) == ("TERMINATED", "the user stopped it")


async def test_under_its_share_nothing_happens(world, procs):
    factory, plugin, usage = world
    a, (a_old, a_new) = session(factory, procs, "alice", "big")
    b, (b_old, _) = session(factory, procs, "bob", "small")
    # 41 GiB: over the 40 GiB share, within the 2 GiB tolerance
    readings(usage, plugin, [(a_old, 30 * GiB), (a_new, 11 * GiB), (b_old, 40 * GiB)])
    svc = Service(factory, plugin)
    for _ in range(3):
        assert await svc.tick() == []
    assert audits(factory, a) == audits(factory, b) == [] and svc.counted == []
    assert reason(factory, a) == ("RUNNING", "") and not gone(a_new)


def agent_node(factory) -> list:
    """Make NODE an agent's node; the targets its agent samples."""
    with database.session_scope(factory) as db:
        db.scalar(select(Node).where(Node.name == NODE)).agent_token_id = 1
        return records.targets_on(db, NODE)


class AgentSide:
    """What the agent does with its sampler's readings and the kills a heartbeat's answer hands it
    (labfleet.agent.app), and the service's side of each heartbeat (the handler's calls)."""

    def __init__(self, svc: Service, targets) -> None:
        self.svc, self.targets, self.known, self.reports = svc, targets, {}, []
        self.counted: list[tuple[str, str]] = []

    def sample(self) -> list:
        got = self.svc.sampler.sample(self.targets)
        self.known = gpu_processes(got)
        return got

    def beat(self, live=None) -> list[dict]:
        """One heartbeat: the reports go up (checked as the handler does), the kills come down and
        are carried out; what was handed over."""
        reports = overuse.parse_kill_reports(json.loads(json.dumps(self.reports)))
        live = [t.session_id for t in self.targets] if live is None else live
        handed, done = enforce.agent_heartbeat(self.svc.agent_kills, NODE, reports, live, log=log)
        enforce.finish_agent_kills(
            self.svc.factory, done, log=log, observe=lambda a, g: self.counted.append((a, g))
        )
        handed = json.loads(json.dumps(handed))  # over the wire
        self.reports = [kill_owned((k["session"], k["pid"], k["create_time"]), self.known) for k in handed]
        return handed


async def test_on_an_agent_s_node_kill_is_handed_to_its_agent_and_written_up_on_its_report(world, procs):
    factory, plugin, usage = world
    a, (a_old, a_new) = session(factory, procs, "alice", "big")
    b, (b_old, _) = session(factory, procs, "bob", "small")
    readings(usage, plugin, [(a_old, 30 * GiB), (a_new, 20 * GiB), (b_old, GiB)])
    svc = Service(factory, plugin, agent_kills=overuse.AgentKills())
    agent = AgentSide(svc, agent_node(factory))
    assert agent.beat() == []  # nothing queued yet
    for _ in range(2):
        got = await svc.tick(agent_readings=agent.sample())  # what the agent sent
    assert got == [] and not gone(a_new)  # queued, not done: nothing written yet
    assert audits(factory, a) == [] and svc.counted == []
    started = psutil.Process(a_new).create_time()
    # The answer to the agent's next heartbeat hands the kill over; the agent kills
    assert agent.beat() == [{"session": a, "pid": a_new, "create_time": started}]
    deadline = time.monotonic() + 10
    while not gone(a_new):
        assert time.monotonic() < deadline, "the agent did not kill the newest process"
        await asyncio.sleep(0.05)
    assert not gone(a_old) and not gone(b_old) and audits(factory, a) == []
    # Its report comes up with the next heartbeat: written up as a kill on the service's node is
    assert agent.beat() == []
    (entry,) = audits(factory, a)
    assert entry["action"] == "kill" and entry["node"] == NODE and entry["not_killed"] == []
    assert entry["killed"] == [{"pid": a_new, "cmdline": "sleep 600", "mem_bytes": 20 * GiB}]
    status, why = reason(factory, a)
    assert status == "RUNNING" and why.startswith("gpu-overuse kill:") and f"{a_new} (sleep 600" in why
    assert agent.counted == [("kill", "default")] and svc.counted == []
    # The same report again (its answer was lost, say), or one for a kill never queued: ignored
    agent.reports = [
        {"session": a, "pid": a_new, "create_time": started, "killed": True, "cmdline": "x"},
        {"session": b, "pid": b_old, "create_time": 1.0, "killed": True, "cmdline": "forged"},
    ]
    assert agent.beat() == [] and len(audits(factory, a)) == 1 and audits(factory, b) == []
    assert reason(factory, b) == ("RUNNING", "") and not gone(b_old)


async def test_an_agent_s_kill_unreported_or_of_an_ended_session_is_given_up_and_audited(world, procs):
    factory, plugin, usage = world
    a, (a_old, a_new) = session(factory, procs, "alice", "big")
    b, (b_old, b_new) = session(factory, procs, "bob", "small")
    readings(usage, plugin, [(a_old, 30 * GiB), (a_new, 20 * GiB), (b_old, 30 * GiB), (b_new, 20 * GiB)])
    svc = Service(factory, plugin, agent_kills=overuse.AgentKills())
    agent = AgentSide(svc, agent_node(factory))
    for _ in range(2):
        got = await svc.tick(agent_readings=agent.sample())
    assert got == [] and len(svc.agent_kills.pending) == 2
    # An agent that never reports (the answers are lost, or it is older than the service): handed
    # over 3 times, then given up
    for _ in range(3):
        assert {
            k["session"] for k in enforce.agent_heartbeat(svc.agent_kills, NODE, [], [a, b], log=log)[0]
        } == {
            a,
            b,
        }
    # b's session ends meanwhile: the next usage tick gives its kill up
    with database.session_scope(factory) as db:
        sessions.update_status(db, CLI, b, {"status": "TERMINATED", "reason": "the user stopped it"})
    await svc.tick(agent_readings=agent.sample())
    (entry,) = audits(factory, b)
    assert entry["killed"] == [] and [k["pid"] for k in entry["not_killed"]] == [b_new]
    assert "no longer runs on node" in entry["not_killed"][0]["error"]
    assert reason(factory, b) == ("TERMINATED", "the user stopped it")  # its end keeps its reason
    handed, done = enforce.agent_heartbeat(svc.agent_kills, NODE, [], [a], log=log)
    assert handed == [] and [o.session_id for o in done] == [a]
    enforce.finish_agent_kills(factory, done, log=log)
    (entry,) = audits(factory, a)
    assert entry["not_killed"] == [
        {"pid": a_new, "cmdline": "", "error": f"node {NODE}'s agent did not report the kill in 3 heartbeats"}
    ]
    assert reason(factory, a)[1].startswith("gpu-overuse kill:") and not gone(a_new)
    assert svc.agent_kills.pending == [] and svc.counted == [("kill", "default")]


def test_the_agent_kills_only_a_process_of_the_session_with_its_start_time(procs):
    root = subprocess.Popen(["sh", "-c", "sleep 600 & wait"], start_new_session=True)
    procs.append(root)
    deadline = time.monotonic() + 10
    while not (kids := sleeps(root.pid)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pid, started = kids[0].pid, kids[0].create_time()
    known = {"s1": {pid: GpuProcess(pid, GiB, started)}}
    for key, known_, error in (
        (("s2", pid, started), known, "the session was not sampled running on this node"),
        (("s1", pid + 1, started), known, "the pid is not one of the session's processes on its devices"),
        (("s1", pid, started - 5), known, "the pid is not one of the session's processes on its devices"),
        # the sampler saw the pid with another start: it was reused since
        (("s1", pid, started - 5), {"s1": {pid: GpuProcess(pid, GiB, started - 5)}}, "its pid now belongs"),
    ):
        report = kill_owned(key, known_)
        assert report["killed"] is False and report["error"].startswith(error), report
    assert not gone(pid)
    report = kill_owned(("s1", pid, started), known)
    assert report == {
        "session": "s1",
        "pid": pid,
        "create_time": started,
        "killed": True,
        "cmdline": "sleep 600",
        "mem_bytes": GiB,
        "error": None,
    }
    deadline = time.monotonic() + 10
    while not gone(pid):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    again = kill_owned(("s1", pid, started), known)
    assert again["killed"] is False and again["error"] == "it had already exited"


def test_a_bad_policy_is_refused_naming_the_choices_and_changes_nothing(world):
    factory, _, _ = world
    for body in ({"gpu_overuse": "nuke"}, {"gpu_overuse": None}, {"gpu_overuse": 1}):
        with pytest.raises(InvalidInput) as e, database.session_scope(factory) as db:
            nodes.update_group(db, CLI, "default", {"description": "changed", **body})
        assert (
            e.value.status == 400 and "gpu_overuse must be one of auto, warn, kill, stop" in e.value.message
        )
        with pytest.raises(InvalidInput), database.session_scope(factory) as db:
            nodes.create_group(db, CLI, {"name": "new", **body})
    with factory() as db:
        g = db.scalar(select(ResourceGroup).where(ResourceGroup.name == "default"))
        assert (g.gpu_overuse, g.description) == (
            "auto",
            "The Hub host and the nodes nobody assigned elsewhere",
        )
        assert db.scalar(select(ResourceGroup).where(ResourceGroup.name == "new")) is None
        assert nodes.group_view(g)["gpu_overuse"] == "auto"
    with database.session_scope(factory) as db:
        assert (
            nodes.group_view(nodes.update_group(db, CLI, "default", {"gpu_overuse": "warn"}))["gpu_overuse"]
            == "warn"
        )
