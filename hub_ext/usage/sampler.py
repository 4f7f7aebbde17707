"""The trusted usage sampler: what each live compute session really uses, measured from outside it.

A session's own numbers (its ``labfleet.session`` usage endpoint) can be faked by its user, so accounting
and idle reclamation read this instead: the node's ``/proc`` (through psutil), the Docker engine's
stats and the device plugins, none of which a session can write.  The labfleet service runs a
:class:`Sampler` every ``$LABFLEET_SAMPLE_INTERVAL`` seconds (:func:`sample_interval`, default 15)
in a worker thread for its own node; a node agent runs the same code on the other nodes.  So it
takes plain values and returns plain values: no DB, no service, no Hub.

Per :class:`Target` (one live session on this node), one :class:`Reading`:

- **local** sessions (``pid``: the server's root process, bubblewrap's when sandboxed): the root and
  all its descendants.  CPU is the sum, over the live processes of the tree, of user + system +
  children_user + children_system (the ``children_*`` times are those of descendants already reaped,
  so nothing counts twice); memory is the sum of their RSS (shared pages count once per process).
  The node's process table is read once per tick (one psutil pass over ``/proc``) and every session
  is a subtree of it: walking it per session would read the whole table once per session.  A root
  that is a zombie, or whose pid now belongs to another process, is gone.
- **docker** sessions (``container``): the engine's one-shot stats, up to ``DOCKER_CONCURRENCY``
  containers at once (an engine may hold each answer until its 1 s stats collector ticks).  CPU is
  the container's cgroup total (``cpu_stats.cpu_usage.total_usage``, ns); memory is ``usage`` less
  the inactive page cache, as ``docker stats`` shows it.  A container that is gone or not running
  reads ``alive=False``; so do all of them when the engine does not answer.
- **GPUs**: each device a live session holds is asked once per tick, whoever shares it, for its
  processes (and, only when needed, its utilisation).  The driver's pids map to sessions: a local
  session owns the pids of its tree, a container the pids whose ``/proc/<pid>/cgroup`` names its id.
  A session's share of a device: the sum of its processes' ``gpu_util`` when the driver gives them;
  when it does not and the session's processes are the only ones on the device, the device's own
  ``gpu_util``; otherwise ``None`` (cannot tell).  Memory likewise, from ``mem_used``.  A session with
  no process on a device whose processes are known uses 0 of it.  Each reading also lists the
  session's processes on the device (pid, memory, start time), for the share enforcement
  (:mod:`labfleet.usage.overuse`), whose kills (the service's on its node, an agent's on its own)
  go through :func:`kill_if_same`: a pid is killed only while it still has that start time.

``cpu_seconds`` is cumulative since the session started: consumers take differences between
readings.  It can step down when a process leaves a local tree without being reaped inside it (a
daemon that re-parents itself to the host's init escapes an unsandboxed tree; bubblewrap's own PID
namespace keeps orphans inside): clamp negative differences to 0.

Nothing here raises for a bad target: a reading that cannot be taken has ``alive=False`` (or
``None`` fields) and an ``error`` for the log.  A :class:`Sampler` is used by one thread at a time.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psutil

from labfleet.compute.devices.base import DevicePlugin, plugin_for_device

log = logging.getLogger(__name__)

INTERVAL_ENV = "LABFLEET_SAMPLE_INTERVAL"
DEFAULT_INTERVAL = 15.0
MIN_INTERVAL = 1.0
DOCKER_CONCURRENCY = 32  # stats calls at once (the default client's connection pool is made this big)


def sample_interval(environ: Mapping[str, str] = os.environ) -> float:
    """Seconds between two ticks: ``$LABFLEET_SAMPLE_INTERVAL`` (at least 1), default 15.

    A value that is not a number, or under 1 s, is logged and replaced by the default / the minimum.
    """
    raw = environ.get(INTERVAL_ENV, "").strip()
    if not raw:
        return DEFAULT_INTERVAL
    try:
        value = float(raw)
    except ValueError:
        log.warning(
            "%s=%r is not a number of seconds; sampling every %s s", INTERVAL_ENV, raw, DEFAULT_INTERVAL
        )
        return DEFAULT_INTERVAL
    if not value >= MIN_INTERVAL:  # also NaN
        log.warning("%s=%r is under %s s; sampling every %s s", INTERVAL_ENV, raw, MIN_INTERVAL, MIN_INTERVAL)
        return MIN_INTERVAL
    return value


# --- plain values in, plain values out ----------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One live session on this node, as the sampler needs it."""

    session_id: str
    pid: int | None = None  # local backend: the server's root pid on this node (bubblewrap's when sandboxed)
    container: str | None = None  # docker backend: the container id
    devices: tuple[str, ...] = ()  # UUIDs of the devices the session holds


