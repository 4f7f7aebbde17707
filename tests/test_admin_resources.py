"""The admin console's Resources and Scheduler pages in a real Hub with Chromium.

The Hub's two mock 80 GB GPUs are held by bare admissions through the service token (no Hub
server, so nothing starts and they keep their slots for the module's length): alice holds half of
one device and bob a quarter of the same one, erin (another domain) a whole device. Then alice,
erin and bob each ask for more GPUs than are free, and wait in the default group's queue.

- the occupancy map shows the superadmin each device's holders and the free part; a domain admin
  sees their own domain's holders by name and the rest as "other domains";
- a superadmin edits a resource group through the page (audited as theirs); others cannot;
- the Scheduler page shows a queued session with its position and why it waits; a domain admin
  sees only their domain's queued sessions; the monitor's cancel buttons are disabled; a
  superadmin's cancel through the page makes the session CANCELLED, audited with them as actor.

Screenshots go to test-artifacts/admin/ (resources-*.png, scheduler-*.png).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from tests.browserfixture import WAIT_MS, console_page, create_people, hub_login, whole_page_shot
from tests.hubfixture import start_hub

pytestmark = pytest.mark.hub

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("LABFLEET_TEST_ARTIFACTS", REPO / "test-artifacts")) / "admin"
PASSWORD = "resources-password-1"
PEOPLE = [
    ("carol", "acme", "admin", []),
    ("mona", "acme", "monitor", []),
    ("alice", "acme", "user", ["ml"]),
    ("bob", "acme", "user", ["ml"]),
    ("erin", "beta", "user", ["web"]),
]
# (who, project, slots): what holds the two GPUs, then what waits (in this order: positions 1, 2, 3)
HOLDERS = [
    ("alice", "acme/ml", {"gpu.shares": 0.5, "cpu": 0.1}),
    ("bob", "acme/ml", {"gpu.shares": 0.25, "cpu": 0.1}),
    ("erin", "beta/web", {"gpu": 1, "cpu": 0.1}),
]
WAITERS = [
    ("alice", "acme/ml", {"gpu": 1, "cpu": 0.1}),
    ("erin", "beta/web", {"gpu": 2, "cpu": 0.1}),
    ("bob", "acme/ml", {"gpu": 1, "cpu": 0.1}),
]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    state = tmp_path_factory.mktemp("admin-resources")
    # Bare admissions (no Hub server) keep their slots for the module's length.
    (state / "labfleet_service_config.py").write_text("c.LabfleetService.reconcile_grace = 3600\n")
    h = start_hub(state, console=True)
    try:
        root = h.wait_token("root")
        for path, body in [
            ("/domains", {"name": "acme"}),
            ("/domains", {"name": "beta"}),
            ("/projects", {"domain": "acme", "name": "ml"}),
            ("/projects", {"domain": "beta", "name": "web"}),
            # A second group, with no node yet, that acme may use: its queue is empty
            (
                "/resource-groups",
                {"name": "a100", "is_public": False, "grants": [{"kind": "domain", "target": "acme"}]},
            ),
        ]:
            assert h.api("POST", path, root, json=body).status_code == 201
        create_people(h, root, PEOPLE, PASSWORD)

        def admit(user, project, slots, status):
            body = {"username": user, "project": project, "slots": slots}
            r = h.api("POST", "/sessions", h.service_token, json=body)
            assert r.status_code == 201, r.text
            assert r.json()["status"] == status, r.json()
            return r.json()

        h.holding = {user: admit(user, project, slots, "SCHEDULED") for user, project, slots in HOLDERS}
        h.waiting = {user: admit(user, project, slots, "PENDING")["id"] for user, project, slots in WAITERS}
        h.root_token = root
        yield h
    finally:
        h.stop()


def open_page(browser, hub, name: str, path: str, ready: str):
    """Log ``name`` in through the Hub's form, open the console's ``path`` and wait for ``ready``."""
    return console_page(hub_login(browser, hub, name, PASSWORD, width=1400), hub, path, ready)


def shot(page, name: str) -> None:
    whole_page_shot(page, ARTIFACTS / f"{name}.png", max_height=6000)


def holders(page, uuid: str) -> list[tuple[str, str]]:
    """(user, shares) of each segment of device ``uuid`` on the map, left to right."""
    return page.locator(f'svg.lf-occupancy g.lf-device[data-uuid="{uuid}"] g.lf-seg').evaluate_all(
        "els => els.map(e => [e.dataset.user, e.dataset.shares])"
    )


def part(page, uuid: str, kind: str) -> str | None:
    """The shares of a device's ``lf-free`` or ``lf-others`` part (None: it has none)."""
    found = page.locator(f'svg.lf-occupancy g.lf-device[data-uuid="{uuid}"] g.{kind}')
    return found.get_attribute("data-shares") if found.count() else None


