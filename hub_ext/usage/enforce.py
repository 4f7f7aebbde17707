"""The backstop at the edge: act on the sessions :mod:`labfleet.usage.overuse` finds over their share
of a device's memory, at each usage tick of the service (after the readings are accrued).

Each action writes the audit entry ``session.gpu-overuse`` (``details.action``: warn, kill or stop,
with the numbers), puts what happened in the session's ``status_reason`` (what its owner reads in
``GET /api/sessions/<id>``, the Lab sidebar and the session's own info: ``gpu-overuse warning: ...``,
``gpu-overuse kill: ...``, or for a stop ``gpu-overuse: ...``, the reason its end keeps) and counts
it in the metric ``labfleet_gpu_overuse_total{action, resource_group}``:

- ``warn``: nothing else; the session runs on.
- ``kill``: SIGKILL to the chosen processes (a process is killed only when its pid still belongs to
  the process the sampler read, by its start time); each one audited with its pid, command line and
  device memory (``details.killed``, ``details.not_killed`` with why).  On the service's own node
  the service kills at once.  On a node run by an agent the kill is queued
  (:class:`labfleet.usage.overuse.AgentKills`, in the service's memory) and handed to the agent in
  its heartbeats' answers (:func:`agent_heartbeat`); the agent kills a pid only while it belongs to
  that session as it last sampled it, and reports; the audit entry, the status reason and the
  metric are written when it has reported every kill, or when the kill is given up (not reported
  after a few heartbeats, the session ended, the node went LOST: ``not_killed`` says so).  With no
  process to pick (the driver gave no per-process figures) it warns instead (``details.wanted``).
- ``stop``: TERMINATING with the reason, then the Hub is asked to stop the server (as idle
  reclamation does; back to RUNNING when the Hub does not stop it).  Without a Hub to ask, it warns.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from labfleet.compute import sessions
from labfleet.core import audit, database
from labfleet.core.authz import Actor
from labfleet.core.models import Allocation, ComputeSession, Device, Domain, Node, ResourceGroup, User
from labfleet.core.vocab import HOLDING_STATUSES
from labfleet.usage import overuse
from labfleet.usage.sampler import Reading, kill_if_same

AUDIT_ACTION = "session.gpu-overuse"
# Only where the service was given no queue for its agents' kills (see act's ``agent_kills``).
NO_COMMAND_CHANNEL = "the node is run by an agent, which has no command channel to kill processes with"

StopServer = Callable[[str, str], Awaitable[bool]]
Killer = Callable[[overuse.Proc], "Killed"]
Observe = Callable[[str, str], None]


@dataclass(frozen=True)
class Killed:
    pid: int
    killed: bool
    cmdline: str
    mem_bytes: int
    error: str | None = None


@dataclass(frozen=True)
class _Where:
    user: str
    server: str
    domain: str
    group: str
    local: bool  # on the service's own node (not an agent's)
    node: str = ""
    agent: bool = False  # the node is run by an agent


def kill_process(proc: overuse.Proc) -> Killed:
    """SIGKILL ``proc`` (on this node) if its pid still belongs to the process the sampler read."""
    killed, cmdline, error = kill_if_same(proc.pid, proc.started)
    return Killed(proc.pid, killed, cmdline, proc.mem_bytes, error)


def holdings(
    db: Session, readings: Iterable[Reading], node_name: str
) -> tuple[list[overuse.Holding], dict[str, _Where]]:
    """The fractions of devices RUNNING sessions hold, with what their processes hold on them."""
    by_sid = {r.session_id: r for r in readings if r.alive and r.gpus}
    if not by_sid:
        return [], {}
    s = ComputeSession
    rows = db.execute(
        select(
            s.id,
            s.name,
            User.username,
            Domain.name,
            ResourceGroup.name,
            ResourceGroup.gpu_overuse,
            Node.name,
            Node.agent_token_id,
            Allocation.device_id,
            Allocation.shares_centi,
            Device.uuid,
            Device.memory_bytes,
        )
        .join(Allocation, Allocation.session_id == s.id)
        .join(Device, Device.id == Allocation.device_id)
        .join(Node, Node.id == Allocation.node_id)
        .join(User, User.id == s.user_id)
        .join(Domain, Domain.id == s.domain_id)
        .join(ResourceGroup, ResourceGroup.id == s.resource_group_id)
        .where(s.id.in_(list(by_sid)), s.status == "RUNNING")
    ).all()
    device_ids = {r[8] for r in rows}
    holders: dict[int, int] = {
        device_id: n
        for device_id, n in db.execute(
            select(Allocation.device_id, func.count(func.distinct(Allocation.session_id)))
            .where(Allocation.device_id.in_(device_ids))
            .group_by(Allocation.device_id)
        )
        if device_id is not None
    }
    shares: dict[tuple[str, str], int] = defaultdict(int)
    facts: dict[tuple[str, str], tuple[Any, ...]] = {}
    where: dict[str, _Where] = {}
    for sid, server, user, domain, group, policy, node, agent, device_id, centi, uuid, memory in rows:
        shares[(sid, uuid)] += int(centi or 0)
        facts[(sid, uuid)] = (policy, holders.get(device_id or 0, 1) > 1, int(memory or 0))
        where[sid] = _Where(
            user, server, domain, group, node == node_name and agent is None, node, agent is not None
        )
    out = []
    for (sid, uuid), centi in shares.items():
        g = next((g for g in by_sid[sid].gpus if g.uuid == uuid), None)
        if g is None:
            continue
        policy, shared, memory = facts[(sid, uuid)]
        procs = tuple(overuse.Proc(p.pid, p.mem_bytes or 0, p.started) for p in g.processes)
        out.append(
            overuse.Holding(sid, uuid, centi / 100, memory, policy or "auto", shared, g.mem_bytes, procs)
        )
    return out, where


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def describe(d: overuse.Decision) -> str:
    """Why the session is acted on, in the words its owner reads."""
    h, a = d.holding, d.allowance
    return (
        f"its processes held {_gib(h.used_bytes or 0)} of GPU {h.uuid} at {d.ticks} samples in a row, "
        f"over its share of {h.share:g} of the device ({_gib(a.share_bytes)}, tolerance {_gib(a.tolerance)})"
    )


def _details(d: overuse.Decision, action: str, w: _Where) -> dict[str, Any]:
    h, a = d.holding, d.allowance
    return {
        "action": action,
        "policy": h.policy,
        "device": h.uuid,
        "share": h.share,
        "share_bytes": a.share_bytes,
        "tolerance_bytes": a.tolerance,
        "used_bytes": h.used_bytes,
        "ticks": d.ticks,
        "shared_device": h.shared,
        "processes": [{"pid": p.pid, "mem_bytes": p.mem_bytes} for p in h.processes],
        "user": w.user,
        "server": w.server,
        "resource_group": w.group,
    }


def _note(
    session_factory: sessionmaker[Session], d: overuse.Decision, w: _Where, reason: str, details: dict
) -> None:
    """Audit the action and tell the session (its status reason), in one transaction."""
    with database.session_scope(session_factory) as db:
        s = db.get(ComputeSession, d.holding.session_id)
        if s is not None and s.status == "RUNNING":
            s.status_reason = reason[:1000]
        audit.record(
            db, Actor.cli(), AUDIT_ACTION, d.holding.session_id, target_domain=w.domain, details=details
        )


def _write_kill(
    session_factory: sessionmaker[Session],
    d: overuse.Decision,
    w: _Where,
    details: dict[str, Any],
    done: Sequence[Killed],
) -> None:
    """Audit a kill with what was and was not killed, and tell the session which and why."""
    details["killed"] = [
        {"pid": k.pid, "cmdline": k.cmdline, "mem_bytes": k.mem_bytes} for k in done if k.killed
    ]
    details["not_killed"] = [
        {"pid": k.pid, "cmdline": k.cmdline, "error": k.error} for k in done if not k.killed
    ]
    which = ", ".join(f"{k.pid} ({k.cmdline[:80]}, {_gib(k.mem_bytes)})" for k in done if k.killed)
    reason = (
        f"gpu-overuse kill: {describe(d)}; killed the processes it started last: {which or 'none (all gone)'}"
    )
    _note(session_factory, d, w, reason, details)


async def act(
    session_factory: sessionmaker[Session],
    d: overuse.Decision,
    w: _Where,
    *,
    stop_server: StopServer | None,
    log: logging.Logger,
    kill: Killer = kill_process,
    agent_kills: overuse.AgentKills | None = None,
) -> str | None:
    """Carry out one decision; returns the action taken (warn, kill or stop; None: it ended
    meanwhile, or its kills were queued for the node's agent: written up when it reports)."""
    action, why = d.action, describe(d)
    details = _details(d, action, w)
    queue = action == "kill" and not w.local and w.agent and agent_kills is not None
    if action == "kill" and (not (w.local or queue) or not d.victims):
        details["wanted"] = "kill"
        details["why_not"] = "the driver lists none of its processes" if not d.victims else NO_COMMAND_CHANNEL
        action = details["action"] = "warn"
    if action == "stop" and stop_server is None:
        details["wanted"], details["why_not"] = "stop", "the service has no Hub to stop servers through"
        action = details["action"] = "warn"
    sid = d.holding.session_id
    if action == "warn":
        _note(session_factory, d, w, f"gpu-overuse warning: {why}; free device memory", details)
    elif action == "kill" and queue:
        assert agent_kills is not None
        details["node"] = w.node
        order = agent_kills.queue(w.node, sid, d.victims, (d, w, details))
        log.warning(
            "Session %s (%s/%s): gpu-overuse, kill of pid(s) %s queued for node %s's agent: %s",
            *(sid, w.user, w.server, ", ".join(str(p.pid) for p in d.victims), w.node, why),
        )
        if not order.done:
            return None
        finish_agent_kill(session_factory, order, log=log)
    elif action == "kill":
        _write_kill(session_factory, d, w, details, [kill(p) for p in d.victims])
    else:
        reason = f"gpu-overuse: {why}; stopped"[:1000]
        with database.session_scope(session_factory) as db:
            s = db.get(ComputeSession, sid)
            if s is None or s.status != "RUNNING":
                return None
            sessions.lock_current(db, s)
            if s.status != "RUNNING":
                return None
            sessions.set_status(s, "TERMINATING", reason)
            audit.record(db, Actor.cli(), AUDIT_ACTION, sid, target_domain=w.domain, details=details)
        assert stop_server is not None
        if not await stop_server(w.user, w.server):
            log.warning("Session %s is over its GPU share, but the Hub did not stop it", sid)
            with database.session_scope(session_factory) as db:
                s = db.get(ComputeSession, sid)
                if s is not None and s.status == "TERMINATING" and s.status_reason == reason:
                    sessions.set_status(
                        s, "RUNNING", "the Hub did not stop it when it was over its GPU share"
                    )
    log.warning("Session %s (%s/%s): gpu-overuse, %s: %s", sid, w.user, w.server, action, why)
    return action


def finish_agent_kill(
    session_factory: sessionmaker[Session],
    order: overuse.AgentKill,
    *,
    log: logging.Logger,
    observe: Observe | None = None,
) -> None:
    """Write up a kill an agent reported (or that was given up), as a kill on this node is."""
    d, w, details = order.context
    done = []
    for p in order.victims:
        r = order.reports.get(p.pid)
        if r is None:  # not done: cannot happen, but the audit must not lie
            done.append(Killed(p.pid, False, "", p.mem_bytes, "not reported"))
        else:  # the memory the decision was made on, as for a kill on this node
            done.append(Killed(p.pid, r.killed, r.cmdline, p.mem_bytes, None if r.killed else r.error))
    _write_kill(session_factory, d, w, details, done)
    log.warning(
        "Session %s (%s/%s): gpu-overuse, kill on node %s: killed %s, not killed %s",
        *(order.session_id, w.user, w.server, order.node),
        [k.pid for k in done if k.killed] or "none",
        [f"{k.pid}: {k.error}" for k in done if not k.killed] or "none",
    )
    if observe is not None:
        observe("kill", w.group)


def finish_agent_kills(
    session_factory: sessionmaker[Session],
    orders: Iterable[overuse.AgentKill],
    *,
    log: logging.Logger,
    observe: Observe | None = None,
) -> None:
    for order in orders:
        try:
            finish_agent_kill(session_factory, order, log=log, observe=observe)
        except Exception:  # one session's failure must not stop the others'
            log.exception("gpu-overuse: writing up the kill of session %s failed", order.session_id)


def agent_heartbeat(
    agent_kills: overuse.AgentKills,
    node: str,
    reports: Sequence[overuse.KillReport],
    live: Iterable[str],
    *,
    log: logging.Logger,
) -> tuple[list[dict[str, Any]], list[overuse.AgentKill]]:
    """A heartbeat of ``node``'s agent (already known to be that node's): take its kill reports,
    and say which kills to hand it (``live``: the sessions the service holds on the node); with the
    kills now done, for :func:`finish_agent_kills` once the heartbeat's transaction is over (it
    writes in transactions of its own).  Touches no DB."""
    done, ignored = agent_kills.report(node, reports)
    if ignored:
        log.warning(
            "Node %s's agent reported %d kill(s) the service did not queue for it (ignored): %s",
            node,
            len(ignored),
            ", ".join(f"{r.session_id}/{r.pid}" for r in ignored[:5]),
        )
    commands, given_up = agent_kills.hand_over(node, set(live))
    return commands, [*done, *given_up]


def sweep_agent_kills(
    session_factory: sessionmaker[Session],
    agent_kills: overuse.AgentKills,
    *,
    log: logging.Logger,
    observe: Observe | None = None,
) -> None:
    """Give up the queued kills whose session no longer runs on their node (it ended; the node went
    LOST and ended it), and write them up."""
    wanted = agent_kills.sessions()
    if not wanted:
        return
    with database.session_scope(session_factory) as db:
        live = {
            (node, sid)
            for sid, node in db.execute(
                select(ComputeSession.id, Node.name)
                .join(Node, Node.id == ComputeSession.node_id)
                .where(ComputeSession.id.in_(wanted), ComputeSession.status.in_(HOLDING_STATUSES))
            )
        }
    finish_agent_kills(session_factory, agent_kills.sweep(live), log=log, observe=observe)


async def enforce(
    session_factory: sessionmaker[Session],
    readings: Sequence[Reading],
    watch: overuse.Watch,
    *,
    node_name: str,
    stop_server: StopServer | None,
    log: logging.Logger,
    observe: Observe | None = None,
    kill: Killer = kill_process,
    agent_kills: overuse.AgentKills | None = None,
) -> list[tuple[str, str]]:
    """One tick of the backstop over this tick's readings: (session id, action taken) of each act
    (a kill queued for an agent is not one yet: it is counted when written up).  ``agent_kills``:
    where kills on agents' nodes are queued (None: they are warnings)."""
    if agent_kills is not None:
        sweep_agent_kills(session_factory, agent_kills, log=log, observe=observe)
    with database.session_scope(session_factory) as db:
        found, where = holdings(db, readings, node_name)
    done = []
    for d in overuse.judge(found, watch):
        w = where[d.holding.session_id]
        try:
            action = await act(
                session_factory,
                d,
                w,
                stop_server=stop_server,
                log=log,
                kill=kill,
                agent_kills=agent_kills,
            )
        except Exception:  # one session's failure must not stop the others'
            log.exception("gpu-overuse: acting on session %s failed", d.holding.session_id)
            continue
        if action is None:
            continue
        if observe is not None:
            observe(action, w.group)
        done.append((d.holding.session_id, action))
    return done
