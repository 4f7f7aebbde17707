"""Model serving against the real Hub (local backend, mock GPUs): an endpoint of 2 replicas at a quarter
of a GPU each, every replica an inference session of its owner started through the Hub, answers through
one URL from both; tokens; a replica refuses every call without its credential, from the host and from
another tenant's session, and the credential shows in no log, page or option; a killed replica is
replaced while calls keep succeeding; server-sent events stream through; scale down; delete; another
domain sees nothing; bad model definitions start nothing; the Model Store shows a project's model
folders with their README and model to its members only."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests
from tornado import websocket
from tornado.httpclient import HTTPClientError, HTTPRequest

from labfleet.serving.credentials import HEADER, PROBE_HEADER
from tests.hubfixture import SESSION_NETWORK, in_session, start_hub

pytestmark = pytest.mark.hub

# The model: a stdlib HTTP server that says which replica answers, streams events, and has a health path.
SERVER = r"""
import base64, hashlib, json, os, struct, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NAME = os.environ.get("JUPYTERHUB_SERVER_NAME", "?")

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _json(self, data, code=200):
        body = json.dumps(data).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def websocket_echo(self):
        # A minimal RFC 6455 server: answers each text message with "<replica>:<message>".
        key = self.headers["Sec-WebSocket-Key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", base64.b64encode(hashlib.sha1(key.encode()).digest()).decode())
        self.end_headers()
        self.wfile.flush()
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                break
            op, n = head[0] & 0x0F, head[1] & 0x7F
            if n == 126:
                n = struct.unpack(">H", self.rfile.read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
            if op == 8:
                self.wfile.write(b"\x88\x00")
                break
            if op == 1:
                out = (NAME + ":" + data.decode()).encode()[:125]
                self.wfile.write(bytes([0x81, len(out)]) + out)
                self.wfile.flush()
        self.close_connection = True

    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self.websocket_echo()
        if self.path == "/health":
            return self._json({"ok": True})
        if self.path.startswith("/events"):
            # One event, then the next only once the caller has seen the first (it writes the file `go`).
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b"data: first\n\n")
            self.wfile.flush()
            deadline = time.monotonic() + 60
            while not os.path.exists("go") and time.monotonic() < deadline:
                time.sleep(0.05)
            self.wfile.write(b"data: second\n\n")
            self.wfile.flush()
            self.close_connection = True
            return
        if self.path == "/headers":
            return self._json({"replica": NAME, "headers": list(self.headers)})
        self._json({"replica": NAME, "port": os.environ.get("PORT"), "host": os.environ.get("HOST"),
                    "path": self.path, "auth": self.headers.get("Authorization"), "cwd": os.getcwd()})

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        self._json({"replica": NAME, "echo": self.rfile.read(n).decode()})

ThreadingHTTPServer((os.environ["HOST"], int(sys.argv[1])), H).serve_forever()
"""

DEFINITION = """
models:
  - name: echo
    model_path: /models
    service:
      start_command: [python3, server.py, "8000"]
      port: 8000
      health_check:
        path: /health
        interval: 1.0
        max_retries: 2
        max_wait_time: 2.0
        initial_delay: 0.5
