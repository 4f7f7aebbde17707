"""The trusted usage sampler (hub_ext/usage/sampler.py) against real processes and a real Docker engine.

- a bubblewrap-sandboxed session (the local spawner's command line) burning CPU, measured through the
  sandbox's PID namespace; a plain process tree whose busy child counts, also once it is reaped;
- a container burning CPU, measured from the engine's stats, and its GPU process found by cgroup;
- the mock GPU plugin's readings file: each session's own processes on shared devices, the device's
  reading for its sole user, ``None`` when nobody can tell, the plugin asked once per device per tick;
- what is gone (a dead pid, an unknown or stopped container, no engine) reads alive=False, never raises.

Only GPUs are faked (the mock plugin). The docker tests start the engine and build the test image
themselves (scripts/docker.sh, scripts/build-image.sh): a missing engine is a failure, not a skip.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import psutil
import pytest

from labfleet.compute.devices.mock import USAGE_ENV, MockPlugin
from labfleet.spawner.sandbox import SandboxSpec, sandbox_command, system_layout
from labfleet.usage.sampler import GpuProcess, GpuReading, Reading, Sampler, Target, sample_interval
from tests.hubfixture import REPO

IMAGE = "labfleet/singleuser:test"
GIB = 2**30
BUSY = "while :; do :; done"
GAP = 2.0  # seconds between the two samples of a CPU test


# --- helpers --------------------------------------------------------------------------------------


@pytest.fixture
def spawn() -> Iterator[Callable[[list[str]], subprocess.Popen]]:
    """Start a process in its own process group (as JupyterHub starts a server); all killed at the end."""
    started: list[subprocess.Popen] = []

    def start(argv: list[str]) -> subprocess.Popen:
        p = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        started.append(p)
        return p

    yield start
    for p in started:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if p.stderr:
            p.stderr.close()


def wait_for(what: str, check: Callable[[], object], timeout: float = 15.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def busy_descendant(pid: int) -> psutil.Process | None:
    """A process below ``pid`` that is burning CPU (running, with some CPU time already)."""
    for c in descendants(pid):
        try:
            if c.status() == psutil.STATUS_RUNNING and sum(c.cpu_times()[:2]) > 0.05:
                return c
        except psutil.NoSuchProcess:
            continue
    return None


def one(sampler: Sampler, target: Target) -> Reading:
    readings = sampler.sample([target])
    assert len(readings) == 1 and readings[0].session_id == target.session_id
    return readings[0]


def cpu_of(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def assert_burns(
    sampler: Sampler, target: Target, busy_pid: int, attempts: int = 3
) -> tuple[Reading, Reading]:
    """Two readings GAP seconds apart: alive, memory > 0, the busy process's CPU time counted, and more
    than half a core burnt.  The machine may be shared (2 cores): a window where the loop got less than
    half a core is tried again, a few times at most."""
    seen = []
    for _ in range(attempts):
        own_before = cpu_of(busy_pid)
        first = one(sampler, target)
        time.sleep(GAP)
        second = one(sampler, target)
        own = cpu_of(busy_pid) - own_before
        for r in (first, second):
            assert r.alive, r
            assert r.error is None, r
            assert r.mem_bytes is not None and r.mem_bytes > 0, r
        assert first.cpu_seconds is not None and second.cpu_seconds is not None
        elapsed = second.at - first.at
        used = second.cpu_seconds - first.cpu_seconds
        assert elapsed >= GAP * 0.9
        # The busy process burnt `own` CPU seconds in a window a little wider than the sampler's.
        assert used >= own - 0.1, f"{used:.2f} CPU s counted, the busy process alone burnt {own:.2f}"
        if used > 0.5 * elapsed:
            return first, second
        seen.append(f"{used:.2f} CPU s in {elapsed:.2f} s (the loop itself: {own:.2f})")
    pytest.fail(f"the busy session never showed half a core: {seen}")


def write_usage(path, readings: dict) -> None:
    path.write_text(json.dumps(readings))


# --- local sessions -------------------------------------------------------------------------------


def test_sandboxed_session_cpu_and_memory(spawn, tmp_path):
    bwrap = shutil.which("bwrap")
    assert bwrap, "bubblewrap is not installed: run bash scripts/setup.sh"
    home = tmp_path / "home"
    home.mkdir()
    # The local spawner's command line: bwrap's arguments, then the session command for /bin/sh -c.
    root = spawn([*sandbox_command(bwrap, SandboxSpec(home=str(home), system=system_layout())), BUSY])
    busy = wait_for("the sandboxed loop to run", lambda: busy_descendant(root.pid))
    assert isinstance(busy, psutil.Process) and busy.pid != root.pid  # it runs below bwrap, in its namespace
    sampler = Sampler()
    assert_burns(sampler, Target("sandboxed", pid=root.pid), busy.pid)


def test_plain_tree_counts_a_busy_child_also_once_reaped(spawn):
    # The root shell only waits; its child burns. After the child is killed and reaped, its time
    # lives on in the root's children_* times: the cumulative figure must not drop.
    root = spawn(["sh", "-c", f"( {BUSY} ) & wait; sleep 60"])
    child = wait_for("the busy child", lambda: busy_descendant(root.pid))
    assert isinstance(child, psutil.Process)
    sampler = Sampler()
    target = Target("plain", pid=root.pid)
    _, second = assert_burns(sampler, target, child.pid)
    assert second.cpu_seconds is not None
    child.kill()
    # Reaped (no zombie left) and the root went on to its sleep.
    wait_for("the child to be reaped", lambda: [c.name() for c in descendants(root.pid)] == ["sleep"])
    third = one(sampler, target)
    assert third.alive and third.cpu_seconds is not None
    assert third.cpu_seconds >= second.cpu_seconds - 0.05, (second, third)


def test_a_dead_pid_reads_not_alive(spawn):
    p = spawn(["true"])
    p.wait(timeout=10)
    sampler = Sampler(plugins=[MockPlugin(devices=[{"model": "T4", "memory": "16g"}], node="n")])
    gone, nothing, alive = sampler.sample(
        [
            Target("gone", pid=p.pid, devices=("GPU-mock-x",)),
            Target("nothing"),
            Target("me", pid=os.getpid()),
        ]
    )
    assert not gone.alive and gone.cpu_seconds is None and gone.mem_bytes is None and gone.gpus == ()
    assert gone.error and str(p.pid) in gone.error
    assert not nothing.alive and nothing.error
    assert alive.alive and alive.cpu_seconds and alive.cpu_seconds > 0  # the order is kept


def test_an_exited_root_not_yet_reaped_is_gone(spawn):
    p = spawn(["true"])  # not waited for: a zombie until this test reaps it
    wait_for("the zombie", lambda: psutil.Process(p.pid).status() == psutil.STATUS_ZOMBIE)
    r = one(Sampler(), Target("z", pid=p.pid))
    assert not r.alive and r.error and "zombie" in r.error
    p.wait(timeout=10)


def test_a_reused_pid_is_not_the_session(spawn):
    # The sampler remembers when a session's root started: another process under that pid is not it.
    p = spawn(["sleep", "60"])
    sampler = Sampler()
    assert one(sampler, Target("s", pid=p.pid)).alive
    q = spawn(["sleep", "60"])
    # Same session id, same pid, another start time: what a reused pid looks like to the sampler.
    sampler._roots["s"] = (q.pid, psutil.Process(q.pid).create_time() - 100)
    r = one(sampler, Target("s", pid=q.pid))
    assert not r.alive and r.error and "another process" in r.error


def test_no_docker_engine_reads_not_alive_and_is_retried():
    calls = []

    def factory():
        calls.append(1)
        raise ConnectionError("no engine here")

    sampler = Sampler(docker_client=factory)
    for _ in range(2):
        a, b = sampler.sample([Target("a", container="abc"), Target("b", container="def")])
        for r in (a, b):
            assert not r.alive and r.error and "no engine here" in r.error
    assert len(calls) == 2  # once per tick, not once per container


def test_sample_interval_from_the_environment():
    assert sample_interval({}) == 15.0
    assert sample_interval({"LABFLEET_SAMPLE_INTERVAL": "30"}) == 30.0
    assert sample_interval({"LABFLEET_SAMPLE_INTERVAL": "soon"}) == 15.0
    assert sample_interval({"LABFLEET_SAMPLE_INTERVAL": "0"}) == 1.0


# --- GPUs through the mock plugin ------------------------------------------------------------------


class CountingMock(MockPlugin):
    """The mock plugin, counting how often it is asked."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.calls: list[tuple[str, str]] = []

    def processes(self, uuid):
        self.calls.append(("processes", uuid))
        return super().processes(uuid)

    def utilization(self, uuid):
        self.calls.append(("utilization", uuid))
        return super().utilization(uuid)


