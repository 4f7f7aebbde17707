"""A local session is a tenant (issue [1/7]): what an attacker tries from inside a real session.

One Hub (local sessions, the Hub as root, as the README's embedded Hub runs), two domains. bob
(acme) runs a session and shares a folder read-only with alice; gus (globex) runs an inference
session; alice's batch session runs tests/session_probe.py, a tenant's attempts, as its command
(a subprocess of her real session, in its sandbox), and the test reads what happened from the
session's log:

- it is not root and holds no capability (CapEff and the bounding set 0, no_new_privs);
- mount and umount fail, and so does a remount of the read-only share; it cannot make a user
  namespace of its own (where it would hold every capability); nothing lands in the share;
- the state directory (DBs, secrets), other homes, another domain's folder, root's home,
  /etc/shadow, /run cannot be read;
- no listener on the host (the Hub's API, the labfleet service, the proxy's API, kernels, other
  Hubs: every TCP listener on the host's loopback or on all its addresses, taken from the host's
  own socket table) is reached at 127.0.0.1, at the gateway or at the host's addresses; nor bob's
  session, nor gus's replica; the Hub's public proxy is, and through it the Hub and the labfleet
  service answer the session's own token as alice;
- a memory hog over the session's limit is killed; /tmp is bounded; once its server is up (the end
  of its startup CPU boost) it is held to the half core it asked for;
- a listener it opens is not on the host's loopback, and is on the session's own address;
- an address the test serves outside the host's loopback (a network namespace the test makes) is
  reached, as the internet would be; so an nbgitpuller link (``/hub/user-redirect/git-pull?repo=``)
  clones a repository served there into bob's running session, as the session's user.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import unquote

import psutil
import pytest
import requests

from tests.gitserver import make_work_tree, publish
from tests.hubfixture import free_port, outside_network, remove_outside_network, session_address, start_hub

pytestmark = pytest.mark.hub

PROBE = Path(__file__).with_name("session_probe.py")
MEM = 512 << 20
TMP = 64 << 20
CPU = 0.5  # cores: the probe's session is held to half a core
CONFIG = (
    f"c.LabfleetSpawnerMixin.queue_poll_interval = 0.3\nc.LabfleetLocalSpawner.session_tmp_size = {TMP}\n"
)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.fail("the tenant boundary is the root Hub's: run the tests as root, as CI does")
    state = tmp_path_factory.mktemp("boundary")
    hub = start_hub(state, extra_config=CONFIG)
    root = hub.wait_token("root")
    for method, path, body in [
        ("POST", "/domains", {"name": "acme"}),
        ("POST", "/domains", {"name": "globex"}),
        ("POST", "/projects", {"domain": "acme", "name": "ml"}),
        ("POST", "/projects", {"domain": "globex", "name": "lab"}),
        ("POST", "/users", {"username": "alice", "domain": "acme", "projects": ["ml"]}),
        ("POST", "/users", {"username": "bob", "domain": "acme", "projects": ["ml"]}),
        ("POST", "/users", {"username": "gus", "domain": "globex", "projects": ["lab"]}),
    ]:
        r = hub.api(method, path, root, json=body)
        assert r.status_code == 201, (path, r.text)
    tokens = {name: hub.wait_token(name) for name in ("alice", "bob", "gus")}
    outside = outside_network()
    yield hub, state, tokens, outside
    remove_outside_network(outside[0], outside[2])
    for name, server in (("bob", "b"), ("gus", "r"), ("alice", "probe")):
        hub.hub_api("DELETE", f"/users/{name}/servers/{server}")
    hub.stop()


def _ready(hub, name, server, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        model = hub.hub_api("GET", f"/users/{name}").json()["servers"].get(server)
        if model and model.get("ready"):
            return model
        time.sleep(0.3)
    raise AssertionError(f"{name}/{server} never became ready\n{hub.log_text()[-3000:]}")


def _cpu_quota(session_id: str) -> int:
    """The session's CPU quota per 100 ms period (µs), read from its control group outside it."""
    v1 = Path("/sys/fs/cgroup/cpu/labfleet", session_id, "cpu.cfs_quota_us")
    if v1.exists():
        return int(v1.read_text())
    quota, period = Path("/sys/fs/cgroup/labfleet", session_id, "cpu.max").read_text().split()
    assert period == "100000"
    return int(quota)


