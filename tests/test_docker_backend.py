"""The Docker backend on a real Docker engine and a real Hub: the test image built locally
(scripts/build-image.sh), registered with the labfleet service, spawned through the Hub REST API
with user_options; limits, hardening, the sessions' network and the placement's environment
checked with `docker inspect`; JupyterLab reached through the proxy; ro and rw mounts; a batch
session ending with its command's exit code and its logs; stop freeing the allocation.

A Docker session is a tenant (issue [1/7]): from inside a real session (tests/session_probe.py run
with `docker exec` as the container's user) it is not root and holds no capability, cannot mount,
reaches none of the host's listeners (the Hub's API, the labfleet service, the proxy's API: at
127.0.0.1, at the gateway or at the host's other addresses) but the Hub's public proxy at the
gateway, through which it is its owner; a memory hog over its limit is killed; a listener it opens
is on its own address, not on the host's loopback; an address outside the host (a network namespace
the test makes) is reached, as the internet would be; a second session cannot reach the first.

The module starts Docker itself (scripts/docker.sh): a missing engine is a failure, not a skip. Its
Hubs' sessions join a network of this test process (tests/hubfixture.DOCKER_SESSION_NETWORK),
removed at the end with its nftables tables and the test's namespace.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import socket
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import quote

import pytest
import requests

from tests.hubfixture import (
    DOCKER_SESSION_NETWORK,
    REPO,
    free_port,
    outside_network,
    remove_docker_session_network,
    remove_outside_network,
    start_hub,
)
from tests.pyindex import module_name, write_index

pytestmark = pytest.mark.docker

IMAGE = "labfleet/singleuser:test"
GIB = 2**30
PROBE = Path(__file__).with_name("session_probe.py")
NETWORK = DOCKER_SESSION_NETWORK.get("LABFLEET_DOCKER_NETWORK", "")
BRIDGE = DOCKER_SESSION_NETWORK.get("LABFLEET_DOCKER_SESSION_BRIDGE", "")
SUBNET = ipaddress.IPv4Network(DOCKER_SESSION_NETWORK.get("LABFLEET_DOCKER_SESSION_SUBNET", "0.0.0.0/32"))
GATEWAY = str(SUBNET.network_address + 1)


def _run_script(name: str, timeout: float) -> str:
    try:
        r = subprocess.run(
            ["bash", str(REPO / "scripts" / name)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"scripts/{name} did not finish in {timeout}s:\n{e.stdout}\n{e.stderr}")
    if r.returncode != 0:
        pytest.fail(f"scripts/{name} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout


@pytest.fixture(scope="module")
def engine():
    """A Docker engine that answers and the test image, built here if missing or stale."""
    _run_script("docker.sh", 240)
    out = _run_script("build-image.sh", 900)
    print(out)
    import docker

    client = docker.from_env(version="auto", timeout=60)
    assert client.images.get(IMAGE).labels["ai.labfleet.source-hash"]
    yield client
    client.close()


# The service's settings of this module's Hubs beyond the backend's (the environments' index).
SERVICE_ENV: dict[str, str] = {}
# An environment's package, from the test's own index outside the host (see the ``env`` fixture).
ENV_PACKAGE, ENV_VALUE = f"lfenvpkg-{secrets.token_hex(3)}", secrets.token_hex(8)
ADDED_PACKAGE, ADDED_VALUE = f"lfaddpkg-{secrets.token_hex(3)}", secrets.token_hex(8)  # in a session
INDEX_PORT = 8081


def _start_docker_hub(state, extra, **kw):
    """The Hub with the Docker backend (LABFLEET_BACKEND=docker, as a deployment sets it)."""
    settings = {"LABFLEET_BACKEND": "docker", "LABFLEET_DOCKER_IMAGE": IMAGE, **SERVICE_ENV}
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        return start_hub(state, extra_config=extra, **kw)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def env(engine, tmp_path_factory):
    if not DOCKER_SESSION_NETWORK:
        pytest.fail("the sessions' network is the root Hub's (nftables): run the tests as root, as CI does")
    state = tmp_path_factory.mktemp("docker-hub")
    # Folders mounted into every session: one read-only, one writable by the session user (uid 1000).
    ro, rw = state / "mnt-ro", state / "mnt-rw"
    ro.mkdir()
    rw.mkdir()
    (ro / "given.txt").write_text("read me\n")
    os.chmod(rw, 0o777)
    base = tmp_path_factory.getbasetemp()
    for p in (state, base, base.parent):
        # The session user (uid 1000) must reach the mounts: pytest's tmp dirs are 0700.
        os.chmod(p, p.stat().st_mode | 0o011)
    # The node's MPS pipe folder for the sessions the test gives MPS (the mock node runs no daemon).
    mps_pipe = state / "mps-pipe"
    mps_pipe.mkdir()
    prefix = "lftest" + secrets.token_hex(3)
    hub_port = free_port()
    # Sessions join the default: the sessions' network, here this test process's own
    # (LABFLEET_DOCKER_NETWORK and its bridge and subnet, from tests.hubfixture).
    extra = f"""
c.JupyterHub.spawner_class = "labfleet.spawner.docker.LabfleetDockerSpawner"
c.DockerSpawner.pull_policy = "never"
c.DockerSpawner.name_template = "{prefix}-{{username}}--{{servername}}"
c.LabfleetSpawnerMixin.queue_poll_interval = 0.3
# Sessions outlive a Hub restart (test_hub_restart_...); the fixture's teardown removes what is left.
# The restarted Hub keeps its ports (its API port here, the others in start_hub's ports).
c.JupyterHub.cleanup_servers = False
c.JupyterHub.hub_port = {hub_port}
c.LabfleetDockerSpawner.extra_mounts = [
    {{"source": {str(ro)!r}, "target": "ro-data", "mode": "ro"}},
    {{"source": {str(rw)!r}, "target": "/home/jovyan/rw-data", "mode": "rw"}},
]
# Servers "m" and "n" limit their fraction with MPS (the mock node runs no daemon: its pipe folder
# is the test's); "n" runs as its image's own user, from whom MPS is withheld.
# Servers "v" and "w" share one home volume per user (DockerSpawner's common pattern), with no
# mount of the deployment's inside it.
def _mps_servers(spawner):
    if spawner.name in ("m", "n"):
        spawner.mps = "yes"
        spawner.mps_pipe_dir = {str(mps_pipe)!r}
        spawner.container_user = "" if spawner.name == "n" else "1000:1000"
    if spawner.name in ("v", "w"):
        spawner.volumes = {{"{prefix}-home-{{username}}": "/home/jovyan"}}
        spawner.extra_mounts = []
