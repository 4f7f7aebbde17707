"""The admin console's Maintenance, Information and Configurations pages in a real Hub with Chromium.

- The superadmin publishes an announcement through the Maintenance page: it is audited with them as
  the actor, it shows on the Hub's home page (beside the Hub's own ``announcement`` template
  variable, which keeps working) and at the top of the Fleet sidebar in alice's JupyterLab session;
  the page then clears it, and it goes from both.
- A dry run of the usage recalculation shows no drift (the ledger matches the sessions).
- A domain admin and a monitor see the page's actions disabled, and the API refuses them (403);
  bad input (a non-string, too long, an unknown level) answers 400 and changes nothing.
- The Information page shows the status board and the versions; the Configurations page shows each
  setting with where it came from, and no secret.

Screenshots go to test-artifacts/admin/ (maintenance-*.png, information-*.png, configurations-*.png,
hub-home-announcement.png, sidebar-announcement.png).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.browserfixture import WAIT_MS, console_page, create_people, hub_login, whole_page_shot
from tests.hubfixture import start_hub

pytestmark = pytest.mark.hub

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("LABFLEET_TEST_ARTIFACTS", REPO / "test-artifacts")) / "admin"
PASSWORD = "maintenance-password-1"
PEOPLE = [
    ("carol", "acme", "admin", []),
    ("mona", "acme", "monitor", []),
    ("alice", "acme", "user", ["ml"]),
]
HUB_NOTICE = "Hub notice from template_vars"
TEXT = "Maintenance on Friday 18:00-20:00 UTC <b>not bold</b>\nSave your work before then."


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    state = tmp_path_factory.mktemp("admin-maintenance")
    # The Hub's own announcement, as a deployment sets it: it keeps showing beside labfleet's.
    h = start_hub(
        state, extra_config=f"c.JupyterHub.template_vars = {{'announcement': {HUB_NOTICE!r}}}\n", console=True
    )
    try:
        root = h.wait_token("root")
        for path, body in [("/domains", {"name": "acme"}), ("/projects", {"domain": "acme", "name": "ml"})]:
            assert h.api("POST", path, root, json=body).status_code == 201
        create_people(h, root, PEOPLE, PASSWORD)
        h.root_token = root
        h.tokens = {name: h.wait_token(name) for name, *_ in PEOPLE}
        yield h
    finally:
        h.hub_api("DELETE", "/users/alice/servers/work")
        h.stop()


def login(browser, hub, name: str):
    """A new browser context logged in as ``name`` through the Hub's form."""
    return hub_login(browser, hub, name, PASSWORD, width=1400, own_context=True)


def open_console(browser, hub, name: str, path: str, ready: str):
    return console_page(login(browser, hub, name), hub, path, ready)


def shot(page, name: str) -> None:
    whole_page_shot(page, ARTIFACTS / f"{name}.png")


def announced(hub) -> dict | None:
    r = hub.api("GET", "/announcement", hub.root_token)
    assert r.status_code == 200, r.text
    return r.json()["announcement"]


def audit(hub, action: str) -> list[dict]:
    r = hub.api("GET", "/audit", hub.root_token, params={"action": action, "limit": 1000})
    assert r.status_code == 200, r.text
    return r.json()


def hub_banner(page, hub):
    """The labfleet banner on the Hub's home page once its script has asked the service."""
    with page.expect_response(
        lambda r: r.url.endswith("/services/labfleet/api/announcement") and r.status == 200, timeout=WAIT_MS
    ):
        page.goto(f"{hub.url}/hub/home")
    page.wait_for_timeout(200)  # the script draws what it read
    return page.locator("#labfleet-announcement")


# ---------------------------------------------------------------- the API


def test_only_the_superadmin_announces_and_bad_input_changes_nothing(hub):
    r = hub.api("PUT", "/announcement", hub.root_token, json={"text": "kept", "level": "warning"})
    assert r.status_code == 200, r.text
    before = announced(hub)
    count = len(audit(hub, "announcement.publish"))
    for name in ("carol", "mona", "alice"):
        token = hub.tokens[name]
        assert hub.api("GET", "/announcement", token).json()["announcement"]["text"] == "kept"
        for method, body in (("PUT", {"text": "mine"}), ("DELETE", None)):
            r = hub.api(method, "/announcement", token, json=body)
            assert r.status_code == 403, (name, method, r.text)
            assert "only a superadmin" in r.json()["message"]
    # The Hub reads it (its own token), and may not change it
    assert hub.api("GET", "/announcement", hub.service_token).status_code == 200
    assert hub.api("PUT", "/announcement", hub.service_token, json={"text": "hub"}).status_code == 403
    for body, says in [
        ({"text": 7}, "text must be a string"),
        ({"text": "x" * 2001}, "longer than 2000 characters"),
        ({"text": "hi", "level": "shout"}, "level must be one of info, warning"),
        ({"text": " \n "}, "must not be blank"),
        ({"text": "hi", "html": True}, "unknown field(s)"),
        ([], "must be a JSON object"),
    ]:
        r = hub.api("PUT", "/announcement", hub.root_token, json=body)
        assert r.status_code == 400 and says in r.json()["message"], (body, r.text)
    r = hub.api("PUT", "/announcement", hub.root_token, data=b"")
    assert r.status_code == 400 and "JSON object is required" in r.json()["message"]
    assert announced(hub) == before
    assert len(audit(hub, "announcement.publish")) == count
    assert hub.api("DELETE", "/announcement", hub.root_token).json() == {
        "announcement": None,
        "cleared": True,
    }