def _host_listeners() -> list[tuple[str, int]]:
    """Every TCP port the host listens on, at the addresses a session would try."""
    out = set()
    for c in psutil.net_connections(kind="tcp"):
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.ip in ("127.0.0.1", "0.0.0.0", "::", "::1"):
            out.add(c.laddr.port)
    return sorted(("127.0.0.1", p) for p in out)


def _host_addresses() -> list[str]:
    """The host's own addresses a session could try besides its gateway: those of the interface of
    the default route (other interfaces here may be other test runs' bridges, gone any moment, and
    a connection to a vanished address would leave the machine)."""
    route = subprocess.run(["ip", "-j", "route", "show", "default"], capture_output=True, text=True).stdout
    devices = {r["dev"] for r in json.loads(route or "[]") if r.get("dev")}
    return sorted(
        a.address
        for name, addrs in psutil.net_if_addrs().items()
        if name in devices
        for a in addrs
        if a.family.name == "AF_INET"
    )


def test_a_session_cannot_leave_its_sandbox(env):
    hub, state, tokens, (_, outside_ip, _, near) = env
    alice, bob, gus = tokens["alice"], tokens["bob"], tokens["gus"]
    # bob shares a folder read-only with alice; gus (another domain) has a folder of his own.
    shared = hub.api("POST", "/vfolders", bob, json={"name": "bob-data"}).json()
    assert (
        hub.api("PUT", f"/vfolders/{shared['id']}/files/given.txt", bob, data=b"from bob").status_code == 201
    )
    inv = hub.api(
        "POST", f"/vfolders/{shared['id']}/invitations", bob, json={"invitee": "alice", "permission": "ro"}
    )
    assert hub.api("POST", f"/vfolder-invitations/{inv.json()['id']}/accept", alice).status_code == 200
    secret = hub.api("POST", "/vfolders", gus, json={"name": "globex-secret"}).json()
    assert hub.api("PUT", f"/vfolders/{secret['id']}/files/plans.txt", gus, data=b"globex").status_code == 201

    # bob's session and gus's replica run; their addresses are what alice's session tries.
    assert hub.hub_api("POST", "/users/bob/servers/b", json={"project": "ml"}).status_code in (201, 202)
    replica = {"project": "lab", "type": "inference", "port": 9000}
    replica["command"] = "python3 -m http.server {port} --bind 0.0.0.0"
    assert hub.hub_api("POST", "/users/gus/servers/r", json=replica).status_code in (201, 202)
    _ready(hub, "bob", "b")
    _ready(hub, "gus", "r")
    bob_ip, gus_ip = session_address(state, "bob", "b"), session_address(state, "gus", "r")
    # The host reaches both (the proxy does); the probe below must not.
    assert requests.get(f"http://{bob_ip}:8888/user/bob/b/api", timeout=10).status_code == 200
    deadline = time.monotonic() + 30
    while True:  # the replica's command is still starting
        try:
            socket.create_connection((gus_ip, 9000), timeout=5).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "gus's replica never listened"
            time.sleep(0.5)

    home = state / "homes" / "alice"
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(PROBE, home / "session_probe.py")
    gateway = hub.env["LABFLEET_SESSION_SUBNET"].rsplit(".", 1)[0] + ".1"
    port = int(hub.url.rsplit(":", 1)[1])
    listeners = _host_listeners()
    assert ("127.0.0.1", hub.ports[1]) in listeners and ("127.0.0.1", hub.ports[3]) in listeners
    targets = listeners + [(gateway, p) for _, p in listeners if p != port]
    # The control plane's own ports at every other address of the host.
    plane = [port, *hub.ports[1:]]
    targets += [(a, p) for a in [*_host_addresses(), near] if a != gateway for p in plane]
    targets += [(bob_ip, 8888), (gus_ip, 9000), ("169.254.169.254", 80)]
    listen_port = free_port()
    plan = {
        "unreachable": targets,
        "reachable": [(outside_ip, 8080), (gateway, port)],
        "unreadable": [
            str(state / "labfleet.sqlite"),
            str(state / "jupyterhub.sqlite"),
            str(state / "jupyterhub_cookie_secret"),
            str(state / "labfleet_secret.key"),
            str(state / "session-logs"),
            str(state / "vfolders"),
            str(state / "vfolders" / secret["id"] / "plans.txt"),
            str(state / "homes" / "bob"),
            "/etc/shadow",
            "/root/.bashrc",
            "/run/netns",
            "/var/run/docker.sock",
            "/proc/1/environ",
        ],
        "listing": [str(state), str(state / "homes"), "/root"],
        "read_only": [str(home / "vfolders" / "bob-data")],
        "urls": {
            "hub": [f"http://{gateway}:{port}/hub/api/user", "$JUPYTERHUB_API_TOKEN"],
            "service": [f"http://{gateway}:{port}/services/labfleet/api/me", "$JUPYTERHUB_API_TOKEN"],
        },
        "hog_bytes": 3 * MEM,
        "busy_seconds": 3,
        "tmp_bytes": 2 * TMP,
        "listen_port": listen_port,
        "handshake_dir": str(home),
    }
    text = json.dumps(plan).replace('"$JUPYTERHUB_API_TOKEN"', '"TOKEN"')
    # The session's own token is put in by the session (the test never sees it).
    command = (
        "python3 -c 'import json,os,sys; p=json.loads(sys.argv[1]); "
        '[u.__setitem__(1, os.environ["JUPYTERHUB_API_TOKEN"]) for u in p["urls"].values()]; '
        'os.execvp("python3", ["python3", "session_probe.py", json.dumps(p)])\' '
        f"'{text}'"
    )
    options = {
        "project": "ml",
        "type": "batch",
        "mem": MEM,
        "cpu": CPU,
        "gpu": 0.25,
        "vfolders": ["bob-data"],
    }
    options["command"] = command
    assert hub.hub_api("POST", "/users/alice/servers/probe", json=options).status_code in (201, 202)

    # While it listens: not on the host's loopback, but on its own address.
    deadline = time.monotonic() + 240
    while not (home / "listening").exists():
        assert time.monotonic() < deadline, hub.log_text()[-3000:]
        time.sleep(0.3)
    seen = json.loads((home / "listening").read_text())
    # Its startup boost is over: the kernel holds it to the CPU it asked for.
    (running,) = [s for s in hub.api("GET", "/sessions", alice).json() if s["name"] == "probe"]
    assert _cpu_quota(running["id"]) == int(CPU * 100_000)
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{listen_port}/", timeout=5)
    on_host = psutil.net_connections(kind="tcp")
    assert not [c for c in on_host if c.status == psutil.CONN_LISTEN and c.laddr.port == listen_port]
    with socket.create_connection((seen["address"], listen_port + 1), timeout=5):
        pass
    (home / "release").write_text("")

    deadline = time.monotonic() + 120
    while True:
        found = [s for s in hub.api("GET", "/sessions", alice).json() if s["name"] == "probe"]
        if found and found[-1]["status"] in ("TERMINATED", "ERROR"):
            break
        assert time.monotonic() < deadline, hub.log_text()[-3000:]
        time.sleep(0.5)
    log = hub.api("GET", f"/sessions/{found[-1]['id']}/logs", alice).text
    lines = [line for line in log.splitlines() if line.startswith("PROBE ")]
    assert lines, log[-3000:]
    out = json.loads(lines[-1][len("PROBE ") :])

    assert out["uid"] != 0 and out["euid"] != 0
    assert int(out["CapEff"], 16) == 0 and int(out["CapBnd"], 16) == 0 and out["NoNewPrivs"] == "1"
    assert out["address"] == seen["address"] and out["address"] not in (bob_ip, gus_ip)
    assert out["mount"]["rc"] != 0 and out["umount"]["rc"] != 0, out
    assert out["userns"]["rc"] != 0, out["userns"]  # no user namespace of its own either
    for target, result in out["unreachable"].items():
        assert result != "connected", f"{target} was reached from the session"
    for target, result in out["reachable"].items():
        assert result == "connected", f"{target}: {result}"
    for path, result in out["unreadable"].items():
        assert result.startswith(("FileNotFoundError", "PermissionError")), (path, result)
    # What the sandbox shows of the way to the session's home, and nothing beside it.
    assert out["listing"][str(state)] == "listed: homes", out["listing"]
    assert out["listing"][str(state / "homes")] == "listed: alice", out["listing"]
    assert out["listing"]["/root"].startswith(("FileNotFoundError", "listed: ")), out["listing"]
    assert out["listing"]["/root"] in ("listed: ", "FileNotFoundError: No such file or directory")
    for attempt in out["read_only"].values():
        # Not directly, not by a remount, not from a user namespace of its own (the mount is locked).
        assert attempt["direct"].startswith("OSError") and attempt["remount"]["rc"] != 0, attempt
        assert attempt["exists_after"] is False, attempt
    assert hub.api("GET", f"/vfolders/{shared['id']}/files/written-by-probe", bob).status_code == 404
    # Through the public proxy, with its own token, the session is alice.
    for name in ("hub", "service"):
        status, body = out["urls"][name].split(" ", 1)
        assert status == "200" and '"alice"' in body, out["urls"][name]
    assert out["cpu_share"] <= CPU * 1.2, out["cpu_share"]  # a busy loop gets its quota, no more
    assert out["hog"]["rc"] == -9, out["hog"]  # the kernel's OOM killer, inside the session's group
    assert out["tmp"].startswith("OSError after") and int(out["tmp"].rsplit(" ", 1)[1]) <= TMP, out["tmp"]


