"""The Swarm backend: one Docker Swarm service per session, through dockerspawner's SwarmSpawner.

Swarm cannot hand a service specific GPUs, so labfleet keeps owning the allocator: the service's
placement picks the node and the device UUIDs, and ``LabfleetSwarmSpawner`` pins the service to
that node (``node.id==<swarm.node_id label>``) and names the devices in its environment, with the
pure :func:`labfleet.spawner.swarm_config.service_config`.

- The Hub runs on a manager node and talks to the swarm through its local engine (DockerSpawner's
  ``client_kwargs`` / $DOCKER_HOST).
- Node labels (``swarm.node_id``, ``address``) come from the labfleet service: the session's
  ``node_labels`` when it names them, else the node's ``labels`` in ``GET /nodes``; ``node_labels``
  here (config) covers nodes the service has no labels for.
- Networking: on the sessions' Swarm network (:mod:`labfleet.spawner.swarmnet`, ``network_name``, which
  ``labfleet node network`` makes on every node) the server listens on port 8888 of its container,
  its node publishes it, and the Hub connects to the node's ``address`` at that port; the session
  calls the Hub's API and the labfleet service through the Hub's public proxy at its bridge's
  gateway, and reaches nothing else of the cluster.  With ``network_name = "host"`` the server
  listens on the node's ``address`` on a random port, on the node's own network, and a warning
  says so at each spawn.
- Start: the task is followed until it runs; a task Swarm rejects or that fails ends the spawn with
  Swarm's own reason, and one that waits for a node ("no suitable node") ends it after
  ``task_pending_timeout``.
- End: the service has no restarts; ``poll()`` reads the task's exit code ("ExitCode=N"), the
  mixin reports it and frees the allocation, and the ended service is removed then (the Hub calls
  ``stop()``, which removes it otherwise, only for a server still running).
- Logs: the service's output is followed into the session's log file while it runs.
- Virtual folders: mounted at ``/vfolders/<name>`` in a small root-owned tmpfs of the task's, never
  inside the home; the session's server links ``~/vfolders`` there when it starts
  (``labfleet.session.homelink``), as in the Docker backend.
"""

from __future__ import annotations

import asyncio
import os
import time
from pprint import pformat
from typing import Any

import docker
from docker.types import ContainerSpec, EndpointSpec, Mount, Placement, RestartPolicy, TaskTemplate
from docker.utils import parse_repository_tag
from dockerspawner import SwarmSpawner
from jupyterhub.spawner import SpawnException
from jupyterhub.utils import random_port
from traitlets import Dict, Float, List, Unicode, default

from . import swarmnet
from .docker import lf_image_env
from .docker_config import gateway_environment
from .dockerlogs import follow_logs
from .homefolders import FOLDERS_ROOT
from .launch import LaunchSpec, with_caps
from .launch import Mount as LaunchMount
from .mixin import LabfleetSpawnerMixin
from .options import SessionOptions
from .swarm_config import SERVER_PORT, ServiceConfig, ServiceMount, published_port, service_config

SWARM_NO_MPS = (
    "the swarm backend cannot share the node's IPC namespace with its MPS daemon "
    "(not a service option before Docker API 1.44)"
)

NETWORK_ENV = "LABFLEET_SWARM_NETWORK"  # the default of network_name ("host": the nodes' own)
RUNNING = {"running"}
WAITING = {"new", "allocated", "pending", "assigned", "accepted", "preparing", "ready", "starting"}
FAILED = {"failed", "rejected", "orphaned", "remove", "shutdown", "complete"}


class TaskPollingSwarmSpawner(SwarmSpawner):
    """SwarmSpawner whose poll() tells the exit code of the service's ended task."""

    async def poll(self):
        """None while the task runs or waits; "ExitCode=N, State=..., Err=..." once it ended; 0 when
        there is no service (DockerSpawner's answer for a server that is gone)."""
        task = await self.get_task()
        if not task:
            return 0 if not self.object_id else "ExitCode=-1, State=gone, Err=the service has no task"
        st = task.get("Status", {})
        state = str(st.get("State", "")).lower()
        if state in RUNNING or state in WAITING:
            return None
        code = st.get("ContainerStatus", {}).get("ExitCode")
        return f"ExitCode={code if code is not None else -1}, State={state}, Err={st.get('Err') or ''}"


