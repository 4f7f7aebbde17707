"""The serving controller: the service job that keeps every endpoint's replicas at the wanted count.

Each tick (``LABFLEET_SERVING_INTERVAL`` seconds, 2 by default, and at once after an API change):

1. reads the live endpoints and their routes, and asks the Hub which of the owners' servers run;
2. health-checks the replicas whose server is ready, when due (Backend.AI's rules: after
   ``initial_delay``, every ``interval``, ``max_wait_time`` per request, more than ``max_retries``
   failures in a row and the replica is unhealthy; with no ``health_check`` in the definition, a TCP
   connect to its port);
3. in one transaction: a route whose server is gone FAILED with the reason (its session's own, or the
   Hub's refusal), an unhealthy one FAILED and stopped; too few routes: new ones (after the backoff of
   the failures in a row: 2, 4, 8, ... at most 60 s); too many: the unhealthy, then the newest, stopped;
   the endpoint's status and reason from what its routes are;
4. then asks the Hub to start and to stop (and remove) servers, and rebuilds the routing table that
   :mod:`labfleet.serving.router` reads: per endpoint, the replicas that carry traffic, and its tokens.

A replica is called at its session's own address when the spawner reported one (a session with a
network of its own: ``runtime["address"]``), else at its node's address label, else on the loopback;
every call (the router's, the health checks) carries the replica's credential
(:mod:`labfleet.serving.credentials`), which the replica's front demands.

A replica is a named Hub server of the endpoint's owner (``<endpoint>-r<route id>``) started with the
spawn options of an inference session: the Hub's spawner asks this service for admission and
placement like any other session, so quotas count it and fractions of a GPU are allowed.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol
from urllib.parse import quote

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from labfleet.compute import sessions
from labfleet.core import http
from labfleet.core.database import session_scope
from labfleet.core.models import ComputeSession, ServingEndpoint, ServingRoute, ServingToken
from labfleet.core.secretbox import load_key
from labfleet.serving import credentials, definition, endpoints
from labfleet.usage import serving_usage

LOCAL_HOST = "127.0.0.1"
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
BACKOFF_MAX = 60.0
TCP_RETRIES = 3  # failed connects in a row that make a replica with no health_check unhealthy
RECENT_FAILED = timedelta(minutes=5)  # failed routes whose servers are still stopped if the Hub has them


def _now() -> datetime:
    return datetime.now(timezone.utc)


def backoff(streak: int) -> float:
    """Seconds before the next replica starts after ``streak`` failures in a row."""
    return 0.0 if streak <= 0 else min(BACKOFF_MAX, 2.0 ** min(streak, 10))


def replica_host(node_labels: Mapping[str, Any] | None) -> str:
    """Where the router reaches a replica: its node's ``address`` label (a node of the Swarm backend, see
    spawner/swarm_config.py), else the loopback (the service's own host)."""
    address = (node_labels or {}).get("address")
    if not isinstance(address, str) or not address:
        return LOCAL_HOST
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return address if _HOSTNAME.match(address) else LOCAL_HOST


def replica_address(runtime: Mapping[str, Any] | None, node_labels: Mapping[str, Any] | None) -> str:
    """Where the router reaches a replica: the address its session reported (a network of its own:
    a local session's namespace, a container on a bridge), else :func:`replica_host`."""
    address = (runtime or {}).get("address")
    if isinstance(address, str) and address:
        try:
            return str(ipaddress.ip_address(address))
        except ValueError:
            pass  # the service checks what it stores; an odd value is not routed to
    return replica_host(node_labels)


def free_port(taken: set[int], host: str = LOCAL_HOST) -> int:
    """A port nobody listens on now and no other replica was given."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in taken:
            return port
    raise RuntimeError("no free port")


def token_key(plain: str) -> str:
    return hashlib.sha256(plain.encode()).hexdigest()


# ---------------------------------------------------------------- the routing table (read by the router)


def suspension(domain: str, domain_active: bool, owner: str, owner_active: bool) -> str | None:
    """Why an endpoint answers nobody now, None when it serves (pure).  A deactivated domain
    suspends all its endpoints, whoever owns them (its tokens and public ones alike); a
    deactivated owner, theirs.  Nothing is destroyed: reactivating serves again."""
    if not domain_active:
        return f"domain {domain} is inactive"
    if not owner_active:
        return f"its owner {owner} is inactive"
    return None


@dataclass
class Replica:
    route_id: int
    host: str
    port: int
    outstanding: int = 0  # requests in flight through the router
    down: bool = False  # refused a connection: out of rotation until a health check passes
    credential: str = ""  # what the replica's front demands (labfleet.serving.credentials)


@dataclass
class TokenEntry:
    id: int
    rate_limit: int  # requests per minute; 0 = unlimited
    expires_at: float | None  # epoch seconds


@dataclass
class Entry:
    id: str
    name: str
    open_to_public: bool
    replicas: list[Replica]
    tokens: dict[int, TokenEntry]
    wanted: int
    status: str
    rr: int = 0  # the round robin's position
    suspended: str | None = None  # why it answers nobody now (its domain or owner deactivated)


@dataclass
class Stats:
    requests: int = 0
    errors: int = 0
    latency_ms: float = 0.0
    last_used: datetime | None = None


class HubServers(Protocol):
    """What the controller needs of :class:`labfleet.service.hubsync.HubSync`."""

    api_url: str
    token: str

    async def user_servers(self, user: str) -> dict[str, str] | None: ...

    async def start_server(self, user: str, server: str, user_options: dict[str, Any]) -> http.HTTPReply: ...


@dataclass
class _Probe:
    route_id: int
    ok: bool
    error: str = ""


@dataclass
class _Actions:
    starts: list[tuple[int, str, str, dict[str, Any]]] = field(
        default_factory=list
    )  # route, user, server, options
    stops: list[tuple[str, str]] = field(default_factory=list)  # user, server


class ServingController:
    def __init__(
        self,
        session_factory: sessionmaker[Session],
        hub: HubServers,
        log: logging.Logger,
        *,
        interval: float = 2.0,
        poke: Callable[[], None] | None = None,
        secret_key: bytes | None = None,
    ) -> None:
        self.session_factory = session_factory
        self.hub = hub
        self.log = log
        self.interval = interval
        self.poke = poke or (lambda: None)
        self.table: dict[str, Entry] = {}
        self.token_cache: dict[str, tuple[int, str]] = {}  # sha256(token) -> (token id, endpoint id)
        self.stats: dict[str, Stats] = {}  # endpoint id -> counted by the router, written each tick
        self.token_stats: dict[int, Stats] = {}
        self._starting: dict[int, asyncio.Task[None]] = {}
        self._start_errors: dict[int, str] = {}
        self._next_check: dict[int, float] = {}  # route id -> monotonic time of its next health check
        self._down: set[int] = set()  # routes that refused the router, until a health check passes
        # Replica credentials are derived from the service's secret key ($LABFLEET_SECRET_KEY or its file).
        self._credential_key = credentials.derive_key(secret_key if secret_key is not None else load_key())
        self._credentials: dict[tuple[str, int], str] = {}

    @classmethod
    def attach(cls, app: Any) -> ServingController:
        """Make the controller of the service ``app`` and register its job (when the service knows the Hub)."""
        interval = float(os.environ.get("LABFLEET_SERVING_INTERVAL") or 2)
        engine = cls(app.session_factory, app.hub_sync, app.log, interval=interval)
        if app.hub_sync.enabled:
            engine.poke = lambda: app.jobs.poke("serving")
            app.jobs.add("serving", interval, engine.tick, first_in=0)
        return engine

    # ------------------------------------------------------------ router side

    def credential(self, endpoint_id: str, route_id: int) -> str:
        """The credential of a replica: sent by the router and the health checks, demanded by its front."""
        key = (endpoint_id, route_id)
        found = self._credentials.get(key)
        if found is None:
            if len(self._credentials) > 10_000:
                self._credentials.clear()
            found = self._credentials[key] = credentials.credential(
                self._credential_key, endpoint_id, route_id
            )
        return found

    def count(self, endpoint_id: str, token_id: int | None, ms: float, error: bool) -> None:
        now = _now()
        for stats in (self.stats.setdefault(endpoint_id, Stats()),) + (
            (self.token_stats.setdefault(token_id, Stats()),) if token_id is not None else ()
        ):
            stats.requests += 1
            stats.errors += int(error)
            stats.latency_ms += ms
            stats.last_used = now

    def refused(self, replica: Replica) -> None:
        """The router could not connect to ``replica``: out of rotation, checked at the next tick."""
        replica.down = True
        self._down.add(replica.route_id)
        self._next_check[replica.route_id] = 0.0
        self.poke()

    def check_token(self, entry: Entry, plain: str) -> tuple[int | None, bool]:
        """(token id, known): a token seen before answers from memory; (None, False): verify it."""
        hit = self.token_cache.get(token_key(plain))
        if hit is None or hit[1] != entry.id:
            return None, False
        tok = entry.tokens.get(hit[0])
        if tok is None or (tok.expires_at is not None and tok.expires_at <= time.time()):
            return None, True
        return tok.id, True

    def verify_token(self, entry: Entry, plain: str) -> int | None:
        """Check ``plain`` against the DB (a password hash: run it in a thread); remember it when valid."""
        with session_scope(self.session_factory) as db:
            t = endpoints.verify_token(db, entry.id, plain)
            if t is None:
                return None
            self.token_cache[token_key(plain)] = (t.id, entry.id)
            if len(self.token_cache) > 100_000:
                self.token_cache.clear()
            return t.id

    # ------------------------------------------------------------ the job

    async def tick(self) -> None:
        self._write_stats()
        with session_scope(self.session_factory) as db:
            live = db.scalars(select(ServingEndpoint).where(ServingEndpoint.status.in_(endpoints.LIVE))).all()
            owners = sorted({e.user.username for e in live})
        if not live and not self.table:
            return  # nothing served: one query per tick
        states: dict[str, dict[str, str] | None] = {}
        for owner in owners:
            states[owner] = await self.hub.user_servers(owner)
        probes = await self._probe_due(states)
        actions = _Actions()
        with session_scope(self.session_factory) as db:
            for e in db.scalars(
                select(ServingEndpoint).where(ServingEndpoint.status.in_(endpoints.LIVE))
            ).all():
                servers = states.get(e.user.username)
                if servers is None:
                    continue  # not in the snapshot, or the Hub could not be read: nothing to conclude
                self._reconcile(db, e, servers, probes, actions)
        await self._act(actions)
        self.rebuild()

    def rebuild(self) -> None:
        """The routing table from the DB: per live endpoint, the replicas that carry traffic, its tokens."""
        table: dict[str, Entry] = {}
        now = time.time()
        with session_scope(self.session_factory) as db:
            for e in db.scalars(
                select(ServingEndpoint).where(ServingEndpoint.status.in_(endpoints.LIVE))
            ).all():
                if e.status == "DESTROYING":
                    continue
                old = self.table.get(e.name)
                before = {x.route_id: x for x in old.replicas} if old is not None and old.id == e.id else {}
                replicas = []
                for r in e.routes:
                    if r.status == "RUNNING" and r.traffic == "ACTIVE":
                        prev = before.get(r.id)
                        outstanding = prev.outstanding if prev is not None else 0
                        replicas.append(
                            Replica(
                                r.id,
                                r.host,
                                r.port,
                                outstanding,
                                down=r.id in self._down,
                                credential=self.credential(e.id, r.id),
                            )
                        )
                tokens = {
                    t.id: TokenEntry(t.id, t.rate_limit, t.expires_at.timestamp() if t.expires_at else None)
                    for t in e.tokens
                    if t.revoked_at is None and (t.expires_at is None or t.expires_at.timestamp() > now)
                }
                table[e.name] = Entry(
                    e.id,
                    e.name,
                    e.open_to_public,
                    replicas,
                    tokens,
                    e.replicas,
                    e.status,
                    rr=old.rr if old is not None else 0,
                    suspended=suspension(
                        e.domain.name, e.domain.is_active, e.user.username, e.user.is_active
                    ),
                )
        self.table = table

    # ------------------------------------------------------------ health

    async def _probe_due(self, states: dict[str, dict[str, str] | None]) -> dict[int, _Probe]:
        due: list[tuple[int, str, int, definition.HealthCheck | None, str]] = []
        mono = time.monotonic()
        with session_scope(self.session_factory) as db:
            rows = db.scalars(
                select(ServingRoute)
                .join(ServingEndpoint)
                .where(ServingRoute.status == "RUNNING", ServingEndpoint.status.in_(endpoints.LIVE))
            ).all()
            for r in rows:
                servers = states.get(r.endpoint.user.username) or {}
                if servers.get(r.server) != "ready":
                    continue
                service = definition.ModelService.from_json(r.endpoint.definition)
                hc = service.health_check
                nxt = self._next_check.get(r.id)
                if nxt is None:
                    delay = hc.initial_delay if hc is not None else 0.0
                    if r.ready_at is not None:
                        delay -= (_now() - r.ready_at).total_seconds()
                    nxt = self._next_check[r.id] = mono + max(0.0, delay)
                if nxt <= mono:
                    due.append((r.id, r.host, r.port, hc, self.credential(r.endpoint_id, r.id)))
        results = await asyncio.gather(*(self._probe(*d) for d in due))
        for (rid, _h, _p, hc, _c), _res in zip(due, results, strict=True):
            self._next_check[rid] = time.monotonic() + (hc.interval if hc is not None else self.interval)
        return {p.route_id: p for p in results}

    async def _probe(
        self, route_id: int, host: str, port: int, hc: definition.HealthCheck | None, credential: str
    ) -> _Probe:
        """One health check, with the replica's credential. Without a ``health_check`` in the definition:
        whether the command accepts connections, as the replica's front answers it (a connect to the
        front alone would say nothing of the command behind it)."""
        headers = {credentials.HEADER: credential}
        if hc is None:
            headers[credentials.PROBE_HEADER] = "connect"
        path, expected, wait = (hc.path, hc.expected_status_code, hc.max_wait_time) if hc else ("/", 204, 5.0)
        what = f"health check GET {path}" if hc is not None else f"connect check of {host}:{port}"
        req = HTTPRequest(
            f"http://{host}:{port}{path}",
            headers=headers,
            connect_timeout=wait,
            request_timeout=wait,
            follow_redirects=False,
        )
        try:
            resp = await AsyncHTTPClient().fetch(req, raise_error=False)
        except Exception as e:  # a refused connection is raised, not answered
            return _Probe(route_id, False, f"{what} failed: {e}")
        if resp.code == expected:
            return _Probe(route_id, True)
        if resp.code == 599:
            return _Probe(route_id, False, f"{what} failed: {resp.error}")
        if resp.headers.get(credentials.REFUSED_HEADER):
            return _Probe(route_id, False, f"{what}: nothing accepts connections behind the replica's front")
        if resp.code == 401:
            return _Probe(route_id, False, f"{what}: the replica refused its credential (401)")
        return _Probe(route_id, False, f"{what} answered {resp.code}, not {expected}")

    # ------------------------------------------------------------ one endpoint

    def _reconcile(
        self,
        db: Session,
        e: ServingEndpoint,
        servers: dict[str, str],
        probes: dict[int, _Probe],
        actions: _Actions,
    ) -> None:
        now = _now()
        owner = e.user.username
        service = definition.ModelService.from_json(e.definition)
        hc = service.health_check
        max_retries = hc.max_retries if hc is not None else TCP_RETRIES
        for r in e.routes:
            starting = self._starting.get(r.id)
            if starting is not None and not starting.done():
                continue  # the Hub is being asked to start it
            state = servers.get(r.server)
            if r.status in ("TERMINATING", "FAILED"):
                if state in ("ready", "spawn") and (r.ended_at is None or now - r.ended_at < RECENT_FAILED):
                    actions.stops.append((owner, r.server))  # not gone yet: ask again
                elif r.status == "TERMINATING" and state is None:
                    r.status, r.ended_at = "TERMINATED", r.ended_at or now
                continue
            if r.status not in endpoints.ACTIVE_ROUTES:
                continue
            if state is None:
                self._fail(db, e, r, self._start_errors.pop(r.id, "") or self._why_gone(db, e, r), now)
                actions.stops.append((owner, r.server))  # removes the stopped server from the owner's list
                continue
            if state != "ready":
                # Spawning (or stopping): wait; a session waiting in its group's queue says why.
                s = self._session(db, e, r) if r.status == "PROVISIONING" else None
                if s is not None and s.status == "PENDING" and s.status_reason:
                    r.last_error = f"waiting: {s.status_reason}"[:2000]
                continue
            if r.status == "PROVISIONING":
                r.status, r.ready_at = "RUNNING", now
                session = self._session(db, e, r)
                r.session_id = session.id if session is not None else None
                # In a network of its own (the session's address), or on another node (a Swarm node's
                # address label), the router calls it there.
                r.host = replica_address(
                    session.runtime if session is not None else None,
                    session.node.labels if session is not None and session.node else None,
                )
            probe = probes.get(r.id)
            if probe is None:
                continue
            r.checked_at = now
            if probe.ok:
                self._down.discard(r.id)
                if r.health != "HEALTHY":
                    e.failure_streak = 0  # a replica became healthy: the failures in a row are over
                # Healthy now: what it waited for, or its last failed probe, is over.
                r.health, r.traffic, r.failures, r.last_error = "HEALTHY", "ACTIVE", 0, ""
                continue
            r.failures += 1
            r.last_error = probe.error
            if r.failures > max_retries:
                r.health = "UNHEALTHY"
                self._fail(db, e, r, f"unhealthy after {r.failures} failed checks: {probe.error}", now)
                actions.stops.append((owner, r.server))
        wanted = e.replicas if e.status != "DESTROYING" else 0
        active = [r for r in e.routes if r.status in endpoints.ACTIVE_ROUTES]
        if len(active) > wanted:
            # Those that carry no traffic first, then the newest.
            victims = sorted(active, key=lambda r: (r.traffic == "ACTIVE", -r.id))[: len(active) - wanted]
            for r in victims:
                r.status, r.traffic, r.ended_at = "TERMINATING", "INACTIVE", now
                actions.stops.append((owner, r.server))
        elif len(active) < wanted and (e.next_start_at is None or e.next_start_at <= now):
            taken = {
                r.port
                for r in db.scalars(
                    select(ServingRoute).where(ServingRoute.status.in_(endpoints.ACTIVE_ROUTES))
                )
            }
            for _ in range(wanted - len(active)):
                port = free_port(taken)
                taken.add(port)
                r = ServingRoute(
                    endpoint_id=e.id,
                    server="",
                    host=LOCAL_HOST,
                    port=port,
                    status="PROVISIONING",
                    health="NOT_CHECKED",
                    traffic="INACTIVE",
                    failures=0,
                    last_error="",
                    created_at=now,
                )
                e.routes.append(r)
                db.flush()
                r.server = f"{e.name}-r{r.id}"
                command = definition.replica_command(service, folder=e.folder_name, env=e.env or {})
                body = endpoints.launch_body(e, owner, r.server, command, port)
                try:
                    options = sessions.launch_options(sessions.parse_request(body))
                except Exception as err:  # the endpoint's settings no longer make a session request
                    self._fail(db, e, r, f"cannot make the replica's session request: {err}", now)
                    continue
                actions.starts.append((r.id, owner, r.server, options))
        self._set_status(e, now)

    def _fail(self, db: Session, e: ServingEndpoint, r: ServingRoute, error: str, now: datetime) -> None:
        r.status, r.traffic, r.ended_at, r.last_error = "FAILED", "INACTIVE", now, error[:2000]
        self._next_check.pop(r.id, None)
        self._down.discard(r.id)
        e.failure_streak += 1
        e.next_start_at = now + timedelta(seconds=backoff(e.failure_streak))
        self.log.warning("Endpoint %s: replica %s failed: %s", e.name, r.server, error)

    def _session(self, db: Session, e: ServingEndpoint, r: ServingRoute) -> ComputeSession | None:
        return db.scalars(
            select(ComputeSession)
            .where(ComputeSession.user_id == e.user_id, ComputeSession.name == r.server)
            .order_by(ComputeSession.created_at.desc())
            .limit(1)
        ).first()

    def _why_gone(self, db: Session, e: ServingEndpoint, r: ServingRoute) -> str:
        s = self._session(db, e, r)
        if s is None:
            return "its server is gone and it never became a session"
        code = f", exit code {s.exit_code}" if s.exit_code is not None else ""
        return f"its session {s.id} ended {s.status}: {s.status_reason or 'no reason given'}{code}"

    def _set_status(self, e: ServingEndpoint, now: datetime) -> None:
        routes = list(e.routes)
        active = [r for r in routes if r.status in endpoints.ACTIVE_ROUTES]
        if e.status == "DESTROYING":
            if not active and not any(r.status == "TERMINATING" for r in routes):
                e.status, e.status_reason, e.destroyed_at = "DESTROYED", "its replicas are gone", now
            return
        healthy = sum(1 for r in active if r.traffic == "ACTIVE")
        failed = [r for r in routes if r.status == "FAILED"]
        if healthy:
            status, reason = "READY", f"{healthy} of {e.replicas} replicas healthy"
        elif e.replicas == 0:
            status, reason = "DEGRADED", "scaled to 0 replicas: nothing serves"
        elif e.failure_streak and failed:
            status, reason = (
                "DEGRADED",
                f"0 of {e.replicas} replicas healthy; last error: {failed[-1].last_error}",
            )
        elif routes:
            status, reason = "DEPLOYING", f"0 of {e.replicas} replicas healthy yet: starting"
        else:
            status, reason = "PENDING", f"starting {e.replicas} replica(s)"
        if (status, reason[:2000]) != (e.status, e.status_reason):
            e.status, e.status_reason = status, reason[:2000]

    # ------------------------------------------------------------ the Hub

    async def _act(self, actions: _Actions) -> None:
        for route_id, owner, server, options in actions.starts:
            task = asyncio.ensure_future(self._start(route_id, owner, server, options))
            self._starting[route_id] = task
            task.add_done_callback(self._started(route_id))
        if actions.stops:
            await asyncio.gather(*(self._stop(u, s) for u, s in set(actions.stops)))

    def _started(self, route_id: int) -> Callable[[asyncio.Task[None]], None]:
        def done(_task: asyncio.Task[None]) -> None:
            self._starting.pop(route_id, None)

        return done

    async def _start(self, route_id: int, owner: str, server: str, options: dict[str, Any]) -> None:
        try:
            reply = await self.hub.start_server(owner, server, options)
        except Exception as e:  # never leave the route waiting on a task that died
            self._start_errors[route_id] = f"the Hub could not be asked to start it: {e}"
            return
        if not reply.ok:
            self._start_errors[route_id] = f"the Hub refused to start it: {reply.message}"
        self.poke()

    async def _stop(self, owner: str, server: str) -> None:
        """Stop the server and remove it from the owner's named servers."""
        path = f"/users/{quote(owner, safe='')}/servers/{quote(server, safe='')}"
        reply = await http.request(
            "DELETE",
            self.hub.api_url.rstrip("/") + path,
            token=self.hub.token,
            json_body={"remove": True},
            timeout=30,
            upstream="the Hub",
        )
        if reply.status not in (202, 204, 404):
            self.log.warning("Stopping replica %s/%s: %s", owner, server, reply.message or reply.error)

    # ------------------------------------------------------------ counters

    def _write_stats(self) -> None:
        stats, self.stats = self.stats, {}
        token_stats, self.token_stats = self.token_stats, {}
        if not stats and not token_stats:
            return
        with session_scope(self.session_factory) as db:
            for eid, s in stats.items():
                e = db.get(ServingEndpoint, eid)
                if e is not None:
                    e.requests += s.requests
                    e.errors += s.errors
                    e.latency_ms_total += s.latency_ms
            for tid, s in token_stats.items():
                t = db.get(ServingToken, tid)
                if t is not None:
                    t.requests += s.requests
                    t.latency_ms_total += s.latency_ms
                    t.last_used = s.last_used
            # Over time too, per endpoint and token in 15-minute rows: "how many requests yesterday".
            serving_usage.record(db, stats, token_stats, _now())
