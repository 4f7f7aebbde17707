"""Measured enforcement of fractional GPUs, the backstop: which sessions hold more of a device's
memory than their share, and what to do about it.  Plain values in, plain values out.

MPS limits and framework memory caps hold a well-behaved session to its fraction; a session that
walks around them (a second process, a framework that ignores the cap) is caught here, from the
trusted sampler's per-process readings (:mod:`labfleet.usage.sampler`), and acted on by the
service (:mod:`labfleet.usage.enforce`).

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
- On a node run by an agent, a ``kill`` is **queued** for the node (:class:`AgentKills`): handed over
  in each answer to its agent's heartbeat (``kill``: session, pid, the process's start time) until
  the agent reports what it did (``kill_reports``), at most :data:`KILL_HANDOVERS` times; a kill not
  reported by then, or whose session no longer runs on the node, is given up with the reason.  A
  report is taken only for a kill queued for that very node, session, pid and start time: anything
  else an agent says about kills is ignored.  A repeat is safe: the agent kills a pid only while it
  still has that start time (a reused pid is another process).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from labfleet.core.bootstrap import GPU_OVERUSE_POLICIES
from labfleet.core.errors import InvalidInput
from labfleet.core.validate import check_bool, check_fields, check_int, check_session_id, check_text
from labfleet.usage.sampler import same_start

TOLERANCE_FRACTION = 0.05  # of the share's bytes
TOLERANCE_FLOOR = 256 * 2**20  # bytes: the least tolerance, whatever the share
DEFAULT_TICKS = 2  # consecutive sampler ticks over the allowance before the service acts
ACTIONS = ("warn", "kill", "stop")  # what a policy comes to (auto is kill or warn)
KILL_HANDOVERS = 3  # heartbeat answers that carry an agent's kill before it is given up unreported
MAX_KILL_REPORTS = 1024  # in one heartbeat


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


# ---------------------------------------------------------------- kills on nodes run by an agent


@dataclass(frozen=True)
class KillReport:
    """What a node agent says it did with one kill it was handed (untrusted until matched)."""

    session_id: str
    pid: int
    started: float  # the start time the kill was handed with
    killed: bool
    cmdline: str = ""
    mem_bytes: int | None = None  # the agent's last reading of the process (the audit keeps the judged one)
    error: str | None = None  # why it was not killed


@dataclass
class AgentKill:
    """One decision's kills, queued for the agent of the session's node until it reports them.

    ``context``: what the service needs to write it up once done (opaque here)."""

    node: str
    session_id: str
    victims: tuple[Proc, ...]
    context: Any = None
    reports: dict[int, KillReport] = field(default_factory=dict)  # by pid
    handed: int = 0  # heartbeat answers it went out in

    @property
    def done(self) -> bool:
        return all(p.pid in self.reports for p in self.victims)

    def unreported(self) -> tuple[Proc, ...]:
        return tuple(p for p in self.victims if p.pid not in self.reports)

    def give_up(self, why: str) -> None:
        """Every kill not reported yet: not killed, for ``why``."""
        for p in self.unreported():
            self.reports[p.pid] = KillReport(self.session_id, p.pid, p.started or 0.0, False, "", None, why)


@dataclass
class AgentKills:
    """The kills queued for node agents.  The service keeps them in memory: a restart loses them,
    which is acceptable (the next ticks judge the session again, in a new episode)."""

    handovers: int = KILL_HANDOVERS
    pending: list[AgentKill] = field(default_factory=list)

    def queue(self, node: str, session_id: str, victims: Iterable[Proc], context: Any = None) -> AgentKill:
        """Queue a decision's kills; one of unknown start cannot be told from a reused pid: given up
        at once.  The caller writes it up at once when it is already ``done``."""
        order = AgentKill(node, session_id, tuple(victims), context)
        for p in order.victims:
            if p.started is None:
                order.reports[p.pid] = KillReport(
                    session_id,
                    p.pid,
                    0.0,
                    False,
                    "",
                    None,
                    "its start time is unknown: its pid could be reused",
                )
        if not order.done:
            self.pending.append(order)
        return order

    def report(self, node: str, reports: Iterable[KillReport]) -> tuple[list[AgentKill], list[KillReport]]:
        """Take ``node``'s agent's reports: (the kills now done, the reports ignored: no such kill
        queued for this node, or already reported)."""
        ignored = []
        for r in reports:
            order = next(
                (
                    o
                    for o in self.pending
                    if o.node == node
                    and o.session_id == r.session_id
                    and any(p.pid == r.pid and same_start(p.started, r.started) for p in o.unreported())
                ),
                None,
            )
            if order is None:
                ignored.append(r)
            else:
                order.reports[r.pid] = r
        return self._take_done(), ignored

    def hand_over(self, node: str, live: Collection[str]) -> tuple[list[dict[str, Any]], list[AgentKill]]:
        """The kills to hand ``node``'s agent in this heartbeat's answer, and those given up now:
        their session no longer runs there (``live``: the sessions it holds), or they went out
        :attr:`handovers` times with no report."""
        out: list[dict[str, Any]] = []
        for o in self.pending:
            if o.node != node:
                continue
            if o.session_id not in live:
                o.give_up(f"the session no longer ran on node {node} when its agent was to kill")
            elif o.handed >= self.handovers:
                o.give_up(f"node {node}'s agent did not report the kill in {o.handed} heartbeats")
            else:
                o.handed += 1
                out += [
                    {"session": o.session_id, "pid": p.pid, "create_time": p.started} for p in o.unreported()
                ]
        return out, self._take_done()

    def sweep(self, live: Collection[tuple[str, str]]) -> list[AgentKill]:
        """Give up the kills whose session no longer runs on their node (``live``: (node, session)
        pairs), e.g. the node went LOST and its sessions ended: those kills, done."""
        for o in self.pending:
            if (o.node, o.session_id) not in live:
                o.give_up(f"the session no longer runs on node {o.node}")
        return self._take_done()

    def sessions(self) -> set[str]:
        return {o.session_id for o in self.pending}

    def _take_done(self) -> list[AgentKill]:
        done = [o for o in self.pending if o.done]
        self.pending = [o for o in self.pending if not o.done]
        return done


def parse_kill_reports(raw: Any) -> list[KillReport]:
    """A heartbeat's ``kill_reports``, checked whole (InvalidInput for anything malformed)."""
    if not isinstance(raw, list) or len(raw) > MAX_KILL_REPORTS:
        raise InvalidInput(f"kill_reports must be a list of at most {MAX_KILL_REPORTS} objects")
    out = []
    for i, item in enumerate(raw):
        where = f"kill_reports[{i}]"
        r = check_fields(
            item,
            required=["session", "pid", "create_time", "killed"],
            optional=["cmdline", "mem_bytes", "error"],
            what=where,
        )
        started = r["create_time"]
        if isinstance(started, bool) or not isinstance(started, (int, float)) or not 0 <= started < 1e11:
            raise InvalidInput(f"{where}.create_time must be the process's start time (epoch seconds)")
        mem, error = r.get("mem_bytes"), r.get("error")
        out.append(
            KillReport(
                session_id=check_session_id(r["session"], f"{where}.session"),
                pid=check_int(r["pid"], f"{where}.pid", minimum=1, maximum=2**22),
                started=float(started),
                killed=check_bool(r["killed"], f"{where}.killed"),
                cmdline=check_text(r.get("cmdline") or "", f"{where}.cmdline", 4096)[:500],
                mem_bytes=check_int(mem, f"{where}.mem_bytes", maximum=2**62) if mem is not None else None,
                error=check_text(error, f"{where}.error", 1000) if error is not None else None,
            )
        )
    return out
