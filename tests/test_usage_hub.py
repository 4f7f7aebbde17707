"""Usage accounting through a real Hub: real local sessions (sandboxed with bubblewrap), the service's
sampler and accrual on a 1-second clock, ``GET /api/usage`` (JSON and CSV) and ``/api/usage/me``.

- a session holding half a mock GPU for N seconds accrues 0.5 x N share-seconds, a CPU-only one no
  GPU; the mock device's readings (by the session's pid, as NVML reports pids) become used GPU, and
  CPU is measured outside the session;
- who reads which rows (user, other user, domain admins of this and of another domain, monitor,
  superadmin, anonymous), in JSON and CSV;
- bad input answers 400 with a message; the per-session utilisation reaches /metrics.
"""

from __future__ import annotations

import csv
import io
import json
import time
from datetime import datetime

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text

from tests.hubfixture import start_hub

pytestmark = pytest.mark.hub
INTERVAL = 1.0
GiB = 2**30
USERS = [
    ("alice", "acme", ["ml"], "user"),
    ("bob", "acme", ["ml"], "user"),
    ("carol", "acme", [], "admin"),
    ("erin", "beta", ["web"], "user"),
    ("dave", "beta", [], "admin"),
    ("mona", "acme", [], "monitor"),
]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    state = tmp_path_factory.mktemp("usagehub")
    readings = state / "mock-gpu-usage.json"
    readings.write_text("{}")
    # Bare admissions (no Hub server) must keep their slots for the module's length.
    (state / "labfleet_service_config.py").write_text("c.LabfleetService.reconcile_grace = 3600\n")
    h = start_hub(
        state,
        env={"LABFLEET_SAMPLE_INTERVAL": str(INTERVAL), "LABFLEET_MOCK_GPU_USAGE": str(readings)},
        extra_config="c.LabfleetSpawnerMixin.queue_poll_interval = 0.3\n",
    )
    try:
        root = h.wait_token("root")
        for path, body in [
            ("/domains", {"name": "acme"}),
            ("/domains", {"name": "beta"}),
            ("/projects", {"domain": "acme", "name": "ml"}),
            ("/projects", {"domain": "beta", "name": "web"}),
        ]:
            r = h.api("POST", path, root, json=body)
            assert r.status_code == 201, r.text
        for name, domain, projects, role in USERS:
            r = h.api(
                "POST",
                "/users",
                root,
                json={"username": name, "domain": domain, "projects": projects, "role": role},
            )
            assert r.status_code == 201, r.text
        h.tokens = {"root": root, **{name: h.wait_token(name) for name, *_ in USERS}}
        h.readings = readings
        yield h
    finally:
        for server in ("half", "cpuonly"):
            h.hub_api("DELETE", f"/users/alice/servers/{server}")
        h.stop()


def _spawn_ready(hub, user, server, options, timeout=60):
    r = hub.hub_api("POST", f"/users/{user}/servers/{server}", json=options)
    assert r.status_code in (201, 202), r.text
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        model = hub.hub_api("GET", f"/users/{user}").json()["servers"].get(server)
        if model and model.get("ready"):
            return
        time.sleep(0.3)
    sessions = hub.api("GET", "/sessions", hub.tokens["root"], params={"user": user}).json()
    mine = [(x["status"], x["status_reason"]) for x in sessions if x["name"] == server]
    raise AssertionError(f"{server} never became ready: {mine}\n{hub.log_text()[-3000:]}")


def _stop(hub, user, server, timeout=30):
    assert hub.hub_api("DELETE", f"/users/{user}/servers/{server}").status_code in (202, 204)
    deadline = time.monotonic() + timeout
    while hub.hub_api("GET", f"/users/{user}").json()["servers"].get(server):
        assert time.monotonic() < deadline, f"{server} did not stop"
        time.sleep(0.3)


def _session(hub, user, server) -> dict:
    r = hub.api("GET", "/sessions", hub.tokens["root"], params={"user": user})
    assert r.status_code == 200, r.text
    found = [s for s in r.json() if s["name"] == server]
    return found[-1]


