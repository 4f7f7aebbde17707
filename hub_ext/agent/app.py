"""``labfleet agent``: the node agent. One runs on every node but the service's own.

It describes its node with the device plugins (the service's own code), registers it with the labfleet
service (``POST /api/agent/register``, authenticated with a node token), then heartbeats every
``heartbeat`` seconds (the service's answer says how many): it samples the sessions the service lists
on this node with the trusted sampler (:mod:`labfleet.usage.sampler`, the code the service runs on its
own node), and reports what it sees running, what ended and the readings. The service answers what it
believes runs here, and ``stop``: sessions this agent saw running that the service no longer holds
(after the node was LOST, say); the agent stops them (SIGTERM to a local session's process, ``docker
stop`` for a container); and ``kill``: processes of a session over its share of a GPU that the
service's backstop chose (:mod:`labfleet.usage.enforce`), each as (session, pid, its start time). The
agent SIGKILLs one only while it belongs to that session as it last sampled it (one of the session's
processes on its devices, by its tree or its container's cgroup) and still has that start time (a
reused pid is another process), and reports what it did (``kill_reports``, with the command line and
memory, or why not) in each heartbeat until the service's answer no longer hands that kill over (the
service took the report): a kill handed over again is not done twice. And ``commits``: Save as
environment for sessions of this node (:mod:`labfleet.agent.commits`), reported the same way. It
retries with backoff while the service is down, and exits cleanly on SIGTERM. It never touches the DB.

Exit status: 0 on SIGTERM/SIGINT, 1 when the service refuses the token, 2 for bad options or a
registration the service refuses (wrong node for the token, a device another node has, ...).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

from traitlets import Float, Unicode, default
from traitlets.config import Application, catch_config_error

from labfleet.agent.commits import Commits
from labfleet.compute.devices import DevicePlugin, describe_node, get_plugin
from labfleet.compute.devices.mps import (
    CONTROL_BINARY,
    DEFAULT_LOG_DIR,
    DEFAULT_PIPE_DIR,
    MPS_MODES,
    MpsStatus,
    MpsSupervisor,
    check_mode,
    node_mps,
    nvidia_devices,
)
from labfleet.core.envtraits import EnvError, document_env, load_env_fallbacks
from labfleet.core.http import ServiceError
from labfleet.usage.sampler import GpuProcess, Reading, Sampler, Target, kill_if_same, same_start

# A reading whose error says the session's process or container is gone (not that the engine did not
# answer): reported as ended once seen twice in a row.
GONE = ("is gone", "has exited", "no such container", "is not running")
GONE_TICKS = 2
MOCK_GPU = {"model": "A100-80GB", "memory": "80g"}


class Unreachable(Exception):
    """No answer from the service (down, restarting, 5xx): retry later."""


TOKEN_ENV = "LABFLEET_AGENT_TOKEN"  # the node token itself, when no --token-file (a secret: not an option)


def mock_devices_of(value: str) -> list[dict[str, Any]]:
    """``--mock-devices``: a count of mock 80 GB GPUs (``2``) or the service's JSON list."""
    value = value.strip()
    if not value:
        return []
    if value.isdigit():
        return [{**MOCK_GPU, "count": int(value)}] if int(value) else []
    try:
        parsed = json.loads(value)
    except ValueError:
        raise ValueError(f"--mock-devices must be a count or a JSON list, not {value!r:.60}") from None
    if not isinstance(parsed, list):
        raise ValueError("--mock-devices: the JSON must be a list of {model, memory, count}")
    return parsed


def reading_json(r: Reading) -> dict[str, Any]:
    out = asdict(r)
    out["gpus"] = [asdict(g) for g in r.gpus]
    if out["error"] is not None:
        out["error"] = out["error"][:1000]
    return out


def target_of(value: Any) -> Target | None:
    """A target from the service's answer, or None if it is not one."""
    if not isinstance(value, dict) or not isinstance(value.get("session_id"), str):
        return None
    pid, container, devices = value.get("pid"), value.get("container"), value.get("devices") or []
    return Target(
        value["session_id"],
        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        container=container if isinstance(container, str) else None,
        devices=tuple(d for d in devices if isinstance(d, str)),
    )


KillKey = tuple[str, int, float]  # (session, pid, start time) as the service handed it


def kill_order(value: Any) -> KillKey | None:
    """A kill from the service's answer, or None if it is not one."""
    if not isinstance(value, dict):
        return None
    sid, pid, started = value.get("session"), value.get("pid"), value.get("create_time")
    if not isinstance(sid, str) or isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return None
    if isinstance(started, bool) or not isinstance(started, (int, float)):
        return None
    return sid, pid, float(started)


