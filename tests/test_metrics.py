"""Prometheus metrics (labfleet.usage.metrics, GET /services/labfleet/metrics).

Unit: the family builders on an SQLite fleet (sessions admitted with ``sessions.admit``), the
statements a scrape costs, the service's histograms, the bearer token check.
Real Hub: who may read the metrics (monitor and superadmin by token or login, the configured
Prometheus token; anonymous 401, user and domain admin 403), the text parses with
prometheus_client's own parser, the series follow admissions, releases and the queue, every
query of the shipped Grafana dashboard names a series the endpoint exposes, and a served endpoint's
calls move its serving series and the serving part of ``/api/usage`` by exactly their number (per
token too), which another domain's user does not see.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import requests
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import event

from labfleet.compute import nodes, sessions
from labfleet.compute.devices.base import NodeInfo
from labfleet.compute.devices.mock import MockPlugin
from labfleet.core import database, vocab
from labfleet.core.authz import Actor
from labfleet.service.handlers.metrics import bearer_matches
from labfleet.tenancy import directory
from labfleet.tenancy.policies import ensure_default_keypair_policy
from labfleet.usage import metrics
from labfleet.usage.metrics import Held, NodeRow, Tenant
from tests.dbfixture import fresh_db
from tests.hubfixture import start_hub
from tests.test_serving_hub import DEFINITION, SERVER, _call, _folder, _wait

CLI = Actor.cli()
GiB = 2**30
DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "labfleet.json"


# ---------------------------------------------------------------- helpers


def families(text: str) -> dict:
    """name -> family, parsed by prometheus_client's own parser."""
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams, name: str, **labels) -> float:
    """The one sample of family ``name`` (a histogram's ``_count``, ``_sum``, ``_bucket``, a counter's ``_total``)."""
    family = fams[re.sub(r"_(count|sum|bucket|total)$", "", name)] if name not in fams else fams[name]
    found = [s.value for s in family.samples if s.name == name and s.labels == labels]
    assert len(found) == 1, (name, labels, [(s.name, s.labels) for s in family.samples][:20])
    return found[0]


