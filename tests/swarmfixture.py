"""Two real Docker Swarm nodes on this machine and a real Hub with the swarm backend, for tests.

- :func:`swarm_up` runs ``scripts/build-image.sh`` and ``scripts/swarm.sh`` (idempotent): node 1 is
  the main engine (the manager), node 2 a second dockerd in the network namespace
  ``$LABFLEET_SWARM_NETNS``; :func:`swarm_down` removes the sessions' services, leaves the swarm on
  both engines and tears node 2 down (``scripts/swarm.sh --stop``).
- :func:`start_swarm_hub` starts the Hub with its proxy on node 1's address ($LABFLEET_SWARM_ADDR1),
  where node 2 reaches it; the Hub's API and the labfleet service stay on 127.0.0.1 behind it.
- :func:`node_network` runs ``labfleet node network`` on both nodes, as an operator does before a
  node takes sessions (node 2's inside its namespace): the sessions' bridge, config-only network
  and firewall on each, the Swarm network on node 1; the nodes' own network is denied to sessions.
- :func:`register_node` registers a node straight in labfleet's DB with its labels (what a node
  agent does through the service), for tests that run without agents; :class:`Agent` runs
  ``labfleet agent`` for a node (node 2's inside the namespace, through ``nsenter --net``).

A missing engine, namespace or node is a failure with the reason, never a skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.hubfixture import REPO, Hub, free_port, start_hub

IMAGE = "labfleet/singleuser:test"
SERVICE_PREFIX = "lfswarm"
GIB = 2**30


def run_script(args: list[str], timeout: float, env: dict | None = None) -> str:
    """``bash scripts/<args>``; a failure or a timeout fails the test with the script's output."""
    try:
        r = subprocess.run(
            ["bash", str(REPO / "scripts" / args[0]), *args[1:]],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"scripts/{' '.join(args)} did not finish in {timeout}s:\n{e.stdout}\n{e.stderr}")
    if r.returncode != 0:
        pytest.fail(
            f"scripts/{' '.join(args)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        )
    return r.stdout


@dataclass
class SwarmNodes:
    netns: str
    addr1: str
    addr2: str
    sock2: str
    node1_id: str
    node2_id: str

    def docker2(self):
        """A docker-py client of node 2's engine."""
        import docker

        return docker.DockerClient(base_url=f"unix://{self.sock2}", version="auto", timeout=60)


def swarm_up() -> SwarmNodes:
    """Both nodes Ready and the session image on both (built here if missing or stale)."""
    run_script(["build-image.sh"], 900)
    out = run_script(["swarm.sh", "--start"], 600)
    print(out)
    values = dict(
        line.split("=", 1) for line in run_script(["swarm.sh", "--env"], 60).splitlines() if "=" in line
    )
    nodes = SwarmNodes(
        netns=values["LABFLEET_SWARM_NETNS"],
        addr1=values["LABFLEET_SWARM_ADDR1"],
        addr2=values["LABFLEET_SWARM_ADDR2"],
        sock2=values["LABFLEET_SWARM_SOCK2"],
        node1_id=values["LABFLEET_SWARM_NODE1_ID"],
        node2_id=values["LABFLEET_SWARM_NODE2_ID"],
    )
    if not nodes.node1_id or not nodes.node2_id:
        pytest.fail(f"scripts/swarm.sh left a node out of the swarm: {values}\n{out}")
    return nodes


def remove_services(prefix: str = SERVICE_PREFIX) -> None:
    import docker

    client = docker.from_env(version="auto", timeout=60)
    try:
        for s in client.services.list(filters={"name": prefix}):
            s.remove()
    finally:
        client.close()


def swarm_down() -> None:
    """The sessions' services removed, the swarm left on both engines, node 2 torn down."""
    try:
        remove_services()
    except Exception as e:  # the engine may be gone already: the script says what it finds
        print(f"removing the sessions' services failed: {e}")
    run_script(["swarm.sh", "--stop"], 300)


def node_network(nodes: SwarmNodes, hub: Hub, *, remove: bool = False) -> str:
    """``labfleet node network`` on node 1 (``--manager``) and node 2 for ``hub``'s proxy; its output."""
    from urllib.parse import urlparse

    proxy = f"{nodes.addr1}:{urlparse(hub.url).port}"
    cluster = f"{nodes.addr1}/{os.environ.get('LABFLEET_SWARM_PREFIX', '30')}"
    base = [sys.executable, "-m", "labfleet.cli", "node", "network", "--proxy", proxy, "--deny", cluster]
    if remove:
        base.append("--remove")
    runs = [
        [*base, "--manager"],
        ["nsenter", f"--net=/var/run/netns/{nodes.netns}", *base, "--docker-host", f"unix://{nodes.sock2}"],
    ]
    out = []
    for cmd in runs:  # the manager first: its Swarm network goes before the nodes' config-only ones
        r = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        out.append(r.stdout + r.stderr)
        if r.returncode != 0 and not remove:
            pytest.fail(f"{' '.join(cmd[2:])} failed ({r.returncode}): {r.stdout}{r.stderr}")
    return "\n".join(out)


def register_node(
    db_url: str,
    name: str,
    labels: dict[str, Any],
    gpus: int,
    *,
    cpu: int = 2,
    mem: int = 8 * GIB,
    group: str = "default",
) -> None:
    """A node with ``gpus`` mock 80 GB GPUs and ``labels`` in labfleet's DB (no agent needed)."""
    from labfleet.compute import nodes
    from labfleet.compute.devices.base import DeviceInfo, NodeInfo
    from labfleet.core import database, unitofwork

    engine = database.make_engine(db_url)
    try:
        factory = unitofwork.make_session_factory(engine)
        with database.session_scope(factory) as db:
            info = NodeInfo(
                name=name,
                cpu=cpu,
                mem=mem,
                plugin="mock",
                devices=[DeviceInfo(f"GPU-mock-{name}-{i}", i, "A100-80GB", 80 * 10**9) for i in range(gpus)],
            )
            node = nodes.register_node(db, info, group)
            node.labels = dict(labels)
    finally:
        engine.dispose()


def start_swarm_hub(state: Path, nodes: SwarmNodes, extra_config: str = "", env: dict | None = None) -> Hub:
    """The Hub with LABFLEET_BACKEND=swarm, listening on node 1's address (proxy and Hub API)."""
    ports = tuple(free_port() for _ in range(4))
    public = f"http://{nodes.addr1}:{ports[0]}"
    swarm_env = {
        **(env or {}),
        "LABFLEET_BACKEND": "swarm",
        "LABFLEET_DOCKER_IMAGE": IMAGE,
        "LABFLEET_HUB_ADDRESS": nodes.addr1,
        "LABFLEET_SESSION_SERVICE_URL": f"{public}/services/labfleet/api",
    }
    config = (
        "c.SwarmSpawner.name_template = %r\n"
        "c.LabfleetSpawnerMixin.queue_poll_interval = 0.3\n"
        "c.LabfleetSwarmSpawner.task_pending_timeout = 90\n" % (SERVICE_PREFIX + "-{username}--{servername}")
    )
    return start_hub(state, extra_config=config + extra_config, ports=ports, env=swarm_env, ip=nodes.addr1)


def agent_available() -> str | None:
    """None when ``labfleet agent`` runs here, else why not."""
    if not (REPO / "hub_ext" / "agent").is_dir():
        return "hub_ext/agent/ is not in this checkout (the node agent has not landed)"
    r = subprocess.run(
        [sys.executable, "-m", "labfleet.cli", "agent", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    if r.returncode != 0:
        return f"`labfleet agent --help` failed ({r.returncode}): {(r.stderr or r.stdout)[-500:]}"
    return None


class Agent:
    """``labfleet agent`` for one node; node 2's runs inside its network namespace (nsenter --net)."""

    def __init__(
        self,
        hub: Hub,
        name: str,
        *,
        token: str,
        address: str,
        docker_host: str,
        group: str = "default",
        gpus: int = 1,
        netns: str | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        state = hub.state / f"agent-{name}"
        state.mkdir(exist_ok=True)
        token_file = state / "token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        self.log_path = state / "agent.log"
        cmd = [
            sys.executable,
            "-m",
            "labfleet.cli",
            "agent",
            "--service-url",
            hub.env["LABFLEET_SESSION_SERVICE_URL"],
            "--token-file",
            str(token_file),
            "--node-name",
            name,
            "--resource-group",
            group,
            "--mock-devices",
            str(gpus),
            "--docker-host",
            docker_host,
            "--address",
            address,
            *extra,
        ]
        if netns:
            cmd = ["nsenter", f"--net=/var/run/netns/{netns}", *cmd]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            cmd,
            cwd=state,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=open(self.log_path, "a"),
            stderr=subprocess.STDOUT,
        )

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


def node_token(hub: Hub, name: str) -> str:
    """``labfleet node token create --node NAME`` against the Hub's DB: the token, shown once."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "LABFLEET_DB_URL": hub.db_url}
    env["LABFLEET_SECRET_KEY_FILE"] = hub.env["LABFLEET_SECRET_KEY_FILE"]
    r = subprocess.run(
        [sys.executable, "-m", "labfleet.cli", "node", "token", "create", "--node", name],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=hub.state,
        env=env,
    )
    if r.returncode != 0:
        pytest.fail(
            f"labfleet node token create --node {name} failed ({r.returncode}): {r.stderr or r.stdout}"
        )
    lines = [x.strip() for x in r.stdout.splitlines() if x.strip()]
    if not lines:
        pytest.fail(f"labfleet node token create --node {name} printed no token: {r.stderr}")
    return lines[-1].split()[-1]


def wait_until(what: str, check, timeout: float, interval: float = 0.3, detail=lambda: ""):
    """Poll ``check()`` until it answers something true (returned); fail naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s\n{detail()}")
        time.sleep(interval)