class LabfleetSwarmSpawner(LabfleetSpawnerMixin, TaskPollingSwarmSpawner):
    """labfleet sessions as Docker Swarm services (see the module doc)."""

    lf_in_container = True
    lf_session_links_folders = True  # folders at /vfolders/<name>, ~/vfolders links there

    container_user = Unicode(
        "1000:1000",
        help="""`uid:gid` the session's server runs as (it wins over a `user` in `extra_container_spec`).
        Sessions run with every capability dropped, so the server should be an unprivileged user; the
        labfleet images use jovyan (1000). Empty: the image's own USER. Only a numeric uid other than 0
        gets MPS: a node's MPS daemon serves one uid at a time and root could change its limits, so
        with an empty value, root or a user name (which each image maps to its own uid) a fraction
        holds by the framework caps alone, and the Hub's log and the session say why.""",
    ).tag(config=True)

    container_home = Unicode(
        "/home/jovyan",
        help="""The session user's home inside the container. Virtual folders are mounted at
        `/vfolders/<name>` (a small root-owned tmpfs of the container's), and the session links
        `<container_home>/vfolders` there when it starts: a home volume the user's sessions share
        holds no mount point of another session's.""",
    ).tag(config=True)

    extra_mounts: List[Any] = List(
        help="""Host folders to mount in every session, as {"source": "/abs/path", "target": "name or
        /abs/path", "mode": "ro"|"rw"|"wd"}. Every node must have the source at the same path (a
        shared filesystem): Swarm refuses a task whose bind source is missing on its node.""",
    ).tag(config=True)

    mps_pipe_dir = Unicode(
        "/tmp/nvidia-mps",
        help="""The NVIDIA MPS pipe directory used when the session's node reports none (its own
        daemon's is used where it reports one), bind-mounted into sessions with a fraction of a
        device when fractions are limited with MPS (LabfleetSpawnerMixin.mps).""",
    ).tag(config=True)

    node_labels: Dict[str, Any] = Dict(
        help="""Labels of nodes by labfleet node name, {"node-2": {"swarm.node_id": "...", "address":
        "10.0.0.2"}}, for nodes the labfleet service holds no such labels for (a node agent registers
        them). The service's labels win.""",
    ).tag(config=True)

    reserve_resources = Unicode(
        "yes",
        help="""`yes`: reserve the session's CPU and memory in Swarm too (Swarm then never overcommits a
        node either); `no`: limits only (when labfleet's view of a node's capacity is larger than what
        its engine reports, e.g. mock nodes).""",
    ).tag(config=True)

    task_pending_timeout = Float(
        60.0,
        help="""Seconds a session's task may wait for its node (Swarm's "no suitable node": the node is
        down, drained in Swarm, or short of what the task reserves) before the spawn fails.""",
    ).tag(config=True)

    no_new_privs_command = List(
        Unicode(),
        default_value=["setpriv", "--no-new-privs"],
        help="""Put before the server's command so that nothing in the session gains privileges
        through a setuid program (`no_new_privs`, which a Swarm service cannot ask of the engine
        before API 1.46). `setpriv` is util-linux's, in every Debian and Ubuntu image; `[]` for an
        image without it (its sessions then run without no_new_privs).""",
    ).tag(config=True)

    log_follow_timeout = Float(
        1.0,
        help="""Seconds to wait, once a session's service is removed, for its last output to reach the
        session log before the log stream is cut.""",
    ).tag(config=True)

    session_subnet = Unicode(
        help="""The sessions' addresses on every node (`labfleet node network --subnet`): the first is
        each node's bridge, the gateway where a session calls the Hub's public proxy. Default:
        $LABFLEET_SWARM_SESSION_SUBNET, else `10.215.0.0/16`.""",
    ).tag(config=True)

    @default("session_subnet")
    def _session_subnet_default(self) -> str:
        return os.environ.get("LABFLEET_SWARM_SESSION_SUBNET") or swarmnet.DEFAULT_SUBNET

    @default("network_name")
    def _network_name_default(self) -> str:
        return os.environ.get(NETWORK_ENV) or swarmnet.SWARM_NETWORK

    @default("ip")
    def _ip_default(self) -> str:
        return "127.0.0.1" if self.network_name == "host" else "0.0.0.0"

    # ------------------------------------------------------------------ state

    lf_service: ServiceConfig | None = None
    _lf_log_done: asyncio.Future | None = None
    _lf_task_error = ""
    _lf_container: str | None = None
    _lf_log_stream_client: docker.APIClient | None = None
    _lf_log_cut = False
    _lf_final_status: str | None = None

    # ------------------------------------------------------------------ launch

    def lf_session_home(self) -> str:
        return self.container_home

    def lf_mps_withheld(self) -> str | None:
        # MPS clients reach the daemon through the host's IPC namespace, which a service cannot
        # share on the engines labfleet supports (swarm_config.UNSUPPORTED): a client would wait on a
        # daemon it cannot reach.  Then the same rule on the user as Docker's.
        return SWARM_NO_MPS

    def lf_mounts(self, options: SessionOptions) -> tuple[LaunchMount, ...]:
        out = list(super().lf_mounts(options))
        for m in self.extra_mounts:
            target = str(m["target"])
            if not target.startswith("/"):
                target = f"{self.lf_session_home().rstrip('/')}/{target}"
            out.append(LaunchMount(source=str(m["source"]), target=target, mode=m.get("mode", "rw")))
        return tuple(out)

    async def lf_node_labels(self, node: str | None) -> dict[str, Any]:
        """The placed node's labels: the session's ``node_labels``, the service's node list, config."""
        if not node:
            raise RuntimeError("labfleet placed the session on no node")
        labels: dict[str, Any] = dict(self.node_labels.get(node) or {})
        session = self.lf_session or {}
        given = session.get("node_labels")
        if isinstance(given, dict) and given:
            return {**labels, **given}
        offset, limit = 0, 1000
        while True:
            reply = await self.lf_call("GET", f"/nodes?offset={offset}&limit={limit}")
            if not reply.ok or not isinstance(reply.data, list):
                if labels:
                    return labels
                raise RuntimeError(
                    f"cannot read node {node}'s labels from the labfleet service: {reply.code} {reply.message}"
                )
            for item in reply.data:
                if isinstance(item, dict) and item.get("name") == node:
                    found = item.get("labels")
                    return {**labels, **found} if isinstance(found, dict) else labels
            if len(reply.data) < limit:
                return labels
            offset += limit

    def lf_service_config(
        self, launch: LaunchSpec, labels: dict[str, Any], image_env: dict[str, str] | None = None
    ) -> ServiceConfig:
        return service_config(
            launch,
            labels,
            network_name=self.network_name,
            mps_pipe_dir=self.lf_mps_pipe_dir or self.mps_pipe_dir or None,
            user=self.container_user or None,
            reserve=self.reserve_resources != "no",
            image_env=image_env,
            folders_root=FOLDERS_ROOT,
        )

    async def lf_prepare(self, launch: LaunchSpec) -> None:
        labels = await self.lf_node_labels(launch.node)
        # The image's own settings, where the manager holds it (it is not pulled here: the node runs it).
        image_env = await lf_image_env(self, launch.image, pull=False) if launch.fractional else {}
        try:
            cfg = self.lf_service_config(launch, labels, image_env)
        except ValueError as e:
            raise RuntimeError(f"labfleet cannot run this session in Swarm: {e}") from None
        self.lf_service = cfg
        self._lf_task_error = ""
        self._lf_final_status = None
        self.image = cfg.image
        if self.network_name == "host":
            # The server shares its node's interfaces: it listens on the node's address, on a port of its own.
            self.log.warning(
                "labfleet: %s runs on its node's network (SwarmSpawner.network_name = 'host'): it can reach "
                "what listens on that node's loopback, the Hub's API and the labfleet service on the manager",
                self._log_name,
            )
            self.ip = cfg.address
            self.port = random_port()
        else:
            await self._lf_check_network()
            self.ip = "0.0.0.0"
            self.port = SERVER_PORT
        for name in cfg.dropped:
            self.log.debug(
                "labfleet: %s is not a Swarm service option: left out for %s", name, self._log_name
            )

    async def _lf_check_network(self) -> None:
        """The sessions' Swarm network must exist (``labfleet node network --manager``)."""
        try:
            found = await self.docker("inspect_network", self.network_name)
        except docker.errors.NotFound:
            found = None
        if not found or found.get("Scope") != "swarm":
            raise SpawnException(
                f"labfleet: the sessions' Swarm network {self.network_name!r} is missing: run `labfleet node "
                "network --proxy HOST:PORT --manager` on a manager and `labfleet node network --proxy HOST:PORT` "
                "on every node (see the README)",
                status_code=503,
                reason="session-network",
            )

    async def get_command(self):
        if not self.cmd:
            await self._image_on_manager()
        cmd = await super().get_command()
        prefix = list(self.no_new_privs_command)
        return [*prefix, *cmd] if prefix and cmd else cmd

    async def _image_on_manager(self) -> None:
        """The session's command is its image's, which the manager reads from its own engine: an image
        only the fleet's registry has (an environment saved on another node) is pulled here first."""
        try:
            await self.docker("inspect_image", self.image)
        except docker.errors.ImageNotFound:
            repo, tag = parse_repository_tag(self.image)
            self.log.info("labfleet: pulling %s on the manager to read its command", self.image)
            await self.docker("pull", repo, tag or "latest")

    async def check_allowed(self, image):
        # labfleet's service admitted the image for the session's project.
        if self.lf_launch is not None and self.lf_launch.image:
            return self.lf_launch.image
        return image

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        if self.lf_service is not None:
            # Its PyTorch allocator setting (ours merged with the image's) merges with the deployment's.
            env.update(with_caps(env, self.lf_service.env))
        if self.network_name != "host":
            # No route to the Hub's API nor to the service: both through the public proxy, at the gateway.
            # The proxy's port as the nodes reach it (the service's URL for sessions, else its public URL).
            _, port = self.lf_proxy_endpoint(self.session_service_url)
            gateway = swarmnet.gateway_url(self.session_subnet, port)
            env.update(gateway_environment(env, gateway, self.session_service_url or self.service_url))
        return env

    async def create_object(self):
        """The session's service, pinned to its node, with labfleet's limits, mounts and labels."""
        cfg = self.lf_service
        if cfg is None:
            raise RuntimeError("labfleet: create_object before lf_prepare")
        container_kwargs: dict[str, Any] = {
            "image": self.image,
            "env": self.get_env(),
            "args": await self.get_command(),
            "mounts": [_mount(m) for m in cfg.mounts],
            **cfg.container_spec,
        }
        container_kwargs.update(self.extra_container_spec)
        if "user" in cfg.container_spec:
            # The user labfleet judged (an MPS client's uid among them) is the one that runs.
            container_kwargs["user"] = cfg.container_spec["user"]
        task = TaskTemplate(
            container_spec=ContainerSpec(**container_kwargs),
            resources=dict(cfg.resources),
            restart_policy=RestartPolicy(condition="none"),
            placement=Placement(constraints=list(cfg.constraints)),
            networks=list(cfg.networks),
        )
        task.update(self.extra_task_spec)
        service = await self.docker(
            "create_service",
            task_template=task,
            endpoint_spec=EndpointSpec(**{**_endpoint_kwargs(cfg.endpoint), **self.extra_endpoint_spec}),
            name=self.service_name,
            labels=dict(cfg.labels),
        )
        return service

    async def start_object(self):
        """Wait until the session's task runs; fail with Swarm's reason when it cannot."""
        deadline = time.monotonic() + self.task_pending_timeout
        delay = 0.1
        while True:
            task = await self.get_task()
            state = (task or {}).get("Status", {}).get("State", "new").lower() if task else "new"
            err = (task or {}).get("Status", {}).get("Err") or ""
            if state in RUNNING:
                return
            if state in FAILED:
                raise RuntimeError(
                    f"Swarm did not run {self.service_name} on its node: {state}"
                    + (f": {err}" if err else f" ({pformat((task or {}).get('Status'))})")
                )
            if err:
                self._lf_task_error = err  # e.g. "no suitable node (...)": kept for the timeout's message
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the Swarm task of {self.service_name} was still {state} after {self.task_pending_timeout:.0f}s"
                    + (f": {self._lf_task_error}" if self._lf_task_error else "")
                )
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    async def get_ip_and_port(self):
        if self.network_name == "host":
            return self.ip, self.port
        # The node's address, at the port it published for the server (known once the task runs).
        cfg = self.lf_service
        deadline = time.monotonic() + 10
        while True:
            port = published_port(await self.get_task() or {})
            if port is not None and cfg is not None:
                return cfg.address, port
            if time.monotonic() > deadline:
                raise RuntimeError(f"Swarm published no port for {self.service_name}'s server")
            await asyncio.sleep(0.2)

    async def lf_task_container(self) -> str | None:
        task = await self.get_task()
        cid = (task or {}).get("Status", {}).get("ContainerStatus", {}).get("ContainerID")
        return str(cid) if cid else None

    async def start(self):
        url = await super().start()
        self._lf_container = await self.lf_task_container()
        self._lf_follow_logs()
        return url

    def lf_runtime(self) -> dict[str, Any] | None:
        """The task's container (on its node: that node's agent samples it)."""
        return {"container": self._lf_container} if self._lf_container else None

    # ------------------------------------------------------------------ logs

    def _lf_follow_logs(self) -> None:
        """Follow the service's output (from whichever node runs it) into the session log."""
        sid = self.object_id

        def stream(client: docker.APIClient) -> Any:
            return client.service_logs(sid, stdout=True, stderr=True, follow=True)

        follow_logs(self, "service", sid, stream)

    # ------------------------------------------------------------------ poll, stop

    async def poll(self):
        if self._lf_final_status is not None and not self.object_id:
            # We removed the ended service ourselves: keep answering with its exit status.
            return self._lf_final_status
        status = await super().poll()
        if isinstance(status, str) and self.object_id:
            # The server ended by itself (a batch command): its exit code is read and the allocation
            # given back (the mixin did both); the Hub will not call stop() for a server that is not
            # running, so the service goes now.
            self._lf_final_status = status
            try:
                await self.remove_object()
            except Exception:
                self.log.exception("labfleet: removing the ended service of %s failed", self._log_name)
            else:
                self.object_id = ""
        return status

    async def remove_object(self):
        done = self._lf_log_done
        try:
            await self.docker("remove_service", self.object_id)
        except docker.errors.NotFound:
            pass
        if done is not None and not done.done():
            try:
                await asyncio.wait_for(asyncio.shield(done), timeout=self.log_follow_timeout)
            except asyncio.TimeoutError:
                # A followed service log does not always end with its service: cut it.
                self._lf_log_cut = True
                client = self._lf_log_stream_client
                if client is not None:
                    client.close()
        self._lf_log_done = None
        self._lf_log_stream_client = None

    async def stop(self, now: bool = False):
        await super().stop(now=now)
        self._lf_container = None


def _mount(m: ServiceMount) -> Mount:
    """docker-py's Mount of a ServiceMount: a bind, or a tmpfs (the folders' root)."""
    if m.type == "tmpfs":
        return Mount(
            target=m.target, source=None, type="tmpfs", tmpfs_mode=m.tmpfs_mode, tmpfs_size=m.tmpfs_size
        )
    return Mount(target=m.target, source=m.source, type="bind", read_only=m.read_only)


def _endpoint_kwargs(endpoint: dict[str, Any]) -> dict[str, Any]:
    """docker-py's EndpointSpec(mode, ports) from the API's EndpointSpec (ports as the API's list)."""
    out: dict[str, Any] = {}
    if endpoint.get("Mode"):
        out["mode"] = endpoint["Mode"]
    if endpoint.get("Ports"):
        out["ports"] = list(endpoint["Ports"])
    return out
