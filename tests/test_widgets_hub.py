"""The widgets against the real fleet: a real Hub spawns alice's session (half a mock GPU), and the widgets,
driven from this process with the real client through the Hub's proxy and alice's token, show and change
what the service holds; the demo notebook renders through Voila inside the session with the real client."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from datetime import datetime, timezone

import pytest
import requests

from labfleet.widgets import FleetClient, GPUMonitor, QuotaMeter, SessionLauncher, Sessions, VFolderBrowser
from tests.hubfixture import session_address, start_hub
from tests.test_widgets_voila import NOTEBOOK, assert_rendered

pytestmark = pytest.mark.hub

GiB = 2**30
WAIT = 60.0  # seconds: the most a session start or stop may take


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state = tmp_path_factory.mktemp("widgets")
    usage_file = state / "homes" / "alice" / "mock-gpu-usage.json"
    extra = (
        f"c.Spawner.environment = {{'LABFLEET_MOCK_GPU_USAGE': {str(usage_file)!r}}}\n"
        "c.LabfleetSpawnerMixin.queue_poll_interval = 0.3\n"
    )
    hub = start_hub(state, extra_config=extra)
    try:
        root = hub.wait_token("root")
        for method, path, body in [
            ("POST", "/domains", {"name": "acme", "total_resource_slots": {"gpu.shares": 4}}),
            (
                "POST",
                "/projects",
                {"domain": "acme", "name": "ml", "total_resource_slots": {"gpu.shares": 2}},
            ),
            ("POST", "/users", {"username": "alice", "domain": "acme", "projects": ["ml"]}),
        ]:
            r = hub.api(method, path, root, json=body)
            assert r.status_code == 201, (path, r.text)
        token = hub.wait_token("alice")
        r = hub.hub_api("POST", "/users/alice/servers/work", json={"project": "ml", "gpu": 0.5, "cpu": 1})
        assert r.status_code in (201, 202), r.text
        _wait(lambda: (hub.hub_api("GET", "/users/alice").json()["servers"].get("work") or {}).get("ready"))
        yield hub, state, token, usage_file
    finally:
        for server in ("work", "second", "big"):
            hub.hub_api("DELETE", f"/users/alice/servers/{server}")
        hub.stop()


def _wait(check, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.3)


async def until(check, what: str, timeout: float = WAIT) -> None:
    """Await ``check()`` (a coroutine function) until it is true, bounded in time."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.3)


@pytest.fixture
def client(env):
    hub, _, token, _ = env
    return FleetClient(f"{hub.url}/user/alice/work/", token)


@pytest.fixture
def make(client):
    made = []

    def build(cls):
        w = cls(client=client, refresh_interval=0)
        made.append(w)
        return w

    yield build
    for w in made:
        w.close()


async def test_quota_meter_shows_the_sessions_gpu_share(make):
    q = make(QuotaMeter)
    assert await q.refresh(), q.error
    assert q.project_name == "acme/ml"
    b = q.bar_for("project", "gpu.shares")
    assert (b.value, b.max, b.bar_style) == (0.5, 2.0, "success")
    assert q.labels[("project", "gpu.shares")].value == "0.5 of 2"
    d = q.bar_for("domain", "gpu.shares")
    assert (d.value, d.max) == (0.5, 4.0)
    assert any(r["scope_label"] == "Domain acme" for r in q.rows)


async def test_launcher_starts_a_session_that_sessions_lists_and_stops(make):
    sessions, launcher, quota = make(Sessions), make(SessionLauncher), make(QuotaMeter)
    assert await sessions.refresh(), sessions.error
    assert [(r["name"], r["status"], r["current"]) for r in sessions.rows] == [("work", "RUNNING", True)]
    assert sessions.stop_buttons["work"].disabled
    assert await launcher.refresh(), launcher.error
    assert launcher.project.options == ("acme/ml",)
    assert launcher.left["gpu.shares"] == 1.5 and launcher.gpu.max == 1.5
    launcher.gpu.value = 0.25
    launcher.cpu.value = 0.5
    launcher.mem.value = 0.5
    launcher.name.value = "second"
    launcher.start_button.click()  # as the page does: the start runs on the loop

    async def listed_running():
        await sessions.refresh()
        return any(r["name"] == "second" and r["status"] == "RUNNING" for r in sessions.rows)

    await until(listed_running, "the new session shows RUNNING")

    async def answered():
        return not launcher.start_button.disabled

    await until(answered, "the start is answered (the Hub answers when the server is up)")
    assert not launcher.message_is_error and launcher.message.startswith("Session second "), launcher.message
    second = next(r for r in sessions.rows if r["name"] == "second")
    assert second["url"] == "/user/alice/second/lab" and not second["current"]
    assert second["slots"] == "cpu 0.5, mem 512 MiB, gpu.shares 0.25"
    await quota.refresh()
    assert quota.bar_for("project", "gpu.shares").value == 0.75
    # Its stop button.
    button = sessions.stop_buttons["second"]
    assert not button.disabled
    button.click()

    async def gone():
        await sessions.refresh()
        return "second" not in [r["name"] for r in sessions.rows]

    await until(gone, "the stopped session leaves the list")
    assert sessions.message == "Stopped session second."
    await quota.refresh()
    assert quota.bar_for("project", "gpu.shares").value == 0.5


