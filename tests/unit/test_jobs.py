"""The service's job loop (hub_ext/service/jobs.py): a failing job does not stop it, a job never
runs twice at once, a poke runs a job now. Real asyncio, short intervals, bounded waits.
Reconciling with the Hub's servers as a pure decision, and the service's end with its parent."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from labfleet.compute.reconcile import (
    Fix,
    HubServer,
    LiveSession,
    OrphanWatch,
    orphan_servers,
    plan_reconcile,
)
from labfleet.core.http import HTTPReply
from labfleet.service.hubsync import HubSync
from labfleet.service.jobs import JobLoop, parent_changed

REPO = Path(__file__).resolve().parents[2]


async def _until(cond, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.01)):  # bounded: a condition never met fails the test
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not reached within {timeout}s")


@pytest.fixture
async def loop_runner():
    loops = []

    def start(loop: JobLoop) -> JobLoop:
        loops.append((loop, asyncio.ensure_future(loop.run_forever())))
        return loop

    yield start
    for loop, task in loops:
        task.cancel()
        await loop.stop()


async def test_a_job_that_raises_does_not_stop_the_loop(loop_runner, caplog):
    calls = {"flaky": 0, "steady": 0}

    async def flaky():
        calls["flaky"] += 1
        if calls["flaky"] == 1:
            raise RuntimeError("the Hub did not answer")

    async def steady():
        calls["steady"] += 1

    loop = JobLoop(logging.getLogger("test.jobs"))
    loop.add("flaky", 0.05, flaky)
    loop.add("steady", 0.05, steady)
    with caplog.at_level(logging.ERROR, logger="test.jobs"):
        loop_runner(loop)
        await _until(lambda: calls["flaky"] >= 3 and calls["steady"] >= 3)
    job = loop.jobs["flaky"]
    assert job.failures == 1 and "the Hub did not answer" in job.last_error
    assert any("Job flaky failed" in r.getMessage() for r in caplog.records)


async def test_a_job_never_runs_twice_at_once(loop_runner):
    running, most, runs = 0, 0, 0
    release = asyncio.Event()

    async def slow():
        nonlocal running, most, runs
        running += 1
        most = max(most, running)
        await release.wait()
        running -= 1
        runs += 1

    loop = loop_runner(JobLoop(logging.getLogger("test.jobs")))
    loop.add("slow", 0.01, slow, first_in=0)
    await _until(lambda: running == 1)
    for _ in range(5):  # ticks and pokes while it runs start nothing new...
        loop.poke("slow")
        await asyncio.sleep(0.03)
    assert most == 1 and runs == 0
    release.set()  # ...but the pokes make it run once more right after
    await _until(lambda: runs >= 2)
    assert most == 1


async def test_a_poke_runs_a_job_now_and_its_clock_goes_on(loop_runner):
    ran = []

    async def job():
        ran.append(asyncio.get_running_loop().time())

    loop = loop_runner(JobLoop(logging.getLogger("test.jobs")))
    loop.add("serve", 3600, job)  # an hour: only a poke runs it within this test
    await asyncio.sleep(0.05)
    assert ran == []
    loop.poke("serve")
    await _until(lambda: len(ran) == 1, timeout=1)
    await asyncio.sleep(0.1)
    assert len(ran) == 1  # and not again until its interval (or the next poke)
    loop.poke("serve")
    await _until(lambda: len(ran) == 2, timeout=1)
    loop.poke("no such job")  # ignored


async def test_a_job_added_later_wakes_the_loop(loop_runner):
    ran = asyncio.Event()

    async def job():
        ran.set()

    loop = loop_runner(JobLoop(logging.getLogger("test.jobs")))
    await asyncio.sleep(0.05)  # the loop sleeps with nothing to do
    loop.add("late", 0.05, job)
    await asyncio.wait_for(ran.wait(), 2)


# ---------------------------------------------------------------- reconciling with the Hub (pure)


def _live(sid, status, age=0.0, user="alice", server="a", created=0.0):
    return LiveSession(id=sid, user=user, server=server, status=status, created=created, age=age)


def _plan(live, servers, grace=120):
    return {f.session_id: (f.status, f.reason) for f in plan_reconcile(live, servers, grace)}


def test_statuses_follow_what_the_hub_reports():
    live = [
        _live("s1", "SCHEDULED", server="a"),
        _live("s2", "PREPARING", server="b"),
        _live("s3", "SCHEDULED", server="c"),
        _live("s4", "RUNNING", server="d"),
        _live("s5", "PENDING", server="e"),  # queued: its spawner waits, the Hub says "spawn"
        _live("s6", "PREPARING", server="f"),
        _live("s7", "RUNNING", server="g"),  # being stopped: its spawner releases it
    ]
    servers = {
        ("alice", "a"): "ready",
        ("alice", "b"): "ready",
        ("alice", "c"): "spawn",
        ("alice", "d"): "ready",
        ("alice", "e"): "spawn",
        ("alice", "f"): "spawn",
        ("alice", "g"): "stop",
    }
    plan = _plan(live, servers)
    assert {k: v[0] for k, v in plan.items()} == {"s1": "RUNNING", "s2": "RUNNING", "s3": "PREPARING"}
    assert plan["s1"][1] == "the Hub reports alice/a ready"


def test_a_ready_server_with_no_live_session_is_an_orphan_once_seen_for_the_grace_period():
    live = [_live("s1", "RUNNING", server="a"), _live("s2", "TERMINATING", server="b")]
    servers = {
        ("alice", "a"): "ready",
        ("alice", "b"): "ready",  # being reclaimed: its session is still live
        ("alice", "stray"): "ready",  # its session ended while it ran on
        ("alice", "going"): "stop",
        ("bob", ""): "ready",
        ("bob", "new"): "spawn",
        ("carol", "x"): "unknown",
    }
    assert orphan_servers(live, servers) == [("alice", "stray"), ("bob", "")]
    watch = OrphanWatch()
    t0 = datetime(2026, 11, 27, tzinfo=timezone.utc)
    assert watch.due([("alice", "stray"), ("bob", "")], t0, 120) == []
    assert watch.due([("alice", "stray")], t0 + timedelta(seconds=60), 120) == []  # bob's went
    later = t0 + timedelta(seconds=120)
    assert watch.due([("alice", "stray"), ("bob", "")], later, 120) == [("alice", "stray")]  # bob's anew


def test_the_hubs_servers_are_read_with_their_times_as_untrusted_values():
    """What recalculate-usage reports of an unaccounted server (issue 27): its state, and when it
    started and was last active where the Hub's list says so as text; anything else is None."""
    when = "2026-11-24T09:00:00.123456Z"
    pages = [
        [
            {
                "name": "alice",
                "servers": {
                    "": {"ready": True, "pending": None, "started": when, "last_activity": when},
                    "b": {"ready": False, "pending": "spawn", "started": None, "last_activity": 7},
                    "c": {"ready": False, "pending": None, "started": when},  # stopped: not listed
                    "d": "not a server model",
                    "e": {"ready": True, "started": "9" * 65, "last_activity": [when]},
                },
            },
            {"name": 7, "servers": {"x": {"ready": True}}},  # not a user name: skipped
            "not a user",
        ],
        [{"name": "bob", "servers": {"w": {"ready": True, "last_activity": when}}}],
        [],
    ]
    asked = []

    async def call(method, path, body=None, ok=(200,)):
        asked.append(path)
        return HTTPReply(200, pages[len(asked) - 1] if len(asked) <= len(pages) else [])

    hub = HubSync("http://hub/api", "token", None, logging.getLogger("test"))
    hub._call = call  # type: ignore[method-assign]
    want = {
        ("alice", ""): HubServer("ready", when, when),
        ("alice", "b"): HubServer("spawn"),
        ("alice", "e"): HubServer("ready"),
        ("bob", "w"): HubServer("ready", None, when),
    }
    assert asyncio.run(hub.server_list()) == want
    assert asked == [f"/users?state=active&offset={n}&limit=200" for n in (0, 3, 4)]
    asked.clear()
    assert asyncio.run(hub.servers()) == {key: s.state for key, s in want.items()}

    async def down(method, path, body=None, ok=(200,)):
        return HTTPReply(0, error="connection refused")

    hub._call = down  # type: ignore[method-assign]
    assert asyncio.run(hub.server_list()) is None and asyncio.run(hub.servers()) is None


