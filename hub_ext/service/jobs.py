"""The service's clock: plain job functions, driven by one periodic loop.

Jobs (see ``LabfleetService.start_async``):

- ``schedule``: serve every resource group's queue, so a pending timeout fires on time and a
  session waits no longer than it must when capacity comes from outside a request (a node
  registered, a limit raised with the CLI). Poked at once after every committed write of the API.
- ``housekeeping``: expire idle uploads, purge old trash, rescan the folders.
- ``reconcile``: make sessions agree with the Hub's servers (at start, then on a clock): statuses
  follow what the Hub reports, and slots held with no server go back after a grace period.
- ``usage``: sample this node's sessions from outside them (in a worker thread) and accrue every
  session's usage records (labfleet.usage.records); then act on the sessions over their share of
  a device's memory (labfleet.usage.enforce).
- ``nodes``: mark LOST the agent nodes that missed their heartbeats; their sessions end in ERROR
  (labfleet.compute.agents), their slots go back and the Hub is asked to stop their servers.
- ``parent``: stop the service when the Hub that started it is gone (a killed Hub's service must
  not keep the port from the next Hub's).

A job that raises is logged and runs again at its next tick; a job never runs twice at once
(a poke while it runs makes it run once more right after).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from sqlalchemy.orm import Session, sessionmaker

from labfleet.compute import agents, reconcile, sessions
from labfleet.core import audit, database
from labfleet.core.authz import Actor
from labfleet.core.models import ResourceGroup
from labfleet.usage import records
from labfleet.usage.sampler import Reading, Sampler

# ---------------------------------------------------------------- the jobs


# Told (resource group, seconds waited) of the sessions a committed unit of work placed from a queue.
QueueWaits = Callable[[list[tuple[str, float]]], None]


def serve_queues(
    session_factory: sessionmaker[Session], log: logging.Logger, observe_waits: QueueWaits | None = None
) -> list[str]:
    """Serve the queue of every group where a session waits, one transaction per group.

    Returns the ids of the sessions scheduled; cancellations (pending timeouts) are logged; once
    each group's transaction has committed, ``observe_waits`` hears how long its placed sessions waited."""
    with database.session_scope(session_factory) as db:
        group_ids = sessions.groups_with_queue(db)
    scheduled: list[str] = []
    for group_id in group_ids:
        with database.session_scope(session_factory) as db:
            group = db.get(ResourceGroup, group_id)
            if group is None:
                continue
            served = sessions.schedule_group(db, group)
            name = group.name
        waits = sessions.take_queue_waits(db)
        if observe_waits is not None and waits:
            observe_waits(waits)
        scheduled += served.scheduled
        if served.scheduled:
            log.info("Queue of %s: scheduled %s", name, ", ".join(served.scheduled))
        if served.cancelled:
            log.info("Queue of %s: cancelled %s (pending timeout)", name, ", ".join(served.cancelled))
    return scheduled


async def account_usage(
    session_factory: sessionmaker[Session],
    sampler: Sampler,
    node_name: str,
    log: logging.Logger,
    *,
    max_gap: float,
    retention_days: int,
    agent_readings: Sequence[Reading] = (),
    enforce: Callable[[Sequence[Reading]], Awaitable[Any]] | None = None,
) -> records.Accrued:
    """One usage tick: read what runs on ``node_name`` (unless an agent samples it), sample it off
    the event loop, accrue, with the readings node agents sent since the last tick; then
    ``enforce`` (the GPU share backstop) hears every reading."""
    with database.session_scope(session_factory) as db:
        targets = [] if agents.has_agent(db, node_name) else records.targets_on(db, node_name)
    readings = (
        await asyncio.get_running_loop().run_in_executor(None, sampler.sample, targets) if targets else []
    )
    readings = [*readings, *agent_readings]
    for r in readings:
        if not r.alive and r.error:
            log.debug("Usage: session %s not sampled: %s", r.session_id, r.error)
    with database.session_scope(session_factory) as db:
        done = records.accrue(db, readings, max_gap=max_gap, retention_days=retention_days)
    if done.started or done.finished or done.purged:
        log.info(
            "Usage: %d session(s) accounted from now on, %d finished, %d bucket(s) written, %d purged",
            len(done.started),
            len(done.finished),
            done.buckets,
            done.purged,
        )
    if enforce is not None:
        await enforce(readings)
    return done


