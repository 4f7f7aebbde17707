"""Device plugins: mock devices, NVIDIA discovery against a fake NVML, this machine as a node.

The test marked ``gpu`` uses the real NVML and is deselected by default (``-m 'not gpu'``);
on a machine with an NVIDIA GPU and driver run it with ``pytest -m gpu tests/unit/test_devices.py``.
"""

from __future__ import annotations

import logging
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from labfleet.compute.devices import DeviceInfo, DevicePlugin, NodeInfo, describe_node, get_plugin
from labfleet.compute.devices.base import (
    available_plugins,
    cgroup_cpu_limit,
    cgroup_memory_limit,
    host_cpu,
    host_memory,
)
from labfleet.compute.devices.mock import MockPlugin, mock_uuid
from labfleet.compute.devices.nvidia import NvidiaPlugin

GiB = 2**30

# --- mock --------------------------------------------------------------------------------------


def test_mock_counts_models_and_memory():
    plugin = MockPlugin(
        devices=[{"model": "A100-80GB", "memory": "80g", "count": 2}, {"model": "T4", "memory": 16 * GiB}],
        node="gpu-01",
    )
    devices = plugin.discover()
    assert [(d.index, d.model, d.memory_bytes, d.kind) for d in devices] == [
        (0, "A100-80GB", 80 * GiB, "gpu"),
        (1, "A100-80GB", 80 * GiB, "gpu"),
        (2, "T4", 16 * GiB, "gpu"),
    ]
    assert plugin.reason is None
    assert len({d.uuid for d in devices}) == 3
    assert all(d.uuid.startswith("GPU-mock-") and d.parent_uuid is None for d in devices)


def test_mock_uuids_are_deterministic_per_node_and_index():
    spec = [{"model": "A100-80GB", "memory": "80g", "count": 2}]
    first = [d.uuid for d in MockPlugin(devices=spec, node="gpu-01").discover()]
    again = [d.uuid for d in MockPlugin(devices=spec, node="gpu-01").discover()]
    other = [d.uuid for d in MockPlugin(devices=spec, node="gpu-02").discover()]
    assert first == again == [mock_uuid("gpu-01", 0), mock_uuid("gpu-01", 1)]
    assert not set(first) & set(other)


def test_mock_through_the_registry():
    plugin = get_plugin("mock", devices=[{"model": "H100", "memory": "80g", "count": 1}], node="n1")
    assert isinstance(plugin, MockPlugin) and plugin.name == "mock"
    assert [d.model for d in plugin.discover()] == ["H100"]
    assert {"mock", "nvidia"} <= set(available_plugins())


def test_mock_with_nothing_configured_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="labfleet.compute.devices"):
        plugin = MockPlugin(devices=[{"model": "T4", "memory": "16g", "count": 0}], node="n1")
        assert plugin.discover() == []
    assert plugin.reason and "no mock devices" in plugin.reason
    assert "no mock devices" in caplog.text


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        ([{"model": "A100", "memory": "40g", "cuont": 2}], "unknown key(s) cuont"),
        ([{"model": "A100", "memory": "40g", "count": -1}], "count must be 0 or more"),
        ([{"model": "A100", "memory": "40g", "count": 1.5}], "count must be a whole number"),
        ([{"model": "A100", "memory": "40g", "count": True}], "count must be a whole number"),
        ([{"model": "A100", "memory": "12zz"}], "cannot read '12zz'"),
        ([{"model": "A100", "memory": -5}], "negative"),
        ([{"model": "A100", "memory": 0}], "more than 0"),
        ([{"model": "A100"}], "memory is required"),
        ([{"memory": "40g"}], "model must be a non-empty string"),
        ([{"model": "  ", "memory": "40g"}], "model must be a non-empty string"),
        (["A100"], "expected a mapping"),
        ({"model": "A100", "memory": "40g"}, "expected a list"),
        ([{"model": "A100", "memory": "1g", "count": 5000}], "more than 1024"),
    ],
)
def test_mock_bad_config_is_a_clear_value_error(devices: Any, message: str):
    with pytest.raises(ValueError) as err:
        MockPlugin(devices=devices, node="n1")
    assert message in str(err.value)


def test_registry_rejects_unknown_names_and_options():
    with pytest.raises(ValueError, match="unknown device plugin 'amd'.*mock"):
        get_plugin("amd")
    with pytest.raises(ValueError, match="bad configuration"):
        get_plugin("mock", device=[])


