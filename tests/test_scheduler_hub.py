"""The scheduler through the real Hub and service: the embedded node with two mock 80 GB
GPUs, fractional placement, the queue, quota refusals, release, reconcile after restart.

Admission is asked as the Hub's spawner asks it (the service token, on behalf of a user): these
tests are about the scheduler, not about sessions started through the API (which start a Hub server).
"""

import threading
import time

import pytest

from tests.hubfixture import start_hub

pytestmark = pytest.mark.hub


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state = tmp_path_factory.mktemp("hub")
    # The bare admissions below have no Hub server: reconciling must not take them back mid-module.
    (state / "labfleet_service_config.py").write_text("c.LabfleetService.reconcile_grace = 3600\n")
    hub = start_hub(state)
    root = hub.wait_token("root")
    for method, path, body in [
        ("POST", "/domains", {"name": "acme"}),
        ("POST", "/projects", {"domain": "acme", "name": "ml", "total_resource_slots": {"gpu.shares": 2.5}}),
        ("POST", "/users", {"username": "alice", "domain": "acme", "projects": ["ml"]}),
    ]:
        assert hub.api(method, path, root, json=body).status_code == 201
    yield hub, state, root, hub.wait_token("alice")
    hub.stop()


def _admit(hub, body, user="alice"):
    """Admission as the Hub's spawner asks for it: the service token, on behalf of ``user``."""
    return hub.api("POST", "/sessions", hub.service_token, json={"username": user, **body})


def _gpu_devices(hub, token):
    nodes = hub.api("GET", "/nodes", token).json()
    assert len(nodes) == 1
    return nodes[0]["devices"]


def test_fractional_placement_queue_quota_and_release(env):
    hub, _, root, alice = env
    devices = _gpu_devices(hub, alice)
    assert [(d["model"], d["memory_bytes"]) for d in devices] == [("A100-80GB", 80 * 2**30)] * 2

    def ask(**slots):
        return _admit(hub, {"project": "ml", "slots": slots})

    half = ask(**{"gpu.shares": 0.5, "cpu": 0.1})
    assert half.status_code == 201 and half.json()["status"] == "SCHEDULED", half.text
    assert half.json()["devices"][0]["shares"] == 0.5
    whole = ask(gpu=1)
    assert whole.json()["status"] == "SCHEDULED"
    # Placement never over-commits: 0.5 + 1 of 2 devices used.
    held = sorted(d["allocated"] for d in _gpu_devices(hub, alice))
    assert held == [0.5, 1.0]
    waiting = ask(gpu=1)
    assert waiting.json()["status"] == "PENDING" and waiting.json()["queue_position"] == 1
    assert "waiting" in waiting.json()["status_reason"]
    queue = hub.api("GET", "/scheduler/queue", alice).json()
    assert [q["id"] for q in queue] == [waiting.json()["id"]] and queue[0]["position"] == 1
    # The project cap (2.5 shares, whole devices counting 1) refuses more, with the reason.
    over = ask(**{"gpu.shares": 0.25})
    assert over.status_code == 409
    assert over.json()["message"].startswith("project acme/ml would use 2.75 of its 2.5 gpu.shares")
    # Stopping the half session frees its device share at once; the queued whole-GPU
    # request still does not fit (0.5 + 1 used -> one device free): it is scheduled now.
    assert hub.api("DELETE", f"/sessions/{half.json()['id']}", alice).status_code == 200
    after = hub.api("GET", f"/sessions/{waiting.json()['id']}", alice).json()
    assert after["status"] == "SCHEDULED"
    assert sorted(d["allocated"] for d in _gpu_devices(hub, alice)) == [1.0, 1.0]
    # /me shows what admission counts: two whole devices = 2 of the project's 2.5 shares.
    quota = hub.api("GET", "/me", alice).json()["quota"]["projects"]["acme/ml"]
    assert quota["used"]["gpu.shares"] == 2 and quota["left"]["gpu.shares"] == 0.5


