"""Prometheus metrics of the fleet, answered at ``/services/labfleet/metrics``.

Two kinds of series:

- **read from the DB at each scrape** by :class:`FleetCollector`: the fleet as it is now, in nine
  statements whatever its size (:func:`read_fleet`; no query per node, group, tenant or endpoint),
  turned into metric families by plain functions (:func:`session_families`, :func:`capacity_families`,
  :func:`quota_families`, :func:`serving_families`) that take plain rows and can be tested without
  a server;
- **observed by the service** as it works (:class:`Metrics`): admission latency, queue wait and
  the router's request latency,
  histograms of this service process since it started (``rate()`` and ``histogram_quantile()``
  take restarts in their stride).

Every amount is a float in base units: ``cpu`` in cores, ``mem`` in bytes, ``gpu`` in devices,
``gpu.shares`` in devices' worth of shares (a whole device is 1); per-model slots (``gpu:A100``)
appear in the quota series as they are named in caps and charged. Series (all ``labfleet_``), with
their labels:

- gauges: ``sessions`` (status: PENDING .. TERMINATING, type, resource_group); ``queue_length``
  (resource_group); ``nodes`` (resource_group, status); ``node_capacity`` and ``node_allocated``
  (node, resource_group, slot); ``resource_group_capacity`` and ``resource_group_allocated``
  (resource_group, slot); ``domain_quota_used`` and ``domain_quota_limit`` (domain, slot);
  ``project_quota_used`` and ``project_quota_limit`` (domain, project, slot); per live session
  (session, domain, project, user), its last reading by the trusted sampler:
  ``session_cpu_used_cores``, ``session_memory_used_bytes``, ``session_gpu_used_devices``,
  ``session_gpu_memory_used_bytes``;
- histograms: ``admission_duration_seconds`` (outcome: scheduled, queued, refused);
  ``queue_wait_seconds`` (resource_group);
- counters: ``sessions_reclaimed_total`` (reason: idle-timeout, idle-utilization, lifetime,
  gpu-overuse);
  ``gpu_overuse_total`` (action: warn, kill, stop; resource_group), sessions over their share of a
  device's memory acted on (labfleet.usage.enforce).

Model serving (labfleet.serving), per endpoint not destroyed (endpoint, project, domain): the counters
``serving_requests_total`` and ``serving_errors_total``, read from the endpoints' cumulative columns
(written by the serving controller each tick, so they survive restarts and lag by at most a tick); the
gauges ``serving_replicas_healthy`` and ``serving_replicas_wanted``; the histogram
``serving_request_duration_seconds`` (endpoint), observed by the router as it counts each request.
Per token there is no label (as many series as tokens): per token is in ``GET /api/usage``.

Left out, and why:

- sessions that ended (TERMINATED, ERROR, CANCELLED): their number only grows, and counting it
  would read the whole session history at every scrape; the usage records will count them;
- ended sessions' utilisation: what they used is in the usage records (``GET /api/usage``);
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from sqlalchemy import distinct, func, select
from sqlalchemy.orm import Session, sessionmaker

from labfleet.core import usage_ledger
from labfleet.core.models import (
    RECLAIM_REASONS,
    Allocation,
    ComputeSession,
    Device,
    Domain,
    Node,
    Project,
    ResourceGroup,
    ServingEndpoint,
    ServingRoute,
)
from labfleet.core.slots import ResourceSlots, SlotError
from labfleet.core.vocab import LIVE_STATUSES, SESSION_TYPES, SLOT_NAMES
from labfleet.usage import records

# Live sessions, in the order a session goes through them.
NODE_STATUSES = ("ALIVE", "LOST", "DISABLED")
# The slots of nodes and groups: cores, bytes, devices, devices' worth of shares.
ADMISSION_OUTCOMES = ("scheduled", "queued", "refused")
ASKED_AGAIN = "asked again"  # the spawner asked again for a session admitted already: not timed
# Seconds: an admission is a few milliseconds; a wait in a queue, seconds to days.
ADMISSION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
QUEUE_WAIT_BUCKETS = tuple(
    float(s) for s in (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 3 * 3600, 12 * 3600, 24 * 3600)
)
# Seconds a request through the router takes: the router adds a millisecond or two to what the model
# takes, from milliseconds (a health-style call) to a minute (a long generation).
SERVING_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ENDPOINT_LABELS = ("endpoint", "project", "domain")

_SLOT_UNITS = "cpu in cores, mem in bytes, gpu in devices, gpu.shares in devices' worth of shares"

# name -> (HELP, labels) of every gauge read from the DB.
GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "labfleet_sessions": (
        "Live sessions (queued or holding slots) by status, session type and resource group; ended "
        "sessions are not counted",
        ("status", "type", "resource_group"),
    ),
    "labfleet_queue_length": (
        "Sessions waiting in the resource group's queue (status PENDING)",
        ("resource_group",),
    ),
    "labfleet_nodes": ("Nodes of the resource group by node status", ("resource_group", "status")),
    "labfleet_node_capacity": (
        f"What the node has, per slot ({_SLOT_UNITS}; a device is one share)",
        ("node", "resource_group", "slot"),
    ),
    "labfleet_node_allocated": (
        f"What sessions hold on the node, per slot ({_SLOT_UNITS}; gpu counts the devices of which "
        "any share is held)",
        ("node", "resource_group", "slot"),
    ),
    "labfleet_resource_group_capacity": (
        f"What the resource group's nodes have together, whatever their status, per slot ({_SLOT_UNITS})",
        ("resource_group", "slot"),
    ),
    "labfleet_resource_group_allocated": (
        f"What sessions hold on the resource group's nodes, per slot ({_SLOT_UNITS}; gpu counts the "
        "devices of which any share is held)",
        ("resource_group", "slot"),
    ),
    "labfleet_domain_quota_used": (
        "What the domain's live sessions are charged against its cap, per slot, as admission counts "
        f"it: queued sessions included, a whole device counting as one gpu.shares too ({_SLOT_UNITS})",
        ("domain", "slot"),
    ),
    "labfleet_domain_quota_limit": (
        "The domain's total resource cap, per slot it names (a slot it does not name is unlimited)",
        ("domain", "slot"),
    ),
    "labfleet_project_quota_used": (
        "What the project's live sessions are charged against its cap, per slot, as admission counts "
        f"it: queued sessions included, a whole device counting as one gpu.shares too ({_SLOT_UNITS})",
        ("domain", "project", "slot"),
    ),
    "labfleet_project_quota_limit": (
        "The project's total resource cap, per slot it names (a slot it does not name is unlimited)",
        ("domain", "project", "slot"),
    ),
}
_SESSION_LABELS = ("session", "domain", "project", "user")
GAUGES.update(
    {
        "labfleet_session_cpu_used_cores": (
            "CPU the live session's processes used over the sampler's last interval, in cores, measured "
            "outside the session (its process tree or its container)",
            _SESSION_LABELS,
        ),
        "labfleet_session_memory_used_bytes": (
            "Resident memory of the live session's processes at the sampler's last reading",
            _SESSION_LABELS,
        ),
        "labfleet_session_gpu_used_devices": (
            "GPU busy time the live session's processes took at the last reading, in devices' worth "
            "(0.3: 30 % of one device), from the device plugin's per-process figures",
            _SESSION_LABELS,
        ),
        "labfleet_session_gpu_memory_used_bytes": (
            "Device memory the live session's processes used at the last reading",
            _SESSION_LABELS,
        ),
    }
)
GAUGES.update(
    {
        "labfleet_serving_replicas_healthy": (
            "Replicas of the endpoint that carry traffic (running and healthy), as the router sees them",
            _ENDPOINT_LABELS,
        ),
        "labfleet_serving_replicas_wanted": (
            "Replicas the endpoint asks for (0 while it is being destroyed)",
            _ENDPOINT_LABELS,
        ),
    }
)
# name (without _total) -> (HELP, labels) of every counter read from the DB.
COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "labfleet_serving_requests": (
        "Requests the router passed to the endpoint's replicas, or refused past a token's rate limit "
        "(written each serving tick: at most a tick behind)",
        _ENDPOINT_LABELS,
    ),
    "labfleet_serving_errors": (
        "Of those, the ones that failed: answered 5xx (by a replica or the router: none healthy, "
        "none reachable) or refused past a token's rate limit",
        _ENDPOINT_LABELS,
    ),
}
HISTOGRAMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "labfleet_admission_duration_seconds": (
        "Seconds the service took to answer the Hub's admission requests (checks, placement, commit), "
        "by outcome: scheduled (placed), queued (PENDING) or refused (anything that admitted nothing)",
        ("outcome",),
    ),
    "labfleet_sessions_reclaimed": (
        "Sessions this service stopped, by reason: idle-timeout (no activity), idle-utilization (under "
        "the thresholds of a utilization checker), lifetime (past the max session lifetime), gpu-overuse "
        "(over its share of a device's memory, in a group whose gpu_overuse policy is stop)",
        ("reason",),
    ),
    "labfleet_gpu_overuse": (
        "Sessions found holding more of a device's memory than their fraction of it (for consecutive "
        "samples), by the action the service took: warn, kill (their newest processes) or stop",
        ("action", "resource_group"),
    ),
    "labfleet_queue_wait_seconds": (
        "Seconds sessions waited in a resource group's queue before they were placed (from the "
        "session's creation to its placement; sessions placed at admission do not wait)",
        ("resource_group",),
    ),
    "labfleet_serving_request_duration_seconds": (
        "Seconds requests took through the router, from their arrival to the end of the answer (the "
        "replica's time included; a websocket: until it is bridged), by endpoint",
        ("endpoint",),
    ),
}


def gauge(name: str) -> GaugeMetricFamily:
    """An empty gauge family of :data:`GAUGES`, with its HELP and labels."""
    doc, labels = GAUGES[name]
    return GaugeMetricFamily(name, doc, labels=list(labels))


def counter(name: str) -> CounterMetricFamily:
    """An empty counter family of :data:`COUNTERS`, with its HELP and labels."""
    doc, labels = COUNTERS[name]
    return CounterMetricFamily(name, doc, labels=list(labels))


# ---------------------------------------------------------------- what a scrape reads


@dataclass(frozen=True)
class NodeRow:
    id: int
    name: str
    group_id: int
    status: str
    cpu: str  # cores, a decimal string
    mem: int  # bytes
    devices: int


@dataclass(frozen=True)
class Held:
    """What sessions hold on one node (sums of its allocations)."""

    cpu_milli: int = 0
    mem: int = 0
    shares_centi: int = 0
    devices: int = 0  # devices of which any share is held


@dataclass(frozen=True)
class Tenant:
    """A domain or a project: its ledger id, names and cap (stored slots)."""

    id: int
    domain: str
    name: str
    cap: Mapping[str, Any]


@dataclass(frozen=True)
class SessionFigures:
    """A live session's last sampled figures (None: not measured)."""

    session: str
    domain: str
    project: str
    user: str
    cpu: float | None
    mem: float | None
    gpu: float | None
    gpu_mem: float | None