c.Spawner.pre_spawn_hook = _mps_servers
"""
    # Outside the host (as the internet): a package index for environment builds, which run on the
    # sessions' network and reach what a session reaches.
    outside = outside_network("lfdout")
    index_dir = state / "index"
    write_index(index_dir, {ENV_PACKAGE: ("1.0", ENV_VALUE), ADDED_PACKAGE: ("2.0", ADDED_VALUE)})
    index = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{outside[0]}", "python3", "-m", "http.server", str(INDEX_PORT)]
        + ["--bind", outside[1], "--directory", str(index_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    SERVICE_ENV["LABFLEET_ENVIRONMENT_INDEX_URL"] = f"http://{outside[1]}:{INDEX_PORT}/simple/"
    box: dict = {"extra": extra, "state": state, "hub_port": hub_port}
    try:
        box["hub"] = _start_docker_hub(state, extra)
        hub = box["hub"]
        box["outside"], box["outside_near"] = outside[1], outside[3]
        root = hub.wait_token("root")
        for method, path, body in [
            ("POST", "/domains", {"name": "acme"}),
            ("POST", "/projects", {"domain": "acme", "name": "ml"}),
            ("POST", "/users", {"username": "alice", "domain": "acme", "projects": ["ml"]}),
        ]:
            r = hub.api(method, path, root, json=body)
            assert r.status_code == 201, (path, r.text)
        box.update(root=root, alice=hub.wait_token("alice"), ro=ro, rw=rw, prefix=prefix, mps_pipe=mps_pipe)
        yield box
    finally:
        hub = box.get("hub")  # a test may have restarted it
        if hub is not None:
            for server in ("a", "b", "r", "m", "n", "v", "w", "e", "s"):
                hub.hub_api("DELETE", f"/users/alice/servers/{server}")
            hub.stop()
        index.kill()
        index.wait(10)
        for c in engine.containers.list(all=True, filters={"name": prefix}):
            c.remove(force=True)
        for v in engine.volumes.list(filters={"name": prefix}):
            v.remove(force=True)
        for tag in box.get("env_images", []):  # what a failed test left (the test removes its own)
            if engine.images.list(name=tag):
                engine.images.remove(tag, force=True)
        remove_outside_network(outside[0], outside[2])
        remove_docker_session_network(NETWORK, BRIDGE)


def _image_path() -> str:
    return "/images/" + quote(IMAGE, safe="")


def _register_image(env) -> dict:
    hub, root = env["hub"], env["root"]
    r = hub.api("GET", _image_path(), root)
    if r.status_code == 404:
        r = hub.api("POST", "/images", root, json={"name": IMAGE, "inspect": True})
        assert r.status_code == 201, r.text
    else:
        assert r.status_code == 200, r.text
    return r.json()


def _spawn(hub, server, options):
    return hub.hub_api("POST", f"/users/alice/servers/{server}", json=options)


def _wait_ready(hub, server, timeout=90):
    deadline = time.monotonic() + timeout
    model = None
    while time.monotonic() < deadline:
        model = hub.hub_api("GET", "/users/alice").json()["servers"].get(server)
        if model and model.get("ready"):
            return model
        time.sleep(0.2)
    raise AssertionError(f"alice/{server} never became ready: {model}\n{hub.log_text()[-5000:]}")


def _session(hub, token, server):
    live = [
        s
        for s in hub.api("GET", "/sessions", token).json()
        if s["name"] == server and s["status"] not in ("TERMINATED", "CANCELLED", "ERROR")
    ]
    assert len(live) == 1, live
    return live[0]


def _wait_status(hub, token, sid, statuses, timeout=60):
    deadline = time.monotonic() + timeout
    s = None
    while time.monotonic() < deadline:
        s = hub.api("GET", f"/sessions/{sid}", token).json()
        if s["status"] in statuses:
            return s
        time.sleep(0.3)
    raise AssertionError(f"session {sid} never reached {statuses}: {s}\n{hub.log_text()[-4000:]}")


def _container(engine, sid):
    found = engine.containers.list(all=True, filters={"label": f"ai.labfleet.session-id={sid}"})
    assert len(found) == 1, found
    return found[0]


def _exec(container, cmd):
    r = container.exec_run(["bash", "-c", cmd])
    return r.exit_code, r.output.decode(errors="replace")


# The probe, run by `docker exec` as the container's user, with the session's own environment: it
# calls the Hub and the labfleet service at the URLs the session was given, with the session's token.
PROBE_RUNNER = """
import json, os, sys
plan = json.loads(sys.argv[1])
token = os.environ["JUPYTERHUB_API_TOKEN"]
plan["urls"] = {
    "hub": [os.environ["JUPYTERHUB_API_URL"].rstrip("/") + "/user", token],
    "service": [os.environ["LABFLEET_SERVICE_URL"].rstrip("/") + "/me", token],
}
source, sys.argv = sys.argv[2], ["session_probe.py", json.dumps(plan)]
exec(compile(source, "session_probe.py", "exec"), {"__name__": "__main__"})
"""


def _probe(container, plan) -> dict:
    r = container.exec_run(["python3", "-c", PROBE_RUNNER, json.dumps(plan), PROBE.read_text()])
    out = r.output.decode(errors="replace")
    lines = [line for line in out.splitlines() if line.startswith("PROBE ")]
    assert r.exit_code == 0 and lines, out[-3000:]
    return json.loads(lines[-1][len("PROBE ") :])


def _host_listeners() -> set[int]:
    """Every TCP port the host listens on at its loopback or at all its addresses (/proc/net/tcp*)."""
    ports = set()
    for path, anywhere in (("/proc/net/tcp", ("0100007F", "00000000")), ("/proc/net/tcp6", None)):
        with open(path) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, port = local.split(":")
                if state == "0A" and (anywhere is None or address in anywhere):
                    ports.add(int(port, 16))
    return ports


# Tries every (host, port) at once from inside a session: a refusal is quick (the sessions' table
# answers TCP with a reset), but anything answered by an ICMP error (rate-limited by the kernel, about
# one a second) or dropped would cost its seconds one after the other. A timeout is no connection.
CONNECTS = """
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
def connect(target):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((target[0], target[1]))
        return "connected"
    except OSError as e:
        return type(e).__name__
    finally:
        s.close()