def _runtime(hub, sid) -> dict:
    """Where the spawner said the session runs (read from the service's DB, as the sampler does)."""
    engine = create_engine(hub.db_url)
    try:
        with engine.connect() as conn:
            value = conn.execute(text("SELECT runtime FROM sessions WHERE id = :id"), {"id": sid}).scalar()
    finally:
        engine.dispose()
    return json.loads(value) if isinstance(value, str) else value


def _held_seconds(session: dict) -> float:
    times = {h["status"]: datetime.fromisoformat(h["at"]) for h in session["status_history"]}
    return (times["TERMINATED"] - times["SCHEDULED"]).total_seconds()


def _usage(hub, token, **params):
    return hub.api("GET", "/usage", token, params=params)


def _session_row(hub, sid) -> dict | None:
    rows = _usage(hub, hub.tokens["root"], group_by="session").json()["rows"]
    return next((r for r in rows if r["session"] == sid), None)


@pytest.fixture(scope="module")
def ran(hub):
    """alice held half a GPU (its device busy at 60 % by her processes) and, beside it, a CPU-only
    session, for a few seconds each; both stopped, and their accounting finished."""
    _spawn_ready(hub, "alice", "half", {"project": "ml", "gpu": 0.5, "cpu": 1, "mem": "1g"})
    _spawn_ready(hub, "alice", "cpuonly", {"project": "ml", "cpu": 0.5, "mem": "1g"})
    half, cpu_only = _session(hub, "alice", "half"), _session(hub, "alice", "cpuonly")
    (device,) = half["devices"]
    pid = _runtime(hub, half["id"])["pid"]
    assert _runtime(hub, cpu_only["id"])["pid"] > 0
    # What NVML would say: one of alice's processes (by its pid on the node) keeps the device 60 % busy.
    hub.readings.write_text(
        json.dumps(
            {
                device["uuid"]: {
                    "gpu_util": 60,
                    "mem_used": 3 * GiB,
                    "processes": [{"pid": pid, "gpu_util": 60, "mem_used": 3 * GiB}],
                }
            }
        )
    )
    time.sleep(6)
    metrics_text = requests.get(
        f"{hub.url}/services/labfleet/metrics",
        headers={"Authorization": f"token {hub.tokens['root']}"},
        timeout=30,
    ).text
    _stop(hub, "alice", "half")
    _stop(hub, "alice", "cpuonly")
    hub.readings.write_text("{}")
    half, cpu_only = _session(hub, "alice", "half"), _session(hub, "alice", "cpuonly")
    expected = 0.5 * _held_seconds(half)
    deadline = time.monotonic() + 20
    while True:  # until the job saw the end (before that, the live tail reaches now)
        row = _session_row(hub, half["id"])
        if row and abs(row["allocated"]["gpu.shares"] - expected) <= 0.5 * INTERVAL:
            time.sleep(2 * INTERVAL)  # and stays there: a finished session accrues nothing more
            break
        assert time.monotonic() < deadline, (row, expected, hub.log_text()[-3000:])
        time.sleep(0.5)
    return {"half": half, "cpu_only": cpu_only, "metrics": metrics_text, "device": device}


def test_half_a_gpu_for_n_seconds_accrues_half_n_share_seconds(hub, ran):
    half = ran["half"]
    row = _session_row(hub, half["id"])
    held = _held_seconds(half)
    assert held > 5
    assert row["allocated"]["gpu.shares"] == pytest.approx(0.5 * held, abs=0.5 * INTERVAL)
    assert row["allocated"]["cpu"] == pytest.approx(1.0 * held, abs=INTERVAL)
    assert row["allocated"]["mem"] == pytest.approx(GiB * held, rel=0.05)
    # Measured from outside: the JupyterLab server's start burns CPU and holds memory.
    assert row["used"]["cpu"] > 0.2 and row["used"]["mem_peak"] > 20 * 2**20
    # The device was 60 % busy with her process for most of the time she held it: at least the
    # 6 s the test waited, less one reading, and never more than 60 % of the whole hold.
    assert 0.6 * (6 - 2 * INTERVAL) <= row["used"]["gpu.shares"] <= 0.6 * held + 0.6 * INTERVAL
    assert row["used"]["gpu_mem_peak"] == 3 * GiB
    assert row["efficiency"]["gpu.shares"] == pytest.approx(
        row["used"]["gpu.shares"] / row["allocated"]["gpu.shares"], rel=1e-3
    )


