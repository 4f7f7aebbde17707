"""A real JupyterHub for tests: ``jupyterhub -f jupyterhub_config.py`` as a subprocess on
127.0.0.1, with the real configurable-http-proxy and the labfleet service it starts."""

from __future__ import annotations

import atexit
import fcntl
import ipaddress
import json
import os
import pwd
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from labfleet.core import database, unitofwork
from labfleet.core.authz import Actor
from labfleet.core.secretbox import ensure_key_file
from labfleet.tenancy import directory
from labfleet.tenancy.policies import ensure_default_keypair_policy

REPO = Path(__file__).parent.parent
ADMIN_PASSWORD = "root-password-1"


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A free TCP port on 127.0.0.1, never one this process has handed out before: the kernel may
    give a just-closed port again, and two of one Hub's ports alike (its own and the proxy's API)
    make it fail to start."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def _session_network() -> dict[str, str]:
    """One bridge and subnet for the local sessions of every Hub this test process starts: not the
    product's default (a Hub of scripts/up may run here), a subnet no interface of this machine
    has, taken at once (the bridge is made here, under a lock, so that two test runs at the same
    time never pick one subnet), removed when the process ends."""
    if os.geteuid() != 0:
        return {}
    bridge = f"lft{os.getpid() % 1000000}"
    with open("/run/lock/labfleet-test-subnets", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True).stdout or "[]"
        used = [
            ipaddress.IPv4Network(f"{a['local']}/{a['prefixlen']}", strict=False)
            for link in json.loads(out)
            for a in link.get("addr_info", [])
        ]
        for candidate in ipaddress.IPv4Network("10.216.0.0/14").subnets(new_prefix=24):
            if not any(candidate.overlaps(u) for u in used):
                break
        atexit.register(_remove_session_network, bridge)
        gateway = f"{candidate.network_address + 1}/{candidate.prefixlen}"
        for cmd in (["link", "add", bridge, "type", "bridge"], ["addr", "add", gateway, "dev", bridge]):
            subprocess.run(["ip", *cmd], capture_output=True, check=True)
    return {"LABFLEET_SESSION_BRIDGE": bridge, "LABFLEET_SESSION_SUBNET": str(candidate)}


def _remove_session_network(bridge: str) -> None:
    """The test bridge, its sessions' namespaces and its Hubs' nftables tables."""
    for name in os.listdir("/run/netns") if os.path.isdir("/run/netns") else []:
        if name.startswith(bridge + "-"):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout.split()
    for table in tables:
        if table.startswith(f"labfleet_{bridge}_"):
            subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True)
    subprocess.run(["ip", "link", "delete", bridge], capture_output=True)


SESSION_NETWORK = _session_network()


def _docker_session_network() -> dict[str, str]:
    """The Docker sessions' network of every Hub this test process starts (LABFLEET_BACKEND=docker):
    a network, bridge and subnet of its own (not the product's default, not the local sessions'
    subnet, none that an interface of this machine has), removed when the process ends."""
    if os.geteuid() != 0:
        return {}
    out = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True).stdout or "[]"
    used = [
        ipaddress.IPv4Network(f"{a['local']}/{a['prefixlen']}", strict=False)
        for link in json.loads(out)
        for a in link.get("addr_info", [])
    ]
    if SESSION_NETWORK:
        used.append(ipaddress.IPv4Network(SESSION_NETWORK["LABFLEET_SESSION_SUBNET"]))
    candidates = list(ipaddress.IPv4Network("10.220.0.0/14").subnets(new_prefix=24))
    start = os.getpid() % len(candidates)  # test processes side by side start apart
    subnet = next(c for c in candidates[start:] + candidates[:start] if not any(c.overlaps(u) for u in used))
    bridge = f"lfd{os.getpid() % 1000000}"
    name = f"lftest-{bridge}"
    atexit.register(remove_docker_session_network, name, bridge)
    return {
        "LABFLEET_DOCKER_NETWORK": name,
        "LABFLEET_DOCKER_SESSION_BRIDGE": bridge,
        "LABFLEET_DOCKER_SESSION_SUBNET": str(subnet),
    }