def devices_of(hub) -> tuple[str, str]:
    """(the device alice and bob share, erin's whole device)."""
    shared = hub.holding["alice"]["devices"][0]["uuid"]
    assert (
        hub.holding["bob"]["devices"][0]["uuid"] == shared
    )  # the group's placement keeps the other one whole
    return shared, hub.holding["erin"]["devices"][0]["uuid"]


# ---------------------------------------------------------------- resources


def test_the_occupancy_map_shows_each_devices_holders(hub, browser):
    shared, whole = devices_of(hub)
    page = open_page(browser, hub, "root", "resources", "svg.lf-occupancy g.lf-device")
    assert sorted(holders(page, shared)) == [["alice", "0.5"], ["bob", "0.25"]]
    assert part(page, shared, "lf-free") == "0.25"
    assert holders(page, whole) == [["erin", "1"]]
    assert part(page, whole, "lf-free") is None
    text = page.inner_text("body")
    # The map's own labels, the exact holders' table, the nodes and the groups
    for expected in ("alice 0.5", "bob 0.25", "erin 1", "free 0.25", hub.holding["erin"]["id"], "A100-80GB"):
        assert expected in text, expected
    assert "2 devices: 1.75 held by sessions you can see, 0.25 free" in text
    assert "ALIVE" in text and "default" in text and "10 min" in text  # a new group's pending timeout
    assert "a100" in text and "granted only" in text and "domain:acme" in text
    shot(page, "resources-root")
    page.close()


def test_a_domain_admin_sees_other_domains_only_as_load(hub, browser):
    shared, whole = devices_of(hub)
    page = open_page(browser, hub, "carol", "resources", "svg.lf-occupancy g.lf-device")
    assert sorted(holders(page, shared)) == [["alice", "0.5"], ["bob", "0.25"]]
    assert holders(page, whole) == []
    assert part(page, whole, "lf-others") == "1"
    text = page.inner_text("body")
    assert "erin" not in text and hub.holding["erin"]["id"] not in text
    # Groups are read only for a domain admin
    assert "Read only: only a superadmin changes resource groups." in text
    assert page.get_by_role("button", name="Save changes").is_disabled()
    shot(page, "resources-carol")
    page.close()


def test_a_superadmin_edits_a_group_through_the_page(hub, browser):
    page = open_page(browser, hub, "root", "resources", "svg.lf-occupancy g.lf-device")
    form = page.locator(".lf-form")
    form.locator(".widget-dropdown", has_text="Group").locator("select").select_option("a100")
    description = form.locator(".widget-text", has_text="Description").locator("input")
    description.fill("big GPUs for acme")
    timeout = form.locator(".widget-inline-hbox", has_text="Pending timeout").locator("input")
    # Bad input first: the page says what is wrong and sends nothing
    form.locator("textarea").fill("domain:acme team:x")
    page.get_by_role("button", name="Save changes").click()
    page.wait_for_selector("text=grant 'team:x' is not KIND:TARGET", timeout=WAIT_MS)
    form.locator("textarea").fill("domain:acme, project:beta/web")
    timeout.fill("900")
    timeout.press("Tab")
    page.get_by_role("button", name="Save changes").click()
    page.wait_for_selector(
        "text=Saved resource group a100: description, grants, pending_timeout.", timeout=WAIT_MS
    )
    page.wait_for_selector("text=big GPUs for acme", timeout=WAIT_MS)  # the table follows
    # The editor stays on the group it saved
    assert form.locator(".widget-dropdown", has_text="Group").locator("select").input_value() == "a100"
    shot(page, "resources-root-edited")
    # A new group, by name: not public, granted to nobody, and the editor turns to it
    page.locator(".widget-text", has_text="New group").locator("input").fill("t4")
    page.get_by_role("button", name="Create group").click()
    page.wait_for_selector("text=Created resource group t4", timeout=WAIT_MS)
    assert form.locator(".widget-dropdown", has_text="Group").locator("select").input_value() == "t4"
    page.close()
    group = hub.api("GET", "/resource-groups/a100", hub.root_token).json()
    assert group["description"] == "big GPUs for acme" and group["pending_timeout"] == 900
    assert group["grants"] == [
        {"kind": "domain", "target": "acme"},
        {"kind": "project", "target": "beta/web"},
    ]
    audit = hub.api("GET", "/audit", hub.root_token, params={"limit": 1000}).json()
    (entry,) = [a for a in audit if a["action"] == "resource_group.update" and a["target"] == "a100"]
    assert entry["actor"] == "root"
    t4 = hub.api("GET", "/resource-groups/t4", hub.root_token).json()
    assert t4["is_public"] is False and t4["grants"] == []
    (entry,) = [a for a in audit if a["action"] == "resource_group.create" and a["target"] == "t4"]
    assert entry["actor"] == "root"


