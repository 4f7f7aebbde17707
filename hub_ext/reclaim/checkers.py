"""Idle checkers' judgments: plain values in, plain values out (no DB, no clock, no Hub).

Three checkers, as Backend.AI has them, in one engine (:mod:`labfleet.reclaim.reclaimer`):

- ``activity`` (:func:`judge_activity`): no activity for ``timeout`` seconds. Activity is the
  session's own report (jupyter-server's last activity: API requests, kernel and terminal traffic,
  and a kernel that is computing counts as activity now, whether anyone is connected or not), its
  user's "I'm still here", and its start; whichever is latest.
- ``utilization`` (:func:`judge_utilization`): the trusted samples (labfleet.usage.sampler) averaged
  over ``window`` seconds are under the thresholds (percent of what the session was given:
  ``cpu_util``, ``mem``, ``gpu_util``, ``gpu_mem``), all of them (``combine: and``) or any
  (``or``); a resource the session was not given is not looked at; nothing is judged in the first
  ``grace`` seconds, nor before the samples cover the window.
- ``lifetime`` (:func:`judge_lifetime`): the keypair policy's max session lifetime.

:func:`parse_options` checks a checker definition (InvalidInput, a 400, for anything wrong).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from labfleet.core.errors import InvalidInput
from labfleet.core.models import IDLE_CHECKER_KINDS, RECLAIM_REASONS

MAX_SECONDS = 366 * 86400
# Seconds a session's server may take from RUNNING to its first report before its idle clock runs
# (JupyterHub gives a server 30 s to answer by default; a loaded node is slower still).
STARTUP_ALLOWANCE = 60.0
THRESHOLDS = ("cpu_util", "mem", "gpu_util", "gpu_mem")
REASONS = RECLAIM_REASONS
_OPTIONS = {
    "activity": {"timeout", "only_when_queue_waiting"},
    "utilization": {"window", "grace", "thresholds", "combine", "only_when_queue_waiting"},
}


def _seconds(value: Any, name: str, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise InvalidInput(f"{name} must be a number of seconds, not {value!r:.40}")
    if value < minimum or value > MAX_SECONDS:
        raise InvalidInput(f"{name} must be from {minimum:g} to {MAX_SECONDS} seconds, not {value:g}")
    return float(value)


def parse_options(kind: Any, options: Any) -> dict[str, Any]:
    """A checker's options, checked and with their defaults; InvalidInput with a message otherwise.

    activity: ``timeout`` (seconds, > 0); utilization: ``window`` (> 0), ``grace`` (>= 0, default
    0), ``thresholds`` (a mapping of cpu_util, mem, gpu_util, gpu_mem to percents 0..100, at least
    one), ``combine`` (and | or, default and); both: ``only_when_queue_waiting`` (default false).
    """
    if kind not in IDLE_CHECKER_KINDS:
        raise InvalidInput(f"kind must be one of {', '.join(IDLE_CHECKER_KINDS)}, not {str(kind)[:40]!r}")
    if not isinstance(options, Mapping):
        raise InvalidInput("options must be an object")
    unknown = sorted(str(k) for k in options if k not in _OPTIONS[kind])
    if unknown:
        raise InvalidInput(
            f"unknown option(s) for a {kind} checker: {', '.join(unknown)[:100]}; "
            f"known: {', '.join(sorted(_OPTIONS[kind]))}"
        )
    contention = options.get("only_when_queue_waiting", False)
    if not isinstance(contention, bool):
        raise InvalidInput("only_when_queue_waiting must be true or false")
    if kind == "activity":
        if "timeout" not in options:
            raise InvalidInput("an activity checker needs a timeout (seconds)")
        return {"timeout": _seconds(options["timeout"], "timeout", 1), "only_when_queue_waiting": contention}
    if "window" not in options:
        raise InvalidInput("a utilization checker needs a window (seconds)")
    window = _seconds(options["window"], "window", 1)
    grace = _seconds(options.get("grace", 0), "grace", 0)
    combine = options.get("combine", "and")
    if combine not in ("and", "or"):
        raise InvalidInput(f"combine must be and or or, not {str(combine)[:20]!r}")
    thresholds = options.get("thresholds")
    if not isinstance(thresholds, Mapping) or not thresholds:
        raise InvalidInput(f"thresholds must be an object naming one or more of {', '.join(THRESHOLDS)}")
    checked: dict[str, float] = {}
    for name, value in thresholds.items():
        if name not in THRESHOLDS:
            raise InvalidInput(f"unknown threshold {str(name)[:40]!r}; known: {', '.join(THRESHOLDS)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
            raise InvalidInput(f"threshold {name} must be a percent from 0 to 100, not {value!r:.40}")
        checked[name] = float(value)
    return {
        "window": window,
        "grace": grace,
        "thresholds": checked,
        "combine": combine,
        "only_when_queue_waiting": contention,
    }


# ---------------------------------------------------------------- what a judgment looks at


@dataclass(frozen=True)
class Sample:
    """One trusted reading: ``cpu_total`` cumulative core-seconds, ``mem`` bytes, ``gpu`` devices'
    worth of busy time, ``gpu_mem`` bytes (None: not measured)."""

    at: datetime
    cpu_total: float | None = None
    mem: float | None = None
    gpu: float | None = None
    gpu_mem: float | None = None


@dataclass(frozen=True)
class Facts:
    """What the checkers know of one running session."""

    running_since: datetime
    last_activity: datetime | None = None  # the session's own report
    busy_kernels: int = 0
    reported_at: datetime | None = None
    still_here_at: datetime | None = None
    # what it was given: cores, bytes, devices' worth of shares, bytes of device memory
    alloc: Mapping[str, float] = field(default_factory=dict)
    samples: Sequence[Sample] = ()
    lifetime: float | None = None  # seconds, None: no max lifetime


@dataclass(frozen=True)
class Judgment:
    """One checker's view of one session: ``reclaim`` now or not; ``reclaim_at`` when it will be,
    if nothing changes (None: cannot tell); ``idle_for`` seconds; ``reason`` one of REASONS."""

    checker: str
    reason: str
    reclaim: bool
    idle_for: float
    timeout: float | None
    reclaim_at: datetime | None
    detail: str
    only_when_queue_waiting: bool = False


def last_active(f: Facts, now: datetime, stale_after: float) -> datetime:
    """The latest sign of life: the start, the session's report, "I'm still here", and now when a
    kernel is computing (as long as its report is fresh: a report older than ``stale_after``
    seconds is a session that stopped reporting, and its busy kernels are no longer believed).

    The start is when its server first reported: RUNNING comes when the server's process has
    started, and the server answers (and reports) seconds later, more on a loaded node. A session
    that has not reported yet is starting, up to ``STARTUP_ALLOWANCE`` after RUNNING (one whose
    server never reports is then judged from there)."""
    start = f.running_since
    if f.reported_at is None and f.last_activity is None:
        start += timedelta(seconds=STARTUP_ALLOWANCE)
    signs = [start, *(t for t in (f.last_activity, f.still_here_at) if t is not None)]
    if (
        f.busy_kernels > 0
        and f.reported_at is not None
        and (now - f.reported_at).total_seconds() <= stale_after
    ):
        signs.append(now)
    return max(signs)  # later than now while it is starting


def judge_activity(
    name: str, f: Facts, now: datetime, timeout: float, *, stale_after: float, contention: bool = False
) -> Judgment:
    since = last_active(f, now, stale_after)
    idle = max((now - since).total_seconds(), 0.0)
    at = since + timedelta(seconds=timeout)
    computing = f.busy_kernels > 0 and since == now
    detail = (
        "a kernel is computing" if computing else f"no activity for {idle:.0f} s (timeout {timeout:.0f} s)"
    )
    return Judgment(name, "idle-timeout", idle >= timeout, idle, timeout, at, detail, contention)


def _averages(samples: Sequence[Sample], start: datetime) -> dict[str, float]:
    """Each figure over the samples at or after ``start``: CPU from the counter's difference (cores),
    the others' mean; a figure not measured is left out."""
    inside = [s for s in samples if s.at >= start]
    out: dict[str, float] = {}
    cpu = [s for s in inside if s.cpu_total is not None]
    if len(cpu) >= 2:
        span = (cpu[-1].at - cpu[0].at).total_seconds()
        if span > 0:
            out["cpu"] = max(cpu[-1].cpu_total - cpu[0].cpu_total, 0.0) / span  # type: ignore[operator]
    for key in ("mem", "gpu", "gpu_mem"):
        values = [getattr(s, key) for s in inside if getattr(s, key) is not None]
        if values:
            out[key] = sum(values) / len(values)
    return out