def remove_docker_session_network(name: str, bridge: str) -> None:
    """The test's Docker network (once its containers are gone), its Hubs' nftables tables, the bridge."""
    if shutil.which("docker") and os.path.exists(f"/sys/class/net/{bridge}"):
        subprocess.run(["docker", "network", "rm", name], capture_output=True, stdin=subprocess.DEVNULL)
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout.split()
    for table in tables:
        if table.startswith(f"labfleet_{bridge}_"):
            subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True)
    if os.path.exists(f"/sys/class/net/{bridge}"):
        subprocess.run(["ip", "link", "delete", bridge], capture_output=True)


DOCKER_SESSION_NETWORK = _docker_session_network()


def spawner_state(state: Path, name: str, server: str) -> dict:
    """What the Hub keeps of a user's server (its spawner's state: pid, session id, network index)."""
    db = sqlite3.connect(state / "jupyterhub.sqlite")
    try:
        rows = db.execute(
            "SELECT spawners.state FROM spawners JOIN users ON users.id = spawners.user_id "
            "WHERE users.name = ? AND spawners.name = ?",
            (name, server),
        ).fetchall()
    finally:
        db.close()
    return json.loads(rows[0][0] or "{}") if rows else {}


def session_netns(state: Path, name: str, server: str) -> str:
    """The network namespace of a running local session of a Hub this process started."""
    return f"/run/netns/{SESSION_NETWORK['LABFLEET_SESSION_BRIDGE']}-{spawner_state(state, name, server)['labfleet_net']}"


def session_address(state: Path, name: str, server: str) -> str:
    """A local session's address on its bridge (where the proxy, and the host, reach it)."""
    subnet = ipaddress.IPv4Network(SESSION_NETWORK["LABFLEET_SESSION_SUBNET"])
    return str(subnet.network_address + 2 + spawner_state(state, name, server)["labfleet_net"])


