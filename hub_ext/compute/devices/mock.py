"""Mock devices: fake GPUs declared in configuration, for machines without one.

Like the mock accelerators GPU platforms ship for development, they let the whole product
(placement, quotas, the spawn form, dashboards) run on a laptop or CI machine::

    MockPlugin(devices=[{"model": "A100-80GB", "memory": "80g", "count": 2},
                        {"model": "T4", "memory": "16g"}], node="gpu-01")

gives devices 0 and 1 (A100-80GB) and 2 (T4).  UUIDs are ``GPU-mock-<hash>`` derived from the
node name and the index, so a restart reports the same ids.

Asked for utilization and processes (what a session's usage endpoint shows), a mock device is idle,
unless the JSON file named by ``$LABFLEET_MOCK_GPU_USAGE`` says otherwise, by UUID::

    {"GPU-mock-...": {"gpu_util": 40, "mem_used": 1073741824,
                      "processes": [{"pid": 12, "mem_used": 536870912, "gpu_util": 25}]}}
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from labfleet.compute.devices.base import DeviceInfo, DevicePlugin
from labfleet.core.slots import SlotError, parse_amount

_KEYS = frozenset({"model", "memory", "count"})
USAGE_ENV = "LABFLEET_MOCK_GPU_USAGE"
log = logging.getLogger(__name__)
MAX_MOCK_DEVICES = 1024  # per node; more is a typo


def mock_uuid(node: str, index: int) -> str:
    """The stable UUID of mock device ``index`` on ``node``."""
    digest = hashlib.sha256(f"labfleet-mock\0{node}\0{index}".encode()).hexdigest()
    return f"GPU-mock-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


class MockPlugin(DevicePlugin):
    """Declares ``count`` fake devices of each ``model`` with ``memory`` (``"80g"``, bytes, ...).

    ``node``: the node name the UUIDs derive from (default: this host's name).
    Bad configuration raises ``ValueError`` at construction, naming the entry and key at fault.
    """

    name: ClassVar[str] = "mock"

    def __init__(self, devices: Sequence[Mapping[str, Any]] = (), node: str | None = None) -> None:
        super().__init__()
        if node is not None and (not isinstance(node, str) or not node.strip()):
            raise ValueError(f"mock devices: node must be a non-empty string, not {node!r}")
        self.node: str = node or socket.gethostname()
        if isinstance(devices, (str, bytes, Mapping)) or not isinstance(devices, Sequence):
            raise ValueError(
                'mock devices: expected a list like [{"model": "A100-80GB", "memory": "80g", "count": 2}], '
                f"got {type(devices).__name__}"
            )
        self.specs: list[tuple[str, int, int]] = [self._spec(i, spec) for i, spec in enumerate(devices)]
        total = sum(count for _, _, count in self.specs)
        if total > MAX_MOCK_DEVICES:
            raise ValueError(f"mock devices: {total} devices on one node, more than {MAX_MOCK_DEVICES}")

    @staticmethod
    def _spec(i: int, spec: Any) -> tuple[str, int, int]:
        """Validate one ``{"model", "memory", "count"}`` entry into (model, bytes, count)."""
        where = f"mock devices[{i}]"
        if not isinstance(spec, Mapping):
            raise ValueError(f"{where}: expected a mapping with model, memory, count; got {spec!r}")
        unknown = sorted(str(k) for k in spec if k not in _KEYS)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: model, memory, count")
        model = spec.get("model")
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"{where}: model must be a non-empty string, e.g. 'A100-80GB'; got {model!r}")
        if "memory" not in spec:
            raise ValueError(f"{where}: memory is required, e.g. '80g'")
        try:
            memory = int(parse_amount("mem", spec["memory"]))
        except SlotError as e:
            raise ValueError(f"{where}: memory: {e}") from None
        if memory <= 0:
            raise ValueError(f"{where}: memory must be more than 0")
        count = spec.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int):
            raise ValueError(f"{where}: count must be a whole number, not {count!r}")
        if count < 0:
            raise ValueError(f"{where}: count must be 0 or more, not {count}")
        return model.strip(), memory, count

    def discover(self) -> list[DeviceInfo]:
        """The declared devices, indexed 0.. in declaration order."""
        devices = self._declared()
        if not devices:
            return self._nothing("no mock devices configured (devices=[] or every count is 0)")
        return self._found(devices)

    def _reading(self, uuid: str) -> dict[str, Any]:
        path = os.environ.get(USAGE_ENV)
        if not path:
            return {}
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            log.warning("mock devices: cannot read %s: %s", path, e)
            return {}
        entry = data.get(uuid) if isinstance(data, dict) else None
        return entry if isinstance(entry, dict) else {}

    def _memory_of(self, uuid: str) -> int | None:
        for d in self._declared():
            if d.uuid == uuid:
                return d.memory_bytes
        return None

    def _declared(self) -> list[DeviceInfo]:
        devices: list[DeviceInfo] = []
        for model, memory, count in self.specs:
            for _ in range(count):
                devices.append(DeviceInfo(mock_uuid(self.node, len(devices)), len(devices), model, memory))
        return devices

    def utilization(self, uuid: str) -> dict[str, int | None] | None:
        if not uuid.startswith("GPU-mock-"):
            return None
        reading = self._reading(uuid)
        return {
            "gpu_util": _int_or_none(reading.get("gpu_util", 0)),
            "mem_used": _int_or_none(reading.get("mem_used", 0)),
            "mem_total": _int_or_none(reading.get("mem_total", self._memory_of(uuid))),
        }

    def processes(self, uuid: str) -> list[dict[str, int | None]] | None:
        if not uuid.startswith("GPU-mock-"):
            return None
        rows = self._reading(uuid).get("processes") or []
        return [
            {
                "pid": _int_or_none(p.get("pid")),
                "mem_used": _int_or_none(p.get("mem_used")),
                "gpu_util": _int_or_none(p.get("gpu_util")),
            }
            for p in rows
            if isinstance(p, dict) and _int_or_none(p.get("pid")) is not None
        ]


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
