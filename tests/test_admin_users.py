"""The admin console's Users page (admin_dashboards/notebooks/users.ipynb) in a real Hub with Chromium:

- a superadmin creates a user through the form: it exists, and the audit log names the superadmin;
- a CSV with one bad row: the preview shows the row's message, and the good rows are created;
- a domain admin lists only their domain's users, and a user in another domain is refused with the
  service's own message;
- the monitor's buttons are disabled; a plain user gets 403;
- edits (status, role, projects), search and pages, and keypairs (issue: the secret shown once;
  rate limit; revoke) act through the service as the viewer;
- the Domains & Projects page (admin_dashboards/projects.py), sharing this Hub: a domain admin sees
  only their domain's projects, sets a cap that the next admission holds, adds and removes a member;
  a monitor's controls are disabled.
Screenshots go to test-artifacts/admin/users-*.png and projects-*.png.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.browserfixture import WAIT_MS, console_page, create_people, hub_login, whole_page_shot
from tests.hubfixture import start_hub

pytestmark = pytest.mark.hub

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("LABFLEET_TEST_ARTIFACTS", REPO / "test-artifacts")) / "admin"
PASSWORD = "users-page-password-1"
PEOPLE = [
    ("carol", "acme", "admin", []),
    ("dave", "beta", "admin", []),
    ("mona", "acme", "monitor", []),
    ("alice", "acme", "user", ["ml"]),
    ("erin", "beta", "user", ["web"]),
]

# Enough users in beta that the superadmin's list has more than one page of 10.
STUDENTS = [f"student{i:02d}" for i in range(1, 17)]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = start_hub(tmp_path_factory.mktemp("admin-users"), console=True)
    try:
        root = h.wait_token("root")
        for path, body in [
            ("/domains", {"name": "acme"}),
            ("/domains", {"name": "beta"}),
            ("/projects", {"domain": "acme", "name": "ml"}),
            ("/projects", {"domain": "acme", "name": "vision"}),
            ("/projects", {"domain": "beta", "name": "web"}),
            ("/policies/user", {"name": "big-folders", "max_vfolder_count": 50}),
        ]:
            r = h.api("POST", path, root, json=body)
            assert r.status_code == 201, r.text
        people = PEOPLE + [(s, "beta", "user", []) for s in STUDENTS]
        create_people(h, root, people, PASSWORD)
        h.root_token = root
        yield h
    finally:
        h.stop()


def login(browser, hub, name: str):
    """A new browser page logged in to the Hub as ``name``."""
    return hub_login(browser, hub, name, PASSWORD)


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"users-{name}.png"), full_page=True)


def users_page(browser, hub, name: str):
    """``name``'s Users page, once its list is there."""
    page = login(browser, hub, name)
    page.goto(f"{hub.url}/services/labfleet-admin/users")
    page.wait_for_selector("text=Viewing as", timeout=WAIT_MS)
    page.wait_for_selector(".lf-users-list", timeout=WAIT_MS)
    return page


def tab(page, title: str) -> None:
    page.locator(".lm-TabBar-tab", has_text=title).click()


def user(hub, name: str) -> dict | None:
    r = hub.api("GET", f"/users/{name}", hub.root_token)
    return r.json() if r.status_code == 200 else None


def listed(page) -> str:
    return page.locator(".lf-users-list").inner_text()


def preview_and_create(page, text: str, expect_preview: str, upload: bool = False) -> None:
    """Put ``text`` into the import (typed, or opened as a file) and preview it."""
    tab(page, "Import CSV")
    if upload:
        with page.expect_file_chooser(timeout=WAIT_MS) as chooser:
            page.click(".lf-csv-upload")
        chooser.value.set_files(
            files=[{"name": "people.csv", "mimeType": "text/csv", "buffer": text.encode()}]
        )
        page.wait_for_function(
            "t => document.querySelector('.lf-csv-text textarea').value === t", arg=text, timeout=WAIT_MS
        )
    else:
        page.fill(".lf-csv-text textarea", text)
    page.click(".lf-csv-preview")
    page.wait_for_selector(f"text={expect_preview}", timeout=WAIT_MS)