"""

BAD = {
    "noport": "models:\n- service:\n    start_command: [python3, server.py]\n",
    "badyaml": "models: [\n  - service: {port: 80\n",
    "nocommand": "models:\n- service:\n    port: 8000\n",
}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state = tmp_path_factory.mktemp("serving")
    extra = (
        "c.LabfleetSpawnerMixin.batch_poll_interval = 1\nc.LabfleetSpawnerMixin.queue_poll_interval = 0.3\n"
    )
    hub = start_hub(state, extra_config=extra, env={"LABFLEET_SERVING_INTERVAL": "1"})
    root = hub.wait_token("root")
    for method, path, body in [
        ("POST", "/domains", {"name": "acme", "total_resource_slots": {"gpu.shares": 2}}),
        ("POST", "/domains", {"name": "other"}),
        ("POST", "/projects", {"domain": "acme", "name": "ml", "total_resource_slots": {"gpu.shares": 1}}),
        ("POST", "/projects", {"domain": "other", "name": "play"}),
        ("POST", "/users", {"username": "alice", "domain": "acme", "projects": ["ml"]}),
        ("POST", "/users", {"username": "eve", "domain": "other", "projects": ["play"]}),
    ]:
        r = hub.api(method, path, root, json=body)
        assert r.status_code == 201, (path, r.text)
    tokens = {name: hub.wait_token(name) for name in ("alice", "eve")}
    yield hub, state, tokens
    hub.hub_api("DELETE", "/users/eve/servers/peek")
    for name in ("echo", "bad"):
        hub.api("DELETE", f"/endpoints/{name}", tokens["alice"])
    time.sleep(2)
    hub.stop()


def _folder(hub, token, name, files):
    r = hub.api("POST", "/vfolders", token, json={"name": name, "usage_mode": "model"})
    assert r.status_code == 201, r.text
    folder = r.json()
    for path, text in files.items():
        put = hub.api("PUT", f"/vfolders/{folder['id']}/files/{path}", token, data=text.encode())
        assert put.status_code == 201, put.text
    return folder


def _servers(hub, user):
    return {n: s for n, s in hub.hub_api("GET", f"/users/{user}").json()["servers"].items() if n}


def _wait(what, check, timeout=120, hub=None):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    tail = hub.log_text()[-4000:] if hub is not None else ""
    raise AssertionError(f"{what}: not within {timeout}s (last: {last})\n{tail}")


def _endpoint(hub, token, name="echo"):
    r = hub.api("GET", f"/endpoints/{name}", token)
    assert r.status_code == 200, r.text
    return r.json()


def _call(hub, url, token, path="whoami", **kw):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.get(f"{hub.url}{url}{path}", headers=headers | kw.pop("headers", {}), timeout=30, **kw)


@pytest.fixture(scope="module")
def deployed(env):
    hub, state, tokens = env
    folder = _folder(
        hub, tokens["alice"], "echo-model", {"model-definition.yaml": DEFINITION, "server.py": SERVER}
    )
    r = hub.api(
        "POST",
        "/endpoints",
        tokens["alice"],
        json={
            "name": "echo",
            "project": "acme/ml",
            "model_folder": "echo-model",
            "replicas": 2,
            "slots": {"cpu": 0.5, "mem": "512m", "gpu.shares": 0.25},
            "env": {"GREETING": "hi"},
        },
    )
    assert r.status_code == 201, r.text
    ep = r.json()
    assert ep["status"] == "PENDING" and ep["url"] == "/services/labfleet/serve/echo/"
    assert ep["definition"]["health_check"]["path"] == "/health" and ep["model_folder"]["id"] == folder["id"]
    ready = _wait(
        "2 healthy replicas",
        lambda: (e := _endpoint(hub, tokens["alice"]))["healthy_replicas"] == 2 and e,
        hub=hub,
    )
    t = hub.api("POST", "/endpoints/echo/tokens", tokens["alice"], json={"expires_in": 3600, "note": "test"})
    assert t.status_code == 201, t.text
    return ready, t.json()["token"], folder


def test_two_quarter_gpu_replicas_answer_through_one_url(env, deployed):
    hub, state, tokens = env
    ep, token, folder = deployed
    assert ep["status"] == "READY" and ep["status_reason"] == "2 of 2 replicas healthy"
    routes = [r for r in ep["routes"] if r["status"] == "RUNNING"]
    assert len(routes) == 2 and all(r["health"] == "HEALTHY" and r["traffic"] == "ACTIVE" for r in routes)
    assert all(r["last_error"] == "" for r in routes), routes  # healthy: no error of before shows
    # Each replica is an inference session of alice in acme/ml with a quarter of a GPU, placed like any other.
    sessions = {s["id"]: s for s in hub.api("GET", "/sessions", tokens["alice"]).json()}
    for r in routes:
        s = sessions[r["session_id"]]
        assert s["type"] == "inference" and s["project"] == "acme/ml" and s["name"] == r["server"]
        assert s["slots"]["gpu.shares"] == 0.25 and s["status"] == "RUNNING"
        # Every page that lists it shows it as the endpoint's (scaled there, not stopped).
        assert s["endpoint"] == "echo"
        assert hub.api("GET", f"/sessions/{s['id']}", tokens["alice"]).json()["endpoint"] == "echo"
    assert all(s["endpoint"] is None for s in sessions.values() if s["type"] != "inference")
    seen = set()
    for _ in range(6):
        r = _call(hub, ep["url"], token, "whoami?x=1")
        assert r.status_code == 200, r.text
        body = r.json()
        seen.add(body["replica"])
        # The model got the path and query, $PORT and $HOST (its session's loopback, behind the front),
        # ran in its folder; the token stayed with the router, the replica credential with the front.
        assert body["path"] == "/whoami?x=1" and body["host"] == "127.0.0.1" and body["auth"] is None
        assert body["cwd"].endswith("/vfolders/echo-model")
        assert body["port"] != str(_address(next(x for x in routes if x["server"] == body["replica"]))[1])
    for _ in range(2):
        # A caller's own replica headers are dropped, and the router's credential stops at the front.
        named = _call(
            hub, ep["url"], token, "headers", headers={HEADER: "lfrc_forged", PROBE_HEADER: "connect"}
        )
        assert named.status_code == 200, named.text
        assert not [h for h in named.json()["headers"] if h.lower().startswith("x-labfleet-replica")], (
            named.text
        )
    if SESSION_NETWORK:
        # Each replica is called at its session's own address, on the test's bridge.
        subnet = ipaddress.ip_network(SESSION_NETWORK["LABFLEET_SESSION_SUBNET"])
        assert all(ipaddress.ip_address(_address(r)[0]) in subnet for r in routes), routes
    assert seen == {r["server"] for r in routes}
    post = requests.post(
        f"{hub.url}{ep['url']}echo", data=b"ping", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    assert post.status_code == 200 and post.json()["echo"] == "ping"


def test_no_token_or_a_wrong_one_is_401(env, deployed):
    hub, state, tokens = env
    ep, token, _ = deployed
    assert _call(hub, ep["url"], None).status_code == 401
    assert _call(hub, ep["url"], token[:-2] + "xx").status_code == 401
    assert _call(hub, ep["url"], "lfsrv_999_nope").status_code == 401
    # A Hub token is not an endpoint token.
    assert _call(hub, ep["url"], tokens["alice"]).status_code == 401
    assert _call(hub, "/services/labfleet/serve/nothing/", token).status_code == 404
    # The token list never shows values.
    (listed,) = hub.api("GET", "/endpoints/echo/tokens", tokens["alice"]).json()
    assert "token" not in listed and listed["valid"] is True


def test_token_rate_limit_revocation_and_open_to_public(env, deployed):
    hub, state, tokens = env
    ep, _, _ = deployed
    r = hub.api("POST", "/endpoints/echo/tokens", tokens["alice"], json={"rate_limit": 2})
    assert r.status_code == 201, r.text
    limited = r.json()
    assert [_call(hub, ep["url"], limited["token"]).status_code for _ in range(3)] == [200, 200, 429]
    assert hub.api("DELETE", f"/endpoints/echo/tokens/{limited['id']}", tokens["alice"]).status_code == 200
    assert _call(hub, ep["url"], limited["token"]).status_code == 401
    for bad in ({"expires_in": 0}, {"rate_limit": -1}, {"nope": 1}, [1]):
        assert hub.api("POST", "/endpoints/echo/tokens", tokens["alice"], json=bad).status_code == 400, bad
    assert hub.api("DELETE", "/endpoints/echo/tokens/x", tokens["alice"]).status_code == 400
    # Open to the public: no token needed; closed again: 401.
    assert (
        hub.api("PATCH", "/endpoints/echo", tokens["alice"], json={"open_to_public": True}).status_code == 200
    )
    assert _call(hub, ep["url"], None).status_code == 200
    assert (
        hub.api("PATCH", "/endpoints/echo", tokens["alice"], json={"open_to_public": False}).status_code
        == 200
    )
    assert _call(hub, ep["url"], None).status_code == 401


def test_a_deactivated_domain_or_owner_suspends_the_endpoint_until_active_again(env, deployed):
    hub, state, tokens = env
    ep, token, _ = deployed
    root = hub.wait_token("root")
    assert (
        hub.api("PATCH", "/endpoints/echo", tokens["alice"], json={"open_to_public": True}).status_code == 200
    )
    try:
        for path, off, on, why in [
            ("/domains/acme", {"is_active": False}, {"is_active": True}, "domain acme is inactive"),
            ("/users/alice", {"status": "inactive"}, {"status": "active"}, "its owner alice is inactive"),
        ]:
            assert hub.api("PATCH", path, root, json=off).status_code == 200
            try:
                # At once (the answer to the change comes after the router's table), with a token or none.
                for caller in (token, None):
                    r = _call(hub, ep["url"], caller)
                    assert r.status_code == 403, r.text
                    assert r.json()["message"] == f"endpoint echo is suspended: {why}", r.text
                assert _call(hub, ep["url"], token, headers={"Upgrade": "websocket"}).status_code == 403
            finally:
                assert hub.api("PATCH", path, root, json=on).status_code == 200
            assert _call(hub, ep["url"], token).status_code == 200
    finally:
        hub.api("PATCH", "/endpoints/echo", tokens["alice"], json={"open_to_public": False})
    # Nothing was torn down meanwhile: both replicas still serve.
    assert _endpoint(hub, tokens["alice"])["healthy_replicas"] == 2


def test_server_sent_events_stream_through_in_pieces(env, deployed):
    hub, state, tokens = env
    ep, token, folder = deployed
    with _call(hub, ep["url"], token, "events", stream=True) as r:
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        lines = r.iter_lines()
        assert next(lines) == b"data: first"
        # The second event is only written once the first has reached us: the router did not buffer it.
        put = hub.api("PUT", f"/vfolders/{folder['id']}/files/go", tokens["alice"], data=b"1")
        assert put.status_code == 201, put.text
        rest = [line for line in lines if line]
        assert rest == [b"data: second"]


async def _ws_roundtrip(url: str, token: str | None, message: str) -> str | None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    conn = await websocket.websocket_connect(HTTPRequest(url, headers=headers, request_timeout=30))
    try:
        await conn.write_message(message)
        return await asyncio.wait_for(conn.read_message(), 30)
    finally:
        conn.close()


def test_websockets_pass_through(env, deployed):
    hub, state, tokens = env
    ep, token, _ = deployed
    url = hub.url.replace("http://", "ws://") + ep["url"] + "ws"
    replicas = {r["server"] for r in ep["routes"] if r["status"] == "RUNNING"}
    answers = {asyncio.run(_ws_roundtrip(url, token, f"hello {i}")) for i in range(4)}
    assert {a.rsplit(":", 1)[0] for a in answers} <= replicas and all(a.startswith("echo-r") for a in answers)
    assert {a.rsplit(":", 1)[1] for a in answers} == {f"hello {i}" for i in range(4)}
    with pytest.raises(HTTPClientError) as e:
        asyncio.run(_ws_roundtrip(url, None, "no token"))
    assert e.value.code == 401


def _address(route) -> tuple[str, int]:
    host, port = route["address"].rsplit(":", 1)
    return host, int(port)


_DIRECT = requests.Session()
_DIRECT.trust_env = False  # straight to the replica, whatever proxy the environment names


def _direct(host: str, port: int, headers=None, path="whoami"):
    return _DIRECT.get(f"http://{host}:{port}/{path}", headers=headers or {}, timeout=10)


# Run inside another session's network namespace as the session account: each URL's status, or the
# error that stopped it (unreachable, refused, timed out).
PEEK = r"""
import json, sys, urllib.error, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
out = []
for url, headers in json.loads(sys.argv[1]):
    try:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=3) as r:
            out.append(r.status)
    except urllib.error.HTTPError as e:
        out.append(e.code)
    except Exception as e:
        out.append(type(getattr(e, "reason", e)).__name__)
