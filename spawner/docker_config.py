"""A LaunchSpec as a Docker container: a pure builder, in the style of KubeSpawner's ``make_pod``.

:func:`container_config` turns what the placement decided (:class:`~labfleet.spawner.launch.LaunchSpec`)
into the settings DockerSpawner takes (image, limits, volumes, host config, create kwargs).  No
daemon, no I/O: the Docker backend (:mod:`labfleet.spawner.docker`) applies the result.

Hardening that every session gets: all capabilities dropped, ``no-new-privileges``, a pids limit,
an init process (reaps the orphans of batch commands).  The server runs as an unprivileged user,
so it needs no capability back.  Devices are requested by UUID: Docker does not choose devices,
the placement does.  A fraction of a device is limited through MPS when the spec says so (the
client talks to the node's MPS daemon through its pipe directory and the host IPC namespace, and
runs as the one numeric non-root uid the node's sessions share: never as root, never as the image's
own user), else by the framework caps already in the spec's environment.

Virtual folders: with ``folders_root`` (the Docker backend's ``/vfolders``) the container gets a
small tmpfs there, owned by root and mode 0755, under which the folders are bind-mounted (Docker
mounts it first: mounts go parent before child).  The root exists with no folder too, and the
session cannot add to it; the session links ``~/vfolders`` to it (``labfleet.session.homelink``),
so a home volume the user's sessions share never gets mount points of Docker's.

Networking: a session joins ``network_name``.  ``host`` shares the host's network, its loopback
included (the Hub's API, the labfleet service): an operator's explicit choice.  Any other name is
a Docker bridge network for sessions (:func:`session_network_spec` makes it, :func:`network_bridge`
reads one that exists), which the Docker backend guards with :mod:`labfleet.spawner.sessionnet`'s nftables
table: its sessions reach the Hub's public proxy at the bridge's address and the internet, nothing
else of the host, and not each other.  They call the Hub and the labfleet service through that
proxy (:func:`gateway_environment`).  No port is published: the proxy connects to the container's
address on the network (or to the host's port, with host networking).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from labfleet.core.hubmap import SESSION_ID_LABEL as LABEL_SESSION_ID

from .launch import LaunchSpec, mps_withheld_for, with_caps

LABEL_USER = "ai.labfleet.user"
LABEL_PROJECT = "ai.labfleet.project"
MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
# Docker refuses a memory limit under 6 MiB.
MIN_MEM = 6 * 2**20
NO_NEW_PRIVILEGES = "no-new-privileges:true"
HOST_NETWORK = "host"
# A Docker bridge network's options: the Linux bridge's name (sessionnet's rules name it), and no
# traffic between its containers nor masquerading by Docker itself where Docker writes iptables
# rules (the nftables table refuses the one and does the other either way).
BRIDGE_NAME_OPTION = "com.docker.network.bridge.name"
ICC_OPTION = "com.docker.network.bridge.enable_icc"
MASQUERADE_OPTION = "com.docker.network.bridge.enable_ip_masquerade"
LABEL_SESSION_NETWORK = "ai.labfleet.session-network"
# The folders' root: a tmpfs that only holds the folders' mount points (Docker adds nosuid, nodev, noexec).
FOLDERS_TMPFS_MODE = 0o755
FOLDERS_TMPFS_SIZE = 2**20


@dataclass(frozen=True)
class ContainerConfig:
    """What DockerSpawner needs for one session (its trait names)."""

    image: str
    mem_limit: int | None  # bytes; None: no limit
    cpu_limit: float | None  # cores; None: no limit
    environment: dict[str, str]
    # DockerSpawner's form: {host_path: {"bind": container_path, "mode": "ro" | "rw"}}
    volumes: dict[str, dict[str, str]]
    # keyword arguments of docker-py's create_host_config
    extra_host_config: dict[str, Any]
    # keyword arguments of docker-py's create_container (labels, user)
    extra_create_kwargs: dict[str, Any]
    network_name: str
    # None: the image's own command.  Every session type runs the image's command: for batch and
    # inference sessions the runner inside (labfleet.session) reads LABFLEET_SESSION_TYPE and LABFLEET_COMMAND.
    cmd: list[str] | None = None


def _device_requests(uuids: list[str], driver: str) -> list[Any]:
    from docker.types import DeviceRequest  # docker-py: the `docker` extra

    return [DeviceRequest(driver=driver, device_ids=list(uuids), capabilities=[["gpu"]])]


def container_config(
    spec: LaunchSpec,
    *,
    network_name: str = "host",
    mps_pipe_dir: str | None = None,
    gpu_driver: str | None = "nvidia",
    user: str | None = None,
    init: bool = True,
    extra_labels: Mapping[str, str] | None = None,
    image_env: Mapping[str, str] | None = None,
    folders_root: str | None = None,
) -> ContainerConfig:
    """The container for ``spec``.

    - ``network_name``: the sessions' Docker network (the server listens on the container's port,
      the Hub's proxy connects to the container's address there), or ``host`` (the server listens
      on the host's loopback, the Hub connects to 127.0.0.1:port).
    - ``mps_pipe_dir``: the node's MPS pipe directory; needed when the spec limits a fraction of a
      device with MPS (``spec.mps``).
    - ``gpu_driver``: the device driver to ask Docker for (``nvidia``); None requests no device
      (devices Docker cannot give, such as mock devices: only the environment names them then).
    - ``user``: ``uid:gid`` to run as; None keeps the image's user.  A fraction limited with MPS
      needs a numeric non-root uid (:func:`~labfleet.spawner.launch.mps_withheld_for`).
    - ``image_env``: the image's own environment (:func:`image_environment`): a container's variable
      replaces the image's, so PyTorch's allocator setting of the image is merged under the cap here.
    - ``folders_root``: where the spec's virtual folders are mounted (``/vfolders``): a root-owned
      tmpfs of the container's there (see the module doc); None: none.

    Raises ValueError for a spec a container cannot express.
    """
    if not spec.image:
        raise ValueError(f"session {spec.session_id} has no image to run")
    if not network_name or not network_name.strip():
        raise ValueError("network_name must name a Docker network (the sessions' bridge network, or host)")
    if spec.cpu is not None and spec.cpu <= 0:
        raise ValueError(f"cpu limit must be more than 0, not {spec.cpu}")
    if spec.mem is not None and spec.mem < MIN_MEM:
        raise ValueError(f"memory limit {spec.mem} bytes is under Docker's minimum ({MIN_MEM} bytes)")
    if spec.pids_limit <= 0:
        raise ValueError(f"pids limit must be more than 0, not {spec.pids_limit}")
    if len(spec.gpus) > 1 and any(g.shares != 1 for g in spec.gpus):
        raise ValueError("a session has either whole devices or a fraction of one device, not both")
    if any(g.shares <= 0 or g.shares > 1 for g in spec.gpus):
        raise ValueError("a device share must be more than 0 and at most 1")
    if len(set(spec.gpu_uuids)) != len(spec.gpus):
        raise ValueError("the same device is assigned twice")
    use_mps = spec.mps and spec.fractional
    if use_mps and not mps_pipe_dir:
        raise ValueError("the spec limits a device fraction with MPS, but no MPS pipe directory is given")
    if mps_pipe_dir is not None and not mps_pipe_dir.startswith("/"):
        raise ValueError(f"the MPS pipe directory must be an absolute path, not {mps_pipe_dir!r}")
    if folders_root is not None and (not folders_root.startswith("/") or folders_root.rstrip("/") == ""):
        raise ValueError(f"the folders' root must be an absolute path other than /, not {folders_root!r}")
    withheld = mps_withheld_for(user) if use_mps else None
    if withheld:
        # The spawner withholds MPS from such a session (LabfleetSpawnerMixin.lf_mps_withheld).
        raise ValueError(f"the spec limits a device fraction with MPS, but {withheld}")

    environment = with_caps(image_env or {}, {str(k): str(v) for k, v in spec.env.items()})
    volumes: dict[str, dict[str, str]] = {}
    targets: set[str] = set()

    def bind(source: str, target: str, mode: str) -> None:
        if source in volumes:
            raise ValueError(f"host folder {source} is mounted twice (Docker binds a host path once)")
        if target in targets:
            raise ValueError(f"two mounts have the same target {target}")
        volumes[source] = {"bind": target, "mode": mode}
        targets.add(target)

    for m in spec.mounts:
        # wd (write + delete) is a writable mount to the kernel; the difference is labfleet's policy.
        bind(m.source, m.target, "ro" if m.read_only else "rw")

    host_config: dict[str, Any] = {
        "pids_limit": spec.pids_limit,
        "security_opt": [NO_NEW_PRIVILEGES],
        "cap_drop": ["ALL"],
        "network_mode": network_name,
        # Nothing published on the host's ports: the Hub's proxy connects to the container's address
        # on its network (with host networking the server is on a port of the host already).
        "port_bindings": None,
        "init": init,
    }
    if folders_root is not None:
        root = folders_root.rstrip("/")
        if root in targets:
            raise ValueError(f"a mount covers the folders' root {root}")
        host_config["tmpfs"] = {root: f"mode={FOLDERS_TMPFS_MODE:04o},size={FOLDERS_TMPFS_SIZE}"}
    if spec.mem is not None:
        # No swap beyond the limit (ignored by kernels without swap accounting).
        host_config["memswap_limit"] = spec.mem
    if spec.gpus and gpu_driver:
        host_config["device_requests"] = _device_requests(spec.gpu_uuids, gpu_driver)
    if use_mps:
        assert mps_pipe_dir is not None
        # MPS clients reach the daemon through its pipes and share its IPC namespace.
        bind(mps_pipe_dir, mps_pipe_dir, "rw")
        host_config["ipc_mode"] = "host"
        environment[MPS_PIPE_ENV] = mps_pipe_dir

    labels = {
        LABEL_SESSION_ID: spec.session_id,
        LABEL_USER: spec.user,
        LABEL_PROJECT: spec.project,
    }
    if extra_labels:
        labels = {**{str(k): str(v) for k, v in extra_labels.items()}, **labels}
    create_kwargs: dict[str, Any] = {"labels": labels}
    if user:
        create_kwargs["user"] = user

    return ContainerConfig(
        image=spec.image,
        mem_limit=spec.mem,
        cpu_limit=float(spec.cpu) if spec.cpu is not None else None,
        environment=environment,
        volumes=volumes,
        extra_host_config=host_config,
        extra_create_kwargs=create_kwargs,
        network_name=network_name,
        cmd=None,
    )


# ---------------------------------------------------------------- the sessions' network


def session_network_spec(name: str, bridge: str, subnet: str) -> dict[str, Any]:
    """Keyword arguments of docker-py's ``APIClient.create_network`` for the sessions' network: a
    bridge network whose Linux bridge is ``bridge``, on ``subnet``, its first address the gateway
    (where :mod:`labfleet.spawner.sessionnet` expects it). ValueError for a name or subnet that is not one."""
    if not name or not name.strip() or name == HOST_NETWORK:
        raise ValueError(f"{name!r} cannot name the sessions' network")
    options, ipam, labels = session_bridge_config(bridge, subnet)
    return {
        "name": name,
        "driver": "bridge",
        "options": options,
        "ipam": ipam,
        "labels": labels,
        "check_duplicate": True,
    }


def session_bridge_config(bridge: str, subnet: str) -> tuple[dict[str, str], dict[str, Any], dict[str, str]]:
    """The options, IPAM and labels of a sessions' bridge network (the Docker backend's, a Swarm
    node's config-only one): the Linux bridge ``bridge`` on ``subnet``, its first address the
    gateway, no inter-container traffic nor masquerade of Docker's own (labfleet.spawner.sessionnet guards
    it). ValueError for a subnet that is not one."""
    try:
        net = ipaddress.IPv4Network(subnet, strict=True)
    except ValueError as e:
        raise ValueError(f"session subnet {subnet!r}: {e}") from None
    options = {BRIDGE_NAME_OPTION: bridge, ICC_OPTION: "false", MASQUERADE_OPTION: "false"}
    ipam = {"Driver": "default", "Config": [{"Subnet": str(net), "Gateway": str(net.network_address + 1)}]}
    return options, ipam, {LABEL_SESSION_NETWORK: bridge}


def network_bridge(network: Mapping[str, Any]) -> tuple[str, str]:
    """The Linux bridge and the IPv4 subnet of a Docker network (as ``inspect_network`` answers),
    which the backend guards. ValueError for a network it cannot guard: not a bridge network, not
    exactly one IPv4 subnet, a gateway other than the subnet's first address."""
    name = network.get("Name") or network.get("Id", "?")
    driver = network.get("Driver")
    if driver != "bridge":
        raise ValueError(
            f"Docker network {name!r} is a {driver!r} network: labfleet keeps sessions apart on a bridge "
            "network only (or on the host's network, when network_name = 'host' says so)"
        )
    options = network.get("Options") or {}
    bridge = options.get(BRIDGE_NAME_OPTION) or "br-" + str(network.get("Id", ""))[:12]
    ipam = network.get("IPAM") or {}
    configs = [c for c in ipam.get("Config") or [] if ":" not in str(c.get("Subnet", ":"))]
    if len(configs) != 1:
        raise ValueError(f"Docker network {name!r} must have one IPv4 subnet, not {len(configs)}")
    try:
        net = ipaddress.IPv4Network(str(configs[0]["Subnet"]), strict=False)
    except ValueError as e:
        raise ValueError(f"Docker network {name!r}: {e}") from None
    gateway = str(configs[0].get("Gateway") or "").split("/")[0]
    if gateway and gateway != str(net.network_address + 1):
        raise ValueError(
            f"Docker network {name!r}: its gateway {gateway} is not the first address of {net}, where "
            "labfleet's sessions call the Hub"
        )
    return bridge, str(net)


