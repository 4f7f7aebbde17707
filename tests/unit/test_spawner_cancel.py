"""A spawn the Hub interrupts while its session waits in the queue lets go at once.

The Hub cancels a pending spawn and stops its server one second later; a spawn still running by
then makes the stop fail, and its server stays a "ready" ghost nobody can stop or remove (seen with
many spawns queued, when giving the allocation back waited behind their polls).  So the spawner's
start ends as soon as it is cancelled, and the allocation goes back in a task of its own."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from jupyterhub.spawner import SpawnException

from labfleet.core.http import HTTPReply
from labfleet.spawner.mixin import LabfleetSpawnerMixin


class QueuedSpawner:
    """The mixin's start and release, against a service where the session waits and a release is slow."""

    start = LabfleetSpawnerMixin.start
    _lf_admit = LabfleetSpawnerMixin._lf_admit
    _lf_wait_for_placement = LabfleetSpawnerMixin._lf_wait_for_placement
    _lf_release_soon = LabfleetSpawnerMixin._lf_release_soon
    _lf_release = LabfleetSpawnerMixin._lf_release
    _lf_report = LabfleetSpawnerMixin._lf_report

    def __init__(self, release_takes: float) -> None:
        self.release_takes = release_takes
        self.lf_options = object()
        self.lf_exit = None
        self.lf_session = None
        self.lf_session_id = None
        self._lf_queue_message = ""
        self.queue_poll_interval = 0.01
        self.service_restart_wait = 5.0
        self._log_name = "alice/q"
        self.log = logging.getLogger("test")
        self.calls: list[tuple[str, str, Any]] = []
        self.queued = asyncio.Event()  # it asked where its session stands: it waits in the queue

    def _lf_admission_body(self, options: Any) -> dict[str, Any]:
        return {}

    async def lf_call(self, method: str, path: str, body: Any = None) -> HTTPReply:
        self.calls.append((method, path, body))
        if method == "GET":
            self.queued.set()
        if method == "PATCH":
            await asyncio.sleep(self.release_takes)
        return HTTPReply(201 if method == "POST" else 200, {"id": "s1", "status": "PENDING"})


async def test_a_queued_spawn_cancelled_by_the_hub_ends_at_once_and_still_gives_back():
    spawner = QueuedSpawner(release_takes=0.5)
    task = asyncio.ensure_future(spawner.start())
    await asyncio.wait_for(spawner.queued.wait(), 5)
    task.cancel()
    started = time.monotonic()
    try:
        await task
    except asyncio.CancelledError:
        pass
    assert task.cancelled()
    assert time.monotonic() - started < 0.1  # not after the release's half second
    release = [c for c in spawner.calls if c[0] == "PATCH"]
    assert release == [("PATCH", "/sessions/s1", {"status": "ERROR", "reason": release[0][2]["reason"]})]
    assert spawner.lf_session_id == "s1"  # given back later, in its own task
    await asyncio.sleep(0.7)
    assert spawner.lf_session_id is None


class AdmittingSpawner(QueuedSpawner):
    """The mixin's admission, against a service that answers nothing ``silent`` times, then ``answer``."""

    def __init__(self, silent: int, answer: int = 201, wait: float = 5.0) -> None:
        super().__init__(release_takes=0)
        self.silent = silent
        self.answer = answer
        self.service_restart_wait = wait

    async def lf_call(self, method: str, path: str, body: Any = None) -> HTTPReply:
        self.calls.append((method, path, body))
        if method == "POST" and self.silent:
            self.silent -= 1
            return HTTPReply(0, error="connection refused")
        if method == "POST" and self.answer >= 400:
            return HTTPReply(self.answer, {"status": self.answer, "message": "no room"})
        return HTTPReply(self.answer, {"id": body["id"], "status": "SCHEDULED"})


async def test_an_admission_with_no_answer_is_asked_again_with_the_same_id():
    spawner = AdmittingSpawner(silent=2)
    session = await spawner._lf_admit(object())
    posts = [c[2] for c in spawner.calls if c[0] == "POST"]
    assert len(posts) == 3
    assert len({p["id"] for p in posts}) == 1  # the service can tell it is the same request
    assert session["id"] == posts[0]["id"] == spawner.lf_session_id


async def test_a_refused_admission_holds_nothing_and_a_silent_service_fails_the_spawn_in_time():
    refused = AdmittingSpawner(silent=0, answer=409)
    try:
        await refused._lf_admit(object())
        raise AssertionError("a refusal must fail the spawn")
    except SpawnException as e:
        assert "no room" in str(e)
    assert refused.lf_session_id is None  # nothing to give back
    silent = AdmittingSpawner(silent=10**6, wait=0.3)
    started = time.monotonic()
    try:
        await silent._lf_admit(object())
        raise AssertionError("a service that never answers must fail the spawn")
    except SpawnException:
        pass
    assert time.monotonic() - started < 2
    # It may have admitted the session before it went quiet: the Hub's stop gives it back by id.
    assert silent.lf_session_id == silent.calls[0][2]["id"]
