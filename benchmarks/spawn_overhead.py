"""Spawn overhead: POST to ready, labfleet's local backend vs JupyterHub's LocalProcessSpawner.

Starts a real Hub twice in one run (the same machine, the same JupyterLab): once with the
labfleet spawner (admission, placement on a mock GPU, launch spec, bubblewrap sandbox when it is
installed), once with JupyterHub's own SimpleLocalProcessSpawner. Each spawns N servers one after
the other through the REST API and times POST -> ready; then it reads the labfleet spawner's own
accounting of what it added (admission call, launch preparation, status reports), which the
end-to-end difference cannot resolve below the noise of a JupyterLab start.

    .venv/bin/python benchmarks/spawn_overhead.py            # 10 spawns each, a table
    .venv/bin/python benchmarks/spawn_overhead.py -n 20 --json

Bounded: N <= 50 spawns per spawner, each waited for at most 60 s.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.hubfixture import start_hub  # noqa: E402  (the tests' real-Hub launcher)

PLAIN = (
    "c.JupyterHub.spawner_class = 'simple'\n"
    "c.SimpleLocalProcessSpawner.home_dir_template = c.LabfleetLocalSpawner.home_dir_template\n"
    "c.SimpleLocalProcessSpawner.args = list(c.LabfleetLocalSpawner.args)\n"
)
OVERHEAD = re.compile(r"labfleet overhead ([0-9.]+) ms")


def _run(kind: str, n: int, options: dict) -> list[float]:
    with tempfile.TemporaryDirectory(prefix=f"lf-bench-{kind}-") as tmp:
        hub = start_hub(Path(tmp), extra_config=PLAIN if kind == "plain" else "")
        try:
            root = hub.wait_token("root")
            for method, path, body in [
                ("POST", "/domains", {"name": "bench"}),
                ("POST", "/projects", {"domain": "bench", "name": "p"}),
                ("POST", "/users", {"username": "ann", "domain": "bench", "projects": ["p"]}),
            ]:
                r = hub.api(method, path, root, json=body)
                assert r.status_code == 201, r.text
            hub.wait_user("ann")
            times = []
            for i in range(n):
                server = f"s{i}"
                t0 = time.perf_counter()
                r = hub.hub_api(
                    "POST", f"/users/ann/servers/{server}", json=options if kind != "plain" else {}
                )
                assert r.status_code in (201, 202), r.text
                deadline = t0 + 60
                while True:
                    model = hub.hub_api("GET", "/users/ann").json()["servers"].get(server)
                    if model and model.get("ready"):
                        break
                    if time.perf_counter() > deadline:
                        raise RuntimeError(f"{kind} spawn {i} not ready in 60 s")
                    time.sleep(0.02)
                times.append(1000 * (time.perf_counter() - t0))
                hub.hub_api("DELETE", f"/users/ann/servers/{server}")
            if kind == "labfleet":
                _run.overhead = [float(x) for x in OVERHEAD.findall(hub.log_text())]  # type: ignore[attr-defined]
            return times
        finally:
            hub.stop()


def _summary(values: list[float]) -> dict:
    ordered = sorted(values)
    return {
        "n": len(values),
        "median_ms": round(statistics.median(ordered), 1),
        "p90_ms": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 1),
        "min_ms": round(ordered[0], 1),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=10, help="spawns per spawner (1-50)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if not 1 <= args.n <= 50:
        parser.error("-n must be between 1 and 50")
    options = {"project": "p", "cpu": 1, "mem": "1g", "gpu": 0.5}
    plain = _run("plain", args.n, options)
    labfleet = _run("labfleet", args.n, options)
    overhead = getattr(_run, "overhead", [])
    result = {
        "plain_local_process": _summary(plain),
        "labfleet_local": _summary(labfleet),
        "median_difference_ms": round(statistics.median(labfleet) - statistics.median(plain), 1),
        "labfleet_own_overhead": _summary(overhead) if overhead else None,
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{'spawner':<28}{'n':>4}{'median ms':>12}{'p90 ms':>10}{'min ms':>10}")
    for name, key in (
        ("LocalProcessSpawner (plain)", "plain_local_process"),
        ("labfleet local", "labfleet_local"),
    ):
        s = result[key]
        print(f"{name:<28}{s['n']:>4}{s['median_ms']:>12}{s['p90_ms']:>10}{s['min_ms']:>10}")
    print(f"median difference (labfleet - plain): {result['median_difference_ms']} ms")
    if overhead:
        o = result["labfleet_own_overhead"]
        print(
            f"labfleet's own time per spawn (admission + launch spec + reports): median {o['median_ms']} ms,"
            f" p90 {o['p90_ms']} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
