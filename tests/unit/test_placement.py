"""Pure placement (labfleet.compute.scheduler): hand-made clusters with known answers, plus properties."""

from __future__ import annotations

from decimal import Decimal as D

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labfleet.compute.scheduler import (
    POLICIES,
    Cluster,
    Device,
    Node,
    Placement,
    PlacementError,
    Request,
    Workload,
    apply,
    node_fragmentation,
    place,
    release,
)
from labfleet.compute.scheduler.fragmentation import TaskShape, shape_of

GIB = 2**30


def dev(node: str, index: int, model: str = "A100", allocated: str | D = "0") -> Device:
    return Device(id=f"{node}-gpu{index}", index=index, model=model, allocated=D(allocated))


def node(name: str, *allocs: str, model: str = "A100", cpu: int = 32, mem: int = 128 * GIB, **kw) -> Node:
    return Node(name, D(cpu), mem, [dev(name, i, model, a) for i, a in enumerate(allocs)], **kw)


def half() -> Request:
    return Request(cpu=D(1), mem=GIB, shares=D("0.5"))


def snapshot(cluster: Cluster) -> list[dict]:
    return cluster.to_dicts()


# --------------------------------------------------------------------------------------------
# Known answers per policy
# --------------------------------------------------------------------------------------------


def test_pack_fills_the_half_used_device_spread_takes_the_empty_one():
    c = Cluster([node("n1", "0.5", "0")])
    assert place(half(), c, "pack").devices == (("n1-gpu0", D("0.5")),)
    assert place(half(), c, "spread").devices == (("n1-gpu1", D("0.5")),)


def test_pack_and_spread_across_nodes():
    c = Cluster([node("a", "0", "0"), node("b", "0.5", "1")])
    p = place(half(), c, "pack")
    assert (p.node, p.devices) == ("b", (("b-gpu0", D("0.5")),))
    s = place(half(), c, "spread")
    assert (s.node, s.devices) == ("a", (("a-gpu0", D("0.5")),))


def test_whole_gpu_rounds_a_fraction_up_to_a_free_device():
    c = Cluster([node("n1", "0.5", "0")])
    p = place(half(), c, "whole-gpu")
    assert p.devices == (("n1-gpu1", D(1)),)
    assert p.gpu_shares == 1
    # No whole device free: a fraction that would fit elsewhere does not fit under whole-gpu.
    assert place(half(), Cluster([node("n1", "0.5")]), "whole-gpu") is None


def test_fgd_keeps_a_whole_gpu_free_where_pack_does_not():
    # a: one empty device.  b: a half-used device and two empty ones.
    # pack picks a (least GPU left on the node) and breaks its whole device; fgd fills b's
    # half-used device, since the target workload is mostly whole-GPU tasks.
    c = Cluster([node("a", "0"), node("b", "0.5", "0", "0")])
    wl = Workload({TaskShape(cpu=1000, mem=GIB, whole=1): 9, TaskShape(cpu=1000, mem=GIB, frac=50): 1})
    assert place(half(), c, "pack").devices == (("a-gpu0", D("0.5")),)
    p = place(half(), c, "fgd", workload=wl)
    assert (p.node, p.devices) == ("b", (("b-gpu0", D("0.5")),))
    apply(c, p)
    assert c.nodes["a"].devices[0].allocated == 0
    assert node_fragmentation(c.nodes["b"], wl) == 0


def test_fgd_packs_fractions_that_fit_the_workload_together():
    # Device 1 has 0.5 free. Filling it removes the 0.5 that whole-GPU tasks cannot use
    # (fragmentation falls); taking half of the empty device 0 would break a whole GPU (it rises).
    c = Cluster([node("n1", "0", "0.5")])
    wl = Workload({TaskShape(cpu=0, mem=0, frac=50): 1, TaskShape(cpu=0, mem=0, whole=1): 1})
    assert place(half(), c, "fgd", workload=wl).devices == (("n1-gpu1", D("0.5")),)


