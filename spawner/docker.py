"""The Docker backend: one container per session, through DockerSpawner.

``LabfleetDockerSpawner`` is the labfleet mixin (admission, queue, launch spec, release) on top
of DockerSpawner.  In ``lf_prepare`` it turns the placement's LaunchSpec into DockerSpawner's
settings with the pure :func:`spawner.docker_config.container_config` (image, CPU and memory
limits, devices by UUID, mounts, hardening, labels), merged over what the deployment configured
for DockerSpawner (an admin's ``extra_host_config`` or ``volumes`` still apply; labfleet's
limits and hardening win).

- Networking: with ``network_name = "host"`` (the default here; the workplace's rule and the
  simplest single-machine set-up) each server listens on 127.0.0.1 on a random port of the host,
  and the Hub connects there.  With a Docker network (bridge, overlay) the server listens on its
  container's port 8888 and the Hub uses the container's address (DockerSpawner's own logic).
- Logs: while the container runs, its output is followed into the session's log file
  (``session_log_path``), which the labfleet service serves at ``/api/sessions/{id}/logs``.
- End of a session: a batch command ends the server with the command's exit code; ``poll()``
  reads it from the exited container ("ExitCode=N"), reports it to the service (which frees the
  allocation), then removes the container (``remove = True``).  Containers are kept until their
  exit code was read: Docker's auto-remove would lose it.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from copy import deepcopy
from typing import Any

import docker
from dockerspawner import DockerSpawner
from dockerspawner.dockerspawner import _deep_merge
from jupyterhub.utils import random_port
from traitlets import Float, List, Unicode, default

from .docker_config import ContainerConfig, container_config
from .dockerlogs import follow_logs
from .launch import LaunchSpec, Mount
from .mixin import LabfleetSpawnerMixin

MOCK_UUID_PREFIX = "GPU-mock-"


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

    gpu_driver = Unicode(
        "nvidia",
        help="""The Docker device driver that gives a session its GPUs, by UUID (`docker run --gpus
        device=UUID` does the same). Empty: request no device from Docker, only name them in the
        session's environment. Mock devices (UUIDs `GPU-mock-...`) are never requested.""",
    ).tag(config=True)

    mps_pipe_dir = Unicode(
        help="""The host's NVIDIA MPS pipe directory. When sessions with a fraction of a device are
        limited with MPS (LabfleetSpawnerMixin.mps), it is bind-mounted into those sessions, which
        also share the host's IPC namespace with the MPS daemon. Default: $CUDA_MPS_PIPE_DIRECTORY,
        else /tmp/nvidia-mps (the daemon's default).""",
    ).tag(config=True)

    @default("mps_pipe_dir")
    def _mps_pipe_dir_default(self) -> str:
        return os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"

    container_user = Unicode(
        "1000:1000",
        help="""`uid:gid` the session's server runs as (`docker run --user`). Sessions run with every
        capability dropped and no-new-privileges, so the server should be an unprivileged user; the
        labfleet images use jovyan (1000). Empty: the image's own USER.""",
    ).tag(config=True)

    container_home = Unicode(
        "/home/jovyan",
        help="""The session user's home inside the container: relative mount targets are under it, and
        the session's virtual folders are mounted at `<container_home>/vfolders/<name>`.""",
    ).tag(config=True)

    extra_mounts = List(
        help="""Host folders to mount in every session, as {"source": "/abs/host/dir", "target": "name or
        /abs/path", "mode": "ro"|"rw"|"wd"}; a relative target is under `container_home`. The container
        user (`container_user`) must be allowed to write a rw or wd source on the host.""",
    ).tag(config=True)

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
        return "127.0.0.1" if self.network_name == "host" else "0.0.0.0"

    # ------------------------------------------------------------------ state

    lf_container: ContainerConfig | None = None
    _lf_configured: dict[str, Any] | None = None
    _lf_log_done: asyncio.Future | None = None
    _lf_log_stream_client: docker.APIClient | None = None
    _lf_log_cut = False
    _lf_final_status: str | None = None

    # ------------------------------------------------------------------ launch

    def lf_session_home(self) -> str:
        return self.container_home

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

    def lf_container_config(self, launch: LaunchSpec) -> ContainerConfig:
        uuids = launch.gpu_uuids
        mock = bool(uuids) and all(u.startswith(MOCK_UUID_PREFIX) for u in uuids)
        return container_config(
            launch,
            network_name=self.network_name,
            mps_pipe_dir=self.mps_pipe_dir or None,
            gpu_driver=None if mock else (self.gpu_driver or None),
            user=self.container_user or None,
        )

    async def lf_prepare(self, launch: LaunchSpec) -> None:
        configured = self._lf_snapshot_config()
        try:
            cfg = self.lf_container_config(launch)
        except ValueError as e:
            raise RuntimeError(f"labfleet cannot run this session in Docker: {e}") from None
        self.lf_container = cfg
        self._lf_final_status = None
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
        if self.network_name == "host":
            # DockerSpawner publishes the server's port when use_internal_ip is off; Docker refuses
            # published ports on the host network (the server is on the host's own ports already).
            ours_host["port_bindings"] = None
        self.extra_host_config = self._lf_merged(configured["extra_host_config"], ours_host)
        self.extra_create_kwargs = self._lf_merged(
            configured["extra_create_kwargs"], _escape_all(cfg.extra_create_kwargs)
        )
        if self.network_name == "host":
            # Every server shares the host's ports: each gets its own.
            self.port = random_port()
        # The container's environment (spec.env and what running it needs, such as the MPS pipe
        # directory) reaches it through get_env().

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        if self.lf_container is not None:
            env.update(self.lf_container.environment)
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
        """The container: the sampler reads the engine's stats of it."""
        return {"container": self.object_id} if self.object_id else None

    async def get_ip_and_port(self):
        if self.network_name == "host":
            ip = self.ip if self.ip not in ("", "0.0.0.0") else "127.0.0.1"
            return ip, self.port
        return await super().get_ip_and_port()

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
