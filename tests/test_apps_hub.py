"""App services on a real Hub: a labfleet session (local backend) runs TensorBoard, MLflow and VS Code
(code-server) behind jupyter-server-proxy when they are installed, plus the ports its image declares; all
are reached through the Hub's proxy at /user/<name>/<server>/<app>/ with the user's token, websockets
included, and nobody else's.

The programs come from ``bash scripts/setup.sh --test`` (``.labfleet-tools/apps/bin``), put on the Hub's
PATH, which the spawner passes to its sessions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import requests
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from tests.hubfixture import REPO, in_session, start_hub

pytestmark = pytest.mark.hub

APPS_BIN = REPO / ".labfleet-tools" / "apps" / "bin"
SERVER = "apps"
IMAGE = "apps/echo:1"

# The image's own services: an HTTP page with a websocket echo, and a raw TCP echo.
SERVICES = textwrap.dedent(
    """
    import asyncio, sys
    from tornado import web, websocket

    class Page(web.RequestHandler):
        def get(self, *args):
            self.finish({"app": "echo", "path": self.request.path})

    class WS(websocket.WebSocketHandler):
        def on_message(self, message):
            self.write_message("echo:" + message)

    async def tcp_echo(reader, writer):
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()

    async def main():
        web.Application([(r"/ws", WS), (r"/.*", Page)]).listen(int(sys.argv[1]), address="127.0.0.1")
        await asyncio.start_server(tcp_echo, "127.0.0.1", int(sys.argv[2]))
        print("services listening", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    for program in ("tensorboard", "mlflow", "code-server"):
        if not os.access(APPS_BIN / program, os.X_OK):
            raise RuntimeError(f"{APPS_BIN / program} is missing: run `bash scripts/setup.sh --test`")
    state = tmp_path_factory.mktemp("apps")
    http_port, tcp_port = 8701, 8702  # in the session's own network: any ports
    services = hub = None
    try:
        with pytest.MonkeyPatch.context() as mp:
            # Sessions get the Hub's PATH: the launchers find the programs there.
            mp.setenv("PATH", f"{os.environ['PATH']}{os.pathsep}{APPS_BIN}")
            hub = start_hub(state)
        root = hub.wait_token("root")
        for path, body in [
            ("/domains", {"name": "acme"}),
            ("/projects", {"domain": "acme", "name": "ml"}),
            ("/users", {"username": "alice", "domain": "acme", "projects": ["ml"]}),
            ("/users", {"username": "bob", "domain": "acme", "projects": ["ml"]}),
            (
                "/images",
                {"name": IMAGE, "service_ports": [f"echo:http:{http_port}", f"rawecho:tcp:{tcp_port}"]},
            ),
        ]:
            r = hub.api("POST", path, root, json=body)
            assert r.status_code == 201, (path, r.text)
        tokens = {name: hub.wait_token(name) for name in ("alice", "bob")}
        # The user's choice of TensorBoard log dir, and a run in it, before TensorBoard first starts.
        home = state / "homes" / "alice"
        (home / ".labfleet").mkdir(parents=True)
        (home / ".labfleet" / "apps.json").write_text(json.dumps({"tensorboard": {"logdir": "runs"}}))
        write_run(home / "runs" / "exp1")
        r = hub.hub_api("POST", f"/users/alice/servers/{SERVER}", json={"project": "ml", "image": IMAGE})
        assert r.status_code in (201, 202), r.text
        wait_ready(hub, "alice", SERVER)
        # The image's own services run in the session, as its processes would in a container.
        services = subprocess.Popen(
            in_session(
                state, "alice", SERVER, [sys.executable, "-c", SERVICES, str(http_port), str(tcp_port)]
            ),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert services.stdout.readline().strip() == "services listening"
        yield hub, tokens, home
    finally:
        if hub is not None:
            hub.hub_api("DELETE", f"/users/alice/servers/{SERVER}")
            hub.stop()
        if services is not None:
            services.terminate()
            services.wait(10)


def write_run(logdir) -> None:
    """A TensorBoard run with a scalar, written by the apps' own Python (where tensorboard is)."""
    python = os.path.realpath(APPS_BIN / "tensorboard")
    python = os.path.join(os.path.dirname(python), "python")
    code = textwrap.dedent(
        """
        import sys, time
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        w = EventFileWriter(sys.argv[1])
        for step in range(3):
            value = Summary.Value(tag="loss", simple_value=1.0 / (step + 1))
            w.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=[value])))
        w.close()
        """
    )
    subprocess.run([python, "-c", code, str(logdir)], check=True, timeout=60)


def wait_ready(hub, name: str, server: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    model = None
    while time.monotonic() < deadline:
        model = hub.hub_api("GET", f"/users/{name}").json()["servers"].get(server)
        if model and model.get("ready"):
            return
        time.sleep(0.3)
    raise AssertionError(f"{name}/{server} never became ready: {model}\n{hub.log_text()[-4000:]}")


def get(hub, token, path: str, **kw) -> requests.Response:
    kw.setdefault("timeout", 120)  # the first request starts the app (MLflow migrates its DB first)
    return requests.get(
        f"{hub.url}/user/alice/{SERVER}/{path}", headers={"Authorization": f"token {token}"}, **kw
    )


async def ws(hub, token, path: str):
    url = f"{hub.url.replace('http', 'ws', 1)}/user/alice/{SERVER}/{path}"
    request = HTTPRequest(url, headers={"Authorization": f"token {token}"}, request_timeout=60)
    return await websocket_connect(request)


def test_apps_lists_the_installed_launchers_and_the_image_ports(env):
    hub, tokens, _ = env
    r = get(hub, tokens["alice"], "labfleet/apps")
    assert r.status_code == 200, r.text
    base = f"/user/alice/{SERVER}/"
    assert sorted((a["name"], a["source"], a["url"]) for a in r.json()) == [
        ("echo", "image", base + "echo/"),
        ("mlflow", "launcher", base + "mlflow/"),
        ("rawecho", "image", base + "rawecho/"),
        ("tensorboard", "launcher", base + "tensorboard/"),
        ("vscode", "launcher", base + "vscode/"),
    ]
    # The Lab's launcher (jupyter-server-proxy) offers the same, raw TCP aside.
    info = get(hub, tokens["alice"], "server-proxy/servers-info").json()["server_processes"]
    shown = {p["name"] for p in info if p["launcher_entry"]["enabled"]}
    assert shown == {"echo", "mlflow", "tensorboard", "vscode"}


def test_tensorboard_shows_the_run_in_the_chosen_log_dir(env):
    hub, tokens, home = env
    page = get(hub, tokens["alice"], "tensorboard/")
    assert page.status_code == 200 and "tb-relative-root" in page.text
    environment = get(hub, tokens["alice"], "tensorboard/data/environment").json()
    assert environment["data_location"] == str(home / "runs")
    deadline = time.monotonic() + 30  # TensorBoard reads the log dir in the background
    tags = {}
    while time.monotonic() < deadline:
        tags = get(hub, tokens["alice"], "tensorboard/data/plugin/scalars/tags").json()
        if tags:
            break
        time.sleep(0.5)
    assert list(tags) == ["exp1"] and "loss" in tags["exp1"]
    scalars = get(hub, tokens["alice"], "tensorboard/data/plugin/scalars/scalars?run=exp1&tag=loss").json()
    assert [step for _, step, _ in scalars] == [0, 1, 2]


def test_mlflow_ui_and_rest_api(env):
    hub, tokens, home = env
    page = get(hub, tokens["alice"], "mlflow/")
    assert page.status_code == 200 and "static-files" in page.text
    headers = {"Authorization": f"token {tokens['alice']}"}
    api = f"{hub.url}/user/alice/{SERVER}/mlflow/api/2.0/mlflow/experiments"
    created = requests.post(f"{api}/create", json={"name": "apps-test"}, headers=headers, timeout=60)
    assert created.status_code == 200, created.text
    exp_id = created.json()["experiment_id"]
    got = get(
        hub, tokens["alice"], "mlflow/ajax-api/2.0/mlflow/experiments/get-by-name?experiment_name=apps-test"
    )
    assert got.status_code == 200 and got.json()["experiment"]["experiment_id"] == exp_id
    assert (home / "mlflow.db").is_file()  # the session's default store, in its home


def test_vscode_page(env):
    hub, tokens, home = env
    page = get(hub, tokens["alice"], "vscode/")  # code-server redirects to ./?folder=<home>
    assert page.status_code == 200, page.text[:500]
    assert page.url.endswith(f"/vscode/?folder={home}") and "vscode-workbench" in page.text.lower()
    assert get(hub, tokens["alice"], "vscode/healthz").json()["status"] == "alive"
    assert (home / ".labfleet" / "code-server" / "sessions" / SERVER).is_dir()


async def test_vscode_websocket(env):
    hub, tokens, _ = env
    # The workbench's channel to the server is a websocket at the same prefix: the upgrade goes through.
    conn = await ws(
        hub, tokens["alice"], "vscode/?reconnectionToken=t1&reconnection=false&skipWebSocketFrames=false"
    )
    conn.close()


def test_image_port_http(env):
    hub, tokens, _ = env
    r = get(hub, tokens["alice"], "echo/some/page")
    assert r.status_code == 200 and r.json() == {"app": "echo", "path": "/some/page"}


async def test_image_ports_websocket_and_tcp(env):
    hub, tokens, _ = env
    conn = await ws(hub, tokens["alice"], "echo/ws")
    await conn.write_message("hello")
    assert await conn.read_message() == "echo:hello"
    conn.close()
    # A tcp port: a websocket carries the raw stream.
    raw = await ws(hub, tokens["alice"], "rawecho/")
    await raw.write_message(b"ping\n", binary=True)
    assert await raw.read_message() == b"ping\n"
    raw.close()


def test_nobody_else_reaches_the_apps(env):
    hub, tokens, _ = env
    for path in ("labfleet/apps", "tensorboard/", "echo/x"):
        r = get(hub, tokens["bob"], path, allow_redirects=False)
        assert r.status_code == 403, (path, r.status_code)
        anonymous = requests.get(f"{hub.url}/user/alice/{SERVER}/{path}", allow_redirects=False, timeout=30)
        assert anonymous.status_code in (302, 401, 403) and '"app"' not in anonymous.text


async def test_nobody_else_opens_a_websocket(env):
    hub, tokens, _ = env
    with pytest.raises(Exception, match="403"):
        await ws(hub, tokens["bob"], "echo/ws")
