"""The swarm backend on two real Swarm nodes of this machine (scripts/swarm.sh) and a real Hub.

Node 1 is the main Docker engine, the swarm's manager, where the Hub runs; node 2 a second engine in
its own network namespace. labfleet places each session on a node and its devices; the Swarm
service is pinned to that node (node.id constraint) and answers through the Hub's proxy.

Without agents (nodes registered in labfleet's DB with their labels, as an agent would):
- a session lands on node 2 when node 1 is full, runs there (its task, its container on engine 2,
  its limits and devices) and answers through the proxy; stopping it frees its allocation;
- a folder written from a session on node 1 is read from a session on node 2;
- a model-serving replica placed on node 2 answers through the endpoint's URL (the router calls it at
  node 2's address) and through its own session's inference page (the port the engine gave it);
- an environment built on node 1 is pushed to the fleet's registry and runs on node 2, which pulls
  it: a batch session there ends with its command's exit code and its output in the session log
  (it runs late in the module: the test image's push to the registry goes on while earlier tests run).
With an agent per node (`labfleet agent`, node 2's inside the namespace):
- a drained node (`labfleet node drain`) gets no new session;
- Save as environment for a session on node 2: its agent commits the container and pushes the image
  to the fleet's registry; a batch session of it on node 1 pulls it and has the session's file;
- killing node 2's agent makes the node LOST and frees its allocations.

The module starts Docker, the swarm and node 2 itself and stops them at its end (the swarm left,
node 2 torn down); anything that cannot start is a failure that says why, never a skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from urllib.parse import urlparse

import pytest
import requests

from labfleet.spawner.swarm_config import published_port
from tests.hubfixture import REPO, free_port
from tests.swarmfixture import (
    IMAGE,
    SERVICE_PREFIX,
    Agent,
    agent_available,
    node_network,
    node_token,
    register_node,
    remove_services,
    start_swarm_hub,
    swarm_down,
    swarm_up,
    wait_until,
)
from tests.test_serving_hub import DEFINITION, SERVER, _folder

pytestmark = pytest.mark.docker

OPTIONS = {"project": "ml", "image": IMAGE, "cpu": 0.5, "mem": "512m", "gpu": 1}


@pytest.fixture(scope="module")
def nodes():
    try:
        yield swarm_up()
    finally:
        swarm_down()


@pytest.fixture(scope="module")
def engines(nodes):
    import docker

    one = docker.from_env(version="auto", timeout=60)
    two = nodes.docker2()
    yield one, two
    one.close()
    two.close()


def _in_registry(ref: str) -> bool:
    """Does the fleet's registry have the image ``ref`` (its manifest), as its HTTP API says?"""
    host, _, rest = ref.partition("/")
    repository, _, tag = rest.rpartition(":")
    r = requests.head(
        f"https://{host}/v2/{repository}/manifests/{tag}",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
        verify=f"/etc/docker/certs.d/{host}/ca.crt",
        timeout=30,
    )
    assert r.status_code in (200, 404), (r.status_code, r.text)
    return r.status_code == 200


def _push_and_pull_base(nodes, ref: str) -> None:
    """The test image through the registry: pushed from node 1, pulled on node 2. An engine that loaded
    an image knows its layers but not their digests in a registry, so without this node 2 would
    download (and push) the base's layers again with each environment; a fleet whose nodes pull their
    images from the registry has that already."""
    import docker

    repository, _, tag = ref.rpartition(":")
    one, two = docker.from_env(version="auto", timeout=300), nodes.docker2()
    try:
        one.api.tag(IMAGE, repository, tag)
        for act in (one.api.push, two.api.pull):
            for item in act(repository, tag=tag, stream=True, decode=True):
                assert not item.get("error"), item
    finally:
        one.close()
        two.close()


# The registry fixture's push and pull of the test image (in the background, while the first tests run).
_BASE_IN_REGISTRY: dict[str, Future] = {}


def _base_in_registry(registry: str) -> None:
    """Wait until the registry has the test image and node 2 pulled it from there."""
    _BASE_IN_REGISTRY[registry].result(timeout=300)


