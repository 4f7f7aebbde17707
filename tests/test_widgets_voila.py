"""The widgets where they really run: Voila renders the demo notebook (widgets/examples/fleet.ipynb) with the
in-memory fleet, and a real IPython kernel refreshes widgets on its own loop and runs a button's coroutine
when the page clicks it (the comm message the front end sends)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from jupyter_client.manager import start_new_kernel

from tests.hubfixture import free_port

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "widgets" / "examples" / "fleet.ipynb"
WAIT = 90.0  # seconds: the most the render (a kernel start and the notebook's cells) may take


def _voila(tmp_path: Path, port: int, env: dict[str, str]) -> subprocess.Popen:
    log = open(tmp_path / "voila.log", "wb")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "voila",
            "--no-browser",
            f"--port={port}",
            "--Voila.ip=127.0.0.1",
            "--show_tracebacks=True",  # an error in a cell then shows in the page (and fails the test)
            NOTEBOOK.name,
        ],
        cwd=NOTEBOOK.parent,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def assert_rendered(html: str, where: str) -> None:
    """A rendered page of the demo notebook: five widget views, the data line, no error anywhere."""
    views = html.count("application/vnd.jupyter.widget-view+json")
    assert views >= 5, f"{views} widget views in {where}"
    assert "problems: none" in html, html[-3000:]
    for bad in ("Traceback", "error when executing", "application/vnd.jupyter.stderr"):
        assert bad not in html, f"{bad!r} in {where}: {html[-3000:]}"


def test_voila_renders_the_demo_notebook_with_the_fake_fleet(tmp_path):
    port = free_port()
    env = dict(os.environ, LABFLEET_WIDGETS_FAKE="1", JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    proc = _voila(tmp_path, port, env)
    try:
        deadline = time.monotonic() + WAIT
        html = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                r = requests.get(f"http://127.0.0.1:{port}/", timeout=WAIT)
            except requests.ConnectionError:
                time.sleep(0.3)
                continue
            assert r.status_code == 200, r.text[-2000:]
            html = r.text
            break
        log = (tmp_path / "voila.log").read_text(errors="replace")
        assert html is not None, f"voila did not answer (exit {proc.poll()}):\n{log[-3000:]}"
        assert_rendered(html, "the Voila page")
        # The fake fleet was used: its data line and its model ids are there.
        assert (
            "data from FakeFleet(user=&#39;alice&#39;); project acme/ml; 1 session(s), 3 folder(s), 1 GPU(s)"
            in html
        )
        model_ids = {
            json.loads("{" + part.split("}", 1)[0] + "}")["model_id"]
            for part in html.split('"application/vnd.jupyter.widget-view+json": {')[1:]
        }
        assert len(model_ids) >= 5
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class Kernel:
    """A real IPython kernel: run code, read what it printed."""

    def __init__(self) -> None:
        self.km, self.kc = start_new_kernel(kernel_name="python3")

    def run(self, code: str, timeout: float = 30.0) -> str:
        msg_id = self.kc.execute(code)
        out: list[str] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind = msg["msg_type"]
            if kind == "stream":
                out.append(msg["content"]["text"])
            elif kind == "error":
                raise AssertionError("\n".join(msg["content"]["traceback"]))
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                return "".join(out)
        raise AssertionError(f"no answer within {timeout}s to {code!r}")

    def wait_for(self, expression: str, timeout: float = 15.0) -> None:
        """Until ``expression`` is true in the kernel (its loop runs the widgets' tasks meanwhile)."""
        deadline = time.monotonic() + timeout
        while self.run(f"print(bool({expression}))").strip() != "True":
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout}s: {expression}")
            time.sleep(0.1)

    def click(self, model_id: str) -> None:
        """What the page sends when a Button is clicked."""
        content = {"comm_id": model_id, "data": {"method": "custom", "content": {"event": "click"}}}
        self.kc.shell_channel.send(self.kc.session.msg("comm_msg", content))

    def stop(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


@pytest.fixture
def kernel():
    k = Kernel()
    yield k
    k.stop()


def test_widgets_refresh_and_take_clicks_in_a_real_kernel(kernel):
    kernel.run(
        "from widgets import Sessions, QuotaMeter\n"
        "from widgets.fake import FakeFleet\n"
        "f = FakeFleet()\n"
        "s = Sessions(client=f, refresh_interval=0.1)\n"
        "q = QuotaMeter(client=f, refresh_interval=0.1)"
    )
    # Created with no await: the kernel's loop loads them and keeps refreshing, between cells.
    kernel.wait_for("s.refreshes > 1 and q.refreshes > 1")
    kernel.run("f.add_session('x', {'project': 'acme/ml', 'gpu': 0.5})")
    kernel.wait_for("[r['name'] for r in s.rows] == ['work', 'x']")
    kernel.wait_for("q.bar_for('project', 'gpu.shares').value == 1.0")
    # A click from the page: the stop runs on the loop, and the list and quota follow.
    kernel.click(kernel.run("print(s.stop_buttons['x'].model_id, end='')"))
    kernel.wait_for("[r['name'] for r in s.rows] == ['work']")
    assert kernel.run("print(s.message)").strip() == "Stopped session x."
    kernel.wait_for("q.bar_for('project', 'gpu.shares').value == 0.5")
    # close() ends the refresh task.
    kernel.run("t = q._task\nq.close()")
    kernel.wait_for("t.done()")
