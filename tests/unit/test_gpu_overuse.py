"""The GPU share backstop's judgment (hub_ext.usage.overuse): plain values in, plain values out."""

from __future__ import annotations

import pytest

from hub_ext.usage.overuse import (
    TOLERANCE_FLOOR,
    Holding,
    Proc,
    Watch,
    action_for,
    allowance,
    judge,
    victims,
)

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