targets = json.loads(sys.argv[1])
with ThreadPoolExecutor(64) as pool:
    print(json.dumps(dict(zip([f"{h}:{p}" for h, p in targets], pool.map(connect, targets)))))
"""


def _connects(container, targets) -> dict[str, str]:
    r = container.exec_run(["python3", "-c", CONNECTS, json.dumps(targets)])
    out = r.output.decode(errors="replace")
    assert r.exit_code == 0, out[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _host_addresses(*own: str) -> list[str]:
    """The host's addresses a session might try: those of the interface of its default route, and
    ``own`` (addresses this test gave the host). Not the bridges of other tests running beside:
    they come and go, and an address gone is routed off the machine."""
    route = subprocess.run(["ip", "-j", "-4", "route", "show", "default"], capture_output=True, text=True)
    devices = {r["dev"] for r in json.loads(route.stdout or "[]") if r.get("dev")}
    out = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True).stdout or "[]"
    found = [
        a["local"]
        for link in json.loads(out)
        if link.get("ifname") in devices
        for a in link.get("addr_info", [])
        if not a["local"].startswith("127.")
    ]
    return sorted({*found, *own})


def _runtime(hub, sid) -> dict:
    """Where the service records the session running (the spawner's report)."""
    db = sqlite3.connect(hub.db_url.removeprefix("sqlite:///"))
    try:
        (raw,) = db.execute("SELECT runtime FROM sessions WHERE id = ?", (sid,)).fetchone()
    finally:
        db.close()
    return json.loads(raw) if raw else {}


def _address(engine, container) -> str:
    info = engine.api.inspect_container(container.id)
    return info["NetworkSettings"]["Networks"][NETWORK]["IPAddress"]


def _connect(host: str, port: int, timeout: float = 3) -> str:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return "connected"
    except OSError as e:
        return f"{type(e).__name__}: {e}"


def test_image_is_registered_with_its_labels(env):
    hub, root = env["hub"], env["root"]
    # LABFLEET_BACKEND=docker registers the default image when the service starts; register it
    # again by hand, through the API, with its labels read from the Docker engine.
    _register_image(env)
    assert hub.api("DELETE", _image_path(), root).status_code == 200
    assert hub.api("GET", _image_path(), root).status_code == 404
    r = hub.api("POST", "/images", root, json={"name": IMAGE, "inspect": True})
    assert r.status_code == 201, r.text
    image = r.json()
    assert image["name"] == IMAGE
    assert image["display_name"] == "Python 3 + JupyterLab (test)"
    assert image["accelerators"] == ["cuda"]
    assert image["service_ports"] == [{"name": "jupyter", "protocol": "http", "port": 8888}]
    assert float(image["min_resource_slots"]["cpu"]) == 0.5
    assert int(image["min_resource_slots"]["mem"]) == 256 * 2**20
    assert len(image["labels"]["ai.labfleet.source-hash"]) == 32
    missing = hub.api("POST", "/images", root, json={"name": "labfleet/not-built:1", "inspect": True})
    assert missing.status_code == 400 and "has no image" in missing.json()["message"], missing.text


def test_interactive_session_limits_hardening_mounts_and_stop(env, engine):
    hub, alice, root = env["hub"], env["alice"], env["root"]
    _register_image(env)
    options = {"project": "ml", "image": IMAGE, "cpu": 1, "mem": "1g", "gpu": 0.5}
    t0 = time.monotonic()
    r = _spawn(hub, "a", options)
    assert r.status_code in (201, 202), r.text
    _wait_ready(hub, "a")
    print(f"spawn to ready: {time.monotonic() - t0:.1f}s")
    s = _session(hub, alice, "a")
    assert s["status"] == "RUNNING" and s["image"] == IMAGE
    assert [d["shares"] for d in s["devices"]] == [0.5]

    c = _container(engine, s["id"])
    info = engine.api.inspect_container(c.id)
    host = info["HostConfig"]
    # Limits: 1 CPU (CFS quota over period), 1 GiB of memory and no swap beyond it, pids.
    assert host["CpuQuota"] / host["CpuPeriod"] == 1.0 and host["CpuPeriod"] == 100_000
    assert host["Memory"] == GIB and host["MemorySwap"] == GIB
    assert host["PidsLimit"] == 4096
    # Hardening: no capability, no privilege gain, an init process, an unprivileged user.
    assert host["SecurityOpt"] == ["no-new-privileges:true"]
    assert [x.upper() for x in host["CapDrop"]] == ["ALL"] and not host.get("CapAdd")
    assert host["Init"] is True and host["Privileged"] is False
    assert info["Config"]["User"] == "1000:1000"
    # The sessions' network, nothing published on the host; the service knows the address.
    assert host["NetworkMode"] == NETWORK and not host.get("PortBindings")
    address = info["NetworkSettings"]["Networks"][NETWORK]["IPAddress"]
    assert ipaddress.IPv4Address(address) in SUBNET and address != GATEWAY
    assert _runtime(hub, s["id"]) == {"container": c.id, "address": address}
    # Mock devices are accounted but not requested from Docker.
    assert not host.get("DeviceRequests")
    assert info["Config"]["Labels"]["ai.labfleet.session-id"] == s["id"]
    assert info["Config"]["Labels"]["ai.labfleet.user"] == "alice"
    assert info["Config"]["Labels"]["ai.labfleet.project"] == "acme/ml"
    env_ = dict(e.split("=", 1) for e in info["Config"]["Env"])
    assert env_["LABFLEET_SESSION_ID"] == s["id"]
    assert env_["LABFLEET_GPU_SHARES"] == "0.5"
    assert env_["LABFLEET_GPU_FRACTION"] == "0.5"
    assert env_["CUDA_VISIBLE_DEVICES"] == "0"  # renumbered inside the container
    assert env_["NVIDIA_VISIBLE_DEVICES"] == s["devices"][0]["uuid"]
    assert env_["LABFLEET_CPU_LIMIT"] == "1" and env_["LABFLEET_MEM_LIMIT"] == str(GIB)
    assert env_["JUPYTERHUB_SERVICE_URL"].startswith("http://0.0.0.0:8888/")
    # The Hub and the service, through the Hub's public proxy at the gateway.
    proxy_port = int(hub.url.rsplit(":", 1)[1])
    assert env_["JUPYTERHUB_API_URL"] == f"http://{GATEWAY}:{proxy_port}/hub/api"
    assert env_["JUPYTERHUB_ACTIVITY_URL"] == f"http://{GATEWAY}:{proxy_port}/hub/api/users/alice/activity"
    assert env_["LABFLEET_SERVICE_URL"] == f"http://{GATEWAY}:{proxy_port}/services/labfleet/api"
    assert "LABFLEET_SERVICE_TOKEN" not in env_

    # The limits reach the kernel: the container's own cgroup and process status.
    code, out = _exec(
        c,
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max; "
        "id -u; grep CapEff /proc/self/status; mount -t tmpfs x /mnt; echo mount=$?; "
        "umount /home/jovyan/ro-data; echo umount=$?",
    )
    assert code == 0, out
    mem, uid, capeff = out.split("\n")[:3]
    assert int(mem) == GIB and uid == "1000"
    assert capeff.split()[1] == "0000000000000000"
    # Not root, no capability: no mount, no unmount (the read-only mount stays).
    assert "must be superuser to use mount" in out and "mount=32" in out, out
    assert "must be superuser to unmount" in out and "umount=32" in out, out

    # JupyterLab through the Hub's proxy, with the user's token: the server checked the token with
    # the Hub at the gateway (its JUPYTERHUB_API_URL), through the proxy.
    lab = requests.get(
        f"{hub.url}/user/alice/a/api/status", headers={"Authorization": f"token {alice}"}, timeout=30
    )
    assert lab.status_code == 200, lab.text

    # From inside: every listener of the host (the Hub's API, the labfleet service, the proxy's
    # API among them) at 127.0.0.1, at the gateway and at the host's other addresses is out of
    # reach; the public proxy at the gateway and an address outside the host are not.
    listeners = _host_listeners()
    assert {env["hub_port"], hub.ports[2], hub.ports[3]} <= listeners
    targets = [("127.0.0.1", p) for p in listeners if p != 8888]  # 8888: the session's own server
    targets += [(GATEWAY, p) for p in listeners if p != proxy_port]
    targets += [(a, p) for a in _host_addresses(env["outside_near"]) for p in listeners]
    tried = _connects(c, targets)
    assert len(tried) == len(targets)
    reached = [t for t, result in tried.items() if result == "connected"]
    assert not reached, f"reached from the session: {reached}"
    listen_port = free_port()
    for name in ("listening", "release"):
        (env["rw"] / name).unlink(missing_ok=True)
    plan = {
        "reachable": [(env["outside"], 8080), (GATEWAY, proxy_port)],
        "hog_bytes": 2 * GIB,
        "listen_port": listen_port,
        "handshake_dir": "/home/jovyan/rw-data",
    }
    probed: list[dict] = []
    runner = threading.Thread(target=lambda: probed.append(_probe(c, plan)), daemon=True)
    runner.start()
    # While it listens: not on the host's loopback, but on the session's own address.
    deadline = time.monotonic() + 120
    while not (env["rw"] / "listening").exists():
        assert runner.is_alive() and time.monotonic() < deadline, "the probe never listened"
        time.sleep(0.2)
    assert _connect("127.0.0.1", listen_port).startswith("ConnectionRefusedError"), listen_port
    assert listen_port not in _host_listeners()
    assert _connect(address, listen_port + 1) == "connected"
    (env["rw"] / "release").write_text("")
    runner.join(60)
    (out,) = probed
    assert out["uid"] == out["euid"] == 1000, out
    assert int(out["CapEff"], 16) == 0 and out["NoNewPrivs"] == "1", out
    assert out["mount"]["rc"] != 0 and out["umount"]["rc"] != 0, out
    assert out["address"] == address
    for target, result in out["reachable"].items():
        assert result == "connected", f"{target}: {result}"
    # Through the public proxy, with its own token, the session is alice (Hub and labfleet service).
    for name in ("hub", "service"):
        status, body = out["urls"][name].split(" ", 1)
        assert status == "200" and '"alice"' in body, out["urls"][name]
    assert out["hog"]["rc"] == -9, out["hog"]  # the kernel's OOM killer, inside the container's limit
    c.reload()
    assert c.status == "running"  # the hog went, the session stays

    # Mounts: ro cannot be written, rw can (and the file lands on the host, owned by the session user).
    code, out = _exec(c, "cat ~/ro-data/given.txt && touch ~/ro-data/new.txt")
    assert code != 0 and "read me" in out and "Read-only file system" in out, out
    assert not (env["ro"] / "new.txt").exists()
    code, out = _exec(c, "echo written > /home/jovyan/rw-data/new.txt")
    assert code == 0, out
    assert (env["rw"] / "new.txt").read_text() == "written\n"
    assert (env["rw"] / "new.txt").stat().st_uid == 1000

    # Stop: the container goes, the allocation comes back at once.
    assert hub.hub_api("DELETE", "/users/alice/servers/a").status_code in (202, 204)
    after = _wait_status(hub, alice, s["id"], ("TERMINATED",))
    assert after["devices"] == []
    nodes = hub.api("GET", "/nodes", root).json()
    assert all(d["allocated"] == 0 for n in nodes for d in n["devices"])
    deadline = time.monotonic() + 30
    while engine.containers.list(all=True, filters={"label": f"ai.labfleet.session-id={s['id']}"}):
        assert time.monotonic() < deadline, "the stopped session's container was not removed"
        time.sleep(0.3)


def test_mps_only_for_sessions_that_run_as_the_unprivileged_user(env, engine):
    """A fraction limited with MPS runs as the unprivileged uid (1000) and reaches the node's pipe;
    a session that would run as its image's own user gets the framework caps alone, and says why."""
    hub, alice = env["hub"], env["alice"]
    _register_image(env)
    pipe = str(env["mps_pipe"])
    options = {"project": "ml", "image": IMAGE, "cpu": 0.5, "mem": "512m", "gpu": 0.25}
    for server in ("m", "n"):
        assert _spawn(hub, server, options).status_code in (201, 202)
    for server in ("m", "n"):
        _wait_ready(hub, server)

    # MPS: uid 1000 inside, the node's pipe folder mounted and named, the host's IPC namespace.
    m = _session(hub, alice, "m")
    c = _container(engine, m["id"])
    info = engine.api.inspect_container(c.id)
    assert info["Config"]["User"] == "1000:1000"
    code, out = _exec(c, "id -u; id -g")
    assert code == 0 and out.split() == ["1000", "1000"], out
    env_ = dict(e.split("=", 1) for e in info["Config"]["Env"])
    assert env_["LABFLEET_GPU_ENFORCEMENT"] == "mps" and env_["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    assert env_["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25" and "LABFLEET_GPU_MPS_WITHHELD" not in env_
    assert info["HostConfig"]["IpcMode"] == "host"
    assert [x for x in info["Mounts"] if x["Source"] == pipe and x["Destination"] == pipe and x["RW"]]
    assert m["status_reason"] == "server started"

    # The image's own user: no MPS, no pipe, and the session, its status and the Hub's log say why.
    n = _session(hub, alice, "n")
    c = _container(engine, n["id"])
    info = engine.api.inspect_container(c.id)
    assert info["Config"]["User"] == "1000:1000"  # the test image's USER, which the Hub cannot vouch for
    env_ = dict(e.split("=", 1) for e in info["Config"]["Env"])
    assert env_["LABFLEET_GPU_ENFORCEMENT"] == "caps"
    reason = env_["LABFLEET_GPU_MPS_WITHHELD"]
    assert "image's own user" in reason, reason
    assert env_["PYTORCH_CUDA_ALLOC_CONF"] == "per_process_memory_fraction:0.25"
    assert not any(k.startswith("CUDA_MPS_") for k in env_), env_
    assert info["HostConfig"]["IpcMode"] != "host"
    assert not [x for x in info["Mounts"] if x["Source"] == pipe]
    assert n["status_reason"] == f"server started; MPS withheld, framework caps only: {reason}"
    assert f"gets no MPS on node {n['node']}, only the framework caps: {reason}" in hub.log_text()
    # The session's sidebar (labfleet.session in the image) tells it too.
    info = requests.get(
        f"{hub.url}/user/alice/n/labfleet/session", headers={"Authorization": f"token {alice}"}, timeout=30
    )
    assert info.status_code == 200, info.text
    assert info.json()["gpu_share"] == {
        "shares": 0.25,
        "memory": int(env_["LABFLEET_GPU_MEMORY_LIMIT"]),
        "enforcement": "caps",
        "mps_withheld": reason,
    }
    for server in ("m", "n"):
        assert hub.hub_api("DELETE", f"/users/alice/servers/{server}").status_code in (202, 204)
    for s in (m, n):
        _wait_status(hub, alice, s["id"], ("TERMINATED",))


def test_batch_session_ends_with_its_exit_code_and_keeps_its_logs(env, engine):
    hub, alice, root = env["hub"], env["alice"], env["root"]
    _register_image(env)
    options = {
        "project": "ml",
        "image": IMAGE,
        "cpu": 0.5,
        "mem": "512m",
        "gpu": 0.25,
        "type": "batch",
        "command": "echo from-batch; exit 3",
    }
    r = _spawn(hub, "b", options)
    # A command quicker than the spawn: the session waits for the Hub to see it up before it exits
    # (labfleet.session), so the spawn itself succeeds.
    assert r.status_code in (201, 202), r.text
    deadline = time.monotonic() + 30
    while True:
        sessions = [s for s in hub.api("GET", "/sessions", alice).json() if s["name"] == "b"]
        if sessions:
            break
        assert time.monotonic() < deadline, "no session for the batch spawn"
        time.sleep(0.2)
    (s,) = sessions
    assert s["type"] == "batch"
    done = _wait_status(hub, alice, s["id"], ("TERMINATED", "ERROR"), timeout=120)
    assert done["status"] == "TERMINATED", done
    assert done["exit_code"] == 3, done
    assert done["devices"] == []
    # The container's output, kept by the backend and served by the service.
    logs = hub.api("GET", f"/sessions/{s['id']}/logs", alice)
    assert logs.status_code == 200, logs.text
    assert "from-batch" in logs.text, logs.text[-3000:]
    # The exited container is removed once its exit code was read; the Hub has no server left.
    deadline = time.monotonic() + 30
    while engine.containers.list(all=True, filters={"label": f"ai.labfleet.session-id={s['id']}"}):
        assert time.monotonic() < deadline, "the batch session's container was not removed"
        time.sleep(0.3)
    deadline = time.monotonic() + 30
    while (model := hub.hub_api("GET", "/users/alice").json()["servers"].get("b")) is not None:
        assert time.monotonic() < deadline, model
        time.sleep(0.3)
    nodes = hub.api("GET", "/nodes", root).json()
    assert all(d["allocated"] == 0 for n in nodes for d in n["devices"])


def test_hub_restart_keeps_the_container_its_allocation_and_its_log(env, engine):
    hub, alice = env["hub"], env["alice"]
    _register_image(env)
    r = _spawn(hub, "r", {"project": "ml", "image": IMAGE, "cpu": 0.5, "mem": "512m", "gpu": 0.25})
    assert r.status_code in (201, 202), r.text
    _wait_ready(hub, "r")
    s = _session(hub, alice, "r")
    c = _container(engine, s["id"])
    hub.stop()
    c.reload()
    assert c.status == "running", "the session must survive the Hub's restart"
    # Same ports: the running session calls the Hub's public proxy at the gateway, on its port.
    again = _start_docker_hub(env["state"], env["extra"], db_url=hub.db_url, do_seed=False, ports=hub.ports)
    env["hub"] = again
    token = again.wait_token("alice")
    time.sleep(2)  # the service reconciles with the Hub's servers at start
    after = again.api("GET", f"/sessions/{s['id']}", token).json()
    assert after["status"] == "RUNNING" and after["devices"][0]["shares"] == 0.25
    lab = requests.get(
        f"{again.url}/user/alice/r/api/status", headers={"Authorization": f"token {token}"}, timeout=30
    )
    assert lab.status_code == 200
    # The new Hub follows the container's output again: a request shows up in the session log.
    marker = "/user/alice/r/api/contents/marker-" + secrets.token_hex(4)
    requests.get(again.url + marker, headers={"Authorization": f"token {token}"}, timeout=30)
    deadline = time.monotonic() + 20
    while marker not in (text := again.api("GET", f"/sessions/{s['id']}/logs", token).text):
        assert time.monotonic() < deadline, text[-2000:]
        time.sleep(0.3)
    assert again.hub_api("DELETE", "/users/alice/servers/r").status_code in (202, 204)
    assert _wait_status(again, token, s["id"], ("TERMINATED",))["devices"] == []
    deadline = time.monotonic() + 30
    while engine.containers.list(all=True, filters={"label": f"ai.labfleet.session-id={s['id']}"}):
        assert time.monotonic() < deadline, "the stopped session's container was not removed"
        time.sleep(0.3)


def _in_volume(engine, volume: str, script: str) -> str:
    """``script`` as root in a throwaway container with ``volume`` at /h (no network)."""
    out = engine.containers.run(
        IMAGE,
        ["bash", "-c", script],
        user="0:0",
        network_mode="none",
        volumes={volume: {"bind": "/h", "mode": "rw"}},
        remove=True,
    )
    return out.decode(errors="replace")


def test_vfolders_in_containers_ro_rw_shared_and_never_split_in_a_shared_home(env, engine):
    """Two sessions of alice share one home volume ("v", "w"): each sees its own folders through
    ~/vfolders -> /vfolders (a root-owned tmpfs of its container's), a folder of one never shows up
    in the other, and Docker leaves no mount point in the volume. The volume holds what the old
    layout left (Docker's root-owned ~/vfolders/x, a file of the user's in it): moved aside whole by
    the first session, and said in its log."""
    hub, alice = env["hub"], env["alice"]
    _register_image(env)
    volume = f"{env['prefix']}-home-alice"
    _in_volume(
        engine,
        volume,
        "mkdir -p /h/vfolders/x && echo keep > /h/vfolders/notes.txt && echo mine > /h/work.txt"
        " && chown 1000:1000 /h /h/work.txt /h/vfolders/notes.txt",
    )
    folders = {}
    for name in ("shared-rw", "shared-ro", ".dot"):
        r = hub.api("POST", "/vfolders", alice, json={"name": name})
        assert r.status_code == 201, r.text
        folders[name] = r.json()["id"]
    assert (
        hub.api(
            "PUT", f"/vfolders/{folders['shared-ro']}/files/given.txt", alice, data=b"read me"
        ).status_code
        == 201
    )
    # alice's own folders are wd; a read-only mount comes from a share, so make one: root's
    # project folder in acme/ml, open to members read-only.
    r = hub.api(
        "POST", "/vfolders", env["root"], json={"name": "team", "project": "acme/ml", "permission": "ro"}
    )
    assert r.status_code == 201, r.text
    team = r.json()["id"]
    assert (
        hub.api("PUT", f"/vfolders/{team}/files/given.txt", env["root"], data=b"team file").status_code == 201
    )

    options = {"project": "ml", "image": IMAGE, "cpu": 0.5, "mem": "512m", "vfolders": ["shared-rw", "team"]}
    assert _spawn(hub, "v", options).status_code in (201, 202)
    _wait_ready(hub, "v")
    s1 = _session(hub, alice, "v")
    assert {m["name"]: m["permission"] for m in s1["mounts"]} == {
        "shared-rw": "wd",
        "team": "ro",
        ".dot": "wd",
    }
    c1 = _container(engine, s1["id"])
    info = engine.api.inspect_container(c1.id)
    # The folders under /vfolders, a root-owned tmpfs of the container's; nothing mounted in the home
    # but the home itself.
    assert info["HostConfig"]["Tmpfs"] == {"/vfolders": "mode=0755,size=1048576"}
    binds = {m["Destination"]: m for m in info["Mounts"]}
    assert sorted(binds) == ["/home/jovyan", "/vfolders/.dot", "/vfolders/shared-rw", "/vfolders/team"]
    assert binds["/home/jovyan"]["Name"] == volume
    env1 = dict(e.split("=", 1) for e in info["Config"]["Env"])
    assert env1["LABFLEET_FOLDERS_ROOT"] == "/vfolders" and env1["LABFLEET_FOLDERS_TIDY"] == "1"
    code, out = _exec(c1, "readlink ~/vfolders; stat -c '%U %a' /vfolders; ls -a ~/vfolders/")
    assert code == 0 and out.split() == [
        "/vfolders",
        "root",
        "755",
        ".",
        "..",
        ".dot",
        "shared-rw",
        "team",
    ], out
    code, out = _exec(c1, "cat ~/vfolders/team/given.txt && touch ~/vfolders/team/new.txt")
    assert code != 0 and "team file" in out and "Read-only file system" in out, out
    code, out = _exec(c1, "echo from-a > ~/vfolders/shared-rw/note.txt && mkdir ~/vfolders/mine")
    assert code != 0 and "Permission denied" in out, out  # the root takes nothing of the session's
    # Written through ~/vfolders: in the folder's directory on the host, and through the API.
    assert Path(binds["/vfolders/shared-rw"]["Source"], "note.txt").read_text() == "from-a\n"
    r = hub.api("GET", f"/vfolders/{folders['shared-rw']}/files/note.txt", alice)
    assert r.status_code == 200 and r.content == b"from-a\n"
    # The old ~/vfolders (root's mount point, the user's file) moved aside whole, the rest kept.
    code, out = _exec(
        c1,
        "cd ~ && ls -d vfolders-moved-aside-*; cat vfolders-moved-aside-*/notes.txt work.txt; "
        "ls vfolders-moved-aside-*/",
    )
    assert code == 0, out
    aside, *rest = out.split()
    assert aside.startswith("vfolders-moved-aside-") and rest == ["keep", "mine", "notes.txt", "x"], out
    deadline = time.monotonic() + 20
    said = f"labfleet: moved aside in the home: vfolders -> {aside} (in /home/jovyan)"
    while said not in (logs := hub.api("GET", f"/sessions/{s1['id']}/logs", alice).text):
        assert time.monotonic() < deadline, logs[-3000:]
        time.sleep(0.3)

    # Another session of the same home and folder: it reads what the first wrote, and what the API
    # uploaded is writable there; the folder only the first mounts is nowhere in it.
    assert _spawn(
        hub,
        "w",
        {"project": "ml", "image": IMAGE, "cpu": 0.5, "mem": "512m", "vfolders": [folders["shared-rw"]]},
    ).status_code in (
        201,
        202,
    )
    _wait_ready(hub, "w")
    s2 = _session(hub, alice, "w")
    c2 = _container(engine, s2["id"])
    env2 = dict(e.split("=", 1) for e in engine.api.inspect_container(c2.id)["Config"]["Env"])
    assert env2["LABFLEET_FOLDERS_TIDY"] == "0"  # the first runs: an old ~/vfolders would stay
    assert (
        hub.api("PUT", f"/vfolders/{folders['shared-rw']}/files/api.txt", alice, data=b"api").status_code
        == 201
    )
    code, out = _exec(c2, "cat ~/vfolders/shared-rw/note.txt && echo more >> ~/vfolders/shared-rw/api.txt")
    assert code == 0 and "from-a" in out, out
    code, out = _exec(c2, "readlink ~/vfolders; ls -a ~/vfolders/; test -e ~/vfolders/team; echo team=$?")
    assert out.split() == ["/vfolders", ".", "..", ".dot", "shared-rw", "team=1"], out
    code, out = _exec(c1, "ls ~/vfolders/team")  # the first still sees its own
    assert code == 0 and out.split() == ["given.txt"], out

    # Two sessions on one network: the host (the proxy) reaches each server, neither reaches the other.
    a1, a2 = _address(engine, c1), _address(engine, c2)
    assert requests.get(f"http://{a1}:8888/user/alice/v/api", timeout=10).status_code == 200
    assert requests.get(f"http://{a2}:8888/user/alice/w/api", timeout=10).status_code == 200
    tries = "import socket\nfor h in {!r}:\n try:\n  socket.create_connection((h, 8888), 3); print(h, 'connected')\n except OSError as e: print(h, e)"
    for container, other in ((c2, a1), (c1, a2)):
        r = container.exec_run(["python3", "-c", tries.format([other])])
        out = r.output.decode(errors="replace")
        assert r.exit_code == 0 and "connected" not in out and other in out, out
    for server in ("v", "w"):
        hub.hub_api("DELETE", f"/users/alice/servers/{server}")
    for s in (s1, s2):
        _wait_status(hub, alice, s["id"], ("TERMINATED",))
    deadline = time.monotonic() + 30
    for s in (s1, s2):
        while engine.containers.list(all=True, filters={"label": f"ai.labfleet.session-id={s['id']}"}):
            assert time.monotonic() < deadline, "the stopped sessions' containers were not removed"
            time.sleep(0.3)
    # Both gone: the volume holds the link, the user's files and the aside folder, and nothing of
    # root's (no mount point of Docker's) outside the aside folder.
    out = _in_volume(
        engine,
        volume,
        "readlink /h/vfolders; ls -A /h | grep -v '^[.]'; echo root-owned:;"
        " find /h -path '/h/vfolders-moved-aside-*' -prune -o -user root -print",
    )
    assert out.split() == ["/vfolders", "vfolders", aside, "work.txt", "root-owned:"], out


def _wait_environment(hub, token, env_id, timeout=300) -> dict:
    deadline = time.monotonic() + timeout
    e = {}
    while time.monotonic() < deadline:
        e = hub.api("GET", f"/environments/{env_id}", token).json()
        if e["status"] in ("READY", "FAILED"):
            return e
        time.sleep(0.5)
    raise AssertionError(f"environment {env_id} still {e.get('status')} after {timeout}s")


def test_an_environment_is_built_run_saved_from_its_session_and_run_again_by_its_owner_only(env, engine):
    """My Environments end to end: the service builds a recipe on the node's engine, its package from
    an index outside the host (the build is on the sessions' network); the launch options offer it;
    a session started from ``env:<id>`` runs its image and imports the package. In that session the
    user adds a package (the environment's venv is theirs) and a file, and saves the session as an
    environment: its recipe names the package, its image has none of the session's secrets, and a
    new session from it has both. Another member of the project can neither start nor save them;
    deleting them takes their images off the engine."""
    hub, root, alice = env["hub"], env["root"], env["alice"]
    _register_image(env)
    if not engine.networks.list(names=[NETWORK]):
        # Builds join the sessions' network, which the spawner makes at the first session (this
        # module's earlier tests start some; this one alone, -k, starts one).
        r = _spawn(hub, "e", {"project": "ml", "image": IMAGE, "cpu": 0.5, "mem": "512m"})
        assert r.status_code in (201, 202), r.text
        _wait_ready(hub, "e")
        hub.hub_api("DELETE", "/users/alice/servers/e")
        wait_until_gone = time.monotonic() + 60
        while (
            hub.hub_api("GET", "/users/alice").json()["servers"].get("e")
            and time.monotonic() < wait_until_gone
        ):
            time.sleep(0.3)
    body = {"name": "with-pkg", "base": IMAGE, "files": {"requirements.txt": f"{ENV_PACKAGE}\n"}}
    r = hub.api("POST", "/environments", alice, json=body)
    assert r.status_code == 202, r.text
    created = r.json()
    env.setdefault("env_images", []).append(f"labfleet/env:{created['recipe_hash']}")
    done = _wait_environment(hub, alice, created["id"])
    log = hub.api("GET", f"/environments/{created['id']}/logs", alice).text
    assert done["status"] == "READY", (done["status_reason"], log[-3000:])
    assert f"Successfully installed {ENV_PACKAGE}-1.0" in log
    ref = f"env:{created['id']}"
    offered = hub.api("GET", "/users/alice/launch-options", alice).json()["images"]
    assert [i["projects"] for i in offered if i["name"] == ref] == [["acme/ml"]]

    r = _spawn(hub, "e", {"project": "ml", "image": ref, "cpu": 0.5, "mem": "512m"})
    assert r.status_code in (201, 202), r.text
    _wait_ready(hub, "e", timeout=120)
    s = _session(hub, alice, "e")
    assert s["image"] == done["image"], s
    c = _container(engine, s["id"])
    assert c.image.id == done["image_id"]
    code, out = _exec(c, f"python -c 'import {module_name(ENV_PACKAGE)} as m; print(m.VALUE)'")
    assert (code, out.strip()) == (0, ENV_VALUE), out

    # Save as environment: a package and a file added in the session.
    index_url = SERVICE_ENV["LABFLEET_ENVIRONMENT_INDEX_URL"]
    code, out = _exec(
        c,
        f"PIP_DISABLE_PIP_VERSION_CHECK=1 python3 -m pip install -q --index-url {index_url}"
        f" --trusted-host {env['outside']} {ADDED_PACKAGE}"
        " && echo kept > ~/saved.txt",
    )
    assert code == 0, out
    bert = hub.api("POST", "/users", root, json={"username": "bert", "domain": "acme", "projects": ["ml"]})
    assert bert.status_code == 201, bert.text
    bert_token = hub.wait_token("bert")
    r = hub.api("POST", "/environments", bert_token, json={"name": "stolen", "session": s["id"]})
    assert r.status_code == 404, r.text
    r = hub.api("POST", "/environments", alice, json={"name": "saved", "session": s["id"]})
    assert r.status_code == 202, r.text
    saved = _wait_environment(hub, alice, r.json()["id"])
    env["env_images"].append(saved["image"] or "")
    saved_log = hub.api("GET", f"/environments/{saved['id']}/logs", alice).text
    assert saved["status"] == "READY", (saved["status_reason"], saved_log[-3000:])
    assert saved["base"] == IMAGE and saved["source_session"] == s["id"]
    assert f"{ADDED_PACKAGE}==2.0" in saved["files"]["requirements.txt"], saved["files"]
    # None of the session's settings (its token) in the image: its own variables are there, emptied.
    config = engine.api.inspect_image(saved["image"])["Config"]
    session_env = dict(e.partition("=")[::2] for e in engine.api.inspect_container(c.id)["Config"]["Env"])
    assert session_env["JUPYTERHUB_API_TOKEN"] and session_env["JUPYTERHUB_API_TOKEN"] not in json.dumps(
        config
    )
    assert [
        e for e in config["Env"] if e.startswith(("JUPYTERHUB_", "LABFLEET_")) and not e.endswith("=")
    ] == []
    hub.hub_api("DELETE", "/users/alice/servers/e")

    r = _spawn(hub, "s", {"project": "ml", "image": f"env:{saved['id']}", "cpu": 0.5, "mem": "512m"})
    assert r.status_code in (201, 202), r.text
    _wait_ready(hub, "s", timeout=120)
    again = _container(engine, _session(hub, alice, "s")["id"])
    assert again.image.id == saved["image_id"]
    code, out = _exec(
        again, f"python -c 'import {module_name(ADDED_PACKAGE)} as m; print(m.VALUE)'; cat ~/saved.txt"
    )
    assert (code, out.split()) == (0, [ADDED_VALUE, "kept"]), out
    hub.hub_api("DELETE", "/users/alice/servers/s")

    # Another member of acme/ml: as if they did not exist; nothing starts.
    r = hub.hub_api("POST", "/users/bert/servers/e", json={"project": "ml", "image": ref})
    assert r.status_code == 404 and "no environment" in r.json()["message"], r.text
    assert hub.api("GET", f"/environments/{created['id']}", bert_token).status_code == 404
    assert [x for x in hub.api("GET", "/sessions", root).json() if x["user"] == "bert"] == []

    for env_id, image in ((created["id"], done["image"]), (saved["id"], saved["image"])):
        r = hub.api("DELETE", f"/environments/{env_id}", alice)
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 60
        while engine.images.list(name=image) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not engine.images.list(name=image)
