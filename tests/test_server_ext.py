"""labfleet.session: the in-session runners (batch, inference) and their endpoints.

In-process tests use pytest-jupyter's server fixtures (a real ServerApp with the extension loaded, real HTTP
on 127.0.0.1); the exit-code contract is checked on a real ``jupyter server`` process, since it is about
the process's own exit status.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

# pytest-jupyter's fixtures, imported into this module only (not `pytest_plugins`): plugins and their hooks
# become global, and pytest-jupyter's hooks (its own coroutine runner, an autouse loop fixture that closes
# the loop) would take over every async test of the suite from pytest-asyncio. Imported fixtures stay local.
from pytest_jupyter.jupyter_server import *  # noqa: F403
from tornado.httpclient import HTTPClientError

import labfleet.session
from labfleet.session.runner import exit_code_of, write_json_atomic

REPO = Path(__file__).resolve().parents[1]
WAIT = 30.0  # seconds: the most any wait in these tests may take


# A tiny model server: echoes method, path, body and the proxy prefix; a websocket echo at /ws. It only
# listens once the file "go" exists in its working directory, so the test controls "not ready yet".
BACKEND = textwrap.dedent(
    """
    import asyncio, json, os, sys
    from tornado import web, websocket

    class Echo(web.RequestHandler):
        def _echo(self, *args):
            self.finish({"method": self.request.method, "path": self.request.path,
                         "query": self.request.query, "body": self.request.body.decode(),
                         "prefix": self.request.headers.get("X-Forwarded-Prefix"),
                         "port_env": os.environ.get("PORT")})
        get = post = put = delete = _echo

    class WS(websocket.WebSocketHandler):
        def on_message(self, message):
            self.write_message("echo:" + message)

    async def main():
        while not os.path.exists("go"):
            await asyncio.sleep(0.05)
        web.Application([(r"/ws", WS), (r"/.*", Echo)]).listen(int(sys.argv[1]), address="127.0.0.1")
        print("backend listening", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


@pytest.fixture
async def jp_asyncio_loop():
    """pytest-jupyter's server on pytest-asyncio's (module) loop, which this fixture must not close
    (pytest-jupyter's own version closes the loop after each test)."""
    return asyncio.get_running_loop()


@pytest.fixture
def labfleet_session(request, monkeypatch, tmp_path):
    """The spawner's LABFLEET_* variables for the server of this test, set before the server is created.
    Parametrize indirectly with (session type, command); the command may use $BACKEND_PY (the test
    backend below) and $PYTHON."""
    session_type, command = getattr(request, "param", ("interactive", None))
    for name in list(os.environ):
        if name.startswith("LABFLEET_"):
            monkeypatch.delenv(name)
    if session_type:
        monkeypatch.setenv("LABFLEET_SESSION_TYPE", session_type)
    if command is not None:
        monkeypatch.setenv("LABFLEET_COMMAND", command)
    monkeypatch.setenv("LABFLEET_SESSION_ID", "0b0e4d2a-3f5c-4c1e-9a57-1f6f3c0d8e21")
    run_dir = tmp_path / "run"
    monkeypatch.setenv("LABFLEET_RUN_DIR", str(run_dir))
    backend = tmp_path / "backend.py"
    backend.write_text(BACKEND)
    monkeypatch.setenv("BACKEND_PY", str(backend))
    monkeypatch.setenv("PYTHON", sys.executable)
    return run_dir


@pytest.fixture
def jp_server_config(labfleet_session):
    # The dev install may not have the shipped config file (jupyter_server_config.d/labfleet.json) on the
    # config path, and pytest-jupyter isolates the path anyway: enable the extension explicitly.
    # exit_with_command off: a finished command must not end the pytest process.
    return {
        "ServerApp": {"jpserver_extensions": {"labfleet.session": True}},
        "LabfleetExtension": {"exit_with_command": False},
    }


@pytest.fixture
async def app(jp_serverapp):
    """The server with its extensions started, as ServerApp does once its loop runs (that is when the
    runner starts the command); the extensions (and so the command) stopped afterwards."""
    await jp_serverapp.extension_manager.start_all_extensions()
    yield jp_serverapp
    await jp_serverapp.extension_manager.stop_all_extensions()


def session(session_type, command=None):
    return pytest.mark.parametrize("labfleet_session", [(session_type, command)], indirect=True)


def read(path: Path) -> str:
    """A small local file, read from async tests (blocking for microseconds)."""
    return Path(path).read_text()


async def get_json(jp_fetch, *parts):
    r = await jp_fetch(*parts)
    return json.loads(r.body)


async def wait_for_state(jp_fetch, *states):
    """Poll GET labfleet/runner until the state is one of ``states`` (bounded)."""
    deadline = time.monotonic() + WAIT
    while True:
        doc = await get_json(jp_fetch, "labfleet", "runner")
        if doc["state"] in states:
            return doc
        assert time.monotonic() < deadline, f"runner still {doc['state']}: {doc}"
        await asyncio.sleep(0.1)


# -- unit --------------------------------------------------------------------------------------------------


def test_extension_points_and_shipped_config():
    assert labfleet.session._jupyter_server_extension_points()[0]["module"] == "labfleet.session"
    shipped = json.loads((REPO / "server_ext/etc/jupyter_server_config.d/labfleet.json").read_text())
    assert shipped["ServerApp"]["jpserver_extensions"] == {"labfleet.session": True}


def test_exit_code_of_signals_and_atomic_state(tmp_path):
    assert exit_code_of(0) == 0 and exit_code_of(3) == 3
    assert exit_code_of(-9) == 137 and exit_code_of(-15) == 143
    target = tmp_path / "a" / "runner.json"
    write_json_atomic(target, {"state": "running"})
    write_json_atomic(target, {"state": "exited"})
    assert json.loads(target.read_text()) == {"state": "exited"}
    assert [p.name for p in target.parent.iterdir()] == ["runner.json"]  # no temp file left behind


# -- interactive -------------------------------------------------------------------------------------------


async def test_interactive_endpoint(app, jp_fetch, http_server_client, jp_base_url):
    assert await get_json(jp_fetch, "labfleet", "runner") == {"type": "interactive", "state": "none"}
    # No token: jupyter-server's auth refuses the API before any runner code runs.
    r = await http_server_client.fetch(f"{jp_base_url}labfleet/runner", raise_error=False)
    assert r.code == 403
    # No inference proxy in an interactive session.
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("labfleet", "inference", "x")
    assert e.value.code == 404


# -- batch (in process) ------------------------------------------------------------------------------------


@session("batch", "echo hello; echo oops >&2; exit 3")
async def test_batch_runs_command_and_records_exit(app, labfleet_session, jp_fetch, jp_root_dir):
    doc = await wait_for_state(jp_fetch, "exited")
    assert doc["exit_code"] == 3
    assert doc["type"] == "batch" and doc["command"] == "echo hello; echo oops >&2; exit 3"
    assert isinstance(doc["pid"], int) and doc["started_at"] and doc["ended_at"]
    assert "hello\noops\n" in doc["output_tail"]  # stdout and stderr, in order
    log = Path(doc["log"])
    assert log == jp_root_dir / "labfleet-batch.log"  # in the Lab's root: the file browser shows it
    assert "hello" in read(log)
    state = json.loads(read(labfleet_session / "runner.json"))
    assert state == {k: v for k, v in doc.items() if k != "output_tail"}
    # The Lab's own contents API sees the log, as the file browser would.
    model = await get_json(jp_fetch, "api", "contents", "labfleet-batch.log")
    assert "hello" in model["content"]


@session("batch", "kill -TERM $$")
async def test_batch_signal_gives_128_plus_signal(app, jp_fetch):
    assert (await wait_for_state(jp_fetch, "exited"))["exit_code"] == 143


@session("batch", "   ")
async def test_batch_empty_command_fails_with_2(app, labfleet_session, jp_fetch, jp_root_dir):
    doc = await wait_for_state(jp_fetch, "failed-to-start")
    assert doc["exit_code"] == 2 and doc["pid"] is None
    assert "LABFLEET_COMMAND is empty" in doc["output_tail"]
    assert "LABFLEET_COMMAND is empty" in read(jp_root_dir / "labfleet-batch.log")
    assert json.loads(read(labfleet_session / "runner.json"))["state"] == "failed-to-start"


@session("batch", "sleep 60 & echo $! > child.pid; echo started; sleep 60")
async def test_stopping_the_server_stops_the_command_tree(app, jp_fetch, jp_root_dir):
    # A long command with a background child: stopping the session must stop both.
    deadline = time.monotonic() + WAIT
    while "started" not in (await get_json(jp_fetch, "labfleet", "runner"))["output_tail"]:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    child = int(read(jp_root_dir / "child.pid"))
    assert _alive(child)
    await app.extension_manager.stop_all_extensions()  # what the server's stop (SIGTERM) runs
    doc = await get_json(jp_fetch, "labfleet", "runner")
    assert doc["state"] == "exited" and doc["exit_code"] == 143  # ended by SIGTERM
    deadline = time.monotonic() + WAIT
    while _alive(child):
        assert time.monotonic() < deadline, "the command's background child survived the session"
        await asyncio.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


# -- inference (in process) --------------------------------------------------------------------------------


async def wait_until_ready(jp_fetch):
    """Retry through the proxy while it answers 503 (the command is starting); its first real answer."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            return await jp_fetch("labfleet", "inference", "v1", "models", params={"q": "1"})
        except HTTPClientError as err:
            assert err.code == 503 and time.monotonic() < deadline, err
            await asyncio.sleep(0.1)


@session("inference", 'exec "$PYTHON" "$BACKEND_PY" {port}')
async def test_inference_proxy(app, labfleet_session, jp_fetch, jp_ws_fetch, jp_root_dir):
    doc = await wait_for_state(jp_fetch, "running")
    port = doc["port"]
    assert (
        isinstance(port, int) and doc["command"] == f'exec "$PYTHON" "$BACKEND_PY" {port}'
    )  # {port} filled in
    assert doc["url_path"] == "/a%40b/labfleet/inference/"
    assert json.loads(read(labfleet_session / "runner.json"))["port"] == port

    # Not listening yet: a clear 503 at once, not a hang.
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("labfleet", "inference", "v1", "models", request_timeout=5)
    assert e.value.code == 503
    assert "nothing listens" in json.loads(e.value.response.body)["message"]

    (jp_root_dir / "go").touch()  # the command's cwd is the Lab's root
    body = json.loads((await wait_until_ready(jp_fetch)).body)
    assert body == {
        "method": "GET",
        "path": "/v1/models",
        "query": "q=1",
        "body": "",
        "prefix": "/a%40b/labfleet/inference",
        "port_env": str(port),
    }
    r = await jp_fetch("labfleet", "inference", "generate", method="POST", body='{"prompt": "hi"}')
    assert json.loads(r.body)["body"] == '{"prompt": "hi"}'

    # A websocket through the same prefix.
    ws = await jp_ws_fetch("labfleet", "inference", "ws")
    try:
        await ws.write_message("ping")
        assert await asyncio.wait_for(ws.read_message(), WAIT) == "echo:ping"
    finally:
        ws.close()

    # The bare prefix redirects below the slash, where the app's relative links work.
    r = await jp_fetch("labfleet", "inference", follow_redirects=False, raise_error=False)
    assert r.code == 302 and r.headers["Location"].endswith("/a%40b/labfleet/inference/")

    # The command's output reached the log file.
    assert "backend listening" in read(jp_root_dir / "labfleet-inference.log")


@session("inference", "echo bye; exit 4")
async def test_inference_command_gone_gives_503(app, jp_fetch):
    doc = await wait_for_state(jp_fetch, "exited")
    assert doc["exit_code"] == 4 and "bye" in doc["output_tail"]
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("labfleet", "inference", "v1", "models", request_timeout=5)
    assert e.value.code == 503
    assert "not running (exited, exit code 4)" in json.loads(e.value.response.body)["message"]


@session("inference", 'exec "$PYTHON" "$BACKEND_PY" "$PORT"')
async def test_inference_refused_without_token(app, jp_fetch, http_server_client, jp_base_url, jp_root_dir):
    (jp_root_dir / "go").touch()
    assert json.loads((await wait_until_ready(jp_fetch)).body)["path"] == "/v1/models"  # with the token
    url = f"{jp_base_url}labfleet/inference/v1/models"
    for method, headers, body in (
        ("GET", {}, None),
        ("POST", {}, "x"),
        ("GET", {"Authorization": "token wrong"}, None),
    ):
        r = await http_server_client.fetch(
            url, method=method, headers=headers, body=body, raise_error=False, follow_redirects=False
        )
        # GET: a redirect to the login page; other methods: 403. Never the model's answer.
        assert r.code in (302, 403), (method, headers, r.code)
        assert b"/v1/models" not in (r.body or b"")


# -- the real process: exits with the command's exit code --------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("session_type", "command", "expected"),
    [("batch", "echo hi; exit 7", 7), ("batch", "echo hi", 0), ("inference", "echo hi; exit 5", 5)],
)
def test_real_server_exits_with_command_exit_code(tmp_path, session_type, command, expected):
    root = tmp_path / "root"
    root.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LABFLEET_", "JUPYTER"))}
    env.update(
        HOME=str(tmp_path / "home"),
        JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
        JUPYTER_DATA_DIR=str(tmp_path / "data"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
        LABFLEET_SESSION_TYPE=session_type,
        LABFLEET_COMMAND=command,
        LABFLEET_RUN_DIR=str(tmp_path / "run"),
        LABFLEET_BATCH_LINGER="0.2",
    )
    argv = [
        sys.executable,
        "-m",
        "jupyter_server",
        "--ServerApp.jpserver_extensions={'labfleet.session': True}",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={_free_port()}",
        "--ServerApp.port_retries=0",
        "--IdentityProvider.token=test-token",
        f"--ServerApp.root_dir={root}",
        "--ServerApp.open_browser=False",
        "--allow-root",
    ]
    proc = subprocess.Popen(
        argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"the server did not exit by itself:\n{out[-3000:]}")
    assert proc.returncode == expected, out[-3000:]
    assert "hi\n" in out  # the command's output reached the server's stdout (the spawner's log)
    assert "hi" in (root / f"labfleet-{session_type}.log").read_text()
    state = json.loads((tmp_path / "run" / "runner.json").read_text())
    assert state["state"] == "exited" and state["exit_code"] == expected
