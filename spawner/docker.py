"""The Docker backend: one container per session, through DockerSpawner.

``LabfleetDockerSpawner`` is the labfleet mixin (admission, queue, launch spec, release) on top
of DockerSpawner.  In ``lf_prepare`` it turns the placement's LaunchSpec into DockerSpawner's
settings with the pure :func:`labfleet.spawner.docker_config.container_config` (image, CPU and memory
limits, devices by UUID, mounts, hardening, labels), merged over what the deployment configured
for DockerSpawner (an admin's ``extra_host_config`` or ``volumes`` still apply; labfleet's
limits and hardening win).

- Networking: a session is a tenant.  Its container joins the sessions' bridge network
  (``network_name``, by default ``labfleet-sessions``, made when missing on ``session_subnet``
  with the Linux bridge ``session_bridge``), on which the control plane does not listen: the Hub's
  API, the labfleet service, the proxy's API stay on the host's loopback.  The spawner guards the
  network with :mod:`labfleet.spawner.sessionnet`'s nftables table (the same rules as local sessions'): a
  session reaches the Hub's public proxy at the bridge's address (the gateway) and, through the
  host, the internet; not the host's other ports, not other sessions (frames between two
  containers cross the host's firewall: ``br_netfilter``), not the ``session_egress_deny``
  networks.  Its environment points the Hub's API, the activity URL and the labfleet service at
  the gateway (:func:`labfleet.spawner.docker_config.gateway_environment`).  The server listens on the
  container's port 8888; the proxy connects to the container's address, which the session's
  runtime also reports (where the serving router can reach a replica).  ``network_name = "host"``,
  only where an operator sets it, shares the host's network (loopback included: a warning at each
  spawn); the server then listens on 127.0.0.1 on a random port of the host.
- Logs: while the container runs, its output is followed into the session's log file
  (``session_log_path``), which the labfleet service serves at ``/api/sessions/{id}/logs``.
- Virtual folders: bind-mounted at ``/vfolders/<name>``, in a small root-owned tmpfs of the
  container's, never inside the home; the session's server links ``~/vfolders`` there when it
  starts (``labfleet.session.homelink``), so a home volume the user's sessions share holds neither
  another session's mount points nor, after they stop, any of Docker's.
- End of a session: a batch command ends the server with the command's exit code; ``poll()``
  reads it from the exited container ("ExitCode=N"), reports it to the service (which frees the
  allocation), then removes the container (``remove = True``).  Containers are kept until their
  exit code was read: Docker's auto-remove would lose it.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Mapping
from copy import deepcopy
from typing import Any

import docker
from dockerspawner import DockerSpawner
from dockerspawner.dockerspawner import _deep_merge
from jupyterhub.spawner import SpawnException
from jupyterhub.utils import random_port
from traitlets import Float, List, Unicode, default

from labfleet.core.hubmap import DEFAULT_DOCKER_NETWORK, DOCKER_NETWORK_ENV

from . import sessionnet
from .docker_config import (
    HOST_NETWORK,
    ContainerConfig,
    container_config,
    gateway_environment,
    image_environment,
    network_bridge,
    session_network_spec,
)
from .dockerlogs import follow_logs
from .homefolders import FOLDERS_ROOT
from .launch import LaunchSpec, Mount, mps_withheld_for, with_caps
from .mixin import LabfleetSpawnerMixin

MOCK_UUID_PREFIX = "GPU-mock-"
DEFAULT_NETWORK = DEFAULT_DOCKER_NETWORK
DEFAULT_BRIDGE = "lfdock0"  # sessionnet: 1 to 9 characters
DEFAULT_SUBNET = "10.214.0.0/16"  # beside the local sessions' 10.213.0.0/16
# Session networks this Hub process has guarded: (nftables table, Docker network id, bridge ifindex).
# A network or bridge made again (Docker restarted, the network removed) is guarded again.
_GUARDED: set[tuple[str, str, int]] = set()


def _escape_template(value: str) -> str:
    """DockerSpawner formats volumes and create/host kwargs as templates ({username}, ...): keep
    our literal values literal."""
    return value.replace("{", "{{").replace("}", "}}")


def _escape_all(obj: Any) -> Any:
    """_escape_template over the strings of plain dicts and lists (labels, user, volume binds)."""
    if isinstance(obj, str):
        return _escape_template(obj)
    if isinstance(obj, dict):
        return {_escape_all(k): _escape_all(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_escape_all(v) for v in obj)
    return obj


class LabfleetDockerSpawner(LabfleetSpawnerMixin, DockerSpawner):
    """labfleet sessions as Docker containers (see the module doc)."""

    lf_in_container = True
    lf_session_links_folders = True  # folders at /vfolders/<name>, ~/vfolders links there

    gpu_driver = Unicode(
        "nvidia",
        help="""The Docker device driver that gives a session its GPUs, by UUID (`docker run --gpus
        device=UUID` does the same). Empty: request no device from Docker, only name them in the
        session's environment. Mock devices (UUIDs `GPU-mock-...`) are never requested.""",
    ).tag(config=True)

    mps_pipe_dir = Unicode(
        "/tmp/nvidia-mps",
        help="""The NVIDIA MPS pipe directory used when the session's node reports none (its own
        daemon's is used where it reports one). When sessions with a fraction of a device are limited
        with MPS (LabfleetSpawnerMixin.mps), it is bind-mounted into those sessions, which also share
        the host's IPC namespace with the MPS daemon.""",
    ).tag(config=True)

    container_user = Unicode(
        "1000:1000",
        help="""`uid:gid` the session's server runs as (`docker run --user`; it wins over a `user` in
        `extra_create_kwargs`). Sessions run with every capability dropped and no-new-privileges, so
        the server should be an unprivileged user; the labfleet images use jovyan (1000). Empty: the
        image's own USER. Only a numeric uid other than 0 gets MPS: a node's MPS daemon serves one uid
        at a time and root could change its limits, so with an empty value, root or a user name
        (which each image maps to its own uid) a fraction holds by the framework caps alone, and the
        Hub's log and the session say why.""",
    ).tag(config=True)

    container_home = Unicode(
        "/home/jovyan",
        help="""The session user's home inside the container: relative mount targets are under it. The
        session's virtual folders are mounted at `/vfolders/<name>` (a small root-owned tmpfs of
        the container's), and the session links `<container_home>/vfolders` there when it starts, so
        a home volume the user's sessions share (`volumes = {"home-{username}": "/home/jovyan"}`)
        holds no mount point of another session's.""",
    ).tag(config=True)

    extra_mounts: List[dict] = List(
        help="""Host folders to mount in every session, as {"source": "/abs/host/dir", "target": "name or
        /abs/path", "mode": "ro"|"rw"|"wd"}; a relative target is under `container_home`. The container
        user (`container_user`) must be allowed to write a rw or wd source on the host.""",
    ).tag(config=True)

    network_name = Unicode(
        help="""The Docker network sessions join. Default: $LABFLEET_DOCKER_NETWORK, else
        `labfleet-sessions`, a bridge network the spawner makes when it is missing (on
        `session_subnet`, with the Linux bridge `session_bridge`). Any network but `host` must be a
        bridge network whose Linux bridge has a name of 1 to 9 characters (the option
        `com.docker.network.bridge.name`) and whose gateway is its subnet's first address: the
        spawner guards it with an nftables table (sessions reach the Hub's public proxy at the
        gateway and the internet; not the host's other ports, not each other), which needs the Hub
        to run as root. `host`: the host's network, loopback included; every session can reach the
        Hub's API, the labfleet service and every port of the host (a warning at each spawn).""",
    ).tag(config=True)

    @default("network_name")
    def _network_name_default(self) -> str:
        return os.environ.get(DOCKER_NETWORK_ENV) or DEFAULT_NETWORK

    session_bridge = Unicode(
        help="""The Linux bridge of the sessions' network when the spawner makes it (1 to 9 lowercase
        letters and digits, starting with a letter). Default: $LABFLEET_DOCKER_SESSION_BRIDGE, else
        `lfdock0`.""",
    ).tag(config=True)

    @default("session_bridge")
    def _session_bridge_default(self) -> str:
        return os.environ.get("LABFLEET_DOCKER_SESSION_BRIDGE") or DEFAULT_BRIDGE

    session_subnet = Unicode(
        help="""The sessions' addresses (IPv4) when the spawner makes their network: the first is the
        bridge's (the gateway, where sessions call the Hub's public proxy), one per running session
        after it. Pick a range your network does not route. Default: $LABFLEET_DOCKER_SESSION_SUBNET,
        else `10.214.0.0/16`.""",
    ).tag(config=True)

    @default("session_subnet")
    def _session_subnet_default(self) -> str:
        return os.environ.get("LABFLEET_DOCKER_SESSION_SUBNET") or DEFAULT_SUBNET

    log_follow_timeout = Float(
        10.0,
        help="""Seconds to wait, once a session's container has stopped, for the rest of its output to
        reach the session log before the container is removed.""",
    ).tag(config=True)

    @default("remove")
    def _remove_default(self) -> bool:
        return True

    @default("ip")
    def _ip_default(self) -> str:
        # Host networking: the server shares the host's interfaces, so only loopback is bound.
        return "127.0.0.1" if self.network_name == HOST_NETWORK else "0.0.0.0"

    # ------------------------------------------------------------------ state

    lf_container: ContainerConfig | None = None
    lf_network: sessionnet.SessionNetwork | None = None  # the guarded network of this start
    lf_address: str | None = None  # the container's address on it
    _lf_configured: dict[str, Any] | None = None
    _lf_log_done: asyncio.Future | None = None
    _lf_log_stream_client: docker.APIClient | None = None
    _lf_log_cut = False
    _lf_final_status: str | None = None

    # ------------------------------------------------------------------ launch

    def lf_session_home(self) -> str:
        return self.container_home

    def lf_mps_withheld(self) -> str | None:
        # The container runs as container_user (labfleet's wins over the deployment's create kwargs).
        return mps_withheld_for(self.container_user or None)

    def lf_mounts(self, options) -> tuple[Mount, ...]:
        out = list(super().lf_mounts(options))
        for m in self.extra_mounts:
            target = str(m["target"])
            if not target.startswith("/"):
                target = f"{self.lf_session_home().rstrip('/')}/{target}"
            out.append(Mount(source=str(m["source"]), target=target, mode=m.get("mode", "rw")))
        return tuple(out)

    def _lf_snapshot_config(self) -> dict[str, Any]:
        """What the deployment configured for DockerSpawner, before labfleet sets anything."""
        if self._lf_configured is None:
            self._lf_configured = {
                "volumes": dict(self.volumes),
                "extra_host_config": self.extra_host_config,
                "extra_create_kwargs": self.extra_create_kwargs,
                "mem_limit": self.mem_limit,
                "cpu_limit": self.cpu_limit,
            }
        return self._lf_configured

    def lf_container_config(
        self, launch: LaunchSpec, image_env: Mapping[str, str] | None = None
    ) -> ContainerConfig:
        uuids = launch.gpu_uuids
        mock = bool(uuids) and all(u.startswith(MOCK_UUID_PREFIX) for u in uuids)
        return container_config(
            launch,
            network_name=self.network_name,
            mps_pipe_dir=self.lf_mps_pipe_dir or self.mps_pipe_dir or None,
            gpu_driver=None if mock else (self.gpu_driver or None),
            user=self.container_user or None,
            image_env=image_env,
            folders_root=FOLDERS_ROOT,
        )

    async def lf_prepare(self, launch: LaunchSpec) -> None:
        configured = self._lf_snapshot_config()
        # Only a fraction's caps merge with the image's own settings: no need to look at it otherwise.
        image_env = await lf_image_env(self, launch.image, pull=True) if launch.fractional else {}
        try:
            cfg = self.lf_container_config(launch, image_env)
        except ValueError as e:
            raise RuntimeError(f"labfleet cannot run this session in Docker: {e}") from None
        self.lf_container = cfg
        self._lf_final_status = None
        self.lf_address = None
        self.lf_network = await self.lf_session_network()
        self.image = cfg.image
        if cfg.cmd is not None:
            self.cmd = cfg.cmd
        self.mem_limit = cfg.mem_limit if cfg.mem_limit is not None else configured["mem_limit"]
        self.cpu_limit = cfg.cpu_limit if cfg.cpu_limit is not None else configured["cpu_limit"]
        self.volumes = {
            **configured["volumes"],
            **{_escape_template(k): _escape_all(v) for k, v in cfg.volumes.items()},
        }
        ours_host = {
            **cfg.extra_host_config,
            # Keep the container after it exits until poll() has read its exit code (then it is
            # removed): Docker's auto-remove would take the exit code of a batch command with it.
            "auto_remove": False,
        }
        self.extra_host_config = self._lf_merged(configured["extra_host_config"], ours_host)
        self.extra_create_kwargs = self._lf_merged(
            configured["extra_create_kwargs"], _escape_all(cfg.extra_create_kwargs)
        )
        if self.network_name == HOST_NETWORK:
            # Every server shares the host's ports: each gets its own.
            self.port = random_port()
        # The container's environment (spec.env and what running it needs, such as the MPS pipe
        # directory) reaches it through get_env().

    async def lf_session_network(self) -> sessionnet.SessionNetwork | None:
        """The sessions' network, made when missing and guarded (its nftables table, its bridge's
        settings); None on the host's network."""
        if self.network_name == HOST_NETWORK:
            self.log.warning(
                "labfleet: %s runs on the host's network: it can reach the Hub's API, the labfleet "
                "service and every port on the host's loopback (network_name = 'host')",
                self._log_name,
            )
            return None
        if os.geteuid() != 0:
            raise SpawnException(
                f"labfleet: the sessions' Docker network {self.network_name!r} is guarded with nftables, "
                "which needs the Hub to run as root (or set c.DockerSpawner.network_name = 'host': "
                "sessions then reach everything on the host's loopback)",
                status_code=503,
                reason="session-network",
            )
        proxy_host, proxy_port = self.lf_proxy_endpoint()
        network = await self._lf_docker_network(proxy_host, proxy_port)
        try:
            bridge, subnet = network_bridge(network)
            net = sessionnet.SessionNetwork.parse(
                bridge, subnet, proxy_host, proxy_port, self.session_egress_deny
            )
        except ValueError as e:
            raise SpawnException(
                f"labfleet: the sessions' network: {e}", status_code=500, reason="session-network"
            ) from None
        network_id = str(network.get("Id"))
        if (net.table, network_id, _ifindex(net.bridge)) not in _GUARDED:
            await _filter_bridged(net.bridge)
            await sessionnet.ensure(net)
            _GUARDED.add((net.table, network_id, _ifindex(net.bridge)))
        return net

    async def _lf_docker_network(self, proxy_host: str, proxy_port: int) -> dict[str, Any]:
        """``inspect_network`` of ``network_name``, made first when it is missing."""
        name = self.network_name
        try:
            return await self.docker("inspect_network", name)
        except docker.errors.NotFound:
            pass
        try:
            # What the operator configured is checked before Docker makes anything.
            sessionnet.SessionNetwork.parse(self.session_bridge, self.session_subnet, proxy_host, proxy_port)
            spec = session_network_spec(name, self.session_bridge, self.session_subnet)
        except ValueError as e:
            raise SpawnException(
                f"labfleet: the sessions' network: {e}", status_code=500, reason="session-network"
            ) from None
        self.log.info(
            "labfleet: making the sessions' Docker network %s (bridge %s, %s)",
            name,
            self.session_bridge,
            self.session_subnet,
        )
        try:
            await self.docker("create_network", **spec)
        except docker.errors.APIError as e:
            if e.status_code != 409:  # 409: another spawn made it meanwhile
                raise SpawnException(
                    f"labfleet: cannot make the sessions' Docker network {name!r}: {e.explanation or e}",
                    status_code=500,
                    reason="session-network",
                ) from None
        return await self.docker("inspect_network", name)

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        if self.lf_container is not None:
            # Its PyTorch allocator setting (ours merged with the image's) merges with the deployment's.
            env.update(with_caps(env, self.lf_container.environment))
        if self.lf_network is not None:
            # The session's network has no route to the host's loopback: the Hub's API and the
            # labfleet service are called through the Hub's public proxy, at the gateway.
            service = None if self.session_service_url else self.service_url
            env.update(gateway_environment(env, self.lf_network.hub_url, service))
        return env

    def _lf_merged(self, configured: Any, ours: dict[str, Any]):
        """DockerSpawner evaluates callables at create time: merge ours over the configured value then."""
        if not callable(configured):
            return _deep_merge(deepcopy(configured or {}), ours)

        async def merged(spawner):
            value = configured(spawner)
            if inspect.isawaitable(value):
                value = await value
            return _deep_merge(deepcopy(value or {}), ours)

        return merged

    async def check_allowed(self, image):
        # labfleet's service admitted the image for the session's project: DockerSpawner's own
        # allowed_images list does not apply.
        if self.lf_launch is not None and self.lf_launch.image:
            return self.lf_launch.image
        return image

    def lf_runtime(self) -> dict[str, Any] | None:
        """The container (the sampler reads the engine's stats of it) and its address on the
        sessions' network (the serving router calls a replica there)."""
        if not self.object_id:
            return None
        out: dict[str, Any] = {"container": self.object_id}
        if self.lf_address and self.network_name != HOST_NETWORK:
            out["address"] = self.lf_address
        return out

    async def get_ip_and_port(self):
        if self.network_name == HOST_NETWORK:
            ip = self.ip if self.ip not in ("", "0.0.0.0") else "127.0.0.1"
            return ip, self.port
        # The container's address on the sessions' network, whatever use_internal_ip says: no port
        # is published on the host.
        info = await self.docker("inspect_container", self.container_id)
        self.lf_address = self.get_network_ip(info["NetworkSettings"])
        return self.lf_address, self.port

    async def start(self):
        self._lf_final_status = None
        url = await super().start()
        self._lf_follow_logs()
        return url

    # ------------------------------------------------------------------ logs

    def _lf_follow_logs(self, since: int | None = None) -> None:
        """Follow the container's output into the session log (the stream ends when the container
        stops); ``_lf_log_done`` resolves then."""
        cid = self.object_id

        def stream(client: docker.APIClient) -> Any:
            return client.logs(cid, stdout=True, stderr=True, stream=True, follow=True, since=since)

        follow_logs(self, "container", cid, stream)

    async def _lf_logs_flushed(self) -> None:
        """Wait (bounded) for the log follower to write the container's last output."""
        done = self._lf_log_done
        if done is not None and not done.done():
            try:
                await asyncio.wait_for(asyncio.shield(done), timeout=self.log_follow_timeout)
            except asyncio.TimeoutError:
                self.log.warning("labfleet: the logs of %s did not end in time", self._log_name)

    # ------------------------------------------------------------------ poll, stop

    def lf_exit_code(self, status: Any) -> int | None:
        """DockerSpawner's poll status "ExitCode=N, Error=..., FinishedAt=..." as N. A container
        that is gone (DockerSpawner answers 0) has no known exit code."""
        if isinstance(status, int) and not isinstance(status, bool) and status == 0 and not self.object_id:
            return None
        return super().lf_exit_code(status)

    async def poll(self):
        if self._lf_final_status is not None and not self.object_id:
            # We removed the exited container ourselves: keep answering with its exit status.
            return self._lf_final_status
        status = await super().poll()
        if status is None:
            if self.object_id and (self._lf_log_done is None) and self.session_log_path is not None:
                # The Hub restarted while the container ran: follow its logs again from the last write.
                path = self.session_log_path
                since = int(path.stat().st_mtime) if path.exists() else None
                self._lf_follow_logs(since=since)
            return None
        if isinstance(status, str) and self.object_id and self.remove:
            # The server exited by itself (a batch command ended): its exit code is read, the
            # allocation given back (the mixin did both); now the container can go.
            self._lf_final_status = status
            try:
                await self.remove_object()
            except Exception:
                self.log.exception("labfleet: removing the exited container of %s failed", self._log_name)
            else:
                self.object_id = ""
        return status

    async def remove_object(self):
        await self._lf_logs_flushed()
        await super().remove_object()

    async def stop(self, now: bool = False):
        await super().stop(now=now)
        self._lf_log_done = None


