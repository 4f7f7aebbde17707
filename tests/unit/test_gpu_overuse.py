"""The GPU share backstop's judgment (labfleet.usage.overuse): plain values in, plain values out."""

from __future__ import annotations

import pytest

from labfleet.agent.app import gpu_processes, kill_order
from labfleet.core.errors import InvalidInput
from labfleet.usage.overuse import (
    KILL_HANDOVERS,
    TOLERANCE_FLOOR,
    AgentKills,
    Holding,
    KillReport,
    Proc,
    Watch,
    action_for,
    allowance,
    judge,
    parse_kill_reports,
    victims,
)
from labfleet.usage.sampler import GpuProcess, GpuReading, Reading

GiB = 2**30
DEVICE = 80 * GiB


def holding(used, share=0.25, policy="auto", shared=True, sid="s1", procs=()) -> Holding:
    return Holding(sid, "GPU-a", share, DEVICE, policy, shared, used, tuple(procs))


def test_the_allowance_is_the_share_plus_5_percent_at_least_256_mib():
    a = allowance(0.25, DEVICE)
    assert (a.share_bytes, a.tolerance, a.limit) == (20 * GiB, GiB, 21 * GiB)
    small = allowance(0.01, 16 * GiB)  # 5 % of 164 MiB is under the floor
    assert small.tolerance == TOLERANCE_FLOOR and small.limit == small.share_bytes + TOLERANCE_FLOOR


@pytest.mark.parametrize(
    "policy, shared, action",
    [
        ("auto", True, "kill"),
        ("auto", False, "warn"),
        ("warn", True, "warn"),
        ("kill", False, "kill"),
        ("stop", True, "stop"),
        ("bogus", True, "kill"),
    ],
)
def test_the_policy_decides_the_action(policy, shared, action):
    assert action_for(policy, shared) == action


def test_victims_are_the_newest_until_the_rest_fit():
    old = Proc(10, 15 * GiB, 100.0)
    mid = Proc(11, 6 * GiB, 200.0)
    new = Proc(12, 4 * GiB, 300.0)
    unknown = Proc(9, GiB, None)
    # 26 GiB; 20 GiB share: the newest (4) leaves 22, then the next (6) leaves 16 <= 20
    assert victims([old, unknown, mid, new], 20 * GiB) == (new, mid)
    assert victims([old, mid], 21 * GiB) == ()  # already within
    # Unknown starts come last; equal starts, the higher pid first
    assert victims([unknown, Proc(5, GiB, 1.0), Proc(6, GiB, 1.0)], 0) == (
        Proc(6, GiB, 1.0),
        Proc(5, GiB, 1.0),
        unknown,
    )


def test_over_for_two_ticks_then_acted_on_once_per_episode():
    w = Watch()
    procs = (Proc(1, 15 * GiB, 1.0), Proc(2, 10 * GiB, 2.0))
    over = holding(25 * GiB, procs=procs)
    assert judge([over], w) == []  # one tick over: not yet
    (d,) = judge([over], w)
    assert (d.action, d.ticks, d.victims) == ("kill", 2, (procs[1],))
    assert judge([over], w) == []  # same episode: nothing more
    assert judge([holding(10 * GiB)], w) == []  # back under: the episode ends
    assert judge([over], w) == [] and len(judge([over], w)) == 1  # a new episode


def test_under_the_tolerance_or_unknown_or_whole_devices_are_never_judged():
    w = Watch()
    for _ in range(3):
        assert judge([holding(21 * GiB)], w) == []  # within the tolerance
        assert judge([holding(None)], w) == []
        assert judge([holding(80 * GiB, share=1.0, sid="whole")], w) == []
    assert w.over == {} and w.acted == set()


def test_an_unknown_tick_breaks_the_run_and_a_gone_session_is_forgotten():
    w = Watch()
    judge([holding(30 * GiB)], w)
    judge([holding(None)], w)
    assert judge([holding(30 * GiB)], w) == []  # the run started again
    judge([], w)
    assert w.over == {}


def test_alone_on_its_device_it_is_warned_and_n_ticks_is_the_watch_s():
    w = Watch(ticks=3)
    h = holding(30 * GiB, shared=False)
    assert judge([h], w) == [] and judge([h], w) == []
    (d,) = judge([h], w)
    assert d.action == "warn" and d.victims == ()


# ---------------------------------------------------------------- kills on agents' nodes


def report(sid="s1", pid=12, started=300.0, killed=True, **kw) -> KillReport:
    return KillReport(sid, pid, started, killed, kw.pop("cmdline", "python train.py"), **kw)


def test_a_queued_kill_is_handed_over_until_reported_then_done_once():
    kills = AgentKills()
    new, mid = Proc(12, 4 * GiB, 300.0), Proc(11, 6 * GiB, 200.0)
    order = kills.queue("n2", "s1", (new, mid), context="ctx")
    assert not order.done and kills.sessions() == {"s1"}
    assert kills.hand_over("n3", {"s1"}) == ([], [])  # another node's agent hears nothing of it
    wanted = [
        {"session": "s1", "pid": 12, "create_time": 300.0},
        {"session": "s1", "pid": 11, "create_time": 200.0},
    ]
    assert kills.hand_over("n2", {"s1"}) == (wanted, [])
    assert kills.hand_over("n2", {"s1"}) == (wanted, [])  # the answer was lost: again
    # One reported: only the other goes out again; the order is not done yet
    assert kills.report("n2", [report()]) == ([], [])
    assert kills.hand_over("n2", {"s1"}) == ([wanted[1]], [])
    done, ignored = kills.report("n2", [report(pid=11, started=200.0, killed=False, error="gone")])
    assert done == [order] and ignored == [] and order.context == "ctx"
    assert order.reports[11].error == "gone" and order.reports[12].killed
    assert kills.pending == [] and kills.hand_over("n2", {"s1"}) == ([], [])
    # The same report again: nothing queued any more, ignored
    assert kills.report("n2", [report()]) == ([], [report()])


