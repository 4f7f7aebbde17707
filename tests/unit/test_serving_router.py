"""The router's choice of replica (pure): round robin over those in rotation, least outstanding
requests, replicas that refused skipped while another is left, none twice for one request."""

from __future__ import annotations

from hub_ext.serving.engine import Replica, backoff
from hub_ext.serving.router import _refused, choose


def _reps(n):
    return [Replica(route_id=i, host="127.0.0.1", port=10000 + i) for i in range(1, n + 1)]


def test_round_robin_spreads_evenly():
    reps = _reps(3)
    pos, seen = 0, []
    for _ in range(6):
        r, pos = choose(reps, pos)
        seen.append(r.route_id)
    assert seen == [1, 2, 3, 1, 2, 3]


def test_least_outstanding_prefers_the_idle_one_and_rotates_ties():
    reps = _reps(3)
    reps[0].outstanding, reps[1].outstanding, reps[2].outstanding = 4, 1, 1
    picks = [choose(reps, p, how="least_outstanding")[0].route_id for p in range(4)]
    assert picks == [2, 3, 2, 3]


def test_down_replicas_are_skipped_while_another_is_left():
    reps = _reps(2)
    reps[0].down = True
    assert {choose(reps, p)[0].route_id for p in range(4)} == {2}
    reps[1].down = True  # all refused once: try them anyway (one may be back)
    assert choose(reps, 0)[0] is not None


def test_a_request_never_tries_a_replica_twice():
    reps = _reps(2)
    first, pos = choose(reps, 0)
    second, pos = choose(reps, pos, exclude={first.route_id})
    third, _ = choose(reps, pos, exclude={first.route_id, second.route_id})
    assert {first.route_id, second.route_id} == {1, 2} and third is None
    assert choose([], 5) == (None, 5)


def test_refusal_is_told_from_other_errors():
    assert _refused(ConnectionRefusedError(111, "refused"))
    assert not _refused(TimeoutError("slow"))
    assert not _refused(None)


def test_backoff_doubles_up_to_a_minute():
    assert [backoff(n) for n in (0, 1, 2, 3, 6, 7, 50)] == [0.0, 2.0, 4.0, 8.0, 60.0, 60.0, 60.0]
