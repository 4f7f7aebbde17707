"""The service's job loop (hub_ext/service/jobs.py): a failing job does not stop it, a job never
runs twice at once, a poke runs a job now. Real asyncio, short intervals, bounded waits."""

from __future__ import annotations

import asyncio
import logging

import pytest

from hub_ext.service.jobs import JobLoop


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
