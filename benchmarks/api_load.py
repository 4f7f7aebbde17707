#!/usr/bin/env python3
"""API load benchmark: labfleet's REST API under many concurrent users, next to the stock Hub's.

Method:

- a labfleet database (SQLite in a temporary folder) with ``--users`` users (default 1,000) in
  ``--domains`` domains (default 10, two projects each) and ``--sessions`` compute sessions
  (default 10,000, spread over the users, all ended: TERMINATED, CANCELLED or ERROR), written in
  bulk as ``throughput.py`` writes its fill;
- a real Hub (configurable-http-proxy, the labfleet service) started with ``tests/hubfixture.py``
  ``start_hub``; the service creates the Hub users at its start (``hub_sync``), which is waited for;
- ``--tokens-per-user`` Hub API tokens per user (default 5), created through the Hub's REST API
  with the admin token, concurrently, before anything is timed;
- then ``--clients`` concurrent clients (default 50) for ``--seconds`` seconds (default 60, and at
  most ``--max-requests`` requests in all), through the Hub's proxy, client ``c`` calling the
  ``c % 4``-th of four endpoints over and over (a slow endpoint holds back no other):
  ``/services/labfleet/api/me``, ``/api/sessions``, ``/api/vfolders`` and the stock Hub's
  ``GET /hub/api/user`` (in the same run, for comparison; ``--endpoints`` picks fewer);
- two runs: ``cold``, where each request takes the next unused token of the pool (a different
  user each time, so the service's token cache misses until the pool wraps around; reuses are
  counted), and ``warm``, where each client is one user with one token.

Two kinds of load (``--rate``):

- ``closed`` (the default): each client sends its next request as soon as the last one is
  answered, with no think time.  This measures the most the service answers; at that point the
  latency is the time spent queueing (about clients / throughput), not the cost of a request.
- paced (open loop), ``--rate R``: R requests per second in all, spread evenly over the clients
  (each client sends one every ``clients / R`` seconds, the clients staggered), whatever the
  answers do.  The latency is counted from the moment the request was due, so a request sent
  late because its client was still waiting for the previous answer counts the wait too (no
  coordinated omission); ``late`` counts requests sent more than 10 ms after they were due (the
  offered load is then more than the system answers).  Below saturation this shows the latency
  a user sees at a stated load.  ``--rate closed,100,300`` runs each kind in turn, each for
  ``--seconds``, on the same Hub.

Reported per endpoint: requests answered per second, p50 and p99 latency, and errors (any status
other than 200, or a failed connection).  And from the Hub's log (the Hub's and the service's
request lines, each with the time the server spent on it): how often the Hub asked labfleet for a
user's groups and roles (``refresh_user``, every ``auth_refresh_age`` per user) and how many token
look-ups the Hub answered, with their server-side times.  The client is aiohttp with one
connection pool and no response parsing beyond reading the body.

Usage::

    python benchmarks/api_load.py                       # both runs, tables
    python benchmarks/api_load.py --seconds 20 --json   # one JSON object
    python benchmarks/api_load.py --mode warm --clients 20 --users 200
    python benchmarks/api_load.py --rate closed,100,200 --seconds 30   # closed loop, then paced
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
for p in (REPO, REPO / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))  # so that it runs as a plain script from any directory

import aiohttp  # noqa: E402
from sqlalchemy import insert, select  # noqa: E402

from labfleet.compute import nodes  # noqa: E402
from labfleet.core import database, unitofwork  # noqa: E402
from labfleet.core.authz import Actor  # noqa: E402
from labfleet.core.models import ComputeSession, Keypair, Project, ResourceGroup, User  # noqa: E402
from labfleet.core.secretbox import ensure_key_file  # noqa: E402
from labfleet.core.slots import ResourceSlots  # noqa: E402
from labfleet.tenancy import directory  # noqa: E402
from tests.hubfixture import seed, start_hub  # noqa: E402

CLI = Actor.cli()
ENDPOINTS = {
    "labfleet /api/me": "/services/labfleet/api/me",
    "labfleet /api/sessions": "/services/labfleet/api/sessions",
    "labfleet /api/vfolders": "/services/labfleet/api/vfolders",
    "hub /hub/api/user": "/hub/api/user",
}
ENDED = ("TERMINATED", "TERMINATED", "TERMINATED", "CANCELLED", "ERROR")
GROUP = "bench"


# ---------------------------------------------------------------- the world


def build_db(url: str, users: int, domains: int, n_sessions: int, seed_: int) -> list[str]:
    """Tenancy and ended sessions in the labfleet DB (before the Hub starts); the user names."""
    seed(url)
    engine = database.make_engine(url)
    factory = unitofwork.make_session_factory(engine)
    names: list[str] = []
    with database.session_scope(factory) as db:
        nodes.create_group(db, CLI, {"name": GROUP, "is_public": True, "scheduler": "fifo"})
        for d in range(domains):
            directory.create_domain(db, CLI, {"name": f"d{d}"})
            for p in range(2):
                directory.create_project(db, CLI, {"domain": f"d{d}", "name": f"p{p}"})
        for i in range(users):
            d, p = i % domains, (i // domains) % 2
            name = f"u{i:05d}"
            directory.create_user(db, CLI, {"username": name, "domain": f"d{d}", "projects": [f"p{p}"]})
            names.append(name)
    with database.session_scope(factory) as db:
        group_id = db.execute(select(ResourceGroup.id)).scalar_one()
        info = {}
        for user_id, domain_id, username in db.execute(select(User.id, User.domain_id, User.username)):
            if username == "root":
                continue
            kp_id = db.execute(
                select(Keypair.id).where(Keypair.user_id == user_id, Keypair.is_main.is_(True))
            ).scalar_one()
            project_id = (
                db.execute(select(Project.id).where(Project.domain_id == domain_id)).scalars().first()
            )
            info[username] = (user_id, kp_id, project_id, domain_id)
        rnd = random.Random(seed_)
        now = datetime.now(timezone.utc)
        slots = ResourceSlots({"cpu": "1", "mem": "4g", "gpu.shares": "0.5"}).to_db()
        rows = []
        for k in range(n_sessions):
            user_id, kp_id, project_id, domain_id = info[names[k % len(names)]]
            created = now - timedelta(seconds=rnd.randrange(1, 90 * 86400))
            rows.append(
                {
                    "id": str(uuid.uuid4()),
                    "name": f"s{k}",
                    "user_id": user_id,
                    "keypair_id": kp_id,
                    "project_id": project_id,
                    "domain_id": domain_id,
                    "resource_group_id": group_id,
                    "type": "interactive",
                    "requested_slots": slots,
                    "gpu_models": [],
                    "status": ENDED[k % len(ENDED)],
                    "status_reason": "",
                    "status_history": [],
                    "node_id": None,
                    "created_at": created,
                    "status_changed_at": created + timedelta(seconds=rnd.randrange(60, 86400)),
                }
            )
        db.execute(insert(ComputeSession), rows)
    engine.dispose()
    return names


def wait_hub_users(hub: Any, names: list[str], timeout: float) -> float:
    """Wait until the service's start-up sync has given every user its Hub groups; seconds waited."""
    t0 = time.monotonic()
    want = set(names)
    while True:
        done = {line.split("Hub groups of ", 1)[1].split(":", 1)[0] for line in _lines(hub, "Hub groups of ")}
        if want <= done:
            return time.monotonic() - t0
        if hub.proc.poll() is not None or time.monotonic() - t0 > timeout:
            raise RuntimeError(f"Hub users not synced in {timeout:.0f} s ({len(want & done)}/{len(want)})")
        time.sleep(1)