def _ifindex(link: str) -> int:
    try:
        with open(f"/sys/class/net/{link}/ifindex") as f:
            return int(f.read())
    except (OSError, ValueError):
        return -1


async def lf_image_env(spawner: DockerSpawner, image: str | None, *, pull: bool) -> dict[str, str]:
    """The image's own environment, best effort ({} when Docker cannot tell): what a fractional session's
    framework caps merge with.  ``pull``: an image not here yet is pulled first, as ``start()`` would
    (by ``pull_policy``), else it is not looked for (a Swarm manager need not hold the nodes' images)."""
    if not image:
        return {}
    try:
        try:
            inspected = await spawner.docker("inspect_image", image)
        except docker.errors.NotFound:
            if not pull:
                return {}
            await spawner.pull_image(image)
            inspected = await spawner.docker("inspect_image", image)
    except docker.errors.DockerException as e:
        spawner.log.warning("labfleet: cannot read the environment of image %s: %s", image, e)
        return {}
    return image_environment(inspected)


async def _filter_bridged(bridge: str) -> None:
    """Sessions on ``bridge`` cross the firewall's forward hook (sessionnet.filter_bridged)."""
    try:
        await sessionnet.filter_bridged(bridge)
    except sessionnet.NetworkError as e:
        raise SpawnException(f"labfleet: {e}", status_code=503, reason="session-network") from None
