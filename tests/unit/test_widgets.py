"""The notebook widgets against the in-memory fleet (labfleet.widgets.fake): their models (plain attributes and the
children's traits) follow the fleet through starts, stops, uploads, refusals, auto refresh and a failing
source; the pure formatting; the HTTP client against a real tornado server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from bqplot import DateScale, OrdinalScale
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from labfleet.core import display
from labfleet.widgets import (
    FleetClient,
    FleetError,
    GPUMonitor,
    QuotaMeter,
    SessionLauncher,
    Sessions,
    UsageChart,
    VFolderBrowser,
)
from labfleet.widgets import format as fmt
from labfleet.widgets.client import connectable, server_path
from labfleet.widgets.fake import FakeFleet, GiB
from labfleet.widgets.launcher import build_request, describe_answer, problems
from labfleet.widgets.usage import report_series, time_label

WAIT = 5.0  # seconds: the most any wait in these tests may take


async def until(check, what: str, timeout: float = WAIT) -> None:
    """Poll ``check()`` on the loop (the widgets' tasks run meanwhile), bounded in time."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.01)


@pytest.fixture
def fleet():
    return FakeFleet()


@pytest.fixture
def make():
    """Build widgets (with no auto refresh unless asked) and close them after the test."""
    made = []

    def build(cls, client, **kw):
        kw.setdefault("refresh_interval", 0)
        w = cls(client=client, **kw)
        made.append(w)
        return w

    yield build
    for w in made:
        w.close()


# ------------------------------------------------------------------ formatting (pure)


@pytest.mark.parametrize(
    "used, limit, expected",
    [(0, 10, "ok"), (7.99, 10, "ok"), (8, 10, "warn"), (9.99, 10, "warn"), (10, 10, "over"), (11, 10, "over")]
    + [(5, None, "ok"), (0, 0, "over"), ("1.6", "2", "warn")],
)
def test_levels(used, limit, expected):
    assert fmt.level(used, limit) == expected


def test_bars_and_words():
    assert fmt.bar(1.6, 2) == {"value": 1.6, "max": 2.0, "bar_style": "warning", "level": "warn"}
    assert fmt.bar(3, 2)["value"] == 2.0 and fmt.bar(3, 2)["bar_style"] == "danger"
    # A zero limit: a full red bar, since nothing may be used.
    assert fmt.bar(0, 0) == {"value": 1.0, "max": 1.0, "bar_style": "danger", "level": "over"}
    assert (
        display.fmt_bytes(0) == "0 B"
        and display.fmt_bytes(1536) == "1.5 KiB"
        and display.fmt_bytes(GiB) == "1 GiB"
    )
    assert display.fmt_slot("mem", 64 * GiB) == "64 GiB" and display.fmt_slot("gpu.shares", 0.25) == "0.25"
    assert display.fmt_slot("cpu", None) == "unlimited"
    assert (
        display.fmt_percent(37.4) == "37 %"
        and display.fmt_percent(2.25) == "2.2 %"
        and display.fmt_percent(None) == "n/a"
    )
    assert [display.fmt_duration(s) for s in (None, 42, 600, 3725, 90000)] == [
        "no limit",
        "42 s",
        "10 min",
        "1 h 2 min",
        "1 d 1 h",
    ]
    assert display.sort_slots({"gpu:A100", "gpu.shares", "cpu", "mem"}) == [
        "cpu",
        "mem",
        "gpu.shares",
        "gpu:A100",
    ]
    assert "&lt;b&gt;" in fmt.error_html("<b>")
    assert [display.fmt_hours(h) for h in (0, 0.0001, 0.004, 0.075, 0.25, 3.5, 12.34, 140.4)] == [
        "0 h",
        "< 1 s",
        "14 s",
        "4.5 min",
        "0.25 h",
        "3.5 h",
        "12.3 h",
        "140 h",
    ]


def test_launch_request_is_built_and_checked_before_sending():
    opts = build_request(
        project="acme/ml", type="batch", cpu=2, mem_gib=1.5, gpu=0.29, command=" python x.py "
    )
    assert opts == {
        "project": "acme/ml",
        "type": "batch",
        "cpu": 2,
        "mem": int(1.5 * GiB),
        "gpu": 0.29,
        "command": "python x.py",
    }
    assert build_request(project="p", type="interactive", gpu=2.0)["gpu"] == 2
    assert problems("train", opts) == []
    assert problems("bad name!", {"project": "p"})[0].startswith("name 'bad name!'")
    assert problems("", {"project": "p", "gpu": 1.5}) == [
        "more than one GPU comes in whole devices (1, 2, ...), not 1.5"
    ]
    # The endpoint passes on the Hub's status: 201 up, 202 starting (or queued).
    assert describe_answer("", {"name": "", "status": 201}) == "Session (default) has started."
    assert describe_answer("q", {"name": "q", "status": 202}).startswith("Session q is starting")
    assert problems("x", {"project": "p", "type": "inference", "command": ""}) == [
        "an inference session needs a command"
    ]


# ------------------------------------------------------------------ the client (real HTTP on 127.0.0.1)


def test_client_urls():
    assert connectable("http://0.0.0.0:8888/user/alice/work") == "http://127.0.0.1:8888/user/alice/work/"
    assert connectable("http://:8888/user/alice/") == "http://127.0.0.1:8888/user/alice/"
    assert connectable("http://[::]:9/x/") == "http://127.0.0.1:9/x/"
    assert connectable("https://hub.example:443/user/a/") == "https://hub.example:443/user/a/"
    assert server_path("") == "~" and server_path("a b") == "a%20b"
    with pytest.raises(FleetError, match="not inside a labfleet session"):
        FleetClient.from_env({})
    c = FleetClient.from_env(
        {
            "JUPYTERHUB_SERVICE_URL": "http://0.0.0.0:5/user/alice/w/",
            "JUPYTERHUB_API_TOKEN": "t",
            "JUPYTERHUB_USER": "alice",
        }
    )
    assert c.base_url == "http://127.0.0.1:5/user/alice/w/" and c.token == "t"


class _Recorder(web.RequestHandler):
    seen: list[dict] = []

    def _any(self, path):
        self.seen.append(
            {
                "method": self.request.method,
                "path": path,
                "query": self.request.query,
                "auth": self.request.headers.get("Authorization"),
                "length": self.request.headers.get("Content-Length"),
                "body": self.request.body,
            }
        )
        if self.request.headers.get("Authorization") != "token secret":
            self.set_status(403)
            self.finish({"message": "no token"})
        elif path == "labfleet/session":
            self.finish({"user": "alice", "name": "work"})
        elif path == "labfleet/sessions/big":
            self.set_status(409)
            self.finish({"message": "project acme/ml would use 3 of its 2 gpu.shares"})
        elif path == "labfleet/broken":
            self.set_status(502)
            self.finish("<html>bad gateway</html>")
        else:
            self.finish(json.dumps({"ok": path}))

    get = post = put = delete = _any


@pytest.fixture
async def server():
    sock, port = bind_unused_port()
    srv = HTTPServer(web.Application([(r"/user/alice/work/(.*)", _Recorder)]))
    srv.add_sockets([sock])
    _Recorder.seen = []
    yield f"http://127.0.0.1:{port}/user/alice/work/"
    srv.stop()


async def test_client_speaks_the_endpoints_contract(server):
    c = FleetClient(server, "secret")
    assert await c.quota() == {"ok": "labfleet/quota"}
    assert await c.launch_options() == {"ok": "labfleet/api/users/alice/launch-options"}
    await c.start_session("", {"project": "ml", "gpu": 0.5})
    await c.stop_session("train")
    await c.vfolders()
    await c.upload("f1", "dir/a b.txt", b"12345")
    await c.my_usage()
    await c.usage_report()
    await c.usage_report("project", datetime(2026, 11, 1), "2026-11-24T10:00:00+01:00", bucket="day")
    seen = [(s["method"], s["path"]) for s in _Recorder.seen]
    assert seen == [
        ("GET", "labfleet/quota"),
        ("GET", "labfleet/session"),  # who "me" is, asked once
        ("GET", "labfleet/api/users/alice/launch-options"),
        ("POST", "labfleet/sessions/~"),
        ("DELETE", "labfleet/sessions/train"),
        ("GET", "labfleet/api/vfolders"),
        ("PUT", "labfleet/api/vfolders/f1/files/dir/a b.txt"),  # sent as a%20b.txt
        ("GET", "labfleet/api/usage/me"),
        ("GET", "labfleet/api/usage"),
        ("GET", "labfleet/api/usage"),
    ]
    assert all(s["auth"] == "token secret" for s in _Recorder.seen)
    assert json.loads(_Recorder.seen[3]["body"]) == {"project": "ml", "gpu": 0.5}
    assert _Recorder.seen[5]["query"] == "status=READY&limit=1000"
    assert _Recorder.seen[6]["length"] == "5" and _Recorder.seen[6]["body"] == b"12345"
    assert _Recorder.seen[8]["query"] == "group_by=user&bucket=none&format=json"
    # A naive datetime is UTC; a string goes as it is.
    assert _Recorder.seen[9]["query"] == (
        "group_by=project&bucket=day&format=json"
        "&start=2026-11-01T00%3A00%3A00%2B00%3A00&end=2026-11-24T10%3A00%3A00%2B01%3A00"
    )


async def test_client_errors_carry_the_services_words(server):
    c = FleetClient(server, "secret")
    with pytest.raises(FleetError) as e:
        await c.start_session("big", {"project": "ml", "gpu": 3})
    assert e.value.status == 409 and e.value.message == "project acme/ml would use 3 of its 2 gpu.shares"
    with pytest.raises(FleetError, match="answered 502") as e:
        await c.request("GET", "labfleet/broken")
    with pytest.raises(FleetError, match="no token"):
        await FleetClient(server, "wrong").quota()
    sock, port = bind_unused_port()
    sock.close()  # nobody listens there
    with pytest.raises(FleetError, match="cannot reach the session server"):
        await FleetClient(f"http://127.0.0.1:{port}/", "secret", timeout=5).quota()


# ------------------------------------------------------------------ QuotaMeter


async def test_quota_bars_follow_the_fleet(fleet, make):
    q = make(QuotaMeter, fleet)
    assert await q.refresh()
    assert q.project_name == "acme/ml"
    row = next(r for r in q.rows if (r["scope"], r["slot"]) == ("project", "gpu.shares"))
    assert (row["used"], row["limit"], row["left"], row["level"]) == (0.5, 2, 1.5, "ok")
    b = q.bar_for("project", "gpu.shares")
    assert (b.value, b.max, b.bar_style) == (0.5, 2.0, "success")
    assert q.labels[("project", "gpu.shares")].value == "0.5 of 2"
    # Unlimited: no bar, the word.
    assert q.bar_for("domain", "cpu") is None
    assert q.bars[("domain", "cpu")].layout.display == "none"
    assert "unlimited" in q.labels[("domain", "cpu")].value
    # 1.6 of 2 shares: warning; all 2: danger.
    await fleet.start_session("b", {"project": "acme/ml", "gpu": 0.6})
    await fleet.start_session("b2", {"project": "acme/ml", "gpu": 0.5})
    await q.refresh()
    b = q.bar_for("project", "gpu.shares")
    assert (b.value, b.max, b.bar_style) == (1.6, 2.0, "warning")
    assert q.bar_for("domain", "gpu.shares").bar_style == "success"  # 1.6 of 4
    await fleet.start_session("c", {"project": "acme/ml", "gpu": 0.4})
    await q.refresh()
    b = q.bar_for("project", "gpu.shares")
    assert (b.value, b.bar_style) == (2.0, "danger")
    assert next(r for r in q.rows if (r["scope"], r["slot"]) == ("project", "gpu.shares"))["left"] == 0
    # Stopping gives the shares back.
    for name in ("b", "b2", "c"):
        await fleet.stop_session(name)
    await q.refresh()
    assert q.bar_for("project", "gpu.shares").value == 0.5
    assert q.bar_for("keypair", "mem").max == 64 * GiB


# ------------------------------------------------------------------ Sessions


async def test_sessions_list_start_queue_and_stop_button(fleet, make):
    s = make(Sessions, fleet)
    await s.refresh()
    assert [(r["name"], r["status"], r["current"]) for r in s.rows] == [("work", "RUNNING", True)]
    # This session cannot stop itself from here.
    assert s.stop_buttons["work"].disabled
    # One whole GPU (the other device) and then 0.75 of one: only 0.5 is free anywhere, so it queues.
    await fleet.start_session("whole", {"project": "web", "gpu": 1})
    await fleet.start_session("queued", {"project": "web", "gpu": 0.75})
    await s.refresh()
    by_name = {r["name"]: r for r in s.rows}
    assert [r["name"] for r in s.rows] == ["work", "queued", "whole"]
    assert by_name["whole"]["status"] == "RUNNING" and by_name["whole"]["url"] == "/user/alice/whole/lab"
    assert by_name["queued"]["status_text"].startswith("PENDING (queue position 1)")
    status_html = s._lines["queued"].children[2].value
    assert "queue position 1" in status_html
    assert 'href="/user/alice/whole/lab"' in s._lines["whole"].children[0].value
    # The stop button (as a click in the page would): the queued one starts on the freed device.
    button = s.stop_buttons["whole"]
    assert not button.disabled
    button.click()
    await until(lambda: "whole" not in [r["name"] for r in s.rows], "the stopped session leaves the list")
    assert s.message == "Stopped session whole." and not s.message_is_error
    assert {r["name"]: r["status"] for r in s.rows} == {"work": "RUNNING", "queued": "RUNNING"}
    assert "whole" not in s.stop_buttons and button.comm is None  # closed with its row
    # A stop the service refuses says why.
    assert not await s.stop("nope")
    assert s.message_is_error and "you have no session named nope" in s.message_box.value


# ------------------------------------------------------------------ SessionLauncher


async def test_launcher_offers_choices_bounded_by_quota_and_starts(fleet, make):
    launcher = make(SessionLauncher, fleet)
    await launcher.refresh()
    assert launcher.project.options == ("acme/ml", "acme/web") and launcher.project.value == "acme/ml"
    assert launcher.left == {"cpu": 7, "mem": 63 * GiB, "gpu": None, "gpu.shares": 1.5}
    # The inputs stop at what is left.
    assert launcher.gpu.max == 1.5 and launcher.cpu.max == 7 and launcher.mem.max == 63
    assert [v for _, v in launcher.image.options] == ["", "local/host", "pytorch:2.3"]
    assert launcher.command.disabled
    launcher.gpu.value = 0.5
    launcher.name.value = "train"
    by_slot = {r["slot"]: r for r in launcher.summary}
    assert by_slot["gpu.shares"] == {"slot": "gpu.shares", "request": 0.5, "left": 1.5, "fits": True}
    assert "left in acme/ml" in launcher.quota_box.value
    assert await launcher.start() == {"name": "train", "status": 201}
    assert launcher.message == "Session train has started." and not launcher.message_is_error
    assert "Session train has started." in launcher.message_box.value
    live = {s.name: s for s in fleet.all_sessions if s.status == "RUNNING"}
    assert str(live["train"].slots["gpu.shares"]) == "0.5" and live["train"].project == "acme/ml"
    # The refresh after the start shows less left.
    assert launcher.left["gpu.shares"] == 1 and launcher.gpu.max == 1
    # The other project: its own quota (only the domain and keypair bound it).
    launcher.project.value = "acme/web"
    assert launcher.left["gpu.shares"] == 3 and launcher.gpu.max == 3


async def test_launcher_shows_the_refusal_past_quota(fleet, make):
    launcher = make(SessionLauncher, fleet)
    started = []
    launcher.on_started(started.append)
    await launcher.refresh()
    launcher.gpu.value = 1.0
    launcher.name.value = "big"
    # Meanwhile another start takes the project's shares (the launcher's numbers are now stale).
    await fleet.start_session("other", {"project": "acme/ml", "gpu": 1})
    calls = len(fleet.calls)
    assert await launcher.start() is None
    assert launcher.message_is_error
    assert launcher.message == (
        "could not start big: project acme/ml would use 2.5 of its 2 gpu.shares (1.5 already in use)"
    )
    assert "would use 2.5 of its 2 gpu.shares" in launcher.message_box.value
    assert "start_session" in fleet.calls[calls:] and started == []
    assert "big" not in [s.name for s in fleet.all_sessions]
    # ... and the form now knows what is left, and says the request is too big.
    assert launcher.left["gpu.shares"] == 0.5 and launcher.gpu.value == 0.5
    launcher.gpu.max = 2  # as if the quota had not been read again
    launcher.gpu.value = 1.0
    assert "the service will refuse it" in launcher.quota_box.value
    # Wrong input is caught before anyone is asked.
    launcher.session_type.value = "batch"
    assert not launcher.command.disabled
    calls = len(fleet.calls)
    assert await launcher.start() is None
    assert launcher.message == "a batch session needs a command" and fleet.calls[calls:] == []


async def test_launcher_start_button_and_callback(fleet, make):
    launcher = make(SessionLauncher, fleet)
    sessions = make(Sessions, fleet)
    await launcher.refresh()
    await sessions.refresh()
    launcher.on_started(lambda answer: sessions.schedule_refresh())
    launcher.session_type.value = "batch"
    launcher.command.value = "python train.py"
    launcher.name.value = "job"
    launcher.start_button.click()
    await until(lambda: "job" in [r["name"] for r in sessions.rows], "the batch session shows in the list")
    await until(lambda: not launcher.start_button.disabled, "the button is enabled again")
    job = next(s for s in fleet.all_sessions if s.name == "job")
    assert (job.type, job.command) == ("batch", "python train.py")


# ------------------------------------------------------------------ VFolderBrowser


async def test_folders_usage_upload_and_create(fleet, make):
    MiB = 2**20
    next(f for f in fleet.folders if f.name == "data").max_size = 50 * MiB  # small numbers, same levels
    v = make(VFolderBrowser, fleet)
    await v.refresh()
    rows = {r["name"]: r for r in v.rows}
    assert set(rows) == {"data", "shared-ml", "results-of-bob"}
    assert (rows["data"]["owner"], rows["data"]["permission"], rows["data"]["text"]) == (
        "mine",
        "wd",
        "40 MiB of 50 MiB",
    )
    assert rows["results-of-bob"]["owner"] == "shared by bob" and rows["results-of-bob"]["limit"] is None
    assert v.bars[rows["results-of-bob"]["id"]].layout.display == "none"
    # Only folders I may write to take uploads.
    assert [name for name, _ in v.target.options] == ["data", "shared-ml"]
    data_bar = v.bars[rows["data"]["id"]]
    assert (data_bar.value, data_bar.max, data_bar.bar_style) == (40 * MiB, 50 * MiB, "warning")  # 80 %
    # An upload as the page sends it: FileUpload's value.
    v.target.value = rows["data"]["id"]
    content = b"x" * (5 * MiB)
    when = datetime.now(timezone.utc)
    v.upload_button.value = (
        {
            "name": "big.bin",
            "type": "",
            "size": len(content),
            "content": memoryview(content),
            "last_modified": when,
        },
    )
    await until(lambda: v.message.startswith("Uploaded"), "the upload finishes")
    assert v.message == "Uploaded big.bin into data."
    assert v.upload_button.value == ()
    data_bar = v.bars[rows["data"]["id"]]
    assert (data_bar.value, data_bar.bar_style) == (45 * MiB, "warning")  # 90 %
    assert next(f for f in fleet.folders if f.name == "data").files["big.bin"] == len(content)
    # Past the folder's limit: refused, the words shown, usage unchanged.
    assert not await v.upload(rows["data"]["id"], [("more.bin", b"y" * (6 * MiB))])
    assert v.message_is_error and "do not fit in vfolder data" in v.message
    assert next(r for r in v.rows if r["name"] == "data")["usage"] == 45 * MiB
    # Exactly full: danger.
    assert await v.upload(rows["data"]["id"], [("last.bin", b"z" * (5 * MiB))])
    assert (v.bars[rows["data"]["id"]].value, v.bars[rows["data"]["id"]].bar_style) == (50 * MiB, "danger")
    # A read-only folder refuses too (the service is the judge, whatever the page sends).
    assert not await v.upload(rows["results-of-bob"]["id"], [("x", b"1")])
    assert "shared with you ro" in v.message
    # Create a folder with the button.
    v.new_name.value = "models"
    v.create_button.click()
    await until(lambda: "models" in [r["name"] for r in v.rows], "the new folder shows")
    assert v.message == "Created folder models." and v.new_name.value == ""
    assert "models" in [name for name, _ in v.target.options]
    assert await v.create("models") is None and "already have a folder named models" in v.message


# ------------------------------------------------------------------ GPUMonitor


async def test_gpu_monitor_rows(fleet, make):
    g = make(GPUMonitor, fleet)
    assert g.refresh_interval == 0
    await g.refresh()
    cpu, mem, gpu = g.rows
    assert cpu["kind"] == "cpu" and cpu["percent"] == 12.5 and cpu["max_percent"] == 100
    assert (mem["used"], mem["limit"]) == (300 * 2**20, GiB)
    assert (gpu["model"], gpu["shares"], gpu["utilization"]) == ("A100-80GB", 0.5, 37)
    assert (gpu["memory_used"], gpu["memory_limit"]) == (2 * GiB, 40 * GiB)
    util = g.bars[f"gpu:{gpu['uuid']}:util"]
    gmem = g.bars[f"gpu:{gpu['uuid']}:mem"]
    assert (util.value, util.max) == (37, 100) and g.labels[f"gpu:{gpu['uuid']}:util"].value == "37 %"
    assert (gmem.value, gmem.max, gmem.bar_style) == (2 * GiB, 40 * GiB, "success")
    assert g.labels[f"gpu:{gpu['uuid']}:mem"].value == "2 GiB of 40 GiB"
    # Near the memory limit: warning; a driver that cannot tell utilization: n/a.
    fleet.gpu_memory_used, fleet.gpu_utilization = 36 * GiB, None
    await g.refresh()
    assert gmem.bar_style == "warning" and g.labels[f"gpu:{gpu['uuid']}:util"].value == "n/a"
    assert g.no_gpu.value == ""


async def test_gpu_monitor_defaults_and_no_gpu(make):
    fleet = FakeFleet()
    fleet.current = fleet.add_session("cpu-only", {"project": "web", "cpu": 2})
    g = make(GPUMonitor, fleet, refresh_interval=None)
    assert g.refresh_interval == 2  # the default: live
    await g.refresh()
    assert [r["kind"] for r in g.rows] == ["cpu", "memory"]
    assert g.rows[0]["max_percent"] == 200 and "No GPU" in g.no_gpu.value


# ------------------------------------------------------------------ UsageChart

NOW = datetime(2026, 11, 24, 10, 0, tzinfo=timezone.utc)


class Clock:
    """A stopped clock for the fake's statistics; ``+=`` moves it on."""

    def __init__(self, t: datetime = NOW) -> None:
        self.t = t

    def __call__(self) -> datetime:
        return self.t


@pytest.fixture
def clock():
    return Clock()


async def test_my_usage_shapes_from_the_fake(clock):
    # The fake's answer adds up its sessions: "work" (0.5 GPU, 1 core) has run 1.5 h, "finetune" (0.5 GPU,
    # 4 cores) 4 h four days ago, "eda" (1 core) 2 h two days ago; older ones fall outside 7 days.
    u = await FakeFleet(clock=clock).my_usage()
    assert [p["key"] for p in u["periods"]] == ["7d", "30d", "month"]
    assert u["periods"][2]["label"] == "November 2026" and u["now"] == NOW.isoformat()
    week = u["periods"][0]
    assert week["sessions"] == 3
    assert week["allocated"]["gpu.shares"] == pytest.approx((0.75 + 2) * 3600)
    assert week["used"]["gpu.shares"] == pytest.approx((0.75 * 0.37 + 2 * 0.7) * 3600)
    assert week["allocated"]["cpu"] == pytest.approx((1.5 + 16 + 2) * 3600)
    assert week["efficiency"]["gpu.shares"] == pytest.approx(
        week["used"]["gpu.shares"] / (2.75 * 3600), abs=1e-4
    )
    assert week["used"]["gpu_mem_peak"] == int(80 * GiB * 0.5 * 0.7)  # finetune's, above work's 2 GiB
    assert u["periods"][1]["allocated"]["gpu.shares"] == pytest.approx(11.25 * 3600)
    daily = u["daily"]
    assert len(daily) == 30 and daily[0]["bucket"] == "2026-10-26T00:00:00+00:00"
    assert daily[-1]["bucket"] == "2026-11-24T00:00:00+00:00"
    assert daily[-1]["allocated"]["gpu.shares"] == pytest.approx(0.75 * 3600)
    assert daily[1]["sessions"] == 0 and daily[1]["efficiency"]["cpu"] is None
    # The running session keeps counting, with what the fleet reads now.
    fleet = FakeFleet(clock=clock)
    clock.t += timedelta(hours=1)
    fleet.gpu_utilization = 100
    u = await fleet.my_usage()
    assert u["daily"][-1]["allocated"]["gpu.shares"] == pytest.approx(1.25 * 3600)
    assert u["daily"][-1]["used"]["gpu.shares"] == pytest.approx(1.25 * 3600)


async def test_usage_report_shapes_and_refusals_from_the_fake(clock):
    fleet = FakeFleet(clock=clock)
    r = await fleet.usage_report(group_by="project")
    assert (r["group_by"], r["bucket"], r["end"]) == ("project", "none", NOW.isoformat())
    assert [(x["project"], x["bucket"], x["sessions"]) for x in r["rows"]] == [
        ("acme/ml", None, 4),
        ("acme/web", None, 2),
    ]
    # A user sees only their own rows; a domain admin everyone's in the domain.
    assert [x["user"] for x in (await fleet.usage_report())["rows"]] == ["alice"]
    fleet.admin = True
    rows = (await fleet.usage_report(start=NOW - timedelta(days=7), bucket="day"))["rows"]
    assert [(x["user"], x["bucket"][:10]) for x in rows] == [
        ("alice", "2026-11-20"),
        ("alice", "2026-11-22"),
        ("alice", "2026-11-24"),
        ("bob", "2026-11-18"),
    ]
    for bad, words in [
        ({"group_by": "team"}, "group_by must be one of"),
        ({"bucket": "week"}, "bucket must be one of"),
        ({"start": "yesterday"}, "start must be an ISO 8601 time"),
        ({"start": NOW, "end": NOW}, "end must be after start"),
    ]:
        with pytest.raises(FleetError, match=words) as e:
            await fleet.usage_report(**bad)
        assert e.value.status == 400


async def test_usage_chart_plots_my_usage_day_by_day(clock, make):
    fleet = FakeFleet(clock=clock)
    u = make(UsageChart, fleet)
    assert not u.report and set(u.figures) == {"gpu", "cpu"}
    assert await u.refresh()
    # One mark per series on shared scales: allocated wide and light, used narrow and dark in front.
    alloc, used = u.bars["gpu"]["allocated"], u.bars["gpu"]["used"]
    assert u.figures["gpu"].marks == [alloc, used] and alloc.scales == used.scales
    assert (list(alloc.labels), list(used.labels), alloc.padding < used.padding) == (
        ["allocated"],
        ["used"],
        True,
    )
    # A bar a day on a date axis, at the day's noon (UTC): on its own date in the browser's time zone.
    assert isinstance(alloc.scales["x"], DateScale) and u.x_axes["gpu"].tick_format == "%b %-d"
    assert len(alloc.x) == 30 and list(used.x) == list(alloc.x)
    assert (alloc.x[0], alloc.x[-1]) == (np.datetime64("2026-10-26T12:00"), np.datetime64("2026-11-24T12:00"))
    labels = u.series["gpu"]["labels"]
    assert (labels[0], labels[-1]) == ("Oct 26", "Nov 24")
    # The marks carry the hours: today the running session's 0.75 GPU-hours, 0.37 of them used; the
    # fine-tuning run 4 days ago.
    assert (alloc.y[-1], used.y[-1]) == (0.75, pytest.approx(0.2775))
    assert (labels[-5], alloc.y[-5], used.y[-5]) == ("Nov 20", 2.0, 1.4)
    assert sum(alloc.y) == pytest.approx(11.25)
    cpu = u.bars["cpu"]
    assert cpu["allocated"].y[-3] == 2.0 and cpu["used"].y[-3] == 0.5  # eda: 1 core for 2 h, a quarter used
    assert u.figures["gpu"].title == "GPU-hours per day, last 30 days"
    assert u.figures["gpu"].axes[1].label == "hours"  # the scale's unit; the title says what
    assert "allocated" in u.legend.value and "used" in u.legend.value
    # The periods' table.
    week = u.periods[0]
    assert (week["key"], week["sessions"], week["gpu"]["allocated"]) == ("7d", 3, 2.75)
    assert week["cpu"]["allocated"] == 19.5 and week["cpu"]["used"] == pytest.approx(8.6875)
    assert "1.68 h used of 2.75 h (61 %)" in u.summary.value
    assert "last 30 days (6 sessions)" in u.summary.value
    assert u.empty.value == "" and u.error is None
    # A refresh moves the same marks on: an hour later, at full GPU use.
    clock.t += timedelta(hours=1)
    fleet.gpu_utilization = 100
    assert await u.refresh()
    assert u.bars["gpu"]["allocated"] is alloc and (alloc.y[-1], used.y[-1]) == (1.25, 1.25)


async def test_usage_chart_without_gpu_or_any_usage(clock, make):
    fleet = FakeFleet(clock=clock)
    # Only her finished sessions without a GPU are left.
    fleet.all_sessions = [
        s
        for s in fleet.all_sessions
        if not s.user and s.status == "TERMINATED" and not {"gpu", "gpu.shares"} & set(s.slots)
    ]
    u = make(UsageChart, fleet)
    await u.refresh()
    assert u.figures["gpu"].layout.display == "none" and u.figures["cpu"].layout.display is None
    assert "No GPU-hours in the last 30 days." in u.empty.value
    fleet.all_sessions = []
    await u.refresh()
    assert "No usage yet" in u.empty.value and u.summary.value == ""
    assert all(f.layout.display == "none" for f in u.figures.values())


async def test_usage_chart_report_per_user_project_and_day(clock, make):
    admin = FakeFleet(clock=clock, admin=True)
    per_user = make(UsageChart, admin, group_by="user")
    assert per_user.report and set(per_user.figures) == {"report"}
    await per_user.refresh()
    bars = per_user.bars["report"]
    assert isinstance(bars["allocated"].scales["x"], OrdinalScale)
    assert list(bars["allocated"].x) == ["alice", "bob", "carol"]
    assert list(bars["allocated"].y) == [11.25, 8.0, 1.25]  # GPU-hours allocated
    assert list(bars["used"].y) == [pytest.approx(7.8525), 7.2, 0.25]  # and used
    assert per_user.figures["report"].title == "GPU-hours per user"
    assert "used of 20.5 h allocated" in per_user.summary.value
    assert admin.calls[-1] == "usage_report"
    per_project = make(UsageChart, FakeFleet(clock=clock), group_by="project", metric="cpu")
    await per_project.refresh()
    assert list(per_project.bars["report"]["allocated"].x) == ["acme/ml", "acme/web"]
    assert list(per_project.bars["report"]["allocated"].y) == [51.5, 8.0]  # CPU-hours allocated
    per_day = make(UsageChart, admin, start=NOW - timedelta(days=7), bucket="day")
    await per_day.refresh()
    # Every day of the span has its bar (zeros where nobody ran), in time order.
    days = per_day.series["report"]
    assert days["labels"] == ["Nov 17", "Nov 18", "Nov 19", "Nov 20", "Nov 21", "Nov 22", "Nov 23", "Nov 24"]
    # GPU-hours: alice's fine-tuning on Nov 20 and her running session today (bob's Nov 18 had no GPU).
    assert list(per_day.bars["report"]["allocated"].y) == [0, 0, 0, 2.0, 0, 0, 0, 0.75]
    assert per_day.bars["report"]["allocated"].x[3] == np.datetime64("2026-11-20T12:00")
    assert per_day.figures["report"].title == "GPU-hours per day (all users)"
    # Nothing in the window: said, no empty plot.
    empty = make(UsageChart, admin, start=NOW - timedelta(days=90), end=NOW - timedelta(days=60))
    await empty.refresh()
    assert empty.figures["report"].layout.display == "none" and "No GPU-hours from" in empty.empty.value
    with pytest.raises(ValueError, match="metric must be one of gpu, cpu"):
        UsageChart(client=admin, metric="mem")
    assert time_label("2026-11-24T14:15:00+00:00", "15m") == "Nov 24 14:15" and time_label(None) == "all"
    assert report_series({"group_by": "user", "bucket": "none", "rows": []}, "gpu")["labels"] == []


async def test_usage_chart_shows_the_services_refusal(fleet, make):
    u = make(UsageChart, fleet, group_by="user")
    fleet.fail = "only domain admins see other users' usage"
    assert not await u.refresh()
    assert u.error == "only domain admins see other users' usage"
    assert "only domain admins see other users" in u.error_box.value and u.error_box in u.children


# ------------------------------------------------------------------ refreshing


async def test_auto_refresh_picks_up_changes_and_close_stops_it(fleet, make):
    q = make(QuotaMeter, fleet, refresh_interval=0.05)
    g = make(GPUMonitor, fleet, refresh_interval=0.05)
    await until(lambda: q.rows and g.rows, "the first load")
    await fleet.start_session("b", {"project": "acme/ml", "gpu": 1})
    fleet.gpu_utilization = 99
    await until(
        lambda: q.bar_for("project", "gpu.shares").value == 1.5, "the quota bar shows the new session"
    )
    await until(lambda: g.rows[2]["utilization"] == 99, "the GPU monitor shows the new utilization")
    task = q._task
    q.close()
    await until(lambda: task.done(), "the refresh task ends")
    assert task.cancelled()
    seen = q.refreshes
    await fleet.stop_session("b")
    await asyncio.sleep(0.2)
    assert q.refreshes == seen  # no more refreshes after close()
    # Its controls are closed with it, down to the bars inside its rows.
    assert q.comm is None and q.bars[("project", "gpu.shares")].comm is None


async def test_a_failing_source_shows_its_error_and_recovers(fleet, make):
    q = make(QuotaMeter, fleet, refresh_interval=0.05)
    await until(lambda: q.refreshes > 0, "the first load")
    rows = q.rows
    fleet.fail = "the labfleet service did not answer (502)"
    await until(lambda: q.error is not None, "the error shows")
    assert q.error == "the labfleet service did not answer (502)"
    assert "did not answer (502)" in q.error_box.value
    assert q.rows == rows  # the last good data stays
    assert not q._task.done()  # and it keeps trying
    fleet.fail = None
    await fleet.start_session("b", {"project": "acme/ml", "gpu": 0.25})
    await until(lambda: q.error is None, "the error clears")
    await until(lambda: q.bar_for("project", "gpu.shares").value == 0.75, "the fresh data shows")
    assert q.error_box.value == ""


async def test_every_widget_shows_a_failing_source(fleet, make):
    fleet.fail = "session server unreachable"
    for cls in (QuotaMeter, Sessions, SessionLauncher, VFolderBrowser, GPUMonitor, UsageChart):
        w = make(cls, fleet)
        assert not await w.refresh()
        assert w.error == "session server unreachable" and "session server unreachable" in w.error_box.value
        assert w.error_box in w.children
    # A bug in the answer (not a FleetError) is shown too, not raised into the kernel.
    fleet.fail = None
    q = make(QuotaMeter, fleet)
    q.client = type("Broken", (), {"quota": staticmethod(lambda: _raise(KeyError("used")))})()
    assert not await q.refresh() and q.error == "KeyError: 'used'"


async def _raise(e: Exception):
    raise e
