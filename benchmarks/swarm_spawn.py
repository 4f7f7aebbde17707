"""Swarm spawn: POST to ready for a session on node 2 (a second engine, another network namespace)
against node 1 (the manager, where the Hub runs), with the swarm backend.

Brings up the two Swarm nodes of this machine (scripts/swarm.sh, as tests/test_swarm.py does) and a
real Hub with LABFLEET_BACKEND=swarm. Each node is the only node of a resource group of its own, so
a spawn asking for that group lands there. Runs alternate node 1, node 2, ... one at a time through
the Hub's REST API: POST -> ready (JupyterLab answering through the proxy), then stop (timed too); "labfleet" is what the
spawner itself added to each spawn (admission, launch spec with the node's labels, reports: its
"labfleet overhead" log line).
At the end the swarm is left and node 2 torn down (--keep-swarm leaves them up).

    .venv/bin/python benchmarks/swarm_spawn.py              # 3 runs per node, a table
    .venv/bin/python benchmarks/swarm_spawn.py -n 5 --json

Bounded: N <= 10 runs per node, each spawn waited for at most 180 s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.swarmfixture import IMAGE, register_node, start_swarm_hub, swarm_down, swarm_up  # noqa: E402

OVERHEAD = re.compile(
    r"labfleet: \S*?(node[12])-\d+ admitted in [0-9.]+ ms, queued [0-9.]+ ms; labfleet overhead ([0-9.]+) ms"
)
OPTIONS = {"project": "p", "image": IMAGE, "cpu": 0.5, "mem": "512m", "gpu": 1}


def _wait(hub, server: str, timeout: float, ready: bool) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        model = hub.hub_api("GET", "/users/ann").json()["servers"].get(server)
        if ready and model and model.get("ready"):
            return
        if not ready and model is None:
            return
        time.sleep(0.05)
    raise RuntimeError(
        f"ann/{server} not {'ready' if ready else 'stopped'} in {timeout}s:\n{hub.log_text()[-4000:]}"
    )


def run(n: int) -> dict:
    nodes = swarm_up()
    with tempfile.TemporaryDirectory(prefix="lf-bench-swarm-") as tmp:
        state = Path(tmp)
        for p in (state, state.parent):
            os.chmod(p, p.stat().st_mode | 0o011)
        hub = start_swarm_hub(state, nodes)
        try:
            root = hub.wait_token("root")
            for method, path, body in [
                ("POST", "/domains", {"name": "bench"}),
                ("POST", "/projects", {"domain": "bench", "name": "p"}),
                ("POST", "/users", {"username": "ann", "domain": "bench", "projects": ["p"]}),
                ("POST", "/resource-groups", {"name": "node1", "is_public": True}),
                ("POST", "/resource-groups", {"name": "node2", "is_public": True}),
            ]:
                r = hub.api(method, path, root, json=body)
                assert r.status_code == 201, r.text
            register_node(
                hub.db_url,
                "swarm-1",
                {"swarm.node_id": nodes.node1_id, "address": nodes.addr1},
                1,
                group="node1",
            )
            register_node(
                hub.db_url,
                "swarm-2",
                {"swarm.node_id": nodes.node2_id, "address": nodes.addr2},
                1,
                group="node2",
            )
            hub.wait_user("ann")
            spawn: dict[str, list[float]] = {"node1": [], "node2": []}
            stop: dict[str, list[float]] = {"node1": [], "node2": []}
            for i in range(n):
                for group in ("node1", "node2"):
                    server = f"{group}-{i}"
                    t0 = time.perf_counter()
                    r = hub.hub_api(
                        "POST", f"/users/ann/servers/{server}", json={**OPTIONS, "resource_group": group}
                    )
                    assert r.status_code in (201, 202), r.text
                    _wait(hub, server, 180, ready=True)
                    spawn[group].append(time.perf_counter() - t0)
                    t1 = time.perf_counter()
                    r = hub.hub_api("DELETE", f"/users/ann/servers/{server}")
                    assert r.status_code in (202, 204), r.text
                    _wait(hub, server, 120, ready=False)
                    stop[group].append(time.perf_counter() - t1)
            # What labfleet added to each spawn, by the spawner's own accounting (its log line).
            overhead: dict[str, list[float]] = {"node1": [], "node2": []}
            for m in OVERHEAD.finditer(hub.log_text()):
                overhead[m.group(1)].append(float(m.group(2)) / 1000)
        finally:
            hub.stop()
    return {"spawn": spawn, "stop": stop, "labfleet": overhead}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=3, help="runs per node (1..10, default 3)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    ap.add_argument("--keep-swarm", action="store_true", help="leave the swarm and node 2 up at the end")
    args = ap.parse_args(argv)
    if not 1 <= args.n <= 10:
        ap.error("-n must be 1 to 10")
    try:
        result = run(args.n)
    finally:
        if not args.keep_swarm:
            swarm_down()
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{'node':<8}{'what':<8}{'runs':>5}{'min s':>8}{'median s':>10}{'max s':>8}")
    for what in ("spawn", "stop", "labfleet"):
        for group, times in result[what].items():
            print(
                f"{group:<8}{what:<8}{len(times):>5}{min(times):>8.2f}{statistics.median(times):>10.2f}{max(times):>8.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
