#!/usr/bin/env python3
"""Packing benchmark: how much GPU demand each placement policy serves on the openb trace.

Method (FGD-style workload inflation, deterministic; Weng et al., USENIX ATC 2023):

- the cluster is the node list (all nodes empty);
- tasks arrive in creation order (all of them: CPU-only tasks take CPU and memory too),
  cycling through the list again when it runs out; nothing departs;
- each task is placed with ``labfleet.compute.scheduler.place`` and ``apply``-ed; a task that fits
  nowhere fails and is skipped;
- arrivals stop once the GPU demand that has arrived (served or not) reaches the cluster's GPU
  capacity.

The score of a policy is served GPU demand / GPU capacity, where a fractional task counts what
it asked (gpu_milli / 1000) even where ``whole-gpu`` rounds it up to a device.  The ``fgd``
policy's target workload is the trace's own task mix, given up front (``--workload online``:
estimated from the tasks seen so far instead).

Usage::

    python benchmarks/packing.py [--nodes NODES.csv] [--pods PODS.csv] [--json]
    python benchmarks/packing.py --decisions-only      # in-memory decision latency only

Default data: ``<repo>/../shared/data/openb-2023/`` or ``$LABFLEET_SHARED_DATA/openb-2023/``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # so that it runs as a plain script from any directory

from labfleet.compute.scheduler import POLICIES, Cluster, Device, Node, Request, Workload, apply, place  # noqa: E402

MIB = 2**20
GIB = 2**30
# Device memory of the trace's models, for completeness (placement does not use it).
MODEL_MEMORY = {"V100M16": 16 * GIB, "V100M32": 32 * GIB, "T4": 16 * GIB, "P100": 16 * GIB, "A10": 24 * GIB}
DEVICE_NAMESPACE = uuid.UUID("6f1c0c52-5d4e-4c1e-9a57-1f1a3c1b0e42")


def data_dir() -> Path:
    """The openb-2023 folder: $LABFLEET_SHARED_DATA/openb-2023, else <repo>/../shared/data/openb-2023."""
    env = os.environ.get("LABFLEET_SHARED_DATA")
    if env:
        base = Path(env)
        return base if (base / "openb_node_list_gpu_node.csv").exists() else base / "openb-2023"
    return REPO.parent / "shared" / "data" / "openb-2023"


@dataclass(frozen=True)
class Task:
    name: str
    request: Request
    demand_milli: int  # GPU asked, in thousandths of a device (what the score counts)


def load_nodes(path: Path) -> list[Node]:
    """Nodes from an openb node list (sn, cpu_milli, memory_mib, gpu, model); all empty."""
    nodes = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            model = row["model"] or ""
            devices = [
                Device(
                    id=str(uuid.uuid5(DEVICE_NAMESPACE, f"{row['sn']}/{i}")),
                    index=i,
                    model=model,
                    memory=MODEL_MEMORY.get(model, 0),
                )
                for i in range(int(row["gpu"]))
            ]
            nodes.append(
                Node(
                    name=row["sn"],
                    cpu=Decimal(int(row["cpu_milli"])) / 1000,
                    mem=int(row["memory_mib"]) * MIB,
                    devices=devices,
                )
            )
    return nodes


def load_tasks(path: Path) -> list[Task]:
    """Tasks from an openb pod list, in creation order (ties keep file order)."""
    rows = []
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    rows.sort(key=lambda r: int(r["creation_time"] or 0))
    tasks = []
    for r in rows:
        num_gpu = int(r["num_gpu"])
        milli = int(r["gpu_milli"] or 0)
        models = tuple(m for m in (r.get("gpu_spec") or "").split("|") if m)
        cpu = Decimal(int(r["cpu_milli"])) / 1000
        mem = int(r["memory_mib"]) * MIB
        if num_gpu == 1 and 0 < milli < 1000:
            req = Request(cpu=cpu, mem=mem, shares=Decimal(milli) / 1000, models=models)
            demand = milli
        else:
            # num_gpu > 1 asks whole devices; gpu_milli only matters when num_gpu == 1.
            req = Request(cpu=cpu, mem=mem, gpu=num_gpu, models=models)
            demand = num_gpu * 1000
        tasks.append(Task(r["name"], req, demand))
    return tasks


def arrivals(tasks: Sequence[Task]) -> Iterator[Task]:
    """The trace, over and over."""
    while True:
        yield from tasks


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


@dataclass
class Result:
    policy: str
    capacity_milli: int
    arrived_milli: int = 0
    served_milli: int = 0
    tasks: int = 0
    failed_gpu: int = 0
    failed_cpu: int = 0
    elapsed_s: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    p99_cpu_ms: float = 0.0  # thread CPU time: what a decision costs, without preemption by other processes
    decisions_per_s: float = 0.0

    @property
    def served_fraction(self) -> float:
        return self.served_milli / self.capacity_milli if self.capacity_milli else 0.0


def trace_workload(tasks: Sequence[Task]) -> Workload:
    return Workload.from_requests(t.request for t in tasks)


def replay(
    nodes: list[Node],
    tasks: Sequence[Task],
    policy: str,
    workload_mode: str = "trace",
    stop_fraction: float = 1.0,
    refresh: int = 200,
) -> tuple[Result, Cluster, Workload | None, Iterator[Task]]:
    """Replay the trace with one policy until arrived GPU demand reaches ``stop_fraction`` of capacity.

    ``workload_mode`` "online": fgd's target is a snapshot of the tasks seen so far, renewed every
    ``refresh`` tasks (each renewal drops the fragmentation memo, so not on every task).
    """
    cluster = Cluster(Node.from_dict(n.to_dict()) for n in nodes)
    capacity = sum(len(n.devices) for n in nodes) * 1000
    res = Result(policy, capacity)
    workload: Workload | None = None
    seen = Workload()
    if policy == "fgd":
        workload = trace_workload(tasks) if workload_mode == "trace" else Workload()
    lat: list[float] = []
    cpu_lat: list[float] = []
    stream = arrivals(tasks)
    t_start = time.perf_counter()
    while res.arrived_milli < stop_fraction * capacity:
        task = next(stream)
        if workload is not None and workload_mode == "online":
            seen.observe(task.request)
            if res.tasks % refresh == 0:
                workload = Workload(seen.counts())
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        p = place(task.request, cluster, policy, workload=workload)
        lat.append((time.perf_counter_ns() - t0) / 1e6)
        cpu_lat.append((time.thread_time_ns() - c0) / 1e6)
        res.tasks += 1
        res.arrived_milli += task.demand_milli
        if p is None:
            if task.demand_milli:
                res.failed_gpu += 1
            else:
                res.failed_cpu += 1
            continue
        apply(cluster, p)
        res.served_milli += task.demand_milli
    res.elapsed_s = time.perf_counter() - t_start
    lat.sort()
    res.p50_ms, res.p99_ms, res.max_ms = percentile(lat, 0.5), percentile(lat, 0.99), lat[-1] if lat else 0.0
    res.p99_cpu_ms = percentile(sorted(cpu_lat), 0.99)
    res.decisions_per_s = len(lat) / (sum(lat) / 1000) if lat else 0.0
    return res, cluster, workload, stream


def measure_decisions(
    cluster: Cluster, requests: Sequence[Request], policy: str, workload: Workload | None = None
) -> dict[str, float]:
    """In-memory decision speed: ``place`` (no ``apply``) for each request on a fixed state.

    Returns decisions/s and p50 / p99 / max latency in milliseconds.
    """
    lat = []
    cpu_lat = []
    for r in requests:
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        place(r, cluster, policy, workload=workload)
        lat.append((time.perf_counter_ns() - t0) / 1e6)
        cpu_lat.append((time.thread_time_ns() - c0) / 1e6)
    lat.sort()
    return {
        "decisions": len(lat),
        "decisions_per_s": len(lat) / (sum(lat) / 1000) if lat else 0.0,
        "p50_ms": percentile(lat, 0.5),
        "p99_ms": percentile(lat, 0.99),
        "max_ms": lat[-1] if lat else 0.0,
        "p99_cpu_ms": percentile(sorted(cpu_lat), 0.99),
    }


def print_table(results: list[Result], nodes_path: Path, pods_path: Path, n_nodes: int) -> None:
    cap = results[0].capacity_milli / 1000 if results else 0
    print(f"nodes: {nodes_path.name} ({n_nodes} nodes, {cap:g} GPUs)   pods: {pods_path.name}")
    head = (
        f"{'policy':<10} {'served/cap':>10} {'served GPUs':>11} {'failed GPU':>10} {'failed CPU':>10} "
        f"{'tasks':>6} {'elapsed s':>9} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'p99 cpu':>7} {'dec/s':>7}"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        print(
            f"{r.policy:<10} {r.served_fraction:>10.4f} {r.served_milli / 1000:>11.2f} {r.failed_gpu:>10} "
            f"{r.failed_cpu:>10} {r.tasks:>6} {r.elapsed_s:>9.1f} {r.p50_ms:>7.3f} {r.p99_ms:>7.3f} "
            f"{r.max_ms:>7.2f} {r.p99_cpu_ms:>7.3f} {r.decisions_per_s:>7.0f}"
        )
    print(
        "latency: one place() call on the live state of the replay, all nodes considered; wall clock,\n"
        "'p99 cpu' = p99 of the calling thread's CPU time (excludes preemption by other processes)"
    )


def decisions_only(
    nodes: list[Node], tasks: Sequence[Task], policies: Sequence[str], n: int, fill: float
) -> None:
    """Fill the cluster to ``fill`` of GPU capacity with each policy, then time ``n`` decisions."""
    print(f"in-memory decisions on a cluster filled to {fill:.0%} of GPU capacity, {n} requests, no apply")
    head = f"{'policy':<10} {'decisions':>9} {'dec/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'p99 cpu':>7}"
    print(head)
    print("-" * len(head))
    for policy in policies:
        _, cluster, workload, stream = replay(nodes, tasks, policy, stop_fraction=fill)
        reqs = [next(stream).request for _ in range(n)]
        s = measure_decisions(cluster, reqs, policy, workload)
        print(
            f"{policy:<10} {s['decisions']:>9} {s['decisions_per_s']:>8.0f} {s['p50_ms']:>7.3f} "
            f"{s['p99_ms']:>7.3f} {s['max_ms']:>7.2f} {s['p99_cpu_ms']:>7.3f}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    d = data_dir()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--nodes", type=Path, default=d / "openb_node_list_gpu_node.csv")
    ap.add_argument("--pods", type=Path, default=d / "openb_pod_list_default.csv")
    ap.add_argument(
        "--policies", default=",".join(POLICIES), help="comma-separated subset of " + ",".join(POLICIES)
    )
    ap.add_argument("--workload", choices=("trace", "online"), default="trace", help="fgd's target workload")
    ap.add_argument(
        "--refresh", type=int, default=200, help="online workload: renew the estimate every N tasks"
    )
    ap.add_argument("--json", action="store_true", help="print only {policy: served fraction}")
    ap.add_argument("--decisions-only", action="store_true", help="only time in-memory decisions")
    ap.add_argument("--decisions", type=int, default=2000, help="requests timed by --decisions-only")
    ap.add_argument("--fill", type=float, default=0.5, help="GPU fill level for --decisions-only")
    args = ap.parse_args(argv)

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for p in policies:
        if p not in POLICIES:
            ap.error(f"unknown policy {p!r}")
    for path in (args.nodes, args.pods):
        if not path.exists():
            ap.error(f"{path} not found (set LABFLEET_SHARED_DATA or pass --nodes/--pods)")
    nodes = load_nodes(args.nodes)
    tasks = load_tasks(args.pods)

    if args.decisions_only:
        decisions_only(nodes, tasks, policies, args.decisions, args.fill)
        return 0

    results = [replay(nodes, tasks, p, args.workload, refresh=args.refresh)[0] for p in policies]
    if args.json:
        print(json.dumps({r.policy: round(r.served_fraction, 6) for r in results}))
    else:
        print_table(results, args.nodes, args.pods, len(nodes))
        if results:
            mean_ms = statistics.fmean(r.elapsed_s * 1000 / max(r.tasks, 1) for r in results)
            print(f"mean time per task over all policies: {mean_ms:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