def test_a_superadmin_creates_a_user_through_the_page(hub, browser):
    page = users_page(browser, hub, "root")
    tab(page, "Create user")
    page.fill(".lf-new-username input", "newbie")
    page.fill(".lf-new-email input", "newbie@example.org")
    page.locator(".lf-new-domain select").select_option(label="acme")
    projects = page.locator(".lf-new-projects")
    projects.get_by_role("checkbox", name="vision", exact=True).wait_for(timeout=WAIT_MS)
    # One click per project: checking vision keeps ml (a multi-select's plain click would drop it).
    projects.get_by_role("checkbox", name="ml", exact=True).check()
    projects.get_by_role("checkbox", name="vision", exact=True).check()
    assert projects.get_by_role("checkbox", name="ml", exact=True).is_checked()
    page.fill(".lf-new-password input", "newbie-password-1")
    page.click(".lf-create-user")
    page.wait_for_selector("text=Created user newbie in domain acme", timeout=WAIT_MS)
    shot(page, "create-root")
    page.close()
    made = user(hub, "newbie")
    assert made is not None
    assert (made["domain"], made["role"], made["email"]) == ("acme", "user", "newbie@example.org")
    assert sorted(made["projects"]) == ["acme/ml", "acme/vision"] and made["has_password"]
    audit = hub.api("GET", "/audit", hub.root_token, params={"action": "user.create", "limit": 1000}).json()
    (entry,) = [a for a in audit if a["target"] == "newbie"]
    assert entry["actor"] == "root"


def test_a_csv_with_one_bad_row_creates_the_good_ones(hub, browser):
    page = users_page(browser, hub, "root")
    csv_text = (
        "username,email,domain,role,projects\n"
        "csv-one,one@example.org,acme,user,ml\n"
        "csv-two,two@example.org,acme,boss,\n"
        "csv-three,three@example.org,beta,admin,web\n"
    )
    preview_and_create(page, csv_text, "3 row(s): 2 ready, 1 with problems (not created)")
    preview = page.locator(".lf-csv-preview-table").inner_text()
    assert "role must be one of superadmin, admin, user, monitor (got 'boss')" in preview
    assert preview.count("ready") == 2
    shot(page, "csv-preview")
    assert page.locator(".lf-csv-create").inner_text().strip() == "Create 2 user(s)"
    page.click(".lf-csv-create")
    page.wait_for_selector("text=Created 2 user(s); 1 row(s) with problems not created.", timeout=WAIT_MS)
    assert page.locator(".lf-csv-create").is_disabled()  # once per preview
    shot(page, "csv-created")
    page.close()
    assert user(hub, "csv-one")["projects"] == ["acme/ml"]
    assert user(hub, "csv-three")["role"] == "admin"
    assert user(hub, "csv-two") is None


def test_a_domain_admin_sees_only_their_domain_and_cannot_create_in_another(hub, browser):
    page = users_page(browser, hub, "carol")
    text = listed(page)
    for name in ("alice", "carol", "mona"):
        assert name in text
    for name in ("erin", "dave", "root", "student01"):
        assert name not in text
    shot(page, "carol-list")
    # The form offers carol's domain only, and the roles she may give
    tab(page, "Create user")
    assert page.locator(".lf-new-domain option").all_inner_texts() == ["acme"]
    assert page.locator(".lf-new-role option").all_inner_texts() == ["user", "admin"]
    # A CSV row for another domain reaches the service, which refuses it in its own words
    csv_text = "username,domain,role\ncarols-own,acme,user\nintruder,beta,user\n"
    preview_and_create(page, csv_text, "2 row(s): 2 ready.", upload=True)
    page.click(".lf-csv-create")
    page.wait_for_selector("text=The labfleet service said: no domain 'beta'", timeout=WAIT_MS)
    page.wait_for_selector("text=Created 1 user(s); the service refused 1.", timeout=WAIT_MS)
    shot(page, "carol-refused")
    page.close()
    assert user(hub, "intruder") is None
    assert user(hub, "carols-own")["domain"] == "acme"