def test_a_session_without_a_server_gives_its_slots_back_after_the_grace_period():
    live = [
        _live("young", "SCHEDULED", age=119, server="x"),
        _live("old", "RUNNING", age=121, server="y"),
        _live("queued", "PENDING", age=500, server="z"),
        _live("stopping", "TERMINATING", age=500, server=""),
    ]
    plan = _plan(live, {})
    assert {k: v[0] for k, v in plan.items()} == {
        "old": "TERMINATED",
        "queued": "CANCELLED",
        "stopping": "TERMINATED",
    }
    assert plan["old"][1].startswith("the Hub has no server alice/y")
    assert plan["stopping"][1].startswith("the Hub has no server alice's default server")
    # Another user's server of the same name is not this one's.
    assert (
        _plan([_live("old", "RUNNING", age=500, server="y")], {("bob", "y"): "ready"})["old"][0]
        == "TERMINATED"
    )
    # grace 0: at once
    assert set(_plan(live, {}, grace=0)) == {"young", "old", "queued", "stopping"}


def test_a_server_runs_its_newest_session_an_older_one_is_released():
    live = [
        _live("leaked", "SCHEDULED", age=300, created=1.0),
        _live("current", "PREPARING", age=1, created=2.0),
        _live("leaked-young", "RUNNING", age=10, created=0.5),
    ]
    plan = _plan(live, {("alice", "a"): "ready"})
    assert plan["current"][0] == "RUNNING"
    assert plan["leaked"] == (
        "TERMINATED",
        "alice/a runs a newer session (checked 300s after its last change)",
    )
    assert "leaked-young" not in plan