def _lines(hub: Any, needle: str) -> list[str]:
    return [line for line in hub.log_text().splitlines() if needle in line]


async def make_tokens(base: str, admin: str, names: list[str], per_user: int) -> dict[str, list[str]]:
    """``per_user`` Hub API tokens for each user, through the Hub's REST API, 16 at a time."""
    out: dict[str, list[str]] = {n: [] for n in names}
    sem = asyncio.Semaphore(16)
    headers = {"Authorization": f"token {admin}"}

    async def one(session: aiohttp.ClientSession, name: str) -> None:
        async with sem:
            for attempt in range(5):
                async with session.post(
                    f"{base}/hub/api/users/{name}/tokens",
                    json={"note": "api_load", "expires_in": 7200},
                    headers=headers,
                ) as r:
                    if r.status == 201:
                        out[name].append((await r.json())["token"])
                        return
                    text = await r.text()
                await asyncio.sleep(0.5 * (attempt + 1))
            raise RuntimeError(f"token for {name}: {r.status} {text[:200]}")

    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=32)) as session:
        await asyncio.gather(*(one(session, n) for n in names for _ in range(per_user)))
    return out


# ---------------------------------------------------------------- the load


def token_pools(tokens: dict[str, list[str]], seed_: int) -> tuple[Pool, Pool]:
    """cold: labfleet's three endpoints share one pool, so the service sees no token twice before
    the pool wraps around; the Hub's endpoint has a pool of its own (the same tokens, rotated)."""
    flat = [t for n in tokens for t in tokens[n]]
    random.Random(seed_).shuffle(flat)
    half = len(flat) // 2
    return Pool(flat), Pool(flat[half:] + flat[:half])