class HubServers(Protocol):
    """What reconciling reads of the Hub (``HubSync``): None where the Hub could not be read."""

    async def servers(self) -> dict[tuple[str, str], str] | None: ...

    async def user_servers(self, user: str) -> dict[str, str] | None: ...


async def reconcile_sessions(
    session_factory: sessionmaker[Session],
    hub: HubServers,
    log: logging.Logger,
    grace: float = reconcile.RECONCILE_GRACE,
    now: datetime | None = None,
    observe_waits: QueueWaits | None = None,
    stop_orphans: tuple[StopServer, reconcile.OrphanWatch] | None = None,
) -> list[reconcile.Fix] | None:
    """Make labfleet's sessions agree with the Hub's servers (:func:`reconcile.plan_reconcile`).

    ``stop_orphans``: how to stop a Hub server, and the memory of orphans; a server the Hub runs
    with no live session (:func:`reconcile.orphan_servers`) is stopped once it has been one for the
    grace period, and audited (``server.stop_orphan``).

    Before slots go back, the Hub is asked again about each user whose session would lose them (a
    user may have moved between pages of the list while it was read); a user it cannot tell about
    keeps everything.  Returns the changes made; None if the Hub could not be read (nothing changes).
    Slots given back serve their group's queue: ``observe_waits`` hears how long the sessions placed
    then waited.
    """
    servers = await hub.servers()
    if servers is None:
        log.warning("Could not read the Hub's servers: sessions not reconciled")
        return None
    with database.session_scope(session_factory) as db:
        planned = reconcile.plan_reconcile(reconcile.live_sessions(db, now), servers, grace)
    confirmed = set()
    for user in sorted({f.user for f in planned if f.releases}):
        again = await hub.user_servers(user)
        servers = {k: v for k, v in servers.items() if k[0] != user}
        if again is None:
            servers.update({(user, f.server): reconcile.UNKNOWN for f in planned if f.user == user})
        else:
            servers.update({(user, name): state for name, state in again.items()})
            confirmed.add(user)
    with database.session_scope(session_factory) as db:
        fixes = reconcile.reconcile(db, servers, grace, now, release_users=confirmed)
    waits = sessions.take_queue_waits(db)
    if observe_waits is not None and waits:
        observe_waits(waits)
    for f in fixes:
        log.info(
            "Reconciled session %s (%s/%s) with the Hub: %s -> %s: %s",
            f.session_id,
            f.user,
            f.server,
            f.old,
            f.status,
            f.reason,
        )
    if stop_orphans is not None:
        await _stop_orphans(session_factory, servers, log, grace, now, *stop_orphans)
    return fixes


async def _stop_orphans(
    session_factory: sessionmaker[Session],
    servers: dict[tuple[str, str], str],
    log: logging.Logger,
    grace: float,
    now: datetime | None,
    stop_server: StopServer,
    watch: reconcile.OrphanWatch,
) -> None:
    now = now or datetime.now(timezone.utc)
    with database.session_scope(session_factory) as db:
        orphans = reconcile.orphan_servers(reconcile.live_sessions(db, now), servers)
    await stop_orphan_servers(session_factory, watch.due(orphans, now, grace), stop_server, log)


async def stop_orphan_servers(
    session_factory: sessionmaker[Session],
    orphans: Sequence[tuple[str, str]],
    stop_server: StopServer,
    log: logging.Logger,
    actor: Actor | None = None,
    via: str = "reconcile",
) -> dict[tuple[str, str], bool]:
    """Ask the Hub to stop each (user, server name) of ``orphans``, servers found running no live
    session, and audit each (``server.stop_orphan``, by ``actor``: the service itself by default;
    ``via``: what found it). Returns whether each stop was accepted."""
    done = {}
    for user, server in orphans:
        label = f"{user}/{server}" if server else f"{user}'s default server"
        log.warning("The Hub runs %s, which holds no live session: stopping it", label)
        stopped = await stop_server(user, server)
        with database.session_scope(session_factory) as db:
            audit.record(
                db,
                actor or Actor.cli(),
                "server.stop_orphan",
                f"{user}/{server}",
                details={"user": user, "server": server, "stopped": stopped, "via": via},
                success=stopped,
            )
        done[(user, server)] = stopped
    return done


StopServer = Callable[[str, str], Awaitable[bool]]


