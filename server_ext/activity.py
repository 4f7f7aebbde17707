"""The session's activity, reported to the labfleet service: what its ``activity`` idle checker judges.

JupyterHub's own single-user servers tell the Hub when they were last used (``notify_activity`` in
``jupyterhub.singleuser.extension``, every ``$JUPYTERHUB_ACTIVITY_INTERVAL``). Every interactive labfleet
session does the same towards the labfleet service, every ``$LABFLEET_ACTIVITY_INTERVAL`` seconds (default
60), with ``POST <service>/sessions/<id>/activity``:

- ``last_activity``: jupyter-server's own notion (``ServerApp.web_app.last_activity()``): the server's start,
  API requests, kernel messages and shutdowns, terminals;
- ``busy_kernels``: how many of its kernels compute now (``execution_state == "busy"``). A kernel that
  computes with nobody connected is activity, although nothing reaches the server.

The service (``labfleet.reclaim``) takes the latest of the report, the user's "I'm still here" and the start;
a report older than about three intervals no longer vouches for a busy kernel, so a report goes out every
interval even when nothing changed. A kernel turning busy or idle is reported at once as well, at most once
every :data:`CHANGE_GAP` seconds: kernels' state changes are watched through their ``execution_state`` trait,
which the kernel manager sets from the kernels' status messages (no polling, no extra connection).

The reporter never raises into the server: a service that does not take reports is logged when that starts
(and when the reason changes) and once when it takes them again, not at every interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
import weakref
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from .calls import SessionCalls, quoted

ENV = "LABFLEET_ACTIVITY_INTERVAL"
DEFAULT_INTERVAL = 60.0  # seconds; the service's report interval has the same default and variable
MIN_INTERVAL = 1.0
# The least time between two reports prompted by kernels turning busy or idle: a notebook running many quick
# cells toggles its kernel's state many times a second, and the service only needs to hear the gist.
CHANGE_GAP = 2.0


def activity_interval(
    environ: Mapping[str, str] | None = None, log: logging.Logger | logging.LoggerAdapter | None = None
) -> float:
    """Seconds between two reports: ``$LABFLEET_ACTIVITY_INTERVAL``, a number of seconds, at least
    :data:`MIN_INTERVAL`. Unset: :data:`DEFAULT_INTERVAL`; anything else (not a number, below the minimum,
    infinite) is logged and the default is used: a typo must not silence the reports, nor flood the
    service."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV, "").strip()
    if not raw:
        return DEFAULT_INTERVAL
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= MIN_INTERVAL):
        if log is not None:
            log.warning(
                "labfleet: %s=%r is not a number of seconds >= %g: reporting activity every %gs",
                ENV,
                raw[:40],
                MIN_INTERVAL,
                DEFAULT_INTERVAL,
            )
        return DEFAULT_INTERVAL
    return value


def iso_utc(t: datetime) -> str:
    """An instant as the service reads it (ISO 8601, UTC, with a Z); a naive time is taken as UTC, which
    is what jupyter-server's ``utcnow()`` gives."""
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _kernels(kernel_manager: Any) -> list[Any]:
    """The kernel manager's kernels (their managers), now; none when it cannot say."""
    if kernel_manager is None:
        return []
    try:
        ids = list(kernel_manager.list_kernel_ids())
    except Exception:
        return []
    out = []
    for kid in ids:
        try:
            out.append(kernel_manager.get_kernel(kid))
        except KeyError:  # shut down in between
            continue
    return out


def busy_kernels(kernel_manager: Any) -> int:
    """How many of the kernel manager's kernels compute now (``execution_state == "busy"``)."""
    return sum(1 for k in _kernels(kernel_manager) if getattr(k, "execution_state", None) == "busy")