@dataclass(frozen=True)
class GpuProcess:
    """One of a session's processes on a device, as the driver lists it (by host pid)."""

    pid: int
    mem_bytes: int | None  # device memory it holds now
    started: float | None  # its start (psutil's create_time, epoch seconds): tells a reused pid apart


@dataclass(frozen=True)
class GpuReading:
    """A session's use of one device it holds."""

    uuid: str
    util_percent: float | None  # this session's share of the device's busy time, 0..100 (None: cannot tell)
    mem_bytes: int | None  # device memory its processes use now
    processes: tuple[GpuProcess, ...] = ()  # its processes the driver lists on the device


@dataclass(frozen=True)
class Reading:
    """What one session uses now; ``alive=False``: the process/container is gone (or unknown)."""

    session_id: str
    at: float  # time.time() of the reading
    alive: bool
    cpu_seconds: float | None  # CUMULATIVE CPU time (user+system, core-seconds) since the session started
    mem_bytes: int | None  # resident memory now
    gpus: tuple[GpuReading, ...] = ()
    error: str | None = None  # why a reading is missing, for the log


def _dead(session_id: str, error: str) -> Reading:
    return Reading(
        session_id=session_id, at=time.time(), alive=False, cpu_seconds=None, mem_bytes=None, error=error
    )


@dataclass
class _Measured:
    """A live session's host-side measure, before its GPUs are added."""

    cpu_seconds: float
    mem_bytes: int
    at: float
    pids: frozenset[int] = frozenset()  # local: its tree
    container_id: str | None = None  # docker: the full id (what its processes' cgroup paths name)


@dataclass
class _Device:
    """One device's answers for this tick (asked once, whoever shares it)."""

    uuid: str
    plugin: DevicePlugin | None
    error: str | None = None
    rows: list[tuple[int, int | None, float | None]] | None = None  # (pid, mem_used, gpu_util)
    _util: dict[str, Any] | None = None
    _util_asked: bool = False
    owners: dict[int, int] = field(default_factory=dict)  # pid -> index of the target that owns it

    def utilization(self) -> dict[str, Any] | None:
        """The device's own reading, asked at most once (only a sole user's fallback needs it)."""
        if not self._util_asked and self.plugin is not None:
            self._util_asked = True
            try:
                self._util = self.plugin.utilization(self.uuid)
            except Exception as e:  # a plugin's bug must not stop the tick
                log.debug("device %s: utilization failed", self.uuid, exc_info=True)
                self.error = f"gpu {self.uuid}: utilization failed: {type(e).__name__}: {e}"
        return self._util


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value == value else None  # NaN is no reading


def _clamp_util(value: float) -> float:
    return min(max(value, 0.0), 100.0)


