"""scripts/up is the restart (issue [1/7]): after a SIGKILL of the Hub, running scripts/up again
brings the Hub back where its sessions expect it, and nothing that binds the old Hub port takes a
session over.

One Hub of the real ``bash scripts/up`` for the module (its own state directory and public port, the
test process's session bridge and subnet, no admin console: it would only make each start slower),
with a demo login's session holding half a GPU:

- its ports are kept in ``<state>/ports`` (0600); the Hub is killed with SIGKILL; scripts/up notices,
  says so and exits, leaving the proxy to the running session;
- a program on the host that listens on the old Hub API port makes the next scripts/up refuse to
  start, naming the port, the program and what to do (it never moves to another port);
- once that program is gone, scripts/up (with no port given: the kept ones) brings the Hub back: the
  session answers a token the Hub issued after the restart (so it asked the new Hub) within 30 s of
  the start, the labfleet service shows it RUNNING with its half GPU, the ports file is as it was,
  and the old proxy was replaced;
- meanwhile a listener on ``127.0.0.1:<old Hub port>`` inside the session's own network namespace
  (opened there with nsenter: what a program of the session could open) received nothing: the
  session calls the Hub through its public proxy at the gateway, never at an address it could bind.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests

from labfleet.cli.init import DEMO_PASSWORD
from tests.hubfixture import SESSION_NETWORK, free_port, session_netns, spawner_state

pytestmark = pytest.mark.hub

REPO = Path(__file__).resolve().parent.parent
UP = REPO / "scripts" / "up"
SERVER = "gpu"
ANSWER_WITHIN = 30  # seconds from the start of scripts/up to the session's answer (the bound)
LISTENER = """
import socket, sys
s = socket.create_server(("127.0.0.1", int(sys.argv[1])))
open(sys.argv[2], "a").write("listening\\n")
while True:
    conn, peer = s.accept()
    open(sys.argv[2], "a").write(f"accepted {peer}\\n")
    conn.close()
"""


class Up:
    """One run of ``bash scripts/up`` in its own process group, its output in ``log``."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                ["bash", str(UP)], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while "[up] labfleet hub: http://" not in self.text():
            if self.proc.poll() is not None:
                raise AssertionError(f"scripts/up exited with {self.proc.returncode}:\n{self.text()[-5000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"scripts/up did not get the Hub up in {timeout}s:\n{self.text()[-5000:]}"
                )
            time.sleep(0.3)

    def hub(self) -> psutil.Process:
        """The JupyterHub process this scripts/up started."""
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                cmd = child.cmdline()
            except psutil.Error:
                continue
            if any(part.endswith("jupyterhub") for part in cmd) and "-f" in cmd:
                return child
        raise AssertionError(f"no JupyterHub under scripts/up (pid {self.proc.pid})")

    def stop(self) -> None:
        """As Ctrl-C does (SIGTERM: a shell may start it with SIGINT ignored): scripts/up stops the
        Hub, which stops its sessions and proxy."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def up_env(state: Path, **extra: str) -> dict[str, str]:
    """A new user's shell: none of this test process's LABFLEET_* variables or Python paths."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("LABFLEET_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    env.update(SESSION_NETWORK)
    env.update(LABFLEET_STATE_DIR=str(state), LABFLEET_ADMIN_CONSOLE="0", **extra)
    return env


def read_ports(state: Path) -> dict[str, int]:
    lines = (state / "ports").read_text().splitlines()
    return {
        k: int(v) for k, _, v in (line.partition("=") for line in lines if line and not line.startswith("#"))
    }


def login_token(url: str, name: str, password: str) -> str:
    """A Hub API token of ``name``, made through the Hub's login form as a person would."""
    s = requests.Session()
    s.get(f"{url}/hub/login", timeout=30)
    r = s.post(
        f"{url}/hub/login?next=",
        data={"username": name, "password": password, "_xsrf": s.cookies.get("_xsrf")},
        allow_redirects=False,
        timeout=30,
    )
    assert r.status_code == 302, r.text[:500]
    r = s.post(
        f"{url}/hub/api/users/{name}/tokens",
        json={"note": "restart test", "expires_in": 3600},
        headers={"X-XSRFToken": s.cookies.get("_xsrf")},
        timeout=30,
    )
    assert r.status_code == 201, r.text
    return r.json()["token"]