def test_bad_session_requests(env):
    hub, _, root, alice = env
    for body in [
        {"project": "ml", "slots": {"gpu.shares": 1.5}},
        {"project": "ml", "slots": {"gpu": 0.5}},
        {"project": "ml", "slots": {"tpu": 1}},
        {"project": "ml", "slots": {"cpu": -1}},
        {"project": "ml", "type": "daemon"},
        {"project": "ml", "slots": "lots"},
        {"project": "nope"},
        {"slots": {"cpu": 1}},
    ]:
        r = _admit(hub, body)
        assert 400 <= r.status_code < 500 and r.json()["message"], (body, r.text)
    # A user asks only for themselves.
    r = hub.api("POST", "/sessions", alice, json={"project": "ml", "username": "root"})
    assert r.status_code == 403 and r.json()["message"], r.text


def _servers(hub, user="alice"):
    return hub.hub_api("GET", f"/users/{user}").json().get("servers") or {}


def test_an_api_session_starts_its_hub_server(env):
    hub, _, root, alice = env
    before = hub.api("GET", "/sessions", root).json()
    # Checked first: bad input and refusals hold nothing and start no server.
    for body, status, words in [
        ({"project": "ml", "slots": {"cpu": "lots"}}, 400, "cpu"),
        ({"project": "ml", "type": "batch"}, 400, "needs a command"),
        ({"project": "ml", "name": "no spaces"}, 400, "not a server name"),
        ({"project": "ml", "slots": {"gpu.shares": 0.75}}, 409, "would use 2.75 of its 2.5 gpu.shares"),
        ({"project": "nope"}, 403, "not a member"),
    ]:
        r = hub.api("POST", "/sessions", alice, json=body)
        assert r.status_code == status and words in r.json()["message"], (body, r.text)
    assert hub.api("GET", "/sessions", root).json() == before and _servers(hub) == {}
    # The session gets a Hub server, started as the spawn form would start it.
    # A whole core: the server's start is held to the session's CPU (a tenth would take minutes).
    r = hub.api("POST", "/sessions", alice, json={"project": "ml", "name": "api1", "slots": {"cpu": 1}})
    assert r.status_code == 202, r.text
    view = r.json()
    assert view["server"] == view["name"] == "api1" and view["user"] == "alice" and view["id"]
    assert view["status"] in ("SCHEDULED", "PREPARING", "RUNNING"), view
    assert "api1" in _servers(hub)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (_servers(hub).get("api1") or {}).get("ready"):
            break
        time.sleep(0.3)
    session = hub.api("GET", f"/sessions/{view['id']}", alice).json()
    assert session["status"] == "RUNNING" and session["slots"] == {"cpu": 1}, session
    # Its server's name is taken while it lives.
    r = hub.api("POST", "/sessions", alice, json={"project": "ml", "name": "api1"})
    assert r.status_code == 409 and "api1" in r.json()["message"], r.text
    # Without a name, one is made up.
    r = hub.api("POST", "/sessions", alice, json={"project": "ml", "slots": {"cpu": 0.1}})
    assert r.status_code == 202 and r.json()["server"].startswith("api-"), r.text
    other = r.json()
    # Stopping the server gives the allocation back, as for any spawn.
    for server, sid in (("api1", view["id"]), (other["server"], other["id"])):
        assert hub.hub_api("DELETE", f"/users/alice/servers/{server}").status_code in (202, 204)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if hub.api("GET", f"/sessions/{sid}", alice).json()["status"] in ("TERMINATED", "ERROR"):
                break
            time.sleep(0.3)
        assert hub.api("GET", f"/sessions/{sid}", alice).json()["status"] in ("TERMINATED", "ERROR")
    audit = hub.api("GET", "/audit", root, params={"action": "session.start"}).json()
    assert {e["target"] for e in audit if e["success"]} >= {view["id"], other["id"]}, audit


