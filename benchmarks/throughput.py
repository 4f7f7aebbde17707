#!/usr/bin/env python3
"""Throughput benchmark: scheduling decisions per second through labfleet's real DB path.

Method:

- the openb node list (1,213 nodes, 6,212 GPUs) is registered as the nodes of one resource
  group of a real labfleet database (a SQLite file in a temporary folder by default;
  ``--db-url`` for PostgreSQL), with tenants: ``--domains`` domains of two projects and two
  users each, no caps (``--caps``: every domain and project capped in cpu and gpu.shares, far
  above what the cluster holds, so that every admission reads and checks its caps);
- the cluster is first filled to ``--fill`` of its GPU capacity with the trace's first tasks
  (placed in memory by the group's policy and written as RUNNING sessions in one bulk insert);
- then ``--admissions`` tasks from the trace (continuing where the fill stopped) are admitted
  one by one with ``labfleet.compute.sessions.admit``, each in its own transaction and commit, as the
  service does; before each one, while the GPU demand held is above the fill level, a random
  running session is stopped (``sessions.terminate``), so the run stays at that fill; a task that
  has to wait (PENDING) is cancelled at once, so no queue builds up.

Measured per admission: the whole decision (open the transaction, admit, commit), and within
it the in-memory placement step (every ``Cluster.place`` call the decision makes, timed by a
wrapper installed here); the DB transaction's cost is the difference; and the SQL statements the
decision executes (a ``before_cursor_execute`` listener on the engine, on only inside the
decision).  The cluster cache's hit rate is that of the decisions (``labfleet.compute.clustercache``).
The decisions are also counted in the benchmark thread's CPU time (``cpu_decisions_per_s``,
``decision_cpu_mean_ms``): on a machine busy with other work, wall-clock time includes the waits
for a core, CPU time does not (it still includes what the CPU's contention costs).

Usage::

    python benchmarks/throughput.py [--admissions 2000] [--fill 0.5] [--placement fgd] [--json]
    python benchmarks/throughput.py --db-url postgresql://user@host/emptydb
    python benchmarks/throughput.py --postgres     # a throwaway server (Debian's PostgreSQL binaries)
    python benchmarks/throughput.py --caps --domains 100

Default data: as ``benchmarks/packing.py`` (``<repo>/../shared/data/openb-2023/``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
for p in (REPO, REPO / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))  # so that it runs as a plain script from any directory

from packing import Task, arrivals, data_dir, load_nodes, load_tasks, percentile  # noqa: E402
from sqlalchemy import event, insert, select  # noqa: E402

from labfleet.compute import clustercache, nodes, sessions  # noqa: E402
from labfleet.compute.devices.base import DeviceInfo, NodeInfo  # noqa: E402
from labfleet.compute.scheduler import POLICIES, Cluster, Node  # noqa: E402
from labfleet.core import allocversions, database, unitofwork, usage_ledger  # noqa: E402
from labfleet.core.authz import Actor  # noqa: E402
from labfleet.core.models import Allocation, ComputeSession, Device, Keypair, Project, User  # noqa: E402
from labfleet.core.models import Node as NodeRow  # noqa: E402
from labfleet.core.secretbox import ensure_key_file  # noqa: E402
from labfleet.core.slots import ResourceSlots  # noqa: E402
from labfleet.tenancy import directory, policies  # noqa: E402

CLI = Actor.cli()
GROUP = "openb"
MAX_ADMISSIONS = 100_000


# ---------------------------------------------------------------- timing hook


class PlaceTimer:
    """Wraps ``Cluster.place`` to add up the time of every call made while it is on."""

    def __init__(self) -> None:
        self.total_ns = 0
        self.calls = 0
        self._orig = Cluster.place

    def __enter__(self) -> PlaceTimer:
        orig = self._orig
        timer = self

        def timed(cluster: Cluster, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return orig(cluster, *args, **kwargs)
            finally:
                timer.total_ns += time.perf_counter_ns() - t0
                timer.calls += 1

        Cluster.place = timed  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        Cluster.place = self._orig  # type: ignore[method-assign]

    def take(self) -> float:
        """Milliseconds added up since the last take."""
        ms = self.total_ns / 1e6
        self.total_ns = 0
        return ms


# ---------------------------------------------------------------- the world


def slots_of(task: Task) -> dict[str, Any]:
    r = task.request
    out: dict[str, Any] = {}
    if r.cpu:
        out["cpu"] = str(r.cpu)
    if r.mem:
        out["mem"] = r.mem
    if r.gpu:
        out["gpu"] = r.gpu
    elif r.shares:
        out["gpu.shares"] = str(r.shares)
    return out


@dataclass
class World:
    factory: Any
    engine: Any
    users: list[tuple[str, str]]  # (user name, "domain/project")
    group_id: int
    capacity_milli: int


class StatementCounter:
    """Counts the SQL statements the engine executes (``before_cursor_execute``) while ``on``."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.on = False
        self.count = 0

    def _hook(self, *args: Any) -> None:
        if self.on:
            self.count += 1

    def __enter__(self) -> StatementCounter:
        event.listen(self.engine, "before_cursor_execute", self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self._hook)