def wait(cond, what: str, timeout: float, up: Up):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = cond()
        except requests.RequestException:
            value = None
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"{what}: not within {timeout}s\n{up.text()[-4000:]}")


def status(url: str, token: str) -> int:
    headers = {"Authorization": f"token {token}"}
    return requests.get(f"{url}/user/alice/{SERVER}/api/status", headers=headers, timeout=10).status_code


def session_of(url: str, token: str) -> dict | None:
    headers = {"Authorization": f"token {token}"}
    r = requests.get(f"{url}/services/labfleet/api/sessions", headers=headers, timeout=10)
    found = [s for s in r.json() if s["name"] == SERVER] if r.status_code == 200 else []
    return found[-1] if found else None


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """scripts/up's Hub with alice's session on half a GPU, and a listener on the Hub's API port
    inside that session's network namespace."""
    if os.geteuid() != 0:
        pytest.fail(
            "sessions get network namespaces of their own only under a root Hub: run as root, as CI does"
        )
    root = tmp_path_factory.mktemp("restart-up")
    state = root / "state"
    port = free_port()
    first = Up(up_env(state, LABFLEET_PORT=str(port)), root / "up-1.log")
    ups = [first]
    listener = None
    try:
        t = time.monotonic()
        first.wait_ready()
        started = time.monotonic() - t
        url = f"http://127.0.0.1:{port}"
        token = login_token(url, "alice", DEMO_PASSWORD)
        headers = {"Authorization": f"token {token}"}
        r = requests.post(
            f"{url}/hub/api/users/alice/servers/{SERVER}",
            json={"project": "ml-team", "gpu": 0.5},
            headers=headers,
            timeout=60,
        )
        assert r.status_code in (201, 202), r.text

        def ready():
            model = requests.get(f"{url}/hub/api/users/alice", headers=headers, timeout=10).json()
            return (model.get("servers") or {}).get(SERVER, {}).get("ready")

        wait(ready, "alice's session ready", 120, first)
        ports = read_ports(state)
        spawner = spawner_state(state, "alice", SERVER)
        netns = session_netns(state, "alice", SERVER)
        heard = root / "listener.txt"
        listener = subprocess.Popen(
            [
                "nsenter",
                f"--net={netns}",
                sys.executable,
                "-c",
                LISTENER,
                str(ports["LABFLEET_HUB_PORT"]),
                str(heard),
            ]
        )
        wait(
            lambda: heard.exists() and "listening" in heard.read_text(),
            "the listener in the session",
            30,
            first,
        )
        yield {
            "root": root,
            "state": state,
            "url": url,
            "token": token,
            "ports": ports,
            "pid": spawner["pid"],
            "heard": heard,
            "ups": ups,
            "started": started,
        }
    finally:
        if listener is not None:
            listener.kill()
            listener.wait(10)
        for up in ups:
            up.stop()
        proxy = state / "jupyterhub-proxy.pid"
        if proxy.exists():  # a proxy the test's failure left behind
            try:
                os.kill(int(proxy.read_text().strip()), signal.SIGTERM)
            except (ValueError, OSError):
                pass


