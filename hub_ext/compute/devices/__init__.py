"""Device plugins: discover a node's accelerators (NVIDIA via NVML, or mock devices from config).

See :mod:`labfleet.compute.devices.base` for the interface and the registry.
"""

from labfleet.compute.devices.base import (
    ENTRY_POINT_GROUP,
    DeviceInfo,
    DevicePlugin,
    NodeInfo,
    available_plugins,
    describe_node,
    get_plugin,
    host_cpu,
    host_memory,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "DeviceInfo",
    "DevicePlugin",
    "NodeInfo",
    "available_plugins",
    "describe_node",
    "get_plugin",
    "host_cpu",
    "host_memory",
]
