"""Measured enforcement of fractional GPUs, the backstop: which sessions hold more of a device's
memory than their share, and what to do about it.  Plain values in, plain values out.

MPS limits and framework memory caps hold a well-behaved session to its fraction; a session that
walks around them (a second process, a framework that ignores the cap) is caught here, from the
trusted sampler's per-process readings (:mod:`hub_ext.usage.sampler`), and acted on by the
service (:mod:`hub_ext.usage.enforce`).

The rules:

- Only a session holding a **fraction** of a device (``0 < share < 1``) is judged; a session
  holding whole devices owns all of their memory.
- Its **allowance** on the device is its share of the device's memory
  (``share x memory_bytes``) plus a **tolerance**: 5 % of that share
  (:data:`TOLERANCE_FRACTION`), at least 256 MiB (:data:`TOLERANCE_FLOOR`: a CUDA context alone
  is a few hundred MiB, so a small share must not be judged for its context).
- It is **over** its share when its processes on the device together hold more than the allowance
  at :data:`DEFAULT_TICKS` (2) consecutive sampler ticks.  A tick where its memory on the device
  cannot be told (``None``) or is within the allowance ends the run.
- The **action** is the resource group's ``gpu_overuse`` policy: ``warn``, ``kill``, ``stop``, or
  ``auto`` (the default): ``kill`` when another session holds a share of the same device (it is
  taking their memory), ``warn`` when the session is alone on it (nobody is hurt yet).
- ``kill`` picks the session's processes on the device that **started last**, newest first, until
  what the rest hold fits the share itself (without the tolerance): :func:`victims`.
- Once per **episode**: a (session, device) acted on is not acted on again until a tick finds it
  no longer over (:class:`Watch`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from hub_ext.core.bootstrap import GPU_OVERUSE_POLICIES

TOLERANCE_FRACTION = 0.05  # of the share's bytes
TOLERANCE_FLOOR = 256 * 2**20  # bytes: the least tolerance, whatever the share
DEFAULT_TICKS = 2  # consecutive sampler ticks over the allowance before the service acts
ACTIONS = ("warn", "kill", "stop")  # what a policy comes to (auto is kill or warn)


@dataclass(frozen=True)
class Proc:
    """One of the session's processes on the device."""

    pid: int
    mem_bytes: int  # device memory it holds (a process the driver gives no figure for holds 0 here)
    started: float | None  # epoch seconds (None: unknown; chosen after every known one)


@dataclass(frozen=True)
class Holding:
    """A session's fraction of one device at one tick, with what its processes hold on it."""

    session_id: str
    uuid: str
    share: float  # the fraction of the device it holds (0..1)
    device_bytes: int  # the device's memory
    policy: str  # the resource group's gpu_overuse
    shared: bool  # another live session holds a share of the same device
    used_bytes: int | None  # what its processes hold on the device (None: cannot tell)
    processes: tuple[Proc, ...] = ()

    @property
    def key(self) -> tuple[str, str]:
        return (self.session_id, self.uuid)


@dataclass(frozen=True)
class Allowance:
    share_bytes: int  # the share of the device's memory
    tolerance: int

    @property
    def limit(self) -> int:
        return self.share_bytes + self.tolerance


@dataclass(frozen=True)
class Decision:
    """Act on ``holding``: ``action`` (warn, kill or stop), with the processes to kill."""

    holding: Holding
    action: str
    allowance: Allowance
    ticks: int  # consecutive ticks it has been over
    victims: tuple[Proc, ...] = ()


@dataclass
class Watch:
    """What the service remembers between ticks: consecutive ticks over, and the episodes acted on."""

    ticks: int = DEFAULT_TICKS
    over: dict[tuple[str, str], int] = field(default_factory=dict)
    acted: set[tuple[str, str]] = field(default_factory=set)


def judged(share: float) -> bool:
    """Whether a holding of ``share`` of a device is judged at all (only a fraction is)."""
    return 0 < share < 1


def allowance(share: float, device_bytes: int) -> Allowance:
    """The share of the device's memory, and the tolerance on top of it."""
    share_bytes = int(share * device_bytes)
    return Allowance(share_bytes, max(int(TOLERANCE_FRACTION * share_bytes), TOLERANCE_FLOOR))


def action_for(policy: str, shared: bool) -> str:
    """What the group's policy does to a session over its share (an unknown policy: auto)."""
    if policy in ACTIONS and policy in GPU_OVERUSE_POLICIES:
        return policy
    return "kill" if shared else "warn"


def victims(processes: Iterable[Proc], keep_within: int) -> tuple[Proc, ...]:
    """The processes to kill, newest first, until what the rest hold is at most ``keep_within``.

    Processes of an unknown start come after every known one; equal starts, the higher pid first."""
    order = sorted(
        processes,
        key=lambda p: (p.started is not None, p.started or 0.0, p.pid),
        reverse=True,
    )
    rest = sum(p.mem_bytes for p in order)
    chosen: list[Proc] = []
    for p in order:
        if rest <= keep_within:
            break
        chosen.append(p)
        rest -= p.mem_bytes
    return tuple(chosen)


def judge(holdings: Iterable[Holding], watch: Watch) -> list[Decision]:
    """One tick: the decisions to carry out now; ``watch`` is brought up to this tick.

    A key not seen at this tick (the session ended or gave the device back) is forgotten."""
    over: dict[tuple[str, str], int] = {}
    out: list[Decision] = []
    for h in holdings:
        if not judged(h.share) or h.used_bytes is None:
            continue
        a = allowance(h.share, h.device_bytes)
        if h.used_bytes <= a.limit:
            continue
        n = over[h.key] = watch.over.get(h.key, 0) + 1
        if n < watch.ticks or h.key in watch.acted:
            continue
        action = action_for(h.policy, h.shared)
        chosen = victims(h.processes, a.share_bytes) if action == "kill" else ()
        out.append(Decision(h, action, a, n, chosen))
    watch.over = over
    watch.acted = {k for k in watch.acted if k in over} | {d.holding.key for d in out}
    return out