def test_fgd_cpu_only_task_goes_where_it_strands_no_gpu():
    # b's GPU is fully used, so taking b's CPU strands nothing; taking a's last CPU would.
    c = Cluster([node("a", "0", cpu=4), node("b", "1", cpu=4)])
    wl = Workload({TaskShape(cpu=2000, mem=0, whole=1): 1})
    p = place(Request(cpu=D(3)), c, "fgd", workload=wl)
    assert p.node == "b" and p.devices == ()


def test_whole_devices_only_on_untouched_devices_and_lowest_index_first():
    c = Cluster([node("n1", "0.01", "0", "0", "0")])
    p = place(Request(gpu=2), c, "pack")
    assert p.devices == (("n1-gpu1", D(1)), ("n1-gpu2", D(1)))
    assert place(Request(gpu=4), c, "pack") is None


def test_shares_are_never_split_over_devices():
    c = Cluster([node("n1", "0.5", "0.5")])  # 1.0 free in total, 0.5 per device
    for policy in ("spread", "pack", "fgd"):
        assert place(Request(shares=D("0.6")), c, policy) is None
        p = place(Request(shares=D("0.5")), c, policy)
        assert len(p.devices) == 1


def test_models_are_honoured():
    c = Cluster([node("a", "0", model="T4"), node("b", "0", model="V100M32"), node("c", "0", model="A100")])
    for policy in POLICIES:
        p = place(Request(gpu=1, models=("V100M32", "V100M16")), c, policy)
        assert p.node == "b", policy
        assert place(Request(shares=D("0.2"), models=("H100",)), c, policy) is None
    # A mixed node: only the allowed model's device is used.
    mixed = Cluster([Node("m", D(8), GIB, [dev("m", 0, "T4"), dev("m", 1, "A100")])])
    assert place(Request(shares=D("0.3"), models=("A100",)), mixed, "pack").devices == (("m-gpu1", D("0.3")),)


def test_cpu_and_memory_limit_placement():
    c = Cluster([node("a", "0", cpu=2), node("b", "0", cpu=8, mem=GIB)])
    assert place(Request(cpu=D(4), shares=D("0.1")), c, "pack").node == "b"
    assert place(Request(cpu=D(4), mem=2 * GIB), c, "pack") is None
    assert place(Request(cpu=D("2.001")), c, "spread").node == "b"


def test_ties_break_by_node_name_then_device_index():
    nodes = [node(n, "0", "0") for n in ("n2", "n10", "n1")]
    for policy in POLICIES:
        p = place(half(), Cluster(nodes), policy)
        assert (p.node, p.devices[0][0]) == ("n1", "n1-gpu0"), policy
    # Devices given out of index order are still chosen by index.
    odd = Node("x", D(8), GIB, [dev("x", 3), dev("x", 1), dev("x", 2)])
    assert place(half(), [odd], "pack").devices[0][0] == "x-gpu1"


def test_place_has_no_side_effects_and_accepts_plain_nodes():
    nodes = [node("a", "0.3", "0"), node("b", "0")]
    before = [n.to_dict() for n in nodes]
    c = Cluster(nodes)
    for policy in POLICIES:
        assert place(half(), nodes, policy) == place(half(), c, policy)
    assert [n.to_dict() for n in nodes] == before


def test_decimal_shares_are_exact():
    c = Cluster([node("n1", "0")])
    for s in ("0.1", "0.2"):
        apply(c, place(Request(shares=D(s)), c, "pack"))
    assert c.nodes["n1"].devices[0].allocated == D("0.3")
    p = place(Request(shares=D("0.7")), c, "pack")
    assert p is not None
    apply(c, p)
    assert c.nodes["n1"].devices[0].allocated == D(1)
    assert place(Request(shares=D("0.01")), c, "pack") is None