@dataclass(frozen=True)
class EndpointRow:
    """A serving endpoint not destroyed: its names, cumulative counts and replicas."""

    name: str
    project: str
    domain: str
    requests: int
    errors: int
    wanted: int
    healthy: int


@dataclass
class Fleet:
    """The rows of one scrape."""

    groups: dict[int, str] = field(default_factory=dict)  # id -> name
    sessions: list[tuple[str, str, int, int]] = field(default_factory=list)  # status, type, group id, n
    nodes: list[NodeRow] = field(default_factory=list)
    held: dict[int, Held] = field(default_factory=dict)  # node id -> held
    domains: list[Tenant] = field(default_factory=list)
    projects: list[Tenant] = field(default_factory=list)
    ledger: usage_ledger.Rows = field(default_factory=dict)
    utilisation: list[SessionFigures] = field(default_factory=list)
    serving: list[EndpointRow] = field(default_factory=list)


def read_endpoints(db: Session) -> list[EndpointRow]:
    """Every endpoint not destroyed with its healthy replicas, in one statement."""
    e, r = ServingEndpoint, ServingRoute
    healthy = (r.endpoint_id == e.id) & (r.status == "RUNNING") & (r.traffic == "ACTIVE")
    cols = (e.id, e.name, Project.name, Domain.name, e.status, e.replicas, e.requests, e.errors)
    return [
        EndpointRow(
            name,
            project,
            domain,
            int(requests or 0),
            int(errors or 0),
            0 if status == "DESTROYING" else int(replicas),
            int(n),
        )
        for _id, name, project, domain, status, replicas, requests, errors, n in db.execute(
            select(*cols, func.count(r.id))
            .join(Project, Project.id == e.project_id)
            .join(Domain, Domain.id == e.domain_id)
            .outerjoin(r, healthy)
            .where(e.status != "DESTROYED")
            .group_by(*cols)
        )
    ]


