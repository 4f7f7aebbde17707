"""Crashes, on a real Hub with local sessions: the Hub killed with SIGKILL while sessions run, then
restarted with the same config and ports; the labfleet service killed with SIGKILL right after it
admitted a session, then restarted by the Hub.

- A killed Hub's service goes with it (parent-death signal), so the restarted Hub's own service takes
  the port at once: it answers, it is the one listening, the Hub's log shows no crash loop, and the
  sessions and their allocations are as they were.
- A service killed between the spawner's admission and its RUNNING report comes back (the Hub
  restarts it) and reconciles: the session becomes RUNNING with the allocation it had.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest
import requests

from tests.hubfixture import start_hub

pytestmark = pytest.mark.hub

RESTARTABLE = "c.JupyterHub.cleanup_servers = False\nc.LabfleetSpawnerMixin.queue_poll_interval = 0.3\n"
SERVERS = (("alice", "a"), ("bob", "b"), ("alice", "c"), ("alice", "c2"), ("alice", "c3"))


class Env:
    def __init__(self, hub, state: Path, root: str, tokens: dict[str, str]) -> None:
        self.hub = hub
        self.state = state
        self.root = root
        self.tokens = tokens
        self.leftovers: list[int] = []  # processes a failed test leaves behind (an orphaned service)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state = tmp_path_factory.mktemp("crash")
    # Reconcile every 2 s (the default 30 s would only make the test wait longer).
    (state / "labfleet_service_config.py").write_text("c.LabfleetService.reconcile_interval = 2\n")
    hub = start_hub(state, extra_config=RESTARTABLE, console=True)
    root = hub.wait_token("root")
    for path, body in [
        ("/domains", {"name": "acme"}),
        ("/projects", {"domain": "acme", "name": "ml", "total_resource_slots": {"gpu.shares": 2}}),
        ("/users", {"username": "alice", "domain": "acme", "projects": ["ml"]}),
        ("/users", {"username": "bob", "domain": "acme", "projects": ["ml"]}),
    ]:
        r = hub.api("POST", path, root, json=body)
        assert r.status_code == 201, (path, r.text)
    e = Env(hub, state, root, {name: hub.wait_token(name) for name in ("alice", "bob")})
    yield e
    try:
        for user, server in SERVERS:
            e.hub.hub_api("DELETE", f"/users/{user}/servers/{server}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(
            (e.hub.hub_api("GET", f"/users/{u}").json().get("servers") or {}) for u in ("alice", "bob")
        ):
            time.sleep(0.3)
    finally:
        e.hub.stop()
        for pid in e.leftovers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- helpers


def _spawn(hub, user, server, options):
    r = hub.hub_api("POST", f"/users/{user}/servers/{server}", json=options)
    assert r.status_code in (201, 202), r.text


def _wait(cond, what, timeout, hub, step=0.3):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"{what}: not within {timeout}s\n{hub.log_text()[-4000:]}")


def _ready(hub, user, server):
    model = (hub.hub_api("GET", f"/users/{user}").json().get("servers") or {}).get(server)
    return bool(model and model.get("ready"))


def _live(hub, token):
    """Live sessions: id -> (status, [(device uuid, shares)])."""
    return {
        s["id"]: (s["status"], sorted((d["uuid"], d["shares"]) for d in s["devices"]))
        for s in hub.api("GET", "/sessions", token).json()
        if s["status"] not in ("TERMINATED", "CANCELLED", "ERROR")
    }


def _allocated(hub, token):
    return {d["uuid"]: d["allocated"] for n in hub.api("GET", "/nodes", token).json() for d in n["devices"]}


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    """Running (a zombie has ended: its new parent reaps it when it likes)."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def _service_pid(hub_pid: int, module: bytes = b"labfleet.service") -> int | None:
    """The labfleet service the Hub started (its child running ``python -m labfleet.service``), or
    another of its children by its module (the admin console: ``labfleet.console``)."""
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        stat = _stat(int(p.name))
        if stat is None or int(stat[1]) != hub_pid or stat[0] == "Z":
            continue
        try:
            cmd = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if module in cmd:
            return int(p.name)
    return None