class Pool:
    """Tokens handed out in turn (cold: every request the next one; reuses counted on wrap-around)."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.i = 0
        self.reused = 0

    def next(self) -> str:
        if self.i >= len(self.tokens):
            self.reused += 1
        t = self.tokens[self.i % len(self.tokens)]
        self.i += 1
        return t


async def load(
    base: str,
    mode: str,
    tokens: dict[str, list[str]],
    clients: int,
    seconds: float,
    max_requests: int,
    seed_: int,
    endpoints: Sequence[str] = tuple(ENDPOINTS),
    rate: float | None = None,
    pools: tuple[Pool, Pool] | None = None,
) -> dict[str, Any]:
    """One run: closed loop (``rate`` None) or paced at ``rate`` requests/s over all clients.
    ``pools``: the cold runs' token pools (labfleet's, the Hub's), shared by the runs of one Hub so
    that a later cold run goes on with tokens no earlier run has used."""
    names = list(tokens)
    lf_pool, hub_pool = pools or token_pools(tokens, seed_)
    reused_before = lf_pool.reused
    lat: dict[str, list[float]] = {ep: [] for ep in ENDPOINTS}
    errors: dict[str, int] = {ep: 0 for ep in ENDPOINTS}
    late: dict[str, int] = {ep: 0 for ep in ENDPOINTS}
    error_kinds: dict[str, int] = {}
    sent = 0
    t_begin = time.perf_counter()
    deadline = t_begin + seconds
    # Paced: client c sends at t_begin + c / rate, then every clients / rate seconds.
    interval = clients / rate if rate else 0.0

    async def client(c: int, session: aiohttp.ClientSession) -> None:
        nonlocal sent
        ep = endpoints[c % len(endpoints)]
        own = tokens[names[c % len(names)]][0]  # warm: this client is one user
        due = t_begin + (c / rate if rate else 0.0)
        while sent < max_requests:
            now = time.perf_counter()
            if rate:
                if due >= deadline:
                    break
                if due > now:
                    await asyncio.sleep(due - now)
                elif now - due > 0.010:
                    late[ep] += 1
            elif now >= deadline:
                break
            sent += 1
            if mode == "warm":
                token = own
            else:
                token = (hub_pool if ep.startswith("hub") else lf_pool).next()
            # Paced: counted from when it was due (a late send's wait is part of its latency).
            t0 = due if rate else time.perf_counter()
            due += interval
            try:
                async with session.get(
                    base + ENDPOINTS[ep], headers={"Authorization": f"token {token}"}
                ) as r:
                    await r.read()
                    status = r.status
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                status = type(e).__name__
            dt = time.perf_counter() - t0
            if status == 200:
                lat[ep].append(dt * 1000)
            else:
                errors[ep] += 1
                key = f"{ep}: {status}"
                error_kinds[key] = error_kinds.get(key, 0) + 1

    timeout = aiohttp.ClientTimeout(total=60)
    connector = aiohttp.TCPConnector(limit=clients, force_close=False)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await asyncio.gather(*(client(c, session) for c in range(clients)))
    elapsed = time.perf_counter() - t_begin
    rows = {}
    for ep in endpoints:
        xs = sorted(lat[ep])
        rows[ep] = {
            "ok": len(xs),
            "errors": errors[ep],
            "req_per_s": round(len(xs) / elapsed, 2),
            "p50_ms": round(_pct(xs, 0.5), 1),
            "p99_ms": round(_pct(xs, 0.99), 1),
            "max_ms": round(xs[-1], 1) if xs else 0.0,
            "late": late[ep],
        }
    return {
        "mode": mode,
        "load": "closed" if not rate else "paced",
        # paced: what was offered, in requests/s over all endpoints (each endpoint its clients' share)
        "rate": rate,
        "clients": clients,
        "elapsed_s": round(elapsed, 2),
        "requests": sent,
        "token_reuses": lf_pool.reused - reused_before if mode == "cold" else None,
        "endpoints": rows,
        "error_kinds": error_kinds,
    }


# A request line of the Hub's log (tornado's, the Hub's and the service's own format alike):
# "... 200 GET /services/labfleet/api/auth/users/u00001 3.1ms" or "... 200 GET /hub/api/user (u@ip) 9.87ms".
_LOG_LINE = re.compile(
    r"\] (\d{3}) (GET|POST|PUT|PATCH|DELETE) (\S+?)(?:\?\S*)?(?: \([^)]*\))? ([\d.]+)ms\s*$"
)
SERVER_SIDE = {
    # the Hub asks labfleet for a user's groups and roles (Authenticator.refresh_user)
    "labfleet /api/auth/users/* (the Hub's refresh)": "/api/auth/users/",
    # the Hub answering a token: the benchmark's Hub endpoint and the service's token look-ups alike
    "hub /hub/api/user (all callers)": "/hub/api/user",
}


def server_side(log: str) -> dict[str, dict[str, float]]:
    """From the Hub's log lines of one run: how many requests of each kind the servers answered
    and how long each took inside the server (no proxy, no queue before it was read)."""
    times: dict[str, list[float]] = {k: [] for k in SERVER_SIDE}
    for line in log.splitlines():
        m = _LOG_LINE.search(line)
        if not m:
            continue
        path = m.group(3)
        for k, needle in SERVER_SIDE.items():
            if needle in path and (needle != "/hub/api/user" or path.endswith(needle)):
                times[k].append(float(m.group(4)))
    out = {}
    for k, xs in times.items():
        xs.sort()
        out[k] = {
            "count": len(xs),
            "p50_ms": round(_pct(xs, 0.5), 1),
            "p99_ms": round(_pct(xs, 0.99), 1),
            "total_s": round(sum(xs) / 1000, 2),
        }
    return out


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def print_table(run: dict[str, Any]) -> None:
    reuse = f"   token reuses: {run['token_reuses']}" if run["token_reuses"] is not None else ""
    load = "closed loop" if not run.get("rate") else f"paced at {run['rate']:g} req/s offered"
    print(
        f"run: {run['mode']}, {load}   clients: {run['clients']}   elapsed: {run['elapsed_s']:.1f} s   "
        f"requests: {run['requests']}{reuse}"
    )
    head = (
        f"{'endpoint':<24} {'ok':>7} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'errors':>7}"
        f" {'late':>6}"
    )
    print(head)
    print("-" * len(head))
    for ep, r in run["endpoints"].items():
        print(
            f"{ep:<24} {r['ok']:>7} {r['req_per_s']:>8.1f} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} "
            f"{r['max_ms']:>8.1f} {r['errors']:>7} {r.get('late', 0):>6}"
        )
    for k, v in run["error_kinds"].items():
        print(f"  error {k}: {v}")
    for k, v in run.get("server_side", {}).items():
        print(
            f"  server side, {k}: {v['count']} requests, p50 {v['p50_ms']} ms, p99 {v['p99_ms']} ms,"
            f" {v['total_s']} s in all"
        )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--users", type=int, default=1000, help="labfleet users (10..5000)")
    ap.add_argument("--domains", type=int, default=10, help="domains (1..100), two projects each")
    ap.add_argument("--sessions", type=int, default=10_000, help="ended sessions in the DB (0..100000)")
    ap.add_argument("--clients", type=int, default=50, help="concurrent clients (1..500)")
    ap.add_argument("--seconds", type=float, default=60.0, help="duration of each run (1..600)")
    ap.add_argument("--max-requests", type=int, default=200_000, help="requests per run at most")
    ap.add_argument(
        "--tokens-per-user",
        type=int,
        default=5,
        help="Hub tokens per user for the cold runs (1..20; the cold runs of one invocation share them)",
    )
    ap.add_argument("--mode", choices=("both", "cold", "warm"), default="both")
    ap.add_argument(
        "--endpoints",
        default="me,sessions,vfolders,hub",
        help="which of me, sessions, vfolders, hub (the Hub's /hub/api/user) the clients call",
    )
    ap.add_argument(
        "--rate",
        default="closed",
        help="comma-separated loads to run in turn: 'closed' (closed loop, no think time) or a paced "
        "rate in requests/s over all clients (open loop, e.g. 100), e.g. closed,100,200",
    )
    ap.add_argument(
        "--auth-refresh-age",
        type=int,
        default=None,
        help="the Hub's Authenticator.auth_refresh_age in seconds (default: labfleet's, 60; 0: the Hub "
        "never asks labfleet again for a user's groups and roles): to see what that refresh costs",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if args.auth_refresh_age is not None and not 0 <= args.auth_refresh_age <= 86400:
        ap.error("--auth-refresh-age must be 0..86400")
    rates: list[float | None] = []
    for part in (p.strip() for p in args.rate.split(",")):
        if part == "closed":
            rates.append(None)
            continue
        try:
            value = float(part)
        except ValueError:
            value = 0.0
        if not 0.1 <= value <= 10_000:
            ap.error(f"--rate: {part!r} is neither 'closed' nor a rate in 0.1..10000 requests/s")
        rates.append(value)
    if not 10 <= args.users <= 5000:
        ap.error("--users must be 10..5000")
    if not 1 <= args.domains <= 100 or args.domains > args.users:
        ap.error("--domains must be 1..100 and at most --users")
    if not 0 <= args.sessions <= 100_000:
        ap.error("--sessions must be 0..100000")
    if not 1 <= args.clients <= 500:
        ap.error("--clients must be 1..500")
    if not 1 <= args.seconds <= 600:
        ap.error("--seconds must be 1..600")
    if not 1 <= args.max_requests <= 1_000_000:
        ap.error("--max-requests must be 1..1000000")
    if not 1 <= args.tokens_per_user <= 20:
        ap.error("--tokens-per-user must be 1..20")
    short = {ep.rsplit("/", 1)[1] if ep.startswith("labfleet") else "hub": ep for ep in ENDPOINTS}
    picked = [short.get(e.strip(), e.strip()) for e in args.endpoints.split(",") if e.strip()]
    if not picked or any(e not in ENDPOINTS for e in picked):
        ap.error(f"--endpoints: a comma-separated list of {', '.join(short)}")
    say = (lambda *a: None) if args.json else (lambda *a: print(*a, flush=True))

    out: dict[str, Any] = {
        "db": "sqlite",
        "users": args.users,
        "domains": args.domains,
        "sessions": args.sessions,
        "clients": args.clients,
        "seconds": args.seconds,
        "endpoints": picked,
        "auth_refresh_age": args.auth_refresh_age,
    }
    with tempfile.TemporaryDirectory(prefix="lf-apiload-") as tmp:
        state = Path(tmp)
        key = state / "labfleet_secret.key"
        os.environ["LABFLEET_SECRET_KEY_FILE"] = str(key)
        ensure_key_file(key)
        url = f"sqlite:///{state / 'labfleet.sqlite'}"
        t0 = time.monotonic()
        say(f"writing {args.users} users in {args.domains} domains and {args.sessions} sessions ...")
        names = build_db(url, args.users, args.domains, args.sessions, args.seed)
        out["setup_db_s"] = round(time.monotonic() - t0, 1)
        say("starting the Hub ...")
        extra = "c.JupyterHub.log_level = 'INFO'\n"
        if args.auth_refresh_age is not None:
            extra += f"c.Authenticator.auth_refresh_age = {args.auth_refresh_age}\n"
        hub = start_hub(state, db_url=url, do_seed=False, extra_config=extra)
        try:
            out["hub_sync_s"] = round(wait_hub_users(hub, names, timeout=600), 1)
            say(
                f"Hub users synced in {out['hub_sync_s']} s; creating {args.tokens_per_user} tokens per user ..."
            )
            t0 = time.monotonic()
            tokens = asyncio.run(make_tokens(hub.url, hub.admin_token, names, args.tokens_per_user))
            out["tokens_s"] = round(time.monotonic() - t0, 1)
            say(f"{sum(map(len, tokens.values()))} tokens in {out['tokens_s']} s")
            out["runs"] = []
            pools = token_pools(tokens, args.seed)
            for rate in rates:
                for mode in ("cold", "warm") if args.mode == "both" else (args.mode,):
                    kind = "closed loop" if rate is None else f"paced at {rate:g} req/s"
                    say(f"{mode} run, {kind}: {args.clients} clients for {args.seconds:.0f} s ...")
                    mark = len(hub.log_text())
                    run = asyncio.run(
                        load(
                            hub.url,
                            mode,
                            tokens,
                            args.clients,
                            args.seconds,
                            args.max_requests,
                            args.seed,
                            picked,
                            rate,
                            pools,
                        )
                    )
                    run["server_side"] = server_side(hub.log_text()[mark:])
                    out["runs"].append(run)
                    if not args.json:
                        print_table(run)
        finally:
            hub.stop()
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
