"""Control groups for local sessions: memory, CPU and process limits the kernel holds them to.

One group per session, ``<parent>/<session id>``, in each controller (cgroup v1) or in the one
hierarchy (cgroup v2).  :func:`limit_files` is the pure plan (which file gets which value);
:class:`SessionGroup` makes the group, puts a process in it (from a ``preexec_fn``: the child
joins before it runs anything), kills what is left in it and removes it.

A session over its memory is stopped by the kernel's OOM killer inside its own group (the biggest
process, a runaway kernel, goes first); its ``/tmp`` is a tmpfs whose pages count against that
memory too.  Swap does not extend the limit (``memsw`` / ``swap.max``).
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass
from decimal import Decimal

CGROUP_ROOT = "/sys/fs/cgroup"
V1_CONTROLLERS = ("memory", "cpu", "pids")
CPU_PERIOD_US = 100_000
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def cgroup_version(root: str = CGROUP_ROOT) -> int | None:
    """2 for the unified hierarchy, 1 for v1 controllers, None when neither is mounted writable."""
    if os.path.exists(os.path.join(root, "cgroup.controllers")):
        return 2
    if all(os.path.isdir(os.path.join(root, c)) for c in V1_CONTROLLERS):
        return 1
    return None


def limit_files(
    version: int, *, cpu: Decimal | None, mem: int | None, pids: int | None, swap_file: bool = True
) -> list[tuple[str, str, str]]:
    """(controller, file, value) in the order they must be written; controller is "" on v2."""
    out: list[tuple[str, str, str]] = []
    if version == 1:
        if mem is not None:
            out.append(("memory", "memory.limit_in_bytes", str(mem)))
            if swap_file:  # only after limit_in_bytes, and only where the kernel accounts swap
                out.append(("memory", "memory.memsw.limit_in_bytes", str(mem)))
        if cpu is not None:
            out.append(("cpu", "cpu.cfs_period_us", str(CPU_PERIOD_US)))
            out.append(("cpu", "cpu.cfs_quota_us", str(max(1000, int(cpu * CPU_PERIOD_US)))))
        if pids is not None:
            out.append(("pids", "pids.max", str(pids)))
    else:
        if mem is not None:
            out.append(("", "memory.max", str(mem)))
            if swap_file:
                out.append(("", "memory.swap.max", "0"))
        if cpu is not None:
            out.append(("", "cpu.max", f"{max(1000, int(cpu * CPU_PERIOD_US))} {CPU_PERIOD_US}"))
        if pids is not None:
            out.append(("", "pids.max", str(pids)))
    return out


def startup_cpu(cpu: Decimal | None, boost: Decimal) -> Decimal | None:
    """The CPU a session may use while its server starts: at least ``boost`` cores (a JupyterLab
    held to a tenth of a core takes minutes to start), its own ``cpu`` when that is more; None (no
    limit) stays None."""
    if cpu is None or boost <= 0:
        return cpu
    return max(cpu, boost)


@dataclass(frozen=True)
class SessionGroup:
    """A session's control group(s); ``parent`` and ``name`` are path components."""

    parent: str
    name: str
    version: int
    root: str = CGROUP_ROOT

    def __post_init__(self) -> None:
        for part in (self.parent, self.name):
            if not _NAME.match(part):
                raise ValueError(f"cgroup name {part!r}: letters, digits, '.', '_' and '-' only")

    def dirs(self) -> list[tuple[str, str]]:
        """(controller, directory) of each group: one per controller on v1, one on v2."""
        if self.version == 1:
            return [(c, os.path.join(self.root, c, self.parent, self.name)) for c in V1_CONTROLLERS]
        return [("", os.path.join(self.root, self.parent, self.name))]

    def create(self, *, cpu: Decimal | None, mem: int | None, pids: int | None) -> None:
        if self.version == 2:
            _enable_v2_controllers(self.root, self.parent)
        where = dict(self.dirs())
        for d in where.values():
            os.makedirs(d, exist_ok=True)
        memory_dir = where["memory"] if self.version == 1 else where[""]
        swap = os.path.exists(
            os.path.join(
                memory_dir, "memory.memsw.limit_in_bytes" if self.version == 1 else "memory.swap.max"
            )
        )
        for controller, name, value in limit_files(self.version, cpu=cpu, mem=mem, pids=pids, swap_file=swap):
            _write(os.path.join(where[controller], name), value)

    def set_cpu(self, cpu: Decimal) -> None:
        """Change the group's CPU limit (the startup boost's end)."""
        where = dict(self.dirs())
        for controller, name, value in limit_files(self.version, cpu=cpu, mem=None, pids=None):
            _write(os.path.join(where[controller], name), value)

    def join(self, pid: int = 0) -> None:
        """Move ``pid`` (0: the calling process) into the group; safe in a ``preexec_fn``."""
        for _, d in self.dirs():
            _write(os.path.join(d, "cgroup.procs"), str(pid or os.getpid()))

    def pids(self) -> set[int]:
        out: set[int] = set()
        for _, d in self.dirs():
            try:
                with open(os.path.join(d, "cgroup.procs")) as f:
                    out.update(int(x) for x in f.read().split())
            except OSError:
                pass
        return out

    def memory_peak(self) -> int | None:
        """The most memory the group held (bytes), as the kernel counted it."""
        for controller, d in self.dirs():
            if controller in ("memory", ""):
                for name in ("memory.max_usage_in_bytes", "memory.peak"):
                    try:
                        with open(os.path.join(d, name)) as f:
                            return int(f.read().strip())
                    except (OSError, ValueError):
                        continue
        return None

    def kill(self) -> None:
        """SIGKILL whatever still runs in the group (a process that left the session's process group)."""
        if self.version == 2:
            try:
                _write(os.path.join(self.dirs()[0][1], "cgroup.kill"), "1")
                return
            except OSError:
                pass
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def remove(self, wait: float = 2.0) -> bool:
        """Kill what is left, then remove the group; False when it is still busy after ``wait`` s."""
        deadline = time.monotonic() + wait
        while True:
            if self.pids():
                self.kill()
            left = False
            for _, d in self.dirs():
                try:
                    os.rmdir(d)
                except FileNotFoundError:
                    pass
                except OSError:
                    left = True
            if not left or time.monotonic() > deadline:
                return not left
            time.sleep(0.05)


def _enable_v2_controllers(root: str, parent: str) -> None:
    """Hand memory, cpu and pids down to ``parent``'s children (v2 needs it at each level)."""
    os.makedirs(os.path.join(root, parent), exist_ok=True)
    for d in (root, os.path.join(root, parent)):
        try:
            _write(os.path.join(d, "cgroup.subtree_control"), "+memory +cpu +pids")
        except OSError:
            pass  # already on, or not ours to change: the limits below then say so


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)
