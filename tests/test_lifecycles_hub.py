"""Lifecycles nobody walks around (issue [2/7]), against a real Hub and the service's REST API: a user
with a session that is not over cannot be deleted (their slots stay held until they stop it); a
token revoked at the Hub is refused by the service within seconds; a username given to someone in
another domain gets nothing through the old user's token; a deactivated domain's people cannot log
in, call the API with a token or sign with a keypair, until it is active again; a JSON body too large
or without a credential is refused from its headers, before it is sent; a server the Hub runs
after its session ended is reported by recalculate-usage and stopped by its real run.  Only that
test starts a notebook server: the others admit sessions as the Hub's spawner asks for them (the
service token)."""

import json
import socket
import time
from urllib.parse import urlparse

import pytest
import requests

from labfleet.core import signing
from tests.hubfixture import read_http_answer, start_hub

pytestmark = pytest.mark.hub

API = "/services/labfleet/api"
PW = "lifecycle-pass-1"
CACHE_AGE = 5  # the service's token_cache_age default


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    state = tmp_path_factory.mktemp("hub")
    # A small queue; sessions admitted with no Hub server behind them are not reconciled away
    (state / "labfleet_service_config.py").write_text(
        "c.LabfleetService.max_queued_sessions = 4\n"
        "c.LabfleetService.max_pending_per_user = 2\n"
        "c.LabfleetService.reconcile_grace = 3600\n"
    )
    hub = start_hub(state)
    root = hub.wait_token("root")

    def ok(method, path, body=None, token=root):
        r = hub.api(method, path, token, json=body)
        assert r.status_code in (200, 201), (path, r.status_code, r.text)
        return r.json()

    for domain in ("acme", "globex", "initech"):
        ok("POST", "/domains", {"name": domain})
        ok("POST", "/projects", {"domain": domain, "name": "ml"})
    people = [("gus", "acme"), ("hana", "acme"), ("ivy", "acme"), ("jo", "initech")]
    for name, domain in [*people, ("q1", "acme"), ("q2", "acme"), ("q3", "acme")]:
        ok("POST", "/users", {"username": name, "domain": domain, "projects": ["ml"], "password": PW})
    yield hub, ok, root
    hub.stop()


def admit_as_hub(hub, username, domain, name, cpu, status=201, **slots):
    """A session admitted as the Hub's spawner asks for one (charged to the main keypair)."""
    body = {"project": f"{domain}/ml", "username": username, "name": name, "slots": {"cpu": cpu, **slots}}
    r = hub.api("POST", "/sessions", hub.service_token, json=body)
    assert r.status_code == status, r.text
    return r.json()


def allocated_cpu(ok):
    return sum(n["allocated"]["cpu"] for n in ok("GET", "/nodes"))


def wait_refused(hub, token, limit):
    """Seconds until the service refuses ``token`` on GET /me (AssertionError after ``limit``)."""
    start = time.monotonic()
    while (r := hub.api("GET", "/me", token)).status_code == 200:
        assert time.monotonic() - start < limit, f"still accepted after {limit} s: {r.json()}"
        time.sleep(0.25)
    assert r.status_code in (401, 403), r.text
    return time.monotonic() - start


def test_a_user_with_a_session_that_is_not_over_is_not_deleted(world):
    hub, ok, root = world
    session = admit_as_hub(hub, "gus", "acme", "work", 1)
    assert session["status"] in ("SCHEDULED", "PENDING")
    used = allocated_cpu(ok)
    assert used >= 1
    r = hub.api("DELETE", "/users/gus", root)
    assert r.status_code == 409, r.text
    assert r.json()["message"] == (
        f"user 'gus' has 1 session(s) that are not over: work ({session['status']}); "
        "stop them first, then delete the user"
    )
    # Nothing changed: the user, their Hub user, the session and the slots it holds
    assert ok("GET", "/users/gus")["username"] == "gus"
    assert hub.hub_api("GET", "/users/gus").status_code == 200
    assert ok("GET", f"/sessions/{session['id']}")["status"] == session["status"]
    assert allocated_cpu(ok) == used
    # Stopped, the user goes, and so does their Hub user
    ok("DELETE", f"/sessions/{session['id']}")
    assert ok("DELETE", "/users/gus") == {"deleted": "gus"}
    assert hub.hub_api("GET", "/users/gus").status_code == 404


def test_a_token_revoked_at_the_hub_is_refused_within_seconds(world):
    hub, ok, root = world
    made = hub.hub_api("POST", "/users/hana/tokens", json={"note": "revoke me", "expires_in": 600})
    assert made.status_code == 201, made.text
    token, token_id = made.json()["token"], made.json()["id"]
    assert hub.api("GET", "/me", token).json()["username"] == "hana"  # now known to the service
    assert hub.hub_api("DELETE", f"/users/hana/tokens/{token_id}").status_code == 204
    took = wait_refused(hub, token, CACHE_AGE + 5)
    assert took <= CACHE_AGE + 2, took


