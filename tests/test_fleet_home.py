"""The Fleet home (``/services/labfleet/``) in a real Hub with Chromium: where people land after login.

- alice logs in on the Hub's login page and lands on the Fleet home: her folders, no session yet, the
  nav bar (Home, Fleet, her name, Logout; no admin console link for a plain user); the announcement,
  as text; the page loads nothing from outside the Hub;
- she uploads a file into her folder from the page and downloads it back (the same bytes), renames
  and deletes it there, and shares the folder with bob, who accepts the invitation on his page;
- she starts a session from the "Half a GPU" card, sees it RUNNING with its GPU share and device and
  an Open link to its Hub server, then stops it from the page (its Hub server goes too); the card is
  a recent choice then;
- with both GPUs taken, the card warns before Start that the session would wait; started, it shows
  PENDING with why it waits and its place in the queue, and Stop cancels it;
- bob, in no project, is told who can add him: his domain's admins, by name; his usage is plotted;
- dora, a domain admin, lands there too, with the admin console's link (and the Hub's dark mode);
- an Import & Run link (``/hub/labfleet/import?url=``) opened logged out works after one login: the
  repository is cloned into a new folder, a session that mounts it starts and JupyterLab opens the
  notebook; the same link again (upstream moved on, alice edited a file) re-syncs, keeps her edit and
  opens it in the session that runs;
- the Hub sends people to the Fleet home (``c.JupyterHub.default_url``) unless a deployment says
  otherwise; the small helpers of the page's handler.

Screenshots go to test-artifacts/fleet-home/.
"""

from __future__ import annotations

import json
import os
import re
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlencode

import pytest
import requests
from playwright.sync_api import expect

from labfleet.core.hubmap import console_wanted
from labfleet.hub.configure import fleet_home_url
from labfleet.service.handlers import hub_base_url
from tests.browserfixture import WAIT_MS, whole_page_shot
from tests.gitserver import GitServer, commit, make_work_tree
from tests.hubfixture import start_hub

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("LABFLEET_TEST_ARTIFACTS", REPO / "test-artifacts")) / "fleet-home"
PASSWORD = "fleet-home-password-1"
HOME = "/services/labfleet/"


def tid(name: str) -> str:
    return f'[data-testid="{name}"]'


# ---------------------------------------------------------------- helpers (no Hub)


def test_the_hub_base_url_and_the_console_setting():
    assert hub_base_url("/services/labfleet/", {}) == "/"
    assert hub_base_url("/base/services/labfleet/", {}) == "/base/"
    assert hub_base_url("/services/labfleet/", {"JUPYTERHUB_BASE_URL": "/jh"}) == "/jh/"
    assert console_wanted({}) and console_wanted({"LABFLEET_ADMIN_CONSOLE": "1"})
    assert not console_wanted({"LABFLEET_ADMIN_CONSOLE": " Off "})
    assert fleet_home_url(SimpleNamespace(base_url="/")) == HOME
    assert fleet_home_url(SimpleNamespace(base_url="/jh/")) == "/jh" + HOME


def test_a_deployments_own_default_url_is_kept(tmp_path, monkeypatch):
    from traitlets.config import Config

    from labfleet.hub.configure import configure

    monkeypatch.setenv("LABFLEET_ADMIN_CONSOLE", "0")
    c = Config()
    configure(c, tmp_path)
    assert c.JupyterHub.default_url is fleet_home_url
    own = Config()
    own.JupyterHub.default_url = "/hub/home"
    configure(own, tmp_path)
    assert own.JupyterHub.default_url == "/hub/home"


# ---------------------------------------------------------------- in a real Hub


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    # console: for the console link; imports may fetch from the test's git server on 127.0.0.1
    h = start_hub(
        tmp_path_factory.mktemp("fleet-home"),
        console=True,
        env={"LABFLEET_IMPORT_ALLOWED_HOSTS": "127.0.0.1"},
    )
    try:
        root = h.wait_token("root")
        for path, body in [
            ("/domains", {"name": "acme", "total_resource_slots": {"gpu.shares": 4}}),
            ("/projects", {"domain": "acme", "name": "ml", "total_resource_slots": {"gpu.shares": 2}}),
            ("/users", {"username": "alice", "domain": "acme", "projects": ["ml"], "password": PASSWORD}),
            ("/users", {"username": "bob", "domain": "acme", "projects": [], "password": PASSWORD}),
            ("/users", {"username": "dora", "domain": "acme", "role": "admin", "password": PASSWORD}),
            ("/users", {"username": "mona", "domain": "acme", "role": "monitor", "password": PASSWORD}),
            # erin's sessions fill both mock GPUs when a test wants alice's to wait
            ("/projects", {"domain": "acme", "name": "big", "total_resource_slots": {"gpu.shares": 2}}),
            ("/users", {"username": "erin", "domain": "acme", "projects": ["big"], "password": PASSWORD}),
        ]:
            r = h.api("POST", path, root, json=body)
            assert r.status_code == 201, r.text
        r = h.api(
            "PUT", "/announcement", root, json={"text": "Maintenance <b>Friday</b>", "level": "warning"}
        )
        assert r.status_code == 200, r.text
        alice = h.wait_token("alice")
        folder = h.api("POST", "/vfolders", alice, json={"name": "data"}).json()
        r = h.api("PUT", f"/vfolders/{folder['id']}/files/readme.txt", alice, data=b"hello\n")
        assert r.status_code == 201, r.text
        h.alice, h.folder = alice, folder
        yield h
    finally:
        h.hub_api("DELETE", "/users/alice/servers/work")
        h.stop()