def test_an_nbgitpuller_link_pulls_into_a_running_session(env, tmp_path):
    """nbgitpuller's links work unchanged: the Hub's user-redirect keeps the query, and the session's
    own nbgitpuller clones from a host outside (as the session's user, in its sandbox)."""
    hub, state, tokens, (netns, outside_ip, _, _) = env
    bob = {"Authorization": f"token {tokens['bob']}"}
    if not (hub.hub_api("GET", "/users/bob").json()["servers"].get("b") or {}).get("ready"):
        assert hub.hub_api("POST", "/users/bob/servers/b", json={"project": "ml"}).status_code in (201, 202)
        _ready(hub, "bob", "b")
    lesson = json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    publish(make_work_tree(tmp_path / "teacher", {"lesson.ipynb": lesson}), tmp_path / "srv", "course.git")
    served = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{netns}", "python3", "-m", "http.server", "8081", "--bind", outside_ip,
         "--directory", str(tmp_path / "srv")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        repo = f"http://{outside_ip}:8081/course.git"
        query = f"repo={repo}&branch=main&urlpath=lab/tree/course/lesson.ipynb"
        # Logged out, the link's whole query waits in the login's next (the Hub's page asks for a login).
        r = requests.get(f"{hub.url}/hub/user-redirect/git-pull?{query}", allow_redirects=False, timeout=30)
        assert r.status_code == 302, r.text
        assert unquote(r.headers["Location"]).endswith(f"next=/hub/user-redirect/git-pull?{query}"), r.headers
        page = requests.get(f"{hub.url}/user/bob/b/git-pull?{query}", headers=bob, timeout=30)
        assert page.status_code == 200 and "git-pull" in page.text  # nbgitpuller's own page, in the session
        deadline = time.monotonic() + 60
        while True:  # the server in the namespace is starting
            try:
                socket.create_connection((outside_ip, 8081), timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        events = requests.get(
            f"{hub.url}/user/bob/b/git-pull/api",
            # depth 0: a whole clone (git serves no shallow clone over the dumb protocol of this server)
            params={"repo": repo, "branch": "main", "targetpath": "course", "depth": "0"},
            headers=bob,
            timeout=120,
        ).text
        phases = [json.loads(line[6:])["phase"] for line in events.splitlines() if line.startswith("data: ")]
        assert phases and phases[-1] == "finished", events[-2000:]
        got = requests.get(f"{hub.url}/user/bob/b/api/contents/course/lesson.ipynb", headers=bob, timeout=30)
        assert got.status_code == 200 and got.json()["type"] == "notebook", got.text[:500]
        cloned = state / "homes" / "bob" / "course"
        assert (cloned / ".git").is_dir() and (cloned / "lesson.ipynb").stat().st_uid != 0
    finally:
        served.kill()
        served.wait(10)