def gpu_processes(readings: list[Reading]) -> dict[str, dict[int, GpuProcess]]:
    """Each live session's processes on its devices, by pid, as the sampler attributed them."""
    out: dict[str, dict[int, GpuProcess]] = {}
    for r in readings:
        if r.alive:
            out[r.session_id] = {p.pid: p for g in r.gpus for p in g.processes}
    return out


def kill_owned(key: KillKey, known: dict[str, dict[int, GpuProcess]]) -> dict[str, Any]:
    """Carry out one kill the service handed over: SIGKILL the pid only if it is one of the session's
    processes on its devices at the last sampling (``known``) with the start time the service gave,
    and still that process now. The report for the service."""
    sid, pid, started = key
    proc = known.get(sid, {}).get(pid)
    report: dict[str, Any] = {"session": sid, "pid": pid, "create_time": started, "killed": False}
    report["mem_bytes"] = proc.mem_bytes if proc is not None else None
    if sid not in known:
        report.update(cmdline="", error="the session was not sampled running on this node")
    elif proc is None or not same_start(proc.started, started):
        report.update(cmdline="", error="the pid is not one of the session's processes on its devices")
    else:
        killed, cmdline, error = kill_if_same(pid, started)
        report.update(killed=killed, cmdline=cmdline, error=error)
    return report


