"""The MPS supervisor against a stand-in control binary (tests/mps_control_standin.py): start,
restart after a crash with backoff, stop on exit, and the node's status and reason."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from labfleet.compute.devices.base import DeviceInfo, DevicePlugin
from labfleet.compute.devices.mps import MpsSupervisor, node_mps

STANDIN = Path(__file__).with_name("mps_control_standin.py")
GPU = DeviceInfo(uuid="GPU-1", index=0, model="H200", memory_bytes=2**30)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """The stand-in as an executable named like the real binary, first on PATH; its record file."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    binary = bindir / "nvidia-cuda-mps-control"
    binary.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN}" "$@"\n')
    binary.chmod(0o755)
    record = tmp_path / "record"
    monkeypatch.setenv("MPS_STANDIN_RECORD", str(record))
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    return binary, record


def _kill(pid: int) -> None:
    assert pid > 0  # never 0 or -1: those would signal whole process groups
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return
        time.sleep(0.02)


def test_start_restart_with_backoff_and_stop(standin, tmp_path):
    binary, record = standin
    clock = Clock()
    pipe, logs = tmp_path / "pipe", tmp_path / "log"
    status, sup = node_mps(
        "auto", [GPU], pipe_dir=str(pipe), log_dir=str(logs), base_delay=2.0, max_delay=60.0, clock=clock
    )
    assert sup is not None and status.state == "on" and status.pipe_dir == str(pipe)
    assert record.read_text().splitlines() == [f"-d pipe={pipe} log={logs}"]
    first = sup.pid()
    assert first is not None and sup.check().state == "on"

    _kill(first)  # the daemon dies
    dead = sup.check()
    assert dead.state == "failed" and "died" in (dead.reason or "") and "2 s" in (dead.reason or "")
    clock.now += 1.0
    assert sup.check().state == "failed"  # still inside its backoff: no restart yet
    assert record.read_text().count("-d") == 1
    clock.now += 1.5
    back = sup.check()
    assert back.state == "on" and sup.pid() not in (None, first)
    assert record.read_text().count("-d") == 2
    assert sup.check().state == "on"  # seen alive after its restart: the failures in a row reset

    # A start that fails backs off twice as long the next time.
    _kill(sup.pid() or 0)
    os.environ["MPS_STANDIN_FAIL"] = "1"
    try:
        assert "2 s" in (sup.check().reason or "")  # died: first failure in a row
        clock.now += 2.0
        failed = sup.check()
        assert (
            failed.state == "failed"
            and "exited 1" in (failed.reason or "")
            and "4 s" in (failed.reason or "")
        )
    finally:
        del os.environ["MPS_STANDIN_FAIL"]
    clock.now += 4.0
    assert sup.check().state == "on"

    pid = sup.pid()
    off = sup.stop()
    assert off.state == "off" and record.read_text().splitlines()[-1] == "quit"
    assert not (pipe / "nvidia-cuda-mps-control.pid").exists()
    assert pid is not None
    _kill(pid)  # reap-or-gone: the stand-in's quit already ended it


def test_node_status_and_reason(standin, tmp_path, monkeypatch):
    kw = {"pipe_dir": str(tmp_path / "p"), "log_dir": str(tmp_path / "l")}
    off, sup = node_mps("off", [GPU], **kw)
    assert (off.state, sup) == ("off", None) and "mps=off" in (off.reason or "")
    none, sup = node_mps("auto", [], **kw)
    assert (none.state, sup) == ("off", None) and "no NVIDIA GPU" in (none.reason or "")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    missing, sup = node_mps("on", [GPU], **kw)
    assert (missing.state, sup) == ("failed", None)
    assert missing.reason == "nvidia-cuda-mps-control is not on PATH"
    assert not (tmp_path / "record").exists()


def test_supervisor_without_binary_stays_failed(tmp_path):
    sup = MpsSupervisor(None, str(tmp_path / "p"), str(tmp_path / "l"))
    assert sup.start().state == "failed" and sup.check().state == "failed"


class FakeNvidia(DevicePlugin):
    """The nvidia plugin as a GPU node sees it (no GPU here)."""

    name = "nvidia"

    def discover(self) -> list[DeviceInfo]:
        return [GPU]


def test_the_service_runs_its_own_nodes_daemon_and_stores_its_state(standin, tmp_path, monkeypatch):
    from labfleet.compute import nodes
    from labfleet.core import database
    from labfleet.core.models import Node
    from labfleet.service import app as service_app
    from tests.dbfixture import fresh_db

    engine, factory = fresh_db(f"sqlite:///{tmp_path / 'lf.sqlite'}", tmp_path, monkeypatch)
    monkeypatch.setattr(service_app, "get_plugin", lambda name, **_: FakeNvidia())
    pipe = tmp_path / "pipe"
    svc = service_app.LabfleetService(
        node_name="gpu1",
        device_plugins=["nvidia"],
        mps="on",
        mps_pipe_dir=str(pipe),
        mps_log_dir=str(tmp_path / "log"),
    )
    svc.session_factory = factory
    svc.mps_supervisor = None

    def stored() -> dict:
        with database.session_scope(factory) as db:
            return nodes.mps_view(db.query(Node).filter_by(name="gpu1").one())

    try:
        svc.register_node()
        assert stored() == {"state": "on", "reason": None, "pipe_dir": str(pipe)}
        assert svc.mps_supervisor is not None
        _kill(svc.mps_supervisor.pid() or 0)
        assert asyncio.run(svc.check_mps()) == "failed"
        assert stored()["state"] == "failed" and "died" in stored()["reason"]
    finally:
        assert svc.mps_supervisor is not None
        svc.mps_supervisor.stop()
        engine.dispose()


def test_the_agent_reports_its_daemon_in_register_and_heartbeats(standin, tmp_path):
    from labfleet.agent.app import LabfleetAgent
    from labfleet.agent.commits import Commits

    _binary, record = standin
    pipe = tmp_path / "pipe"
    agent = LabfleetAgent(
        node_name="gpu2", mps="auto", mps_pipe_dir=str(pipe), mps_log_dir=str(tmp_path / "l")
    )
    agent.plugins, agent.targets, agent.gone, agent.reported = [FakeNvidia()], {}, {}, set()
    agent.gpu_procs, agent.kill_reports = {}, {}
    agent.commits = Commits(agent.docker_client, agent.log)
    agent.mps_supervisor = None
    sent: list[tuple[str, dict]] = []
    agent.call = lambda path, body: sent.append((path, body)) or {}  # type: ignore[method-assign]
    try:
        agent.register()
        assert sent[-1][0] == "/agent/register"
        assert sent[-1][1]["mps"] == {"state": "on", "reason": None, "pipe_dir": str(pipe)}
        assert agent.mps_supervisor is not None
        _kill(agent.mps_supervisor.pid() or 0)
        agent.beat()
        assert sent[-1][0] == "/agent/heartbeat" and sent[-1][1]["mps"]["state"] == "failed"
    finally:
        assert agent.mps_supervisor is not None
        assert agent.mps_supervisor.stop().state == "off"