def test_the_monitor_reads_resources_and_changes_nothing(hub, browser):
    shared, _ = devices_of(hub)
    page = open_page(browser, hub, "mona", "resources", "svg.lf-occupancy g.lf-device")
    assert sorted(holders(page, shared)) == [["alice", "0.5"], ["bob", "0.25"]]
    assert page.get_by_role("button", name="Save changes").is_disabled()
    assert page.get_by_role("button", name="Create group").is_disabled()
    page.close()


def test_a_superadmin_drains_and_undrains_a_node_through_the_page(hub, browser):
    (node, *_) = hub.api("GET", "/nodes", hub.root_token).json()
    name = node["name"]
    assert node["schedulable"] is True
    # The monitor's switch is disabled (and the service would refuse her anyway)
    page = open_page(browser, hub, "mona", "resources", f".lf-node-switch-{name}")
    assert page.locator(f".lf-node-switch-{name}").is_disabled()
    mona = hub.wait_token("mona")
    assert hub.api("PATCH", f"/nodes/{name}", mona, json={"schedulable": False}).status_code == 403
    page.close()
    page = open_page(browser, hub, "root", "resources", f".lf-node-switch-{name}")
    switch = page.locator(f".lf-node-switch-{name}")
    assert switch.inner_text().strip() == "Drain"
    switch.click()
    page.wait_for_selector(f"text=Node {name} is drained", timeout=WAIT_MS)
    page.locator(f".lf-node-switch-{name}", has_text="Undrain").wait_for(timeout=WAIT_MS)
    assert "drained" in page.locator(".lf-nodes").inner_text()  # the table's badge follows
    shot(page, "resources-root-drained")
    assert hub.api("GET", "/nodes", hub.root_token).json()[0]["schedulable"] is False
    page.locator(f".lf-node-switch-{name}").click()
    page.wait_for_selector(f"text=Node {name} takes new sessions again.", timeout=WAIT_MS)
    page.close()
    assert hub.api("GET", "/nodes", hub.root_token).json()[0]["schedulable"] is True
    audit = hub.api("GET", "/audit", hub.root_token, params={"limit": 1000}).json()
    done = [
        (a["action"], a["actor"]) for a in audit if a["target"] == name and a["action"].startswith("node.")
    ]
    assert ("node.drain", "root") in done and ("node.undrain", "root") in done


# ---------------------------------------------------------------- scheduler


def cancel_button(page, sid: str):
    return page.locator(f'button[title="Cancel session {sid}"]')


def cell_of(cells: list[str], sid: str) -> int:
    """The index of the session's cell (``user/server`` and the id's first 8 characters)."""
    return next(i for i, c in enumerate(cells) if sid[:8] in c)


