"""The labfleet service behind a real JupyterHub and configurable-http-proxy:
password login, /api/me, tenants through the API, Hub groups and roles following,
keypair-signed requests, and bad input answered with 4xx that changes nothing."""

import json
import os
import time

import pytest
import requests

from labfleet.core import signing
from tests.gitserver import GitServer, make_work_tree
from tests.hubfixture import ADMIN_PASSWORD, start_hub

pytestmark = pytest.mark.hub

PW = "alice-password-1"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    # Refresh auth every second so role and group changes show on the next request.
    # Imports may fetch from the tests' own git server on 127.0.0.1 (and nothing else that is not public).
    h = start_hub(
        tmp_path_factory.mktemp("hub"),
        extra_config="c.LabfleetBaseAuthenticator.auth_refresh_age = 1\n",
        env={"LABFLEET_IMPORT_ALLOWED_HOSTS": "127.0.0.1"},
    )
    yield h
    h.stop()


@pytest.fixture(scope="module")
def root(hub):
    return hub.wait_token("root")


def hub_user(hub, name):
    r = hub.hub_api("GET", f"/users/{name}")
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def tenants(hub, root):
    ok = [
        hub.api(
            "POST",
            "/domains",
            root,
            json={"name": "acme", "total_resource_slots": {"cpu": 64, "gpu.shares": 4}},
        ),
        hub.api(
            "POST",
            "/projects",
            root,
            json={"domain": "acme", "name": "ml", "total_resource_slots": {"gpu.shares": 2.5}},
        ),
        hub.api("POST", "/projects", root, json={"domain": "acme", "name": "viz"}),
        hub.api(
            "POST",
            "/users",
            root,
            json={"username": "alice", "domain": "acme", "password": PW, "projects": ["ml"]},
        ),
        hub.api(
            "POST",
            "/users",
            root,
            json={"username": "carol", "domain": "acme", "role": "admin", "password": PW},
        ),
        hub.api("POST", "/users", root, json={"username": "bob", "domain": "acme"}),
    ]
    for r in ok:
        assert r.status_code == 201, r.text
    return True


def test_password_login_and_failed_login(hub, root):
    good = hub.login("root", ADMIN_PASSWORD)
    assert good.login_status == 302
    bad = hub.login("root", "wrong-password")
    assert bad.login_status == 403
    entries = hub.api("GET", "/audit?action=user.login", root).json()
    assert any(e["actor"] == "root" and e["success"] for e in entries)
    assert any(e["target"] == "root" and not e["success"] for e in entries)
    # The password never reaches the log or the audit details.
    assert "wrong-password" not in hub.log_text() and ADMIN_PASSWORD not in hub.log_text()
    assert "wrong-password" not in json.dumps(entries)
    # This Hub runs without the admin console (tests/hubfixture.py): no "Fleet admin" link, even for root
    home = good.get(f"{hub.url}/hub/home", timeout=30)
    assert home.status_code == 200 and "/hub/logout" in home.text, home.text[:500]
    assert "Fleet admin" not in home.text and "services/labfleet-admin" not in home.text