def test_a_reused_username_gets_nothing_of_the_old_user(world):
    hub, ok, root = world
    old = hub.user_token("ivy")
    assert hub.api("GET", "/me", old).json()["domain"]["name"] == "acme"
    assert hub.api("POST", "/keypairs", old, json={}).status_code == 201  # audited, as ivy of acme
    assert any(a["action"] == "keypair.issue" for a in hub.api("GET", "/audit", old).json())
    ok("DELETE", "/users/ivy")
    ok("POST", "/users", {"username": "ivy", "domain": "globex", "projects": ["ml"], "password": PW})
    hub.wait_user("ivy")
    # At once: the service forgot what the old token was (the Hub deleted it with the old user)
    r = hub.api("GET", "/me", old)
    assert r.status_code == 401, r.text
    assert hub.api("GET", "/sessions", old).status_code == 401
    fresh = hub.user_token("ivy")
    assert hub.api("GET", "/me", fresh).json()["domain"]["name"] == "globex"
    # Nor the old ivy's history: the new one reads only what happened since she was made
    mine = hub.api("GET", "/audit", fresh).json()
    assert not [a for a in mine if a["actor_domain"] == "acme"], mine
    assert [a["action"] for a in ok("GET", "/audit?limit=1000") if a["actor"] == "ivy"].count(
        "keypair.issue"
    ) == 1


def test_a_deactivated_domains_people_are_suspended_until_it_is_active_again(world):
    hub, ok, root = world
    token = hub.wait_token("jo")
    keypair = ok("POST", "/keypairs", {}, token=token)
    assert hub.login("jo", PW).login_status == 302
    ok("PATCH", "/domains/initech", {"is_active": False})
    try:
        # A token, a signature, a login: each refused with the reason
        r = hub.api("GET", "/me", token)
        assert r.status_code == 403 and r.json()["message"] == "domain initech is inactive", r.text
        headers = signing.signed_headers(keypair["access_key"], keypair["secret_key"], "GET", API + "/me")
        signed = requests.get(hub.url + API + "/me", headers=headers, timeout=30)
        assert signed.status_code == 403 and signed.json()["message"] == "domain initech is inactive"
        assert hub.login("jo", PW).login_status == 403
        audit = ok("GET", "/audit?limit=1000")
        assert any(
            a["action"] == "user.login"
            and a["target"] == "jo"
            and not a["success"]
            and a["details"]["reason"] == "domain initech is inactive"
            for a in audit
        ), [a for a in audit if a["action"] == "user.login"]
        # Other domains go on; so does the superadmin
        assert hub.api("GET", "/me", hub.wait_token("hana")).status_code == 200
        assert ok("GET", "/me")["role"] == "superadmin"
    finally:
        ok("PATCH", "/domains/initech", {"is_active": True})
    assert hub.api("GET", "/me", token).json()["username"] == "jo"
    assert hub.login("jo", PW).login_status == 302


def headers_only(hub, method, path, headers):
    """Send a request through the Hub's proxy with its headers and the first 64 KiB of the body they
    announce (the proxy passes the headers on with the body's first bytes); the answer's status,
    headers (lower-case names) and JSON body."""
    u = urlparse(hub.url)
    with socket.create_connection((u.hostname, u.port), timeout=15) as s:
        head = [
            f"{method} {API}{path} HTTP/1.1",
            f"Host: {u.netloc}",
            *(f"{k}: {v}" for k, v in headers.items()),
        ]
        s.sendall(("\r\n".join([*head, "", ""])).encode() + b"[" * 65536)
        status, got, body = read_http_answer(s)
        return status, got, json.loads(body)


def test_a_json_body_is_refused_from_its_headers_before_it_is_sent(world):
    hub, ok, root = world
    big = {"Content-Type": "application/json", "Content-Length": str(95 * 2**20)}
    # Nobody: 401 with 64 KiB of 95 MB sent (not once the service has read it all, as before)
    status, headers, body = headers_only(hub, "POST", "/users", big)
    assert status == 401 and body["message"].startswith("authentication required"), body
    # Someone, with more than a JSON body may hold: 413, whoever they are
    status, headers, body = headers_only(hub, "POST", "/users", {**big, "Authorization": f"token {root}"})
    assert status == 413 and body["message"] == f"request body is larger than {2**20} bytes", body
    # A body within the limit is read as before; the connection stays usable
    r = hub.api("POST", "/users", root, json={"username": "kai", "domain": "acme", "note": "x" * 1000})
    assert r.status_code == 400 and "note" in r.json()["message"], r.text
    assert ok("GET", "/users/ivy")["username"] == "ivy"


