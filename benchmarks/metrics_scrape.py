#!/usr/bin/env python3
"""Metrics scrape cost: what one GET /services/labfleet/metrics costs the service's DB and CPU.

Method: the openb node list (1,213 nodes, 6,212 GPUs) registered in a real labfleet database with
``--domains`` domains of two projects and two users each (``throughput.build_world``), every domain
and project capped, and the cluster filled to ``--fill`` of its GPU capacity with RUNNING sessions
(``throughput.prefill``). Then ``--scrapes`` scrapes through ``labfleet.usage.metrics.Metrics``
(the DB read, the families and the text exposition, as the handler answers it), each timed, with
the SQL statements counted (a ``before_cursor_execute`` listener; SQLite's BEGIN IMMEDIATE apart).

Usage::

    python benchmarks/metrics_scrape.py [--scrapes 50] [--fill 0.5] [--json]
    python benchmarks/metrics_scrape.py --db-url postgresql://user@host/emptydb
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for p in (REPO, REPO / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))  # so that it runs as a plain script from any directory

from packing import arrivals, data_dir, load_nodes, load_tasks, percentile  # noqa: E402
from sqlalchemy import event, update  # noqa: E402
from throughput import build_world, prefill  # noqa: E402

from labfleet.core import database  # noqa: E402
from labfleet.core.models import Domain, Project  # noqa: E402
from labfleet.core.secretbox import ensure_key_file  # noqa: E402
from labfleet.usage.metrics import Metrics  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
    d = data_dir()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--nodes", type=Path, default=d / "openb_node_list_gpu_node.csv")
    ap.add_argument("--pods", type=Path, default=d / "openb_pod_list_default.csv")
    ap.add_argument("--db-url", default=None, help="an empty database (default: SQLite in a temp folder)")
    ap.add_argument("--scrapes", type=int, default=50)
    ap.add_argument("--fill", type=float, default=0.5, help="GPU fill level (0..0.95)")
    ap.add_argument("--domains", type=int, default=10, help="domains (each: 2 projects, 2 users per project)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if not 1 <= args.scrapes <= 10_000 or not 0 <= args.fill <= 0.95 or not 1 <= args.domains <= 100:
        ap.error("--scrapes 1..10000, --fill 0..0.95, --domains 1..100")
    node_list = load_nodes(args.nodes)
    with tempfile.TemporaryDirectory(prefix="lf-metrics-") as tmp:
        key = Path(tmp) / "secret.key"
        os.environ["LABFLEET_SECRET_KEY_FILE"] = str(key)
        ensure_key_file(key)
        url = args.db_url or f"sqlite:///{Path(tmp) / 'labfleet.sqlite'}"
        world = build_world(url, node_list, args.domains, "fgd")
        live = prefill(world, node_list, arrivals(load_tasks(args.pods)), "fgd", args.fill)
        with database.session_scope(world.factory) as db:  # caps, so every quota series has its limit
            db.execute(update(Domain).values(total_resource_slots={"cpu": 100000, "gpu.shares": 5000}))
            db.execute(update(Project).values(total_resource_slots={"cpu": 50000, "gpu.shares": 2500}))
        metrics = Metrics(world.factory)
        statements: list[str] = []

        def count(conn, cursor, statement, *rest):
            if not statement.startswith("BEGIN"):
                statements.append(statement)

        event.listen(world.engine, "before_cursor_execute", count)
        metrics.exposition()  # warm: the first one compiles the statements
        times, per_scrape = [], []
        size = 0
        for _ in range(args.scrapes):
            statements.clear()
            start = time.perf_counter()
            body = metrics.exposition()
            times.append((time.perf_counter() - start) * 1000)
            per_scrape.append(len(statements))
            size = len(body)
        series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
        out = {
            "db": world.engine.dialect.name,
            "nodes": len(node_list),
            "gpus": sum(len(n.devices) for n in node_list),
            "sessions": len(live),
            "domains": args.domains,
            "projects": 2 * args.domains,
            "scrapes": args.scrapes,
            "scrape_ms_p50": round(percentile(sorted(times), 0.5), 2),
            "scrape_ms_p99": round(percentile(sorted(times), 0.99), 2),
            "statements": max(per_scrape),
            "series": series,
            "bytes": size,
        }
        world.engine.dispose()
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:>14}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
