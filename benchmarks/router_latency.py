#!/usr/bin/env python3
"""The serving router's cost: what ``/services/labfleet/serve/<endpoint>/`` adds to calling a replica
directly, what a replica's authenticating front adds, and how many requests a second pass through them
with 2 replicas.

Method: a real Hub (``tests/hubfixture.start_hub``: the embedded configuration, SQLite, local
sessions, configurable-http-proxy) serves one endpoint of 2 replicas, each an inference session
running a stdlib HTTP/1.1 model server (``ThreadingHTTPServer``) that answers ``{"ok": true}`` with a
Content-Length, behind its session's replica front (``server_ext/front.py``), which passes on only
calls with the replica's credential. A token with no rate limit calls it. ``--network isolated`` (the
default when root): each session in its own network namespace, its front at the session's address on
the test bridge (traffic to 127.0.0.1 and those addresses only); ``--network host``: the sessions on
the host's network, where the model's own port (on 127.0.0.1) can be called too.

Latency, one request at a time, the paths taken in turn so that a slow moment of the machine touches
them all alike, ``--requests`` times each:

- ``model directly`` (``--network host`` only): the model's own port (the two in turn), the connection
  kept alive; ``model directly, new connection``: a new TCP connection per request, which is what the
  router does towards a replica (tornado's simple HTTP client does not keep connections);
- ``replica front, new connection``: the replica's port with its credential (the front checks it,
  connects to the model and splices the bytes); a new connection per request, as the front allows;
- ``router``: the labfleet service's own port, ``/services/labfleet/serve/bench/`` (token check from
  memory, round robin, the replica's front and model, the answer streamed back, counted and observed);
- ``router via the Hub's proxy``: the Hub's public URL, as callers reach it (configurable-http-proxy
  in front of the router).

Added latencies, p50 and p99: the router's (router minus model directly, kept alive, as measured
before the fronts), the front's (front minus model directly, both with a new connection).

``--front-only``: no Hub; the same model server and a front, each a process of its own on 127.0.0.1,
and the two paths with a new connection per request: what the front alone adds, without the noise of
a Hub and its sessions.

Throughput: ``--clients`` threads, each with its own kept-alive connection, share ``--load-requests``
requests per path (a ``--time-cap`` in seconds stops a path early, and says so); requests per second
over the wall clock, errors counted. The client, the router, the Hub's proxy and both replicas share
this machine's cores: the numbers are for this machine, not for the router alone.

Usage::

    python benchmarks/router_latency.py [--requests 2000] [--clients 8] [--load-requests 4000]
                                        [--time-cap 60] [--network isolated|host] [--json]
    python benchmarks/router_latency.py --front-only [--requests 5000] [--json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # so that it runs as a plain script from any directory

from labfleet.serving.credentials import HEADER  # noqa: E402
from tests.hubfixture import start_hub  # noqa: E402

ENDPOINT = "bench"

SERVER = r"""
import os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BODY = b'{"ok": true}'

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as model servers do: no 40 ms wait for a delayed ACK

    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

ThreadingHTTPServer((os.environ["HOST"], int(os.environ["PORT"])), H).serve_forever()
"""

DEFINITION = """
models:
  - name: bench
    model_path: /models
    service:
      start_command: [python3, server.py]
      port: 8000
      health_check:
        path: /health
        interval: 5.0
        max_retries: 3
        max_wait_time: 5.0
        initial_delay: 0.5
"""


class Client:
    """One kept-alive HTTP/1.1 connection (a new one per request with ``fresh``)."""

    def __init__(self, host: str, port: int, headers: dict[str, str], fresh: bool = False) -> None:
        self.host, self.port, self.headers, self.fresh = host, port, headers, fresh
        self.conn: http.client.HTTPConnection | None = None

    def get(self, path: str) -> int:
        if self.conn is None or self.fresh:
            if self.conn is not None:
                self.conn.close()
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            self.conn.request("GET", path, headers=self.headers)
            r = self.conn.getresponse()
            r.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = None
            return 599
        if r.getheader("Connection", "").lower() == "close":
            self.conn.close()
            self.conn = None
        return r.status


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


FRONT = r"""
import asyncio, sys
from labfleet.session.front import ReplicaFront

