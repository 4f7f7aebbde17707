"""Device plugins: what accelerators a node has, and what the node itself offers.

A :class:`DevicePlugin` discovers one kind of device (``nvidia`` through NVML, ``mock`` from
configuration).  :func:`get_plugin` builds one by name; :func:`describe_node` asks a list of
plugins and adds this machine's CPU cores and memory, giving a :class:`NodeInfo`.

A plugin that finds nothing never raises: :meth:`DevicePlugin.discover` returns an empty list,
sets :attr:`DevicePlugin.reason` to a sentence a person understands, and logs it.

Third-party plugins register a :class:`DevicePlugin` subclass in the entry-point group
``labfleet.device_plugins``; ``mock`` and ``nvidia`` also work without the entry points
(a source checkout that was never installed).
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from decimal import ROUND_DOWN, Decimal
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "labfleet.device_plugins"

# name -> "module:Class", used when no entry point of that name is installed
BUILTIN_PLUGINS: dict[str, str] = {
    "mock": "labfleet.compute.devices.mock:MockPlugin",
    "nvidia": "labfleet.compute.devices.nvidia:NvidiaPlugin",
}

DEVICE_KINDS = ("gpu", "mig")


@dataclass(frozen=True)
class DeviceInfo:
    """One schedulable accelerator: a whole GPU, or a MIG instance of one.

    ``index`` is the GPU's index on its node (a MIG instance carries its parent's index);
    ``memory_bytes`` its device memory; ``parent_uuid`` the GPU a MIG instance lives on.
    """

    uuid: str
    index: int
    model: str
    memory_bytes: int
    kind: str = "gpu"
    parent_uuid: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.uuid, str) or not self.uuid:
            raise ValueError(f"device uuid must be a non-empty string, not {self.uuid!r}")
        if isinstance(self.index, bool) or not isinstance(self.index, int) or self.index < 0:
            raise ValueError(f"device {self.uuid}: index must be an int >= 0, not {self.index!r}")
        if (
            isinstance(self.memory_bytes, bool)
            or not isinstance(self.memory_bytes, int)
            or self.memory_bytes < 0
        ):
            raise ValueError(
                f"device {self.uuid}: memory_bytes must be an int >= 0, not {self.memory_bytes!r}"
            )
        if self.kind not in DEVICE_KINDS:
            raise ValueError(f"device {self.uuid}: kind must be one of {DEVICE_KINDS}, not {self.kind!r}")
        if (self.kind == "mig") != (self.parent_uuid is not None):
            raise ValueError(f"device {self.uuid}: a MIG instance, and only one, has a parent_uuid")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        return asdict(self)


@dataclass(frozen=True)
class NodeInfo:
    """What a node offers: ``cpu`` cores (int, or a Decimal under a fractional cgroup quota),
    ``mem`` bytes, its devices, which plugin(s) looked (comma-separated), and ``reason``: why
    a plugin found no device (``None`` when every plugin found some)."""

    name: str
    cpu: int | Decimal
    mem: int
    devices: list[DeviceInfo] = field(default_factory=list)
    plugin: str = ""
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (``cpu`` as a string when it is fractional)."""
        cpu: int | str = self.cpu if isinstance(self.cpu, int) else format(self.cpu.normalize(), "f")
        return {
            "name": self.name,
            "cpu": cpu,
            "mem": self.mem,
            "devices": [d.to_dict() for d in self.devices],
            "plugin": self.plugin,
            "reason": self.reason,
        }


class DevicePlugin(ABC):
    """Discovers one kind of device on this machine.

    Subclasses set :attr:`name` and implement :meth:`discover`; configuration goes to
    ``__init__`` as keyword arguments, validated there (``ValueError`` with a clear message).
    """

    name: ClassVar[str] = ""

    def __init__(self) -> None:
        #: Why the last :meth:`discover` found nothing; ``None`` when it found devices.
        self.reason: str | None = None

    @abstractmethod
    def discover(self) -> list[DeviceInfo]:
        """The devices found now; an empty list (and :attr:`reason`) when there are none.

        Must not raise for a missing driver, library or device.
        """

    def utilization(self, uuid: str) -> dict[str, int | None] | None:
        """Now: ``{"gpu_util": percent or None, "mem_used": bytes, "mem_total": bytes}`` of the device
        with this UUID; ``None`` when this plugin cannot tell (the default)."""
        return None

    def processes(self, uuid: str) -> list[dict[str, int | None]] | None:
        """The processes using the device now: ``{"pid", "mem_used" (bytes or None), "gpu_util" (percent
        or None)}`` each, pids as the driver sees them; ``None`` when this plugin cannot tell (the default)."""
        return None

    def _found(self, devices: list[DeviceInfo]) -> list[DeviceInfo]:
        """Record a successful discovery."""
        self.reason = None
        log.info("device plugin %s: found %d device(s)", self.name, len(devices))
        return devices

    def _nothing(self, reason: str) -> list[DeviceInfo]:
        """Record and log that nothing was found, and why; returns an empty list."""
        self.reason = reason
        log.warning("device plugin %s: no devices: %s", self.name, reason)
        return []


