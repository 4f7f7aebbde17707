#!/usr/bin/env python3
"""Sampler cost: the CPU time the trusted usage sampler (``labfleet.usage.sampler``) spends per tick.

Goal (issue [4/8]): under 1 % of one core at the default 15 s interval with 100 live sessions on
the node.

Method: ``--sessions`` live local "sessions" are started, each a small process tree in its own
process group (``sh -c 'sleep 600 & sleep 600'``: a shell and two children, as a server with a
kernel or two); ``--devices`` mock GPUs (the mock device plugin, readings from a file named by
``$LABFLEET_MOCK_GPU_USAGE``) are each shared by two sessions, with per-process readings for their
children and one process of no session's.  Optionally ``--containers`` Docker containers (host
network, ``sleep 600`` in the test image ``labfleet/singleuser:test``; needs the engine and the
image: ``bash scripts/build-image.sh``) are sampled in the same ticks.  Then ``--ticks`` ticks of
``Sampler.sample`` over all of them, ``--pause`` seconds apart, each timed with
``time.process_time()`` (the sampler's CPU time: psutil runs in this process; the Docker engine's own
work answering stats is not counted) and ``time.perf_counter()`` (wall).  The first tick (cold:
psutil's process table is filled) is reported apart; the statistics are over the others.  Every
reading is checked (alive, with GPU readings where the session holds a device).  Everything started
is stopped and removed at the end.

Usage::

    .venv/bin/python benchmarks/sampler_cost.py [--sessions 100] [--ticks 20] [--devices 4] [--json]
    .venv/bin/python benchmarks/sampler_cost.py --containers 20      # docker sessions too

Prints a table, or with ``--json`` one JSON object: per-tick CPU ms (p50, p95, max), wall ms, and
the % of one core that the p50 / p95 tick costs at ``--interval`` (default 15 s).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # so that it runs as a plain script from any directory

import psutil  # noqa: E402

from labfleet.compute.devices.mock import USAGE_ENV, MockPlugin  # noqa: E402
from labfleet.usage.sampler import Sampler, Target  # noqa: E402

GIB = 2**30
IMAGE = "labfleet/singleuser:test"


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def start_sessions(n: int) -> list[subprocess.Popen]:
    return [
        subprocess.Popen(
            ["sh", "-c", "sleep 600 & sleep 600"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for _ in range(n)
    ]


def children_of(pid: int, want: int, timeout: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            kids = [c.pid for c in psutil.Process(pid).children()]
        except psutil.NoSuchProcess:
            kids = []
        if len(kids) >= want:
            return kids
        time.sleep(0.02)
    raise RuntimeError(f"session {pid} did not start its {want} children in {timeout}s")


def gpu_readings(
    plugin: MockPlugin, count: int, sessions: list[subprocess.Popen]
) -> tuple[dict[str, Any], dict[int, tuple[str, ...]]]:
    """Mock readings: device k shared by sessions 2k and 2k+1 (their first child each) and an outsider."""
    readings: dict[str, Any] = {}
    held: dict[int, tuple[str, ...]] = {}
    for k, dev in enumerate(plugin.discover() if count else ()):
        pair = [i for i in (2 * k, 2 * k + 1) if i < len(sessions)]
        procs = [{"pid": children_of(sessions[i].pid, 1)[0], "mem_used": GIB, "gpu_util": 20} for i in pair]
        procs.append({"pid": os.getpid(), "mem_used": GIB // 2, "gpu_util": 5})
        readings[dev.uuid] = {"gpu_util": 45, "mem_used": 3 * GIB, "processes": procs}
        for i in pair:
            held[i] = (*held.get(i, ()), dev.uuid)
    return readings, held


def start_containers(n: int) -> tuple[Any, list[Any]]:
    import docker

    client = docker.from_env(version="auto", timeout=60)
    client.images.get(IMAGE)  # fails clearly when the image was not built
    made = []
    try:
        for i in range(n):
            made.append(
                client.containers.run(
                    IMAGE,
                    ["sleep", "600"],
                    name=f"lfbench-sampler-{os.getpid()}-{i}",
                    detach=True,
                    network_mode="host",
                )
            )
    except BaseException:
        for c in made:
            c.remove(force=True)
        raise
    return client, made


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--sessions", type=int, default=100, help="live local sessions (process trees)")
    ap.add_argument("--containers", type=int, default=0, help="live Docker sessions (needs the engine)")
    ap.add_argument("--devices", type=int, default=4, help="mock GPUs, each shared by two sessions")
    ap.add_argument("--ticks", type=int, default=20)
    ap.add_argument("--pause", type=float, default=0.2, help="seconds between ticks")
    ap.add_argument("--interval", type=float, default=15.0, help="the sampling interval the %% is taken at")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if not (0 <= args.sessions <= 2000 and 0 <= args.containers <= 500 and 0 <= args.devices <= 64):
        ap.error("--sessions 0..2000, --containers 0..500, --devices 0..64")
    if not 2 <= args.ticks <= 10_000 or args.interval <= 0 or args.pause < 0:
        ap.error("--ticks 2..10000, --interval > 0, --pause >= 0")

    sessions: list[subprocess.Popen] = []
    client, containers = None, []
    with tempfile.TemporaryDirectory(prefix="lf-sampler-") as tmp:
        try:
            sessions = start_sessions(args.sessions)
            for p in sessions:
                children_of(p.pid, 2)
            plugin = MockPlugin(
                devices=[{"model": "A100-80GB", "memory": "80g", "count": args.devices}], node="bench"
            )
            readings, held = gpu_readings(plugin, args.devices, sessions)
            usage = Path(tmp) / "usage.json"
            usage.write_text(json.dumps(readings))
            os.environ[USAGE_ENV] = str(usage)
            if args.containers:
                client, containers = start_containers(args.containers)
            targets = [Target(f"s{i}", pid=p.pid, devices=held.get(i, ())) for i, p in enumerate(sessions)]
            targets += [Target(f"c{i}", container=c.id) for i, c in enumerate(containers)]
            sampler = Sampler(plugins=[plugin])
            cpu_ms: list[float] = []
            wall_ms: list[float] = []
            for tick in range(args.ticks):
                if tick:
                    time.sleep(args.pause)
                c0, w0 = time.process_time(), time.perf_counter()
                out = sampler.sample(targets)
                cpu_ms.append((time.process_time() - c0) * 1000)
                wall_ms.append((time.perf_counter() - w0) * 1000)
                bad = [
                    r for r in out if not r.alive or r.error or any(g.util_percent is None for g in r.gpus)
                ]
                if bad:
                    raise RuntimeError(f"tick {tick}: {len(bad)} bad reading(s), e.g. {bad[0]}")
            procs_on_node = len(psutil.pids())
            sampler.close()
        finally:
            os.environ.pop(USAGE_ENV, None)
            for p in sessions:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for p in sessions:
                p.wait(timeout=30)
            for c in containers:
                c.remove(force=True)
            if client is not None:
                client.close()

    steady_cpu, steady_wall = cpu_ms[1:], wall_ms[1:]
    p50, p95 = statistics.median(steady_cpu), percentile(steady_cpu, 95)
    result = {
        "sessions": args.sessions,
        "containers": args.containers,
        "devices": args.devices,
        "gpu_sessions": len(held),
        "processes_on_node": procs_on_node,
        "ticks": args.ticks,
        "cold_tick_cpu_ms": round(cpu_ms[0], 2),
        "cpu_ms_p50": round(p50, 2),
        "cpu_ms_p95": round(p95, 2),
        "cpu_ms_max": round(max(steady_cpu), 2),
        "wall_ms_p50": round(statistics.median(steady_wall), 2),
        "wall_ms_p95": round(percentile(steady_wall, 95), 2),
        "interval_s": args.interval,
        "core_percent_p50": round(p50 / (args.interval * 1000) * 100, 4),
        "core_percent_p95": round(p95 / (args.interval * 1000) * 100, 4),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:20} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