def test_many_queued_spawns_stopped_at_the_hub_leave_no_ghost(env):
    """Queued spawns stopped at the Hub while many others poll: the Hub interrupts each pending spawn
    and gives it one second before it stops the server. Each stop succeeds and the Hub keeps no
    server: a spawn that took longer to let go stayed a "ready" ghost that no stop or remove could
    clear (before, most of these stops were 500s, each leaving one)."""
    hub, _, root, _ = env
    # Two users (each may have 20 sessions waiting) in a project with no cap of its own, so that
    # every spawn waits for the devices, not for quota.
    users = ("bursty", "burstz")
    assert hub.api("POST", "/projects", root, json={"domain": "acme", "name": "burst"}).status_code == 201
    for user in users:
        body = {"username": user, "domain": "acme", "projects": ["burst"]}
        assert hub.api("POST", "/users", root, json=body).status_code == 201
    holder = _admit(hub, {"project": "burst", "name": "holder", "slots": {"gpu": 2}}, user="bursty")
    # (Both devices taken: by it, or by the module's earlier sessions before it.)
    assert holder.status_code == 201 and holder.json()["status"] in ("SCHEDULED", "PENDING"), holder.text
    spawns = [(users[i % 2], f"q{i}") for i in range(32)]
    answers: dict[tuple[str, str], tuple[int, int]] = {}

    def spawn_then_stop(i: int) -> None:
        user, name = spawns[i]
        body = {"project": "burst", "gpu": 1, "cpu": 0.1}
        started = hub.hub_api("POST", f"/users/{user}/servers/{name}", json=body).status_code
        time.sleep((0, 0.05, 0.3, 1.0, 2.5)[i % 5])
        answers[(user, name)] = (started, hub.hub_api("DELETE", f"/users/{user}/servers/{name}").status_code)

    def left() -> dict[str, list[str]]:
        return {u: sorted(servers) for u in users if (servers := _servers(hub, u))}

    try:
        threads = [threading.Thread(target=spawn_then_stop, args=(i,)) for i in range(len(spawns))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        # Every spawn was queued (202), every stop answered 202 or 204
        assert sorted(answers) == sorted(spawns), answers
        assert {start for start, _ in answers.values()} == {202}, answers
        assert {stop for _, stop in answers.values()} <= {202, 204}, answers
        deadline = time.monotonic() + 20
        while left() and time.monotonic() < deadline:
            time.sleep(0.3)
        assert left() == {}
        ended = [
            s["status"]
            for u in users
            for s in hub.api("GET", f"/sessions?user={u}", root).json()
            if s["name"] != "holder"
        ]
        assert len(ended) == len(spawns) and set(ended) <= {"CANCELLED", "ERROR"}, ended
    finally:
        assert hub.api("DELETE", f"/sessions/{holder.json()['id']}", root).status_code == 200


def test_reconcile_after_restart_releases_sessions_without_servers(env):
    hub, state, root, alice = env
    r = _admit(hub, {"project": "ml", "slots": {"gpu.shares": 0.5}})
    assert r.json()["status"] == "PENDING", r.text  # within quota, but both devices are taken: it waits
    held = [s for s in hub.api("GET", "/sessions", alice).json() if s["status"] in ("SCHEDULED", "PENDING")]
    assert len(held) == 3
    hub.stop()
    # Same state and DB; the Hub runs none of these sessions' servers, so their allocations go back
    # when the service starts (once their grace period is over: none here).
    (state / "labfleet_service_config.py").write_text("c.LabfleetService.reconcile_grace = 0\n")
    again = start_hub(state, db_url=hub.db_url, do_seed=False)
    try:
        root2 = again.wait_token("root")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            statuses = {s["id"]: s["status"] for s in again.api("GET", "/sessions", root2).json()}
            if all(statuses[s["id"]] in ("TERMINATED", "CANCELLED") for s in held):
                break
            time.sleep(0.3)
        expected = {s["id"]: "CANCELLED" if s["status"] == "PENDING" else "TERMINATED" for s in held}
        assert {i: statuses[i] for i in expected} == expected
        assert all(d["allocated"] == 0 for d in _gpu_devices(again, root2))
    finally:
        again.stop()