async def main():
    front = ReplicaFront(sys.argv[1], int(sys.argv[2]))
    await front.start("127.0.0.1", int(sys.argv[3]))
    await asyncio.Event().wait()

asyncio.run(main())
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


def front_only(n: int) -> dict[str, Any]:
    """The model and a front as processes of their own; direct vs through the front, new connections."""
    model_port, front_port = _free_port(), _free_port()
    cred = "lfrc_" + "b" * 43
    env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(model_port), "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen([sys.executable, "-c", SERVER], env=env),
        # Its stderr: a connection still open when it is stopped is reported there, not in the results.
        subprocess.Popen(
            [sys.executable, "-c", FRONT, cred, str(model_port), str(front_port)],
            env=env,
            stderr=subprocess.DEVNULL,
        ),
    ]
    try:
        _wait_port(model_port)
        _wait_port(front_port)
        paths = {
            "model directly, new connection": Client("127.0.0.1", model_port, {}, fresh=True),
            "front, new connection": Client("127.0.0.1", front_port, {HEADER: cred}, fresh=True),
        }
        denied = Client("127.0.0.1", front_port, {}, fresh=True).get("/")
        times = _timed({k: (lambda i, c=c: c.get("/")) for k, c in paths.items()}, n)
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
    added = {
        q: round(
            times["front, new connection"][f"{q}_ms"] - times["model directly, new connection"][f"{q}_ms"], 3
        )
        for q in ("p50", "p99")
    }
    return {"latency": times, "front_added_ms": added, "without_credential": denied}


def _timed(paths: dict, n: int, warm: int = 200) -> dict[str, dict[str, float]]:
    for i in range(warm):  # warm: connections, the token in the router's memory, code paths
        for call in paths.values():
            assert call(i) == 200
    times: dict[str, list[float]] = {k: [] for k in paths}
    errors = dict.fromkeys(paths, 0)
    for i in range(n):
        for name, call in paths.items():
            t0 = time.perf_counter()
            code = call(i)
            times[name].append((time.perf_counter() - t0) * 1000)
            errors[name] += code != 200
    return {
        name: {
            "p50_ms": round(pct(v, 0.5), 3),
            "p99_ms": round(pct(v, 0.99), 3),
            "mean_ms": round(statistics.fmean(v), 3),
            "errors": errors[name],
        }
        for name, v in times.items()
    }


def setup(state: Path, network: str) -> tuple[Any, str, list[dict[str, Any]]]:
    extra = "c.LabfleetLocalSpawner.session_network = 'host'\n" if network == "host" else ""
    hub = start_hub(state, env={"LABFLEET_SERVING_INTERVAL": "2"}, extra_config=extra)
    root = hub.wait_token("root")
    for path, body in [
        ("/domains", {"name": "bench"}),
        ("/projects", {"domain": "bench", "name": "m"}),
        ("/users", {"username": "ann", "domain": "bench", "projects": ["m"]}),
    ]:
        r = hub.api("POST", path, root, json=body)
        assert r.status_code == 201, r.text
    ann = hub.wait_token("ann")
    r = hub.api("POST", "/vfolders", ann, json={"name": "bench-model", "usage_mode": "model"})
    assert r.status_code == 201, r.text
    folder = r.json()["id"]
    for name, text in (("model-definition.yaml", DEFINITION), ("server.py", SERVER)):
        put = hub.api("PUT", f"/vfolders/{folder}/files/{name}", ann, data=text.encode())
        assert put.status_code == 201, put.text
    r = hub.api(
        "POST",
        "/endpoints",
        ann,
        json={
            "name": ENDPOINT,
            "project": "bench/m",
            "model_folder": "bench-model",
            "replicas": 2,
            "slots": {"cpu": 0.5, "mem": "256m"},
        },
    )
    assert r.status_code == 201, r.text
    deadline = time.monotonic() + 180
    while True:
        ep = hub.api("GET", f"/endpoints/{ENDPOINT}", ann).json()
        if ep["healthy_replicas"] == 2:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the replicas did not become healthy: {ep['status_reason']}")
        time.sleep(0.5)
    t = hub.api("POST", f"/endpoints/{ENDPOINT}/tokens", ann, json={"rate_limit": 0})
    assert t.status_code == 201, t.text
    replicas: list[dict[str, Any]] = []
    for route in ep["routes"]:
        if route["status"] == "RUNNING" and route["traffic"] == "ACTIVE":
            host, port = route["address"].rsplit(":", 1)
            cred = hub.api("GET", f"/sessions/{route['session_id']}/replica-credential", ann).json()
            runner = requests.get(
                f"{hub.url}/user/ann/{route['server']}/labfleet/runner",
                headers={"Authorization": f"token {ann}"},
                timeout=30,
            ).json()
            replicas.append(
                {"host": host, "port": int(port), "credential": cred["credential"], "inner": runner["port"]}
            )
    hub.bench_ann = ann  # type: ignore[attr-defined]
    return hub, t.json()["token"], replicas


