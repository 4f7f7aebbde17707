"""The MPS decision and backoff (pure): labfleet.compute.devices.mps."""

from __future__ import annotations

import pytest

from labfleet.compute.devices.base import DeviceInfo, NodeInfo
from labfleet.compute.devices.mps import MpsStatus, backoff, check_mode, decide, nvidia_devices

GPU = DeviceInfo(uuid="GPU-1", index=0, model="H200", memory_bytes=2**30)
MIG = DeviceInfo(uuid="MIG-1", index=0, model="H200 MIG", memory_bytes=2**30, kind="mig", parent_uuid="GPU-1")


def test_backoff_doubles_to_the_cap():
    assert [backoff(n, base=1, cap=10) for n in range(6)] == [0, 1, 2, 4, 8, 10]
    assert backoff(10_000, base=0.5, cap=300) == 300


def test_decide():
    assert decide("off", [GPU], "/bin/mps") == MpsStatus("off", "MPS is off on this node (mps=off)")
    assert decide("auto", [GPU], "/bin/mps") is None
    assert decide("on", [GPU], "/bin/mps") is None
    no_gpu = decide("auto", [], "/bin/mps")
    assert no_gpu is not None and no_gpu.state == "off" and "no NVIDIA GPU" in (no_gpu.reason or "")
    mig = decide("auto", [MIG], "/bin/mps")
    assert mig is not None and mig.state == "off" and "MIG" in (mig.reason or "")
    missing = decide("on", [GPU], None)
    assert missing is not None and missing.state == "failed" and "not on PATH" in (missing.reason or "")
    auto_missing = decide("auto", [GPU], None)
    assert auto_missing is not None and auto_missing.state == "off"
    required = decide("on", [], "/bin/mps")
    assert required is not None and required.state == "failed"
    mock_only = decide("auto", None, "/bin/mps")
    assert mock_only == MpsStatus("off", "the node does not use the nvidia device plugin")


def test_nvidia_devices_of_a_node():
    mock = DeviceInfo(uuid="GPU-mock-n1-0", index=0, model="A100", memory_bytes=1)
    assert nvidia_devices(NodeInfo("n1", 4, 1, [mock], plugin="mock")) is None
    assert nvidia_devices(NodeInfo("n1", 4, 1, [mock, GPU], plugin="mock,nvidia")) == [GPU]


def test_mode_is_checked():
    with pytest.raises(ValueError, match="auto, on, off"):
        check_mode("yes")