class ThirdParty(DevicePlugin):
    """A plugin another package registers in the ``labfleet.device_plugins`` entry-point group."""

    name = "third"

    def discover(self) -> list[DeviceInfo]:
        return self._found([DeviceInfo("GPU-3rd", 0, "X1", GiB)])


def test_registry_loads_entry_points(monkeypatch):
    from importlib.metadata import EntryPoint

    from labfleet.compute.devices import base

    eps = [
        EntryPoint("third", f"{__name__}:ThirdParty", base.ENTRY_POINT_GROUP),
        EntryPoint("mock", "no_such_module:Nope", base.ENTRY_POINT_GROUP),  # broken: the built-in wins
        EntryPoint("bad", "no_such_module:Nope", base.ENTRY_POINT_GROUP),
        EntryPoint("notaplugin", "decimal:Decimal", base.ENTRY_POINT_GROUP),
    ]
    monkeypatch.setattr(base, "entry_points", lambda group: [ep for ep in eps if ep.group == group])
    assert [d.uuid for d in get_plugin("third").discover()] == ["GPU-3rd"]
    assert isinstance(get_plugin("mock"), MockPlugin)
    with pytest.raises(ValueError, match="'bad'.*cannot be loaded"):
        get_plugin("bad")
    with pytest.raises(ValueError, match="not a DevicePlugin subclass"):
        get_plugin("notaplugin")
    assert {"third", "mock", "nvidia", "bad"} <= set(available_plugins())


# --- nvidia against a fake NVML ----------------------------------------------------------------


class FakeNVML:
    """The slice of ``pynvml`` NvidiaPlugin uses, over a list of fake GPUs.

    Each GPU: ``{"uuid", "name", "total", "used", "util", "mig": None | [{"uuid", "name", "total",
    "slot"}], "max_mig": n}``.  Errors are the real pynvml classes.  ``init_error`` makes
    ``nvmlInit`` raise; ``as_bytes`` returns strings as bytes like old pynvml versions.
    """

    NVMLError = pynvml.NVMLError
    NVMLError_NotFound = pynvml.NVMLError_NotFound
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE

    def __init__(
        self, gpus: list[dict[str, Any]], init_error: Exception | None = None, as_bytes: bool = False
    ):
        self.gpus = gpus
        self.init_error = init_error
        self.as_bytes = as_bytes
        self.inits = 0
        self.shutdowns = 0

    def _s(self, text: str) -> str | bytes:
        return text.encode() if self.as_bytes else text

    def _live(self) -> None:
        if self.inits <= self.shutdowns:
            raise pynvml.NVMLError_Uninitialized()

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self._live()
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        self._live()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> dict[str, Any]:
        self._live()
        if not 0 <= i < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return self.gpus[i]

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> dict[str, Any]:
        self._live()
        key = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in self.gpus:
            for dev in [gpu, *(gpu["mig"] or [])]:
                if dev["uuid"] == key:
                    return dev
        raise pynvml.NVMLError_NotFound()

    def nvmlDeviceGetUUID(self, h: dict[str, Any]) -> str | bytes:
        self._live()
        return self._s(h["uuid"])

    def nvmlDeviceGetName(self, h: dict[str, Any]) -> str | bytes:
        self._live()
        return self._s(h["name"])

    def nvmlDeviceGetMemoryInfo(self, h: dict[str, Any]) -> SimpleNamespace:
        self._live()
        return SimpleNamespace(total=h["total"], used=h.get("used", 0), free=h["total"] - h.get("used", 0))

    def nvmlDeviceGetUtilizationRates(self, h: dict[str, Any]) -> SimpleNamespace:
        self._live()
        if "util" not in h:
            raise pynvml.NVMLError_NotSupported()
        return SimpleNamespace(gpu=h["util"], memory=0)

    def nvmlDeviceGetMigMode(self, h: dict[str, Any]) -> list[int]:
        self._live()
        if h.get("mig") is None:
            raise pynvml.NVMLError_NotSupported()
        return [pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: dict[str, Any]) -> int:
        self._live()
        return int(h["max_mig"])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: dict[str, Any], slot: int) -> dict[str, Any]:
        self._live()
        for mig in h["mig"]:
            if mig["slot"] == slot:
                return mig
        raise pynvml.NVMLError_NotFound()