_GIVEN = {
    "cpu_util": ("cpu", "cpu"),
    "mem": ("mem", "mem"),
    "gpu_util": ("gpu", "gpu.shares"),
    "gpu_mem": ("gpu_mem", "gpu_mem"),
}


def judge_utilization(
    name: str, f: Facts, now: datetime, options: Mapping[str, Any], *, interval: float
) -> Judgment:
    """Idle when the figures over the window are under the thresholds (see the module's doc)."""
    window, grace = float(options["window"]), float(options["grace"])
    contention = bool(options.get("only_when_queue_waiting"))
    up = (now - f.running_since).total_seconds()
    if up < grace:
        return Judgment(
            name,
            "idle-utilization",
            False,
            0.0,
            window,
            None,
            f"in its first {grace:.0f} s (grace)",
            contention,
        )
    start = now - timedelta(seconds=window)
    samples = sorted(f.samples, key=lambda s: s.at)
    # the window must be covered: a sample from its first interval on
    if not samples or samples[0].at > start + timedelta(seconds=max(interval, 1.0)) or up < window:
        return Judgment(
            name,
            "idle-utilization",
            False,
            0.0,
            window,
            None,
            "not enough samples for the window yet",
            contention,
        )
    avg = _averages(samples, start)
    below: list[bool] = []
    parts = []
    for threshold, limit in options["thresholds"].items():
        figure, slot = _GIVEN[threshold]
        given = f.alloc.get(slot, 0.0)
        if given <= 0 or figure not in avg:
            continue  # not given (or not measured): not looked at
        percent = 100.0 * avg[figure] / given
        below.append(percent < limit)
        parts.append(f"{threshold} {percent:.1f} % {'<' if percent < limit else '>='} {limit:g} %")
    if not below:
        return Judgment(
            name, "idle-utilization", False, 0.0, window, None, "nothing it was given is measured", contention
        )
    idle = all(below) if options["combine"] == "and" else any(below)
    detail = f"over the last {window:.0f} s: " + ", ".join(parts)
    return Judgment(
        name,
        "idle-utilization",
        idle,
        window if idle else 0.0,
        window,
        now if idle else None,
        detail,
        contention,
    )


def judge_lifetime(f: Facts, now: datetime) -> Judgment | None:
    if not f.lifetime:
        return None
    expires = f.running_since + timedelta(seconds=f.lifetime)
    up = max((now - f.running_since).total_seconds(), 0.0)
    return Judgment(
        "lifetime",
        "lifetime",
        now >= expires,
        up,
        f.lifetime,
        expires,
        f"ran {up:.0f} s of its max lifetime {f.lifetime:.0f} s",
    )


def first_to_reclaim(judgments: Iterable[Judgment]) -> Judgment | None:
    """The judgment that reclaims the session first: of those that reclaim now the one whose time came
    first, else the earliest ``reclaim_at``; None when none will."""
    items = list(judgments)
    now_ = [j for j in items if j.reclaim]
    timed = [j for j in items if j.reclaim_at is not None]
    if now_:
        return min(now_, key=lambda j: (j.reclaim_at is None, j.reclaim_at or datetime.min))
    return min(timed, key=lambda j: j.reclaim_at) if timed else None  # type: ignore[arg-type,return-value]
