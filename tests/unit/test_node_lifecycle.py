"""The node lifecycle's pure judgment (labfleet.compute.agents.judge) and the agent's pure helpers."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from labfleet.agent.app import mock_devices_of, reading_json, target_of
from labfleet.compute.agents import NodeBeat, judge
from labfleet.core.errors import InvalidInput
from labfleet.usage.records import parse_agent_readings
from labfleet.usage.sampler import GpuProcess, GpuReading, Reading, Target

NOW = datetime(2026, 11, 24, 5, 0, tzinfo=timezone.utc)


def beat(name, ago, status="ALIVE", agent=True):
    return NodeBeat(name, status, None if ago is None else NOW - timedelta(seconds=ago), agent)


def test_an_agent_node_is_lost_after_missing_its_heartbeats():
    beats = [beat("fresh", 5), beat("edge", 30), beat("late", 30.5), beat("never", None)]
    assert judge(beats, NOW, heartbeat=10, lost_after=3) == ["late", "never"]
    assert judge(beats, NOW, heartbeat=1, lost_after=3) == ["fresh", "edge", "late", "never"]
    assert judge(beats, NOW, heartbeat=10, lost_after=6) == ["never"]


def test_only_alive_agent_nodes_are_judged():
    beats = [beat("service", 3600, agent=False), beat("lost", 3600, "LOST"), beat("off", 3600, "DISABLED")]
    assert judge(beats, NOW, heartbeat=10, lost_after=3) == []


def test_heartbeats_missed_before_the_service_started_do_not_count():
    beats = [beat("n2", 3600), beat("n3", None)]
    started = NOW - timedelta(seconds=20)
    assert judge(beats, NOW, heartbeat=10, lost_after=3, since=started) == []
    assert judge(beats, NOW + timedelta(seconds=11), heartbeat=10, lost_after=3, since=started) == [
        "n2",
        "n3",
    ]


@pytest.mark.parametrize("lost_after", [0, -1])
def test_lost_after_is_at_least_one_heartbeat(lost_after):
    assert judge([beat("n2", 11)], NOW, heartbeat=10, lost_after=lost_after) == ["n2"]
    assert judge([beat("n2", 9)], NOW, heartbeat=10, lost_after=lost_after) == []


def test_agent_mock_devices_option():
    assert mock_devices_of("2") == [{"model": "A100-80GB", "memory": "80g", "count": 2}]
    assert mock_devices_of("0") == mock_devices_of("") == []
    assert mock_devices_of('[{"model": "T4", "memory": "16g"}]') == [{"model": "T4", "memory": "16g"}]
    for bad in ("two", '{"model": "T4"}'):
        with pytest.raises(ValueError):
            mock_devices_of(bad)


def test_agent_wire_format_round_trips():
    r = Reading("s1", 1.5, True, 2.0, 100, (GpuReading("GPU-1", 50.0, 10),), "x" * 2000)
    out = reading_json(r)
    assert (
        out["gpus"] == [{"uuid": "GPU-1", "util_percent": 50.0, "mem_bytes": 10, "processes": ()}]
        and len(out["error"]) == 1000
    )
    # Each device's processes travel too (the GPU share backstop needs them), and come back whole.
    gpu = GpuReading("GPU-1", 50.0, 10, (GpuProcess(4242, 10, 1764200000.5), GpuProcess(7, None, None)))
    sent = Reading("s1", 1764200001.0, True, 2.0, 100, (gpu,))
    assert parse_agent_readings(json.loads(json.dumps([reading_json(sent)])), 1764200002.0) == [sent]
    # An older agent's reading (no processes) is still taken
    old = reading_json(Reading("s1", 1764200001.0, True, 2.0, 100, (GpuReading("GPU-1", 50.0, 10),)))
    del old["gpus"][0]["processes"]
    assert parse_agent_readings([old], 1764200002.0)[0].gpus[0].processes == ()
    bad = json.loads(json.dumps([reading_json(sent)]))
    bad[0]["gpus"][0]["processes"][0]["pid"] = "4242"
    with pytest.raises(InvalidInput, match=r"processes\[0\]\.pid must be a process id"):
        parse_agent_readings(bad, 1764200002.0)
    assert target_of({"session_id": "s1", "pid": 12, "container": None, "devices": ["GPU-1"]}) == Target(
        "s1", pid=12, devices=("GPU-1",)
    )
    assert target_of({"pid": 1}) is None and target_of("s1") is None
    assert target_of({"session_id": "s", "pid": True, "devices": [1, "u"]}) == Target("s", devices=("u",))