def total(fams, name: str, **labels) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    family = fams[re.sub(r"_(count|sum|bucket|total)$", "", name)] if name not in fams else fams[name]
    return sum(
        s.value
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def by_name(built) -> dict:
    return {f.name: f for f in built}


def _world(tmp_path, monkeypatch, gpus=2, domain_cap=None, project_cap=None):
    engine, factory = fresh_db(f"sqlite:///{tmp_path / 'lf.sqlite'}", tmp_path, monkeypatch)
    with database.session_scope(factory) as db:
        ensure_default_keypair_policy(db)
        nodes.ensure_default_group(db)
        directory.create_domain(db, CLI, {"name": "acme", "total_resource_slots": domain_cap or {}})
        directory.create_project(
            db, CLI, {"domain": "acme", "name": "ml", "total_resource_slots": project_cap or {}}
        )
        directory.create_project(db, CLI, {"domain": "acme", "name": "viz"})
        directory.create_user(db, CLI, {"username": "alice", "domain": "acme", "projects": ["ml"]})
        devs = MockPlugin(
            devices=[{"model": "A100-80GB", "memory": "80g", "count": gpus}], node="n1"
        ).discover()
        nodes.register_node(
            db, NodeInfo(name="n1", cpu=64, mem=512 * GiB, devices=devs, plugin="mock", reason=None)
        )
    return engine, factory


def _admit(factory, **slots):
    with database.session_scope(factory) as db:
        s = sessions.admit(db, CLI, {"project": "acme/ml", "username": "alice", "slots": slots})
        return s.id, s.status


def _scrape(factory) -> dict:
    with factory() as db:
        return by_name(metrics.fleet_families(metrics.read_fleet(db)))


# ---------------------------------------------------------------- unit: builders on a real DB


def test_an_empty_fleet_shows_zeros_not_nothing(tmp_path, monkeypatch):
    engine, factory = _world(tmp_path, monkeypatch)
    fams = _scrape(factory)
    assert set(fams) == set(metrics.GAUGES) | set(metrics.COUNTERS)
    assert fams["labfleet_serving_requests"].samples == []  # no endpoint: no series
    # Every live status of every session type of the group, at 0: series never vanish at 0.
    live = [(s.labels["status"], s.labels["type"]) for s in fams["labfleet_sessions"].samples]
    assert sorted(live) == sorted((st, t) for st in vocab.LIVE_STATUSES for t in vocab.SESSION_TYPES)
    assert all(s.value == 0 for s in fams["labfleet_sessions"].samples)
    assert value(fams, "labfleet_queue_length", resource_group="default") == 0
    assert value(fams, "labfleet_nodes", resource_group="default", status="ALIVE") == 1
    cap = {s.labels["slot"]: s.value for s in fams["labfleet_node_capacity"].samples}
    assert cap == {"cpu": 64.0, "mem": float(512 * GiB), "gpu": 2.0, "gpu.shares": 2.0}
    assert all(s.value == 0 for s in fams["labfleet_node_allocated"].samples)
    # No caps: nothing used, no limits.
    assert fams["labfleet_domain_quota_limit"].samples == []
    assert fams["labfleet_project_quota_used"].samples == []
    engine.dispose()


def test_sessions_allocation_and_quota_follow_admissions(tmp_path, monkeypatch):
    engine, factory = _world(
        tmp_path,
        monkeypatch,
        domain_cap={"cpu": 100, "gpu.shares": 4},
        project_cap={"gpu.shares": 2.5},
    )
    half, st_half = _admit(factory, **{"gpu.shares": 0.5, "cpu": 2, "mem": "4g"})
    whole, st_whole = _admit(factory, gpu=1, cpu=1)
    waiting, st_waiting = _admit(factory, gpu=1, cpu=1)  # 0.5 and 1 of 2 devices held: it queues
    assert (st_half, st_whole, st_waiting) == ("SCHEDULED", "SCHEDULED", "PENDING")
    fams = _scrape(factory)
    g = {"resource_group": "default"}
    assert value(fams, "labfleet_sessions", status="SCHEDULED", type="interactive", **g) == 2
    assert value(fams, "labfleet_sessions", status="PENDING", type="interactive", **g) == 1
    assert value(fams, "labfleet_sessions", status="RUNNING", type="batch", **g) == 0
    assert value(fams, "labfleet_queue_length", **g) == 1
    n1 = {"node": "n1", **g}
    assert value(fams, "labfleet_node_allocated", slot="cpu", **n1) == 3
    assert value(fams, "labfleet_node_allocated", slot="gpu.shares", **n1) == 1.5
    assert value(fams, "labfleet_node_allocated", slot="gpu", **n1) == 2  # devices with any share held
    assert value(fams, "labfleet_node_allocated", slot="mem", **n1) >= 4 * GiB
    for slot in vocab.SLOT_NAMES:  # one node: the group's sums are the node's
        assert value(fams, "labfleet_resource_group_allocated", slot=slot, **g) == value(
            fams, "labfleet_node_allocated", slot=slot, **n1
        )
        assert value(fams, "labfleet_resource_group_capacity", slot=slot, **g) == value(
            fams, "labfleet_node_capacity", slot=slot, **n1
        )
    # Quotas as admission counts them: the queued session too, whole devices as shares.
    ml = {"domain": "acme", "project": "ml"}
    assert value(fams, "labfleet_project_quota_used", slot="gpu.shares", **ml) == 2.5
    assert value(fams, "labfleet_project_quota_used", slot="gpu", **ml) == 2
    assert value(fams, "labfleet_project_quota_limit", slot="gpu.shares", **ml) == 2.5
    assert [s.labels["slot"] for s in fams["labfleet_project_quota_limit"].samples] == ["gpu.shares"]
    assert value(fams, "labfleet_domain_quota_used", domain="acme", slot="cpu") == 4
    assert value(fams, "labfleet_domain_quota_limit", domain="acme", slot="cpu") == 100
    assert value(fams, "labfleet_domain_quota_limit", domain="acme", slot="gpu.shares") == 4
    # An uncapped project with nothing held shows nothing.
    assert not [s for s in fams["labfleet_project_quota_used"].samples if s.labels["project"] == "viz"]

    # Stopping the whole-GPU session frees a device: the queued one is placed in the same unit of
    # work, which records how long it waited for whoever commits it (the service's histogram).
    with database.session_scope(factory) as db:
        sessions.terminate(db, CLI, whole)
        unit = db
    waits = sessions.take_queue_waits(unit)
    assert [g for g, _ in waits] == ["default"] and 0 <= waits[0][1] < 60
    assert sessions.take_queue_waits(unit) == []  # taken once
    fams = _scrape(factory)
    assert value(fams, "labfleet_queue_length", **g) == 0
    assert value(fams, "labfleet_sessions", status="SCHEDULED", type="interactive", **g) == 2
    assert value(fams, "labfleet_node_allocated", slot="gpu.shares", **n1) == 1.5
    assert value(fams, "labfleet_project_quota_used", slot="gpu.shares", **ml) == 1.5
    engine.dispose()


def test_a_scrape_is_nine_statements_whatever_the_fleet(tmp_path, monkeypatch):
    engine, factory = _world(tmp_path, monkeypatch)
    _admit(factory, **{"gpu.shares": 0.5})
    counted = []
    # Every statement but SQLite's BEGIN IMMEDIATE (labfleet.core.database: each transaction takes it).
    event.listen(
        engine,
        "before_cursor_execute",
        lambda conn, cursor, statement, *a: (
            counted.append(statement) if not statement.startswith("BEGIN") else None
        ),
    )
    m = metrics.Metrics(factory)
    m.exposition()
    small = len(counted)
    with database.session_scope(factory) as db:
        nodes.create_group(db, CLI, {"name": "cpu-only", "is_public": True})
        for i in range(20):
            nodes.register_node(
                db,
                NodeInfo(name=f"c{i}", cpu=8, mem=32 * GiB, devices=[], plugin="mock", reason=None),
                "cpu-only",
            )
        for d in range(5):
            directory.create_domain(db, CLI, {"name": f"d{d}", "total_resource_slots": {"cpu": 10}})
            directory.create_project(
                db, CLI, {"domain": f"d{d}", "name": "p", "total_resource_slots": {"cpu": 5}}
            )
    counted.clear()
    fams = families(m.exposition().decode())
    assert len(counted) == small == 9
    assert value(fams, "labfleet_resource_group_capacity", resource_group="cpu-only", slot="cpu") == 160
    assert value(fams, "labfleet_project_quota_limit", domain="d3", project="p", slot="cpu") == 5
    engine.dispose()


# ---------------------------------------------------------------- unit: pure builders, histograms, token


def test_builders_take_plain_rows():
    groups = {1: "a100", 2: "cpu"}
    built = by_name(
        metrics.session_families(groups, [("PENDING", "batch", 1, 3), ("RUNNING", "batch", 1, 2)], ["batch"])
    )
    assert value(built, "labfleet_queue_length", resource_group="a100") == 3
    assert value(built, "labfleet_sessions", status="RUNNING", type="batch", resource_group="cpu") == 0
    rows = [
        NodeRow(10, "g1", 1, "ALIVE", "16.5", 64 * GiB, 4),
        NodeRow(11, "g2", 1, "LOST", "16", 64 * GiB, 4),
    ]
    built = by_name(metrics.capacity_families(groups, rows, {10: Held(1500, GiB, 125, 2)}))
    assert value(built, "labfleet_node_allocated", node="g1", resource_group="a100", slot="cpu") == 1.5
    assert (
        value(built, "labfleet_node_allocated", node="g1", resource_group="a100", slot="gpu.shares") == 1.25
    )
    assert value(built, "labfleet_resource_group_capacity", resource_group="a100", slot="cpu") == 32.5
    assert value(built, "labfleet_resource_group_capacity", resource_group="cpu", slot="gpu") == 0
    assert value(built, "labfleet_nodes", resource_group="a100", status="LOST") == 1
    # A stored cap that does not parse shows as no cap; the scrape goes on.
    built = by_name(
        metrics.quota_families(
            [Tenant(1, "acme", "acme", {"cpu": "lots"})],
            [Tenant(2, "acme", "ml", {"gpu:A100": 2})],
            {("project", 2): {"gpu:A100": 1, "gpu:*": 1, "@sessions": 1}},
        )
    )
    assert built["labfleet_domain_quota_limit"].samples == []
    assert value(built, "labfleet_project_quota_used", domain="acme", project="ml", slot="gpu:A100") == 1
    assert value(built, "labfleet_project_quota_limit", domain="acme", project="ml", slot="gpu:A100") == 2


def test_histograms_live_in_a_private_registry(tmp_path, monkeypatch):
    engine, factory = _world(tmp_path, monkeypatch)
    m = metrics.Metrics(factory)
    with m.timing_admission() as timed:
        timed["outcome"] = "scheduled"
    with m.timing_admission():
        pass  # no outcome: refused
    with pytest.raises(RuntimeError), m.timing_admission():
        raise RuntimeError("boom")
    m.observe_queue_waits([("default", 12.0), ("default", 700.0)])
    m.observe_gpu_overuse("kill", "a100")
    m.observe_gpu_overuse("stop", "a100")
    for seconds in (0.0008, 0.003, 0.003, 2.0):
        m.observe_serving("echo", seconds)
    fams = families(m.exposition().decode())
    for f in fams.values():
        assert f.documentation and f.type != "unknown", f.name
    seconds = "labfleet_admission_duration_seconds_count"
    assert value(fams, seconds, outcome="scheduled") == 1
    assert value(fams, seconds, outcome="refused") == 2
    assert value(fams, seconds, outcome="queued") == 0
    assert value(fams, "labfleet_queue_wait_seconds_count", resource_group="default") == 2
    assert value(fams, "labfleet_gpu_overuse_total", action="kill", resource_group="a100") == 1
    assert value(fams, "labfleet_sessions_reclaimed_total", reason="gpu-overuse") == 1  # the stop
    assert value(fams, "labfleet_queue_wait_seconds_bucket", resource_group="default", le="600.0") == 1
    assert value(fams, "labfleet_queue_wait_seconds_sum", resource_group="default") == 712
    served = "labfleet_serving_request_duration_seconds"
    assert value(fams, f"{served}_count", endpoint="echo") == 4
    assert value(fams, f"{served}_bucket", endpoint="echo", le="0.001") == 1
    assert value(fams, f"{served}_bucket", endpoint="echo", le="0.005") == 3
    assert value(fams, f"{served}_sum", endpoint="echo") == pytest.approx(2.0068)
    # Not the process-wide registry: two services (or tests) never clash.
    assert (
        REGISTRY.get_sample_value("labfleet_admission_duration_seconds_count", {"outcome": "scheduled"})
        is None
    )
    metrics.Metrics(factory)
    engine.dispose()


@pytest.mark.parametrize(
    "header, ok",
    [
        ("Bearer s3cret-token", True),
        ("bearer   s3cret-token ", True),
        ("Bearer s3cret-tokeN", False),
        ("Bearer s3cret", False),
        ("token s3cret-token", False),
        ("Bearer sécret", False),
        ("", False),
    ],
)
def test_bearer_token_check(header, ok):
    assert bearer_matches(header, "s3cret-token") is ok
    assert bearer_matches(header, "") is False  # no token configured: nobody gets in with one


# ---------------------------------------------------------------- the Grafana dashboard


def dashboard_metric_names(dashboard: dict) -> set[str]:
    """Every ``labfleet_*`` metric name the dashboard's queries (and template variables) use."""
    exprs = []

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("expr", "definition") and isinstance(v, str):
                    exprs.append(v)
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(dashboard)
    assert exprs, "no queries found"
    return {name for e in exprs for name in re.findall(r"\blabfleet_[a-zA-Z0-9_:]+", e)}


def unknown_metrics(names: set[str], fams: dict) -> list[str]:
    """The names that are no series of ``fams``: a histogram's ``_bucket``, ``_sum`` and ``_count``
    count as its series, a counter's ``_total`` as its series, any other name must be a family itself."""
    bad = []
    for name in sorted(names):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if name in fams and fams[name].type not in ("histogram", "counter"):
            continue
        if base != name and base in fams and fams[base].type == "histogram":
            continue
        if name.endswith("_total") and fams.get(name[: -len("_total")]) is not None:
            if fams[name[: -len("_total")]].type == "counter":
                continue
        bad.append(name)
    return bad


def test_the_dashboard_checker_catches_a_wrong_name(tmp_path, monkeypatch):
    engine, factory = _world(tmp_path, monkeypatch)
    fams = families(metrics.Metrics(factory).exposition().decode())
    exprs = {"panels": [{"targets": [{"expr": "labfleet_sessions_bucket + labfleet_nope"}]}]}
    names = dashboard_metric_names(exprs)
    assert unknown_metrics(names, fams) == ["labfleet_nope", "labfleet_sessions_bucket"]
    # A histogram is used through its series, not by its bare name; a counter through its _total.
    assert unknown_metrics({"labfleet_admission_duration_seconds"}, fams) == [
        "labfleet_admission_duration_seconds"
    ]
    assert unknown_metrics({"labfleet_serving_requests_total", "labfleet_sessions_total"}, fams) == [
        "labfleet_sessions_total"
    ]
    assert unknown_metrics({"labfleet_serving_requests"}, fams) == ["labfleet_serving_requests"]
    engine.dispose()


def test_the_dashboard_has_the_panels_the_readme_promises():
    dashboard = json.loads(DASHBOARD.read_text())
    titles = " | ".join(p["title"] for p in dashboard["panels"])
    for wanted in (
        "Sessions by status",
        "allocated vs capacity",
        "Queue length",
        "Admission latency",
        "quota used vs limit",
        "Serving: requests and errors",
        "Serving: latency through the router",
    ):
        assert wanted in titles, wanted
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert any(
        "histogram_quantile(0.99" in e and "labfleet_admission_duration_seconds_bucket" in e for e in exprs
    )


# ---------------------------------------------------------------- real Hub

METRICS_TOKEN = "prometheus-test-token-0123456789"
PW = "monitor-password-1"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    state = tmp_path_factory.mktemp("hub")
    # Bare admissions below have no Hub server: reconciling must not take them back mid-module.
    (state / "labfleet_service_config.py").write_text("c.LabfleetService.reconcile_grace = 3600\n")
    h = start_hub(state, env={"LABFLEET_METRICS_TOKEN": METRICS_TOKEN, "LABFLEET_SERVING_INTERVAL": "1"})
    try:
        root = h.wait_token("root")
        for path, body in [
            ("/domains", {"name": "acme", "total_resource_slots": {"gpu.shares": 4}}),
            ("/projects", {"domain": "acme", "name": "ml", "total_resource_slots": {"gpu.shares": 2.5}}),
            ("/users", {"username": "alice", "domain": "acme", "projects": ["ml"]}),
            ("/users", {"username": "carol", "domain": "acme", "role": "admin"}),
            ("/users", {"username": "mona", "domain": "acme", "role": "monitor", "password": PW}),
            ("/domains", {"name": "other"}),
            ("/users", {"username": "eve", "domain": "other"}),
        ]:
            r = h.api("POST", path, root, json=body)
            assert r.status_code == 201, r.text
        h.tokens = {"root": root, **{u: h.wait_token(u) for u in ("alice", "carol", "mona", "eve")}}
        yield h
    finally:
        h.stop()


def scrape(hub, token=None, header=None, session=None):
    headers = {"Authorization": header or f"token {token}"} if (token or header) else {}
    return (session or requests).get(f"{hub.url}/services/labfleet/metrics", headers=headers, timeout=30)


def scraped(hub) -> dict:
    r = scrape(hub, header=f"Bearer {METRICS_TOKEN}")
    assert r.status_code == 200, r.text
    return families(r.text)


def _admit_hub(hub, **slots):
    """Admission as the Hub's spawner asks for it: the service token, on behalf of alice."""
    return hub.api(
        "POST", "/sessions", hub.service_token, json={"username": "alice", "project": "ml", "slots": slots}
    )


@pytest.mark.hub
def test_who_may_read_the_metrics(hub):
    for who in ("mona", "root"):
        r = scrape(hub, hub.tokens[who])
        assert r.status_code == 200, (who, r.text)
        assert r.headers["Content-Type"].startswith("text/plain") and "version=" in r.headers["Content-Type"]
    ok = scrape(hub, header=f"Bearer {METRICS_TOKEN}")
    assert ok.status_code == 200 and "labfleet_sessions" in ok.text
    # A monitor's Hub token sent as a bearer token is a Hub token still.
    assert scrape(hub, header=f"Bearer {hub.tokens['mona']}").status_code == 200
    # A monitor's browser login (the service's OAuth cookie).
    browser = hub.login("mona", PW)
    assert browser.login_status == 302
    assert browser.get(f"{hub.url}/services/labfleet/", timeout=30).status_code == 200
    assert scrape(hub, session=browser).status_code == 200
    for r, status in [
        (scrape(hub), 401),
        (scrape(hub, header=f"Bearer {METRICS_TOKEN}x"), 401),
        (scrape(hub, header="Bearer "), 401),
        (scrape(hub, hub.tokens["alice"]), 403),
        (scrape(hub, hub.tokens["carol"]), 403),  # a domain admin: the metrics are fleet-wide
        (scrape(hub, hub.service_token), 403),  # the Hub itself
    ]:
        assert r.status_code == status, (status, r.text)
        assert r.headers["Content-Type"].startswith("application/json")
        assert r.json()["status"] == status and r.json()["message"]
    r = requests.post(
        f"{hub.url}/services/labfleet/metrics",
        headers={"Authorization": f"token {hub.tokens['root']}"},
        timeout=30,
    )
    assert r.status_code == 405 and r.headers["Allow"] == "GET"
    # The token never reaches the log.
    assert METRICS_TOKEN not in hub.log_text()


@pytest.mark.hub
def test_the_text_parses_and_every_family_has_help_and_type(hub):
    r = scrape(hub, hub.tokens["root"])
    fams = families(r.text)
    assert set(metrics.GAUGES) | set(metrics.HISTOGRAMS) <= set(fams)
    for f in fams.values():
        assert f.name.startswith("labfleet_"), f.name
        assert f.documentation, f"{f.name}: no HELP"
        assert f.type in ("gauge", "histogram", "counter"), f"{f.name}: TYPE {f.type}"
    for name in metrics.GAUGES:
        assert f"# HELP {name} " in r.text and f"# TYPE {name} gauge" in r.text
    # The embedded node: two mock 80 GB GPUs in the default group.
    g = {"resource_group": "default"}
    assert value(fams, "labfleet_resource_group_capacity", slot="gpu", **g) == 2


@pytest.mark.hub
def test_series_follow_admission_release_and_the_queue(hub):
    g = {"resource_group": "default"}
    before = scraped(hub)
    admitted_before = total(before, "labfleet_admission_duration_seconds_count")
    scheduled_before = value(before, "labfleet_sessions", status="SCHEDULED", type="interactive", **g)
    waits_before = total(before, "labfleet_queue_wait_seconds_count")

    half = _admit_hub(hub, **{"gpu.shares": 0.5, "cpu": 0.1})
    whole = _admit_hub(hub, gpu=1)
    waiting = _admit_hub(hub, gpu=1)
    over = _admit_hub(hub, **{"gpu.shares": 0.25})  # the project's 2.5 shares are all charged
    assert [r.status_code for r in (half, whole, waiting, over)] == [201, 201, 201, 409]
    assert waiting.json()["status"] == "PENDING"
    after = scraped(hub)
    assert (
        value(after, "labfleet_sessions", status="SCHEDULED", type="interactive", **g) == scheduled_before + 2
    )
    assert value(after, "labfleet_sessions", status="PENDING", type="interactive", **g) == 1
    assert value(after, "labfleet_queue_length", **g) == 1
    assert value(after, "labfleet_resource_group_allocated", slot="gpu.shares", **g) == 1.5
    assert value(after, "labfleet_resource_group_allocated", slot="gpu", **g) == 2
    node = half.json()["node"]
    assert value(after, "labfleet_node_allocated", node=node, slot="gpu.shares", **g) == 1.5
    ml = {"domain": "acme", "project": "ml"}
    assert value(after, "labfleet_project_quota_used", slot="gpu.shares", **ml) == 2.5
    assert value(after, "labfleet_project_quota_limit", slot="gpu.shares", **ml) == 2.5
    assert value(after, "labfleet_domain_quota_limit", domain="acme", slot="gpu.shares") == 4
    # The admission latency histogram counts every admission asked, by outcome.
    assert total(after, "labfleet_admission_duration_seconds_count") == admitted_before + 4
    assert value(after, "labfleet_admission_duration_seconds_count", outcome="queued") >= 1
    assert value(after, "labfleet_admission_duration_seconds_count", outcome="refused") >= 1
    assert total(after, "labfleet_admission_duration_seconds_sum") > 0

    # Stopping the whole-GPU session places the queued one (in the stop's own request): it waited.
    assert hub.api("DELETE", f"/sessions/{whole.json()['id']}", hub.tokens["root"]).status_code == 200
    assert (
        hub.api("GET", f"/sessions/{waiting.json()['id']}", hub.tokens["root"]).json()["status"]
        == "SCHEDULED"
    )
    later = scraped(hub)
    assert value(later, "labfleet_queue_length", **g) == 0
    assert total(later, "labfleet_queue_wait_seconds_count", **g) == waits_before + 1
    assert value(later, "labfleet_queue_wait_seconds_bucket", le="+Inf", **g) >= 1
    for r in (half, waiting):
        assert hub.api("DELETE", f"/sessions/{r.json()['id']}", hub.tokens["root"]).status_code == 200
    done = scraped(hub)
    assert value(done, "labfleet_resource_group_allocated", slot="gpu.shares", **g) == 0
    assert value(done, "labfleet_project_quota_used", slot="gpu.shares", **ml) == 0


@pytest.mark.hub
def test_every_dashboard_query_names_an_exposed_series(hub):
    names = dashboard_metric_names(json.loads(DASHBOARD.read_text()))
    assert {"labfleet_sessions", "labfleet_admission_duration_seconds_bucket"} <= names
    assert unknown_metrics(names, scraped(hub)) == []


def _serving(hub, who: str, endpoint: str) -> tuple[int, dict, dict]:
    """(all requests ``who`` sees, ``endpoint``'s row, per token id) of ``GET /api/usage``."""
    r = hub.api("GET", "/usage", hub.tokens[who])  # the last 30 days
    assert r.status_code == 200, r.text
    part = r.json()["serving"]
    rows = [e for e in part["endpoints"] if e["endpoint"] == endpoint]
    return part["requests"], (rows[0] if rows else {}), {t["token_id"]: t for t in part["tokens"]}


@pytest.mark.hub
def test_a_served_endpoint_moves_its_series_and_usage_by_its_calls(hub):
    """Last in the module: its replica runs no GPU, so the series above are not moved by it."""
    alice = hub.tokens["alice"]
    _folder(hub, alice, "metered-model", {"model-definition.yaml": DEFINITION, "server.py": SERVER})
    r = hub.api(
        "POST",
        "/endpoints",
        alice,
        json={
            "name": "metered",
            "project": "acme/ml",
            "model_folder": "metered-model",
            "replicas": 1,
            "slots": {"cpu": 1, "mem": "1g"},
        },
    )
    assert r.status_code == 201, r.text
    try:
        _wait(
            "a healthy replica",
            lambda: hub.api("GET", "/endpoints/metered", alice).json()["healthy_replicas"] == 1,
            hub=hub,
        )
        t = hub.api("POST", "/endpoints/metered/tokens", alice, json={"rate_limit": 0})
        assert t.status_code == 201, t.text
        token, token_id = t.json()["token"], t.json()["id"]
        url = "/services/labfleet/serve/metered/"
        ep = {"endpoint": "metered", "project": "ml", "domain": "acme"}
        before = scraped(hub)
        seen_before = {who: _serving(hub, who, "metered")[0] for who in ("alice", "carol", "eve", "root")}
        n = 5
        for _ in range(n):
            assert _call(hub, url, token).status_code == 200
        assert _call(hub, url, token[:-2] + "xx").status_code == 401  # not counted: no token of it
        # The histogram moves at once; the counters with the next tick.
        fams = _wait(
            "the counters",
            lambda: (f := scraped(hub)) and value(f, "labfleet_serving_requests_total", **ep) == n and f,
            timeout=30,
        )
        assert value(fams, "labfleet_serving_errors_total", **ep) == 0
        assert value(fams, "labfleet_serving_replicas_healthy", **ep) == 1
        assert value(fams, "labfleet_serving_replicas_wanted", **ep) == 1
        count = "labfleet_serving_request_duration_seconds_count"
        assert value(fams, count, endpoint="metered") == n
        assert (
            value(fams, "labfleet_serving_request_duration_seconds_bucket", endpoint="metered", le="+Inf")
            == n
        )
        assert value(before, "labfleet_serving_requests_total", **ep) == 0  # there from the start, at 0
        # GET /api/usage: alice (the owner) and carol (her domain's admin) see exactly these calls, per
        # token too; eve, of another domain, none of them.
        for who in ("alice", "carol", "root"):
            total_seen, row, tokens = _serving(hub, who, "metered")
            assert total_seen == seen_before[who] + n, who
            assert (row["requests"], row["errors"], row["user"], row["project"]) == (n, 0, "alice", "acme/ml")
            assert row["latency_ms_mean"] > 0 and tokens[token_id]["requests"] == n
        total_seen, row, tokens = _serving(hub, "eve", "metered")
        assert total_seen == seen_before["eve"] and row == {} and token_id not in tokens
        me = hub.api("GET", "/usage/me", alice).json()
        week = next(p for p in me["periods"] if p["key"] == "7d")["serving"]
        assert week["requests"] == n and [t["requests"] for t in week["tokens"]] == [n]
        assert me["daily"][-1]["serving"]["requests"] == n
        assert token not in hub.log_text()  # the endpoint's token never reaches the log
    finally:
        hub.api("DELETE", "/endpoints/metered", alice)