def read_fleet(db: Session) -> Fleet:
    """Everything a scrape shows, in nine statements (no lock; one read transaction)."""
    fleet = Fleet()
    fleet.groups = {gid: name for gid, name in db.execute(select(ResourceGroup.id, ResourceGroup.name))}
    s = ComputeSession
    fleet.sessions = [
        (status, type_, gid, int(n))
        for status, type_, gid, n in db.execute(
            select(s.status, s.type, s.resource_group_id, func.count())
            .where(s.status.in_(LIVE_STATUSES))
            .group_by(s.status, s.type, s.resource_group_id)
        )
    ]
    fleet.nodes = [
        NodeRow(nid, name, gid, status, cpu, int(mem), int(n))
        for nid, name, gid, status, cpu, mem, n in db.execute(
            select(
                Node.id,
                Node.name,
                Node.resource_group_id,
                Node.status,
                Node.cpu,
                Node.mem,
                func.count(Device.id),
            )
            .outerjoin(Device, Device.node_id == Node.id)
            .group_by(Node.id, Node.name, Node.resource_group_id, Node.status, Node.cpu, Node.mem)
        )
    ]
    a = Allocation
    fleet.held = {
        nid: Held(int(cpu or 0), int(mem or 0), int(centi or 0), int(devices or 0))
        for nid, cpu, mem, centi, devices in db.execute(
            select(
                a.node_id,
                func.sum(a.cpu_milli),
                func.sum(a.mem),
                func.sum(a.shares_centi),
                func.count(distinct(a.device_id)),
            ).group_by(a.node_id)
        )
    }
    fleet.domains = [
        Tenant(did, name, name, cap or {})
        for did, name, cap in db.execute(select(Domain.id, Domain.name, Domain.total_resource_slots))
    ]
    fleet.projects = [
        Tenant(pid, domain, name, cap or {})
        for pid, domain, name, cap in db.execute(
            select(Project.id, Domain.name, Project.name, Project.total_resource_slots).join(
                Domain, Domain.id == Project.domain_id
            )
        )
    ]
    fleet.ledger = usage_ledger.read_kinds(db, ("domain", "project"))
    fleet.utilisation = [
        SessionFigures(
            st.session_id, st.domain, st.project, st.user, st.cpu_now, st.mem_now, st.gpu_now, st.gpu_mem_now
        )
        for st in records.live_figures(db)
    ]
    fleet.serving = read_endpoints(db)
    return fleet