def two_gpus() -> list[dict[str, Any]]:
    """GPU 0 plain; GPU 1 in MIG mode with instances in slots 0 and 2 of 7 (slot 1 empty)."""
    return [
        {
            "uuid": "GPU-aaaa",
            "name": "NVIDIA A100-SXM4-80GB",
            "total": 80 * GiB,
            "used": GiB,
            "util": 37,
            "mig": None,
        },
        {
            "uuid": "GPU-bbbb",
            "name": "NVIDIA A100-SXM4-80GB",
            "total": 80 * GiB,
            "max_mig": 7,
            "mig": [
                {
                    "uuid": "MIG-1111",
                    "name": "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
                    "total": 40 * GiB,
                    "slot": 0,
                },
                {
                    "uuid": "MIG-2222",
                    "name": "NVIDIA A100-SXM4-80GB MIG 1g.10gb",
                    "total": 10 * GiB,
                    "slot": 2,
                },
            ],
        },
    ]


@pytest.mark.parametrize("as_bytes", [False, True], ids=["str", "bytes"])
def test_nvidia_gpus_and_mig_instances(as_bytes: bool):
    nvml = FakeNVML(two_gpus(), as_bytes=as_bytes)
    plugin = NvidiaPlugin(nvml=nvml)
    devices = plugin.discover()
    assert devices == [
        DeviceInfo("GPU-aaaa", 0, "NVIDIA A100-SXM4-80GB", 80 * GiB),
        DeviceInfo(
            "MIG-1111", 1, "NVIDIA A100-SXM4-80GB MIG 3g.40gb", 40 * GiB, kind="mig", parent_uuid="GPU-bbbb"
        ),
        DeviceInfo(
            "MIG-2222", 1, "NVIDIA A100-SXM4-80GB MIG 1g.10gb", 10 * GiB, kind="mig", parent_uuid="GPU-bbbb"
        ),
    ]
    assert plugin.reason is None
    assert nvml.inits == nvml.shutdowns == 1


def test_nvidia_without_the_library_reports_empty_with_reason(caplog):
    nvml = FakeNVML([], init_error=pynvml.NVMLError_LibraryNotFound())
    plugin = NvidiaPlugin(nvml=nvml)
    with caplog.at_level(logging.WARNING, logger="labfleet.compute.devices"):
        assert plugin.discover() == []
    assert plugin.reason == "NVML not available: NVML Shared Library Not Found"
    assert "NVML not available" in caplog.text
    assert nvml.shutdowns == 0
    assert plugin.utilization("GPU-aaaa") is None


def test_nvidia_with_no_gpu_and_with_an_empty_mig_gpu():
    plugin = NvidiaPlugin(nvml=FakeNVML([]))
    assert plugin.discover() == [] and plugin.reason == "NVML found no NVIDIA GPU"
    gpus = two_gpus()[1:]
    gpus[0]["mig"] = []
    plugin = NvidiaPlugin(nvml=FakeNVML(gpus))
    assert plugin.discover() == []
    assert plugin.reason and "MIG mode with no MIG instance" in plugin.reason


def test_nvidia_skips_a_broken_gpu():
    class Flaky(FakeNVML):
        def nvmlDeviceGetUUID(self, h: dict[str, Any]) -> str | bytes:
            if h["uuid"] == "GPU-aaaa":
                raise pynvml.NVMLError_GpuIsLost()
            return super().nvmlDeviceGetUUID(h)

    nvml = Flaky(two_gpus())
    plugin = NvidiaPlugin(nvml=nvml)
    assert [d.uuid for d in plugin.discover()] == ["MIG-1111", "MIG-2222"]
    assert nvml.inits == nvml.shutdowns == 1


def test_nvidia_utilization():
    plugin = NvidiaPlugin(nvml=FakeNVML(two_gpus()))
    assert plugin.utilization("GPU-aaaa") == {"gpu_util": 37, "mem_used": GiB, "mem_total": 80 * GiB}
    assert plugin.utilization("MIG-2222") == {"gpu_util": None, "mem_used": 0, "mem_total": 10 * GiB}
    assert plugin.utilization("GPU-nope") is None


def test_nvidia_on_this_machine_never_raises():
    """The real pynvml: devices on a GPU machine, otherwise an empty list with a reason."""
    plugin = NvidiaPlugin()
    devices = plugin.discover()
    assert devices or (plugin.reason and plugin.reason.startswith("NVML"))


# --- nodes -------------------------------------------------------------------------------------


def test_describe_node_on_this_machine():
    node = describe_node()
    assert isinstance(node, NodeInfo)
    assert node.name and node.plugin == "nvidia"
    assert node.cpu >= 1 and node.mem > 0
    assert node.devices or node.reason