def in_session(state: Path, name: str, server: str, argv: list[str]) -> list[str]:
    """``argv`` as a program of a running local session would run: in its network namespace, as the
    session account, with no capability (what the session's own code can do on the network)."""
    account = pwd.getpwnam("labfleet-session")
    drop = [f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--clear-groups", "--inh-caps=-all"]
    return ["nsenter", f"--net={session_netns(state, name, server)}", "setpriv", *drop, "--", *argv]


def seed(db_url: str) -> None:
    """Create the schema, the default policy, a domain `root` and the superadmin `root`."""
    engine = database.make_engine(db_url)
    database.upgrade(engine)
    factory = unitofwork.make_session_factory(engine)
    with database.session_scope(factory) as db:
        ensure_default_keypair_policy(db)
        cli = Actor.cli()
        directory.create_domain(db, cli, {"name": "root"})
        directory.create_user(
            db, cli, {"username": "root", "domain": "root", "role": "superadmin", "password": ADMIN_PASSWORD}
        )
    engine.dispose()


@dataclass
class Hub:
    url: str
    state: Path
    db_url: str
    admin_token: str
    service_token: str
    proc: subprocess.Popen
    log_path: Path
    env: dict = field(default_factory=dict)
    ports: tuple = ()

    @property
    def api_url(self) -> str:
        return self.url + "/services/labfleet/api"

    def hub_api(self, method: str, path: str, token: str | None = None, **kw) -> requests.Response:
        headers = {"Authorization": f"token {token or self.admin_token}"}
        return requests.request(method, f"{self.url}/hub/api{path}", headers=headers, timeout=30, **kw)

    def api(self, method: str, path: str, token: str | None = None, **kw) -> requests.Response:
        headers = kw.pop("headers", {})
        if token:
            headers["Authorization"] = f"token {token}"
        return requests.request(method, f"{self.api_url}{path}", headers=headers, timeout=30, **kw)

    def wait_user(self, name: str, timeout: float = 20) -> None:
        """The service creates Hub users asynchronously: wait until ``name`` exists in the Hub."""
        deadline = time.monotonic() + timeout
        while self.hub_api("GET", f"/users/{name}").status_code != 200:
            if time.monotonic() > deadline:
                raise AssertionError(f"Hub user {name} never appeared")
            time.sleep(0.2)

    def wait_token(self, name: str) -> str:
        """A Hub API token of user ``name``, once the user exists."""
        self.wait_user(name)
        return self.user_token(name)

    def user_token(self, name: str) -> str:
        """A Hub API token of user ``name`` (who must exist in the Hub)."""
        r = self.hub_api("POST", f"/users/{name}/tokens", json={"note": "test", "expires_in": 3600})
        assert r.status_code == 201, r.text
        return r.json()["token"]

    def login(self, username: str, password: str) -> requests.Session:
        """Log in through the Hub's own login form; the session then holds the Hub cookie."""
        s = requests.Session()
        s.get(f"{self.url}/hub/login", timeout=30)
        xsrf = s.cookies.get("_xsrf")
        r = s.post(
            f"{self.url}/hub/login?next=",
            data={"username": username, "password": password, "_xsrf": xsrf},
            allow_redirects=False,
            timeout=30,
        )
        s.login_status = r.status_code  # 302 on success, 403 on failure
        return s

    def wait_ready(self) -> None:
        """Wait until the Hub and the labfleet service answer (stopping the Hub if it never does)."""
        try:
            wait_for(f"{self.url}/hub/api", self.proc, self.log_path)
            wait_for(f"{self.api_url}/openapi.yaml", self.proc, self.log_path)
        except Exception:
            self.stop()
            raise

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def wait_for(url: str, proc: subprocess.Popen, log_path: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyterhub exited with {proc.returncode}:\n{log_path.read_text()[-5000:]}")
        try:
            # 200 only: before the Hub adds its routes the proxy answers 404 itself.
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer in {timeout}s:\n{log_path.read_text()[-5000:]}")


def start_hub(
    state: Path,
    db_url: str | None = None,
    extra_config: str = "",
    do_seed: bool = True,
    ports: tuple = (),
    env: dict | None = None,
    checkout: Path = REPO,
    venv: Path | None = None,
    ip: str = "127.0.0.1",
    console: bool = False,
    wait: bool = True,
) -> Hub:
    """Start the Hub; ``ports`` from an earlier Hub restarts it where running servers expect it; ``env``
    adds to the Hub's environment (and the service's, for the variables the service is passed).

    ``checkout`` and ``venv``: the Hub of another checkout, run by that venv's Python in a new user's
    environment (the venv on PATH; no PYTHONPATH, no LABFLEET_* variables but the Hub's own).
    ``ip``: where the Hub's proxy listens (another node's sessions reach it there).
    ``console``: with the admin console (``labfleet-admin``), for the tests that use it; without, the
    Hub starts about 6 s sooner (it waits for every managed service before it answers).
    ``wait``: False returns once the Hub is started, before it answers: call ``hub.wait_ready()``
    (to start several Hubs side by side; each start sets this process's secret key file, so
    start them one after the other and then wait for them)."""
    if not shutil.which("configurable-http-proxy"):
        raise RuntimeError("configurable-http-proxy is not on PATH: run `bash scripts/setup.sh --test`")
    state.mkdir(parents=True, exist_ok=True)
    db_url = db_url or f"sqlite:///{state / 'labfleet.sqlite'}"
    admin_token = os.urandom(16).hex()
    service_token = os.urandom(16).hex()
    ports = ports or tuple(free_port() for _ in range(4))
    port, hub_port, proxy_api, service_port = ports
    extra_env = env or {}
    env = dict(os.environ)
    if venv is not None:
        env = {k: v for k, v in env.items() if k != "PYTHONPATH" and not k.startswith("LABFLEET_")}
        env.update(PATH=os.pathsep.join([str(venv / "bin"), env.get("PATH", "")]), VIRTUAL_ENV=str(venv))
    else:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env.update(extra_env)
    for key, value in SESSION_NETWORK.items():
        env.setdefault(key, value)
    for key, value in DOCKER_SESSION_NETWORK.items():
        env.setdefault(key, value)
    env.setdefault("LABFLEET_ADMIN_PORT", str(free_port()))  # the admin console's own port
    env.setdefault("LABFLEET_ADMIN_CONSOLE", "1" if console else "0")
    env.update(
        LABFLEET_STATE_DIR=str(state),
        LABFLEET_DB_URL=db_url,
        LABFLEET_SERVICE_PORT=str(service_port),
        LABFLEET_SERVICE_TOKEN=service_token,
        LABFLEET_SECRET_KEY_FILE=str(state / "labfleet_secret.key"),
    )
    os.environ["LABFLEET_SECRET_KEY_FILE"] = env["LABFLEET_SECRET_KEY_FILE"]
    ensure_key_file(state / "labfleet_secret.key")
    if do_seed:
        seed(db_url)
    cfg = state / "test_config.py"
    cfg.write_text(
        f"load_subconfig({str(checkout / 'jupyterhub_config.py')!r})\n"
        "c.JupyterHub.services.append({'name': 'test-admin', 'api_token': %r})\n"
        "c.JupyterHub.load_roles.append({'name': 'test-admin', 'scopes': ['admin:users', 'admin:groups', "
        "'admin:servers', 'tokens', 'read:roles', 'list:users', 'read:users', 'access:servers'], "
        "'services': ['test-admin']})\n"
        "c.JupyterHub.hub_port = %d\n"
        "c.ConfigurableHTTPProxy.api_url = 'http://127.0.0.1:%d'\n"
        "c.JupyterHub.log_level = 'DEBUG'\n" % (admin_token, hub_port, proxy_api) + extra_config
    )
    log_path = state / "jupyterhub.log"
    python = str(venv / "bin" / "python") if venv is not None else sys.executable
    log = open(log_path, "a")
    proc = subprocess.Popen(
        [python, "-m", "jupyterhub", "-f", str(cfg), "--ip", ip, "--port", str(port)],
        cwd=state,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://{ip}:{port}"
    hub = Hub(url, state, db_url, admin_token, service_token, proc, log_path, env, ports)
    if wait:
        hub.wait_ready()
    return hub


def outside_network(prefix: str = "lfout") -> tuple[str, str, subprocess.Popen, str]:
    """A network namespace with an HTTP server on port 8080, standing for the internet: not the
    host's loopback, addresses this test process picks (a free /24 in 10.77.20-99.x; the host end
    of a veth pair, and the far end, which serves). Returns (name, far address, server, near
    address); :func:`remove_outside_network` takes it down."""
    name = f"{prefix}{os.getpid() % 100000}"
    remove_outside_network(name)
    out = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True).stdout or "[]"
    used = [
        ipaddress.IPv4Network(f"{a['local']}/{a['prefixlen']}", strict=False)
        for link in json.loads(out)
        for a in link.get("addr_info", [])
    ]
    net = next(
        n
        for n in (ipaddress.IPv4Network(f"10.77.{i}.0/24") for i in range(20, 100))
        if not any(n.overlaps(u) for u in used)
    )
    near, far = str(net.network_address + 1), str(net.network_address + 2)
    for cmd in (
        ["ip", "netns", "add", name],
        ["ip", "link", "add", name, "type", "veth", "peer", "name", "eth0", "netns", name],
        ["ip", "addr", "add", f"{near}/24", "dev", name],
        ["ip", "link", "set", name, "up"],
        ["ip", "-n", name, "addr", "add", f"{far}/24", "dev", "eth0"],
        ["ip", "-n", name, "link", "set", "eth0", "up"],
        ["ip", "-n", name, "link", "set", "lo", "up"],
    ):
        subprocess.run(cmd, check=True, capture_output=True)
    server = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{name}", "python3", "-m", "http.server", "8080", "--bind", far],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return name, far, server, near


def remove_outside_network(name: str, server: subprocess.Popen | None = None) -> None:
    if server is not None:
        server.kill()
        server.wait(10)
    subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    subprocess.run(["ip", "link", "delete", name], capture_output=True)


def read_http_answer(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The status, headers (lower-case names) and body (by its Content-Length) of the HTTP answer
    on ``s``: for tests that write a request by hand (a body announced and not all sent)."""
    f = s.makefile("rb")
    status = int(f.readline().split()[1])
    headers = {}
    while (line := f.readline().strip()) != b"":
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, f.read(int(headers.get("content-length", 0)))