# ---------------------------------------------------------------- rows -> families (pure)


def session_families(
    groups: Mapping[int, str],
    counts: Iterable[tuple[str, str, int, int]],
    types: Iterable[str] = SESSION_TYPES,
) -> list[Metric]:
    """``labfleet_sessions`` and ``labfleet_queue_length`` from (status, type, group id, count) rows:
    every live status and known type of every group, 0 included (a series that vanishes at 0 would
    leave graphs and alerts at its last value)."""
    sessions, queue = gauge("labfleet_sessions"), gauge("labfleet_queue_length")
    n: dict[tuple[str, str, int], int] = defaultdict(int)
    for status, type_, gid, count in counts:
        n[(status, type_, gid)] += count
    kinds = sorted(set(types) | {t for _, t, _ in n})
    for gid, group in sorted(groups.items(), key=lambda g: g[1]):
        for status in LIVE_STATUSES:
            for kind in kinds:
                sessions.add_metric([status, kind, group], n.get((status, kind, gid), 0))
        queue.add_metric([group], sum(n.get(("PENDING", kind, gid), 0) for kind in kinds))
    return [sessions, queue]


def node_capacity(node: NodeRow) -> dict[str, Decimal]:
    return {
        "cpu": Decimal(node.cpu),
        "mem": Decimal(node.mem),
        "gpu": Decimal(node.devices),
        "gpu.shares": Decimal(node.devices),
    }


def held_slots(held: Held) -> dict[str, Decimal]:
    return {
        "cpu": Decimal(held.cpu_milli) / 1000,
        "mem": Decimal(held.mem),
        "gpu": Decimal(held.devices),
        "gpu.shares": Decimal(held.shares_centi) / 100,
    }