def test_the_monitors_buttons_are_disabled(hub, browser):
    page = users_page(browser, hub, "mona")
    assert "erin" in listed(page) and "dave" in listed(page)  # reads every domain
    for tip in ("Edit alice", "Deactivate alice"):
        assert page.locator(f'button[title="{tip}"]').is_disabled(), tip
    assert page.locator('button[title="Keypairs of alice"]').is_enabled()  # reading is fine
    for selector in (".lf-create-user", ".lf-csv-create", ".lf-kp-issue"):
        assert page.locator(selector).is_disabled(), selector
    shot(page, "mona")
    page.locator('button[title="Keypairs of alice"]').click()
    page.wait_for_selector(".lf-kp-list", timeout=WAIT_MS)
    assert page.locator('.lf-kp-list button:has-text("Revoke")').first.is_disabled()
    shot(page, "mona-keypairs")
    page.close()


def test_a_plain_user_gets_403(hub, browser):
    page = login(browser, hub, "alice")
    response = page.goto(f"{hub.url}/services/labfleet-admin/users")
    assert response is not None and response.status == 403
    page.close()


def test_search_pages_and_edits(hub, browser):
    page = users_page(browser, hub, "root")
    total = len(hub.api("GET", "/users", hub.root_token, params={"limit": 1000}).json())
    assert total > 20
    page.wait_for_selector(f"text=Users 1–20 of {total}", timeout=WAIT_MS)
    page.click('button[title="Next page"]')
    page.wait_for_selector(f"text=Users 21–{total} of {total}", timeout=WAIT_MS)
    # Search by e-mail: the list narrows to one user
    page.fill(".lf-users-search input", "newbie@example")
    page.press(".lf-users-search input", "Enter")
    page.wait_for_selector("text=Users 1–1 of 1", timeout=WAIT_MS)
    page.locator('button[title="Edit newbie"]').wait_for(timeout=WAIT_MS)
    assert "student" not in listed(page)
    # Edit: make newbie an admin in acme/ml only, with the bigger folder policy
    page.click('button[title="Edit newbie"]')
    panel = page.locator(".lf-users-panel")
    panel.wait_for(timeout=WAIT_MS)
    panel.locator(".widget-dropdown", has_text="Role").locator("select").select_option(label="admin")
    # newbie is in ml and vision: one click on vision leaves ml alone
    panel.locator(".lf-project-checks").get_by_role("checkbox", name="vision", exact=True).uncheck()
    assert panel.locator(".lf-project-checks").get_by_role("checkbox", name="ml", exact=True).is_checked()
    panel.locator(".widget-dropdown", has_text="Policy").locator("select").select_option(label="big-folders")
    shot(page, "edit-newbie")
    page.click(".lf-edit-save")
    page.wait_for_selector("text=Saved newbie: role, projects, resource policy.", timeout=WAIT_MS)
    made = user(hub, "newbie")
    assert (made["role"], made["projects"], made["resource_policy"]) == ("admin", ["acme/ml"], "big-folders")
    # Deactivate from the row, then activate again
    page.click('button[title="Deactivate newbie"]')
    page.wait_for_selector('button[title="Activate newbie"]', timeout=WAIT_MS)
    assert user(hub, "newbie")["status"] == "inactive"
    page.click('button[title="Activate newbie"]')
    page.wait_for_selector('button[title="Deactivate newbie"]', timeout=WAIT_MS)
    assert user(hub, "newbie")["status"] == "active"
    page.close()