def test_apply_and_release_are_exact_inverses():
    c = Cluster([node("a", "0.25", "0", "0"), node("b", "0")])
    start = snapshot(c)
    placements = []
    for policy, req in [("pack", half()), ("spread", Request(gpu=1, cpu=D("0.5"))), ("fgd", half())]:
        p = place(req, c, policy)
        apply(c, p)
        placements.append(p)
    assert snapshot(c) != start
    for p in reversed(placements):
        release(c, p)
    assert snapshot(c) == start


def test_apply_refuses_to_over_commit_and_changes_nothing():
    c = Cluster([node("a", "0.7", cpu=2)])
    start = snapshot(c)
    bad = [
        Placement("a", (("a-gpu0", D("0.5")),), D(1), 0),  # only 0.3 free
        Placement("a", (), D(3), 0),  # only 2 cores
        Placement("a", (("nope", D("0.1")),), D(0), 0),
        Placement("zz", (), D(0), 0),
        Placement("a", (("a-gpu0", D("0.1")), ("a-gpu0", D("0.1"))), D(0), 0),
    ]
    for p in bad:
        with pytest.raises(PlacementError):
            apply(c, p)
    with pytest.raises(PlacementError):
        release(c, Placement("a", (("a-gpu0", D("0.8")),), D(0), 0))  # only 0.7 allocated
    assert snapshot(c) == start


def test_request_validation():
    with pytest.raises(ValueError, match="not a whole number"):
        Request(shares=D("1.5"))
    r = Request(shares=D(2))
    assert (r.gpu, r.shares) == (2, 0)
    assert Request(shares=D(1)).gpu == 1
    with pytest.raises(ValueError, match="not both"):
        Request(gpu=1, shares=D("0.5"))
    with pytest.raises(ValueError):
        Request(shares=D("0.005"))
    with pytest.raises(ValueError):
        Request(gpu=-1)
    with pytest.raises(ValueError, match="unknown placement policy"):
        place(half(), [], "best")


def test_request_from_slots():
    r = Request.from_slots({"cpu": 2, "mem": "4g", "gpu.shares": "0.25"})
    assert (r.cpu, r.mem, r.shares, r.gpu, r.models) == (D(2), 4 * GIB, D("0.25"), 0, ())
    r = Request.from_slots({"gpu:A100": 2})
    assert (r.gpu, r.models) == (2, ("A100",))
    with pytest.raises(ValueError):
        Request.from_slots({"gpu:A100": 1, "gpu:T4": 1})


def test_node_dict_round_trip():
    n = Node.from_dict(
        {
            "name": "g1",
            "cpu": "64",
            "mem": "256g",
            "cpu_allocated": "1.5",
            "labels": {"zone": "a"},
            "devices": [{"id": "u-1", "index": 0, "model": "A100", "allocated": "0.25"}],
        }
    )
    assert n.mem == 256 * GIB and n.devices[0].allocated == D("0.25")
    assert Node.from_dict(n.to_dict()) == n
    c = Cluster.from_dicts([n.to_dict()])
    assert c.copy().to_dicts() == c.to_dicts()
    with pytest.raises(ValueError):
        Node.from_dict(
            {
                "name": "x",
                "cpu": 1,
                "mem": 1,
                "devices": [{"id": "d", "index": 0, "model": "T4", "allocated": "1.5"}],
            }
        )


def test_node_fragmentation_definition():
    # Devices free 0.3 and 1.0; workload: half 0.5-tasks, half 1-GPU tasks.
    n = node("n", "0.7", "0")
    wl = Workload({TaskShape(cpu=0, mem=0, frac=50): 1, TaskShape(cpu=0, mem=0, whole=1): 1})
    # 0.5 task: 0.3 unusable; whole task: 0.3 unusable -> expected 0.3.
    assert node_fragmentation(n, wl) == D("0.3")
    # A task the node cannot host sees all 1.3 free shares as fragment.
    big = Workload({TaskShape(cpu=10**9, mem=0, frac=10): 1})
    assert node_fragmentation(n, big) == D("1.3")
    cpu_only = Workload({shape_of(Request(cpu=D(1))): 1})
    assert node_fragmentation(n, cpu_only) == D("1.3")