def capacity_families(
    groups: Mapping[int, str], nodes: Iterable[NodeRow], held: Mapping[int, Held]
) -> list[Metric]:
    """Node counts, and capacity and allocated per slot of each node and of each group (its nodes'
    sums, exact until the float of the answer)."""
    count = gauge("labfleet_nodes")
    node_cap, node_alloc = gauge("labfleet_node_capacity"), gauge("labfleet_node_allocated")
    group_cap, group_alloc = (
        gauge("labfleet_resource_group_capacity"),
        gauge("labfleet_resource_group_allocated"),
    )
    zero = dict.fromkeys(SLOT_NAMES, Decimal(0))
    cap_sum = {gid: dict(zero) for gid in groups}
    alloc_sum = {gid: dict(zero) for gid in groups}
    statuses: dict[tuple[int, str], int] = defaultdict(int)
    for node in sorted(nodes, key=lambda n: n.name):
        group = groups.get(node.group_id)
        if group is None:
            continue  # a group made after the groups were read: the next scrape has both
        statuses[(node.group_id, node.status)] += 1
        cap, alloc = node_capacity(node), held_slots(held.get(node.id, Held()))
        for slot in SLOT_NAMES:
            node_cap.add_metric([node.name, group, slot], float(cap[slot]))
            node_alloc.add_metric([node.name, group, slot], float(alloc[slot]))
            cap_sum[node.group_id][slot] += cap[slot]
            alloc_sum[node.group_id][slot] += alloc[slot]
    for gid, group in sorted(groups.items(), key=lambda g: g[1]):
        for status in sorted(set(NODE_STATUSES) | {st for g, st in statuses if g == gid}):
            count.add_metric([group, status], statuses.get((gid, status), 0))
        for slot in SLOT_NAMES:
            group_cap.add_metric([group, slot], float(cap_sum[gid][slot]))
            group_alloc.add_metric([group, slot], float(alloc_sum[gid][slot]))
    return [count, node_cap, node_alloc, group_cap, group_alloc]


def _cap(stored: Mapping[str, Any]) -> ResourceSlots:
    try:
        return ResourceSlots.parse(stored)
    except SlotError:
        return ResourceSlots()  # a cap the API would refuse: shown as none rather than failing the scrape


def quota_families(
    domains: Iterable[Tenant], projects: Iterable[Tenant], rows: Mapping[tuple[str, int], Mapping[str, int]]
) -> list[Metric]:
    """Quota used (from the usage ledger's ``rows``) and limit (the caps) of every domain and project:
    used for every slot held or capped (0 where capped and unused), limit for every slot capped."""
    out: list[Metric] = []
    for kind, tenants, labels in (
        ("domain", domains, lambda t: [t.name]),
        ("project", projects, lambda t: [t.domain, t.name]),
    ):
        used_f, limit_f = gauge(f"labfleet_{kind}_quota_used"), gauge(f"labfleet_{kind}_quota_limit")
        for t in sorted(tenants, key=lambda t: (t.domain, t.name)):
            used = usage_ledger.used(rows.get((kind, t.id), {}))
            cap = _cap(t.cap)
            for slot in sorted(set(used) | set(cap)):
                used_f.add_metric([*labels(t), slot], float(used.get_amount(slot)))
            for slot in sorted(cap):
                limit_f.add_metric([*labels(t), slot], float(cap[slot]))
        out += [used_f, limit_f]
    return out


def utilisation_families(rows: Iterable[SessionFigures]) -> list[Metric]:
    """The per-session gauges, one sample per live session and figure it has."""
    families = {
        "cpu": gauge("labfleet_session_cpu_used_cores"),
        "mem": gauge("labfleet_session_memory_used_bytes"),
        "gpu": gauge("labfleet_session_gpu_used_devices"),
        "gpu_mem": gauge("labfleet_session_gpu_memory_used_bytes"),
    }
    for r in rows:
        labels = [r.session, r.domain, r.project, r.user]
        for figure, family in families.items():
            v = getattr(r, figure)
            if v is not None:
                family.add_metric(labels, float(v))
    return list(families.values())


def serving_families(rows: Iterable[EndpointRow]) -> list[Metric]:
    """The serving counters and replica gauges, one sample per endpoint each (0 included)."""
    requests, errors = counter("labfleet_serving_requests"), counter("labfleet_serving_errors")
    healthy, wanted = gauge("labfleet_serving_replicas_healthy"), gauge("labfleet_serving_replicas_wanted")
    for r in sorted(rows, key=lambda r: r.name):
        labels = [r.name, r.project, r.domain]
        requests.add_metric(labels, float(r.requests))
        errors.add_metric(labels, float(r.errors))
        healthy.add_metric(labels, float(r.healthy))
        wanted.add_metric(labels, float(r.wanted))
    return [requests, errors, healthy, wanted]