def test_a_killed_hub_comes_back_with_its_sessions_and_no_one_takes_its_port(fleet):
    state, url, token, ports = fleet["state"], fleet["url"], fleet["token"], fleet["ports"]
    ups: list[Up] = fleet["ups"]
    first = ups[0]
    hub_port = ports["LABFLEET_HUB_PORT"]
    # The ports are kept, private, and are the ones the Hub runs on.
    assert stat.S_IMODE((state / "ports").stat().st_mode) == 0o600
    assert set(ports) == {
        "LABFLEET_PORT",
        "LABFLEET_HUB_PORT",
        "LABFLEET_PROXY_API_PORT",
        "LABFLEET_SERVICE_PORT",
        "LABFLEET_ADMIN_PORT",
    }
    assert ports["LABFLEET_PORT"] == int(url.rsplit(":", 1)[1])
    assert f"--JupyterHub.hub_port={hub_port}" in first.hub().cmdline()
    assert status(url, token) == 200
    before = session_of(url, token)
    assert before["status"] == "RUNNING" and [d["shares"] for d in before["devices"]] == [0.5], before
    # The session calls the Hub through the public proxy at its gateway, not at the Hub's own port.
    environ = Path(f"/proc/{fleet['pid']}/environ").read_bytes().split(b"\0")
    (api_url,) = [e.decode().split("=", 1)[1] for e in environ if e.startswith(b"JUPYTERHUB_API_URL=")]
    assert f":{ports['LABFLEET_PORT']}/hub/api" in api_url and "127.0.0.1" not in api_url, api_url

    # SIGKILL: scripts/up notices, says so and exits; the proxy and the session live on.
    old_proxy = int((state / "jupyterhub-proxy.pid").read_text().strip())
    first.hub().send_signal(signal.SIGKILL)
    assert first.proc.wait(30) == 128 + signal.SIGKILL, first.text()[-3000:]
    assert "keeps serving the running sessions" in first.text(), first.text()[-3000:]
    assert psutil.pid_exists(old_proxy) and psutil.pid_exists(fleet["pid"])

    # A program on the host listening on the old Hub port: scripts/up refuses, and says why.
    squatter = socket.create_server(("127.0.0.1", hub_port))
    try:
        refused = Up(up_env(state), fleet["root"] / "up-2.log")
        ups.append(refused)
        assert refused.proc.wait(180) == 1, refused.text()[-3000:]
        out = refused.text()
        assert f"LABFLEET_HUB_PORT={hub_port}" in out and f"pid {os.getpid()}" in out, out[-3000:]
        assert "stop that process and run scripts/up again" in out, out[-3000:]
        assert "starting JupyterHub" not in out, out[-3000:]
    finally:
        squatter.close()
    assert read_ports(state) == ports
    assert psutil.pid_exists(old_proxy) and psutil.pid_exists(fleet["pid"])

    # Once it is gone, scripts/up (no port given: the kept ones) brings the Hub and the session back.
    t = time.monotonic()
    again = Up(up_env(state), fleet["root"] / "up-3.log")
    ups.append(again)

    def fresh_token():  # issued by the new Hub: the session must ask it to accept this one
        r = requests.post(
            f"{url}/hub/api/users/alice/tokens",
            json={"note": "after the restart", "expires_in": 600},
            headers={"Authorization": f"token {token}"},
            timeout=10,
        )
        return r.json()["token"] if r.status_code == 201 else None

    new_token = wait(fresh_token, "the restarted Hub", ANSWER_WITHIN + 60, again)
    wait(lambda: status(url, new_token) == 200, "the session through the new Hub", ANSWER_WITHIN + 60, again)
    answered = time.monotonic() - t
    print(
        f"scripts/up first start: {fleet['started']:.1f}s; restart to the session's answer: {answered:.1f}s"
    )
    assert answered <= ANSWER_WITHIN, f"the session answered {answered:.1f}s after scripts/up started"
    after = session_of(url, new_token)
    assert after["id"] == before["id"] and after["status"] == "RUNNING", after
    assert [d["shares"] for d in after["devices"]] == [0.5] and after["devices"] == before["devices"], after
    assert read_ports(state) == ports
    assert f"--JupyterHub.hub_port={hub_port}" in again.hub().cmdline()
    assert not psutil.pid_exists(old_proxy) or psutil.Process(old_proxy).status() == psutil.STATUS_ZOMBIE
    # Nothing in the session ever called the Hub at 127.0.0.1:<its port> in the session's own network.
    assert fleet["heard"].read_text().splitlines() == ["listening"], fleet["heard"].read_text()