class ActivityReporter:
    """Reports this session's activity to the labfleet service, on a clock and when kernels turn busy or idle.

    ``last_activity`` gives jupyter-server's last activity (``web_app.last_activity``); ``kernel_manager`` is
    the server's (its kernels' ``execution_state`` is counted and watched). :meth:`start` in the server's
    event loop, :meth:`stop` when the server stops.
    """

    def __init__(
        self,
        calls: SessionCalls,
        session_id: str,
        *,
        last_activity: Callable[[], datetime | None],
        kernel_manager: Any,
        interval: float,
        log: logging.Logger | logging.LoggerAdapter,
        change_gap: float = CHANGE_GAP,
    ) -> None:
        self.calls = calls
        self.session_id = session_id
        self.last_activity = last_activity
        self.kernel_manager = kernel_manager
        self.interval = interval
        self.change_gap = min(change_gap, interval)
        self.log = log
        self.reports = 0  # reports the service took
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._last_sent = 0.0  # time.monotonic() of the last report (tried)
        self._busy_sent: int | None = None  # busy_kernels in the last report
        self._trouble: str | None = None  # why reports are not taken now (logged once), None while they are
        self._watched: weakref.WeakSet[Any] = weakref.WeakSet()

    # -- one report ----------------------------------------------------------------------------------------

    def body(self) -> dict[str, Any]:
        """What one report says, now."""
        body: dict[str, Any] = {"busy_kernels": busy_kernels(self.kernel_manager)}
        last = self.last_activity()
        if last is not None:
            body["last_activity"] = iso_utc(last)
        return body

    async def report(self) -> bool:
        """Send one report now; whether the service took it. Never raises (but for cancellation)."""
        self._changed.clear()
        self._last_sent = time.monotonic()
        try:
            body = self.body()
            self._busy_sent = body["busy_kernels"]
            got = await self.calls.service("POST", f"sessions/{quoted(self.session_id)}/activity", body)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a bug here must not stop the reports, nor reach the server
            self._not_taken(f"error: {err!r:.200}", exc_info=True)
            return False
        if got.ok:
            self.reports += 1
            if self._trouble is not None:
                self.log.info("labfleet: the labfleet service takes activity reports again")
                self._trouble = None
            self.log.debug("labfleet: activity reported: %s", body)
            return True
        # 409: the session is not RUNNING (yet, or any more): expected around its start and its end.
        self._not_taken(f"{got.status}: {got.message}", level=logging.INFO if got.status == 409 else None)
        return False

    def _not_taken(self, why: str, level: int | None = None, exc_info: bool = False) -> None:
        """Log why a report was not taken, once for each new reason (the service being down for an hour
        must not write a line every interval)."""
        if why == self._trouble:
            self.log.debug("labfleet: activity report not taken (%s)", why)
            return
        self._trouble = why
        self.log.log(
            logging.WARNING if level is None else level,
            "labfleet: the labfleet service did not take this session's activity report (%s); "
            "retrying every %gs, logged again when that changes",
            why,
            self.interval,
            exc_info=exc_info,
        )

    # -- kernels turning busy or idle ----------------------------------------------------------------------

    def _watch_kernels(self, change: Any = None) -> None:
        """Watch the ``execution_state`` of kernels not watched yet. Called at start and whenever the kernel
        manager records a kernel message (its ``last_kernel_activity`` changes before the kernel's state
        does, so a new kernel is watched before its first change). A kernel shut down or dead while busy
        is not seen here: the next report on the clock counts it out."""
        for k in _kernels(self.kernel_manager):
            if k in self._watched:
                continue
            try:
                k.observe(self._state_changed, "execution_state")
            except Exception:  # not a traitlets kernel manager (a gateway's): the clock's reports only
                continue
            self._watched.add(k)

    def _state_changed(self, change: Any = None) -> None:
        """A kernel's state changed: wake the loop when the number of busy kernels differs from the last
        report."""
        if busy_kernels(self.kernel_manager) != self._busy_sent:
            self._changed.set()

    # -- the loop ------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start reporting (in the server's running event loop): the first report one interval from now,
        since the service counts the session's start itself."""
        if self._task is not None:
            return
        self._last_sent = time.monotonic()
        self._busy_sent = busy_kernels(self.kernel_manager)
        km = self.kernel_manager
        if km is not None and hasattr(km, "observe"):
            try:
                km.observe(self._watch_kernels, "last_kernel_activity")
            except Exception:
                self.log.debug("labfleet: kernel activity not watched", exc_info=True)
        self._watch_kernels()
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        """Stop reporting (the server stops): the loop ends, a report in flight is dropped, no kernel is
        watched any more."""
        task, self._task = self._task, None
        km = self.kernel_manager
        with contextlib.suppress(Exception):
            km.unobserve(self._watch_kernels, "last_kernel_activity")
        for k in list(self._watched):
            with contextlib.suppress(Exception):
                k.unobserve(self._state_changed, "execution_state")
        self._watched = weakref.WeakSet()
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _run(self) -> None:
        while True:
            await self._until_due()
            await self.report()

    async def _until_due(self) -> None:
        """Wait until the next report is due: one interval after the last one, or sooner when the number of
        busy kernels changed, but not before ``change_gap`` after the last one."""
        while True:
            now = time.monotonic()
            due = self._last_sent + self.interval
            if now >= due:
                return
            if self._changed.is_set():
                soon = self._last_sent + self.change_gap
                if now >= soon:
                    return
                await asyncio.sleep(min(soon, due) - now)
                continue
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), due - now)