def fleet_families(fleet: Fleet) -> list[Metric]:
    """Every family of :data:`GAUGES` and :data:`COUNTERS`, from one scrape's rows."""
    return [
        *session_families(fleet.groups, fleet.sessions),
        *capacity_families(fleet.groups, fleet.nodes, fleet.held),
        *quota_families(fleet.domains, fleet.projects, fleet.ledger),
        *utilisation_families(fleet.utilisation),
        *serving_families(fleet.serving),
    ]


# ---------------------------------------------------------------- the collector and the service's metrics


class FleetCollector:
    """A custom collector: reads the fleet from the DB at each scrape (:func:`read_fleet`)."""

    def __init__(self, session_factory: sessionmaker[Session]) -> None:
        self.session_factory = session_factory

    def describe(self) -> list[Metric]:
        """The families' names, without reading the DB (the registry checks names for clashes)."""
        return [*(gauge(name) for name in GAUGES), *(counter(name) for name in COUNTERS)]

    def collect(self) -> list[Metric]:
        with self.session_factory() as db:  # read only: closing rolls the read transaction back
            fleet = read_fleet(db)
        return fleet_families(fleet)


class Metrics:
    """The service's metrics: a private registry (never the process-wide one) with the fleet
    collector and the histograms the service feeds (:meth:`observe_admission`,
    :meth:`observe_queue_waits`, :meth:`observe_serving`)."""

    def __init__(self, session_factory: sessionmaker[Session]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(FleetCollector(session_factory))
        doc, labels = HISTOGRAMS["labfleet_admission_duration_seconds"]
        self.admission = Histogram(
            "labfleet_admission_duration_seconds",
            doc,
            labels,
            buckets=ADMISSION_BUCKETS,
            registry=self.registry,
        )
        for outcome in ADMISSION_OUTCOMES:
            self.admission.labels(outcome)  # every outcome shows from the start, at 0
        doc, labels = HISTOGRAMS["labfleet_sessions_reclaimed"]
        self.reclaimed = Counter("labfleet_sessions_reclaimed", doc, labels, registry=self.registry)
        for reason in RECLAIM_REASONS:
            self.reclaimed.labels(reason)  # every reason shows from the start, at 0
        doc, labels = HISTOGRAMS["labfleet_gpu_overuse"]
        self.gpu_overuse = Counter("labfleet_gpu_overuse", doc, labels, registry=self.registry)
        doc, labels = HISTOGRAMS["labfleet_queue_wait_seconds"]
        self.queue_wait = Histogram(
            "labfleet_queue_wait_seconds", doc, labels, buckets=QUEUE_WAIT_BUCKETS, registry=self.registry
        )

        doc, labels = HISTOGRAMS["labfleet_serving_request_duration_seconds"]
        self.serving = Histogram(
            "labfleet_serving_request_duration_seconds",
            doc,
            labels,
            buckets=SERVING_BUCKETS,
            registry=self.registry,
        )

    def observe_serving(self, endpoint: str, seconds: float) -> None:
        """One request through the router to ``endpoint`` (its name), as the router counts it."""
        self.serving.labels(endpoint).observe(seconds)

    def observe_reclaimed(self, reason: str) -> None:
        self.reclaimed.labels(reason if reason in RECLAIM_REASONS else "idle-timeout").inc()

    def observe_gpu_overuse(self, action: str, resource_group: str) -> None:
        """A session over its GPU share acted on (labfleet.usage.enforce); one stopped is reclaimed too."""
        self.gpu_overuse.labels(action, resource_group).inc()
        if action == "stop":
            self.observe_reclaimed("gpu-overuse")

    def observe_admission(self, seconds: float, outcome: str) -> None:
        self.admission.labels(outcome if outcome in ADMISSION_OUTCOMES else "refused").observe(seconds)

    @contextmanager
    def timing_admission(self) -> Iterator[dict[str, str]]:
        """Times the block as one admission; the block sets ``["outcome"]`` (refused if it does not)."""
        result: dict[str, str] = {}
        start = time.perf_counter()
        try:
            yield result
        finally:
            outcome = result.get("outcome", "refused")
            if outcome != ASKED_AGAIN:  # the answer to a request asked again is not an admission
                self.observe_admission(time.perf_counter() - start, outcome)

    def observe_queue_waits(self, waits: Iterable[tuple[str, float]]) -> None:
        """(resource group, seconds waited) of sessions placed from a queue, once their unit committed."""
        for group, seconds in waits:
            self.queue_wait.labels(group).observe(seconds)

    def exposition(self) -> bytes:
        """The text exposition format of every series (reads the DB)."""
        return generate_latest(self.registry)