print(json.dumps(out))
"""


def _from_session(state, user: str, server: str, targets) -> list:
    """``targets`` ([(url, headers)]) called from inside ``user``'s session ``server``: its network
    namespace and its unprivileged account, as its own code would."""
    out = subprocess.run(
        in_session(state, user, server, ["/usr/bin/python3", "-c", PEEK, json.dumps(targets)]),
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_replica_refuses_calls_without_its_credential(env, deployed):
    hub, state, tokens = env
    ep, token, _ = deployed
    root = hub.wait_token("root")
    routes = [r for r in _endpoint(hub, tokens["alice"])["routes"] if r["status"] == "RUNNING"]
    assert len(routes) == 2
    creds = {}
    for r in routes:
        # The credential goes to the replica's own session (its owner's token) and the Hub, nobody else.
        path = f"/sessions/{r['session_id']}/replica-credential"
        mine = hub.api("GET", path, tokens["alice"])
        assert mine.status_code == 200 and mine.headers["Cache-Control"] == "no-store", mine.text
        got = mine.json()
        assert (got["replica"], got["endpoint"], got["route"], got["header"]) == (
            True,
            "echo",
            r["id"],
            HEADER,
        )
        assert hub.api("GET", path, hub.service_token).json()["credential"] == got["credential"]
        for other in (tokens["eve"], root):
            assert hub.api("GET", path, other).status_code == 404
        creds[r["id"]] = got["credential"]
    assert len(set(creds.values())) == 2  # one per replica

    # From the host, straight at a replica's port: 401 without the credential, with a wrong one, with
    # the other replica's, or with the endpoint's own token; the model is never reached.
    (a, b) = routes
    host, port = _address(a)
    for headers in (
        {},
        {HEADER: "lfrc_" + "A" * 43},
        {HEADER: creds[b["id"]]},
        {"Authorization": f"Bearer {token}"},
        {PROBE_HEADER: "connect"},
    ):
        r = _direct(host, port, headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.json()["message"].startswith("this is a replica of a model-serving endpoint")
    # With its credential it answers (what the router sends), and the model never sees the credential.
    r = _direct(host, port, {HEADER: creds[a["id"]]})
    assert r.status_code == 200 and r.json()["replica"] == a["server"]
    named = _direct(host, port, {HEADER: creds[a["id"]]}, path="headers").json()["headers"]
    assert not [h for h in named if h.lower().startswith("x-labfleet-replica")], named
    if SESSION_NETWORK:
        # The model itself listens on its session's loopback: not reachable at the session's address.
        inner = int(r.json()["port"])
        assert inner != port
        with pytest.raises(requests.ConnectionError):
            _direct(host, inner)

        # From another tenant's session (eve's, in domain `other`): the replica cannot even be reached,
        # its own credential included; the host's loopback is not the session's.
        assert hub.hub_api("POST", "/users/eve/servers/peek", json={"project": "other/play", "cpu": 0.25}).ok
        _wait(
            "eve's session ready",
            lambda: (hub.hub_api("GET", "/users/eve").json()["servers"].get("peek") or {}).get("ready"),
            timeout=90,
            hub=hub,
        )
        url = f"http://{host}:{port}/whoami"
        got = _from_session(
            state,
            "eve",
            "peek",
            [
                [url, {}],
                [url, {HEADER: "lfrc_" + "A" * 43}],
                [url, {HEADER: creds[a["id"]]}],
                [f"http://127.0.0.1:{port}/whoami", {HEADER: creds[a["id"]]}],
            ],
        )
        print(f"calls from eve's session: {got}")
        assert all(g == 401 or isinstance(g, str) for g in got), got  # refused or unreachable: never 200
        assert hub.hub_api("DELETE", "/users/eve/servers/peek").status_code in (202, 204)

    # The credential is in no log (the Hub's, the service's, the sessions'), no page and no option.
    seen = [hub.log_text()]
    for r in routes:
        seen.append(hub.api("GET", f"/sessions/{r['session_id']}/logs", tokens["alice"]).text)
        seen.append(hub.api("GET", f"/sessions/{r['session_id']}", tokens["alice"]).text)
        page = requests.get(
            f"{hub.url}/user/alice/{r['server']}/labfleet/session",
            headers={"Authorization": f"token {tokens['alice']}"},
            timeout=30,
        )
        assert page.status_code == 200, page.text
        seen.append(page.text)
        for pid in _pids_of(r["server"]):
            seen.append(Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace"))
    seen.append(json.dumps(hub.hub_api("GET", "/users/alice").json()))  # user_options, as the Hub shows them
    seen += [hub.api("GET", "/endpoints/echo", who).text for who in (tokens["alice"], root)]
    home = state / "homes" / "alice"
    seen += [
        p.read_text(errors="replace") for p in home.rglob("*") if p.is_file() and p.stat().st_size < 1 << 20
    ]
    for c in creds.values():
        assert not [i for i, text in enumerate(seen) if c in text]


def _pids_of(server: str) -> list[int]:
    """The model's processes of one replica (its Hub server's name in their environment)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            args = (p / "cmdline").read_bytes().split(b"\0")
            if b"server.py" in args and f"JUPYTERHUB_SERVER_NAME={server}".encode() in (
                p / "environ"
            ).read_bytes().split(b"\0"):
                out.append(int(p.name))
        except OSError:
            continue
    return out


