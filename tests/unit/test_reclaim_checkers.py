"""Idle checkers' judgments (labfleet.reclaim.checkers): plain values, no DB, no clock."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from labfleet.core.errors import InvalidInput
from labfleet.reclaim.checkers import (
    STARTUP_ALLOWANCE,
    Facts,
    Sample,
    first_to_reclaim,
    judge_activity,
    judge_lifetime,
    judge_utilization,
    parse_options,
)

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=timezone.utc)
GiB = 2**30


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


@pytest.mark.parametrize(
    "kind, options, message",
    [
        ("sleepy", {"timeout": 5}, "kind must be one of activity, utilization"),
        ("activity", {}, "needs a timeout"),
        ("activity", {"timeout": -5}, "timeout must be from 1"),
        ("activity", {"timeout": "soon"}, "timeout must be a number of seconds"),
        ("activity", {"timeout": 60, "window": 5}, "unknown option(s) for a activity checker: window"),
        ("utilization", {"thresholds": {"cpu_util": 5}}, "needs a window"),
        ("utilization", {"window": -1, "thresholds": {"cpu_util": 5}}, "window must be from 1"),
        ("utilization", {"window": 60, "thresholds": {"cpu_util": 150}}, "percent from 0 to 100"),
        ("utilization", {"window": 60, "thresholds": {"disk": 5}}, "unknown threshold 'disk'"),
        ("utilization", {"window": 60, "thresholds": {}}, "thresholds must be an object"),
        (
            "utilization",
            {"window": 60, "thresholds": {"mem": 5}, "combine": "xor"},
            "combine must be and or or",
        ),
        ("utilization", {"window": 60, "thresholds": {"mem": 5}, "grace": -1}, "grace must be from 0"),
        ("activity", {"timeout": 60, "only_when_queue_waiting": "yes"}, "must be true or false"),
        ("activity", [1], "options must be an object"),
    ],
)
def test_bad_checker_definitions_are_refused(kind, options, message):
    with pytest.raises(InvalidInput) as e:
        parse_options(kind, options)
    assert message in e.value.message


def test_options_get_their_defaults():
    assert parse_options("activity", {"timeout": 600}) == {"timeout": 600.0, "only_when_queue_waiting": False}
    assert parse_options("utilization", {"window": 300, "thresholds": {"gpu_util": 10}}) == {
        "window": 300.0,
        "grace": 0.0,
        "thresholds": {"gpu_util": 10.0},
        "combine": "and",
        "only_when_queue_waiting": False,
    }


def test_activity_counts_from_the_latest_sign_of_life():
    f = Facts(running_since=at(0), last_activity=at(100), reported_at=at(110))
    j = judge_activity("c", f, at(400), 600, stale_after=200)
    assert (j.reclaim, j.idle_for, j.reclaim_at) == (False, 300.0, at(700))
    assert judge_activity("c", f, at(700), 600, stale_after=200).reclaim
    # "I'm still here" is activity too
    still = Facts(running_since=at(0), last_activity=at(100), still_here_at=at(650))
    assert judge_activity("c", still, at(700), 600, stale_after=200).reclaim_at == at(1250)


def test_a_session_whose_server_has_not_reported_yet_is_starting():
    """RUNNING is the server's process started; it answers (and reports) seconds later. Until its
    first report the clock starts STARTUP_ALLOWANCE after RUNNING: a reclaimer that counted from
    RUNNING stopped servers still starting, their spawn then failing (a 500 in CI)."""
    starting = Facts(running_since=at(0))
    j = judge_activity("c", starting, at(8), 5, stale_after=200)
    assert not j.reclaim and j.idle_for == 0 and j.reclaim_at == at(STARTUP_ALLOWANCE + 5)
    assert judge_activity("c", starting, at(STARTUP_ALLOWANCE + 5), 5, stale_after=200).reclaim
    # Its first report starts the clock, however early
    up = Facts(running_since=at(0), last_activity=at(4), reported_at=at(4))
    assert judge_activity("c", up, at(9), 5, stale_after=200).reclaim


def test_a_computing_kernel_is_activity_while_its_reports_are_fresh():
    busy = Facts(running_since=at(0), last_activity=at(0), busy_kernels=1, reported_at=at(950))
    j = judge_activity("c", busy, at(1000), 600, stale_after=200)
    assert not j.reclaim and j.idle_for == 0 and j.detail == "a kernel is computing"
    # A session that stopped reporting does not keep itself alive with an old "busy"
    stale = Facts(running_since=at(0), last_activity=at(0), busy_kernels=1, reported_at=at(100))
    assert judge_activity("c", stale, at(1000), 600, stale_after=200).reclaim


def _burner(cores: float, mem: float = 0.0, gpu: float | None = None):
    return [Sample(at(t), cpu_total=cores * t, mem=mem, gpu=gpu) for t in range(0, 601, 15)]


UTIL = {"window": 300.0, "grace": 60.0, "thresholds": {"cpu_util": 10.0}, "combine": "and"}


def test_utilization_reclaims_a_sleeping_session_and_keeps_a_busy_one():
    alloc = {"cpu": 2.0, "mem": 4.0 * GiB}
    sleeping = Facts(running_since=at(0), alloc=alloc, samples=_burner(0.01))
    busy = Facts(running_since=at(0), alloc=alloc, samples=_burner(1.5))
    j = judge_utilization("u", sleeping, at(600), UTIL, interval=15)
    assert j.reclaim and "cpu_util 0.5 % < 10 %" in j.detail
    assert not judge_utilization("u", busy, at(600), UTIL, interval=15).reclaim  # 75 % of 2 cores


def test_utilization_waits_for_its_grace_and_a_covered_window():
    f = Facts(running_since=at(0), alloc={"cpu": 1.0}, samples=_burner(0.0))
    assert not judge_utilization("u", f, at(30), UTIL, interval=15).reclaim  # grace
    assert "grace" in judge_utilization("u", f, at(30), UTIL, interval=15).detail
    late = Facts(running_since=at(0), alloc={"cpu": 1.0}, samples=[s for s in _burner(0.0) if s.at > at(500)])
    j = judge_utilization("u", late, at(600), UTIL, interval=15)
    assert not j.reclaim and "not enough samples" in j.detail


def test_resources_not_given_are_ignored_and_and_or_combine():
    both = {
        "window": 300.0,
        "grace": 0.0,
        "thresholds": {"cpu_util": 10.0, "gpu_util": 20.0},
        "combine": "and",
    }
    cpu_only = Facts(running_since=at(0), alloc={"cpu": 1.0}, samples=_burner(0.0))
    assert judge_utilization("u", cpu_only, at(600), both, interval=15).reclaim  # no GPU given: CPU decides
    gpu_busy = Facts(
        running_since=at(0), alloc={"cpu": 1.0, "gpu.shares": 0.5}, samples=_burner(0.0, gpu=0.4)
    )
    assert not judge_utilization("u", gpu_busy, at(600), both, interval=15).reclaim  # GPU 80 % of its share
    assert judge_utilization("u", gpu_busy, at(600), {**both, "combine": "or"}, interval=15).reclaim
    nothing = Facts(running_since=at(0), alloc={"mem": 1.0}, samples=_burner(0.0))
    j = judge_utilization("u", nothing, at(600), both, interval=15)
    assert not j.reclaim and "nothing it was given" in j.detail


def test_lifetime_and_which_rule_reclaims_first():
    f = Facts(running_since=at(0), lifetime=3600)
    life = judge_lifetime(f, at(100))
    assert life is not None and not life.reclaim and life.reclaim_at == at(3600)
    assert judge_lifetime(f, at(3600)).reclaim  # type: ignore[union-attr]
    assert judge_lifetime(Facts(running_since=at(0)), at(100)) is None
    idle = judge_activity("a", Facts(running_since=at(0)), at(100), 600, stale_after=200)
    assert first_to_reclaim([life, idle]) == idle  # at 660, before the lifetime's 3600
    assert first_to_reclaim([]) is None
