"""Placement of tasks on GPU nodes: pure, in-memory, deterministic.

See :mod:`labfleet.compute.scheduler.placement` for the API and the policies, and
:mod:`labfleet.compute.scheduler.fragmentation` for the fragmentation measure behind ``fgd``.
"""

from labfleet.compute.scheduler.fragmentation import TaskShape, Workload, node_fragmentation, shape_of
from labfleet.compute.scheduler.placement import (
    POLICIES,
    Cluster,
    Device,
    Node,
    Placement,
    PlacementError,
    Request,
    apply,
    place,
    release,
)

__all__ = [
    "POLICIES",
    "Cluster",
    "Device",
    "Node",
    "Placement",
    "PlacementError",
    "Request",
    "TaskShape",
    "Workload",
    "apply",
    "node_fragmentation",
    "place",
    "release",
    "shape_of",
]