def test_mock_gpu_readings_flow_to_each_session(spawn, tmp_path, monkeypatch):
    plugin = CountingMock(devices=[{"model": "T4", "memory": "16g", "count": 4}], node="sampler-test")
    shared, solo, unknown, idle = (d.uuid for d in plugin.discover())
    a = spawn(["sh", "-c", "sleep 60 & wait"])
    b = spawn(["sh", "-c", "sleep 60 & wait"])
    a_child = wait_for("a's child", lambda: descendants(a.pid))[0].pid  # type: ignore[index]
    b_child = wait_for("b's child", lambda: descendants(b.pid))[0].pid  # type: ignore[index]
    outsider = os.getpid()  # this test process: in no session's tree
    usage = tmp_path / "usage.json"
    write_usage(
        usage,
        {
            # shared by a, b and an outsider, with per-process utilisation
            shared: {
                "gpu_util": 70,
                "mem_used": 4 * GIB,
                "processes": [
                    {"pid": a_child, "mem_used": 1 * GIB, "gpu_util": 30},
                    {"pid": b.pid, "mem_used": 2 * GIB, "gpu_util": 20},
                    {"pid": b_child, "mem_used": 1 * GIB, "gpu_util": 5},
                    {"pid": outsider, "mem_used": GIB // 2, "gpu_util": 10},
                ],
            },
            # only a's processes, and no per-process utilisation: the device's own reading is a's
            solo: {"gpu_util": 55, "mem_used": 3 * GIB, "processes": [{"pid": a.pid, "mem_used": 3 * GIB}]},
            # a and b, no per-process utilisation: nobody can tell whose the busy time is
            unknown: {
                "gpu_util": 90,
                "processes": [{"pid": a_child, "mem_used": GIB}, {"pid": b_child, "mem_used": 2 * GIB}],
            },
            # b holds it and runs nothing on it
            idle: {"gpu_util": 0, "processes": []},
        },
    )
    monkeypatch.setenv(USAGE_ENV, str(usage))
    sampler = Sampler(plugins=[plugin])
    ra, rb = sampler.sample(
        [
            Target("a", pid=a.pid, devices=(shared, solo, unknown)),
            Target("b", pid=b.pid, devices=(shared, unknown, idle, "GPU-00000000-nvidia-not-here")),
        ]
    )
    assert ra.alive and rb.alive
    assert [replace(g, processes=()) for g in ra.gpus] == [
        GpuReading(shared, 30.0, 1 * GIB),
        GpuReading(solo, 55.0, 3 * GIB),
        GpuReading(unknown, None, 1 * GIB),
    ]
    # Each device's reading names the session's own processes on it, with their start times
    started = {p: psutil.Process(p).create_time() for p in (a.pid, a_child, b.pid, b_child)}
    assert [g.processes for g in ra.gpus] == [
        (GpuProcess(a_child, 1 * GIB, started[a_child]),),
        (GpuProcess(a.pid, 3 * GIB, started[a.pid]),),
        (GpuProcess(a_child, GIB, started[a_child]),),
    ]
    assert rb.gpus[0].processes == (
        GpuProcess(b.pid, 2 * GIB, started[b.pid]),
        GpuProcess(b_child, 1 * GIB, started[b_child]),
    )
    assert ra.error is None
    assert [replace(g, processes=()) for g in rb.gpus] == [
        GpuReading(shared, 25.0, 3 * GIB),
        GpuReading(unknown, None, 2 * GIB),
        GpuReading(idle, 0.0, 0),
        GpuReading("GPU-00000000-nvidia-not-here", None, None),
    ]
    assert rb.error and "nvidia" in rb.error  # a device no plugin here answers for: said, not raised
    # One question per device per tick, whoever shares it; the device's own reading only where needed.
    asked = sorted(plugin.calls)
    assert asked == sorted(
        [("processes", shared), ("processes", solo), ("processes", unknown), ("processes", idle)]
        + [("utilization", solo)]
    ), asked


def test_a_device_of_a_dead_session_is_not_asked(spawn, tmp_path, monkeypatch):
    plugin = CountingMock(devices=[{"model": "T4", "memory": "16g"}], node="sampler-test")
    (uuid,) = (d.uuid for d in plugin.discover())
    p = spawn(["true"])
    p.wait(timeout=10)
    monkeypatch.setenv(USAGE_ENV, str(tmp_path / "missing.json"))
    (r,) = Sampler(plugins=[plugin]).sample([Target("gone", pid=p.pid, devices=(uuid,))])
    assert not r.alive and r.gpus == ()
    assert plugin.calls == []


# --- docker sessions --------------------------------------------------------------------------------


def _run_script(name: str, timeout: float) -> str:
    try:
        r = subprocess.run(
            ["bash", str(REPO / "scripts" / name)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"scripts/{name} did not finish in {timeout}s:\n{e.stdout}\n{e.stderr}")
    if r.returncode != 0:
        pytest.fail(f"scripts/{name} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout


@pytest.fixture(scope="module")
def engine():
    """A Docker engine that answers and the test image (built here if missing or stale)."""
    _run_script("docker.sh", 240)
    _run_script("build-image.sh", 900)
    import docker

    client = docker.from_env(version="auto", timeout=60)
    assert client.images.get(IMAGE)
    yield client
    client.close()


@pytest.fixture
def container(engine):
    """Start a container (host network, as sessions run here); removed at the end."""
    made = []

    def run(command: list[str]):
        c = engine.containers.run(
            IMAGE,
            command,
            name=f"lfsampler-{secrets.token_hex(4)}",
            detach=True,
            network_mode="host",
        )
        made.append(c)
        return c

    yield run
    for c in made:
        try:
            c.remove(force=True)
        except Exception as e:  # already gone
            print(f"removing {c.name}: {e}")


@pytest.mark.docker
def test_container_cpu_memory_and_gpu(container, tmp_path, monkeypatch):
    c = container(["sh", "-c", BUSY])
    c.reload()
    assert c.status == "running"
    main_pid = c.attrs["State"]["Pid"]
    assert main_pid > 0
    plugin = MockPlugin(devices=[{"model": "A100-80GB", "memory": "80g", "count": 2}], node="sampler-test")
    held, other = (d.uuid for d in plugin.discover())
    usage = tmp_path / "usage.json"
    write_usage(
        usage,
        {
            held: {
                "gpu_util": 60,
                "processes": [
                    {"pid": main_pid, "mem_used": 5 * GIB, "gpu_util": 42},
                    {"pid": os.getpid(), "mem_used": GIB, "gpu_util": 18},  # not the container's
                ],
            },
            other: {"gpu_util": 80, "processes": [{"pid": os.getpid(), "mem_used": GIB, "gpu_util": 80}]},
        },
    )
    monkeypatch.setenv(USAGE_ENV, str(usage))
    sampler = Sampler(plugins=[plugin])  # the default docker client factory, made on first use
    try:
        # By short name too: the engine's stats give the full id the cgroup paths name.
        target = Target("box", container=c.name, devices=(held, other))
        _, second = assert_burns(sampler, target, main_pid)
        assert [replace(g, processes=()) for g in second.gpus] == [
            GpuReading(held, 42.0, 5 * GIB),
            GpuReading(other, 0.0, 0),
        ]
        assert [p.pid for p in second.gpus[0].processes] == [main_pid]

        # Several containers in one tick (their stats calls side by side): each its own answer.
        box, unknown = sampler.sample([target, Target("nobox", container="lfsampler-no-such-container")])
        assert box.alive and box.session_id == "box" and box.cpu_seconds is not None
        assert box.cpu_seconds >= second.cpu_seconds
        assert not unknown.alive and unknown.error and "no such container" in unknown.error

        c.kill()
        c.wait(timeout=30)
        stopped = one(sampler, Target("box", container=c.id, devices=(held,)))
        assert not stopped.alive and stopped.gpus == () and stopped.error and "not running" in stopped.error
    finally:
        sampler.close()