def test_a_killed_replica_is_replaced_while_calls_keep_succeeding(env, deployed):
    hub, state, tokens = env
    _, token, _ = deployed
    ep = _endpoint(hub, tokens["alice"])
    victim = next(r for r in ep["routes"] if r["status"] == "RUNNING")
    pids = _pids_of(victim["server"])
    assert pids, victim
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    # Calls keep succeeding: a refused connection, or one closed unanswered, goes to the other replica.
    for _ in range(10):
        r = _call(hub, ep["url"], token)
        assert r.status_code == 200, r.text

    def replaced():
        e = _endpoint(hub, tokens["alice"])
        running = [r for r in e["routes"] if r["status"] == "RUNNING" and r["traffic"] == "ACTIVE"]
        return e["healthy_replicas"] == 2 and victim["server"] not in {r["server"] for r in running} and e

    after = _wait("a new replica in place of the killed one", replaced, timeout=150, hub=hub)
    failed = next(r for r in after["routes"] if r["server"] == victim["server"])
    assert failed["status"] == "FAILED" and failed["last_error"], failed
    assert victim["server"] not in _servers(hub, "alice")
    for _ in range(4):
        assert _call(hub, after["url"], token).status_code == 200


def test_scale_down_to_one(env, deployed):
    hub, state, tokens = env
    _, token, _ = deployed
    r = hub.api("PATCH", "/endpoints/echo", tokens["alice"], json={"replicas": 1})
    assert r.status_code == 200 and r.json()["replicas"] == 1, r.text
    done = _wait(
        "one replica left",
        lambda: (
            (e := _endpoint(hub, tokens["alice"]))["active_replicas"] == 1
            and e["healthy_replicas"] == 1
            and e
        ),
        hub=hub,
    )
    assert done["status"] == "READY" and done["status_reason"] == "1 of 1 replicas healthy"
    left = {r["server"] for r in done["routes"] if r["status"] == "RUNNING"}
    _wait("one replica server in the Hub", lambda: set(_servers(hub, "alice")) == left, timeout=60, hub=hub)
    assert {_call(hub, done["url"], token).json()["replica"] for _ in range(3)} == left
    # Bad input: 400 and nothing changes.
    for body in ({"replicas": -1}, {"replicas": "two"}, {"nope": 1}, {}):
        bad = hub.api("PATCH", "/endpoints/echo", tokens["alice"], json=body)
        assert bad.status_code == 400, (body, bad.text)
    assert _endpoint(hub, tokens["alice"])["replicas"] == 1