def test_workload_top_and_observe():
    wl = Workload()
    for _ in range(8):
        wl.observe(half())
    wl.observe(Request(gpu=1))
    wl.observe(Request(gpu=2))
    assert len(wl) == 3
    assert set(wl.top(0.8).counts()) == {shape_of(half())}
    v = wl.version
    wl.observe(half())
    assert wl.version > v


def test_online_workload_change_is_seen():
    c = Cluster([node("a", "0"), node("b", "0.5", "0", "0")])
    wl = Workload({TaskShape(cpu=0, mem=0, frac=50): 1})
    first = place(half(), c, "fgd", workload=wl)
    for _ in range(20):
        wl.observe(Request(gpu=1))
    assert place(half(), c, "fgd", workload=wl).node == "b"
    assert first is not None


# --------------------------------------------------------------------------------------------
# Reference implementation (slow, straight from the definitions) and properties
# --------------------------------------------------------------------------------------------


def _frag_units(n: Node, wl: Workload) -> int:
    """F = sum(weight * fragment in hundredths), as in the paper's definition."""
    cpu_free = int((n.cpu - n.cpu_allocated) * 1000)
    mem_free = n.mem - n.mem_allocated
    frees = [(d.model, int(d.free * 100)) for d in n.devices]
    total = sum(f for _, f in frees)
    out = 0
    for s, w in wl.counts().items():
        if not s.needs_gpu or cpu_free < s.cpu or mem_free < s.mem:
            out += w * total
            continue
        need = 100 if s.whole else s.frac
        usable = [f for m, f in frees if f >= need and (not s.models or m in s.models)]
        if s.whole and len(usable) < s.whole:
            out += w * total
        else:
            out += w * (total - sum(usable))
    return out


def reference_place(req: Request, nodes: list[Node], policy: str, wl: Workload | None) -> tuple | None:
    whole, frac = req.gpu, int(req.shares * 100)
    if policy == "whole-gpu" and frac:
        whole, frac = 1, 0
    need = whole * 100 + frac
    wl = wl or Workload.from_requests([req])
    best = None
    for n in nodes:
        cpu_after = int((n.cpu - n.cpu_allocated - req.cpu) * 1000)
        mem_after = n.mem - n.mem_allocated - req.mem
        if cpu_after < 0 or mem_after < 0:
            continue
        allowed = [d for d in n.devices if not req.models or d.model in req.models]
        if whole:
            empty = [d for d in allowed if d.allocated == 0]
            options = [tuple(empty[:whole])] if len(empty) >= whole else []
        elif frac:
            options = [(d,) for d in allowed if int(d.free * 100) >= frac]
        else:
            options = [()]
        total = sum(int(d.free * 100) for d in n.devices)
        for opt in options:
            dev_after = int(opt[0].free * 100) - frac if frac else 0
            if policy == "fgd":
                before = _frag_units(n, wl)
                trial = Node.from_dict(n.to_dict())
                c = Cluster([trial])
                taken = D(1) if whole else req.shares
                apply(c, Placement(n.name, tuple((d.id, taken) for d in opt), req.cpu, req.mem))
                score: tuple = (_frag_units(trial, wl) - before,)
            else:
                sign = -1 if policy == "spread" else 1
                score = (sign * (total - need), sign * dev_after, sign * cpu_after, sign * mem_after)
            key = (score, n.name, opt[0].index if opt else -1)
            if best is None or key < best[0]:
                best = (key, n.name, tuple(d.id for d in opt))
    return None if best is None else (best[1], best[2])


share_values = st.sampled_from(["0", "0", "0.25", "0.5", "0.1", "0.3", "1"])