def test_nothing_changes_for_a_server_the_hub_could_not_tell_about():
    live = [_live("s1", "SCHEDULED", age=999), _live("s2", "RUNNING", age=999, created=-1)]
    assert _plan(live, {("alice", "a"): "unknown"}) == {}


def test_final_statuses_release():
    assert Fix("s", "u", "a", "RUNNING", "TERMINATED", "").releases
    assert Fix("s", "u", "a", "PENDING", "CANCELLED", "").releases
    assert not Fix("s", "u", "a", "SCHEDULED", "RUNNING", "").releases


# ---------------------------------------------------------------- the service does not outlive its Hub


def test_parent_changed():
    assert not parent_changed(os.getppid())
    assert parent_changed(os.getppid() + 1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_the_parent_death_signal_ends_a_child_whose_parent_is_killed(tmp_path):
    pidfile = tmp_path / "child.pid"
    child = (
        "import os, signal, sys, time; from labfleet.service.app import exit_with_parent_signal; "
        "assert exit_with_parent_signal(signal.SIGTERM); "
        f"open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    )
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(60)",
        ],
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 20
        while not (pidfile.exists() and pidfile.read_text()):
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.05)
        pid = int(pidfile.read_text())
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 5
        while _alive(pid):
            assert time.monotonic() < deadline, "the child outlived its parent"
            time.sleep(0.05)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        if pidfile.exists() and pidfile.read_text() and _alive(int(pidfile.read_text())):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Alive and not a zombie (the child is reparented: its new parent reaps it, maybe later)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