# --- registry ----------------------------------------------------------------------------------


def plugin_for_device(uuid: str) -> str:
    """The plugin that answers for a device, from its UUID: ``GPU-mock-...`` ones are the mock's."""
    return "mock" if uuid.startswith("GPU-mock-") else "nvidia"


def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_plugins() -> list[str]:
    """Names :func:`get_plugin` accepts: installed entry points and the built-ins."""
    return sorted(set(_entry_points()) | set(BUILTIN_PLUGINS))


def _load_builtin(name: str) -> Any:
    module, _, attr = BUILTIN_PLUGINS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def plugin_class(name: str) -> type[DevicePlugin]:
    """The plugin class registered as ``name`` (entry point first, then the built-ins)."""
    if not isinstance(name, str):
        raise ValueError(f"device plugin name must be a string, not {name!r}")
    ep = _entry_points().get(name)
    cls: Any = None
    if ep is not None:
        try:
            cls = ep.load()
        except Exception as e:
            if name not in BUILTIN_PLUGINS:
                raise ValueError(f"device plugin {name!r} ({ep.value}) cannot be loaded: {e}") from e
            log.warning("device plugin %s: entry point %s failed (%s); using the built-in", name, ep.value, e)
    if cls is None:
        if name not in BUILTIN_PLUGINS:
            raise ValueError(f"unknown device plugin {name!r}; known: {', '.join(available_plugins())}")
        cls = _load_builtin(name)
    if not (isinstance(cls, type) and issubclass(cls, DevicePlugin)):
        raise ValueError(f"device plugin {name!r} is {cls!r}, not a DevicePlugin subclass")
    return cls


def get_plugin(name: str, **config: Any) -> DevicePlugin:
    """Build the plugin registered as ``name`` with its configuration.

    Raises ``ValueError`` for an unknown name or a configuration the plugin refuses.
    """
    cls = plugin_class(name)
    try:
        return cls(**config)
    except TypeError as e:
        raise ValueError(f"device plugin {name!r}: bad configuration {sorted(config)}: {e}") from e


# --- this machine ------------------------------------------------------------------------------

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_SELF_CGROUP = Path("/proc/self/cgroup")
_MEMINFO = Path("/proc/meminfo")
# cgroup v1 writes "no limit" as a huge number (PAGE_COUNTER_MAX pages); anything above is no limit
_NO_LIMIT = 2**62


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _cgroup_dirs(controller: str, cgroup_root: Path, self_cgroup: Path) -> list[Path]:
    """Directories whose ``controller`` limits apply to this process, innermost first.

    Covers cgroup v2 (``0::/path``), v1 (``N:cpu,cpuacct:/path``) and hybrid mounts; a path that
    is not visible (a container without a cgroup namespace) falls back to the mount's root.
    """
    text = _read(self_cgroup) or ""
    dirs: list[Path] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            bases = [cgroup_root, cgroup_root / "unified"]
        elif controller in controllers.split(","):
            bases = [cgroup_root / controllers, cgroup_root / controller]
        else:
            continue
        rel = Path(path.strip("/")) if path.strip("/") else None
        for base in bases:
            chain = [base / rel, *(base / p for p in rel.parents)] if rel else [base]
            dirs.extend(d for d in chain if d not in dirs)
    return dirs


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def cgroup_memory_limit(cgroup_root: Path = _CGROUP_ROOT, self_cgroup: Path = _SELF_CGROUP) -> int | None:
    """The tightest cgroup memory limit on this process in bytes, ``None`` when unlimited."""
    limits = []
    for d in _cgroup_dirs("memory", cgroup_root, self_cgroup):
        for name in ("memory.max", "memory.limit_in_bytes"):
            value = _int(_read(d / name))  # "max" (v2, unlimited) reads as None
            if value is not None and 0 < value < _NO_LIMIT:
                limits.append(value)
    return min(limits) if limits else None


