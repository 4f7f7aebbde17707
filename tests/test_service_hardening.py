"""Hardening of the labfleet service behind a real JupyterHub: deeply nested JSON, long query
arguments, query strings kept out of the log, 405 with Allow, and replayed signed requests."""

import json
import secrets
import time

import pytest
import requests

from labfleet.core import signing
from tests.hubfixture import start_hub

pytestmark = pytest.mark.hub

API = "/services/labfleet/api"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = start_hub(tmp_path_factory.mktemp("hub"))
    yield h
    h.stop()


@pytest.fixture(scope="module")
def root(hub):
    return hub.wait_token("root")


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def wait_in_log(hub, text: str, timeout: float = 10) -> str:
    """The Hub's log (which holds the service's output) once ``text`` is in it."""
    deadline = time.monotonic() + timeout
    while True:
        log = hub.log_text()
        if text in log or time.monotonic() > deadline:
            return log
        time.sleep(0.2)


# ---------------------------------------------------------------- deeply nested JSON


@pytest.mark.parametrize("depth", [1000, 100])
def test_deeply_nested_json_is_refused_and_changes_nothing(hub, root, depth):
    name = f"deep{depth}"
    deep = nested(depth)
    cases = [
        ("/domains", f'{{"name": "{name}", "description": {deep}}}', "/domains"),
        ("/vfolders", f'{{"name": "{name}", "extra": {deep}}}', "/vfolders"),
        ("/domains", deep, "/domains"),  # the whole body
    ]
    for path, body, listing in cases:
        r = hub.api("POST", path, root, data=body.encode(), headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (path, r.status_code, r.text[:300])
        assert r.headers["Content-Type"].startswith("application/json")
        assert "nested too deeply" in r.json()["message"] and "64" in r.json()["message"]
        listed = hub.api("GET", listing, root)
        assert listed.status_code == 200
        assert name not in json.dumps(listed.json())


def test_nesting_within_the_bound_is_parsed(hub, root):
    # 64 levels are fine as JSON: the domain logic then judges the value (and refuses this one).
    body = json.dumps({"name": "deepok", "total_resource_slots": json.loads(nested(63))}).encode()
    r = hub.api("POST", "/domains", root, data=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "nested too deeply" not in r.json()["message"], r.text


# ---------------------------------------------------------------- long query arguments, the log

LONG = "x" * 300


# The ten GET routes that read a query argument, each with one it reads (the session id need
# not exist: the argument is refused first).
QUERY_ROUTES = [
    ("/sessions", "user"),
    ("/audit", "action"),
    ("/projects", "domain"),
    ("/users", "domain"),
    ("/keypairs", "username"),
    ("/scheduler/queue", "resource_group"),
    ("/vfolders", "scope"),
    ("/vfolders/usage", "user"),
    ("/vfolder-invitations", "state"),
    ("/sessions/00000000-0000-0000-0000-000000000000/logs", "tail"),
]


def test_long_query_argument_answers_400_and_the_query_is_never_logged(hub, root):
    secret = "SECRET" + secrets.token_hex(16)
    for path, arg in QUERY_ROUTES:
        r = hub.api("GET", f"{path}?{arg}={LONG}&token={secret}", root)
        assert r.status_code == 400, (path, r.status_code, r.text[:300])
        assert r.headers["Content-Type"].startswith("application/json")
        body = r.json()
        assert body["status"] == 400 and arg in body["message"] and "255" in body["message"], body
        assert int(r.headers["X-RateLimit-Remaining"]) >= 0  # the rate limit headers stay on errors
    # Other refusals with a token in the query: nested JSON, a 405, an unknown route.
    assert hub.api("POST", f"/domains?token={secret}", root, data=nested(1000)).status_code == 400
    assert hub.api("PUT", f"/domains?token={secret}", root, json={}).status_code == 405
    assert hub.api("GET", f"/no-such-route?token={secret}", root).status_code == 404
    # A marker request, to know the service's lines about the requests above are in the log.
    marker = "/users/marker" + secrets.token_hex(4)
    assert hub.api("GET", marker, root).status_code == 404
    log = wait_in_log(hub, f"GET {API}{marker}")
    assert f"GET {API}{marker}" in log
    assert secret not in log
    assert "Uncaught exception" not in log and "InvalidInput" not in log and "RecursionError" not in log
    assert f"400 GET {API}/sessions " in log  # the request log names the path


# ---------------------------------------------------------------- 405 with Allow


@pytest.mark.parametrize(
    "method, path, allow",
    [
        ("PUT", "/domains", "GET, POST"),
        ("DELETE", "/domains", "GET, POST"),
        ("POST", "/domains/root", "GET, DELETE, PATCH"),
        ("POST", "/vfolders/usage", "GET"),
        ("PATCH", "/me", "GET"),
    ],
)
def test_405_has_allow(hub, root, method, path, allow):
    for token in (root, None):  # said the same with or without credentials
        r = hub.api(method, path, token, json={"name": "x"})
        assert r.status_code == 405, (method, path, r.status_code, r.text)
        assert r.headers["Allow"] == allow
        assert r.headers["Content-Type"].startswith("application/json")
        assert r.json()["status"] == 405 and allow in r.json()["message"]


def test_405_for_a_method_tornado_does_not_know(hub, root):
    r = requests.request(
        "PROPFIND", f"{hub.api_url}/domains", headers={"Authorization": f"token {root}"}, timeout=30
    )
    assert r.status_code == 405 and r.headers["Allow"] == "GET, POST"


# ---------------------------------------------------------------- replayed signed requests


@pytest.fixture(scope="module")
def keypair(hub, root):
    r = hub.api("POST", "/keypairs", root, json={})
    assert r.status_code == 201, r.text
    return r.json()["access_key"], r.json()["secret_key"]


def send(hub, method, path, headers, body=b""):
    return requests.request(method, hub.url + API + path, headers=headers, data=body, timeout=30)


def test_replayed_nonce_is_refused(hub, keypair):
    ak, sk = keypair
    headers = signing.signed_headers(ak, sk, "GET", API + "/me", nonce=True)
    assert signing.NONCE_HEADER in headers
    first = send(hub, "GET", "/me", headers)
    assert first.status_code == 200, first.text
    assert first.json()["username"] == "root"
    again = send(hub, "GET", "/me", headers)
    assert again.status_code == 401, again.text
    assert "replayed" in again.json()["message"] and signing.NONCE_HEADER in again.json()["message"]
    # A fresh nonce works; so does no nonce at all, as many times as wanted (within 15 minutes).
    fresh = send(hub, "GET", "/me", signing.signed_headers(ak, sk, "GET", API + "/me", nonce=True))
    assert fresh.status_code == 200, fresh.text
    plain = signing.signed_headers(ak, sk, "GET", API + "/me")
    assert signing.NONCE_HEADER not in plain
    assert [send(hub, "GET", "/me", plain).status_code for _ in range(2)] == [200, 200]


def test_replayed_write_changes_nothing(hub, root, keypair):
    ak, sk = keypair
    body = json.dumps({"name": "replayed"}).encode()
    headers = signing.signed_headers(ak, sk, "POST", API + "/domains", body, nonce=signing.new_nonce())
    assert send(hub, "POST", "/domains", headers, body).status_code == 201
    again = send(hub, "POST", "/domains", headers, body)
    assert again.status_code == 401 and "replayed" in again.json()["message"], again.text
    names = [d["name"] for d in hub.api("GET", "/domains", root).json()]
    assert names.count("replayed") == 1


def test_nonce_is_signed_and_well_formed(hub, keypair):
    ak, sk = keypair
    headers = signing.signed_headers(ak, sk, "GET", API + "/me", nonce=True)
    # Stripped or swapped, the signature no longer matches.
    stripped = {k: v for k, v in headers.items() if k != signing.NONCE_HEADER}
    assert send(hub, "GET", "/me", stripped).status_code == 401
    swapped = dict(headers, **{signing.NONCE_HEADER: signing.new_nonce()})
    r = send(hub, "GET", "/me", swapped)
    assert r.status_code == 401 and "signature" in r.json()["message"]
    # Too short, or not URL-safe: refused, saying why.
    for bad in ("short", "a" * 16 + "!"):
        h = signing.signed_headers(ak, sk, "GET", API + "/me", nonce=bad)
        r = send(hub, "GET", "/me", h)
        assert r.status_code == 401 and "URL-safe" in r.json()["message"], r.text
    # The untouched original still works once.
    assert send(hub, "GET", "/me", headers).status_code == 200
