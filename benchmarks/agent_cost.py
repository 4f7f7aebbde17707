#!/usr/bin/env python3
"""Node agent heartbeat cost: what the labfleet service spends on one heartbeat of a node agent.

Goal (issue [7/8]): say what a heartbeat costs the service, with few and with many sessions on the
agent's node, so that a fleet's heartbeat load can be sized (nodes / heartbeat interval x cost).
The agent's own cost per tick is the trusted sampler's: ``benchmarks/sampler_cost.py`` measures it
(the agent runs the same ``Sampler``).

Method: a fresh SQLite DB (a file under a temporary directory), one domain, project and user, a node
token and an agent's node ``n2`` with 8 mock 80 GB GPUs and 512 cores registered as an agent does;
``--sessions`` sessions admitted onto it (a mix: a quarter of a GPU, or CPU only). Then
``--beats`` heartbeats, each exactly what ``POST /api/agent/heartbeat`` does in the service
(``labfleet.service.handlers.agents``): parse the body (every session reported running, with one
reading per session: CPU, memory and, for those holding one, their GPU), authenticate the token
(the cached check, as a running service does after the first), record the beat, read the node's
targets and keep the readings of its own sessions; one transaction a beat. Each beat is timed with
``time.perf_counter()`` and ``time.process_time()``; the first is reported apart (cold caches).

Usage::

    .venv/bin/python benchmarks/agent_cost.py [--sessions 0,10,100,400] [--beats 200] [--json]

Prints a table, or with ``--json`` one JSON object per session count: per-beat wall and CPU ms
(p50, p95, max), the body's size, and how many nodes one core could take at a 10 s heartbeat.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # so that it runs as a plain script from any directory

from labfleet.compute import agents, nodes, sessions  # noqa: E402
from labfleet.compute.devices.mock import MockPlugin  # noqa: E402
from labfleet.core import database, unitofwork  # noqa: E402
from labfleet.core.authz import Actor  # noqa: E402
from labfleet.core.secretbox import ensure_key_file  # noqa: E402
from labfleet.tenancy import directory  # noqa: E402
from labfleet.tenancy.policies import ensure_default_keypair_policy  # noqa: E402
from labfleet.usage import records  # noqa: E402

CLI = Actor.cli()
GIB = 2**30
HEARTBEAT_S = 10.0


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def world(directory_: Path, n_sessions: int) -> tuple[Any, str, list[dict[str, Any]]]:
    """A DB with an agent's node holding ``n_sessions``; (session factory, the token, their targets)."""
    os.environ["LABFLEET_SECRET_KEY_FILE"] = str(directory_ / "key")
    ensure_key_file(directory_ / "key")
    engine = database.make_engine(f"sqlite:///{directory_ / 'lf.sqlite'}")
    database.upgrade(engine)
    factory = unitofwork.make_session_factory(engine)
    with database.session_scope(factory) as db:
        ensure_default_keypair_policy(db)
        nodes.ensure_default_group(db)
        nodes.create_group(db, CLI, {"name": "edge", "is_public": True})
        directory.create_domain(db, CLI, {"name": "acme"})
        directory.create_project(db, CLI, {"domain": "acme", "name": "ml"})
        directory.create_user(db, CLI, {"username": "alice", "domain": "acme", "projects": ["ml"]})
        _, plain = agents.create_token(db, CLI, {"node": "n2", "resource_group": "edge"})
    devices = MockPlugin(devices=[{"model": "A100-80GB", "memory": "80g", "count": 8}], node="n2").discover()
    body = {
        "node": "n2",
        "cpu": 512,
        "mem": 4096 * GIB,
        "devices": [d.to_dict() for d in devices],
        "plugin": "mock",
        "labels": {"address": "127.0.0.1"},
    }
    with database.session_scope(factory) as db:
        agents.register(db, agents.authenticate(db, plain), body)
    for i in range(n_sessions):
        slots = {"cpu": 0.5, "gpu.shares": 0.25} if i % 2 == 0 and i < 64 else {"cpu": 0.5}
        with database.session_scope(factory) as db:
            s = sessions.admit(
                db, CLI, {"project": "acme/ml", "username": "alice", "resource_group": "edge", "slots": slots}
            )
            sid = s.id
        with database.session_scope(factory) as db:  # its spawner says it runs, and where (as the Hub does)
            sessions.update_status(
                db, Actor.hub(), sid, {"status": "RUNNING", "runtime": {"pid": 100_000 + i}}
            )
    with database.session_scope(factory) as db:
        targets = [
            {"session_id": t.session_id, "devices": list(t.devices)} for t in records.targets_on(db, "n2")
        ]
    if len(targets) != n_sessions:
        raise RuntimeError(f"{len(targets)} sessions run on n2, not {n_sessions}")
    return factory, plain, targets