def log_in(browser, hub, name: str):
    """A fresh browser context logged in through the Hub's login form: it lands on the Fleet home."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(WAIT_MS / 2)
    outside: list[str] = []
    page.on(
        "request",
        lambda req: outside.append(req.url) if not req.url.startswith((hub.url, "data:", "blob:")) else None,
    )
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.errors = errors
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", name)
    page.fill("#password_input", PASSWORD)
    page.click("#login_submit")
    page.wait_for_url(re.compile(re.escape(hub.url + HOME) + r"$"))
    page.outside = outside
    try:
        page.wait_for_selector(tid("lf-me") + ":not(:empty)")
    except Exception:
        shot(page, f"{name}-failed")
        raise AssertionError(
            f"the Fleet home did not load: {errors} {page.inner_text('body')[:2000]}"
        ) from None
    return page


def shot(page, name: str) -> None:
    whole_page_shot(page, ARTIFACTS / f"{name}.png", width=1280)


@pytest.fixture(scope="module")
def alice_page(hub, browser):
    page = log_in(browser, hub, "alice")
    yield page
    page.context.close()


@pytest.mark.hub
def test_alice_lands_on_the_fleet_home(hub, alice_page):
    page = alice_page
    folder = page.locator(f'{tid("lf-folder")}[data-name="data"]')
    folder.wait_for()
    page.wait_for_selector(tid("lf-sessions-none"))
    page.wait_for_selector(tid("lf-card-half-gpu"))
    nav = page.locator(tid("lf-nav"))
    assert nav.get_by_role("link", name="Home").get_attribute("href") == "/hub/home"
    assert nav.get_by_role("link", name="Fleet", exact=True).get_attribute("aria-current") == "page"
    assert nav.locator("#logout").get_attribute("href") == "/hub/logout"
    assert page.locator(tid("lf-user")).inner_text() == "alice"
    assert page.locator("#lf-console-link").is_hidden()  # a plain user opens no admin console
    assert "acme/ml" in page.locator(tid("lf-me")).inner_text()
    assert page.locator(tid("lf-no-project")).is_hidden()
    # The announcement, as text (its markup shown, not applied).
    assert page.locator(tid("lf-announcement")).inner_text() == "Maintenance <b>Friday</b>"
    # The Hub's own stylesheet styles the page (Bootstrap's navbar), and nothing comes from outside.
    assert page.evaluate("getComputedStyle(document.querySelector('.navbar')).display") == "flex"
    page.wait_for_selector(tid("lf-usage-plot"), state="attached")
    assert page.outside == []
    assert page.errors == []
    shot(page, "alice-home")
    # The page's modules: served by the service, asked again each time (an upgrade mixes no versions).
    js = requests.get(f"{hub.url}{HOME}static/fleet-common.js", timeout=30)
    assert js.status_code == 200 and "javascript" in js.headers["Content-Type"]
    assert js.headers["Cache-Control"] == "no-cache"
    assert requests.get(f"{hub.url}{HOME}static/nothing.js", timeout=30).status_code == 404


@pytest.mark.hub
def test_upload_into_a_folder_and_download_it_back(hub, alice_page):
    page = alice_page
    page.locator(f'{tid("lf-folder")}[data-name="data"]').locator(tid("lf-folder-browse")).click()
    browser_box = page.locator(tid("lf-browser"))
    browser_box.locator(f'{tid("lf-file")}[data-name="readme.txt"]').wait_for()
    payload = bytes(range(256)) * 512 + "é\n".encode()  # 128 KiB and some, every byte value
    page.set_input_files(
        tid("lf-upload-input"),
        files=[{"name": "weights.bin", "mimeType": "application/octet-stream", "buffer": payload}],
    )
    row = browser_box.locator(f'{tid("lf-file")}[data-name="weights.bin"]')
    row.wait_for()
    r = hub.api("GET", f"/vfolders/{hub.folder['id']}/files/weights.bin", hub.alice)
    assert r.status_code == 200 and r.content == payload
    with page.expect_download() as download:
        row.locator(tid("lf-file-download")).click()
    assert download.value.suggested_filename == "weights.bin"
    assert Path(download.value.path()).read_bytes() == payload
    shot(page, "alice-folder")
    # Rename it, then delete it (to the folder's trash), in the page.
    row.get_by_role("button", name="Rename").click()
    row.get_by_label("New name").fill("w2.bin")
    row.get_by_role("button", name="Save").click()
    renamed = browser_box.locator(f'{tid("lf-file")}[data-name="w2.bin"]')
    renamed.get_by_role("button", name="Delete").click()
    renamed.get_by_role("button", name="Really delete?").click()
    renamed.wait_for(state="detached")
    names = [
        e["name"] for e in hub.api("GET", f"/vfolders/{hub.folder['id']}/files/", hub.alice).json()["entries"]
    ]
    assert names == ["readme.txt"]
    # Share the folder with bob, read only (he accepts below).
    folder = page.locator(f'{tid("lf-folder")}[data-name="data"]')
    folder.get_by_role("button", name="Share").click()
    page.get_by_label("Invite whom").fill("bob")
    page.get_by_role("button", name="Invite").click()
    page.wait_for_selector(tid("lf-invitation-sent"))


@pytest.mark.hub
def test_start_a_session_from_a_card_and_stop_it(hub, alice_page):
    page = alice_page
    page.locator(tid("lf-card-half-gpu")).click()
    form = page.locator(tid("lf-start-form"))
    form.wait_for()
    assert page.locator("#lf-start-name").input_value() == "work"
    assert page.locator("#lf-start-project").input_value() == "acme/ml"
    page.locator(tid("lf-start-go")).click()
    row = page.locator(f'{tid("lf-session")}[data-name="work"]')
    running = row.locator(tid("lf-session-status"), has_text="RUNNING")
    running.wait_for(timeout=90_000)
    text = row.inner_text()
    assert "0.5 of GPU" in text and "A100-80GB" in text, text
    assert row.locator(tid("lf-session-open")).get_attribute("href") == "/user/alice/work/"
    assert page.locator(tid("lf-recent-0")).is_visible()  # the card is a recent choice now
    row.locator(tid("lf-session-logs")).click()
    page.locator(tid("lf-logs")).wait_for()
    shot(page, "alice-running")
    stop = row.locator(tid("lf-session-stop"))
    stop.click()
    stop.click()  # "Really stop?"
    page.wait_for_selector(tid("lf-sessions-none"))
    sessions = hub.api("GET", "/sessions?user=alice", hub.alice).json()
    assert [s["status"] for s in sessions if s["name"] == "work"] == ["TERMINATED"]
    deadline = time.monotonic() + 20  # and its Hub server is gone
    while hub.hub_api("GET", "/users/alice").json()["servers"].get("work"):
        assert time.monotonic() < deadline, "the Hub server of a stopped session kept running"
        time.sleep(0.3)


@pytest.mark.hub
def test_a_waiting_session_says_why_and_where_it_is_in_the_queue(hub, alice_page):
    page = alice_page
    held = []
    try:
        for _ in range(2):  # erin takes both GPUs
            body = {"username": "erin", "project": "acme/big", "slots": {"gpu": 1}}
            r = hub.api("POST", "/sessions", hub.service_token, json=body)
            assert r.status_code == 201 and r.json()["status"] == "SCHEDULED", r.text
            held.append(r.json()["id"])
        page.locator(tid("lf-card-half-gpu")).click()
        page.fill("#lf-start-name", "queued")
        page.dispatch_event("#lf-start-name", "change")
        warning = page.locator(f'{tid("lf-start-warning")}[data-outcome="waits"]')
        warning.wait_for()
        assert "wait" in warning.inner_text()
        page.locator(tid("lf-start-go")).click()
        row = page.locator(f'{tid("lf-session")}[data-name="queued"]')
        row.locator(tid("lf-session-status"), has_text="PENDING").wait_for()
        why = row.locator(tid("lf-session-why")).inner_text()
        assert "number 1 in the queue" in why, why
        shot(page, "alice-waiting")
        stop = row.locator(tid("lf-session-stop"))
        stop.click()
        stop.click()
        page.wait_for_selector(tid("lf-sessions-none"))
        sessions = hub.api("GET", "/sessions?user=alice", hub.alice).json()
        assert [s["status"] for s in sessions if s["name"] == "queued"] == ["CANCELLED"]
        deadline = time.monotonic() + 20  # its pending spawn at the Hub ends too
        while hub.hub_api("GET", "/users/alice").json()["servers"].get("queued"):
            assert time.monotonic() < deadline, "the Hub still waits to spawn a cancelled session"
            time.sleep(0.3)
    finally:
        for sid in held:
            hub.api("DELETE", f"/sessions/{sid}", hub.service_token)


def sample_usage(scale: float = 1.0) -> dict:
    """A month of /api/usage/me numbers (GPU share-seconds and core-seconds), as the service answers;
    ``scale`` shrinks them (to a few seconds a day)."""
    today = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    daily = []
    for i in range(30):
        gpu = 3600.0 * (i % 5) * 0.5 * scale
        figures = {"cpu": gpu * 2, "mem": 0.0, "gpu.shares": gpu}
        daily.append(
            {
                "bucket": (today - timedelta(days=29 - i)).isoformat(),
                "sessions": 1 if gpu else 0,
                "allocated": figures,
                "used": {**figures, "gpu.shares": gpu * 0.4, "cpu": gpu},
                "efficiency": {},
            }
        )
    total = {"cpu": 0.0, "mem": 0.0, "gpu.shares": sum(d["allocated"]["gpu.shares"] for d in daily)}
    period = {"key": "30d", "label": "last 30 days", "sessions": 24, "allocated": total, "used": total}
    return {"user": "bob", "now": today.isoformat(), "periods": [period], "daily": daily}


@pytest.mark.hub
def test_a_user_in_no_project_is_told_who_can_add_them(hub, browser):
    page = log_in(browser, hub, "bob")
    try:
        box = page.locator(tid("lf-no-project"))
        box.wait_for()
        assert "dora" in box.inner_text() and "acme" in box.inner_text()
        page.wait_for_selector(tid("lf-cards") + " p")  # no start cards without a project
        assert page.locator(tid("lf-sessions-none")).inner_text() == "No session."
        # alice's invitation (test above): accepted, her folder is in his list.
        page.locator(tid("lf-invitation")).filter(has_text="alice invites you to folder data").locator(
            tid("lf-invitation-accept")
        ).click()
        page.locator(f'{tid("lf-folder")}[data-name="data"]').wait_for()
        # His usage plotted: a month of numbers, answered by the browser in the service's place.
        body = json.dumps(sample_usage())
        page.route(
            "**/api/usage/me",
            lambda route: route.fulfill(status=200, content_type="application/json", body=body),
        )
        page.reload()
        plot = page.locator(tid("lf-usage-plot"))
        plot.wait_for()
        assert plot.locator("rect.lf-bar-allocated").count() == 24  # the days with any use
        assert plot.locator("rect.lf-bar-used").count() == 24
        assert "GPU-hours" in page.locator(tid("lf-usage")).inner_text()
        page.wait_for_selector(tid("lf-cards") + " p")
        page.locator(f'{tid("lf-folder")}[data-name="data"]').wait_for()
        shot(page, "bob-no-project")
        # A few seconds a day read as seconds, not as an axis of zeros.
        small = json.dumps(sample_usage(scale=0.002))
        page.unroute("**/api/usage/me")
        page.route(
            "**/api/usage/me",
            lambda route: route.fulfill(status=200, content_type="application/json", body=small),
        )
        page.reload()
        plot = page.locator(tid("lf-usage-plot"))
        plot.wait_for()
        assert "GPU-seconds per day" in page.locator(tid("lf-usage")).inner_text()
        ticks = [t.text_content() for t in plot.locator("text").all()[:3]]
        assert ticks[0] == "0" and ticks[2] not in ("0", "0.0"), ticks
    finally:
        page.context.close()


@pytest.mark.hub
def test_a_domain_admin_lands_there_with_the_console_link(hub, browser):
    page = log_in(browser, hub, "dora")
    try:
        link = page.locator("#lf-console-link a")
        link.wait_for()
        assert link.get_attribute("href") == "/services/labfleet-admin/"
        assert "admin console" in page.locator(tid("lf-no-project")).inner_text()
        page.click("#dark-theme-toggle")  # the Hub's own dark mode
        assert page.evaluate("document.documentElement.dataset.bsTheme") == "dark"
        page.wait_for_timeout(400)  # Bootstrap's color transitions
        shot(page, "dora-admin-dark")
        page.click("#dark-theme-toggle")
    finally:
        page.context.close()


def test_a_monitor_is_told_they_read_and_has_nothing_to_create(hub, browser):
    from playwright.sync_api import expect

    page = log_in(browser, hub, "mona")
    try:
        page.locator("#lf-console-link a").wait_for()
        note = page.locator(tid("lf-no-project"))
        expect(note).to_contain_text("You are a monitor")
        assert "can add you" not in note.inner_text()
        expect(page.locator("#lf-new-folder")).to_be_hidden()  # a monitor changes nothing
        # The Hub's spawn form: no form and no Start to press, only what to do instead.
        page.goto(f"{hub.url}/hub/spawn/mona/x")
        expect(page.locator(".alert-info")).to_contain_text("You are a monitor")
        expect(page.locator("#spawn_form [type=submit]")).to_be_hidden()
    finally:
        page.context.close()


NOTEBOOK = json.dumps(
    {
        "cells": [{"cell_type": "markdown", "metadata": {}, "source": ["# Lesson one"]}],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
)


@pytest.mark.hub
def test_an_import_link_works_through_the_login_and_resyncs_the_second_time(hub, browser, tmp_path):
    server_name = "import-course"
    try:
        with GitServer(tmp_path / "srv") as git_server:
            work = make_work_tree(tmp_path / "teacher", {"lesson.ipynb": NOTEBOOK, "README.md": "v1\n"})
            url = git_server.publish(work, "course.git")
            link = f"{hub.url}/hub/labfleet/import?" + urlencode(
                {"url": url, "open": "lesson.ipynb", "project": "ml"}
            )
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            page = context.new_page()
            page.set_default_timeout(WAIT_MS)
            page.goto(link)
            # Logged out: the Hub's login form, once; then the import runs with no second click.
            page.fill("#username_input", "alice")
            page.fill("#password_input", PASSWORD)
            page.click("#login_submit")
            page.wait_for_selector(tid("lf-import-run"))
            page.wait_for_selector(f'{tid("lf-step-write")}[data-kind="success"]')
            shot(page, "import-running")
            page.wait_for_url(re.compile(rf"/user/alice/{server_name}/lab"), timeout=3 * WAIT_MS)
            page.wait_for_selector('.lm-TabBar-tab:has-text("lesson.ipynb")', state="attached")
            page.wait_for_selector('.jp-Notebook :text("Lesson one")', state="attached")
            shot(page, "import-opened")
            jobs = hub.api("GET", "/imports", hub.alice).json()["items"]
            assert [(j["status"], j["folder"]["name"], j["resync"]) for j in jobs] == [
                ("done", "course", False)
            ]
            folder = jobs[0]["folder"]["id"]

            # Upstream moves on; alice edits README in her folder. The same link: re-synced, her edit kept,
            # opened in the session that runs (no second one).
            commit(work, {"README.md": "v2\n", "extra.txt": "new\n"}, "second")
            git_server.publish(work, "course.git")
            r = hub.api("PUT", f"/vfolders/{folder}/files/README.md", hub.alice, data=b"mine\n")
            assert r.status_code in (200, 201), r.text
            page.goto(link)
            page.wait_for_selector(tid("lf-import-report"))
            opener = page.locator(tid("lf-import-open"))
            expect(opener).to_have_text(f"Open lesson.ipynb in {server_name}")
            expect(page.locator(tid("lf-step-session"))).to_have_text(f"{server_name} (running)")
            report = page.locator(tid("lf-import-report"))
            report.locator("summary").click()
            expect(report).to_contain_text("Yours, kept (1)")
            expect(report).to_contain_text("README.md")
            shot(page, "import-resynced")
            opener.click()
            page.wait_for_url(re.compile(rf"/user/alice/{server_name}/lab"), timeout=2 * WAIT_MS)
            latest = hub.api("GET", "/imports", hub.alice).json()["items"][0]
            assert latest["status"] == "done" and latest["resync"], latest
            assert "README.md" in latest["report"]["kept"] and "extra.txt" in latest["report"]["updated"]
            assert hub.api("GET", f"/vfolders/{folder}/files/README.md", hub.alice).text == "mine\n"
            assert hub.api("GET", f"/vfolders/{folder}/files/extra.txt", hub.alice).text == "new\n"
            live = [
                s
                for s in hub.api("GET", "/sessions?user=alice", hub.alice).json()
                if s["status"] == "RUNNING"
            ]
            assert [s["name"] for s in live] == [server_name]
            context.close()
    finally:
        hub.hub_api("DELETE", f"/users/alice/servers/{server_name}")
