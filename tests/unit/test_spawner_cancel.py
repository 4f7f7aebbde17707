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

from labfleet.hub.client import Reply
from labfleet.spawner.mixin import LabfleetSpawnerMixin


class QueuedSpawner:
    """The mixin's start and release, against a service where the session waits and a release is slow."""

    start = LabfleetSpawnerMixin.start
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
        self.log = logging.getLogger("test")
        self.calls: list[tuple[str, str, Any]] = []
        self.queued = asyncio.Event()  # it asked where its session stands: it waits in the queue

    def _lf_admission_body(self, options: Any) -> dict[str, Any]:
        return {}

    async def lf_call(self, method: str, path: str, body: Any = None) -> Reply:
        self.calls.append((method, path, body))
        if method == "GET":
            self.queued.set()
        if method == "PATCH":
            await asyncio.sleep(self.release_takes)
        return Reply(201 if method == "POST" else 200, {"id": "s1", "status": "PENDING"})


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