def test_info_and_configuration_for_admins_and_monitors_and_no_secret(hub):
    for name in ("alice",):
        for path in ("/info", "/configuration"):
            assert hub.api("GET", path, hub.tokens[name]).status_code == 403
    assert hub.api("GET", "/info", hub.service_token).status_code == 403
    secrets = [hub.service_token, hub.admin_token, hub.root_token]
    key = (hub.state / "labfleet_secret.key").read_text().strip()
    secrets.append(key)
    for name, token in (
        ("root", hub.root_token),
        ("carol", hub.tokens["carol"]),
        ("mona", hub.tokens["mona"]),
    ):
        info = hub.api("GET", "/info", token)
        conf = hub.api("GET", "/configuration", token)
        assert info.status_code == 200 and conf.status_code == 200, (name, info.text, conf.text)
        for r in (info, conf):
            assert not [s for s in secrets if s in r.text], name
    info, conf = info.json(), conf.json()
    assert info["status"] == "ok" and info["hub"]["status"] == "ok" and info["hub"]["version"]
    assert info["database"]["status"] == "ok" and info["database"]["server_version"].startswith("SQLite")
    assert {j["name"] for j in info["service"]["jobs"]} >= {"schedule", "reconcile", "usage"}
    settings = {s["name"]: s for s in conf["settings"]}
    # configure() hands its settings to the service's command line; the Hub passes the rest in the environment
    assert settings["session_log_dir"]["source"] == "command line"
    assert (
        settings["db_url"]["source"] == "environment"
        and settings["db_url"]["source_detail"] == "LABFLEET_DB_URL"
    )
    assert settings["service_token"]["value"] == "(set, hidden)"
    assert (
        settings["schedule_interval"]["source"] == "default" and settings["schedule_interval"]["value"] == 5
    )


# ---------------------------------------------------------------- the pages


def test_a_superadmin_publishes_through_the_page_and_everyone_sees_it(hub, browser):
    # alice's session first: its sidebar shows the banner at its next refresh
    r = hub.hub_api("POST", "/users/alice/servers/work", json={"project": "acme/ml"})
    assert r.status_code in (201, 202), r.text
    page = open_console(browser, hub, "root", "maintenance", ".lf-announcement-text textarea")
    assert "No announcement is shown now." in page.inner_text("body")
    page.locator(".lf-announcement-text textarea").fill(TEXT)
    page.locator(".lf-maint-form select").select_option("warning")
    page.get_by_role("button", name="Publish").click()
    page.wait_for_selector("text=Published: the announcement shows on the Hub", timeout=WAIT_MS)
    page.wait_for_selector('.lf-banner[data-level="warning"]', timeout=WAIT_MS)  # the page rebuilt
    shot(page, "maintenance-root-published")
    assert announced(hub)["text"] == TEXT and announced(hub)["level"] == "warning"
    (entry, *_) = audit(hub, "announcement.publish")
    assert entry["actor"] == "root" and entry["details"]["text"] == TEXT

    # The Hub's home page, as alice: the Hub's own announcement and labfleet's, as text
    alice = login(browser, hub, "alice")
    banner = hub_banner(alice, hub)
    banner.wait_for(state="visible", timeout=WAIT_MS)
    assert banner.inner_text() == TEXT
    assert banner.locator("b").count() == 0  # escaped: the tags are text
    assert "alert-warning" in banner.get_attribute("class") and "announcement" in banner.get_attribute(
        "class"
    )
    assert HUB_NOTICE in alice.inner_text("body")
    shot(alice, "hub-home-announcement")

    # alice's JupyterLab: the banner at the top of the Fleet sidebar
    deadline = time.monotonic() + 90
    while not (hub.hub_api("GET", "/users/alice").json()["servers"].get("work") or {}).get("ready"):
        assert time.monotonic() < deadline, "alice's session did not start"
        time.sleep(0.5)
    alice.goto(f"{hub.url}/user/alice/work/lab")
    alice.wait_for_selector("#jp-main-dock-panel", state="attached", timeout=WAIT_MS)
    tab = alice.locator('li[data-id="labfleet-sidebar"]')
    tab.wait_for(state="attached", timeout=WAIT_MS)
    if "lm-mod-current" not in (tab.get_attribute("class") or ""):
        tab.click()
    side = alice.locator('[data-testid="lf-announcement"]')
    side.wait_for(timeout=WAIT_MS)
    assert side.inner_text() == TEXT and side.get_attribute("data-level") == "warning"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    alice.locator("#labfleet-sidebar").screenshot(path=str(ARTIFACTS / "sidebar-announcement.png"))

    # Cleared through the page: gone from the Hub's pages and, at its next refresh, from the sidebar
    page.get_by_role("button", name="Clear").click()
    page.wait_for_selector("text=Cleared: no announcement is shown any more.", timeout=WAIT_MS)
    assert announced(hub) is None
    (entry, *_) = audit(hub, "announcement.clear")
    assert entry["actor"] == "root" and entry["details"]["text"] == TEXT
    alice.locator('[data-testid="lf-refresh"]').click()
    side.wait_for(state="detached", timeout=WAIT_MS)
    home = login(browser, hub, "alice")
    assert hub_banner(home, hub).is_hidden()
    assert HUB_NOTICE in home.inner_text("body")
    for p in (page, alice, home):
        p.context.close()


