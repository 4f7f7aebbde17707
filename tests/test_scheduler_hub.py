"""The scheduler through the real Hub and service: the embedded node with two mock 80 GB
GPUs, fractional placement, the queue, quota refusals, release, reconcile after restart."""

import time

import pytest

from tests.hubfixture import start_hub

pytestmark = pytest.mark.hub


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state = tmp_path_factory.mktemp("hub")
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


def _gpu_devices(hub, token):
    nodes = hub.api("GET", "/nodes", token).json()
    assert len(nodes) == 1
    return nodes[0]["devices"]


def test_fractional_placement_queue_quota_and_release(env):
    hub, _, root, alice = env
    devices = _gpu_devices(hub, alice)
    assert [(d["model"], d["memory_bytes"]) for d in devices] == [("A100-80GB", 80 * 2**30)] * 2

    def ask(**slots):
        return hub.api("POST", "/sessions", alice, json={"project": "ml", "slots": slots})

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
        {"project": "ml", "username": "root"},
        {"slots": {"cpu": 1}},
    ]:
        r = hub.api("POST", "/sessions", alice, json=body)
        assert 400 <= r.status_code < 500 and r.json()["message"], (body, r.text)


def test_reconcile_after_restart_releases_sessions_without_servers(env):
    hub, state, root, alice = env
    r = hub.api("POST", "/sessions", alice, json={"project": "ml", "slots": {"gpu.shares": 0.5}})
    assert r.json()["status"] == "PENDING", r.text  # within quota, but both devices are taken: it waits
    held = [s for s in hub.api("GET", "/sessions", alice).json() if s["status"] in ("SCHEDULED", "PENDING")]
    assert len(held) == 3
    hub.stop()
    # Same state and DB; the Hub runs none of these sessions' servers, so their
    # allocations go back when the service starts.
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
