"""This session's resource use now: CPU and memory of its processes (psutil), GPUs through the device
plugins (NVML for NVIDIA devices, the mock plugin for mock ones).

The session's processes are the server and everything under it (kernels, terminals, the batch command,
app services). CPU percent needs two samples of each process: the sampler keeps the processes it saw, so
each request measures since the previous one (the first answers 0 for a new process).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import psutil

from labfleet.compute.devices.base import get_plugin, plugin_for_device

from .fleet import gpu_rows


class ProcessSampler:
    """CPU and memory of a process tree, sampled on demand."""

    def __init__(self, root_pid: int | None = None) -> None:
        self.root_pid = root_pid or os.getpid()
        self._seen: dict[int, psutil.Process] = {}

    def tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.root_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return []
        current: dict[int, psutil.Process] = {}
        for p in procs:
            # The same Process object across samples: cpu_percent() measures since its previous call.
            known = self._seen.get(p.pid)
            current[p.pid] = known if known is not None and known.is_running() else p
        self._seen = current
        return list(current.values())

    def sample(self) -> tuple[float, int, set[int]]:
        """(CPU percent of one core summed over the tree, resident memory in bytes, the pids)."""
        cpu = 0.0
        rss = 0
        pids: set[int] = set()
        for p in self.tree():
            try:
                with p.oneshot():
                    cpu += p.cpu_percent(None)
                    rss += p.memory_info().rss
                pids.add(p.pid)
            except psutil.Error:  # ended between listing and reading
                continue
        return cpu, rss, pids


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


def device_readings(
    devices: list[Mapping[str, Any]], plugins: dict[str, Any] | None = None
) -> dict[str, Any]:
    """uuid -> (plugin name, utilization reading, processes) from the plugin that answers for each device."""
    plugins = {} if plugins is None else plugins
    out: dict[str, Any] = {}
    for d in devices:
        uuid = str(d.get("uuid"))
        name = plugin_for_device(uuid)
        try:
            plugin = plugins.get(name) or plugins.setdefault(name, get_plugin(name))
        except (ValueError, ImportError):
            out[uuid] = (name, None, None)
            continue
        out[uuid] = (name, plugin.utilization(uuid), plugin.processes(uuid))
    return out


def session_usage(
    sampler: ProcessSampler,
    devices: list[Mapping[str, Any]],
    environ: Mapping[str, str] | None = None,
    plugins: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``GET labfleet/usage`` (blocking: NVML and /proc; the handler runs it in a thread)."""
    env = os.environ if environ is None else environ
    cpu, rss, pids = sampler.sample()
    mem_limit = _number(env.get("LABFLEET_MEM_LIMIT"))
    return {
        "at": datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "cpu": {"percent": round(cpu, 1), "limit": _number(env.get("LABFLEET_CPU_LIMIT"))},
        "memory": {"used": rss, "limit": int(mem_limit) if mem_limit else None},
        "gpus": gpu_rows(
            devices,
            device_readings(devices, plugins),
            pids,
            pids_comparable=env.get("LABFLEET_PID_NAMESPACE", "") != "own",
        ),
    }


def devices_from_env(environ: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The session's devices as the spawner named them, when the service cannot be asked."""
    env = os.environ if environ is None else environ
    uuids = [u for u in env.get("LABFLEET_GPU_UUIDS", "").split(",") if u]
    fraction = _number(env.get("LABFLEET_GPU_FRACTION"))
    return [
        {"uuid": u, "index": i, "model": None, "memory": None, "shares": fraction if fraction else 1.0}
        for i, u in enumerate(uuids)
    ]