@st.composite
def clusters(draw):
    names = draw(
        st.lists(st.sampled_from(["a", "b", "c", "d", "e", "n1", "n10"]), min_size=1, max_size=5, unique=True)
    )
    nodes = []
    for name in names:
        model = draw(st.sampled_from(["A100", "T4"]))
        allocs = draw(st.lists(share_values, max_size=4))
        cpu = draw(st.integers(1, 8))
        nodes.append(
            node(name, *allocs, model=model, cpu=cpu, mem=8 * GIB, cpu_allocated=D(draw(st.integers(0, cpu))))
        )
    return nodes


@st.composite
def requests(draw):
    kind = draw(st.sampled_from(["cpu", "frac", "whole"]))
    cpu = D(draw(st.integers(0, 6))) / 2
    mem = draw(st.sampled_from([0, GIB, 4 * GIB]))
    models = draw(st.sampled_from([(), ("T4",), ("A100", "T4")]))
    if kind == "frac":
        return Request(
            cpu=cpu,
            mem=mem,
            shares=D(draw(st.sampled_from(["0.1", "0.25", "0.5", "0.75", "1"]))),
            models=models,
        )
    if kind == "whole":
        return Request(cpu=cpu, mem=mem, gpu=draw(st.integers(1, 3)), models=models)
    return Request(cpu=cpu, mem=mem)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), requests(), st.sampled_from(POLICIES), st.lists(requests(), min_size=1, max_size=4))
def test_place_matches_the_reference(nodes, req, policy, wl_reqs):
    wl = Workload.from_requests(wl_reqs) if policy == "fgd" else None
    p = place(req, Cluster(nodes), policy, workload=wl)
    expected = reference_place(req, sorted(nodes, key=lambda n: n.name), policy, wl)
    got = None if p is None else (p.node, tuple(i for i, _ in p.devices))
    assert got == expected


ops = st.lists(
    st.one_of(
        st.tuples(st.just("place"), requests(), st.sampled_from(POLICIES)),
        st.tuples(st.just("release"), st.integers(0, 50)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), ops, st.lists(requests(), min_size=1, max_size=3), requests())
def test_random_place_apply_release_never_over_commits(nodes, steps, wl_reqs, probe):
    c = Cluster(nodes)
    wl = Workload.from_requests(wl_reqs)
    start = snapshot(c)
    cpu0 = {n.name: n.cpu_allocated for n in nodes}
    dev0 = {d.id: d.allocated for n in nodes for d in n.devices}
    live: list[Placement] = []
    for step in steps:
        if step[0] == "place":
            _, req, policy = step
            p = place(req, c, policy, workload=wl)
            if p is None:
                continue
            if req.shares and policy != "whole-gpu":
                assert len(p.devices) == 1 and p.devices[0][1] == req.shares  # never split
            before = snapshot(c)
            apply(c, p)
            live.append(p)
            if len(live) % 3 == 0:  # release returns exactly what apply took
                release(c, p)
                assert snapshot(c) == before
                apply(c, p)
        elif live:
            p = live.pop(step[1] % len(live))
            release(c, p)
        for n in c.nodes.values():
            assert 0 <= n.cpu_allocated <= n.cpu and 0 <= n.mem_allocated <= n.mem
            for d in n.devices:
                assert 0 <= d.allocated <= 1
        # What is allocated is exactly what was there plus what the live placements took.
        for n in c.nodes.values():
            assert n.cpu_allocated == cpu0[n.name] + sum((p.cpu for p in live if p.node == n.name), D(0))
            for d in n.devices:
                assert d.allocated == dev0[d.id] + sum(
                    (s for p in live for i, s in p.devices if i == d.id), D(0)
                )
    # The long-lived indices agree with a cluster built fresh from the same nodes.
    for policy in POLICIES:
        assert place(probe, c, policy, workload=wl) == place(probe, c.copy(), policy, workload=wl)
    for p in reversed(live):
        release(c, p)
    assert snapshot(c) == start