# --caps: never reached (the cluster holds 6,212 GPUs and fewer cores), but checked on every admission.
DOMAIN_CAP = {"cpu": 1_000_000, "gpu.shares": 100_000}
PROJECT_CAP = {"cpu": 500_000, "gpu.shares": 50_000}


def build_world(url: str, node_list: list[Node], domains: int, placement: str, caps: bool = False) -> World:
    engine = database.make_engine(url)
    database.upgrade(engine)
    factory = unitofwork.make_session_factory(engine)
    users = []
    with database.session_scope(factory) as db:
        policies.ensure_default_keypair_policy(db)
        group = nodes.create_group(
            db, CLI, {"name": GROUP, "is_public": True, "placement": placement, "scheduler": "fifo"}
        )
        for d in range(domains):
            dname = f"d{d}"
            cap = {"total_resource_slots": DOMAIN_CAP} if caps else {}
            directory.create_domain(db, CLI, {"name": dname, **cap})
            for p in range(2):
                cap = {"total_resource_slots": PROJECT_CAP} if caps else {}
                directory.create_project(db, CLI, {"domain": dname, "name": f"p{p}", **cap})
                for u in range(2):
                    name = f"u{d}-{p}-{u}"
                    directory.create_user(db, CLI, {"username": name, "domain": dname, "projects": [f"p{p}"]})
                    users.append((name, f"{dname}/p{p}"))
        for n in node_list:
            devices = [
                DeviceInfo(uuid=d.id, index=d.index, model=d.model, memory_bytes=d.memory) for d in n.devices
            ]
            nodes.register_node(db, NodeInfo(name=n.name, cpu=n.cpu, mem=n.mem, devices=devices), GROUP)
        group_id = group.id
    capacity = sum(len(n.devices) for n in node_list) * 1000
    return World(factory, engine, users, group_id, capacity)