@pytest.fixture(scope="module")
def registry(nodes, tmp_path_factory):
    """The fleet's registry (scripts/registry.sh) at node 1's address, which node 2 reaches."""
    state = tmp_path_factory.mktemp("registry")
    script = ["bash", str(REPO / "scripts" / "registry.sh"), "--addr", nodes.addr1]
    script += ["--port", str(free_port()), "--state", str(state)]
    r = subprocess.run(script, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    address = r.stdout.strip().rpartition("=")[2]
    pool = ThreadPoolExecutor(1)
    try:
        _BASE_IN_REGISTRY[address] = pool.submit(_push_and_pull_base, nodes, f"{address}/{IMAGE}")
        yield address
    finally:
        pool.shutdown(wait=True)
        _BASE_IN_REGISTRY.pop(address, None)
        subprocess.run(["docker", "rmi", f"{address}/{IMAGE}"], capture_output=True, timeout=60)
        subprocess.run([*script, "--stop"], capture_output=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def env(nodes, engines, registry, tmp_path_factory):
    state = tmp_path_factory.mktemp("swarm-hub")
    base = tmp_path_factory.getbasetemp()
    for p in (state, base, base.parent):
        # The session user (uid 1000) must reach the folders under the state directory.
        os.chmod(p, p.stat().st_mode | 0o011)
    # Agents heartbeat every second; three missed make their node LOST.
    hub = start_swarm_hub(
        state,
        nodes,
        env={
            "LABFLEET_AGENT_HEARTBEAT": "1",
            "LABFLEET_NODE_LOST_AFTER": "3",
            "LABFLEET_SERVING_INTERVAL": "1",
            # Environments are pushed to the fleet's registry; their builds need no network here.
            "LABFLEET_ENVIRONMENT_REGISTRY": registry,
            "LABFLEET_ENVIRONMENT_BUILD_NETWORK": "none",
        },
    )
    box = {"hub": hub, "state": state, "nodes": nodes, "servers": set()}
    try:
        print(node_network(nodes, hub))
        root = hub.wait_token("root")
        for method, path, body in [
            ("POST", "/domains", {"name": "acme"}),
            ("POST", "/projects", {"domain": "acme", "name": "ml"}),
            ("POST", "/users", {"username": "alice", "domain": "acme", "projects": ["ml"]}),
        ]:
            r = hub.api(method, path, root, json=body)
            assert r.status_code == 201, (path, r.text)
        box.update(root=root, alice=hub.wait_token("alice"))
        yield box
    finally:
        for server in box["servers"]:
            hub.hub_api("DELETE", f"/users/alice/servers/{server}")
        hub.stop()
        remove_services()
        print(node_network(nodes, hub, remove=True))
        print(hub.log_text()[-3000:])


def _spawn(env, server, options=OPTIONS):
    env["servers"].add(server)
    r = env["hub"].hub_api("POST", f"/users/alice/servers/{server}", json=options)
    assert r.status_code in (201, 202), r.text


def _wait_ready(env, server, timeout=180):
    hub = env["hub"]

    def ready():
        model = hub.hub_api("GET", "/users/alice").json()["servers"].get(server)
        return model if model and model.get("ready") else None

    return wait_until(f"alice/{server} ready", ready, timeout, detail=lambda: hub.log_text()[-6000:])


def _stop(env, server):
    hub = env["hub"]
    r = hub.hub_api("DELETE", f"/users/alice/servers/{server}")
    assert r.status_code in (202, 204), r.text
    wait_until(
        f"alice/{server} stopped",
        lambda: server not in hub.hub_api("GET", "/users/alice").json()["servers"],
        90,
        detail=lambda: hub.log_text()[-4000:],
    )
    env["servers"].discard(server)


def _session(env, server):
    live = [
        s
        for s in env["hub"].api("GET", "/sessions", env["alice"]).json()
        if s["name"] == server and s["status"] not in ("TERMINATED", "CANCELLED", "ERROR")
    ]
    assert len(live) == 1, live
    return live[0]


def _service(engines, server):
    one, _ = engines
    found = one.services.list(filters={"name": f"{SERVICE_PREFIX}-alice--{server}"})
    assert len(found) == 1, found
    return found[0]


def _container(client, sid):
    found = client.containers.list(filters={"label": f"ai.labfleet.session-id={sid}"})
    assert len(found) == 1, (sid, found)
    return found[0]


def _exec(container, cmd):
    r = container.exec_run(["bash", "-c", cmd])
    return r.exit_code, r.output.decode(errors="replace")


def _lab_status(env, server):
    hub = env["hub"]
    return requests.get(
        f"{hub.url}/user/alice/{server}/api/status",
        headers={"Authorization": f"token {env['alice']}"},
        timeout=30,
    )


def _nodes_view(env):
    r = env["hub"].api("GET", "/nodes", env["root"])
    assert r.status_code == 200, r.text
    return {n["name"]: n for n in r.json()}


def test_two_swarm_nodes_are_ready(nodes, engines):
    one, two = engines
    by_id = {n.id: n.attrs for n in one.nodes.list()}
    assert by_id[nodes.node1_id]["Status"]["State"] == "ready"
    assert by_id[nodes.node2_id]["Status"]["State"] == "ready"
    assert by_id[nodes.node1_id]["ManagerStatus"]["Addr"] == f"{nodes.addr1}:2377"
    assert by_id[nodes.node2_id]["Status"]["Addr"] == nodes.addr2
    assert two.info()["Swarm"]["NodeID"] == nodes.node2_id
    # Engine 2 runs in node 2's network namespace, and has the session image.
    pids = subprocess.run(["ip", "netns", "pids", nodes.netns], capture_output=True, text=True).stdout.split()
    assert any(open(f"/proc/{p}/comm").read().strip() == "dockerd" for p in pids), pids
    assert two.images.get(IMAGE).id == one.images.get(IMAGE).id


def test_session_lands_on_node_2_when_node_1_is_full(env, nodes, engines):
    """Nodes registered as their agents would (labels swarm.node_id and address); node 1 first."""
    hub, alice = env["hub"], env["alice"]
    one, two = engines
    register_node(hub.db_url, "swarm-1", {"swarm.node_id": nodes.node1_id, "address": nodes.addr1}, gpus=1)
    labels = _nodes_view(env)["swarm-1"].get("labels")
    assert labels == {"swarm.node_id": nodes.node1_id, "address": nodes.addr1}, labels

    _spawn(env, "a")
    _wait_ready(env, "a")
    a = _session(env, "a")
    assert a["node"] == "swarm-1" and [d["shares"] for d in a["devices"]] == [1.0]
    svc = _service(engines, "a").attrs["Spec"]
    assert svc["TaskTemplate"]["Placement"]["Constraints"] == [f"node.id=={nodes.node1_id}"]

    # Node 1's only GPU is taken: the next session goes to node 2, once node 2 is there.
    register_node(hub.db_url, "swarm-2", {"swarm.node_id": nodes.node2_id, "address": nodes.addr2}, gpus=1)
    t0 = time.monotonic()
    _spawn(env, "b")
    _wait_ready(env, "b")
    print(f"spawn to ready on node 2: {time.monotonic() - t0:.1f}s")
    b = _session(env, "b")
    assert b["node"] == "swarm-2", b
    spec = _service(engines, "b").attrs["Spec"]
    task = spec["TaskTemplate"]
    assert task["Placement"]["Constraints"] == [f"node.id=={nodes.node2_id}"]
    assert task["RestartPolicy"]["Condition"] == "none"
    assert task["Resources"]["Limits"] == {"NanoCPUs": 500_000_000, "MemoryBytes": 512 * 2**20, "Pids": 4096}
    assert task["Resources"]["Reservations"] == {"NanoCPUs": 500_000_000, "MemoryBytes": 512 * 2**20}
    assert [n.get("Target") for n in task.get("Networks", [])] != []
    cs = task["ContainerSpec"]
    assert (
        [c.upper() for c in cs["CapabilityDrop"]] == ["ALL"]
        and cs["Init"] is True
        and cs["User"] == "1000:1000"
    )
    tasks = _service(engines, "b").tasks(filters={"desired-state": "running"})
    assert [t["NodeID"] for t in tasks] == [nodes.node2_id]

    # The container runs on engine 2 (not engine 1), in node 2's namespace, with the placement's devices.
    assert not one.containers.list(filters={"label": f"ai.labfleet.session-id={b['id']}"})
    c = _container(two, b["id"])
    info = two.api.inspect_container(c.id)
    # On the sessions' network (not the node's): its address in the sessions' subnet, its server
    # published by node 2, the Hub's API and the service called at the bridge's gateway.
    assert list(info["NetworkSettings"]["Networks"]) == ["labfleet-sessions"], info["NetworkSettings"]
    assert info["NetworkSettings"]["Networks"]["labfleet-sessions"]["IPAddress"].startswith("10.215.")
    env_ = dict(e.split("=", 1) for e in info["Config"]["Env"])
    assert env_["NVIDIA_VISIBLE_DEVICES"] == b["devices"][0]["uuid"] == "GPU-mock-swarm-2-0"
    assert env_["LABFLEET_NODE"] == "swarm-2"
    proxy_port = urlparse(hub.url).port
    assert env_["JUPYTERHUB_API_URL"] == f"http://10.215.0.1:{proxy_port}/hub/api"
    assert env_["LABFLEET_SERVICE_URL"] == f"http://10.215.0.1:{proxy_port}/services/labfleet/api"
    published = published_port(_service(engines, "b").tasks(filters={"desired-state": "running"})[0])
    code, out = _exec(
        c,
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max; id -u",
    )
    assert code == 0, out
    assert out.split() == [str(512 * 2**20), "1000"]
    # The server and what it starts gain no privileges (setpriv --no-new-privs before its command):
    # the init's one child is the server (what `docker exec` runs is not the init's).
    code, out = _exec(
        c,
        "for p in $(cat /proc/1/task/1/children); do grep NoNewPrivs /proc/$p/status; tr '\\0' ' ' </proc/$p/cmdline; done",
    )
    assert code == 0 and out.split()[:2] == ["NoNewPrivs:", "1"] and "jupyterhub-singleuser" in out, out
    _sessions_reach_nothing_of_the_cluster(env, nodes, engines, a, b, published)

    # JupyterLab on node 2 through the Hub's proxy; the session reaches the labfleet service too.
    r = _lab_status(env, "b")
    assert r.status_code == 200, r.text
    code, out = _exec(
        c,
        "python3 -c \"import os,urllib.request as u; r=u.Request(os.environ['LABFLEET_SERVICE_URL']+'/sessions/'+"
        "os.environ['LABFLEET_SESSION_ID'], headers={'Authorization': 'token '+os.environ['JUPYTERHUB_API_TOKEN']}); "
        'print(u.urlopen(r, timeout=20).status)"',
    )
    assert code == 0 and out.strip().endswith("200"), out

    # Stop: the service goes, the allocation comes back.
    _stop(env, "b")
    assert hub.api("GET", f"/sessions/{b['id']}", alice).json()["status"] == "TERMINATED"
    assert not one.services.list(filters={"name": f"{SERVICE_PREFIX}-alice--b"})
    view = _nodes_view(env)["swarm-2"]
    assert view["allocated"]["gpu.shares"] == 0 and view["allocated"]["cpu"] == 0
    _stop(env, "a")
    assert _nodes_view(env)["swarm-1"]["allocated"]["gpu.shares"] == 0


PROBE = """
import json, socket, sys
out = {}
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=4).close()
        out[target] = "open"
    except OSError as e:
        out[target] = type(e).__name__
print(json.dumps(out))
"""


def _probe(container, targets):
    r = container.exec_run(["python3", "-c", PROBE, *targets])
    assert r.exit_code == 0, r.output
    return json.loads(r.output.decode().strip().splitlines()[-1])


def _sessions_reach_nothing_of_the_cluster(env, nodes, engines, a, b, b_published):
    """From a session on each node: the Hub's proxy at the gateway, and nothing else of the cluster
    (the nodes' own ports, the other session's published server, the other node, metadata)."""
    one, two = engines
    hub = env["hub"]
    proxy_port = urlparse(hub.url).port
    a_published = published_port(_service(engines, "a").tasks(filters={"desired-state": "running"})[0])
    on_node1, on_node2 = free_port(), free_port()
    listeners = [
        subprocess.Popen([sys.executable, "-m", "http.server", "--bind", nodes.addr1, str(on_node1)]),
        subprocess.Popen(
            [
                "nsenter",
                f"--net=/var/run/netns/{nodes.netns}",
                sys.executable,
                "-m",
                "http.server",
                "--bind",
                nodes.addr2,
                str(on_node2),
            ]
        ),
    ]
    try:
        wait_until("the nodes' own listeners", lambda: _listening(nodes.addr1, on_node1), 20)
        closed = [
            f"{nodes.addr1}:{on_node1}",  # a program on node 1 (the manager: the Hub's machine)
            f"{nodes.addr2}:{on_node2}",  # a program on node 2
            f"{nodes.addr1}:{proxy_port}",  # the proxy at its own address: only through the gateway
            f"{nodes.addr1}:{a_published}",  # session a's server, published by node 1
            f"{nodes.addr2}:{b_published}",  # session b's server, published by node 2
            "10.215.0.1:22",  # the node at its gateway: only the proxy's port is forwarded
            "169.254.169.254:80",  # cloud metadata
        ]
        for session, client in ((a, one), (b, two)):
            seen = _probe(_container(client, session["id"]), [f"10.215.0.1:{proxy_port}", *closed])
            assert seen.pop(f"10.215.0.1:{proxy_port}") == "open", (session["node"], seen)
            assert all(v != "open" for v in seen.values()), (session["node"], seen)
            # Refused at once, not left to time out.
            assert "TimeoutError" not in seen.values() and "timeout" not in seen.values(), seen
        # The Hub (outside the sessions' network) reaches both servers where the nodes publish them.
        assert _listening(nodes.addr1, a_published) and _listening(nodes.addr2, b_published)
    finally:
        for p in listeners:
            p.terminate()
            p.wait(10)


def _listening(host, port):
    import socket

    try:
        socket.create_connection((host, port), timeout=3).close()
        return True
    except OSError:
        return False


def test_folder_written_on_node_1_is_read_on_node_2(env, nodes, engines):
    hub, alice = env["hub"], env["alice"]
    one, two = engines
    # The nodes of the test above (registered again: idempotent), each with one free GPU.
    register_node(hub.db_url, "swarm-1", {"swarm.node_id": nodes.node1_id, "address": nodes.addr1}, gpus=1)
    register_node(hub.db_url, "swarm-2", {"swarm.node_id": nodes.node2_id, "address": nodes.addr2}, gpus=1)
    r = hub.api("POST", "/vfolders", alice, json={"name": "shared"})
    assert r.status_code == 201, r.text
    options = {**OPTIONS, "vfolders": ["shared"]}
    _spawn(env, "w", options)
    _wait_ready(env, "w")
    _spawn(env, "r", options)
    _wait_ready(env, "r")
    w, rd = _session(env, "w"), _session(env, "r")
    assert {w["node"], rd["node"]} == {"swarm-1", "swarm-2"}, (w, rd)
    writer, reader = (w, rd) if w["node"] == "swarm-1" else (rd, w)
    code, out = _exec(
        _container(one, writer["id"]), "echo written-on-node-1 > ~/vfolders/shared/note.txt && echo ok"
    )
    assert code == 0 and out.strip() == "ok", out
    code, out = _exec(_container(two, reader["id"]), "cat ~/vfolders/shared/note.txt")
    assert code == 0 and out.strip() == "written-on-node-1", out
    # The folder is mounted at /vfolders/shared, in a root-owned tmpfs of the task's, and the session
    # linked ~/vfolders there itself: nothing of the mount is made in the home.
    mounts = _service(engines, "w").attrs["Spec"]["TaskTemplate"]["ContainerSpec"]["Mounts"]
    assert [(m["Type"], m["Target"]) for m in mounts] == [
        ("tmpfs", "/vfolders"),
        ("bind", "/vfolders/shared"),
    ]
    assert mounts[0]["TmpfsOptions"] == {"SizeBytes": 2**20, "Mode": 0o755}
    code, out = _exec(
        _container(two, reader["id"]), "readlink ~/vfolders; stat -c '%U %a' /vfolders; ls -A /vfolders"
    )
    assert code == 0 and out.split() == ["/vfolders", "root", "755", "shared"], out
    _stop(env, "w")
    _stop(env, "r")


def test_a_replica_on_node_2_answers_through_the_endpoints_url(env, nodes, engines):
    hub, alice = env["hub"], env["alice"]
    register_node(hub.db_url, "swarm-1", {"swarm.node_id": nodes.node1_id, "address": nodes.addr1}, gpus=1)
    register_node(hub.db_url, "swarm-2", {"swarm.node_id": nodes.node2_id, "address": nodes.addr2}, gpus=1)
    _spawn(env, "a")  # node 1's GPU: the replica's quarter goes to node 2
    _wait_ready(env, "a")
    assert _session(env, "a")["node"] == "swarm-1"
    _folder(hub, alice, "far-model", {"model-definition.yaml": DEFINITION, "server.py": SERVER})
    body = {
        "name": "far",
        "project": "acme/ml",
        "model_folder": "far-model",
        "replicas": 1,
        "image": IMAGE,
        "slots": {"cpu": 0.5, "mem": "512m", "gpu.shares": 0.25},
    }
    r = hub.api("POST", "/endpoints", alice, json=body)
    assert r.status_code == 201, r.text
    env["servers"].add("far-r1")

    def ready():
        e = hub.api("GET", "/endpoints/far", alice).json()
        return e if e["status"] == "READY" else None

    endpoint = wait_until("endpoint far READY", ready, 180, detail=lambda: hub.log_text()[-6000:])
    (route,) = [r for r in endpoint["routes"] if r["status"] == "RUNNING"]
    assert route["address"].startswith(f"{nodes.addr2}:"), route
    assert _session(env, route["server"])["node"] == "swarm-2"
    token = hub.api("POST", "/endpoints/far/tokens", alice, json={}).json()["token"]
    answer = requests.get(
        f"{hub.url}{endpoint['url'].rstrip('/')}/hello",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    # The model listens on its session's loopback at a port of its own, behind the replica's front,
    # which listens on the node's addresses at the route's port (server_ext/front.py).
    port = route["address"].rsplit(":", 1)[1]
    assert answer.json()["port"] != port
    assert answer.json() | {"auth": None} == {
        "replica": "far-r1",
        "port": answer.json()["port"],
        "host": "127.0.0.1",
        "path": "/hello",
        "auth": None,
        "cwd": answer.json()["cwd"],
    }
    denied = requests.get(f"http://{route['address']}/hello", timeout=30)
    assert denied.status_code == 401, denied.text  # straight at the replica: no credential, no model
    # The session's own inference page proxies the same port on its loopback.
    page = requests.get(
        f"{hub.url}/user/alice/far-r1/labfleet/inference/health",
        headers={"Authorization": f"token {alice}"},
        timeout=30,
    )
    assert page.status_code == 200 and page.json() == {"ok": True}, page.text
    r = hub.api("DELETE", "/endpoints/far", alice)
    assert r.status_code in (200, 202, 204), r.text
    wait_until(
        "replica far-r1 gone",
        lambda: "far-r1" not in hub.hub_api("GET", "/users/alice").json()["servers"],
        90,
        detail=lambda: hub.log_text()[-4000:],
    )
    env["servers"].discard("far-r1")
    _stop(env, "a")


def test_an_environment_built_on_node_1_runs_on_node_2_pulled_from_the_registry(
    env, nodes, engines, registry
):
    """My Environments on two nodes: the service builds on node 1's engine and pushes to the fleet's
    registry; a session of the environment placed on node 2, which never had the image, pulls it
    from there and runs it."""
    hub, alice = env["hub"], env["alice"]
    one, two = engines
    _base_in_registry(registry)
    marker = os.urandom(8).hex()
    post_build = f"#!/bin/sh\nset -e\necho {marker} > /opt/venv/marker.txt\n"
    r = hub.api(
        "POST",
        "/environments",
        alice,
        json={"name": "marked", "base": IMAGE, "files": {"postBuild": post_build}},
    )
    assert r.status_code == 202, r.text
    env_id = r.json()["id"]

    def built():
        e = hub.api("GET", f"/environments/{env_id}", alice).json()
        return e if e["status"] in ("READY", "FAILED") else None

    done = wait_until("the environment built", built, 300, interval=0.5)
    log = hub.api("GET", f"/environments/{env_id}/logs", alice).text
    assert done["status"] == "READY", (done["status_reason"], log[-3000:])
    assert (
        done["image"] == f"{registry}/labfleet/env:{done['recipe_hash']}" and f"pushed {done['image']}" in log
    )
    assert one.images.get(done["image"]).id == done["image_id"]
    assert not two.images.list(name=done["image"])  # node 2 has it only from the registry

    register_node(hub.db_url, "swarm-1", {"swarm.node_id": nodes.node1_id, "address": nodes.addr1}, gpus=1)
    register_node(hub.db_url, "swarm-2", {"swarm.node_id": nodes.node2_id, "address": nodes.addr2}, gpus=1)
    _spawn(env, "a")  # node 1's GPU: the environment's session goes to node 2
    _wait_ready(env, "a")
    assert _session(env, "a")["node"] == "swarm-1"
    command = "cat /opt/venv/marker.txt; exit 3"
    _spawn(env, "envjob", {**OPTIONS, "image": f"env:{env_id}", "type": "batch", "command": command})

    def ended():
        found = [s for s in hub.api("GET", "/sessions", alice).json() if s["name"] == "envjob"]
        return found[0] if found and found[0]["status"] in ("TERMINATED", "ERROR") else None

    job = wait_until("the session ended", ended, 240, interval=0.5, detail=lambda: hub.log_text()[-5000:])
    # A batch session on node 2: it ends with its command's exit code, its output in its log.
    assert (job["node"], job["status"], job["exit_code"], job["image"]) == (
        "swarm-2",
        "TERMINATED",
        3,
        done["image"],
    ), job
    assert job["devices"] == []
    logs = hub.api("GET", f"/sessions/{job['id']}/logs", alice)
    assert logs.status_code == 200 and marker in logs.text, logs.text[-3000:]
    assert two.images.get(done["image"]).id == done["image_id"]  # pulled from the registry
    # The Hub has no server left, nor Swarm a service.
    wait_until(
        "the batch server gone",
        lambda: (
            "envjob" not in hub.hub_api("GET", "/users/alice").json()["servers"]
            and not one.services.list(filters={"name": f"{SERVICE_PREFIX}-alice--envjob"})
        ),
        60,
    )
    env["servers"].discard("envjob")
    _stop(env, "a")
    # Deleted: both its names leave node 1 (the service's part); node 2's pulled copy is the test's.
    assert hub.api("DELETE", f"/environments/{env_id}", alice).status_code == 200
    two.images.remove(done["image"], force=True)
    local = done["image"].removeprefix(f"{registry}/")
    wait_until(
        "node 1's names of the image removed, and the registry's",
        lambda: (
            not one.images.list(name=done["image"])
            and not one.images.list(name=local)
            and not _in_registry(done["image"])
        ),
        60,
    )


def test_a_node_without_swarm_labels_fails_the_spawn_clearly(env):
    hub, alice, root = env["hub"], env["alice"], env["root"]
    r = hub.api("POST", "/resource-groups", root, json={"name": "nolabels", "is_public": True})
    assert r.status_code == 201, r.text
    register_node(hub.db_url, "plain-node", {}, gpus=1, group="nolabels")
    env["servers"].add("x")
    r = hub.hub_api("POST", "/users/alice/servers/x", json={**OPTIONS, "resource_group": "nolabels"})

    def ended():
        found = [s for s in hub.api("GET", "/sessions", alice).json() if s["name"] == "x"]
        return found[0] if found and found[0]["status"] in ("TERMINATED", "ERROR", "CANCELLED") else None

    done = wait_until("the spawn on a node with no labels ended", ended, 60, detail=lambda: r.text)
    assert done["status"] == "ERROR" and done["devices"] == [], done
    assert "has no swarm.node_id label" in done["status_reason"], done
    view = _nodes_view(env)["plain-node"]
    assert view["allocated"]["gpu.shares"] == 0
    wait_until("no server x", lambda: "x" not in hub.hub_api("GET", "/users/alice").json()["servers"], 30)
    env["servers"].discard("x")


@pytest.fixture(scope="module")
def agents(env, nodes):
    """One agent per Swarm node (node 2's inside its namespace), in their own resource group."""
    why = agent_available()
    if why:
        pytest.fail(f"the node agent is needed for this test: {why}")
    hub, root = env["hub"], env["root"]
    r = hub.api(
        "POST", "/resource-groups", root, json={"name": "swarm", "is_public": True, "placement": "pack"}
    )
    assert r.status_code == 201, r.text
    started = []
    try:
        for name, addr, host, netns in (
            ("agent-1", nodes.addr1, "unix:///var/run/docker.sock", None),
            ("agent-2", nodes.addr2, f"unix://{nodes.sock2}", nodes.netns),
        ):
            token = node_token(hub, name)
            started.append(
                Agent(
                    hub, name, token=token, address=addr, docker_host=host, group="swarm", gpus=1, netns=netns
                )
            )
        for a in started:
            wait_until(
                f"{a.name} registered and ALIVE",
                lambda a=a: _nodes_view(env).get(a.name, {}).get("status") == "ALIVE",
                120,
                detail=a.log_text,
            )
        yield {a.name: a for a in started}
    finally:
        for a in started:
            a.stop()


def test_agents_register_swarm_nodes_and_a_drained_node_gets_nothing(env, nodes, agents):
    view = _nodes_view(env)
    assert view["agent-1"]["labels"]["swarm.node_id"] == nodes.node1_id
    assert view["agent-2"]["labels"]["swarm.node_id"] == nodes.node2_id
    assert view["agent-2"]["labels"]["address"] == nodes.addr2
    drain = subprocess.run(
        ["labfleet", "node", "drain", "agent-1"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **{k: v for k, v in env["hub"].env.items() if k.startswith("LABFLEET_")}},
    )
    assert drain.returncode == 0, drain.stderr
    assert _nodes_view(env)["agent-1"]["schedulable"] is False
    _spawn(env, "d", {**OPTIONS, "resource_group": "swarm"})
    _wait_ready(env, "d")
    assert _session(env, "d")["node"] == "agent-2"
    _stop(env, "d")


def test_a_session_on_node_2_is_saved_by_its_agent_and_its_image_runs_on_node_1(
    env, nodes, engines, registry, agents
):
    """Save as environment for a Swarm session on node 2: only node 2's engine has its container, so
    the service hands the commit to node 2's agent, which commits it, pushes the image to the fleet's
    registry and reports; a batch session of the environment on node 1 pulls it and has the file
    added on node 2."""
    hub, root, alice = env["hub"], env["root"], env["alice"]
    one, two = engines
    _base_in_registry(registry)

    def schedulable(node, yes):
        r = hub.api("PATCH", f"/nodes/{node}", root, json={"schedulable": yes})
        assert r.status_code == 200, r.text

    schedulable("agent-1", False)
    _spawn(env, "v", {**OPTIONS, "resource_group": "swarm"})
    _wait_ready(env, "v")
    s = _session(env, "v")
    assert s["node"] == "agent-2", s
    code, out = _exec(_container(two, s["id"]), "echo kept > ~/saved.txt")
    assert code == 0, out
    r = hub.api("POST", "/environments", alice, json={"name": "from-node-2", "session": s["id"]})
    assert r.status_code == 202, r.text
    env_id = r.json()["id"]

    def built():
        e = hub.api("GET", f"/environments/{env_id}", alice).json()
        return e if e["status"] in ("READY", "FAILED") else None

    saved = wait_until("the session saved", built, 180, interval=0.5, detail=agents["agent-2"].log_text)
    log = hub.api("GET", f"/environments/{env_id}/logs", alice).text
    assert saved["status"] == "READY", (saved["status_reason"], log[-3000:])
    assert saved["image"] == f"{registry}/labfleet/env:{saved['recipe_hash']}", saved
    assert "handed over to the agent of node agent-2" in log and f"pushed {saved['image']}" in log, log
    assert f"labfleet: READY: image {saved['image']}" in log, log
    assert two.images.get(saved["image"]).id == saved["image_id"]  # committed on node 2's engine
    assert not one.images.list(name=saved["image"])
    _stop(env, "v")

    # On node 1, which only the registry gave the image.
    schedulable("agent-2", False)
    schedulable("agent-1", True)
    try:
        job = {**OPTIONS, "resource_group": "swarm", "image": f"env:{env_id}", "type": "batch"}
        _spawn(env, "vjob", {**job, "command": "cat ~/saved.txt"})

        def ended():
            found = [x for x in hub.api("GET", "/sessions", alice).json() if x["name"] == "vjob"]
            return found[0] if found and found[0]["status"] in ("TERMINATED", "ERROR") else None

        done = wait_until("the batch session ended", ended, 180, interval=0.5)
        assert (done["node"], done["status"], done["exit_code"]) == ("agent-1", "TERMINATED", 0), done
        logs = hub.api("GET", f"/sessions/{done['id']}/logs", alice)
        assert "kept" in logs.text.split(), logs.text[-3000:]
        assert one.images.get(saved["image"]).id == saved["image_id"]  # pulled from the registry
        env["servers"].discard("vjob")
    finally:
        schedulable("agent-2", True)
        schedulable("agent-1", False)
    assert _in_registry(saved["image"])
    assert hub.api("DELETE", f"/environments/{env_id}", alice).status_code == 200
    wait_until("the image out of the registry", lambda: not _in_registry(saved["image"]), 60)
    for image in two.images.list(name=saved["image"]):  # node 2's copy is the test's to remove
        two.images.remove(image.id, force=True)


def test_killing_node_2s_agent_makes_it_lost_and_frees_its_allocations(env, nodes, agents):
    _spawn(env, "k", {**OPTIONS, "resource_group": "swarm"})
    _wait_ready(env, "k")
    s = _session(env, "k")
    assert s["node"] == "agent-2", s
    agents["agent-2"].kill()
    wait_until(
        "agent-2 LOST",
        lambda: _nodes_view(env)["agent-2"]["status"] == "LOST",
        180,
        interval=1,
        detail=lambda: env["hub"].log_text()[-4000:],
    )
    wait_until(
        "agent-2's allocations freed",
        lambda: _nodes_view(env)["agent-2"]["allocated"]["gpu.shares"] == 0,
        60,
        interval=1,
    )
    env["hub"].hub_api("DELETE", "/users/alice/servers/k")
    env["servers"].discard("k")