async def watch_nodes(
    session_factory: sessionmaker[Session],
    stop_server: StopServer | None,
    log: logging.Logger,
    *,
    heartbeat: float,
    lost_after: int,
    since: datetime | None = None,
    now: datetime | None = None,
    observe_waits: QueueWaits | None = None,
) -> dict[str, list[agents.LostSession]]:
    """Mark LOST the agent nodes that missed ``lost_after`` heartbeats (:func:`agents.judge`), one
    transaction each: their sessions end in ERROR and give their slots back, the queues are served;
    then the Hub is asked to stop those sessions' servers. ``since``: the service's start (heartbeats
    missed before it do not count). Returns {node: its sessions ended}."""
    now = now or datetime.now(timezone.utc)
    with database.session_scope(session_factory) as db:
        names = agents.judge(agents.node_beats(db), now, heartbeat, lost_after, since)
    out: dict[str, list[agents.LostSession]] = {}
    for name in names:
        with database.session_scope(session_factory) as db:
            lost = agents.mark_lost(db, name, now, heartbeat, lost_after, since)
        waits = sessions.take_queue_waits(db)
        if observe_waits is not None and waits:
            observe_waits(waits)
        if lost is None:
            continue
        out[name] = lost
        log.warning(
            "Node %s is LOST (no heartbeat for %g s): %d session(s) ended in ERROR: %s",
            name,
            heartbeat * lost_after,
            len(lost),
            ", ".join(s.id for s in lost) or "none",
        )
        for s in lost:
            if stop_server is not None and not await stop_server(s.user, s.server):
                log.info(
                    "The Hub did not stop server %r of %s (session %s, node lost)", s.server, s.user, s.id
                )
    return out


def parent_changed(parent_pid: int) -> bool:
    """Whether the process that started this one is gone (its children are handed to another)."""
    return os.getppid() != parent_pid


# ---------------------------------------------------------------- the loop

NEVER = float("inf")  # the due time of a job that runs only when poked


@dataclass
class Job:
    name: str
    interval: float  # seconds between two runs; 0: only when poked
    run: Callable[[], Awaitable[Any]]
    due: float = 0.0  # monotonic time of the next run
    running: bool = False
    again: bool = False  # poked while running: run once more right after
    runs: int = 0
    failures: int = 0
    last_error: str = ""


@dataclass
class JobLoop:
    """Runs each job every ``interval`` seconds, and at once when poked; one loop for all of them."""

    log: logging.Logger
    jobs: dict[str, Job] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()

    def add(
        self, name: str, interval: float, run: Callable[[], Awaitable[Any]], *, first_in: float | None = None
    ):
        """Add a job; its first run is ``first_in`` seconds from now (default: one interval)."""
        if first_in is None and not interval:
            due = NEVER
        else:
            due = time.monotonic() + (interval if first_in is None else first_in)
        self.jobs[name] = Job(name, interval, run, due=due)
        self._wake.set()

    def poke(self, name: str) -> None:
        """Run ``name`` as soon as possible (after its current run, if it is running)."""
        job = self.jobs.get(name)
        if job is None:
            return
        if job.running:
            job.again = True
        else:
            job.due = time.monotonic()
            self._wake.set()

    async def run_job(self, job: Job) -> None:
        job.running = True
        try:
            while True:
                job.again = False
                try:
                    await job.run()
                except Exception as e:  # keep the loop alive; the next tick tries again
                    job.failures += 1
                    job.last_error = f"{type(e).__name__}: {e}"
                    self.log.exception("Job %s failed (it runs again in %ss)", job.name, job.interval)
                job.runs += 1
                if not job.again:
                    break
        finally:
            job.running = False
            job.due = time.monotonic() + job.interval if job.interval else NEVER
            self._wake.set()

    async def run_forever(self) -> None:
        while True:
            self._wake.clear()
            now = time.monotonic()
            for job in self.jobs.values():
                if not job.running and job.due <= now:
                    task = asyncio.ensure_future(self.run_job(job))
                    self._tasks.add(task)  # a reference, so the task is not collected mid-run
                    task.add_done_callback(self._tasks.discard)
            idle = [j.due for j in self.jobs.values() if not j.running]
            wait = max(0.0, min(idle, default=60.0) - time.monotonic())
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=min(wait, 60.0))
            except asyncio.TimeoutError:
                pass

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
