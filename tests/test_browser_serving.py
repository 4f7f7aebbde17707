"""The Fleet sidebar's Serving section in a real browser against the real Hub.

alice has a model folder holding the tiny stdlib model of tests/test_serving_hub.py. In JupyterLab she
opens Fleet → Serving, deploys the folder as endpoint ``echo`` from the section's form (a quarter of a
mock GPU per replica), sees it become READY with its route healthy, makes a token (shown once, in a
curl line) and calls the endpoint's URL with it, scales it to 2 and deletes it. Screenshots go to
test-artifacts/browser/ (sidebar-serving-*.png).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
import requests

from tests.browserfixture import hub_login
from tests.hubfixture import start_hub
from tests.test_serving_hub import DEFINITION, SERVER, _folder

pytestmark = pytest.mark.hub

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("LABFLEET_TEST_ARTIFACTS", REPO / "test-artifacts")) / "browser"
PASSWORD = "alice-password-1"
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    state = tmp_path_factory.mktemp("browser-serving")
    hub = start_hub(state, env={"LABFLEET_SERVING_INTERVAL": "1"})
    root = hub.wait_token("root")
    for path, body in [
        ("/domains", {"name": "acme", "total_resource_slots": {"gpu.shares": 4}}),
        ("/projects", {"domain": "acme", "name": "ml", "total_resource_slots": {"gpu.shares": 2}}),
        ("/users", {"username": "alice", "domain": "acme", "projects": ["ml"], "password": PASSWORD}),
    ]:
        r = hub.api("POST", path, root, json=body)
        assert r.status_code == 201, r.text
    alice = hub.wait_token("alice")
    _folder(hub, alice, "echo-model", {"model-definition.yaml": DEFINITION, "server.py": SERVER})
    hub.alice_token = alice
    yield hub
    hub.api("DELETE", "/endpoints/echo", alice)
    time.sleep(2)
    hub.hub_api("DELETE", "/users/alice/servers/work")
    hub.stop()


def tid(name: str) -> str:
    return f'[data-testid="{name}"]'


def shot(locator, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    locator.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def refresh_until(page, check, what: str, timeout: float = 120.0) -> None:
    """Press the panel's refresh button until ``check()`` holds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        page.locator(tid("lf-refresh")).click()
        time.sleep(1)


def test_deploy_call_scale_and_delete_from_the_sidebar(hub, browser):
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    page = hub_login(browser, hub, "alice", PASSWORD, width=1400, own_context=True)
    page.goto(f"{hub.url}/hub/spawn/alice/work")
    page.select_option("#lf-project", "acme/ml")
    page.click('form#spawn_form input[type="submit"], form#spawn_form button[type="submit"]')
    page.wait_for_url("**/user/alice/work/**", timeout=WAIT_MS)
    page.goto(f"{hub.url}/user/alice/work/lab")
    page.wait_for_selector("#jp-main-dock-panel", state="attached", timeout=WAIT_MS)
    tab = page.locator('li[data-id="labfleet-sidebar"]')
    tab.wait_for(state="attached", timeout=WAIT_MS)
    if "lm-mod-current" not in (tab.get_attribute("class") or ""):
        tab.click()
    sidebar = page.locator("#labfleet-sidebar")
    # Only Serving open: the panel is short enough to see it whole.
    for section in ("session", "quota", "usage", "sessions", "folders", "apps"):
        toggle = page.locator(tid(f"lf-section-toggle-{section}"))
        if toggle.get_attribute("aria-expanded") == "true":
            toggle.click()
    serving = page.locator(tid("lf-section-serving"))
    expect(serving.locator(tid("lf-endpoints-empty"))).to_be_visible()

    # Deploy from the form: the model folder is offered, the rest typed.
    page.locator(tid("lf-deploy-toggle")).click()
    expect(page.locator(f"{tid('lf-deploy-folder')} option")).to_have_text(["echo-model"])
    page.fill(tid("lf-deploy-name"), "echo")
    page.fill(tid("lf-deploy-cpu"), "0.25")
    page.fill(tid("lf-deploy-mem"), "256m")
    page.fill(tid("lf-deploy-gpu"), "0.25")
    shot(sidebar, "sidebar-serving-deploy-form")
    page.locator(tid("lf-deploy-submit")).click()
    expect(page.locator(tid("lf-endpoint-deployed"))).to_contain_text("Endpoint echo is deploying")
    item = page.locator(tid("lf-endpoint-echo"))
    refresh_until(page, lambda: item.get_attribute("data-status") == "READY", "echo READY")
    expect(item.locator(tid("lf-endpoint-meta"))).to_contain_text("1 of 1 healthy · acme/ml · echo-model")
    route = item.locator(".lf-route")
    expect(route).to_have_count(1)
    expect(route).to_have_attribute("data-health", "HEALTHY")

    # A token, shown once in a curl line that works.
    item.locator(tid("lf-endpoint-new-token")).click()
    line = item.locator(tid("lf-endpoint-curl")).inner_text()
    m = re.fullmatch(r'curl -H "Authorization: Bearer (lfsrv_\S+)" (\S+)', line.strip())
    assert m, line
    token, url = m.groups()
    assert url == f"{hub.url}/services/labfleet/serve/echo/"
    answer = requests.get(f"{url}whoami", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    server = route.get_attribute("data-testid").removeprefix("lf-route-")
    assert answer.status_code == 200 and answer.json()["replica"] == server, answer.text
    shot(sidebar, "sidebar-serving-ready-token")
    item.locator(tid("lf-endpoint-token-close")).click()
    expect(item.locator(tid("lf-endpoint-token"))).to_have_count(0)

    # Scale to 2: the second replica shows once it is healthy.
    item.locator(tid("lf-endpoint-replicas")).fill("2")
    item.locator(tid("lf-endpoint-scale")).click()
    expect(item.locator(tid("lf-endpoint-note"))).to_have_text("Scaled to 2 replicas.")
    refresh_until(page, lambda: item.get_attribute("data-healthy") == "2", "2 healthy replicas")
    expect(item.locator('.lf-route[data-health="HEALTHY"]')).to_have_count(2)
    shot(sidebar, "sidebar-serving-scaled")

    # Delete, after a second click: the URL answers nothing once it is gone.
    item.locator(tid("lf-endpoint-delete")).click()
    expect(item.locator(tid("lf-endpoint-delete"))).to_have_text("Really delete?")
    item.locator(tid("lf-endpoint-delete")).click()
    refresh_until(page, lambda: page.locator(tid("lf-endpoints-empty")).count() == 1, "echo gone")
    gone = requests.get(f"{url}whoami", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert gone.status_code in (404, 503), gone.status_code
    page.context.close()