def test_a_dry_run_shows_no_drift(hub, browser):
    page = open_console(browser, hub, "root", "maintenance", ".lf-announcement-text textarea")
    page.get_by_role("button", name="Check for drift (dry run)").click()
    page.wait_for_selector("text=No drift: the usage ledger matches", timeout=WAIT_MS)
    assert page.get_by_role("button", name="Repair the ledger").is_disabled()
    page.wait_for_timeout(300)
    shot(page, "maintenance-root")
    (entry, *_) = audit(hub, "maintenance.recalculate-usage")
    assert entry["actor"] == "root"
    assert entry["details"] == {"drift": 0, "dry_run": True, "unaccounted_servers": 0}
    page.context.close()


@pytest.mark.parametrize("name,why", [("carol", "only a superadmin"), ("mona", "a monitor changes nothing")])
def test_others_see_the_actions_disabled_and_the_api_refuses_them(hub, browser, name, why):
    hub.api("PUT", "/announcement", hub.root_token, json={"text": "read me", "level": "info"})
    page = open_console(browser, hub, name, "maintenance", ".lf-announcement-text textarea")
    for button in ("Publish", "Clear", "Check for drift (dry run)", "Repair the ledger"):
        assert page.get_by_role("button", name=button).is_disabled(), button
    assert page.locator(".lf-announcement-text textarea").is_disabled()
    text = page.inner_text("body")
    assert why in text and "read me" in text
    shot(page, f"maintenance-{name}")
    page.context.close()
    token = hub.tokens[name]
    r = hub.api("POST", "/maintenance/recalculate-usage", token, json={"dry_run": True})
    assert r.status_code == 403
    assert hub.api("PUT", "/announcement", token, json={"text": "x"}).status_code == 403
    assert hub.api("DELETE", "/announcement", token).status_code == 403
    assert announced(hub)["text"] == "read me"
    hub.api("DELETE", "/announcement", hub.root_token)


@pytest.mark.parametrize("name", ["root", "mona"])
def test_the_information_page_shows_a_status_board(hub, browser, name):
    page = open_console(browser, hub, name, "information", ".lf-board .lf-tile")
    tiles = page.locator(".lf-tile").evaluate_all("els => els.map(e => [e.dataset.part, e.dataset.tone])")
    assert dict(tiles) == {
        "Fleet": "ok",
        "labfleet service": "ok",
        "Database": "ok",
        "Hub API": "ok",
        "Nodes": "ok",
    }
    text = page.inner_text("body")
    for expected in (
        "JupyterHub (the running Hub)",
        "labfleet",
        "SQLAlchemy",
        "JupyterLab",
        "Voila",
        "SQLite",
    ):
        assert expected in text, expected
    assert "schedule" in text and "reconcile" in text and "ALIVE" in text
    assert hub.service_token not in page.content()
    shot(page, f"information-{name}")
    page.context.close()


def test_the_configurations_page_shows_where_each_setting_came_from(hub, browser):
    page = open_console(browser, hub, "root", "configurations", "table.lf-settings tr[data-setting]")
    src = dict(
        page.locator("tr[data-setting]").evaluate_all(
            "els => els.map(e => [e.dataset.setting, e.dataset.source])"
        )
    )
    assert src["session_log_dir"] == "command line"
    assert src["db_url"] == "environment" and src["schedule_interval"] == "default"
    html = page.content()
    assert hub.service_token not in html and "(set, hidden)" in html
    assert "None of these changes while the service runs" in page.inner_text("body")
    assert "/api/storage-hosts" in page.inner_text("body")
    shot(page, "configurations-root")
    page.locator(".lf-settings-search input").fill("idle")
    page.wait_for_function(
        "() => !document.querySelector('tr[data-setting=\"schedule_interval\"]')", timeout=WAIT_MS
    )
    assert page.locator('tr[data-setting="idle_timeout"]').count() == 1
    page.context.close()
    conf = hub.api("GET", "/configuration", hub.root_token).json()
    assert json.dumps(conf).count(hub.service_token) == 0