async def test_launcher_shows_the_services_refusal(make, env):
    hub, _, token, _ = env
    launcher = make(SessionLauncher)
    assert await launcher.refresh(), launcher.error
    # Past the project's quota (as if the form's numbers were stale): the service refuses, in words.
    launcher.gpu.max = 2
    launcher.gpu.value = 2
    launcher.name.value = "big"
    assert await launcher.start() is None
    assert launcher.message_is_error
    assert "project acme/ml would use 2.5 of its 2 gpu.shares" in launcher.message, launcher.message
    assert "would use 2.5 of its 2 gpu.shares" in launcher.message_box.value
    servers = hub.hub_api("GET", "/users/alice").json()["servers"]
    assert "big" not in servers or not servers["big"].get("ready")


async def test_folder_browser_creates_uploads_and_shows_usage(make, env):
    hub, _, token, _ = env
    v = make(VFolderBrowser)
    assert await v.refresh(), v.error
    assert v.rows == []
    created = await v.create("results")
    assert created is not None, v.message
    assert [r["name"] for r in v.rows] == ["results"] and v.rows[0]["owner"] == "mine"
    # A folder with a limit (made through the service API): its bar fills as files arrive.
    r = hub.api("POST", "/vfolders", token, json={"name": "capped", "max_size": 10_000})
    assert r.status_code == 201, r.text
    await v.refresh()
    capped = next(r for r in v.rows if r["name"] == "capped")
    assert (capped["usage"], capped["limit"], capped["permission"]) == (0, 10_000, "wd")
    v.target.value = capped["id"]
    content = b"x" * 9_000
    v.upload_button.value = (
        {
            "name": "part1.bin",
            "type": "application/octet-stream",
            "size": len(content),
            "content": memoryview(content),
            "last_modified": datetime.now(timezone.utc),
        },
    )

    async def uploaded():
        return v.message.startswith(("Uploaded", "could not"))

    await until(uploaded, "the upload finishes", timeout=30)
    assert v.message == "Uploaded part1.bin into capped.", v.message
    capped = next(r for r in v.rows if r["name"] == "capped")
    assert capped["usage"] == 9_000 and capped["level"] == "warn"
    bar = v.bars[capped["id"]]
    assert (bar.value, bar.max, bar.bar_style) == (9_000, 10_000, "warning")
    # The file is there, as the service stores it.
    listing = hub.api("GET", f"/vfolders/{capped['id']}/files/", token).json()
    assert [(e["name"], e["size"]) for e in listing["entries"]] == [("part1.bin", 9_000)]
    # Past the limit: the service's refusal, usage unchanged.
    assert not await v.upload(capped["id"], [("part2.bin", b"y" * 2_000)])
    assert "do not fit in vfolder capped" in v.message, v.message
    assert next(r for r in v.rows if r["name"] == "capped")["usage"] == 9_000
    # Into the other folder (no limit): no bar, the usage in words.
    results = next(r for r in v.rows if r["name"] == "results")
    assert await v.upload(results["id"], [("notes.txt", b"hello")]), v.message
    results = next(r for r in v.rows if r["name"] == "results")
    assert results["usage"] == 5 and results["limit"] is None and results["text"] == "5 B (no limit)"
    assert v.bars[results["id"]].layout.display == "none"


async def test_upload_of_a_file_name_with_spaces(make, env):
    """Browsers send file names as they are ("Q3 report.csv"): the name reaches the folder unchanged."""
    hub, _, token, _ = env
    v = make(VFolderBrowser)
    folder = await v.client.create_vfolder("spaced")
    assert await v.upload(folder["id"], [("Q3 report.csv", b"a,b\n")]), v.message
    listing = hub.api("GET", f"/vfolders/{folder['id']}/files/", token).json()
    assert [e["name"] for e in listing["entries"]] == ["Q3 report.csv"]


async def test_gpu_monitor_shows_the_sessions_gpu(make, env):
    _, _, _, usage_file = env
    g = make(GPUMonitor)
    assert await g.refresh(), g.error
    kinds = [r["kind"] for r in g.rows]
    assert kinds == ["cpu", "memory", "gpu"]
    gpu = g.rows[2]
    assert (gpu["model"], gpu["shares"], gpu["memory_limit"]) == ("A100-80GB", 0.5, 40 * GiB)
    assert g.rows[1]["used"] > 20 * 2**20  # the session's server and kernels
    # What the (mock) device reports reaches the bars.
    usage_file.write_text(json.dumps({gpu["uuid"]: {"gpu_util": 55, "mem_used": 36 * GiB, "processes": []}}))
    await g.refresh()
    gpu = g.rows[2]
    assert (gpu["utilization"], gpu["memory_used"]) == (55, 36 * GiB)
    util, mem = g.bars[f"gpu:{gpu['uuid']}:util"], g.bars[f"gpu:{gpu['uuid']}:mem"]
    assert (util.value, util.max) == (55, 100)
    assert (mem.value, mem.max, mem.bar_style) == (36 * GiB, 40 * GiB, "warning")


def test_voila_renders_the_demo_inside_the_session_with_the_real_client(env):
    hub, state, token, _ = env
    home = state / "homes" / "alice"
    shutil.copy(NOTEBOOK, home / "fleet.ipynb")
    r = requests.get(
        f"{hub.url}/user/alice/work/voila/render/fleet.ipynb",
        headers={"Authorization": f"token {token}"},
        timeout=120,
    )
    assert r.status_code == 200, r.text[-2000:]
    assert_rendered(r.text, "the Voila page in the session")
    # The real client, from the kernel's environment: the session's own server, on its own address.
    own = f"data from FleetClient(&#39;http://{session_address(state, 'alice', 'work')}:8888/user/alice/work/&#39;)"
    assert own in r.text
    assert "project acme/ml; 1 session(s)" in r.text and "1 GPU(s)" in r.text