def test_a_cpu_only_session_accrues_no_gpu(hub, ran):
    row = _session_row(hub, ran["cpu_only"]["id"])
    assert row["allocated"]["gpu.shares"] == 0 and row["used"]["gpu.shares"] == 0
    assert row["efficiency"]["gpu.shares"] is None
    assert row["allocated"]["cpu"] == pytest.approx(0.5 * _held_seconds(ran["cpu_only"]), abs=INTERVAL)
    assert row["used"]["cpu"] > 0


def test_live_sessions_utilisation_reaches_the_metrics(ran):
    fams = {f.name: f for f in text_string_to_metric_families(ran["metrics"])}
    sid = ran["half"]["id"]

    def sample(name):
        (found,) = [s for s in fams[name].samples if s.labels.get("session") == sid]
        assert found.labels["user"] == "alice" and found.labels["project"] == "acme/ml"
        assert found.labels["domain"] == "acme"
        return found.value

    assert sample("labfleet_session_gpu_used_devices") == pytest.approx(0.6)
    assert sample("labfleet_session_gpu_memory_used_bytes") == 3 * GiB
    assert sample("labfleet_session_memory_used_bytes") > 20 * 2**20
    assert sample("labfleet_session_cpu_used_cores") >= 0


def _bare(hub, user, project, **slots):
    """A session admitted as the Hub's spawner asks (no server): it holds its slots all the same."""
    r = hub.api(
        "POST", "/sessions", hub.service_token, json={"username": user, "project": project, "slots": slots}
    )
    assert r.status_code in (200, 201), r.text
    return r.json()["id"]


VISIBLE = {
    "alice": {"alice"},
    "bob": {"bob"},
    "erin": {"erin"},
    "carol": {"alice", "bob"},  # domain admin of acme
    "dave": {"erin"},  # domain admin of beta
    "mona": {"alice", "bob", "erin"},
    "root": {"alice", "bob", "erin"},
}


def test_who_reads_which_rows_in_json_and_csv(hub, ran):
    held = [_bare(hub, "bob", "acme/ml", cpu=1), _bare(hub, "erin", "beta/web", cpu=1)]
    try:
        _who_reads_which_rows(hub)
    finally:  # the node's two cores go back for the tests after this one
        for sid in held:
            hub.api("DELETE", f"/sessions/{sid}", hub.tokens["root"])


def _who_reads_which_rows(hub):
    deadline = time.monotonic() + 10
    while {r["user"] for r in _usage(hub, hub.tokens["root"]).json()["rows"]} != VISIBLE["root"]:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    for who, expected in VISIBLE.items():
        r = _usage(hub, hub.tokens[who])
        assert r.status_code == 200, (who, r.text)
        assert {row["user"] for row in r.json()["rows"]} == expected, who
        r = _usage(hub, hub.tokens[who], format="csv", group_by="domain")
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/csv"), (who, r.text)
        table = list(csv.DictReader(io.StringIO(r.text)))
        domains = {d for name, d, *_ in USERS if name in expected}
        assert {row["domain"] for row in table} == domains, who
        assert all(float(row["allocated_cpu"]) > 0 for row in table)
        by_session = _usage(hub, hub.tokens[who], group_by="session").json()["rows"]
        assert len(by_session) >= len(expected)
    assert _usage(hub, None).status_code == 401
    assert _usage(hub, None, format="csv").status_code == 401