@document_env
class LabfleetAgent(Application):
    name = "labfleet-agent"
    description = """The labfleet node agent: registers this machine as a node with the labfleet service,
    heartbeats, and measures the sessions that run here. An option not given on the command line
    reads its environment variable."""

    service_url = Unicode(
        help="The labfleet service's API base, e.g. http://HUB:PORT/services/labfleet/api.",
    ).tag(config=True, env="LABFLEET_AGENT_SERVICE_URL")

    token_file = Unicode(
        help="""A file holding the node token (`labfleet node token create`). Or give the token itself
        in $LABFLEET_AGENT_TOKEN (never on the command line, where other users see it).""",
    ).tag(config=True, env="LABFLEET_AGENT_TOKEN_FILE")

    node_name = Unicode(help="This node's name (default: the host name).").tag(
        config=True, env="LABFLEET_AGENT_NODE"
    )

    @default("node_name")
    def _node_name(self):
        return socket.gethostname()

    resource_group = Unicode(
        help="""The resource group this node joins, when the token does not say (default: the node's
        group, else 'default').""",
    ).tag(config=True, env="LABFLEET_AGENT_RESOURCE_GROUP")

    device_plugins = Unicode(
        "mock",
        help="Device plugins, comma-separated: nvidia (NVML) and/or mock.",
    ).tag(config=True, env="LABFLEET_AGENT_DEVICE_PLUGINS")

    mock_devices = Unicode(
        help="""Mock devices: a count of 80 GB GPUs (2), or the service's JSON list
        [{"model": "A100-80GB", "memory": "80g", "count": 2}].""",
    ).tag(config=True, env=("LABFLEET_AGENT_MOCK_DEVICES", "LABFLEET_MOCK_DEVICES"))

    docker_host = Unicode(
        help="""The Docker engine of this node, e.g. unix:///var/run/docker.sock: the sampler reads
        containers' stats there, and when the engine is in a swarm the node gets the label
        swarm.node_id. Empty: no Docker.""",
    ).tag(config=True, env="DOCKER_HOST")

    address = Unicode(
        help="The IP address where sessions on this node are reached (label `address`).",
    ).tag(config=True, env="LABFLEET_AGENT_ADDRESS")

    mps = Unicode(
        "auto",
        help=f"""Whether this node runs its own NVIDIA MPS daemon, which limits the sessions that hold a
        fraction of a GPU: {" | ".join(MPS_MODES)}. auto: where the nvidia plugin finds GPUs MPS can
        share (not MIG instances) and nvidia-cuda-mps-control is on PATH; on: required (the node reports
        failed, with the reason, when it cannot run); off: never. The agent must run as root for the
        daemon to take per-session limits.""",
    ).tag(config=True, env="LABFLEET_AGENT_MPS")

    mps_binary = Unicode(
        CONTROL_BINARY,
        help="The MPS control binary: a name looked up on PATH, or a path.",
    ).tag(config=True)

    mps_pipe_dir = Unicode(
        DEFAULT_PIPE_DIR,
        help="""The MPS daemon's own pipe directory ($CUDA_MPS_PIPE_DIRECTORY of the daemon and of its
        clients; reported to the service, which gives it to the sessions placed here).""",
    ).tag(config=True, env="LABFLEET_AGENT_MPS_PIPE_DIR")

    mps_log_dir = Unicode(
        DEFAULT_LOG_DIR,
        help="The MPS daemon's own log directory ($CUDA_MPS_LOG_DIRECTORY).",
    ).tag(config=True, env="LABFLEET_AGENT_MPS_LOG_DIR")

    heartbeat = Float(10.0, help="Seconds between heartbeats until the service's answer says otherwise.").tag(
        config=True
    )
    request_timeout = Float(10.0, help="Seconds to wait for the service's answer to one request.").tag(
        config=True
    )

    aliases = {
        "service-url": "LabfleetAgent.service_url",
        "token-file": "LabfleetAgent.token_file",
        "node-name": "LabfleetAgent.node_name",
        "resource-group": "LabfleetAgent.resource_group",
        "device-plugins": "LabfleetAgent.device_plugins",
        "mock-devices": "LabfleetAgent.mock_devices",
        "docker-host": "LabfleetAgent.docker_host",
        "address": "LabfleetAgent.address",
        "heartbeat": "LabfleetAgent.heartbeat",
        "mps": "LabfleetAgent.mps",
        "mps-binary": "LabfleetAgent.mps_binary",
        "mps-pipe-dir": "LabfleetAgent.mps_pipe_dir",
        "mps-log-dir": "LabfleetAgent.mps_log_dir",
        "log-level": "Application.log_level",
    }

    @default("log_level")
    def _log_level(self):
        return logging.INFO

    @classmethod
    def help_text(cls) -> str:
        lines = ["Usage: labfleet agent [options]", "", " ".join(cls.description.split()), "", "Options:"]
        for alias, target in cls.aliases.items():
            trait = cls.class_traits().get(target.split(".")[1]) if target.startswith(cls.__name__) else None
            text = " ".join(
                (trait.help if trait is not None else "The log level (DEBUG, INFO, ...).").split()
            )
            lines.append(f"  --{alias}=VALUE")
            lines.append(f"      {text}")
        lines += [
            "",
            "Example:",
            "  labfleet agent --service-url http://10.0.0.1:8000/services/labfleet/api \\",
            "      --token-file /etc/labfleet/node-token --node-name gpu-02 --device-plugins nvidia",
        ]
        return "\n".join(lines)

    @catch_config_error
    def initialize(self, argv=None) -> None:
        self.parse_command_line(argv)
        try:  # the environment, for what the command line did not set
            load_env_fallbacks(self, self.config.get(type(self).__name__, {}))
        except EnvError as e:
            self.log.critical("labfleet agent: %s", e)
            self.exit(2)
        problems = []
        if not self.service_url:
            problems.append("--service-url (or $LABFLEET_AGENT_SERVICE_URL) is required")
        self.token = ""
        if self.token_file:
            try:
                self.token = Path(self.token_file).read_text().strip()
            except OSError as e:
                problems.append(f"cannot read --token-file {self.token_file}: {e.strerror}")
        else:
            self.token = os.environ.get(TOKEN_ENV, "").strip()
        if not self.token and not problems:
            problems.append("a node token is required: --token-file or $LABFLEET_AGENT_TOKEN")
        self.plugins: list[DevicePlugin] = []
        try:
            mock = mock_devices_of(self.mock_devices)
            for name in [p.strip() for p in self.device_plugins.split(",") if p.strip()]:
                self.plugins.append(
                    get_plugin(name, devices=mock, node=self.node_name)
                    if name == "mock"
                    else get_plugin(name)
                )
        except (ValueError, KeyError, LookupError) as e:
            problems.append(f"device plugins: {e}")
        try:
            check_mode(self.mps)
        except ValueError as e:
            problems.append(f"--mps: {e}")
        if problems:
            for p in problems:
                self.log.error("labfleet agent: %s", p)
            self.exit(2)
        if self.docker_host:
            os.environ["DOCKER_HOST"] = self.docker_host  # the sampler's docker.from_env() reads it
        self.base = self.service_url.rstrip("/")
        self.stopping = threading.Event()
        self.sampler = Sampler(self.plugins)
        self.targets: dict[str, Target] = {}  # what the service listed on this node last
        self.gone: dict[str, int] = {}  # session -> ticks in a row it read gone
        self.reported: set[str] = set()  # sessions already reported ended
        self.gpu_procs: dict[str, dict[int, GpuProcess]] = {}  # at the last sampling, for the kills
        self.kill_reports: dict[KillKey, dict[str, Any]] = {}  # kills done, until the service takes them
        self.mps_status = MpsStatus("off", "not started yet")
        self.mps_supervisor: MpsSupervisor | None = None
        self.commits = Commits(self.docker_client, self.log)  # Save as environment, handed over

    def docker_client(self) -> Any:
        import docker

        return docker.DockerClient(base_url=self.docker_host or None, version="auto", timeout=120)

    # ------------------------------------------------------------ talking to the service

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.base}{path}",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.request_timeout) as reply:
                answer = json.loads(reply.read() or b"{}")
        except urllib.error.HTTPError as e:
            try:
                message = json.loads(e.read() or b"{}").get("message", "")
            except (ValueError, AttributeError):
                message = ""
            if e.code >= 500 or e.code == 429:
                raise Unreachable(f"the service answered {e.code} {message}".strip()) from None
            raise ServiceError(message or e.reason, e.code) from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise Unreachable(str(getattr(e, "reason", e))) from None
        if not isinstance(answer, dict):
            raise Unreachable("the service's answer is not a JSON object")
        return answer

    def labels(self) -> dict[str, str]:
        out = {}
        if self.address:
            out["address"] = self.address
        node_id = self.swarm_node_id()
        if node_id:
            out["swarm.node_id"] = node_id
        return out

    def swarm_node_id(self) -> str | None:
        """The Swarm node id of this node's Docker engine (`docker info`), when it is in a swarm."""
        if not self.docker_host:
            return None
        try:
            import docker

            client = docker.DockerClient(base_url=self.docker_host, version="auto", timeout=10)
            try:
                swarm = client.info().get("Swarm") or {}
            finally:
                client.close()
        except Exception as e:  # no engine, no docker package: no label
            self.log.warning("Could not read `docker info` from %s: %s", self.docker_host, e)
            return None
        if swarm.get("LocalNodeState") == "active" and swarm.get("NodeID"):
            return str(swarm["NodeID"])
        return None

    def start_mps(self, node: Any) -> None:
        """Start this node's MPS daemon where its setting and its GPUs say so (once)."""
        if self.mps_supervisor is not None:
            return
        self.mps_status, self.mps_supervisor = node_mps(
            self.mps,
            nvidia_devices(node),
            binary=self.mps_binary,
            pipe_dir=self.mps_pipe_dir,
            log_dir=self.mps_log_dir,
        )
        self.log.info(
            "MPS on node %s: %s%s",
            self.node_name,
            self.mps_status.state,
            f" ({self.mps_status.reason})" if self.mps_status.reason else "",
        )

    def check_mps(self) -> None:
        """Restart a dead MPS daemon (with backoff); keep its state for the next report."""
        if self.mps_supervisor is not None:
            self.mps_status = self.mps_supervisor.check()

    def register(self) -> dict[str, Any]:
        node = describe_node(self.node_name, self.plugins)
        self.start_mps(node)
        info = node.to_dict()
        body: dict[str, Any] = {
            "node": self.node_name,
            "cpu": info["cpu"],
            "mem": info["mem"],
            "devices": info["devices"],
            "plugin": info["plugin"],
            "labels": self.labels(),
            "mps": self.mps_status.to_dict(),
        }
        if self.resource_group:
            body["resource_group"] = self.resource_group
        answer = self.call("/agent/register", body)
        self.log.info(
            "Registered node %s (%d device(s)) in resource group %s",
            self.node_name,
            len(info["devices"]),
            answer.get("resource_group"),
        )
        return answer

    def beat(self) -> dict[str, Any]:
        targets = list(self.targets.values())
        readings = self.sampler.sample(targets) if targets else []
        running, ended = [], []
        for r in readings:
            if r.alive:
                running.append(r.session_id)
                self.gone.pop(r.session_id, None)
            elif r.error and any(g in r.error for g in GONE) and r.session_id not in self.reported:
                self.gone[r.session_id] = self.gone.get(r.session_id, 0) + 1
                if self.gone[r.session_id] >= GONE_TICKS:
                    ended.append({"session": r.session_id, "exit_code": None})
                    self.reported.add(r.session_id)
        self.gpu_procs = gpu_processes(readings)
        self.check_mps()
        body: dict[str, Any] = {
            "node": self.node_name,
            "running": running,
            "ended": ended,
            "readings": [reading_json(r) for r in readings],
            "mps": self.mps_status.to_dict(),
        }
        if self.kill_reports:  # only then: a service that hands over no kill knows no such field
            body["kill_reports"] = list(self.kill_reports.values())
        commit_reports = self.commits.reports()
        if commit_reports:  # the same: only for a service that handed a commit over
            body["commit_reports"] = commit_reports
        return self.call("/agent/heartbeat", body)

    def apply(self, answer: dict[str, Any]) -> None:
        beat = answer.get("heartbeat")
        if isinstance(beat, (int, float)) and not isinstance(beat, bool) and 0.1 <= beat <= 3600:
            self.heartbeat = float(beat)
        listed = [t for t in (target_of(v) for v in answer.get("sessions") or []) if t is not None]
        stop = [s for s in answer.get("stop") or [] if isinstance(s, str)]
        known = {**self.targets, **{t.session_id: t for t in listed}}
        self.targets = {t.session_id: t for t in listed}
        self.gone = {k: v for k, v in self.gone.items() if k in self.targets}
        self.reported &= set(self.targets)
        for sid in stop:
            self.stop_session(known.get(sid), sid)
        self.kill(answer.get("kill") or [])
        self.commits.apply(answer.get("commits") or [])

    def kill(self, handed: Any) -> None:
        """The kills the service handed over: a report it no longer hands over was taken; a kill
        already done is reported again, not done again."""
        items = handed if isinstance(handed, list) else []
        keys = [k for k in (kill_order(v) for v in items) if k is not None]
        self.kill_reports = {k: v for k, v in self.kill_reports.items() if k in keys}
        live = {sid: procs for sid, procs in self.gpu_procs.items() if sid in self.targets}
        for key in keys:
            if key in self.kill_reports:
                continue
            report = self.kill_reports[key] = kill_owned(key, live)
            if report["killed"]:
                self.log.warning(
                    "Killed process %d (%s) of session %s: over its share of a GPU",
                    key[1],
                    report["cmdline"][:200],
                    key[0],
                )
            else:
                self.log.warning("Did not kill process %d of session %s: %s", key[1], key[0], report["error"])

    def stop_session(self, target: Target | None, sid: str) -> None:
        """Stop a session the service no longer holds (it ended it while this node was LOST)."""
        if target is None:
            return
        self.log.warning("Stopping session %s: the service no longer holds it on this node", sid)
        try:
            if target.pid is not None:
                os.kill(target.pid, signal.SIGTERM)
            elif target.container is not None:
                client = self.docker_client()
                try:
                    client.containers.get(target.container).stop(timeout=10)
                finally:
                    client.close()
        except ProcessLookupError:
            pass
        except Exception as e:
            self.log.warning("Could not stop session %s: %s", sid, e)

    # ------------------------------------------------------------ the loop

    def run_loop(self) -> int:
        """Register, then heartbeat until stopped; the exit status."""
        registered = False
        backoff = 1.0
        while not self.stopping.is_set():
            try:
                if not registered:
                    self.apply(self.register())
                    registered = True
                else:
                    self.apply(self.beat())
                backoff = 1.0
                wait = self.heartbeat
            except Unreachable as e:
                self.log.warning("The service is unreachable (%s): retrying in %g s", e, backoff)
                wait, backoff = backoff, min(backoff * 2, max(self.heartbeat, 1.0))
            except ServiceError as e:
                if e.status == 401:
                    self.log.error("The service refused the node token: %s", e.message)
                    return 1
                if not registered:
                    self.log.error("The service refused to register node %s: %s", self.node_name, e.message)
                    return 2
                if e.status in (403, 404):
                    self.log.warning(
                        "The service does not know this node as ours (%s): registering again", e.message
                    )
                    registered = False
                    wait = 0.0
                else:
                    self.log.error("The service refused a heartbeat: %s", e.message)
                    wait = self.heartbeat
            self.stopping.wait(wait)
        return 0

    def start(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stopping.set())
        self.log.info("labfleet agent for node %s, service %s", self.node_name, self.base)
        started = time.monotonic()
        try:
            code = self.run_loop()
        finally:
            if self.mps_supervisor is not None:
                self.mps_supervisor.stop()
        self.sampler.close()
        self.log.info("labfleet agent stopping after %.0f s", time.monotonic() - started)
        self.exit(code)


def main(argv=None) -> None:
    app = LabfleetAgent.instance()
    app.initialize(argv)
    app.start()


if __name__ == "__main__":
    main()