def test_keypairs_issue_rate_limit_and_revoke(hub, browser):
    page = users_page(browser, hub, "root")
    page.click('button[title="Keypairs of alice"]')
    page.wait_for_selector(".lf-kp-list", timeout=WAIT_MS)
    main_key = hub.api("GET", "/keypairs", hub.root_token, params={"username": "alice"}).json()[0][
        "access_key"
    ]
    assert page.locator(f'button[title="Revoke {main_key}"]').is_disabled()  # the main keypair stays
    page.click(".lf-kp-issue")
    page.wait_for_selector(".lf-secret-key", timeout=WAIT_MS)
    secret = page.locator(".lf-secret-key").inner_text().strip()
    access = page.locator(".lf-access-key").inner_text().strip()
    assert len(secret) == 40 and len(access) == 20
    assert "shown this once" in page.locator(".lf-secret").inner_text()
    shot(page, "keypair-issued")
    kp = hub.api("GET", f"/keypairs/{access}", hub.root_token).json()
    assert kp["username"] == "alice" and kp["is_active"] and "secret_key" not in kp
    # The rate limit of the new keypair
    row_rate = page.locator(".lf-kp-list .widget-html", has_text=access).locator(
        "xpath=following-sibling::*[4]"
    )
    row_rate.locator("input").fill("250")
    page.click(f'button[title="Set the policy and rate limit of {access}"]')
    page.wait_for_selector(
        f"text=Keypair {access}: policy default, 250 requests per 15 minutes.", timeout=WAIT_MS
    )
    assert page.locator(".lf-secret-key").count() == 1  # still there until hidden
    assert hub.api("GET", f"/keypairs/{access}", hub.root_token).json()["rate_limit"] == 250
    page.click(".lf-secret-hide")
    page.locator(".lf-secret-key").wait_for(state="detached", timeout=WAIT_MS)
    # Revoke it: asked first, revoked at the second click
    page.click(f'button[title="Revoke {access}"]')
    page.wait_for_selector(f"text=Revoke keypair {access}? It signs no request any more", timeout=WAIT_MS)
    assert hub.api("GET", f"/keypairs/{access}", hub.root_token).json()["is_active"] is True
    page.click(f'button[title="Revoke {access}"]')
    page.wait_for_selector(f"text=Revoked keypair {access}", timeout=WAIT_MS)
    assert page.locator(f'button[title="Revoke {access}"]').is_disabled()
    assert "revoked" in page.locator(".lf-kp-list").inner_text()
    shot(page, "keypair-revoked")
    page.close()
    assert hub.api("GET", f"/keypairs/{access}", hub.root_token).json()["is_active"] is False
    audit = hub.api("GET", "/audit", hub.root_token, params={"limit": 1000}).json()
    assert {a["action"] for a in audit if a["target"] == access} == {
        "keypair.issue",
        "keypair.update",
        "keypair.revoke",
    }


# ---------------------------------------------------------------- the Domains & Projects page


def projects_page(browser, hub, name: str):
    """``name``'s Domains & Projects page, once its projects' table is there."""
    return console_page(login(browser, hub, name), hub, "projects", ".lf-project-caps")


def members(hub, project: str) -> list[str]:
    r = hub.api("GET", f"/projects/{project}/members", hub.root_token)
    assert r.status_code == 200, r.text
    return sorted(u["username"] for u in r.json())


