"""NVIDIA GPUs through NVML (``pynvml``, from the ``nvidia-ml-py`` distribution).

Every GPU is a device; a GPU in MIG mode is replaced by its MIG instances (``MIG-...`` UUIDs,
their own memory, the parent's index and ``parent_uuid``), since only those can run work.  No
driver, no library, no GPU: an empty list and a ``reason``, never an exception.

``pynvml`` is imported on first use, so importing this module never touches the driver.  Tests
pass a fake module with the same functions: ``NvidiaPlugin(nvml=fake)``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

from labfleet.compute.devices.base import DeviceInfo, DevicePlugin

log = logging.getLogger(__name__)


def _text(value: Any) -> str:
    """NVML strings are ``bytes`` in old pynvml versions, ``str`` in newer ones."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class NvidiaPlugin(DevicePlugin):
    """Discover NVIDIA GPUs and MIG instances with NVML.

    ``nvml``: the module to use (default: ``import pynvml`` on first use); it must provide
    ``NVMLError``, ``NVMLError_NotFound`` and the ``nvml*`` functions called here.
    """

    name: ClassVar[str] = "nvidia"

    def __init__(self, nvml: Any = None) -> None:
        super().__init__()
        self._nvml = nvml

    def _module(self) -> Any:
        if self._nvml is None:
            import pynvml  # lazy: only machines that look for GPUs need it

            self._nvml = pynvml
        return self._nvml

    @staticmethod
    def _shutdown(nvml: Any) -> None:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as e:
            log.debug("nvmlShutdown: %s", e)

    def discover(self) -> list[DeviceInfo]:
        """All GPUs (MIG instances instead of a GPU in MIG mode); empty with a reason if none."""
        try:
            nvml = self._module()
        except ImportError as e:
            return self._nothing(f"NVML not available: the nvidia-ml-py package is not installed ({e})")
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            return self._nothing(f"NVML not available: {e}")
        devices: list[DeviceInfo] = []
        problems: list[str] = []
        try:
            count = int(nvml.nvmlDeviceGetCount())
            for i in range(count):
                try:
                    devices.extend(self._describe(nvml, i))
                except nvml.NVMLError as e:
                    log.warning("nvidia: skipping GPU %d: %s", i, e)
                    problems.append(f"GPU {i}: {e}")
        except nvml.NVMLError as e:
            return self._nothing(f"NVML cannot count the GPUs: {e}")
        finally:
            self._shutdown(nvml)
        if devices:
            return self._found(devices)
        if count == 0:
            return self._nothing("NVML found no NVIDIA GPU")
        detail = "; ".join(problems) or "every GPU is in MIG mode with no MIG instance configured"
        return self._nothing(f"NVML found {count} GPU(s) but none usable: {detail}")

    def _describe(self, nvml: Any, i: int) -> list[DeviceInfo]:
        """GPU ``i``, or its MIG instances when MIG mode is on."""
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        model = _text(nvml.nvmlDeviceGetName(handle))
        memory = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
        if not self._mig_enabled(nvml, handle):
            return [DeviceInfo(uuid=uuid, index=i, model=model, memory_bytes=memory)]
        migs = []
        for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError_NotFound:
                continue  # an empty slot
            try:
                mig_model = _text(nvml.nvmlDeviceGetName(mig))
            except nvml.NVMLError:
                mig_model = f"{model} MIG"
            migs.append(
                DeviceInfo(
                    uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
                    index=i,
                    model=mig_model,
                    memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(mig).total),
                    kind="mig",
                    parent_uuid=uuid,
                )
            )
        if not migs:
            log.warning(
                "nvidia: GPU %d (%s) is in MIG mode but has no MIG instance: nothing to run on", i, uuid
            )
        return migs

    @staticmethod
    def _mig_enabled(nvml: Any, handle: Any) -> bool:
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError:  # NotSupported (no MIG on this GPU), FunctionNotFound (old driver)
            return False
        return bool(current == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1))

    def _on_device(self, uuid: str, what: str, read: Callable[[Any, Any], Any]) -> Any:
        """``read(nvml, handle)`` of the device with this UUID, between nvmlInit and nvmlShutdown;
        ``None`` when NVML or the device is not there."""
        try:
            nvml = self._module()
        except ImportError as e:
            log.debug("nvidia: no %s for %s: %s", what, uuid, e)
            return None
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:  # no GPU here: expected, and asked often, so quietly
            log.debug("nvidia: no %s for %s: NVML not available: %s", what, uuid, e)
            return None
        try:
            return read(nvml, nvml.nvmlDeviceGetHandleByUUID(uuid.encode()))
        except nvml.NVMLError as e:
            log.warning("nvidia: no %s for %s: %s", what, uuid, e)
            return None
        finally:
            self._shutdown(nvml)

    def utilization(self, uuid: str) -> dict[str, int | None] | None:
        """Now: ``{"gpu_util": percent or None, "mem_used": bytes, "mem_total": bytes}`` of the
        device (GPU or MIG instance) with this UUID; ``None`` when NVML or the device is not there.

        ``gpu_util`` is ``None`` where NVML does not measure it (MIG instances).
        """

        def read(nvml: Any, handle: Any) -> dict[str, int | None]:
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                gpu_util: int | None = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except nvml.NVMLError:
                gpu_util = None
            return {"gpu_util": gpu_util, "mem_used": int(mem.used), "mem_total": int(mem.total)}

        return self._on_device(uuid, "utilization", read)

    def processes(self, uuid: str) -> list[dict[str, int | None]] | None:
        """The compute processes on the device now, with their memory and (where NVML samples it) their
        SM utilization; ``None`` when NVML or the device is not there.

        Pids are the driver's: those of the node's PID namespace, which a session in a PID namespace of
        its own (a container, the local sandbox) cannot map to its own processes.
        """

        def read(nvml: Any, handle: Any) -> list[dict[str, int | None]]:
            running = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            try:
                samples: dict[int, int] | None = {
                    int(p.pid): int(p.smUtil) for p in nvml.nvmlDeviceGetProcessUtilization(handle, 0)
                }
            except nvml.NVMLError:  # NotFound: no sample yet; NotSupported: MIG and older GPUs
                samples = None
            out: list[dict[str, int | None]] = []
            for p in running:
                used = getattr(p, "usedGpuMemory", None)
                util = samples.get(int(p.pid), 0) if samples is not None else None
                out.append(
                    {"pid": int(p.pid), "mem_used": int(used) if used is not None else None, "gpu_util": util}
                )
            return out

        return self._on_device(uuid, "processes", read)