def image_environment(inspected: Mapping[str, Any]) -> dict[str, str]:
    """An image's environment from Docker's ``inspect_image`` (``Config.Env``: ``NAME=value`` items)."""
    config = inspected.get("Config") or {}
    out: dict[str, str] = {}
    for item in config.get("Env") or []:
        name, sep, value = str(item).partition("=")
        if sep and name:
            out[name] = value
    return out


def gateway_environment(
    env: Mapping[str, str], gateway_url: str, service_url: str | None = None
) -> dict[str, str]:
    """What changes in a session's environment when it reaches the Hub only through the Hub's public
    proxy at ``gateway_url`` (``sessionnet.SessionNetwork.hub_url``): the Hub's API and activity
    URLs (JupyterHub points them at the Hub's own address, which the session cannot reach), and the
    labfleet service's URL when ``service_url`` (the URL the Hub itself uses) is given. Pure."""
    base = gateway_url.rstrip("/")
    out: dict[str, str] = {}
    api = env.get("JUPYTERHUB_API_URL")
    if api:
        out["JUPYTERHUB_API_URL"] = base + urlparse(api).path
        activity = env.get("JUPYTERHUB_ACTIVITY_URL", "")
        prefix = api.rstrip("/")
        if activity.startswith(prefix):
            out["JUPYTERHUB_ACTIVITY_URL"] = out["JUPYTERHUB_API_URL"].rstrip("/") + activity[len(prefix) :]
    if service_url:
        out["LABFLEET_SERVICE_URL"] = base + urlparse(service_url).path
    return out