def test_a_queued_session_shows_its_position_and_why_it_waits(hub, browser):
    sid = hub.waiting["alice"]
    page = open_page(browser, hub, "root", "scheduler", f'button[title="Cancel session {sid}"]')
    grid = page.locator(".widget-gridbox").first
    cells = grid.locator(":scope > *").all_inner_texts()
    at = cell_of(cells, sid)
    # Named as user/server (the default server here), the id a muted detail with the whole id as its title
    assert cells[at].split() == ["alice/(default)", sid[:8]]
    assert grid.locator(f'.lf-session-id[title="{sid}"]').count() == 1
    assert cells[at - 1] == "1"  # its position, the column before
    assert cells[at + 1 : at + 4] == ["acme/ml", "interactive", "cpu 0.1, gpu 1"]
    why = cells[at + 5]
    assert "waiting for free capacity in resource group default" in why
    assert "short of GPUs: asks 1 whole GPU; none is free on any node" in why
    text = page.inner_text("body")
    assert re.search(r"3 sessions waiting; [23] resource groups in reach", text)  # t4, once created
    for user in ("erin", "bob"):
        assert hub.waiting[user][:8] in text
    assert "Nobody waits here" in text  # a100's queue
    chart = page.locator("svg.lf-queues")
    assert chart.locator('g.lf-queue[data-group="default"]').get_attribute("data-waiting") == "3"
    assert chart.locator('g.lf-queue[data-group="a100"]').get_attribute("data-waiting") == "0"
    assert not cancel_button(page, sid).is_disabled()
    shot(page, "scheduler-root")
    page.close()


def test_a_domain_admin_sees_only_their_domains_queue(hub, browser):
    page = open_page(
        browser, hub, "carol", "scheduler", f'button[title="Cancel session {hub.waiting["alice"]}"]'
    )
    text = page.inner_text("body")
    assert hub.waiting["bob"][:8] in text
    assert hub.waiting["erin"][:8] not in text and "beta/web" not in text
    # Positions count erin's session too: bob stands third
    cells = page.locator(".widget-gridbox").first.locator(":scope > *").all_inner_texts()
    assert cells[cell_of(cells, hub.waiting["bob"]) - 1] == "3"
    shot(page, "scheduler-carol")
    page.close()


def test_the_monitors_cancel_is_disabled(hub, browser):
    page = open_page(
        browser, hub, "mona", "scheduler", f'button[title="Cancel session {hub.waiting["erin"]}"]'
    )
    for user in ("alice", "erin", "bob"):
        assert cancel_button(page, hub.waiting[user]).is_disabled()
    shot(page, "scheduler-mona")
    page.close()


def test_a_superadmin_cancels_a_queued_session_through_the_page(hub, browser):
    sid = hub.waiting["bob"]
    page = open_page(browser, hub, "root", "scheduler", f'button[title="Cancel session {sid}"]')
    cancel_button(page, sid).click()  # it asks first, and nothing is cancelled yet
    page.wait_for_selector("text=Cancel bob/(default) (queued at position", timeout=WAIT_MS)
    assert cancel_button(page, sid).inner_text().strip() == "Really cancel?"
    shot(page, "scheduler-root-confirm")
    assert hub.api("GET", f"/sessions/{sid}", hub.root_token).json()["status"] == "PENDING"
    t = time.monotonic()
    cancel_button(page, sid).click()
    page.wait_for_selector(f"text=Cancelled session bob/(default) ({sid}", timeout=WAIT_MS)
    cancel_button(page, sid).wait_for(state="detached", timeout=WAIT_MS)  # the queue follows
    assert time.monotonic() - t < 30
    assert "it is CANCELLED now" in page.inner_text("body")
    shot(page, "scheduler-root-cancelled")
    page.close()
    assert hub.api("GET", f"/sessions/{sid}", hub.root_token).json()["status"] == "CANCELLED"
    audit = hub.api("GET", "/audit", hub.root_token, params={"limit": 1000}).json()
    (entry,) = [a for a in audit if a["action"] == "session.terminate" and a["target"] == sid]
    assert entry["actor"] == "root"
    # The others still wait, in order
    queue = hub.api("GET", "/scheduler/queue", hub.root_token).json()
    assert [(q["id"], q["position"]) for q in queue] == [(hub.waiting["alice"], 1), (hub.waiting["erin"], 2)]
