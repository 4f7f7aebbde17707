"""A LaunchSpec as a Docker Swarm service: a pure builder, beside :mod:`labfleet.spawner.docker_config`.

Swarm cannot hand a service specific GPUs (moby/moby#40133: generic resources are counted, not
chosen), so labfleet keeps owning the allocator: its placement picks the node and the devices,
and :func:`service_config` pins the service to that node and names the devices.

- **Node**: the placement constraint ``node.id==<labels["swarm.node_id"]>`` of the placed node
  (the node agent registers each node with the labels ``swarm.node_id`` and ``address``).
- **GPUs**: ``NVIDIA_VISIBLE_DEVICES`` with the placement's UUIDs (the NVIDIA container runtime,
  the node's default runtime, exposes exactly those), plus the MPS variables and pipe directory
  for a fraction, as the Docker backend does.  Mock devices are only named.
- **Limits**: CPU and memory as limits and as reservations (so Swarm's own scheduler agrees with
  labfleet's), and the pids limit.
- **Hardening**: what Swarm services can express of the Docker backend's: every capability
  dropped, an init process, the pids limit, an unprivileged user.  ``no-new-privileges`` and the
  host IPC namespace (which MPS clients use) are not service options on engines before API 1.44 /
  at all: they are left out (listed in ``dropped``).
- **Mounts**: bind mounts of the same host paths as the Docker backend: every node must mount the
  storage at the same place (a shared filesystem).  With ``folders_root`` (``/vfolders``, where the
  spawner mounts the virtual folders) a tmpfs mount there, root-owned and mode 0755, as the Docker
  backend's: the folders' mount points are made in it, never in the home.
- **Network**: ``host``: the server listens on the node's ``address`` label, on the node's network;
  or the sessions' Swarm network (:mod:`labfleet.spawner.swarmnet`), where it listens on port
  :data:`SERVER_PORT` of its container, which the node publishes (host mode: on that node only, on
  a port Docker picks; a model-serving replica's port as itself); the Hub connects to the node's
  ``address`` at the published port.
- **Restarts**: none.  A session whose server exits has ended (a batch command's exit code is
  read from its task); Swarm must not start it again somewhere else.

No daemon, no I/O: :mod:`labfleet.spawner.swarm` turns the result into docker-py's types.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .docker_config import (
    FOLDERS_TMPFS_MODE,
    FOLDERS_TMPFS_SIZE,
    LABEL_PROJECT,
    LABEL_SESSION_ID,
    LABEL_USER,
    container_config,
)
from .launch import LaunchSpec

NODE_ID_LABEL = "swarm.node_id"
ADDRESS_LABEL = "address"
LABEL_NODE = "ai.labfleet.node"
# A Swarm node id: 25 lowercase letters and digits (base 36); accept any sane id of letters and digits.
_NODE_ID = re.compile(r"^[a-z0-9]{10,64}$")
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
NANO = 10**9
SERVER_PORT = 8888  # the server's port inside its container on the sessions' network
INFERENCE_PORT_ENV = "LABFLEET_INFERENCE_PORT"
# Docker options of the Docker backend that a Swarm service cannot set (API 1.41).
UNSUPPORTED = ("security_opt", "memswap_limit", "ipc_mode", "device_requests")


@dataclass(frozen=True)
class ServiceMount:
    """A mount of the service: a bind (docker-py's ``Mount(target, source, type="bind", read_only)``)
    or a tmpfs (``source`` empty, ``tmpfs_mode`` and ``tmpfs_size`` set)."""

    source: str
    target: str
    read_only: bool
    type: str = "bind"
    tmpfs_mode: int | None = None
    tmpfs_size: int | None = None


@dataclass(frozen=True)
class ServiceConfig:
    """The pieces of one session's Swarm service."""

    image: str
    node_id: str  # the Swarm node the service is pinned to
    address: str  # the node's address: where the server listens (host network) or is published
    constraints: list[str]
    env: dict[str, str]  # what the builder adds to the spawner's environment (the spec's, MPS)
    mounts: list[ServiceMount]
    # the API's TaskTemplate.Resources: {"Limits": {...}, "Reservations": {...}}
    resources: dict[str, Any]
    # keyword arguments of docker-py's ContainerSpec besides image, env, args and mounts
    container_spec: dict[str, Any]
    labels: dict[str, str]  # of the service and of its container
    networks: list[str]  # the task's networks: ["host"], or the sessions' Swarm network
    network_name: str
    # the API's EndpointSpec: {} on the host's network, else what the node publishes
    endpoint: dict[str, Any] = field(default_factory=dict)
    restart_policy: dict[str, Any] = field(default_factory=lambda: {"condition": "none"})
    # what the Docker backend sets that the service leaves out (see the module doc)
    dropped: tuple[str, ...] = ()


def node_placement(labels: Mapping[str, Any], node: str | None = None) -> tuple[str, str]:
    """``(swarm node id, address)`` from the placed node's labels; ValueError naming what is missing."""
    what = f"node {node!r}" if node else "the placed node"
    node_id = labels.get(NODE_ID_LABEL)
    if not isinstance(node_id, str) or not node_id:
        raise ValueError(
            f"{what} has no {NODE_ID_LABEL} label: register it with `labfleet agent` on a Swarm node "
            "(or label it) so labfleet knows which Swarm node it is"
        )
    if not _NODE_ID.match(node_id):
        raise ValueError(f"{what}: {NODE_ID_LABEL} {node_id[:80]!r} is not a Swarm node id")
    address = labels.get(ADDRESS_LABEL)
    if not isinstance(address, str) or not address:
        raise ValueError(f"{what} has no {ADDRESS_LABEL} label: where its sessions listen is unknown")
    try:
        ipaddress.ip_address(address)
    except ValueError:
        if not _HOSTNAME.match(address):
            raise ValueError(
                f"{what}: {ADDRESS_LABEL} {address[:80]!r} is not an IP address or a host name"
            ) from None
    return node_id, address


def published_port(task: Mapping[str, Any], target: int = SERVER_PORT) -> int | None:
    """The node's port for ``target`` in a running task (``Status.PortStatus``), None before."""
    ports = ((task.get("Status") or {}).get("PortStatus") or {}).get("Ports") or []
    for p in ports:
        if isinstance(p, Mapping) and p.get("TargetPort") == target and p.get("PublishedPort"):
            return int(p["PublishedPort"])
    return None


def service_config(
    spec: LaunchSpec,
    node_labels: Mapping[str, Any],
    *,
    network_name: str = "host",
    mps_pipe_dir: str | None = None,
    user: str | None = None,
    init: bool = True,
    reserve: bool = True,
    extra_labels: Mapping[str, str] | None = None,
    image_env: Mapping[str, str] | None = None,
    folders_root: str | None = None,
) -> ServiceConfig:
    """The Swarm service for ``spec`` on the node whose labfleet labels are ``node_labels``.

    ``network_name``: ``host`` or the sessions' Swarm network; ``mps_pipe_dir``: the
    nodes' MPS pipe directory (a fraction limited with MPS needs it); ``user``: ``uid:gid`` (a
    fraction limited with MPS needs a numeric uid other than 0, as in the Docker backend);
    ``reserve``: also reserve the CPU and memory (Swarm's scheduler then refuses to overcommit);
    ``folders_root``: where the spec's virtual folders are mounted (a tmpfs of the service's there).
    Raises ValueError for a spec or node a service cannot express.
    """
    node_id, address = node_placement(node_labels, spec.node)
    # The Docker backend's checks and translation (limits, mounts, devices, hardening): one source of truth.
    cfg = container_config(
        spec,
        network_name=network_name,
        mps_pipe_dir=mps_pipe_dir,
        gpu_driver=None,  # Swarm cannot request devices: the environment names them
        user=user,
        init=init,
        extra_labels=extra_labels,
        image_env=image_env,
        folders_root=folders_root,
    )
    host = cfg.extra_host_config
    env = dict(cfg.environment)
    # An inference command (a model-serving replica) listens on every interface of its node, so the
    # service reaches it at the node's address (hub_ext/serving/definition.py HOST_LINE).
    env["LABFLEET_INFERENCE_HOST"] = "0.0.0.0"
    mounts = [
        ServiceMount(source=source, target=bind["bind"], read_only=bind["mode"] == "ro")
        for source, bind in cfg.volumes.items()
    ]
    for target in host.get("tmpfs") or {}:  # the folders' root (Docker mounts it before the binds in it)
        mounts.insert(
            0,
            ServiceMount(
                source="",
                target=target,
                read_only=False,
                type="tmpfs",
                tmpfs_mode=FOLDERS_TMPFS_MODE,
                tmpfs_size=FOLDERS_TMPFS_SIZE,
            ),
        )
    limits: dict[str, Any] = {"Pids": int(host["pids_limit"])}
    reservations: dict[str, Any] = {}
    if cfg.cpu_limit is not None:
        limits["NanoCPUs"] = int(round(cfg.cpu_limit * NANO))
        if reserve:
            reservations["NanoCPUs"] = limits["NanoCPUs"]
    if cfg.mem_limit is not None:
        limits["MemoryBytes"] = int(cfg.mem_limit)
        if reserve:
            reservations["MemoryBytes"] = limits["MemoryBytes"]
    resources: dict[str, Any] = {"Limits": limits}
    if reservations:
        resources["Reservations"] = reservations
    container: dict[str, Any] = {
        "cap_drop": list(host["cap_drop"]),
        "init": bool(host["init"]),
    }
    labels = {**dict(cfg.extra_create_kwargs["labels"]), LABEL_NODE: spec.node or ""}
    container["labels"] = labels
    if user:
        container["user"] = user
    endpoint: dict[str, Any] = {}
    if network_name != "host":
        # Published on the node only (host mode; no ingress); the server on a port Docker picks, a
        # replica on the port the serving controller gave it (its route names the node and that port).
        ports = [{"Protocol": "tcp", "TargetPort": SERVER_PORT, "PublishMode": "host"}]
        inference = spec.env.get(INFERENCE_PORT_ENV, "")
        if inference.isdigit():
            port = int(inference)
            ports.append(
                {"Protocol": "tcp", "TargetPort": port, "PublishedPort": port, "PublishMode": "host"}
            )
        endpoint = {"Mode": "dnsrr", "Ports": ports}
    return ServiceConfig(
        image=cfg.image,
        node_id=node_id,
        address=address,
        constraints=[f"node.id=={node_id}"],
        env=env,
        mounts=mounts,
        resources=resources,
        container_spec=container,
        labels=labels,
        networks=[network_name],
        network_name=network_name,
        endpoint=endpoint,
        dropped=tuple(k for k in UNSUPPORTED if k in host),
    )


__all__ = [
    "ADDRESS_LABEL",
    "LABEL_NODE",
    "LABEL_PROJECT",
    "LABEL_SESSION_ID",
    "LABEL_USER",
    "NODE_ID_LABEL",
    "SERVER_PORT",
    "ServiceConfig",
    "ServiceMount",
    "node_placement",
    "published_port",
    "service_config",
]
