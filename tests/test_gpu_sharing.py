"""On a real GPU (``pytest -m gpu``, as root): a fraction of a GPU holds on the node.

The node side, with labfleet's own parts and no mock: the node's MPS daemon as a node runs it
(``labfleet.compute.devices.mps.node_mps``, which the agent and the service call), the environment a
session gets (``labfleet.spawner.launch.gpu_env``), the trusted sampler over NVML
(``labfleet.usage.sampler.Sampler`` with ``NvidiaPlugin``) and the backstop's judgment and kill
(``labfleet.usage.overuse``, ``labfleet.usage.enforce.kill_process``). Each "session" is a process
tree with that environment running ``benchmarks/gpu_probe.py`` (PyTorch).

Deselected by default (``-m 'not gpu'`` in pyproject). On a machine with an NVIDIA GPU, PyTorch and
labfleet's dependencies: ``python -m pytest -m gpu tests/test_gpu_sharing.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import psutil
import pytest

from labfleet.compute.devices.mps import PID_FILE, node_mps
from labfleet.usage import enforce, overuse
from labfleet.usage.sampler import Sampler, Target

pytestmark = pytest.mark.gpu

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))
import gpu_sharing  # noqa: E402  (benchmarks/gpu_sharing.py: the sessions' environment and the probe)


@pytest.fixture(scope="module")
def gpu():
    return gpu_sharing.first_gpu()


@pytest.fixture(scope="module")
def mps(gpu, tmp_path_factory):
    """The node's MPS daemon, started as a node starts it; stopped after the module."""
    assert os.geteuid() == 0, "the node's MPS daemon is started as root (run this suite as root)"
    sup = gpu_sharing.start_mps(gpu, str(tmp_path_factory.mktemp("mps")))
    yield sup
    sup.stop()


def test_the_node_runs_mps_and_it_is_gone_once_stopped(gpu, tmp_path):
    status, sup = node_mps("auto", [gpu], pipe_dir=str(tmp_path / "pipe"), log_dir=str(tmp_path / "log"))
    assert sup is not None, f"auto found no MPS to run: {status}"
    assert status.state == "on" and status.pipe_dir == str(tmp_path / "pipe")
    pid = sup.pid()
    assert pid is not None and psutil.Process(pid).name().startswith("nvidia-cuda-mps")
    # A client reaches it: a session's process under the daemon computes.
    env = gpu_sharing.session_env(gpu, "0.5", sup.pipe_dir)
    assert gpu_sharing.probe(env, "alloc", 0.01)["allowed"] == {"0.01": True}
    assert sup.stop().state == "off"
    deadline = time.time() + 15
    while psutil.pid_exists(pid) and time.time() < deadline:
        time.sleep(0.2)
    assert not psutil.pid_exists(pid), "the MPS control daemon outlived its node's stop"
    assert not (tmp_path / "pipe" / PID_FILE).exists()


@pytest.mark.parametrize("with_mps", [True, False], ids=["mps", "caps-only"])
def test_a_quarter_session_is_refused_40_percent_and_given_18(gpu, with_mps, request):
    pipe = request.getfixturevalue("mps").pipe_dir if with_mps else None
    env = gpu_sharing.session_env(gpu, "0.25", pipe)
    got = gpu_sharing.probe(env, "alloc", 0.18, 0.40)
    assert got["allowed"] == {"0.18": True, "0.4": False}, got


def test_two_half_sessions_each_get_40_percent_of_the_card(gpu, mps):
    whole = gpu_sharing.rates_at_once([gpu_sharing.session_env(gpu, "1", None)], 6)[0]
    halves = gpu_sharing.rates_at_once([gpu_sharing.session_env(gpu, "0.5", mps.pipe_dir)] * 2, 6)
    assert all(r >= 0.4 * whole for r in halves), f"whole {whole} TFLOP/s, each half {halves}"


def _holding(reading, gpu, share: Decimal) -> overuse.Holding:
    (g,) = [x for x in reading.gpus if x.uuid == gpu.uuid]
    procs = tuple(overuse.Proc(p.pid, p.mem_bytes or 0, p.started) for p in g.processes)
    return overuse.Holding(
        reading.session_id, gpu.uuid, float(share), gpu.memory_bytes, "kill", True, g.mem_bytes, procs
    )


def test_a_second_process_past_the_share_is_killed_within_two_ticks(gpu):
    share = Decimal("0.25")
    env = gpu_sharing.session_env(gpu, str(share), None)
    probe = f"{sys.executable} {BENCH / 'gpu_probe.py'}"
    # One session: its first process holds 0.2 of the card, a second one 0.2 more (each under
    # PyTorch's per-process cap, together past the session's share).
    session = subprocess.Popen(
        ["sh", "-c", f"{probe} hold 0.2 300 & sleep 15; {probe} hold 0.2 300 & wait"],
        env=env,
        start_new_session=True,
    )
    sampler = Sampler([gpu_sharing.NvidiaPlugin()])
    watch = overuse.Watch()
    target = Target("s-gpu", pid=session.pid, devices=(gpu.uuid,))
    limit = overuse.allowance(float(share), gpu.memory_bytes).limit
    try:
        tick, over_tick, kill_tick, killed, after = 0, None, None, [], None
        deadline = time.time() + 120
        while time.time() < deadline and kill_tick is None:
            tick += 1
            (reading,) = sampler.sample([target])
            holding = _holding(reading, gpu, share)
            if over_tick is None and holding.used_bytes is not None and holding.used_bytes > limit:
                over_tick = tick
                assert len(holding.processes) == 2, holding
            for d in overuse.judge([holding], watch):
                killed += [enforce.kill_process(p) for p in d.victims]
                kill_tick = tick
            time.sleep(1)
        assert over_tick is not None, "the session never went past its share"
        assert kill_tick is not None and kill_tick - over_tick <= 1, (over_tick, kill_tick)
        assert [k.killed for k in killed] == [True], killed
        newest = max(holding.processes, key=lambda p: p.started or 0)
        assert killed[0].pid == newest.pid
        time.sleep(1)
        (after,) = sampler.sample([target])
        assert not psutil.pid_exists(newest.pid) or psutil.Process(newest.pid).status() == "zombie"
        assert session.poll() is None, "the session itself was stopped, not just the process past its share"
        assert _holding(after, gpu, share).used_bytes <= limit
    finally:
        os.killpg(session.pid, signal.SIGKILL)
        session.wait()
        sampler.close()