def latency(hub, token: str, replicas: list[dict], n: int, network: str) -> dict[str, dict[str, float]]:
    auth = {"Authorization": f"Bearer {token}"}
    service_port = hub.ports[3]
    hub_host, hub_port = hub.url.removeprefix("http://").rsplit(":", 1)
    path = f"/services/labfleet/serve/{ENDPOINT}/"
    fronts = [Client(r["host"], r["port"], {HEADER: r["credential"]}, fresh=True) for r in replicas]
    router = Client("127.0.0.1", service_port, auth)
    proxy = Client(hub_host, int(hub_port), auth)
    paths = {}
    if network == "host":  # the model's own port is on the host's loopback
        direct = [Client("127.0.0.1", r["inner"], {}) for r in replicas]
        fresh = [Client("127.0.0.1", r["inner"], {}, fresh=True) for r in replicas]
        paths["model directly"] = lambda i: direct[i % 2].get("/")
        paths["model directly, new connection"] = lambda i: fresh[i % 2].get("/")
    paths["replica front, new connection"] = lambda i: fronts[i % 2].get("/")
    paths["router"] = lambda i: router.get(path)
    paths["router via the Hub's proxy"] = lambda i: proxy.get(path)
    return _timed(paths, n)


def load(
    target: tuple[str, int] | list[tuple[str, int, dict[str, str]]],
    path: str,
    headers: dict[str, str],
    clients: int,
    total: int,
    cap: float,
    fresh: bool = False,
) -> dict[str, float]:
    """``clients`` threads share ``total`` requests (a list of targets, each with its own headers: the
    clients split over them); ``fresh``: a new connection per request."""
    targets = target if isinstance(target, list) else [(target[0], target[1], headers)]
    lock = threading.Lock()
    left = [total]
    lat: list[list[float]] = [[] for _ in range(clients)]
    errs = [0] * clients
    start = threading.Barrier(clients + 1)
    deadline = [0.0]

    def work(k: int) -> None:
        host, port, own = targets[k % len(targets)]
        c = Client(host, port, own, fresh=fresh)
        c.get(path)  # connect before the clock starts
        start.wait()
        while time.perf_counter() < deadline[0]:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            t0 = time.perf_counter()
            code = c.get(path)
            lat[k].append((time.perf_counter() - t0) * 1000)
            errs[k] += code != 200

    threads = [threading.Thread(target=work, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    deadline[0] = time.perf_counter() + 3600
    start.wait()
    t0 = time.perf_counter()
    deadline[0] = t0 + cap
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    all_lat = [x for v in lat for x in v]
    return {
        "requests": len(all_lat),
        "capped": len(all_lat) < total,
        "seconds": round(wall, 2),
        "per_second": round(len(all_lat) / wall, 1),
        "p50_ms": round(pct(all_lat, 0.5), 2),
        "p99_ms": round(pct(all_lat, 0.99), 2),
        "errors": sum(errs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000, help="latency: requests per path (at most 100,000)")
    ap.add_argument("--clients", type=int, default=8, help="throughput: concurrent clients (at most 64)")
    ap.add_argument("--load-requests", type=int, default=4000, help="throughput: requests per path")
    ap.add_argument("--time-cap", type=float, default=60.0, help="throughput: seconds at most per path")
    ap.add_argument(
        "--network",
        choices=("isolated", "host"),
        default="isolated" if os.geteuid() == 0 else "host",
        help="the sessions' network (isolated: a namespace each, as root)",
    )
    ap.add_argument("--front-only", action="store_true", help="no Hub: what a replica's front alone adds")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not (1 <= a.requests <= 100_000 and 1 <= a.clients <= 64 and 1 <= a.load_requests <= 1_000_000):
        ap.error("--requests 1..100000, --clients 1..64, --load-requests 1..1000000")
    if a.front_only:
        out = front_only(a.requests)
        if a.json:
            print(json.dumps(out, indent=2))
            return
        print(f"the front alone, one request at a time, {a.requests} per path, new connections (ms)")
        for name, v in out["latency"].items():
            print(
                f"  {name:<32} p50 {v['p50_ms']:>7} p99 {v['p99_ms']:>7} mean {v['mean_ms']:>7} errors {v['errors']}"
            )
        print(f"  front added: {out['front_added_ms']}; without the credential: {out['without_credential']}")
        return
    with tempfile.TemporaryDirectory(prefix="router-bench-") as tmp:
        hub, token, replicas = setup(Path(tmp), a.network)
        try:
            lat = latency(hub, token, replicas, a.requests, a.network)
            auth = {"Authorization": f"Bearer {token}"}
            path = f"/services/labfleet/serve/{ENDPOINT}/"
            hub_host, hub_port = hub.url.removeprefix("http://").rsplit(":", 1)
            fronts = [(r["host"], r["port"], {HEADER: r["credential"]}) for r in replicas]
            thr = {}
            if a.network == "host":
                models: list[tuple[str, int, dict[str, str]]] = [
                    ("127.0.0.1", r["inner"], {}) for r in replicas
                ]
                thr["model directly (2 replicas)"] = load(
                    models, "/", {}, a.clients, a.load_requests, a.time_cap
                )
            thr |= {
                "replica fronts (2, new connections)": load(
                    fronts, "/", {}, a.clients, a.load_requests, a.time_cap, fresh=True
                ),
                "router": load(
                    ("127.0.0.1", hub.ports[3]), path, auth, a.clients, a.load_requests, a.time_cap
                ),
                "router via the Hub's proxy": load(
                    (hub_host, int(hub_port)), path, auth, a.clients, a.load_requests, a.time_cap
                ),
            }
            # What the router counted reached the endpoint's numbers (written each tick).
            time.sleep(3)
            ep = hub.api("GET", f"/endpoints/{ENDPOINT}", hub.bench_ann).json()
        finally:
            hub.api("DELETE", f"/endpoints/{ENDPOINT}", hub.bench_ann)
            time.sleep(3)
            hub.stop()

    def minus(a: str, b: str) -> dict[str, float] | None:
        if a not in lat or b not in lat:
            return None
        return {q: round(lat[a][f"{q}_ms"] - lat[b][f"{q}_ms"], 3) for q in ("p50", "p99")}

    added = minus("router", "model directly")
    result = {
        "network": a.network,
        "latency": lat,
        "router_added_ms": added,
        "router_added_vs_front_ms": minus("router", "replica front, new connection"),
        "front_added_ms": minus("replica front, new connection", "model directly, new connection"),
        "throughput": thr,
        "endpoint_counted": {"requests": ep.get("requests"), "errors": ep.get("errors")},
        "clients": a.clients,
    }
    if a.json:
        print(json.dumps(result, indent=2))
        return
    print(f"latency, one request at a time, {a.requests} per path (ms)")
    print(f"  {'path':<30} {'p50':>8} {'p99':>8} {'mean':>8} {'errors':>7}")
    for name, v in lat.items():
        print(f"  {name:<30} {v['p50_ms']:>8} {v['p99_ms']:>8} {v['mean_ms']:>8} {v['errors']:>7}")
    for what in ("router_added_ms", "router_added_vs_front_ms", "front_added_ms"):
        if result[what] is not None:
            print(f"  {what}: {result[what]}")
    print(f"throughput, {a.clients} clients, {a.load_requests} requests per path (cap {a.time_cap:g} s)")
    print(f"  {'path':<30} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} {'capped':>7}")
    for name, v in thr.items():
        print(
            f"  {name:<30} {v['per_second']:>8} {v['p50_ms']:>8} {v['p99_ms']:>8} {v['errors']:>7} {v['capped']!s:>7}"
        )
    print(f"the endpoint counted {ep.get('requests')} requests, {ep.get('errors')} errors")


if __name__ == "__main__":
    main()