class Sampler:
    """Measures the sessions of this node; see the module's docstring for how.

    ``plugins``: the node's device plugins (matched to a device by ``plugin.name`` and
    :func:`plugin_for_device`).  ``docker_client``: a factory for a docker-py ``DockerClient``,
    called the first time a container target is seen (again on a later tick if it failed);
    default ``docker.from_env(version="auto", timeout=10, max_pool_size=DOCKER_CONCURRENCY)``.
    """

    def __init__(
        self,
        plugins: Sequence[DevicePlugin] = (),
        docker_client: Callable[[], Any] | None = None,
    ) -> None:
        self._plugins: dict[str, DevicePlugin] = {}
        for p in plugins:
            if p.name in self._plugins:
                log.warning("sampler: two device plugins named %r; using the first", p.name)
                continue
            self._plugins[p.name] = p
        self._docker_factory: Callable[[], Any] = docker_client or _default_docker_client
        self._docker: Any = None
        self._one_shot = True  # the engine's API takes one-shot stats (1.41+, Docker 20.10+)
        # session -> (root pid, its start time) when first seen: a reused pid is not the session
        self._roots: dict[str, tuple[int, float]] = {}
        self._said: dict[str, str] = {}  # what was logged as a warning, by subject (once until it changes)
        self._saying: dict[str, str] = {}

    # ------------------------------------------------------------------ the tick

    def sample(self, targets: Sequence[Target]) -> list[Reading]:
        """One reading per target, in order; blocking (one walk of /proc, a few ms per container)."""
        targets = list(targets)
        self._saying = {}
        measured: list[_Measured | Reading] = [_dead(t.session_id, "not measured") for t in targets]
        local = [i for i, t in enumerate(targets) if t.container is None]
        docker = [i for i, t in enumerate(targets) if t.container is not None]
        for idx, stage in ((local, self._measure_local), (docker, self._measure_docker)):
            if not idx:
                continue
            try:
                stage(targets, idx, measured)
            except Exception as e:  # a bug here must not stop the service's job loop
                log.exception("sampler: measuring %d session(s) failed", len(idx))
                for i in idx:
                    if not isinstance(measured[i], _Measured):
                        measured[i] = _dead(targets[i].session_id, f"{type(e).__name__}: {e}")
        # Roots are remembered while their session is asked about, so a reused pid stays "gone".
        asked = {t.session_id for t in targets}
        self._roots = {k: v for k, v in self._roots.items() if k in asked}
        try:
            gpus = self._measure_gpus(targets, measured)
        except Exception as e:
            log.exception("sampler: reading devices failed")
            failed = [f"devices: {type(e).__name__}: {e}"]
            gpus = {
                i: (tuple(GpuReading(u, None, None) for u in t.devices), failed)
                for i, t in enumerate(targets)
            }
        out: list[Reading] = []
        for i, (t, m) in enumerate(zip(targets, measured, strict=True)):
            if isinstance(m, Reading):
                out.append(m)
                continue
            readings, problems = gpus.get(i, ((), []))
            out.append(
                Reading(
                    session_id=t.session_id,
                    at=m.at,
                    alive=True,
                    cpu_seconds=m.cpu_seconds,
                    mem_bytes=m.mem_bytes,
                    gpus=readings,
                    error="; ".join(problems) or None,
                )
            )
        self._said = {k: v for k, v in self._said.items() if k in self._saying}
        return out

    def close(self) -> None:
        """Close the Docker client, if one was made."""
        client, self._docker = self._docker, None
        if client is not None:
            try:
                client.close()
            except Exception:
                log.debug("sampler: closing the docker client failed", exc_info=True)

    def _say(self, subject: str, message: str, level: int = logging.WARNING) -> None:
        """Log a problem at ``level`` the first tick it is seen (and when it changes), then at debug:
        a sampler that ticks every 15 s must not repeat the same line all day."""
        self._saying[subject] = message
        if self._said.get(subject) != message:
            self._said[subject] = message
            log.log(level, "sampler: %s: %s", subject, message)
        else:
            log.debug("sampler: %s: %s", subject, message)

    # ------------------------------------------------------------------ local sessions

    def _measure_local(self, targets: list[Target], idx: list[int], out: list[_Measured | Reading]) -> None:
        procs, children = _process_table()
        for i in idx:
            t = targets[i]
            try:
                m = self._tree(t, procs, children)
            except Exception as e:  # a bad target never stops the tick
                log.debug("sampler: session %s failed", t.session_id, exc_info=True)
                m = _dead(t.session_id, f"{type(e).__name__}: {e}")
            if isinstance(m, Reading):
                self._say(f"session {t.session_id}", m.error or "gone", logging.INFO)
            out[i] = m

    def _tree(
        self, t: Target, procs: Mapping[int, psutil.Process], children: Mapping[int, list[int]]
    ) -> _Measured | Reading:
        pid = t.pid
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            return _dead(t.session_id, f"no process to measure (pid={pid!r}, no container)")
        try:
            # A fresh look at the root (psutil's table may hold the pid's previous owner): its start
            # time tells a reused pid from the session's own process.
            root = psutil.Process(pid)
            with root.oneshot():
                started = root.create_time()
                zombie = root.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return _dead(t.session_id, f"process {pid} is gone")
        if zombie:
            return _dead(t.session_id, f"process {pid} has exited (a zombie its parent has not reaped)")
        first = self._roots.setdefault(t.session_id, (pid, started))
        if first != (pid, started):
            if first[0] == pid:
                return _dead(t.session_id, f"process {pid} is gone (its pid now belongs to another process)")
            self._roots[t.session_id] = (pid, started)  # the caller says the session moved to another pid
        cpu = 0.0
        mem = 0
        pids: set[int] = set()
        stack = [pid]
        while stack:
            p = stack.pop()
            if p in pids:
                continue  # the table is not one atomic snapshot: never loop
            pids.add(p)
            stack.extend(children.get(p, ()))
            proc = procs.get(p)
            if proc is None:
                continue
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    rss = proc.memory_info().rss
            except psutil.NoSuchProcess:  # gone mid-walk: normal (ZombieProcess is one)
                if p == pid:
                    return _dead(t.session_id, f"process {pid} is gone")
                continue
            except psutil.Error as e:  # AccessDenied: count what can be read
                log.debug("sampler: process %s of session %s: %s", p, t.session_id, e)
                continue
            cpu += times.user + times.system + times.children_user + times.children_system
            mem += rss
        return _Measured(cpu_seconds=cpu, mem_bytes=mem, at=time.time(), pids=frozenset(pids))

    # ------------------------------------------------------------------ docker sessions

    def _client(self) -> tuple[Any, str | None]:
        if self._docker is None:
            try:
                self._docker = self._docker_factory()
            except Exception as e:
                return None, f"no Docker engine: {type(e).__name__}: {e}"
        return self._docker, None

    def _measure_docker(self, targets: list[Target], idx: list[int], out: list[_Measured | Reading]) -> None:
        client, down = self._client()
        if down:
            self._say("docker", down)
            for i in idx:
                out[i] = _dead(targets[i].session_id, down)
            return
        # Some engines (Debian's Docker 20.10, measured here) answer a one-shot stats call only at their
        # stats collector's next tick, about 1 s: the calls go side by side, so that a tick takes about
        # a second per DOCKER_CONCURRENCY containers, not per container.  Newer engines answer in ms.
        engine_down = threading.Event()
        reasons: list[str] = []

        def one(i: int) -> _Measured | Reading:
            t = targets[i]
            if engine_down.is_set():  # the others would wait for the same timeout
                return _dead(t.session_id, reasons[0])
            try:
                return self._container(client, t)
            except _EngineDown as e:
                reasons.append(str(e))
                engine_down.set()
                return _dead(t.session_id, str(e))
            except Exception as e:
                log.debug("sampler: container of session %s failed", t.session_id, exc_info=True)
                return _dead(t.session_id, f"{type(e).__name__}: {e}")

        workers = min(len(idx), _pool_size(client))
        if workers <= 1:
            results = [one(i) for i in idx]
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="labfleet-sampler") as pool:
                results = list(pool.map(one, idx))
        if reasons:
            self._say("docker", reasons[0])
        for i, m in zip(idx, results, strict=True):
            if isinstance(m, Reading) and not reasons:
                self._say(f"session {targets[i].session_id}", m.error or "gone", logging.INFO)
            out[i] = m

    def _container(self, client: Any, t: Target) -> _Measured | Reading:
        name = t.container
        if not isinstance(name, str) or not name:
            return _dead(t.session_id, f"no container to measure (container={name!r})")
        stats = self._stats(client, name)
        if stats is None:
            return _dead(t.session_id, f"no such container {name}")
        memory = stats.get("memory_stats") or {}
        if str(stats.get("read", "")).startswith("0001-01-01") or not memory:
            return _dead(t.session_id, f"container {name} is not running")
        total = _number(((stats.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage"))
        usage = _number(memory.get("usage"))
        return _Measured(
            cpu_seconds=total / 1e9 if total is not None else 0.0,
            mem_bytes=_container_memory(usage, memory.get("stats") or {}),
            at=time.time(),
            container_id=str(stats.get("id") or name),
        )

    def _stats(self, client: Any, name: str) -> dict[str, Any] | None:
        """The engine's stats of one container, ``None`` when there is no such container."""
        try:
            if self._one_shot:
                try:
                    stats = client.api.stats(name, stream=False, one_shot=True)
                except Exception as e:
                    if type(e).__name__ != "InvalidVersion":
                        raise
                    log.info("sampler: the Docker engine's API is older than 1.41: stats take ~1 s each")
                    self._one_shot = False
                    stats = client.api.stats(name, stream=False)
            else:
                stats = client.api.stats(name, stream=False)
        except Exception as e:
            if getattr(e, "status_code", None) == 404:
                return None
            if isinstance(e, OSError):  # requests' connection errors and timeouts are OSErrors
                raise _EngineDown(f"the Docker engine does not answer: {type(e).__name__}: {e}") from e
            raise  # an error about this container alone (an APIError with its status)
        if not isinstance(stats, dict):
            raise ValueError(f"the Docker engine's stats of {name} are not an object")
        return stats

    # ------------------------------------------------------------------ devices

    def _measure_gpus(
        self, targets: list[Target], measured: list[_Measured | Reading]
    ) -> dict[int, tuple[tuple[GpuReading, ...], list[str]]]:
        live = [i for i, m in enumerate(measured) if isinstance(m, _Measured) and targets[i].devices]
        if not live:
            return {}
        devices: dict[str, _Device] = {}
        for i in live:
            for uuid in targets[i].devices:
                if uuid not in devices:
                    devices[uuid] = self._ask(uuid)
        self._own(devices.values(), targets, measured)
        out: dict[int, tuple[tuple[GpuReading, ...], list[str]]] = {}
        for i in live:
            readings = []
            problems: list[str] = []
            for uuid in targets[i].devices:
                dev = devices[uuid]
                readings.append(_share(dev, i))
                if dev.error and dev.error not in problems:
                    problems.append(dev.error)
            out[i] = (tuple(readings), problems)
        return out

    def _ask(self, uuid: str) -> _Device:
        """A device's processes this tick, from the plugin that answers for it."""
        wanted = plugin_for_device(uuid) if isinstance(uuid, str) else "?"
        plugin = self._plugins.get(wanted)
        dev = _Device(uuid=uuid, plugin=plugin)
        if plugin is None:
            dev.error = f"gpu {uuid}: no {wanted!r} device plugin on this node"
            self._say(f"gpu {uuid}", dev.error)
            return dev
        try:
            rows = plugin.processes(uuid)
        except Exception as e:  # a plugin's bug must not stop the tick
            log.debug("sampler: %s.processes(%s) failed", plugin.name, uuid, exc_info=True)
            dev.error = f"gpu {uuid}: processes failed: {type(e).__name__}: {e}"
            self._say(f"gpu {uuid}", dev.error)
            return dev
        if rows is None:
            dev.error = f"gpu {uuid}: the {plugin.name} plugin cannot list its processes"
            return dev
        dev.rows = []
        for row in rows:
            pid = row.get("pid") if isinstance(row, Mapping) else None
            if isinstance(pid, bool) or not isinstance(pid, int):
                continue
            mem = _number(row.get("mem_used"))
            dev.rows.append((pid, int(mem) if mem is not None else None, _number(row.get("gpu_util"))))
        return dev

    @staticmethod
    def _own(devices: Iterable[_Device], targets: list[Target], measured: list[_Measured | Reading]) -> None:
        """Which session owns each pid the drivers report: by tree, else by the pid's cgroup."""
        by_pid: dict[int, int] = {}
        containers: list[tuple[str, int]] = []
        for i, m in enumerate(measured):
            if not isinstance(m, _Measured):
                continue
            for p in m.pids:
                by_pid.setdefault(p, i)
            if m.container_id:
                containers.append((m.container_id, i))
        cgroups: dict[int, int | None] = {}
        for dev in devices:
            for pid, _, _ in dev.rows or ():
                owner = by_pid.get(pid)
                if owner is None and containers:
                    if pid not in cgroups:
                        text = _read_cgroup(pid)
                        cgroups[pid] = next((i for cid, i in containers if cid in text), None)
                    owner = cgroups[pid]
                if owner is not None:
                    dev.owners[pid] = owner


def _share(dev: _Device, i: int) -> GpuReading:
    """Session ``i``'s share of one device (rules in the module's docstring)."""
    if dev.rows is None:
        return GpuReading(dev.uuid, None, None)
    mine = [(pid, mem, util) for pid, mem, util in dev.rows if dev.owners.get(pid) == i]
    if not mine:
        return GpuReading(dev.uuid, 0.0, 0)
    own = [(mem, util) for _, mem, util in mine]
    processes = tuple(GpuProcess(pid, mem, _started(pid)) for pid, mem, _ in mine)
    alone = len(own) == len(dev.rows)
    device = dev.utilization() if alone and any(m is None or u is None for m, u in own) else None
    utils = [u for _, u in own]
    util: float | None
    if all(u is not None for u in utils):
        util = _clamp_util(sum(u for u in utils if u is not None))
    else:
        whole = _number((device or {}).get("gpu_util"))
        util = _clamp_util(whole) if whole is not None else None
    mems = [m for m, _ in own]
    mem: int | None
    if all(m is not None for m in mems):
        mem = sum(m for m in mems if m is not None)
    else:
        whole = _number((device or {}).get("mem_used"))
        mem = int(whole) if whole is not None else None
    return GpuReading(dev.uuid, util, mem, processes)


# --- I/O helpers ----------------------------------------------------------------------------------


class _EngineDown(Exception):
    """The Docker engine did not answer (no socket, connection refused, timeout)."""


def _default_docker_client() -> Any:
    import docker  # the optional extra labfleet[docker]: only nodes that run containers need it

    return docker.from_env(version="auto", timeout=10, max_pool_size=DOCKER_CONCURRENCY)


def _pool_size(client: Any) -> int:
    """How many stats calls may run at once: the client's connection pool (docker-py's default is 10;
    more at once would open connections the pool then throws away, with a warning each)."""
    try:
        adapter = client.api.get_adapter(client.api.base_url)  # requests.Session's public lookup
        size = int(getattr(adapter, "max_pool_size", 10))
    except Exception:
        size = 10
    return max(1, min(size, DOCKER_CONCURRENCY))


def _process_table() -> tuple[dict[int, psutil.Process], dict[int, list[int]]]:
    """Every process of the node and its children, read once (one /proc/<pid>/stat each)."""
    procs: dict[int, psutil.Process] = {}
    children: dict[int, list[int]] = {}
    for p in psutil.process_iter(["ppid"]):
        procs[p.pid] = p
        ppid = p.info.get("ppid")
        if isinstance(ppid, int):
            children.setdefault(ppid, []).append(p.pid)
    return procs, children


def _started(pid: int) -> float | None:
    """When process ``pid`` started (epoch seconds), None when it is gone."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


START_SLACK = 0.01  # seconds: two start times this close are the same process's


def same_start(a: float | None, b: float | None) -> bool:
    """Whether two start times (psutil's create_time) are the same process's (None is nobody's)."""
    return a is not None and b is not None and abs(a - b) <= START_SLACK


def kill_if_same(pid: int, started: float | None) -> tuple[bool, str, str | None]:
    """SIGKILL process ``pid`` if it is still the one that started at ``started`` (epoch seconds, as
    :class:`GpuProcess` has it): (killed, its command line, why not).  The service kills on its own
    node with it, a node agent on its node."""
    try:
        p = psutil.Process(pid)
        cmdline = (" ".join(p.cmdline()) or p.name())[:500]
        if not same_start(p.create_time(), started):
            return False, cmdline, "its pid now belongs to another process"
        p.send_signal(signal.SIGKILL)  # psutil checks the process is still the same one
        return True, cmdline, None
    except psutil.NoSuchProcess:
        return False, "", "it had already exited"
    except psutil.Error as e:
        return False, "", f"{type(e).__name__}: {e}"


def _read_cgroup(pid: int) -> str:
    """``/proc/<pid>/cgroup`` (the container's id is in its paths), empty when the pid is gone."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            return f.read(65536)
    except OSError:
        return ""


def _container_memory(usage: float | None, stats: Mapping[str, Any]) -> int:
    """Memory as ``docker stats`` shows it: usage less the inactive page cache (cgroup v1 or v2)."""
    if usage is None:
        return 0
    v1, v2 = _number(stats.get("total_inactive_file")), _number(stats.get("inactive_file"))
    if v1 is not None and v1 < usage:  # cgroup v1
        return int(usage - v1)
    if v2 is not None and v2 < usage:  # cgroup v2
        return int(usage - v2)
    if v1 is None and v2 is None:  # an engine that reports neither: its page cache
        cache = _number(stats.get("total_cache", stats.get("cache")))
        if cache is not None and cache < usage:
            return int(usage - cache)
    return int(usage)