def test_a_domain_admin_sets_a_cap_that_admission_holds_and_edits_members(hub, browser):
    create_people(hub, hub.root_token, [("gina", "acme", "user", [])], PASSWORD)
    # A live session in acme/ml: its 0.5 GPU shares show beside the caps
    held = hub.api(
        "POST",
        "/sessions",
        hub.service_token,
        json={"username": "alice", "project": "acme/ml", "slots": {"gpu.shares": 0.5, "cpu": 0.1}},
    )
    assert held.status_code == 201 and held.json()["status"] == "SCHEDULED", held.text
    ml = hub.api("GET", "/projects/acme/ml", hub.root_token).json()
    assert ml["in_use"] == {"cpu": 0.1, "gpu.shares": 0.5} and ml["total_resource_slots"] == {}
    (acme,) = [d for d in hub.api("GET", "/domains", hub.root_token).json() if d["name"] == "acme"]
    assert acme["in_use"] == ml["in_use"]
    try:
        page = projects_page(browser, hub, "carol")
        caps = page.locator(".lf-project-caps").inner_text()
        assert "acme/ml" in caps and "acme/vision" in caps and "beta/web" not in caps
        domains = page.locator(".lf-domain-caps").inner_text()
        assert "acme" in domains and "beta" not in domains
        assert page.locator(".lf-new-project-domain option").all_inner_texts() == ["acme"]
        row = page.locator('.lf-project-caps tr[data-project="acme/ml"]')
        assert "0.5 (no cap)" in row.locator('[data-slot="gpu.shares"]').inner_text()
        # The cap, written as people write it
        page.locator(".lf-project-pick select").select_option(label="acme/ml")
        page.fill(".lf-project-cap input", "gpu.shares=0.75")
        page.click(".lf-project-save")
        page.wait_for_selector("text=Saved project acme/ml: cap gpu.shares=0.75.", timeout=WAIT_MS)
        page.wait_for_selector(
            '.lf-project-caps tr[data-project="acme/ml"] [data-slot="gpu.shares"]:has-text("0.5 of 0.75")',
            timeout=WAIT_MS,
        )
        whole_page_shot(page, ARTIFACTS / "projects-carol-cap.png")
        # The next spawn is admitted against it: 0.5 more would pass the cap
        over = hub.api(
            "POST",
            "/sessions",
            hub.service_token,
            json={"username": "alice", "project": "acme/ml", "slots": {"gpu.shares": 0.5, "cpu": 0.1}},
        )
        assert over.status_code == 409, over.text
        assert over.json()["message"].startswith("project acme/ml would use 1 of its 0.75 gpu.shares")
        # Members: one added by name, then that one removed (a second click confirms); the others stay
        before = members(hub, "acme/ml")
        assert "alice" in before and "gina" not in before
        page.fill(".lf-member-name input", "gina")
        page.click(".lf-member-add")
        page.wait_for_selector("text=Added gina to acme/ml.", timeout=WAIT_MS)
        assert members(hub, "acme/ml") == sorted([*before, "gina"])
        page.click('button[title="Remove gina from acme/ml"]')
        page.wait_for_selector(
            "text=Remove gina from acme/ml? Their new sessions may not use it.", timeout=WAIT_MS
        )
        assert members(hub, "acme/ml") == sorted([*before, "gina"])
        whole_page_shot(page, ARTIFACTS / "projects-carol-confirm.png")
        page.click('button[title="Remove gina from acme/ml"]')
        page.wait_for_selector("text=Removed gina from acme/ml.", timeout=WAIT_MS)
        # The members box is built anew after a change: type into the new one, not the old one
        page.locator('button[title="Remove gina from acme/ml"]').wait_for(state="detached", timeout=WAIT_MS)
        assert members(hub, "acme/ml") == before
        # A user of another domain: the service does not even say there is one
        page.fill(".lf-member-name input", "erin")
        page.click(".lf-member-add")
        page.wait_for_selector("text=The labfleet service said: no user 'erin'", timeout=WAIT_MS)
        assert members(hub, "acme/ml") == before
        page.close()
    finally:
        hub.api("DELETE", f"/sessions/{held.json()['id']}", hub.root_token)
    audit = hub.api(
        "GET", "/audit", hub.root_token, params={"action": "project.update", "limit": 1000}
    ).json()
    assert any(a["actor"] == "carol" and a["target"] == "acme/ml" for a in audit)


def test_the_projects_page_is_read_only_for_a_monitor(hub, browser):
    page = projects_page(browser, hub, "mona")
    caps = page.locator(".lf-project-caps").inner_text()
    assert "acme/ml" in caps and "beta/web" in caps  # a monitor reads every domain
    assert "Read only: a monitor changes nothing." in page.inner_text("body")
    for selector in (
        ".lf-domain-save",
        ".lf-create-domain",
        ".lf-project-save",
        ".lf-project-delete",
        ".lf-member-add",
        ".lf-create-project",
        ".lf-member-name input",
        ".lf-project-cap input",
    ):
        assert page.locator(selector).is_disabled(), selector
    page.locator(".lf-project-pick select").select_option(label="acme/ml")
    page.wait_for_selector('button[title="Remove alice from acme/ml"]', timeout=WAIT_MS)
    assert page.locator('button[title="Remove alice from acme/ml"]').is_disabled()
    whole_page_shot(page, ARTIFACTS / "projects-mona.png")
    page.close()
