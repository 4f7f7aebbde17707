"""The widgets where they really run: Voila renders the demo notebook (widgets/examples/fleet.ipynb) with the
in-memory fleet, Chromium draws its usage charts (bqplot) from that page, and a real IPython kernel refreshes
widgets on its own loop and runs a button's coroutine when the page clicks it (the comm message the front end
sends). Screenshots of the page and of the usage charts go to test-artifacts/voila/."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from jupyter_client.manager import start_new_kernel

from tests.browserfixture import CHROMIUM, CHROMIUM_ARGS
from tests.hubfixture import free_port

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "widgets" / "examples" / "fleet.ipynb"
ARTIFACTS = Path(os.environ.get("LABFLEET_TEST_ARTIFACTS", REPO / "test-artifacts")) / "voila"
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
    """A rendered page of the demo notebook: its widget views, the data line, no error anywhere."""
    views = html.count("application/vnd.jupyter.widget-view+json")
    assert views >= 7, f"{views} widget views in {where}"
    assert "problems: none" in html, html[-3000:]
    for bad in ("Traceback", "error when executing", "application/vnd.jupyter.stderr"):
        assert bad not in html, f"{bad!r} in {where}: {html[-3000:]}"


@pytest.fixture(scope="module")
def voila_fake(tmp_path_factory):
    """Voila serving the demo notebook with the in-memory fleet: its URL once it accepts connections."""
    tmp_path = tmp_path_factory.mktemp("voila")
    port = free_port()
    env = dict(os.environ, LABFLEET_WIDGETS_FAKE="1", JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    proc = _voila(tmp_path, port, env)
    try:
        deadline = time.monotonic() + WAIT
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        log = (tmp_path / "voila.log").read_text(errors="replace")
        assert proc.poll() is None, f"voila exited ({proc.poll()}):\n{log[-3000:]}"
        yield f"http://127.0.0.1:{port}/"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def test_voila_renders_the_demo_notebook_with_the_fake_fleet(voila_fake):
    r = requests.get(voila_fake, timeout=WAIT)
    assert r.status_code == 200, r.text[-2000:]
    html = r.text
    assert_rendered(html, "the Voila page")
    # The fake fleet was used: its data lines and its model ids are there.
    assert (
        "data from FakeFleet(user=&#39;alice&#39;); project acme/ml; 1 session(s), 3 folder(s), 1 GPU(s)"
        in html
    )
    assert "usage, last 7 days: 2.75 GPU-hours allocated" in html
    model_ids = {
        json.loads("{" + part.split("}", 1)[0] + "}")["model_id"]
        for part in html.split('"application/vnd.jupyter.widget-view+json": {')[1:]
    }
    assert len(model_ids) >= 7


def test_voila_draws_the_usage_charts_in_a_browser(voila_fake):
    """bqplot's front end draws the UsageChart in the Voila page: a bar a day for GPU-hours and CPU-hours,
    allocated with used in front of it, one per project in the report, titles, axes and legends."""
    from playwright.sync_api import expect, sync_playwright

    assert shutil.which(CHROMIUM), "Chromium is missing: bash scripts/setup.sh --test installs it"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(voila_fake, timeout=WAIT * 1000)
            charts = page.locator(".labfleet-usage")
            expect(charts).to_have_count(2, timeout=WAIT * 1000)
            mine, per_project = charts.nth(0), charts.nth(1)
            # Two figures of mine (GPU-hours, CPU-hours), each 30 days x (allocated, used) bars.
            figures = mine.locator(".bqplot.figure")
            expect(figures).to_have_count(2, timeout=WAIT * 1000)
            for i, what in enumerate(("GPU-hours", "CPU-hours")):
                fig = figures.nth(i)
                expect(fig.locator(".mainheading")).to_have_text(f"{what} per day, last 30 days")
                expect(fig.locator("rect.bar")).to_have_count(60)
                # A date axis: a few days named, not thirty labels on top of each other.
                ticks = fig.locator(".axis").first.locator(".tick text").all_text_contents()
                assert 3 <= len(ticks) <= 10 and all(
                    re.fullmatch(r"[A-Z][a-z]{2} \d{1,2}", t) for t in ticks
                ), ticks
            expect(mine.locator(".lf-usage-legend")).to_have_text(re.compile(r"allocated\W+used"))
            expect(mine).to_contain_text("last 7 days (3 sessions)")
            # The report: one pair per project.
            fig = per_project.locator(".bqplot.figure")
            expect(fig.locator(".mainheading")).to_have_text("GPU-hours per project")
            expect(fig.locator("rect.bar")).to_have_count(4)
            expect(fig.locator(".axis .tick text", has_text="acme/ml")).to_have_count(1)
            # The bars with hours get a height (acme/ml's pair; acme/web ran no GPU): the drawing follows
            # the data, not only the DOM. bqplot grows them in with a transition. The marks come allocated
            # first, then used: [ml, web, ml, web].
            deadline = time.monotonic() + 15
            while True:
                heights = fig.locator("rect.bar").evaluate_all("rs => rs.map(r => r.getBBox().height)")
                if sum(h > 1 for h in heights) == 2 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert sum(h > 1 for h in heights) == 2, heights
            assert heights[0] > heights[2] > 1, heights  # allocated above used
            time.sleep(1)  # every transition over before the screenshots
            mine.screenshot(path=str(ARTIFACTS / "usage-chart.png"))
            per_project.screenshot(path=str(ARTIFACTS / "usage-per-project.png"))
            page.screenshot(path=str(ARTIFACTS / "fleet-demo.png"), full_page=True)
            assert not errors, errors
        finally:
            browser.close()


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
        "from labfleet.widgets import Sessions, QuotaMeter\n"
        "from labfleet.widgets.fake import FakeFleet\n"
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