def test_the_proxys_error_page_is_json_for_the_api_and_html_elsewhere(world):
    """What the proxy asks the Hub for when it cannot reach a target (tests/test_crash_hub.py has
    the service really gone)."""
    hub, ok, root = world
    api = requests.get(f"{hub.url}/hub/error/503", params={"url": f"{API}/sessions?limit=5"}, timeout=30)
    assert api.headers["Content-Type"].startswith("application/json"), api.text
    assert api.json() == {
        "status": 503,
        "message": "the labfleet service is not answering (it may be restarting); retry shortly",
    }
    for url in ("/user/jo/lab", "/services/labfleet-admin/", "/services/labfleet/apis"):
        page = requests.get(f"{hub.url}/hub/error/503", params={"url": url}, timeout=30)
        assert page.headers["Content-Type"].startswith("text/html") and "<html" in page.text, url


def test_a_full_queue_never_stops_a_session_that_fits(world):
    """Queued sessions are the Hub's pending spawns: the fleet queues at most max_queued_sessions (4
    here), a user at most max_pending_per_user (2), and the Hub's spawn limit is raised by the queue's
    size (tests/unit/test_service_config.py), so sessions that fit are never locked out."""
    hub, ok, root = world
    held = [admit_as_hub(hub, "q3", "acme", "both-gpus", 1, gpu=2)]
    assert held[0]["status"] == "SCHEDULED"
    try:
        for user in ("q1", "q2"):
            for i in range(2):
                held.append(admit_as_hub(hub, user, "acme", f"wait{i}", 1, gpu=1))
                assert held[-1]["status"] == "PENDING"
        third = admit_as_hub(hub, "q1", "acme", "wait2", 1, status=409, gpu=1)
        assert third["message"] == (
            "q1 already has 2 sessions waiting for capacity, the most one user may have waiting (2); "
            "stop one or wait"
        )
        full = admit_as_hub(hub, "q3", "acme", "wait", 1, status=409, gpu=1)
        assert (
            full["message"]
            == "4 sessions are waiting for capacity already, the most the fleet queues (4); try again later"
        )
        refused = [a for a in ok("GET", "/audit?limit=50") if a["action"] == "session.refuse"]
        assert {a["details"]["code"] for a in refused[:2]} == {"queue-full"}
        # What fits starts, the queue full or not: the waiting users' and anyone else's
        for user in ("q1", "q3"):
            held.append(admit_as_hub(hub, user, "acme", "cpu-only", 0.5))
            assert held[-1]["status"] == "SCHEDULED"
        statuses = [ok("GET", f"/sessions/{s['id']}")["status"] for s in held]
        assert statuses.count("PENDING") == 4, statuses
    finally:
        for s in held:
            hub.api("DELETE", f"/sessions/{s['id']}", root)


def test_a_queued_spawn_stopped_while_it_waits_leaves_nothing(world):
    """Stopping a server the Hub has pending while its session waits in the queue: the session is
    cancelled, the Hub has no server (no ghost, ready or not), and no server process starts once
    capacity frees."""
    hub, ok, root = world
    holder = admit_as_hub(hub, "q3", "acme", "both-gpus", 1, gpu=2)
    try:
        r = hub.hub_api("POST", "/users/q2/servers/ghost", json={"project": "ml", "gpu": 1, "cpu": 0.5})
        assert r.status_code == 202, r.text  # queued: the spawn is pending
        session = wait_for(lambda: _session_of(ok, "q2", "ghost"), "the queued session", 30)
        assert session["status"] == "PENDING"
        r = hub.hub_api("DELETE", "/users/q2/servers/ghost")
        assert r.status_code in (202, 204), r.text
        wait_for(
            lambda: not hub.hub_api("GET", "/users/q2").json()["servers"], "the Hub to drop the server", 30
        )
        assert ok("GET", f"/sessions/{session['id']}")["status"] == "CANCELLED"
    finally:
        ok("DELETE", f"/sessions/{holder['id']}")
    # Capacity is free now: nothing of the stopped spawn starts, in labfleet or in the Hub
    time.sleep(3)
    assert ok("GET", f"/sessions/{session['id']}")["status"] == "CANCELLED"
    assert hub.hub_api("GET", "/users/q2").json()["servers"] == {}
    assert [s for s in ok("GET", "/sessions") if s["status"] in ("SCHEDULED", "PREPARING", "RUNNING")] == []