def beat_body(targets: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What the agent sends: every session running, one reading each."""
    now = time.time()
    readings = [
        {
            "session_id": t["session_id"],
            "at": now,
            "alive": True,
            "cpu_seconds": 12.5,
            "mem_bytes": 512 * 2**20,
            "gpus": [{"uuid": u, "util_percent": 40.0, "mem_bytes": 4 * GIB} for u in t["devices"]],
        }
        for t in targets
    ]
    return {"node": "n2", "running": [t["session_id"] for t in targets], "ended": [], "readings": readings}


def one_beat(factory: Any, plain: str, raw_body: str, token: Any) -> int:
    """The service's work for one heartbeat (the handler's, without HTTP); the readings kept."""
    beat, raw = agents.parse_heartbeat(json.loads(raw_body))
    readings = records.parse_agent_readings(raw, time.time())
    with database.session_scope(factory) as db:
        agents.heartbeat(db, token, beat)
        targets = records.targets_on(db, beat.node)
        return len(records.accept_agent_readings(readings, targets))


def measure(n_sessions: int, beats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="lf-agent-cost-") as tmp:
        factory, plain, targets = world(Path(tmp), n_sessions)
        raw_body = json.dumps(beat_body(targets))
        with database.session_scope(factory) as db:
            token = agents.authenticate(db, plain)  # the service caches a verified token
            db.expunge(token)
        walls, cpus = [], []
        for i in range(beats + 1):
            raw_body = json.dumps(beat_body(targets))  # fresh times, as every beat's readings are
            w, c = time.perf_counter(), time.process_time()
            kept = one_beat(factory, plain, raw_body, token)
            wall, cpu = (time.perf_counter() - w) * 1000, (time.process_time() - c) * 1000
            if kept != len(targets):
                raise RuntimeError(f"beat {i}: {kept} readings kept of {len(targets)}")
            if i == 0:
                first = (wall, cpu)
            else:
                walls.append(wall)
                cpus.append(cpu)
        factory.kw["bind"].dispose()
    p50 = statistics.median(cpus)
    return {
        "sessions": n_sessions,
        "beats": beats,
        "body_bytes": len(raw_body),
        "first_ms": {"wall": round(first[0], 2), "cpu": round(first[1], 2)},
        "wall_ms": {k: round(v, 2) for k, v in (("p50", statistics.median(walls)),
                                                 ("p95", percentile(walls, 95)), ("max", max(walls)))},
        "cpu_ms": {k: round(v, 2) for k, v in (("p50", p50), ("p95", percentile(cpus, 95)), ("max", max(cpus)))},
        "nodes_per_core_at_10s": int(HEARTBEAT_S * 1000 / p50) if p50 > 0 else None,
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", default="0,10,100,400", help="session counts on the node, comma-separated")
    ap.add_argument("--beats", type=int, default=200, help="heartbeats timed per count (bounded: 1-5000)")
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    args = ap.parse_args(argv)
    try:
        counts = [int(x) for x in args.sessions.split(",") if x.strip()]
    except ValueError:
        ap.error("--sessions takes whole numbers, comma-separated")
    if not counts or any(not 0 <= n <= 2000 for n in counts) or not 1 <= args.beats <= 5000:
        ap.error("--sessions counts 0-2000, --beats 1-5000")
    if not args.json:
        print(
            f"{'sessions':>8} {'body KB':>8} {'wall p50/p95 ms':>16} {'cpu p50/p95 ms':>15} {'nodes/core @10s':>16}"
        )
    for n in counts:
        r = measure(n, args.beats)
        if args.json:
            print(json.dumps(r))
        else:
            print(
                f"{n:>8} {r['body_bytes'] / 1024:>8.1f} "
                f"{r['wall_ms']['p50']:>7.2f}/{r['wall_ms']['p95']:<8.2f} "
                f"{r['cpu_ms']['p50']:>6.2f}/{r['cpu_ms']['p95']:<8.2f} {r['nodes_per_core_at_10s']:>16}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