def cgroup_cpu_limit(cgroup_root: Path = _CGROUP_ROOT, self_cgroup: Path = _SELF_CGROUP) -> Decimal | None:
    """The tightest cgroup CPU quota on this process in cores, ``None`` when unlimited."""
    limits = []
    for d in _cgroup_dirs("cpu", cgroup_root, self_cgroup):
        v2 = (_read(d / "cpu.max") or "").split()
        quota, period = (_int(v2[0]), _int(v2[1])) if len(v2) == 2 else (None, None)
        if quota is None:
            quota, period = _int(_read(d / "cpu.cfs_quota_us")), _int(_read(d / "cpu.cfs_period_us"))
        if quota is not None and period and quota > 0 and period > 0:
            limits.append(Decimal(quota) / Decimal(period))
    return min(limits) if limits else None


def host_cpu(cgroup_root: Path = _CGROUP_ROOT, self_cgroup: Path = _SELF_CGROUP) -> int | Decimal:
    """CPU cores this process may use: its affinity mask (or the CPU count), capped by a cgroup quota.

    An int, or a Decimal with three decimals when a quota is fractional (e.g. ``Decimal("1.5")``).
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_limit(cgroup_root, self_cgroup)
    if quota is None or quota >= cores:
        return max(cores, 1)
    if quota == quota.to_integral_value():
        return max(int(quota), 1)
    return max(quota.quantize(Decimal("0.001"), rounding=ROUND_DOWN), Decimal("0.001"))


def host_memory(
    meminfo: Path = _MEMINFO, cgroup_root: Path = _CGROUP_ROOT, self_cgroup: Path = _SELF_CGROUP
) -> int:
    """Memory this process may use in bytes: MemTotal, capped by a cgroup limit; 0 if unknown."""
    total = 0
    for line in (_read(meminfo) or "").splitlines():
        if line.startswith("MemTotal:"):
            fields = line.split()
            kib = _int(fields[1]) if len(fields) >= 2 else None
            total = kib * 1024 if kib else 0
            break
    if not total:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, ValueError, OSError):
            total = 0
    limit = cgroup_memory_limit(cgroup_root, self_cgroup)
    if limit is not None and (not total or limit < total):
        total = limit
    if not total:
        log.warning("cannot tell this machine's memory (no /proc/meminfo, no sysconf)")
    return max(total, 0)


def describe_node(
    name: str | None = None,
    plugins: Sequence[DevicePlugin | str] | None = None,
) -> NodeInfo:
    """This machine as a node: CPU cores, memory, and the devices the plugins find.

    ``plugins``: plugin objects or names (built with no configuration); default ``["nvidia"]``.
    A plugin that raises is logged and counted as finding nothing.  Two plugins reporting the
    same device UUID is a configuration error (``ValueError``).
    """
    node = name or socket.gethostname()
    objs = [get_plugin(p) if isinstance(p, str) else p for p in (["nvidia"] if plugins is None else plugins)]
    devices: list[DeviceInfo] = []
    reasons: list[str] = []
    for plugin in objs:
        try:
            found = list(plugin.discover())
        except Exception as e:  # a third-party plugin's bug must not take the node down
            log.exception("device plugin %s failed on node %s", plugin.name, node)
            found, plugin.reason = [], f"plugin failed: {type(e).__name__}: {e}"
        if not found:
            reasons.append(f"{plugin.name}: {plugin.reason or 'no devices found'}")
        devices.extend(found)
    _check_unique(devices)
    reason = "; ".join(reasons) or None
    if not devices:
        log.warning("node %s: no devices (%s)", node, reason or "no device plugins configured")
    return NodeInfo(
        name=node,
        cpu=host_cpu(),
        mem=host_memory(),
        devices=devices,
        plugin=",".join(p.name for p in objs),
        reason=reason if objs else "no device plugins configured",
    )


def _check_unique(devices: Iterable[DeviceInfo]) -> None:
    seen: set[str] = set()
    for d in devices:
        if d.uuid in seen:
            raise ValueError(
                f"two devices report the same UUID {d.uuid}: check the device plugin configuration"
            )
        seen.add(d.uuid)