def test_another_domain_sees_nothing(env, deployed):
    hub, state, tokens = env
    assert hub.api("GET", "/endpoints", tokens["eve"]).json() == []
    assert hub.api("GET", "/endpoints/echo", tokens["eve"]).status_code == 404
    assert hub.api("PATCH", "/endpoints/echo", tokens["eve"], json={"replicas": 3}).status_code == 404
    assert hub.api("DELETE", "/endpoints/echo", tokens["eve"]).status_code == 404
    assert hub.api("POST", "/endpoints/echo/tokens", tokens["eve"], json={}).status_code == 404
    # root (superadmin) sees it; alice sees her own.
    root = hub.wait_token("root")
    assert [e["name"] for e in hub.api("GET", "/endpoints", root).json()] == ["echo"]
    assert [e["name"] for e in hub.api("GET", "/endpoints", tokens["alice"]).json()] == ["echo"]


def test_user_policy_limits(env, deployed):
    hub, state, tokens = env
    root = hub.wait_token("root")
    policy = {"name": "serving", "max_endpoints": 1, "max_replicas_per_endpoint": 2}
    r = hub.api("POST", "/policies/user", root, json=policy)
    assert r.status_code == 201 and r.json()["max_replicas_per_endpoint"] == 2, r.text
    # They are a user policy's: a project policy refuses them
    r = hub.api("POST", "/policies/project", root, json={"name": "team", "max_endpoints": 1})
    assert r.status_code == 400 and "max_endpoints" in r.json()["message"], r.text
    assert hub.api("PATCH", "/users/alice", root, json={"resource_policy": "serving"}).status_code == 200
    body = {"name": "echo2", "project": "acme/ml", "model_folder": "echo-model", "replicas": 1}
    r = hub.api("POST", "/endpoints", tokens["alice"], json=body)
    assert r.status_code == 409 and "at most 1 endpoints" in r.json()["message"], r.text
    r = hub.api("POST", "/endpoints", tokens["alice"], json={**body, "replicas": 3})
    assert r.status_code == 409 and "at most 2 replicas" in r.json()["message"], r.text
    r = hub.api("PATCH", "/endpoints/echo", tokens["alice"], json={"replicas": 3})
    assert r.status_code == 409 and _endpoint(hub, tokens["alice"])["replicas"] == 1, r.text
    assert hub.api("PATCH", "/users/alice", root, json={"resource_policy": None}).status_code == 200
    assert [e["name"] for e in hub.api("GET", "/endpoints", tokens["alice"]).json()] == ["echo"]


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_definitions_are_400_and_start_nothing(env, kind):
    hub, state, tokens = env
    _folder(hub, tokens["alice"], f"bad-{kind}", {"model-definition.yaml": BAD[kind], "server.py": SERVER})
    before = set(_servers(hub, "alice"))
    r = hub.api(
        "POST",
        "/endpoints",
        tokens["alice"],
        json={"name": "bad", "project": "acme/ml", "model_folder": f"bad-{kind}", "replicas": 1},
    )
    assert r.status_code == 400, r.text
    message = r.json()["message"]
    assert message.startswith("model-definition.yaml: ")
    assert {
        "noport": "port is missing",
        "badyaml": "not valid YAML",
        "nocommand": "start_command is missing",
    }[kind] in message
    assert hub.api("GET", "/endpoints/bad", tokens["alice"]).status_code == 404
    time.sleep(1.5)  # a serving tick: nothing starts
    assert set(_servers(hub, "alice")) == before