def _listener(port: int) -> int | None:
    """The pid of the process listening on 127.0.0.1:``port`` (read from /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f[9])
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            for fd in (p / "fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return int(p.name)
        except OSError:
            continue
    return None


def _spawner_pid(state: Path, user: str, server: str) -> int:
    db = sqlite3.connect(state / "jupyterhub.sqlite")
    try:
        (raw,) = db.execute(
            "select spawners.state from spawners join users on spawners.user_id = users.id"
            " where users.name = ? and spawners.name = ?",
            (user, server),
        ).fetchone()
    finally:
        db.close()
    return json.loads(raw or "{}")["pid"]


# ---------------------------------------------------------------- 1. the Hub killed


def test_a_killed_hubs_service_goes_with_it_and_the_restarted_hub_takes_over(env):
    hub = env.hub
    _spawn(hub, "alice", "a", {"project": "ml", "gpu": 0.5, "cpu": 0.5})
    _spawn(hub, "bob", "b", {"project": "ml", "gpu": 1, "cpu": 0.5})
    for user, server in (("alice", "a"), ("bob", "b")):
        _wait(lambda u=user, s=server: _ready(hub, u, s), f"{user}/{server} ready", 60, hub)
    before = _live(hub, env.root)
    assert sorted(status for status, _ in before.values()) == ["RUNNING", "RUNNING"], before
    allocated = _allocated(hub, env.root)
    assert sorted(allocated.values()) == [0.5, 1.0]
    service = _service_pid(hub.proc.pid)
    console = _service_pid(hub.proc.pid, b"labfleet.console")
    assert service is not None and console is not None
    env.leftovers += [service, console]
    sessions = [_spawner_pid(env.state, u, s) for u, s in (("alice", "a"), ("bob", "b"))]
    service_port = hub.ports[3]
    log_start = len(hub.log_text())

    hub.proc.send_signal(signal.SIGKILL)
    hub.proc.wait(10)
    t_killed = time.monotonic()
    # The Hub's service does not outlive it: gone within seconds, its port free for the next Hub's.
    deadline = t_killed + 5
    while _alive(service) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(service), "the labfleet service outlived its killed Hub (it keeps the port)"
    while _alive(console) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(console), "the admin console outlived its killed Hub (it keeps its port)"
    service_gone = time.monotonic() - t_killed
    assert all(_alive(pid) for pid in sessions), "the sessions must survive the Hub"

    t0 = time.monotonic()
    again = start_hub(env.state, do_seed=False, extra_config=RESTARTABLE, ports=hub.ports, console=True)
    env.hub = again  # the fixture's teardown stops the new Hub
    answered = time.monotonic() - t0  # start_hub returns once the service answers through the proxy
    root = again.wait_token("root")
    new_service = _service_pid(again.proc.pid)
    assert new_service is not None and new_service != service
    env.leftovers.append(new_service)
    # The restarted Hub's own service serves the port, and stays up: no crash loop.
    assert _listener(service_port) == new_service
    time.sleep(3)
    assert _alive(new_service) and _listener(service_port) == new_service
    log = again.log_text()[log_start:]
    assert "Address already in use" not in log and "exited with status" not in log, log[-3000:]
    assert answered < 30, answered
    # Sessions and allocations as they were; JupyterLab still answers.
    assert _live(again, root) == before
    assert _allocated(again, root) == allocated
    lab = requests.get(
        f"{again.url}/user/alice/a/api/status",
        headers={"Authorization": f"token {again.user_token('alice')}"},
        timeout=30,
    )
    assert lab.status_code == 200, lab.text
    print(
        f"\n[crash] Hub SIGKILL: its service gone after {service_gone:.2f}s; restarted Hub's service answered {answered:.1f}s after the restart began"
    )


# ---------------------------------------------------------------- 2. the service killed


def _admitted(state: Path, user: str, server: str) -> tuple[str, str] | None:
    db = sqlite3.connect(state / "labfleet.sqlite", timeout=5)
    try:
        return db.execute(
            "select sessions.id, sessions.status from sessions join users on sessions.user_id = users.id"
            " where users.username = ? and sessions.name = ?",
            (user, server),
        ).fetchone()
    finally:
        db.close()


def _running_hub(env):
    """The module's Hub; started again on the same ports if an earlier test left it dead."""
    if env.hub.proc.poll() is None:
        return env.hub
    for pid in env.leftovers:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    env.hub = start_hub(env.state, do_seed=False, extra_config=RESTARTABLE, ports=env.hub.ports, console=True)
    return env.hub


