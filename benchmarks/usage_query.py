#!/usr/bin/env python3
"""Usage statistics latency: what ``GET /api/usage`` and ``/api/usage/me`` cost over a month of records.

Method: a real labfleet database (SQLite in a temporary folder, or ``--db-url`` for an empty
PostgreSQL database) gets ``--users`` users in ``--domains`` domains, each with one session that
ran the whole of the last ``--days`` days, so the usage records hold one 15-minute bucket per user
per quarter hour (1,000 users x 30 days = 2.88 million rows), written as the service writes them
(``records.write``: the 15-minute buckets and their sums per day, names copied). A few users' sessions are still live (their state row
unfinished), so the queries also add the live tail. Then each query is timed ``--repeat`` times,
in process, as the handler runs it (``stats.parse_query`` + ``stats.report`` / ``stats.me``, and
``stats.as_csv`` for CSV): the HTTP layer adds about a millisecond.

Queries: a superadmin's ``group_by=user`` over the 30 days up to now (1,000 rows) and over whole
days (midnight to midnight, as a monthly chargeback asks: no 15-minute rows at the edges), ``group_by=domain&bucket=day``,
``group_by=project`` as CSV, a domain admin's ``group_by=user`` (their domain only), a user's own
``group_by=user&bucket=15m`` over 7 days, and ``/api/usage/me`` (four queries on one user's rows).

Usage::

    python benchmarks/usage_query.py [--users 1000] [--domains 10] [--days 30] [--repeat 5] [--json]
    python benchmarks/usage_query.py --db-url postgresql://user@host/emptydb
    python benchmarks/usage_query.py --postgres     # a throwaway server (Debian's PostgreSQL binaries)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # so that it runs as a plain script from any directory

from sqlalchemy import func, select  # noqa: E402

from labfleet.core import database, unitofwork  # noqa: E402
from labfleet.core.authz import Actor  # noqa: E402
from labfleet.core.models import UsageBucket, UsageSessionState  # noqa: E402
from labfleet.core.secretbox import ensure_key_file  # noqa: E402
from labfleet.usage import accrual, records, stats  # noqa: E402


def fill(factory, users: int, domains: int, days: int, now: datetime) -> int:
    """One running session per user over the last ``days`` days, in 15-minute buckets."""
    end = accrual.floor_bucket(now)
    start = end - timedelta(days=days)
    buckets = []
    t = start
    while t < end:
        buckets.append(t)
        t += accrual.BUCKET
    rows = 0
    with database.session_scope(factory) as db:
        for u in range(users):
            domain = f"d{u % domains:02d}"
            name, sid = f"user{u:04d}", f"{u:08d}-0000-4000-8000-000000000000"
            gpu = (u % 4) * 0.25  # 0, a quarter, a half, three quarters of a GPU
            names = {
                sid: SimpleNamespace(
                    user=name, project=f"{domain}/p{u % 2}", domain=domain, resource_group="default"
                )
            }
            amounts = {
                "alloc_cpu": 900.0 * 2,
                "alloc_mem": 900.0 * 8 * 2**30,
                "alloc_gpu": 900.0 * gpu,
                "used_cpu": 900.0 * 0.7,
                "used_mem": 900.0 * 3 * 2**30,
                "used_gpu": 900.0 * gpu * 0.4,
                "mem_peak": 4.0 * 2**30,
                "gpu_mem_peak": 10.0 * 2**30 if gpu else 0.0,
            }
            rows += records.write(db, names, {(sid, b): dict(amounts) for b in buckets})
            if u % 10 == 0:  # a tenth of them still running: the queries add their live tail
                db.add(
                    UsageSessionState(
                        session_id=sid,
                        user=name,
                        project=f"{domain}/p{u % 2}",
                        domain=domain,
                        resource_group="default",
                        alloc_cpu=2.0,
                        alloc_mem=8.0 * 2**30,
                        alloc_gpu=gpu,
                        held_from=start,
                        accrued_until=end,
                        mem_peak=0.0,
                        gpu_mem_peak=0.0,
                        finished=False,
                    )
                )
    return rows


def timed(fn, repeat: int) -> dict:
    times = []
    result = None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append(1000 * (time.perf_counter() - t))
    return {"ms_median": round(statistics.median(times), 1), "ms_max": round(max(times), 1), "result": result}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=1000)
    ap.add_argument("--domains", type=int, default=10)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--db-url", default=None, help="an empty database (default: SQLite in a temporary folder)"
    )
    ap.add_argument(
        "--postgres", action="store_true", help="start a throwaway PostgreSQL server and run on it"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.postgres and args.db_url:
        ap.error("--postgres starts its own server: give it or --db-url, not both")
    with contextlib.ExitStack() as stack:
        if args.postgres:
            from tests.postgres_server import fresh_database, running_postgres

            server = stack.enter_context(running_postgres())
            args.db_url = fresh_database(server.url(), "usage_query")
        return _measure(args)


def _measure(args: argparse.Namespace) -> int:
    tmp = tempfile.mkdtemp(prefix="lf-usage-bench-")
    os.environ.setdefault("LABFLEET_SECRET_KEY_FILE", str(Path(tmp) / "key"))
    ensure_key_file(Path(os.environ["LABFLEET_SECRET_KEY_FILE"]))
    url = args.db_url or f"sqlite:///{tmp}/usage.sqlite"
    engine = database.make_engine(url)
    database.upgrade(engine)
    factory = unitofwork.make_session_factory(engine)
    now = datetime.now(timezone.utc)
    t = time.perf_counter()
    rows = fill(factory, args.users, args.domains, args.days, now)
    fill_s = time.perf_counter() - t
    with factory() as db:
        assert db.scalar(select(func.count()).select_from(UsageBucket)) == rows

    root = Actor(name="root", role="superadmin", domain="root")
    admin = Actor(name="adm", role="admin", domain="d03")
    user = Actor(name="user0003", role="user", domain="d03")
    month = {"start": (now - timedelta(days=args.days)).isoformat()}
    week = {"start": (now - timedelta(days=7)).isoformat()}
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    whole_days = {
        "start": (midnight - timedelta(days=args.days - 1)).isoformat(),
        "end": midnight.isoformat(),
    }

    def run(actor, args_, csv=False):
        q = stats.parse_query(args_, datetime.now(timezone.utc))
        with factory() as db:
            answer = stats.report(db, actor, q)
        return len(stats.as_csv(answer)) if csv else len(answer["rows"])

    def me():
        with factory() as db:
            return len(stats.me(db, user)["daily"])

    queries = {
        "superadmin group_by=user (30 d)": lambda: run(root, {"group_by": "user", **month}),
        "superadmin group_by=user (whole days)": lambda: run(root, {"group_by": "user", **whole_days}),
        "superadmin group_by=domain bucket=day (30 d)": lambda: run(
            root, {"group_by": "domain", "bucket": "day", **month}
        ),
        "superadmin group_by=project csv (30 d)": lambda: run(
            root, {"group_by": "project", "format": "csv", **month}, csv=True
        ),
        "domain admin group_by=user (30 d)": lambda: run(admin, {"group_by": "user", **month}),
        "user group_by=user bucket=15m (7 d)": lambda: run(
            user, {"group_by": "user", "bucket": "15m", **week}
        ),
        "user /api/usage/me": me,
    }
    results = {name: timed(fn, args.repeat) for name, fn in queries.items()}
    out = {
        "db": engine.dialect.name,
        "users": args.users,
        "domains": args.domains,
        "days": args.days,
        "bucket_rows": rows,
        "fill_s": round(fill_s, 1),
        "queries": results,
    }
    engine.dispose()
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(
            f"{out['db']}: {rows:,} bucket rows ({args.users} users, {args.days} days), filled in {out['fill_s']} s"
        )
        for name, r in results.items():
            print(
                f"  {name:48s} median {r['ms_median']:8.1f} ms  max {r['ms_max']:8.1f} ms  ({r['result']} rows/bytes)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