def test_reports_are_taken_only_for_a_kill_queued_for_that_node_session_pid_and_start():
    kills = AgentKills()
    order = kills.queue("n2", "s1", (Proc(12, GiB, 300.0),))
    forged = [
        report(sid="s2"),  # another session
        report(pid=13),  # another pid
        report(started=299.0),  # another process that had the pid
    ]
    assert kills.report("n2", forged) == ([], forged)
    assert kills.report("n3", [report()]) == ([], [report()])  # another node's agent
    assert not order.done and order.reports == {}
    assert kills.report("n2", [report(started=300.004)]) == ([order], [])  # the same start, as a float


def test_an_unreported_kill_is_given_up_after_the_handovers_or_when_its_session_is_gone():
    kills = AgentKills()
    slow = kills.queue("n2", "s1", (Proc(12, GiB, 300.0),))
    ended = kills.queue("n2", "s2", (Proc(22, GiB, 300.0),))
    for _ in range(KILL_HANDOVERS):
        handed, given_up = kills.hand_over("n2", {"s1", "s2"})
        assert len(handed) == 2 and given_up == []
    handed, given_up = kills.hand_over("n2", {"s1"})  # s2 no longer runs there
    assert handed == [] and given_up == [slow, ended]
    assert (
        slow.reports[12].killed is False
        and "did not report the kill in 3 heartbeats" in slow.reports[12].error
    )
    assert "no longer ran on node n2" in ended.reports[22].error
    # The usage tick's sweep: a node gone LOST (its sessions ended) sends no heartbeat any more
    lost = kills.queue("n4", "s4", (Proc(40, GiB, 1.0),))
    kept = kills.queue("n2", "s1", (Proc(12, GiB, 300.0),))
    assert kills.sweep({("n2", "s1")}) == [lost] and kills.pending == [kept]
    assert "no longer runs on node n4" in lost.reports[40].error


def test_a_victim_of_unknown_start_is_never_handed_over():
    kills = AgentKills()
    order = kills.queue("n2", "s1", (Proc(9, GiB, None),))
    assert order.done and kills.pending == [] and "start time is unknown" in order.reports[9].error
    mixed = kills.queue("n2", "s1", (Proc(9, GiB, None), Proc(12, GiB, 300.0)))
    assert kills.hand_over("n2", {"s1"})[0] == [{"session": "s1", "pid": 12, "create_time": 300.0}]
    assert not mixed.done


def test_kill_reports_are_checked_whole():
    good = {"session": "s1", "pid": 12, "create_time": 300.5, "killed": True, "cmdline": "x" * 600}
    (r,) = parse_kill_reports([good, *[]])
    assert (r.session_id, r.pid, r.started, r.killed, len(r.cmdline), r.error) == (
        "s1",
        12,
        300.5,
        True,
        500,
        None,
    )
    assert parse_kill_reports([]) == []
    for bad, says in (
        ({}, "kill_reports must be a list"),
        ([good] * 1025, "kill_reports must be a list"),
        ([{**good, "extra": 1}], "unknown field(s) in kill_reports[0]"),
        ([{k: v for k, v in good.items() if k != "killed"}], "missing field(s) in kill_reports[0]: killed"),
        ([{**good, "session": ""}], "kill_reports[0].session must be a session id"),
        ([{**good, "pid": 0}], "kill_reports[0].pid must be at least 1"),
        ([{**good, "pid": True}], "kill_reports[0].pid must be a whole number"),
        ([{**good, "create_time": "now"}], "kill_reports[0].create_time must be"),
        ([{**good, "create_time": float("nan")}], "kill_reports[0].create_time must be"),
        ([{**good, "killed": 1}], "kill_reports[0].killed must be true or false"),
        ([{**good, "mem_bytes": -1}], "kill_reports[0].mem_bytes must be at least 0"),
        ([{**good, "error": 5}], "kill_reports[0].error must be a string"),
        ([{**good, "cmdline": "a\x00b"}], "kill_reports[0].cmdline must not contain NUL"),
    ):
        with pytest.raises(InvalidInput) as e:
            parse_kill_reports(bad)
        assert says in e.value.message, (bad, e.value.message)


def test_the_agent_reads_kills_and_its_sessions_gpu_processes():
    assert kill_order({"session": "s1", "pid": 12, "create_time": 300}) == ("s1", 12, 300.0)
    for bad in (
        None,
        [],
        {"session": 1, "pid": 12, "create_time": 1.0},
        {"session": "s1", "pid": True, "create_time": 1.0},
        {"session": "s1", "pid": 0, "create_time": 1.0},
        {"session": "s1", "pid": 12},
    ):
        assert kill_order(bad) is None
    p1, p2 = GpuProcess(12, GiB, 300.0), GpuProcess(13, None, None)
    readings = [
        Reading(
            "s1",
            1.0,
            True,
            1.0,
            1,
            (GpuReading("GPU-a", None, GiB, (p1,)), GpuReading("GPU-b", 0.0, 0, (p2,))),
        ),
        Reading("s2", 1.0, False, None, None, (GpuReading("GPU-a", None, GiB, (GpuProcess(14, 1, 1.0),)),)),
    ]
    assert gpu_processes(readings) == {"s1": {12: p1, 13: p2}}  # a session read gone has none
