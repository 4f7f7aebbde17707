"""The pure parts of the session's labfleet endpoints (labfleet.session.fleet) and the device plugins' process
readings that feed them."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pynvml
import pytest

from labfleet.compute.devices.base import plugin_for_device
from labfleet.compute.devices.mock import MockPlugin, mock_uuid
from labfleet.compute.devices.nvidia import NvidiaPlugin
from labfleet.session import fleet
from labfleet.session.runner import SessionEnv
from tests.unit.test_devices import FakeNVML, two_gpus

GiB = 2**30
NOW = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)
DEVICE = {"uuid": "GPU-x", "index": 0, "model": "A100-80GB", "memory": 80 * GiB, "shares": 0.5}


def env(**kw):
    base = dict(
        session_id="s1",
        type="interactive",
        command="",
        project="acme/ml",
        image="img",
        gpu_shares="0.5",
        run_dir=None,
        linger=0,
        inference_port="",
    )
    return SessionEnv(**{**base, **kw})


def test_session_summary_times_from_the_services_view():
    started = NOW - timedelta(hours=1)
    view = {
        "id": "s1",
        "user": "alice",
        "type": "interactive",
        "project": "acme/ml",
        "status": "RUNNING",
        "devices": [DEVICE],
        "started_at": started.isoformat(),
        "max_lifetime": 7200,
        "expires_at": (started + timedelta(seconds=7200)).isoformat(),
        "mounts": [{"vfolder": "f1", "name": "data", "permission": "ro", "source": "/srv/secret/path"}],
    }
    s = fleet.session_summary(env(), view, now=NOW, user="alice", server_name="w", base_url="/user/alice/w/")
    assert (s["uptime"], s["time_left"], s["max_lifetime"]) == (3600, 3600, 7200)
    assert s["urls"]["lab"] == "/user/alice/w/lab" and s["inference"] is None
    # The storage host's path stays in the service.
    assert s["mounts"] == [{"vfolder": "f1", "name": "data", "permission": "ro"}]


def test_session_summary_without_the_service_and_without_a_limit():
    s = fleet.session_summary(
        env(type="inference"),
        None,
        now=NOW,
        user="alice",
        server_name="",
        base_url="/user/alice/",
        service="the labfleet service answered: HTTP 502",
    )
    assert (s["id"], s["project"], s["time_left"], s["uptime"]) == ("s1", "acme/ml", None, None)
    assert s["inference"]["url"] == "/user/alice/labfleet/inference/" and s["service"].endswith("502")


def test_session_summary_tells_the_share_and_how_it_is_held_from_the_spawners_environment():
    from labfleet.spawner.launch import build_launch
    from labfleet.spawner.options import parse_options

    session = {"id": "s1", "project": "acme/ml", "devices": [dict(DEVICE, shares=0.25)]}
    options = parse_options({"project": "ml", "gpu": 0.25})
    kw = dict(now=NOW, user="alice", server_name="w", base_url="/user/alice/w/")
    for mps, held in ((False, "caps"), (True, "mps")):
        environ = build_launch(session, options, mps=mps).env
        s = fleet.session_summary(SessionEnv.from_environ(environ), None, **kw)
        assert s["gpu_share"] == {"shares": 0.25, "memory": 20 * GiB, "enforcement": held}
    # Whole devices (or none), and an odd number, tell no share / no bytes.
    whole = build_launch(dict(session, devices=[dict(DEVICE, shares=1)]), options).env
    assert fleet.session_summary(SessionEnv.from_environ(whole), None, **kw)["gpu_share"] is None
    odd = {"LABFLEET_GPU_SHARES": "0.5", "LABFLEET_GPU_ENFORCEMENT": "caps", "LABFLEET_GPU_MEMORY_LIMIT": "²"}
    assert fleet.session_summary(SessionEnv.from_environ(odd), None, **kw)["gpu_share"] == {
        "shares": 0.5,
        "memory": None,
        "enforcement": "caps",
    }


def test_gpu_rows_whole_shared_and_foreign_namespaces():
    reading = {"gpu_util": 90, "mem_used": 30 * GiB, "mem_total": 80 * GiB}
    procs = [
        {"pid": 10, "mem_used": 2 * GiB, "gpu_util": 20},
        {"pid": 11, "mem_used": GiB, "gpu_util": 5},
        {"pid": 99, "mem_used": 27 * GiB, "gpu_util": 65},
    ]
    readings = {"GPU-x": ("nvidia", reading, procs)}
    (shared,) = fleet.gpu_rows([DEVICE], readings, {10, 11})
    assert (shared["utilization"], shared["memory_used"], shared["scope"]) == (25, 3 * GiB, "session")
    assert shared["memory_limit"] == 40 * GiB
    (whole,) = fleet.gpu_rows([{**DEVICE, "shares": 1}], readings, {10})
    assert (whole["utilization"], whole["memory_used"], whole["memory_limit"]) == (90, 30 * GiB, 80 * GiB)
    (foreign,) = fleet.gpu_rows([DEVICE], readings, {10}, pids_comparable=False)
    assert (foreign["utilization"], foreign["scope"]) == (90, "device")
    # A process the driver does not sample: the session's utilization is unknown, its memory still counts.
    unsampled = {"GPU-x": ("nvidia", reading, [{"pid": 10, "mem_used": GiB, "gpu_util": None}])}
    (row,) = fleet.gpu_rows([DEVICE], unsampled, {10})
    assert (row["utilization"], row["memory_used"]) == (None, GiB)
    (none,) = fleet.gpu_rows([DEVICE], {}, {10})
    assert (none["scope"], none["utilization"]) == ("unknown", None)


def test_quota_and_sessions_views():
    me = {
        "domain": {"name": "acme"},
        "quota": {
            "domain": {"left": {}},
            "keypair": {"left": {}},
            "projects": {"acme/ml": {"left": {"gpu.shares": 1}}, "acme/web": {"left": {}}},
        },
    }
    q = fleet.quota_summary(me, "acme/ml")
    assert q["project"] == {"left": {"gpu.shares": 1}} and q["domain_name"] == "acme"
    assert fleet.quota_summary(me, "other/x")["project_name"] == "acme/ml"  # first project as a fallback
    views = [
        {"id": "a", "user": "alice", "name": "", "status": "RUNNING"},
        {"id": "b", "user": "alice", "name": "q", "status": "PENDING", "queue_position": 2},
        {"id": "c", "user": "alice", "name": "old", "status": "TERMINATED"},
        {"id": "d", "user": "bob", "name": "x", "status": "RUNNING"},
    ]
    rows = fleet.my_sessions(views, user="alice", current_id="a", hub_prefix="/")
    assert [(r["id"], r["current"], r["url"], r["queue_position"]) for r in rows] == [
        ("a", True, "/user/alice/lab", None),
        ("b", False, None, 2),
    ]


def test_mounted_folders_with_usage_and_paths():
    folders = {"f1": {"owner": "user:alice", "usage": {"bytes": 5, "files": 1}, "limits": {"max_size": 10}}}
    rows = fleet.mounted_folders([{"vfolder": "f1", "name": "data", "permission": "rw"}], folders, "vfolders")
    assert rows[0]["path"] == "vfolders/data" and rows[0]["usage_bytes"] == 5 and rows[0]["max_size"] == 10


class ProcessNVML(FakeNVML):
    def nvmlDeviceGetComputeRunningProcesses(self, h):
        self._live()
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in h.get("procs", [])]

    def nvmlDeviceGetProcessUtilization(self, h, since):
        self._live()
        if "samples" not in h:
            raise pynvml.NVMLError_NotFound()
        return [SimpleNamespace(pid=p, smUtil=u) for p, u in h["samples"]]


def test_nvidia_processes_with_and_without_samples():
    gpus = two_gpus()
    gpus[0]["procs"] = [(10, GiB), (11, None)]
    gpus[0]["samples"] = [(10, 30)]
    nvml = ProcessNVML(gpus)
    plugin = NvidiaPlugin(nvml=nvml)
    assert plugin.processes("GPU-aaaa") == [
        {"pid": 10, "mem_used": GiB, "gpu_util": 30},
        {"pid": 11, "mem_used": None, "gpu_util": 0},
    ]
    assert plugin.processes("MIG-1111") == []
    assert plugin.processes("GPU-nope") is None
    assert nvml.inits == nvml.shutdowns == 3


def test_mock_plugin_is_idle_unless_its_readings_say_otherwise(tmp_path, monkeypatch):
    plugin = MockPlugin([{"model": "A100-80GB", "memory": "80g", "count": 1}], node="n1")
    uuid = mock_uuid("n1", 0)
    assert plugin_for_device(uuid) == "mock" and plugin_for_device("GPU-1234") == "nvidia"
    monkeypatch.delenv("LABFLEET_MOCK_GPU_USAGE", raising=False)
    assert plugin.utilization(uuid) == {"gpu_util": 0, "mem_used": 0, "mem_total": 80 * GiB}
    assert plugin.processes(uuid) == []
    readings = tmp_path / "r.json"
    readings.write_text(
        json.dumps({uuid: {"gpu_util": 7, "processes": [{"pid": 3, "mem_used": 5}, {"x": 1}]}})
    )
    monkeypatch.setenv("LABFLEET_MOCK_GPU_USAGE", str(readings))
    assert plugin.utilization(uuid)["gpu_util"] == 7
    assert plugin.processes(uuid) == [{"pid": 3, "mem_used": 5, "gpu_util": None}]
    readings.write_text("not json")
    assert plugin.processes(uuid) == []  # a broken file reads as idle, with a warning
    assert plugin.utilization("GPU-real") is None


@pytest.mark.parametrize("bad", [{"gpu_util": True}, {"gpu_util": "12"}])
def test_mock_readings_of_the_wrong_type_are_ignored(tmp_path, monkeypatch, bad):
    plugin = MockPlugin([{"model": "T4", "memory": "16g"}], node="n1")
    uuid = mock_uuid("n1", 0)
    readings = tmp_path / "r.json"
    readings.write_text(json.dumps({uuid: bad}))
    monkeypatch.setenv("LABFLEET_MOCK_GPU_USAGE", str(readings))
    assert plugin.utilization(uuid)["gpu_util"] is None