def prefill(
    world: World, node_list: list[Node], stream, placement: str, fill: float
) -> list[tuple[str, int]]:
    """Fill the cluster to ``fill`` of its GPU capacity in one bulk insert; returns (session id, demand)."""
    cluster = Cluster(Node.from_dict(n.to_dict()) for n in node_list)
    placed: list[tuple[str, Task, Any, tuple[str, str]]] = []
    held = 0
    i = 0
    while held < fill * world.capacity_milli:
        task = next(stream)
        req = task.request
        p = cluster.place(req, placement, None)
        i += 1
        if p is None:
            if i > 100_000:
                break
            continue
        cluster.apply(p)
        held += task.demand_milli
        placed.append((str(uuid.uuid4()), task, p, world.users[len(placed) % len(world.users)]))
    now = datetime.now(timezone.utc)
    with database.session_scope(world.factory) as db:
        node_ids = {name: i for name, i in db.execute(select(NodeRow.name, NodeRow.id))}
        dev_ids = {u: i for u, i in db.execute(select(Device.uuid, Device.id))}
        info = {}
        for name, full in {u for _, _, _, u in placed}:
            user = db.execute(select(User).where(User.username == name)).scalar_one()
            kp_id = db.execute(
                select(Keypair.id).where(Keypair.user_id == user.id, Keypair.is_main.is_(True))
            ).scalar_one()
            project_id = db.execute(
                select(Project.id).where(
                    Project.name == full.split("/")[1], Project.domain_id == user.domain_id
                )
            ).scalar_one()
            info[name] = (user.id, kp_id, project_id, user.domain_id)
        rows, allocs = [], []
        for sid, task, p, (name, _) in placed:
            user_id, kp_id, project_id, domain_id = info[name]
            slots = ResourceSlots(slots_of(task)).to_db()
            rows.append(
                {
                    "id": sid,
                    "name": "",
                    "user_id": user_id,
                    "keypair_id": kp_id,
                    "project_id": project_id,
                    "domain_id": domain_id,
                    "resource_group_id": world.group_id,
                    "type": "batch",
                    "requested_slots": slots,
                    "gpu_models": list(task.request.models),
                    "status": "RUNNING",
                    "status_reason": "",
                    "status_history": [],
                    "node_id": node_ids[p.node],
                    "created_at": now,
                    "status_changed_at": now,
                }
            )
            cpu_milli = int(p.cpu * 1000)
            parts = list(p.devices) or [(None, Decimal(0))]
            for j, (dev, shares) in enumerate(parts):
                allocs.append(
                    {
                        "session_id": sid,
                        "node_id": node_ids[p.node],
                        "device_id": dev_ids[dev] if dev else None,
                        "shares_centi": int(shares * 100),
                        "cpu_milli": cpu_milli if j == 0 else 0,
                        "mem": p.mem if j == 0 else 0,
                    }
                )
        allocversions.bump(db, world.group_id)
        db.execute(insert(ComputeSession), rows)
        db.execute(insert(Allocation), allocs)
        usage_ledger.recalculate(db)  # the bulk insert went around the ledger: build it from the sessions
    return [(sid, task.demand_milli) for sid, task, _, _ in placed]


# ---------------------------------------------------------------- the run


@dataclass
class Run:
    decisions_ms: list[float] = field(default_factory=list)
    decisions_cpu_ms: list[float] = field(default_factory=list)  # this thread's CPU time, same span
    place_ms: list[float] = field(default_factory=list)
    release_ms: list[float] = field(default_factory=list)
    statements: list[int] = field(default_factory=list)
    outcomes: dict[str, int] = field(default_factory=lambda: {"SCHEDULED": 0, "PENDING": 0, "refused": 0})
    elapsed_s: float = 0.0
    hits: int = 0
    rebuilds: int = 0


def run(world: World, stream, live: list[tuple[str, int]], n: int, fill: float, seed: int) -> Run:
    rnd = random.Random(seed)
    held = sum(d for _, d in live)
    out = Run()

    def stop(i: int) -> None:
        sid, _ = live[i]
        live[i] = live[-1]
        live.pop()
        t0 = time.perf_counter_ns()
        with database.session_scope(world.factory) as db:
            sessions.terminate(db, CLI, sid)
        out.release_ms.append((time.perf_counter_ns() - t0) / 1e6)

    before = clustercache.stats()
    t_start = time.perf_counter()
    with PlaceTimer() as timer, StatementCounter(world.engine) as stmts:
        for k in range(n):
            while held > fill * world.capacity_milli and live:
                i = rnd.randrange(len(live))
                held -= live[i][1]
                stop(i)
            task = next(stream)
            user, project = world.users[k % len(world.users)]
            body = {
                "project": project,
                "username": user,
                "resource_group": GROUP,
                "slots": slots_of(task),
                "type": "batch",
            }
            if task.request.models:
                body["gpu_models"] = list(task.request.models)
            timer.take()
            stmts.count = 0
            stmts.on = True
            c0 = time.thread_time_ns()
            t0 = time.perf_counter_ns()
            try:
                with database.session_scope(world.factory) as db:
                    s = sessions.admit(db, CLI, body)
                    sid, status = s.id, s.status
            except sessions.Refused:
                sid, status = "", "refused"
            out.decisions_ms.append((time.perf_counter_ns() - t0) / 1e6)
            out.decisions_cpu_ms.append((time.thread_time_ns() - c0) / 1e6)
            stmts.on = False
            out.statements.append(stmts.count)
            out.place_ms.append(timer.take())
            out.outcomes[status] += 1
            if status == "SCHEDULED":
                live.append((sid, task.demand_milli))
                held += task.demand_milli
            elif status == "PENDING":
                live.append((sid, 0))
                stop(len(live) - 1)  # cancel: no queue builds up
    out.elapsed_s = time.perf_counter() - t_start
    after = clustercache.stats()
    out.hits = after["hits"] - before["hits"]
    out.rebuilds = after["rebuilds"] - before["rebuilds"]
    return out