def test_describe_node_with_mock_devices_and_a_failing_plugin(caplog):
    class Broken(DevicePlugin):
        name = "broken"

        def discover(self) -> list[DeviceInfo]:
            raise RuntimeError("boom")

    mock = MockPlugin(devices=[{"model": "A100-80GB", "memory": "80g", "count": 2}], node="n1")
    no_gpu = NvidiaPlugin(nvml=FakeNVML([], init_error=pynvml.NVMLError_LibraryNotFound()))
    with caplog.at_level(logging.WARNING):
        node = describe_node("n1", plugins=[mock, no_gpu, Broken()])
    assert node.name == "n1" and node.plugin == "mock,nvidia,broken"
    assert [d.uuid for d in node.devices] == [mock_uuid("n1", 0), mock_uuid("n1", 1)]
    assert (
        node.reason
        == "nvidia: NVML not available: NVML Shared Library Not Found; broken: plugin failed: RuntimeError: boom"
    )
    assert "boom" in caplog.text
    data = node.to_dict()
    assert data["devices"][0]["memory_bytes"] == 80 * GiB and data["name"] == "n1"

    with pytest.raises(ValueError, match="same UUID"):
        describe_node("n1", plugins=[mock, mock])


def test_describe_node_with_no_plugins():
    node = describe_node("n2", plugins=[])
    assert node.devices == [] and node.reason == "no device plugins configured"


def _cgroup_fs(tmp_path: Path, self_cgroup: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    proc = tmp_path / "self-cgroup"
    proc.write_text(self_cgroup)
    return root, proc


def test_cgroup_v2_limits(tmp_path: Path):
    root, proc = _cgroup_fs(
        tmp_path,
        "0::/user.slice/job\n",
        {
            "user.slice/job/memory.max": "max\n",
            "user.slice/memory.max": str(4 * GiB),
            "user.slice/job/cpu.max": "150000 100000\n",
            "user.slice/cpu.max": "max 100000\n",
        },
    )
    assert cgroup_memory_limit(root, proc) == 4 * GiB
    assert cgroup_cpu_limit(root, proc) == Decimal("1.5")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24684084 kB\nMemFree: 1 kB\n")
    assert host_memory(meminfo, root, proc) == 4 * GiB
    cpu = host_cpu(root, proc)
    assert cpu == Decimal("1.5") or cpu == 1  # 1 when this process may only use one core anyway


def test_cgroup_v1_limits_and_no_limits(tmp_path: Path):
    root, proc = _cgroup_fs(
        tmp_path,
        "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n0::/\n",
        {
            "memory/memory.limit_in_bytes": str(2 * GiB),  # the container's own cgroup, mounted at the root
            "cpu,cpuacct/cpu.cfs_quota_us": "-1",
            "cpu,cpuacct/cpu.cfs_period_us": "100000",
        },
    )
    assert cgroup_memory_limit(root, proc) == 2 * GiB
    assert cgroup_cpu_limit(root, proc) is None
    root, proc = _cgroup_fs(
        tmp_path / "none", "4:memory:/\n", {"memory/memory.limit_in_bytes": "9223372036854771712"}
    )
    assert cgroup_memory_limit(root, proc) is None
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1024 kB\n")
    assert host_memory(meminfo, root, proc) == 1024 * 1024


# --- the real GPU ------------------------------------------------------------------------------


@pytest.mark.gpu
def test_real_nvml_finds_a_gpu():
    """Run on a GPU machine with ``pytest -m gpu``; deselected by default, fails where NVML finds nothing."""
    plugin = NvidiaPlugin()
    devices = plugin.discover()
    assert devices, f"no GPU found: {plugin.reason}"
    parents = {d.parent_uuid if d.kind == "mig" else d.uuid for d in devices}
    assert any(u.startswith("GPU-") for u in parents), parents
    assert all(d.memory_bytes > 0 and d.model for d in devices)
    usage = plugin.utilization(devices[0].uuid)
    assert usage is not None and usage["mem_total"] == devices[0].memory_bytes


@pytest.mark.gpu
def test_real_nvml_lists_processes_of_a_device():
    """On a GPU machine: the session's usage endpoint reads processes through this call."""
    plugin = NvidiaPlugin()
    devices = plugin.discover()
    assert devices, f"no GPU found: {plugin.reason}"
    procs = plugin.processes(devices[0].uuid)
    assert isinstance(procs, list)
    assert all(isinstance(p["pid"], int) and p["pid"] > 0 for p in procs)
