"""fgd's memos (labfleet.compute.scheduler.placement): a cluster that keeps its evaluators per
workload and its groups' scores per query picks exactly what a fresh cluster with a fresh
evaluator picks, over random sequences of placements, releases, workload changes and new nodes."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from decimal import Decimal as D

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labfleet.compute.scheduler import Cluster, Node, Placement, Request, Workload, apply, place, release
from labfleet.compute.scheduler import placement as placement_mod
from tests.unit.test_placement import GIB, clusters, node, reference_place, requests


def fresh_place(c: Cluster, req: Request, wl: Workload | None) -> Placement | None:
    """What a new cluster built from the same nodes, with a new evaluator, picks."""
    return place(
        req,
        Cluster(Node.from_dict(d) for d in c.to_dicts()),
        "fgd",
        workload=None if wl is None else Workload(wl.counts()),
    )


@contextlib.contextmanager
def small_limits() -> Iterator[None]:
    """Limits so low that evaluators, queries and memos are dropped all the time."""
    names = ("_EVALUATOR_LIMIT", "_QUERY_LIMIT", "_MEMO_CHECK_EVERY", "_CACHE_LIMIT")
    saved = [getattr(placement_mod, n) for n in names]
    for n, v in zip(names, (1, 2, 3, 5), strict=True):
        setattr(placement_mod, n, v)
    try:
        yield
    finally:
        for n, v in zip(names, saved, strict=True):
            setattr(placement_mod, n, v)


steps = st.lists(
    st.one_of(
        # place with one of the shared workloads (index), or with none (the request alone)
        st.tuples(st.just("place"), requests(), st.sampled_from([None, 0, 1, 2])),
        st.tuples(st.just("release"), st.integers(0, 50)),
        # a shared workload sees one more request: its version changes, its content too
        st.tuples(st.just("observe"), requests(), st.integers(0, 2)),
        # a node with a model the cluster may not have seen: the model table grows
        st.tuples(st.just("node"), st.sampled_from(["A100", "T4", "H100"]), st.integers(1, 8)),
    ),
    max_size=40,
)


def _run(nodes: list[Node], ops: list[tuple], wl_reqs: list[list[Request]]) -> None:
    c = Cluster(nodes)
    workloads = [Workload.from_requests(r) for r in wl_reqs]
    live: list[Placement] = []
    added = 0
    for op in ops:
        if op[0] == "place":
            _, req, wi = op
            wl = None if wi is None else workloads[wi]
            got = place(req, c, "fgd", workload=wl)
            assert got == fresh_place(c, req, wl)
            expected = reference_place(req, sorted(c.nodes.values(), key=lambda n: n.name), "fgd", wl)
            assert (None if got is None else (got.node, tuple(i for i, _ in got.devices))) == expected
            if got is not None:
                apply(c, got)
                live.append(got)
        elif op[0] == "release":
            if live:
                release(c, live.pop(op[1] % len(live)))
        elif op[0] == "observe":
            workloads[op[2]].observe(op[1])
        else:
            added += 1
            c.add_node(node(f"z{added}", "0", "0.5", model=op[1], cpu=op[2], mem=8 * GIB))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), steps, st.lists(st.lists(requests(), min_size=1, max_size=3), min_size=3, max_size=3))
def test_a_long_lived_cluster_picks_what_a_fresh_one_picks(nodes, ops, wl_reqs):
    _run(nodes, ops, wl_reqs)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), steps, st.lists(st.lists(requests(), min_size=1, max_size=3), min_size=3, max_size=3))
def test_the_same_when_every_memo_is_dropped_all_the_time(nodes, ops, wl_reqs):
    with small_limits():
        _run(nodes, ops, wl_reqs)


def test_a_larger_cluster_over_a_long_random_sequence():
    """60 nodes in many states, 600 steps of requests of a dozen shapes that alternate (each its
    own workload, as admission passes them), each decision checked against a fresh cluster."""
    rnd = random.Random(7)
    nodes = []
    for i in range(60):
        model = rnd.choice(["A100", "T4", "V100"])
        allocs = [rnd.choice(["0", "0", "0.25", "0.5", "1"]) for _ in range(rnd.choice([1, 2, 4, 8]))]
        nodes.append(node(f"n{i:02d}", *allocs, model=model, cpu=rnd.choice([16, 32, 64]), mem=64 * GIB))
    c = Cluster(nodes)
    shapes = []
    for _ in range(12):
        kind = rnd.choice(["frac", "frac", "whole", "cpu"])
        cpu, mem = D(rnd.choice([1, 2, 4])), rnd.choice([GIB, 4 * GIB])
        models = rnd.choice([(), (), ("T4",), ("A100", "V100")])
        if kind == "frac":
            r = Request(cpu=cpu, mem=mem, shares=D(rnd.choice(["0.1", "0.25", "0.5", "0.3"])), models=models)
        elif kind == "whole":
            r = Request(cpu=cpu, mem=mem, gpu=rnd.choice([1, 2]), models=models)
        else:
            r = Request(cpu=cpu, mem=mem)
        shapes.append((r, Workload.from_requests([r])))
    mixed = Workload.from_requests(r for r, _ in shapes)
    live: list[Placement] = []
    placed = 0
    for step in range(600):
        if live and (rnd.random() < 0.45 or len(live) > 80):
            release(c, live.pop(rnd.randrange(len(live))))
            continue
        req, own = rnd.choice(shapes)
        wl = rnd.choice([own, own, None, mixed])
        if step == 300:
            mixed.observe(req, 5)  # the shared workload changes halfway
        got = place(req, c, "fgd", workload=wl)
        assert got == fresh_place(c, req, wl), step
        if got is not None:
            apply(c, got)
            live.append(got)
            placed += 1
    assert placed > 200


def test_a_model_the_cluster_sees_later_changes_the_evaluator():
    """A workload that asks T4 when the cluster has none: its evaluator maps T4 to nothing.  Once
    a T4 node joins, the same workload must be evaluated again (T4 shapes can now use it)."""
    c = Cluster([node("b", "0", model="A100")])
    wl = Workload.from_requests([Request(shares=D("0.5"), models=("T4",))])
    req = Request(shares=D("0.75"))
    assert place(req, c, "fgd", workload=wl).node == "b"
    c.add_node(node("a", "0", model="T4"))
    # On a (T4) the 0.75 strands 0.25 that a T4 half cannot use; on b (A100) it takes capacity
    # the T4 shape could never use.  An evaluator still blind to T4 would call it a tie (-> a).
    assert place(req, c, "fgd", workload=wl).node == "b"
    assert fresh_place(c, req, wl).node == "b"
