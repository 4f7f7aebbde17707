"""The admin console's Serving page in a real Hub with Chromium.

alice (domain acme) serves the tiny stdlib model of tests/test_serving_hub.py as endpoint ``echo``
(one replica, a quarter of a mock GPU, an inference session started through the Hub). Then:

- the superadmin sees it with its status, "1 of 1 healthy" and its route (healthy, carrying traffic);
- the superadmin scales it to 2 through the page: the service records it with root as the actor,
  and the second replica shows on the page once it is healthy;
- the monitor sees it with scale and delete disabled;
- a domain admin of another domain sees nothing.

Screenshots go to test-artifacts/admin/ (serving-*.png).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.browserfixture import WAIT_MS, console_page, create_people, hub_login, whole_page_shot
from tests.hubfixture import start_hub
from tests.test_serving_hub import DEFINITION, SERVER, _folder, _wait

pytestmark = pytest.mark.hub

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("LABFLEET_TEST_ARTIFACTS", REPO / "test-artifacts")) / "admin"
PASSWORD = "serving-password-1"
PEOPLE = [
    ("alice", "acme", "user", ["ml"]),
    ("mona", "acme", "monitor", []),
    ("dave", "beta", "admin", []),
]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    state = tmp_path_factory.mktemp("admin-serving")
    h = start_hub(state, env={"LABFLEET_SERVING_INTERVAL": "1"}, console=True)
    alice = None
    try:
        root = h.wait_token("root")
        for path, body in [
            ("/domains", {"name": "acme", "total_resource_slots": {"gpu.shares": 2}}),
            ("/domains", {"name": "beta"}),
            ("/projects", {"domain": "acme", "name": "ml"}),
        ]:
            r = h.api("POST", path, root, json=body)
            assert r.status_code == 201, (path, r.text)
        create_people(h, root, PEOPLE, PASSWORD)
        alice = h.wait_token("alice")
        _folder(h, alice, "echo-model", {"model-definition.yaml": DEFINITION, "server.py": SERVER})
        body = {
            "name": "echo",
            "project": "acme/ml",
            "model_folder": "echo-model",
            "replicas": 1,
            "slots": {"cpu": 0.25, "mem": "256m", "gpu.shares": 0.25},
        }
        r = h.api("POST", "/endpoints", alice, json=body)
        assert r.status_code == 201, r.text
        _wait(
            "a healthy replica",
            lambda: h.api("GET", "/endpoints/echo", alice).json()["status"] == "READY",
            hub=h,
        )
        h.root_token, h.alice_token = root, alice
        yield h
    finally:
        if alice:
            h.api("DELETE", "/endpoints/echo", alice)
            time.sleep(2)
        h.stop()


def open_page(browser, hub, name: str, ready: str):
    return console_page(hub_login(browser, hub, name, PASSWORD, width=1400), hub, "serving", ready)


def shot(page, name: str) -> None:
    whole_page_shot(page, ARTIFACTS / f"{name}.png")


def routes(page) -> list[tuple[str, str, str]]:
    """(status, health, traffic) of each route row on the page."""
    return [tuple(row.locator("td").all_inner_texts()[1:4]) for row in page.locator("tr.lf-route").all()]


def test_the_superadmin_sees_the_endpoint_with_its_routes(hub, browser):
    page = open_page(browser, hub, "root", '.lf-endpoint[data-name="echo"]')
    text = page.inner_text("body")
    for expected in (
        "Endpoint echo",
        "1 of 1 healthy",
        "owner alice",
        "acme/ml",
        "echo-model",
        "/services/labfleet/serve/echo/",
        "gpu.shares 0.25",
        "1 endpoint in reach: 1 READY; 1 of 1 replicas healthy.",
    ):
        assert expected in text, expected
    assert page.locator(".lf-status").first.get_attribute("data-status") == "READY"
    assert routes(page) == [("RUNNING", "HEALTHY", "ACTIVE")]
    assert not page.locator('button[title="Scale endpoint echo"]').is_disabled()
    shot(page, "serving-root")
    page.close()


def test_the_superadmin_scales_it_through_the_page(hub, browser):
    page = open_page(browser, hub, "root", 'button[title="Scale endpoint echo"]')
    box = page.locator(".lf-replicas input")
    box.fill("2")
    box.press("Tab")  # the widget takes the value when the field loses focus
    page.click('button[title="Scale endpoint echo"]')
    page.wait_for_selector("text=Endpoint echo scaled to 2 replicas.", timeout=WAIT_MS)
    assert hub.api("GET", "/endpoints/echo", hub.root_token).json()["replicas"] == 2
    audit = hub.api("GET", "/audit", hub.root_token, params={"limit": 1000}).json()
    (entry,) = [a for a in audit if a["action"] == "endpoint.update" and a["target"] == "echo"]
    assert entry["actor"] == "root" and entry["details"] == {"replicas": 2}, entry
    _wait(
        "2 healthy replicas",
        lambda: hub.api("GET", "/endpoints/echo", hub.root_token).json()["healthy_replicas"] == 2,
        hub=hub,
    )
    page.click("button:has-text('Refresh')")
    page.wait_for_selector("text=2 of 2 healthy", timeout=WAIT_MS)
    assert routes(page) == [("RUNNING", "HEALTHY", "ACTIVE")] * 2
    shot(page, "serving-root-scaled")
    page.close()


def test_the_monitor_reads_only(hub, browser):
    page = open_page(browser, hub, "mona", '.lf-endpoint[data-name="echo"]')
    assert page.locator('button[title="Scale endpoint echo"]').is_disabled()
    assert page.locator('button[title="Delete endpoint echo"]').is_disabled()
    assert "Read only: a monitor changes nothing" in page.inner_text("body")
    shot(page, "serving-mona")
    page.close()


def test_a_domain_admin_of_another_domain_sees_nothing(hub, browser):
    page = open_page(browser, hub, "dave", "text=No endpoint in reach.")
    text = page.inner_text("body")
    assert "echo" not in text and "alice" not in text
    shot(page, "serving-dave")
    page.close()