def test_a_session_stopped_through_the_api_takes_its_hub_server_with_it(world):
    """DELETE /api/sessions/{id} (the Fleet home's and the console's Stop) of a running session stops
    its Hub server at once, not when reconcile finds the server orphaned."""
    hub, ok, root = world
    r = hub.hub_api("POST", "/users/ivy/servers/stopme", json={"project": "ml", "cpu": 0.5})
    assert r.status_code in (201, 202), r.text
    wait_for(
        lambda: (hub.hub_api("GET", "/users/ivy").json()["servers"].get("stopme") or {}).get("ready"),
        "ivy/stopme ready",
        60,
    )
    session = _session_of(ok, "ivy", "stopme")
    assert ok("DELETE", f"/sessions/{session['id']}", token=hub.wait_token("ivy"))["status"] == "TERMINATED"
    wait_for(
        lambda: "stopme" not in hub.hub_api("GET", "/users/ivy").json()["servers"], "the Hub to stop it", 15
    )


def _session_of(ok, user, name):
    rows = [s for s in ok("GET", f"/sessions?user={user}") if s["name"] == name]
    return rows[-1] if rows else None


def wait_for(cond, what, timeout):
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return value


def test_a_server_whose_session_ended_is_reported_then_stopped_by_recalculate_usage(world):
    """Issue 27: the Hub runs a server whose labfleet session is over (the spawner's report of its
    end came while the server ran on, as a crash misread would send it): what the server holds is
    in no ledger row. recalculate-usage's dry run lists it and changes nothing; a real run asks the
    Hub to stop it (the Hub's API shows it gone), audited as server.stop_orphan; the ledger stays
    right all along, the spawner's own stop giving nothing back twice."""
    hub, ok, root = world
    path = "/maintenance/recalculate-usage"
    ok("POST", "/users", {"username": "otto", "domain": "acme", "projects": ["ml"]})
    hub.wait_user("otto")
    before = allocated_cpu(ok)
    r = hub.hub_api("POST", "/users/otto/servers/stray", json={"project": "ml", "cpu": 0.5})
    assert r.status_code in (201, 202), r.text
    try:

        def stray():
            return hub.hub_api("GET", "/users/otto").json()["servers"].get("stray")

        wait_for(lambda: (stray() or {}).get("ready"), "otto/stray to be ready", 90)
        session = _session_of(ok, "otto", "stray")
        assert session["status"] == "RUNNING" and allocated_cpu(ok) == before + 0.5
        assert ok("POST", path, {"dry_run": True})["unaccounted_servers"] == []  # accounted for

        why = "the server exited with code 1"
        r = hub.api(
            "PATCH", f"/sessions/{session['id']}", hub.service_token, json={"status": "ERROR", "reason": why}
        )
        assert r.status_code == 200, r.text
        assert allocated_cpu(ok) == before  # its slots went back; its server runs on
        model = stray()
        assert model["ready"] and model["started"]

        dry = ok("POST", path, {"dry_run": True})
        assert dry["drift"] == [] and dry["repaired"] == 0
        (found,) = dry["unaccounted_servers"]
        ended = ok("GET", f"/sessions/{session['id']}")
        assert {k: v for k, v in found.items() if k != "last_activity"} == {
            "user": "otto",
            "server": "stray",
            "started": model["started"],
            "last_session": {
                "id": session["id"],
                "status": "ERROR",
                "status_reason": why,
                "status_changed_at": ended["status_history"][-1]["at"],
            },
            "stopped": False,
        }
        assert found["last_activity"] is None or isinstance(found["last_activity"], str)
        # A dry run changed nothing: the server runs, nothing was stopped
        assert stray()["ready"] and ok("GET", "/audit?action=server.stop_orphan") == []

        done = ok("POST", path, {"dry_run": False})
        assert done["drift"] == [] and done["repaired"] == 0
        assert [(s["user"], s["server"], s["stopped"]) for s in done["unaccounted_servers"]] == [
            ("otto", "stray", True)
        ]
        wait_for(lambda: stray() is None, "the Hub to stop otto/stray", 60)
        (entry,) = ok("GET", "/audit?action=server.stop_orphan")
        assert (entry["actor"], entry["target"], entry["success"]) == ("root", "otto/stray", True)
        assert entry["details"] == {
            "user": "otto",
            "server": "stray",
            "stopped": True,
            "via": "maintenance.recalculate-usage",
        }
        recalcs = ok("GET", "/audit?action=maintenance.recalculate-usage")
        assert [e["details"] for e in recalcs[:3]] == [
            {"drift": 0, "dry_run": False, "unaccounted_servers": 1},
            {"drift": 0, "dry_run": True, "unaccounted_servers": 1},
            {"drift": 0, "dry_run": True, "unaccounted_servers": 0},
        ]
        # The spawner's stop found its session over: nothing given back twice, nothing left over
        assert ok("POST", path, {"dry_run": True}) == {
            "drift": [],
            "repaired": 0,
            "dry_run": True,
            "unaccounted_servers": [],
        }
        assert allocated_cpu(ok) == before
        assert ok("GET", f"/sessions/{session['id']}")["status"] == "ERROR"
    finally:
        hub.hub_api("DELETE", "/users/otto/servers/stray")