def test_my_usage_for_the_sidebar(hub, ran):
    r = hub.api("GET", "/usage/me", hub.tokens["alice"])
    assert r.status_code == 200, r.text
    me = r.json()
    assert me["user"] == "alice" and [p["key"] for p in me["periods"]] == ["7d", "30d", "month"]
    week = me["periods"][0]
    assert week["sessions"] == 2 and week["allocated"]["gpu.shares"] == pytest.approx(
        0.5 * _held_seconds(ran["half"]), abs=0.5
    )
    assert (
        len(me["daily"]) == 30
        and me["daily"][-1]["allocated"]["gpu.shares"] == week["allocated"]["gpu.shares"]
    )
    # The Hub's own token has no usage of its own
    assert hub.api("GET", "/usage/me", hub.service_token).status_code == 404


@pytest.mark.parametrize(
    "params, message",
    [
        ({"group_by": "team"}, "group_by must be one of"),
        ({"start": "last tuesday"}, "start must be an ISO 8601 time"),
        ({"bucket": "fortnight"}, "bucket must be one of"),
        ({"start": "2024-01-01T00:00:00Z", "end": "2026-01-01T00:00:00Z"}, "at most 400 days"),
        ({"start": "2026-01-01T00:00:00Z", "end": "2026-06-01T00:00:00Z", "bucket": "15m"}, "more than 3000"),
        ({"format": "xlsx"}, "format must be one of json, csv"),
        ({"limit": "5"}, "unknown query argument"),
    ],
)
def test_bad_queries_answer_400_with_a_message(hub, params, message):
    for fmt in ("json", "csv"):
        r = _usage(hub, hub.tokens["alice"], **({"format": fmt} | params))
        assert r.status_code == 400, r.text
        assert message in r.json()["message"]


def test_over_its_gpu_share_a_session_is_stopped_with_the_reason(hub):
    """The GPU share backstop through the real service's usage tick: a group whose gpu_overuse is
    stop; a session whose process (by its pid, as NVML reports it) holds far more than its quarter of
    the device is stopped through the Hub after two samples, and its end says why."""
    root = hub.tokens["root"]
    before = hub.api("GET", "/resource-groups/default", root).json()
    for bad in ("nuke", None, ["stop"]):
        r = hub.api("PATCH", "/resource-groups/default", root, json={"gpu_overuse": bad, "description": "x"})
        assert (
            r.status_code == 400
            and "gpu_overuse must be one of auto, warn, kill, stop" in r.json()["message"]
        )
    assert (
        hub.api("GET", "/resource-groups/default", root).json() == before and before["gpu_overuse"] == "auto"
    )
    r = hub.api("PATCH", "/resource-groups/default", root, json={"gpu_overuse": "stop"})
    assert r.status_code == 200 and r.json()["gpu_overuse"] == "stop", r.text
    try:
        _spawn_ready(hub, "bob", "hog", {"project": "ml", "gpu": 0.25, "cpu": 0.5, "mem": "1g"})
        s = _session(hub, "bob", "hog")
        (device,) = s["devices"]
        pid = _runtime(hub, s["id"])["pid"]
        hub.readings.write_text(
            json.dumps({device["uuid"]: {"processes": [{"pid": pid, "mem_used": 40 * GiB}]}})
        )
        deadline = time.monotonic() + 30
        while (s := _session(hub, "bob", "hog"))["status"] != "TERMINATED":
            assert time.monotonic() < deadline, (s["status"], s["status_reason"], hub.log_text()[-3000:])
            time.sleep(0.3)
        assert s["status_reason"].startswith("gpu-overuse: ") and "stopped" in s["status_reason"]
        # The Hub's stop may still be under way (its DELETE answers 202): it ends within seconds.
        while hub.hub_api("GET", "/users/bob").json()["servers"].get("hog"):
            assert time.monotonic() < deadline + 15, "the Hub did not stop hog"
            time.sleep(0.3)
        r = hub.api("GET", "/audit", root, params={"action": "session.gpu-overuse", "limit": 100})
        (entry,) = [e for e in r.json() if e["target"] == s["id"]]
        assert entry["details"]["action"] == "stop" and entry["details"]["used_bytes"] == 40 * GiB
        assert entry["details"]["share_bytes"] == 20 * GiB
    finally:
        hub.readings.write_text("{}")
        hub.api("PATCH", "/resource-groups/default", root, json={"gpu_overuse": "auto"})
        hub.hub_api("DELETE", "/users/bob/servers/hog")