def test_delete_stops_the_url_and_the_replicas(env, deployed):
    hub, state, tokens = env
    ep, token, _ = deployed
    r = hub.api("DELETE", "/endpoints/echo", tokens["alice"])
    assert r.status_code == 200 and r.json()["status"] == "DESTROYING", r.text
    gone = _wait(
        "the endpoint destroyed",
        lambda: (e := _endpoint(hub, tokens["alice"]))["status"] == "DESTROYED" and e,
        hub=hub,
    )
    assert gone["active_replicas"] == 0
    assert _call(hub, ep["url"], token).status_code == 404
    _wait(
        "no replica server left",
        lambda: not any(n.startswith("echo-r") for n in _servers(hub, "alice")),
        hub=hub,
    )
    sessions = [
        s for s in hub.api("GET", "/sessions", tokens["alice"]).json() if s["name"].startswith("echo-r")
    ]
    assert sessions and all(s["status"] in ("TERMINATED", "ERROR", "CANCELLED") for s in sessions), sessions
    assert hub.api("GET", "/endpoints", tokens["alice"]).json() == []
    history = hub.api("GET", "/endpoints?destroyed=true", tokens["alice"]).json()
    assert [(e["name"], e["status"]) for e in history] == [("echo", "DESTROYED")]
    assert history[0]["requests"] > 0