def test_a_service_killed_right_after_an_admission_comes_back_with_the_session_running(env):
    hub = _running_hub(env)
    alice = hub.user_token("alice")
    caught = None
    for server in ("c", "c2", "c3"):  # the window is short: try again if the reports got through
        service = _service_pid(hub.proc.pid)
        assert service is not None
        env.leftovers.append(service)
        spawn = threading.Thread(target=_spawn, args=(hub, "alice", server, {"project": "ml", "gpu": 0.1}))
        spawn.start()
        # The spawner's admission committed: freeze the service at once, before its next report.
        row = _wait(lambda s=server: _admitted(env.state, "alice", s), "the admission", 30, hub, step=0.002)
        os.kill(service, signal.SIGSTOP)
        row = _admitted(env.state, "alice", server)
        if row[1] in ("SCHEDULED", "PREPARING"):
            os.kill(service, signal.SIGKILL)  # the spawner's PREPARING / RUNNING reports are lost
            caught = (server, row[0], row[1], time.monotonic())
            # Until the Hub starts it again, an API client gets JSON from the proxy, not the Hub's
            # HTML error page
            _wait(lambda s=service: not _alive(s), "the service to end", 10, hub, step=0.01)
            down = requests.get(
                f"{hub.url}/services/labfleet/api/me", headers={"Authorization": f"token {alice}"}, timeout=30
            )
            assert down.status_code == 503 and down.headers["Content-Type"].startswith("application/json")
            assert down.json() == {
                "status": 503,
                "message": "the labfleet service is not answering (it may be restarting); retry shortly",
            }
            spawn.join(60)
            break
        os.kill(service, signal.SIGCONT)
        spawn.join(60)
    assert caught is not None, "never caught the service between an admission and its RUNNING report"
    server, sid, status_then, t_killed = caught
    with sqlite3.connect(env.state / "labfleet.sqlite") as db:
        held = sorted(
            db.execute(
                "select devices.uuid, allocations.shares_centi from allocations"
                " join devices on allocations.device_id = devices.id where allocations.session_id = ?",
                (sid,),
            ).fetchall()
        )
    assert [c for _, c in held] == [10]
    # The server starts anyway (the Hub does not need the reports).
    _wait(lambda: _ready(hub, "alice", server), f"alice/{server} ready", 60, hub)
    # The Hub restarts its dead service by itself; reconciling makes the session RUNNING.
    root = hub.wait_token("root")

    def running():
        try:
            r = hub.api("GET", f"/sessions/{sid}", root)
        except requests.RequestException:
            return None
        return r.json() if r.status_code == 200 and r.json()["status"] == "RUNNING" else None

    session = _wait(running, f"session {sid} RUNNING after the service's restart", 100, hub, step=0.5)
    back = time.monotonic() - t_killed
    restarted = _service_pid(hub.proc.pid)
    assert restarted is not None and restarted != service
    env.leftovers.append(restarted)
    assert sorted((d["uuid"], round(d["shares"] * 100)) for d in session["devices"]) == held
    reasons = [h["reason"] for h in session["status_history"] if h["status"] == "RUNNING"]
    # Reconciling made it RUNNING; or, when the Hub had the service back before the server was up
    # (a loaded machine), the spawner's own report reached the restarted service. Once either way.
    assert reasons in ([f"the Hub reports alice/{server} ready"], ["server started"]), session[
        "status_history"
    ]
    lab = requests.get(
        f"{hub.url}/user/alice/{server}/api/status", headers={"Authorization": f"token {alice}"}, timeout=30
    )
    assert lab.status_code == 200
    print(f"\n[crash] service SIGKILL while {status_then}: session RUNNING again {back:.1f}s later")