def test_browser_oauth_cookie_and_me(hub, tenants):
    s = hub.login("alice", PW)
    assert s.login_status == 302
    page = s.get(f"{hub.url}/services/labfleet/", timeout=30)  # OAuth dance with the Hub, then the page
    assert page.status_code == 200 and "alice" in page.text
    me = s.get(f"{hub.api_url}/me", timeout=30)
    assert me.status_code == 200, me.text
    body = me.json()
    assert body["username"] == "alice" and body["domain"]["name"] == "acme" and body["role"] == "user"
    assert [p["full_name"] for p in body["projects"]] == ["acme/ml"]
    q = body["quota"]
    assert q["projects"]["acme/ml"]["limit"] == {"gpu.shares": 2.5}
    assert q["projects"]["acme/ml"]["left"]["gpu.shares"] == 2.5
    assert q["domain"]["left"]["cpu"] == 64
    assert q["keypair"]["unspecified"] == "UNLIMITED"
    # Cookie-authenticated writes need the XSRF token, like the Hub's own API.
    r = s.patch(f"{hub.api_url}/users/alice", json={"full_name": "Alice A."}, timeout=30)
    assert r.status_code in (401, 403)
    xsrf = s.cookies.get("_xsrf", path="/services/labfleet/") or s.cookies.get("_xsrf")
    r = s.patch(
        f"{hub.api_url}/users/alice",
        json={"full_name": "Alice A."},
        headers={"X-XSRFToken": xsrf},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.json()["full_name"] == "Alice A."


def test_groups_follow_tenancy(hub, root, tenants):
    assert {"domain:acme", "project:acme/ml"} <= set(hub_user(hub, "alice")["groups"])
    r = hub.api("POST", "/projects/acme/viz/members", root, json={"username": "alice"})
    assert r.status_code == 201, r.text
    assert "project:acme/viz" in hub_user(hub, "alice")["groups"]
    assert hub.api("DELETE", "/projects/acme/viz/members/alice", root).status_code == 200
    assert "project:acme/viz" not in hub_user(hub, "alice")["groups"]
    hub.api("POST", "/projects/acme/viz/members", root, json={"username": "alice"})
    assert hub.api("DELETE", "/projects/acme/viz", root).status_code == 200
    assert "project:acme/viz" not in hub_user(hub, "alice")["groups"]
    assert hub.hub_api("GET", "/groups/project:acme%2Fviz").status_code == 404


def test_roles_follow_and_domain_admin_sees_own_domain(hub, root, tenants):
    # A domain admin logs in: their Hub role is filtered to their domain's group.
    carol = hub.login("carol", PW)
    assert carol.login_status == 302
    roles = hub_user(hub, "carol")["roles"]
    assert "labfleet-domain-admin-acme" in roles
    hub.api("POST", "/domains", root, json={"name": "globex"})
    assert hub.api("POST", "/users", root, json={"username": "gus", "domain": "globex"}).status_code == 201
    token = hub.user_token("carol")
    listed = requests.get(f"{hub.url}/hub/api/users", headers={"Authorization": f"token {token}"}, timeout=30)
    assert listed.status_code == 200, listed.text
    names = {u["name"] for u in listed.json()}
    assert {"alice", "carol"} <= names and "gus" not in names and "root" not in names
    # Promote alice through the API: after her next (refreshed) request, her Hub role follows.
    alice = hub.login("alice", PW)
    assert "labfleet-user" in hub_user(hub, "alice")["roles"]
    assert hub.api("PATCH", "/users/alice", root, json={"role": "admin"}).status_code == 200
    time.sleep(1.5)
    assert alice.get(f"{hub.url}/hub/home", timeout=30).status_code == 200
    roles = hub_user(hub, "alice")["roles"]
    assert "labfleet-domain-admin-acme" in roles and "labfleet-user" not in roles
    hub.api("PATCH", "/users/alice", root, json={"role": "user"})


def test_inactive_user_cannot_log_in(hub, root, tenants):
    assert hub.api("PATCH", "/users/bob", root, json={"password": "bob-password-1"}).status_code == 200
    assert hub.login("bob", "bob-password-1").login_status == 302
    assert hub.api("PATCH", "/users/bob", root, json={"status": "inactive"}).status_code == 200
    assert hub.login("bob", "bob-password-1").login_status == 403
    hub.api("PATCH", "/users/bob", root, json={"status": "active"})


# ---------------------------------------------------------------- keypair signatures


def signed(hub, method, path, ak, sk, body=b"", now=None, tamper=None, date=None):
    full = "/services/labfleet/api" + path
    headers = signing.signed_headers(ak, sk, method, full, body, now=now)
    if date:
        headers[signing.DATE_HEADER] = date
    data = tamper if tamper is not None else body
    return requests.request(method, hub.url + full, headers=headers, data=data, timeout=30)


@pytest.fixture(scope="module")
def alice_keypair(hub, tenants):
    token = hub.wait_token("alice")
    r = hub.api("POST", "/keypairs", token, json={})
    assert r.status_code == 201, r.text
    kp = r.json()
    assert len(kp["access_key"]) == 20 and len(kp["secret_key"]) == 40
    # Listed later, the secret is never shown again.
    listed = hub.api("GET", "/keypairs", token).json()
    assert all("secret_key" not in k for k in listed)
    return kp["access_key"], kp["secret_key"]


def test_signed_requests(hub, alice_keypair):
    ak, sk = alice_keypair
    r = signed(hub, "GET", "/me", ak, sk)
    assert r.status_code == 200, r.text
    assert r.json()["username"] == "alice"
    assert int(r.headers["X-RateLimit-Remaining"]) < int(r.headers["X-RateLimit-Limit"])
    # Bad signature (wrong secret), too old, tampered body: all refused.
    assert signed(hub, "GET", "/me", ak, "x" * 40).status_code == 401
    old = signed(hub, "GET", "/me", ak, sk, now=time.time() - 16 * 60)
    assert old.status_code == 401 and "minutes" in old.json()["message"]
    body = json.dumps({"full_name": "Alice"}).encode()
    t = signed(
        hub, "PATCH", "/users/alice", ak, sk, body=body, tamper=json.dumps({"full_name": "Mallory"}).encode()
    )
    assert t.status_code == 401
    ok = signed(hub, "PATCH", "/users/alice", ak, sk, body=body)
    assert ok.status_code == 200 and ok.json()["full_name"] == "Alice"
    assert signed(hub, "GET", "/me", "AK" + "Z" * 18, sk).status_code == 401


def test_rate_limit(hub, root, tenants):
    r = hub.api("POST", "/keypairs", root, json={"username": "carol", "rate_limit": 3})
    assert r.status_code == 201, r.text
    ak, sk = r.json()["access_key"], r.json()["secret_key"]
    codes = [signed(hub, "GET", "/me", ak, sk).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    limited = signed(hub, "GET", "/me", ak, sk)
    assert (
        limited.headers["X-RateLimit-Remaining"] == "0"
        and int(limited.headers["X-RateLimit-Reset"]) > time.time()
    )
    # When to come back, as RFC 9110 says it: whole seconds, no later than the window's reset
    wait = int(limited.headers["Retry-After"])
    assert 1 <= wait <= int(limited.headers["X-RateLimit-Reset"]) - time.time() + 1


# ---------------------------------------------------------------- bad input


def snapshot(hub, root):
    return {
        p: hub.api("GET", p, root).json() for p in ("/domains", "/projects", "/users", "/policies/keypair")
    }


BAD = [
    ("POST", "/domains", b"{not json"),
    ("POST", "/domains", b"[1, 2]"),
    ("POST", "/domains", {"name": 123}),
    ("POST", "/domains", {"name": "UPPER case"}),
    ("POST", "/domains", {"name": "ok1", "unknown": 1}),
    ("POST", "/domains", {"name": "ok2", "total_resource_slots": {"cpu": -1}}),
    ("POST", "/domains", {"name": "ok3", "total_resource_slots": {"cpu": 1e300}}),
    ("POST", "/domains", {"name": "ok4", "total_resource_slots": {"mem": "12zz"}}),
    ("POST", "/domains", {"name": "ok5", "total_resource_slots": {"gpu.shares": 0.001}}),
    ("POST", "/domains", {"name": "ok6", "is_active": "yes"}),
    ("POST", "/domains", {"name": "acme"}),  # duplicate: 409
    ("PATCH", "/domains/acme", {"total_resource_slots": "cpu"}),
    ("PATCH", "/domains/acme", {"description": "x" * 5000}),
    ("POST", "/projects", {"domain": "nope", "name": "p"}),
    ("POST", "/projects", {"domain": "acme", "name": "ml"}),
    ("POST", "/users", {"username": "zed", "domain": "acme", "role": "emperor"}),
    ("POST", "/users", {"username": "zed", "domain": "acme", "password": "short"}),
    ("POST", "/users", {"username": "zed", "domain": "acme", "projects": ["other/ml"]}),
    ("POST", "/users", {"username": "zed", "domain": "acme", "projects": "ml"}),
    ("POST", "/users", {"username": "../etc", "domain": "acme"}),
    ("POST", "/users", {"username": "zed"}),
    ("PATCH", "/users/alice", {"status": "sleeping"}),
    ("POST", "/policies/keypair", {"name": "p1", "max_concurrent_sessions": -1}),
    ("POST", "/policies/keypair", {"name": "p2", "max_concurrent_sessions": 10**12}),
    ("POST", "/policies/keypair", {"name": "p3", "max_concurrent_sessions": 1.5}),
    ("POST", "/policies/keypair", {"name": "p4", "default_for_unspecified": "MAYBE"}),
    ("POST", "/policies/user", {"name": "p5", "total_resource_slots": {}}),
    ("POST", "/keypairs", {"rate_limit": 0}),
    ("PATCH", "/keypairs/NOPE", {"rate_limit": 5}),
    ("GET", "/audit?limit=-5", None),
    ("GET", "/audit?limit=100000", None),
]


@pytest.mark.parametrize("method,path,body", BAD)
def test_bad_input_is_refused_and_changes_nothing(hub, root, tenants, method, path, body):
    before = snapshot(hub, root)
    data = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else None)
    r = hub.api(method, path, root, data=data)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    err = r.json()
    assert err["status"] == r.status_code and len(err["message"]) > 5
    assert snapshot(hub, root) == before


def test_unknown_route_is_json_404(hub, root):
    r = hub.api("GET", "/nothing-here", root)
    assert r.status_code == 404 and r.json()["status"] == 404


def test_a_session_starts_and_lab_answers_through_the_proxy(hub, tenants):
    """The embedded config spawns a real local JupyterLab for a labfleet user."""
    token = hub.wait_token("alice")
    r = requests.post(
        f"{hub.url}/hub/api/users/alice/server", headers={"Authorization": f"token {token}"}, timeout=60
    )
    assert r.status_code in (201, 202), r.text
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        server = hub_user(hub, "alice")["servers"].get("", {})
        if server.get("ready"):
            break
        time.sleep(0.5)
    assert server.get("ready"), hub.log_text()[-3000:]
    lab = requests.get(
        f"{hub.url}/user/alice/api/status", headers={"Authorization": f"token {token}"}, timeout=30
    )
    assert lab.status_code == 200, lab.text
    page = requests.get(f"{hub.url}/user/alice/lab", headers={"Authorization": f"token {token}"}, timeout=30)
    assert page.status_code == 200 and "JupyterLab" in page.text
    stop = requests.delete(
        f"{hub.url}/hub/api/users/alice/server", headers={"Authorization": f"token {token}"}, timeout=60
    )
    assert stop.status_code in (202, 204)


def test_import_api_clones_a_private_repository_with_the_users_credential(hub, tenants, tmp_path):
    """POST /api/imports against a git server the test starts: refusals first (4xx, nothing
    created), then a private repository cloned with alice's stored token into a new folder, read
    back through the file API; the token in no answer and no log."""
    alice = hub.wait_token("alice")
    token = "ghp_" + os.urandom(12).hex()
    with GitServer(tmp_path / "srv", token=token) as server:
        url = server.publish(
            make_work_tree(tmp_path / "w", {"hello.ipynb": "{}", "README.md": "hi\n"}), "private/lab.git"
        )
        refusals = [
            ({"url": "file:///etc/passwd"}, 400, "scheme"),
            ({"url": "http://localhost:9/x.git"}, 403, "not a public address"),
            ({"url": url, "project": "acme/nope"}, 404, "no project"),
            ({"url": url, "extra": 1}, 400, "extra"),
        ]
        for body, status, words in refusals:
            r = hub.api("POST", "/imports", alice, json=body)
            assert r.status_code == status and words in r.json()["message"], (body, r.text)
        assert hub.api("POST", "/imports", None, json={"url": url}).status_code in (401, 403)
        assert hub.api("GET", "/vfolders", alice).json() == []

        r = hub.api("PUT", "/import-credentials/127.0.0.1", alice, json={"token": token})
        assert r.status_code == 200 and r.json()["host"] == "127.0.0.1" and token not in r.text, r.text
        assert [c["host"] for c in hub.api("GET", "/import-credentials", alice).json()["items"]] == [
            "127.0.0.1"
        ]
        r = hub.api("POST", "/imports", alice, json={"url": url, "project": "ml", "open": "hello.ipynb"})
        assert r.status_code == 202, r.text
        where = r.headers["Location"].split("/api", 1)[1]
        deadline = time.monotonic() + 60
        while (job := hub.api("GET", where, alice).json())["status"] not in ("done", "failed"):
            assert time.monotonic() < deadline, job
            time.sleep(0.2)
        assert job["status"] == "done", job
        assert job["folder"]["name"] == "lab" and job["path"] == "hello.ipynb"
        assert job["session"] == {"project": "acme/ml"}
        assert hub.api("GET", where, hub.wait_token("bob")).status_code == 404  # another user's import
        readme = hub.api("GET", f"/vfolders/{job['folder']['id']}/files/README.md", alice)
        assert readme.status_code == 200 and readme.text == "hi\n"
        assert any(auth for path, auth in server.requests if path.startswith("/private/"))
    assert hub.api("DELETE", "/import-credentials/127.0.0.1", alice).status_code == 200
    assert hub.api("GET", "/import-credentials", alice).json()["items"] == []
    assert token not in hub.log_text()