def rebuild_ms(world: World, repeat: int = 3) -> float:
    """What a decision would pay without the cache: rebuilding the group's cluster from the DB (best of 3)."""
    best = float("inf")
    for _ in range(repeat):
        with database.session_scope(world.factory) as db:
            t0 = time.perf_counter_ns()
            clustercache.build(db, world.group_id, allocversions.version(db, world.group_id))
            best = min(best, (time.perf_counter_ns() - t0) / 1e6)
    return best


def summary(r: Run, world: World, args: argparse.Namespace, db_kind: str) -> dict[str, Any]:
    dec = sorted(r.decisions_ms)
    plc = sorted(r.place_ms)
    dbc = sorted(d - p for d, p in zip(r.decisions_ms, r.place_ms, strict=True))
    rel = sorted(r.release_ms)
    total_decision_s = sum(dec) / 1000
    total_cpu_s = sum(r.decisions_cpu_ms) / 1000
    looks = r.hits + r.rebuilds
    return {
        "db": db_kind,
        "nodes": args.n_nodes,
        "gpus": world.capacity_milli // 1000,
        "placement": args.placement,
        "fill": args.fill,
        "caps": args.caps,
        "admissions": len(dec),
        "outcomes": r.outcomes,
        "decisions_per_s": len(dec) / total_decision_s if total_decision_s else 0.0,
        "decision_p50_ms": percentile(dec, 0.5),
        "decision_p99_ms": percentile(dec, 0.99),
        "decision_mean_ms": total_decision_s * 1000 / len(dec) if dec else 0.0,
        # The same decisions counted in this thread's CPU time (user and system): what the decisions
        # cost without the waits for a core that other processes on a busy machine cause.
        "decision_cpu_mean_ms": total_cpu_s * 1000 / len(dec) if dec else 0.0,
        "cpu_decisions_per_s": len(dec) / total_cpu_s if total_cpu_s else 0.0,
        "place_p50_ms": percentile(plc, 0.5),
        "place_p99_ms": percentile(plc, 0.99),
        "place_max_ms": plc[-1] if plc else 0.0,
        "place_mean_ms": sum(plc) / len(plc) if plc else 0.0,
        "db_p50_ms": percentile(dbc, 0.5),
        "db_p99_ms": percentile(dbc, 0.99),
        "db_mean_ms": sum(dbc) / len(dbc) if dbc else 0.0,
        "statements_per_admission": {
            "mean": round(sum(r.statements) / len(r.statements), 2) if r.statements else 0.0,
            "p50": sorted(r.statements)[len(r.statements) // 2] if r.statements else 0,
            "max": max(r.statements, default=0),
        },
        "releases": len(rel),
        "release_p50_ms": percentile(rel, 0.5),
        "release_p99_ms": percentile(rel, 0.99),
        "cache_hit_rate": r.hits / looks if looks else 0.0,
        "cache_rebuilds": r.rebuilds,
        "elapsed_s": r.elapsed_s,
    }


def print_table(s: dict[str, Any]) -> None:
    o = s["outcomes"]
    print(
        f"db: {s['db']}   nodes: {s['nodes']} ({s['gpus']} GPUs)   placement: {s['placement']}   "
        f"fill: {s['fill']:.0%} of GPU capacity"
    )
    print(
        f"admissions: {s['admissions']} ({o['SCHEDULED']} scheduled, {o['PENDING']} pending then cancelled, "
        f"{o['refused']} refused)   releases: {s['releases']}   elapsed: {s['elapsed_s']:.1f} s"
    )
    head = f"{'step':<34} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}"
    print(head)
    print("-" * len(head))
    print(
        f"{'decision, end to end (incl. commit)':<34} {s['decision_p50_ms']:>8.3f} {s['decision_p99_ms']:>8.3f} "
        f"{s['decision_mean_ms']:>8.3f}"
    )
    print(
        f"{'  in-memory placement (place())':<34} {s['place_p50_ms']:>8.3f} {s['place_p99_ms']:>8.3f} "
        f"{s['place_mean_ms']:>8.3f}"
    )
    print(
        f"{'  DB transaction (the rest)':<34} {s['db_p50_ms']:>8.3f} {s['db_p99_ms']:>8.3f} {s['db_mean_ms']:>8.3f}"
    )
    print(
        f"{'release (terminate, own txn)':<34} {s['release_p50_ms']:>8.3f} {s['release_p99_ms']:>8.3f} {'':>8}"
    )
    print(
        f"SQL statements per admission (inside the decision): mean {s['statements_per_admission']['mean']:.1f}, "
        f"median {s['statements_per_admission']['p50']}, max {s['statements_per_admission']['max']}"
    )
    print(
        f"decisions/s (end to end): {s['decisions_per_s']:.0f}   counted in CPU time: "
        f"{s['cpu_decisions_per_s']:.0f} ({s['decision_cpu_mean_ms']:.3f} ms each)   cluster cache hit rate: "
        f"{s['cache_hit_rate']:.1%} ({s['cache_rebuilds']} rebuilds; one rebuild from the DB: "
        f"{s['rebuild_ms']:.0f} ms)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    d = data_dir()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--nodes", type=Path, default=d / "openb_node_list_gpu_node.csv")
    ap.add_argument("--pods", type=Path, default=d / "openb_pod_list_default.csv")
    ap.add_argument("--db-url", default=None, help="an empty database (default: SQLite in a temp folder)")
    ap.add_argument(
        "--postgres",
        action="store_true",
        help="start a throwaway PostgreSQL server (tests/postgres_server.py) and run on it",
    )
    ap.add_argument(
        "--admissions", type=int, default=2000, help=f"admissions timed (at most {MAX_ADMISSIONS})"
    )
    ap.add_argument("--fill", type=float, default=0.5, help="GPU fill level kept during the run (0..0.95)")
    ap.add_argument("--placement", default="fgd", choices=POLICIES)
    ap.add_argument("--domains", type=int, default=10, help="domains (each: 2 projects, 2 users per project)")
    ap.add_argument(
        "--caps",
        action="store_true",
        help="cap every domain and project (cpu, gpu.shares; never reached, checked on every admission)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if not 1 <= args.admissions <= MAX_ADMISSIONS:
        ap.error(f"--admissions must be 1..{MAX_ADMISSIONS}")
    if not 0 <= args.fill <= 0.95:
        ap.error("--fill must be in 0..0.95")
    if not 1 <= args.domains <= 100:
        ap.error("--domains must be 1..100")
    if args.postgres and args.db_url:
        ap.error("--postgres starts its own server: give it or --db-url, not both")
    for path in (args.nodes, args.pods):
        if not path.exists():
            ap.error(f"{path} not found (set LABFLEET_SHARED_DATA or pass --nodes/--pods)")
    node_list = load_nodes(args.nodes)
    tasks = load_tasks(args.pods)
    args.n_nodes = len(node_list)

    with contextlib.ExitStack() as stack:
        if args.postgres:
            from tests.postgres_server import fresh_database, running_postgres

            server = stack.enter_context(running_postgres())
            args.db_url = fresh_database(server.url(), "throughput")
        return _measure(args, node_list, tasks)


def _measure(args: argparse.Namespace, node_list: list[Node], tasks: list[Task]) -> int:
    with tempfile.TemporaryDirectory(prefix="lf-throughput-") as tmp:
        key = Path(tmp) / "secret.key"
        os.environ["LABFLEET_SECRET_KEY_FILE"] = str(key)
        ensure_key_file(key)
        url = args.db_url or f"sqlite:///{Path(tmp) / 'labfleet.sqlite'}"
        db_kind = database.make_engine(url).dialect.name  # no connection yet: nothing to dispose
        if not args.json:
            print(f"setting up {len(node_list)} nodes in {db_kind} ...", flush=True)
        world = build_world(url, node_list, args.domains, args.placement, args.caps)
        stream = arrivals(tasks)
        live = prefill(world, node_list, stream, args.placement, args.fill)
        result = run(world, stream, live, args.admissions, args.fill, args.seed)
        s = summary(result, world, args, db_kind)
        s["rebuild_ms"] = rebuild_ms(world)
        world.engine.dispose()
    if args.json:
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in s.items()}))
    else:
        print_table(s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