# ---------------------------------------------------------------- the Model Store

README = """# Echo *model*

Answers with the [replica](https://example.org)'s name; a test model.

## Usage
Call it.
"""


def _project_folder(hub, token, project, name, files, usage_mode="model"):
    r = hub.api("POST", "/vfolders", token, json={"name": name, "usage_mode": usage_mode, "project": project})
    assert r.status_code == 201, r.text
    folder = r.json()
    for path, content in files.items():
        data = content if isinstance(content, bytes) else content.encode()
        put = hub.api("PUT", f"/vfolders/{folder['id']}/files/{path}", token, data=data)
        assert put.status_code == 201, put.text
    return folder


def _store(hub, token, **params):
    r = hub.api("GET", "/model-store", token, params=params)
    assert r.status_code == 200, r.text
    return {c["name"]: c for c in r.json()}


def test_model_store_shows_the_projects_model_folders(env):
    hub, state, tokens = env
    root = hub.wait_token("root")
    assert hub.api("POST", "/projects", root, json={"domain": "other", "name": "lab"}).status_code == 201
    zoo = _project_folder(
        hub, root, "acme/ml", "zoo-echo", {"README.md": README, "model-definition.yaml": DEFINITION}
    )
    _project_folder(
        hub,
        root,
        "acme/ml",
        "zoo-broken",
        {"README.md": b"# Caf\xe9\n", "model-definition.yaml": BAD["noport"]},
    )
    _project_folder(hub, root, "acme/ml", "zoo-general", {"README.md": README}, usage_mode="general")
    _project_folder(hub, root, "other/lab", "zoo-lab", {})
    _folder(hub, tokens["alice"], "zoo-mine", {"README.md": README, "model-definition.yaml": DEFINITION})

    cards = _store(hub, tokens["alice"])
    # The project's model folders and her own (a plain user can make only those): not a general one,
    # not another domain's.
    assert {n for n in cards if n.startswith("zoo-")} == {"zoo-echo", "zoo-broken", "zoo-mine"}, cards
    mine = cards["zoo-mine"]
    assert (mine["project"], mine["owner"], mine["can_deploy"]) == (None, "user:alice", True)
    assert cards["zoo-echo"]["owner"] == "project:acme/ml"
    echo = cards["zoo-echo"]
    assert (echo["id"], echo["project"], echo["title"]) == (zoo["id"], "acme/ml", "Echo model")
    assert echo["summary"] == "Answers with the replica's name; a test model."
    assert echo["readme"] == README and echo["readme_truncated"] is False and echo["readme_error"] is None
    assert echo["model"] == {"name": "echo", "port": 8000} and echo["definition_error"] is None
    assert echo["has_definition"] and echo["can_deploy"] and echo["host"] == zoo["host"]
    broken = cards["zoo-broken"]
    assert broken["model"] is None and "port is missing" in broken["definition_error"]
    assert (
        broken["readme"] is None and "not UTF-8" in broken["readme_error"] and broken["title"] == "zoo-broken"
    )

    # ?search looks at the name and the title; ?project narrows; a malformed project is 400.
    assert set(_store(hub, tokens["alice"], search="ECHO MOD")) == {"zoo-echo", "zoo-mine"}  # one README
    assert set(_store(hub, tokens["alice"], search="zoo-b")) == {"zoo-broken"}
    assert _store(hub, tokens["alice"], project="other/lab") == {}  # her own folder is in no project
    assert {n for n in _store(hub, tokens["alice"], project="acme/ml") if n.startswith("zoo-")} == {
        "zoo-echo",
        "zoo-broken",
    }
    for bad in ("nodomain", "a/b/c", "", "acme/ no"):
        r = hub.api("GET", "/model-store", tokens["alice"], params={"project": bad})
        assert r.status_code == 400 and r.json()["message"], (bad, r.text)

    # Another domain's user sees none of acme's; acme's admin sees acme's (not being in ml, deploys
    # none); a monitor and the superadmin see every project's.
    assert not {n for n in _store(hub, tokens["eve"]) if n.startswith("zoo-")}
    for name, role in (("acme-admin", "admin"), ("watcher", "monitor")):
        r = hub.api("POST", "/users", root, json={"username": name, "domain": "acme", "role": role})
        assert r.status_code == 201, r.text
    admin = _store(hub, hub.wait_token("acme-admin"))
    assert {n for n in admin if n.startswith("zoo-")} == {"zoo-echo", "zoo-broken"}
    assert not any(c["can_deploy"] for c in admin.values())
    for token in (root, hub.wait_token("watcher")):
        everything = _store(hub, token)
        assert {n for n in everything if n.startswith("zoo-")} == {"zoo-echo", "zoo-broken", "zoo-lab"}
        assert not any(c["can_deploy"] for c in everything.values())
