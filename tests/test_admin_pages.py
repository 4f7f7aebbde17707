"""The admin console's Resource policies, Environments and Storage pages in a real Hub with Chromium.

- a superadmin changes a keypair policy through the page: the service has the new values and the
  audit log has the change with the superadmin as its actor; a user policy is created and deleted
  through the page too, and a project policy's environment limits (max_environments,
  max_environment_bytes) set; a domain's keypair policies are chosen there (a domain admin's form is
  disabled);
- ``mem=12zz`` in the form shows the service's message and changes nothing;
- a superadmin registers an image through the page, and removes it (with its labels read from
  Docker too, where a Docker engine answers);
- the Environments page lists the users' environments (made through the service's API by alice:
  hers and her project's) with their owners; a monitor gets no Delete, a superadmin deletes one
  (asked twice): the service no longer has it and the audit log says who deleted it; none of them
  is READY, so none offers Promote (promotion itself is unit-tested against a stand-in service);
- the Storage page shows the local storage host, alice's folder with its usage, and her quota scope
  as a bar; a domain admin's shows only their domain's folders;
- a domain admin's policies page is read only, and every button of the monitor's policies and
  environments pages that changes something is disabled.

Screenshots go to test-artifacts/admin/ (policies-*.png, environments-*.png, storage-*.png).

The users' environments stay QUEUED or go FAILED: their base is a registry nobody answers at
(127.0.0.1:9), so no engine builds them, and the test needs none.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.browserfixture import WAIT_MS, console_page, hub_login, whole_page_shot
from tests.hubfixture import start_hub
from tests.test_docker_backend import _run_script

pytestmark = pytest.mark.hub

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("LABFLEET_TEST_ARTIFACTS", REPO / "test-artifacts")) / "admin"
PASSWORD = "pages-password-1"
GIB = 2**30
PEOPLE = [
    ("carol", "acme", "admin", []),
    ("mona", "acme", "monitor", []),
    ("alice", "acme", "user", ["ml"]),
    ("erin", "beta", "user", ["web"]),
]
ALICE_FILE = b"x" * 1536  # 1.5 KiB in alice's folder
ENV_BASE = "127.0.0.1:9/labfleet-test/envbase:1"  # registered; a pull of it is refused at once


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    state = tmp_path_factory.mktemp("admin-pages")
    h = start_hub(state, console=True)
    try:
        root = h.wait_token("root")

        def ok(method, path, body=None, token=root, code=None):
            r = h.api(method, path, token, json=body)
            assert r.status_code in ((code,) if code else (200, 201)), (method, path, r.status_code, r.text)
            return r.json()

        for path, body in [
            ("/domains", {"name": "acme"}),
            ("/domains", {"name": "beta"}),
            ("/projects", {"domain": "acme", "name": "ml"}),
            ("/projects", {"domain": "beta", "name": "web"}),
            ("/policies/keypair", {"name": "gold", "total_resource_slots": {"cpu": 8}}),
            ("/policies/user", {"name": "small", "max_vfolder_count": 5, "max_quota_scope_size": 4096}),
            (
                "/policies/project",
                {"name": "team", "max_vfolder_count": 20, "max_quota_scope_size": 100 * GIB},
            ),
        ]:
            ok("POST", path, body)
        for name, domain, role, projects in PEOPLE:
            body = {
                "username": name,
                "domain": domain,
                "role": role,
                "projects": projects,
                "password": PASSWORD,
            }
            ok("POST", "/users", body)
        ok("PATCH", "/users/alice", {"resource_policy": "small"})
        ok("PATCH", "/projects/acme/ml", {"resource_policy": "team"})
        h.folders = {}
        for who, folder, data in (("alice", "alice-data", ALICE_FILE), ("erin", "erin-data", b"hello")):
            token = h.wait_token(who)
            fid = ok("POST", "/vfolders", {"name": folder}, token=token)["id"]
            r = h.api("PUT", f"/vfolders/{fid}/files/{quote('notes.txt')}", token, data=data)
            assert r.status_code in (200, 201), r.text
            h.folders[folder] = fid
        # alice's own environment and her project's (My Environments), through the service's API
        ok("POST", "/images", {"name": ENV_BASE, "display_name": "Env base"})
        alice = h.wait_token("alice")
        h.envs = {
            name: ok("POST", "/environments", {"base": ENV_BASE, "name": name, **more}, token=alice, code=202)
            for name, more in (
                ("numpy", {"files": {"requirements.txt": "numpy\n"}}),
                ("team-tools", {"project": "ml"}),
            )
        }
        h.root_token = root
        h.ok = ok
        yield h
    finally:
        h.stop()


def open_page(browser, hub, name: str, path: str, ready: str):
    """Log ``name`` in through the Hub's form, open the console's ``path`` and wait for ``ready``."""
    return console_page(hub_login(browser, hub, name, PASSWORD, width=1400), hub, path, ready)


def shot(page, name: str) -> None:
    whole_page_shot(page, ARTIFACTS / f"{name}.png", max_height=8000)


def field(form, label: str):
    """The input (or text area, or select) of the form's field labelled exactly ``label``."""
    box = form.locator(".widget-inline-hbox").filter(has=form.page.get_by_text(label, exact=True))
    return box.locator("input, textarea, select").first


def choose(form, label: str, option: str, then: str, value: str | None = None) -> None:
    """Pick ``option`` in the dropdown ``label`` and wait until the kernel has filled the form for
    it (field ``then`` shows ``value``, or shows at all): typing before that would race the
    kernel's own update of the fields."""
    from playwright.sync_api import expect

    field(form, label).select_option(label=option)
    if value is None:
        field(form, then).wait_for(state="visible", timeout=WAIT_MS)
    else:
        expect(field(form, then)).to_have_value(value, timeout=WAIT_MS)


def audit(hub, action: str, target: str) -> list[dict]:
    entries = hub.api("GET", "/audit", hub.root_token, params={"limit": 1000}).json()
    return [a for a in entries if a["action"] == action and a["target"] == target]


# ---------------------------------------------------------------- resource policies


def test_a_superadmin_changes_a_keypair_policy_through_the_page(hub, browser):
    page = open_page(browser, hub, "root", "policies", 'tr[data-kind="keypair"][data-policy="gold"]')
    form = page.locator(".lf-policy-keypair")
    choose(form, "Policy", "gold", "Total slots", "cpu=8")
    field(form, "Total slots").fill("cpu=4, mem=16g, gpu.shares=1.5")
    field(form, "Unnamed slots").select_option("LIMITED")
    field(form, "Max sessions").fill("3")
    field(form, "Idle timeout").fill("30m")
    field(form, "Max lifetime").fill("1d")
    field(form, "Storage hosts").fill("local: mount-in-session, download-file")
    form.get_by_role("button", name="Save changes").click()
    page.wait_for_selector("text=Saved keypair policy gold:", timeout=WAIT_MS)
    row = page.locator('tr[data-kind="keypair"][data-policy="gold"]')  # the table follows
    assert "cpu 4, mem 16 GiB, gpu.shares 1.5; others: none" in row.inner_text()
    assert "30 min" in row.inner_text() and "1 d" in row.inner_text()
    assert field(page.locator(".lf-policy-keypair"), "Policy").input_value() == "gold"
    # The keypair policies a domain's admins may give: a superadmin's domain form (acme, the first)
    domain = page.locator(".lf-domain-form")
    field(domain, "Keypair policies").fill("gold")
    domain.get_by_role("button", name="Save domain").click()
    page.wait_for_selector(
        "text=Saved domain acme: keypair policies its admins may give: gold.", timeout=WAIT_MS
    )
    shot(page, "policies-root")
    page.close()
    assert hub.ok("GET", "/domains/acme")["allowed_keypair_policies"] == ["gold"]
    gold = hub.ok("GET", "/policies/keypair/gold")
    assert gold["total_resource_slots"] == {"cpu": 4, "mem": 16 * GIB, "gpu.shares": 1.5}
    assert gold["default_for_unspecified"] == "LIMITED"
    assert (gold["max_concurrent_sessions"], gold["idle_timeout"], gold["max_session_lifetime"]) == (
        3,
        1800,
        86400,
    )
    assert gold["allowed_storage_hosts"] == {"local": ["mount-in-session", "download-file"]}
    (entry,) = audit(hub, "policy.keypair.update", "gold")
    assert entry["actor"] == "root"


def test_a_bad_slot_shows_the_services_message_and_changes_nothing(hub, browser):
    before = hub.ok("GET", "/policies/keypair/gold")
    updates = len(audit(hub, "policy.keypair.update", "gold"))
    page = open_page(browser, hub, "root", "policies", 'tr[data-kind="keypair"][data-policy="gold"]')
    form = page.locator(".lf-policy-keypair")
    choose(form, "Policy", "gold", "Total slots", "cpu=4, mem=16g, gpu.shares=1.5")
    field(form, "Total slots").fill("cpu=2, mem=12zz")
    field(form, "Max sessions").fill("9")
    form.get_by_role("button", name="Save changes").click()
    said = "The labfleet service said: total_resource_slots: slot 'mem': cannot read '12zz'"
    page.wait_for_selector(f"text={said}", timeout=WAIT_MS)
    shot(page, "policies-root-bad-slot")
    # A slip the form itself reads wrong is named before anything is sent
    field(form, "Total slots").fill("cpu")
    form.get_by_role("button", name="Save changes").click()
    page.wait_for_selector("text=total_resource_slots: cannot read 'cpu': write NAME=AMOUNT", timeout=WAIT_MS)
    page.close()
    assert hub.ok("GET", "/policies/keypair/gold") == before
    assert len(audit(hub, "policy.keypair.update", "gold")) == updates


def test_a_superadmin_creates_and_deletes_a_user_policy_through_the_page(hub, browser):
    page = open_page(browser, hub, "root", "policies", 'tr[data-kind="user"][data-policy="small"]')
    form = page.locator(".lf-policy-user")
    choose(form, "Policy", "(new policy)", "Name")
    field(form, "Name").fill("tiny")
    field(form, "Max folders").fill("2")
    field(form, "Storage quota").fill("500m")
    field(form, "Max folder size").fill("100m")
    field(form, "Max environments").fill("2")
    field(form, "Max keypairs").fill("4")
    field(form, "Max endpoints").fill("1")
    form.get_by_role("button", name="Create user policy").click()
    page.wait_for_selector("text=Created user policy tiny:", timeout=WAIT_MS)
    row = page.locator('tr[data-kind="user"][data-policy="tiny"]')
    assert row.inner_text().split("\t")[1:] == [
        "2",
        "500 MiB",
        "100 MiB",
        "2",
        "no limit",
        "4",
        "1",
        "no limit",
        "nobody",
    ]
    tiny = hub.ok("GET", "/policies/user/tiny")
    assert (tiny["max_vfolder_count"], tiny["max_quota_scope_size"], tiny["max_vfolder_size"]) == (
        2,
        500 * 2**20,
        100 * 2**20,
    )
    assert (tiny["max_endpoints"], tiny["max_replicas_per_endpoint"], tiny["max_keypairs"]) == (1, 0, 4)
    assert (tiny["max_environments"], tiny["max_environment_bytes"]) == (2, 0)
    # The policy alice uses cannot go: the service says so
    form = page.locator(".lf-policy-user")
    choose(form, "Policy", "small", "Max folders", "5")
    delete = form.get_by_role("button", name="Delete")
    delete.click()
    form.get_by_role("button", name="Really delete small?").click()
    page.wait_for_selector("text=user resource policy 'small' is used by 1 users", timeout=WAIT_MS)
    choose(form, "Policy", "tiny", "Max folders", "2")
    form.get_by_role("button", name="Delete").click()
    form.get_by_role("button", name="Really delete tiny?").click()
    page.wait_for_selector("text=Deleted user policy tiny.", timeout=WAIT_MS)
    page.locator('tr[data-kind="user"][data-policy="tiny"]').wait_for(state="detached", timeout=WAIT_MS)
    # A project policy's environment limits (the project acme/ml's)
    form = page.locator(".lf-policy-project")
    choose(form, "Policy", "team", "Max environments", "3")
    field(form, "Max environments").fill("5")
    field(form, "Environment quota").fill("20g")
    form.get_by_role("button", name="Save changes").click()
    page.wait_for_selector(
        "text=Saved project policy team: max_environment_bytes, max_environments.", timeout=WAIT_MS
    )
    row = page.locator('tr[data-kind="project"][data-policy="team"]')
    assert row.inner_text().split("\t")[4:6] == ["5", "20 GiB"]
    shot(page, "policies-root-environment-limits")
    page.close()
    team = hub.ok("GET", "/policies/project/team")
    assert (team["max_environments"], team["max_environment_bytes"]) == (5, 20 * GIB)
    assert hub.api("GET", "/policies/user/tiny", hub.root_token).status_code == 404
    assert hub.api("GET", "/policies/user/small", hub.root_token).status_code == 200
    for action in ("policy.user.create", "policy.user.delete"):
        assert [a["actor"] for a in audit(hub, action, "tiny")] == ["root"]


def test_a_superadmin_adds_and_removes_an_idle_checker_through_the_page(hub, browser):
    page = open_page(browser, hub, "root", "policies", ".lf-idle-form")
    form = page.locator(".lf-idle-form")
    form.locator(".widget-text", has_text="Name").locator("input").fill("gpu-idle")

    def option(name: str):  # a field of the chosen kind's options
        return form.locator(f".lf-option-{name} input")

    # A field per option of the kind (a utilization checker's here), starting from an example
    assert option("window").input_value() == "1200" and option("thresholds-mem").input_value() == ""
    assert form.locator("textarea").count() == 0
    # Bad input first: the service says what is wrong and nothing is made
    option("thresholds-cpu-util").fill("")
    option("thresholds-gpu-util").fill("500")
    form.locator(".widget-text", has_text="Applies to").locator("input").fill("resource_group:default")
    page.locator(".lf-idle-create").click()
    page.wait_for_selector("text=threshold gpu_util must be a percent from 0 to 100", timeout=WAIT_MS)
    assert hub.api("GET", "/idle-checkers/gpu-idle", hub.root_token).status_code == 404
    assert option("thresholds-gpu-util").input_value() == "500"  # the form keeps what was typed
    option("thresholds-gpu-util").fill("5")
    page.locator(".lf-idle-create").click()
    page.wait_for_selector("text=Created idle checker gpu-idle.", timeout=WAIT_MS)
    page.wait_for_selector("text=gpu_util under 5% over 20m, after a grace of 10m", timeout=WAIT_MS)
    page.locator(".lf-idle-preview").click()
    page.wait_for_selector("text=Nothing would be reclaimed now.", timeout=WAIT_MS)
    shot(page, "policies-root-idle-checker")
    checker = hub.ok("GET", "/idle-checkers/gpu-idle")
    assert checker["options"]["thresholds"] == {"gpu_util": 5.0}
    assert checker["bindings"] == [{"scope": "resource_group", "name": "default"}]
    page.locator(".lf-idle-delete").click()  # it asks first
    page.wait_for_selector("text=Delete idle checker gpu-idle?", timeout=WAIT_MS)
    assert hub.api("GET", "/idle-checkers/gpu-idle", hub.root_token).status_code == 200
    page.get_by_role("button", name="Really delete?").click()
    page.wait_for_selector("text=Deleted idle checker gpu-idle.", timeout=WAIT_MS)
    page.close()
    assert hub.api("GET", "/idle-checkers/gpu-idle", hub.root_token).status_code == 404
    for action in ("idle-checker.create", "idle-checker.delete"):
        assert [a["actor"] for a in audit(hub, action, "gpu-idle")] == ["root"]


def test_a_domain_admins_policies_page_is_read_only(hub, browser):
    page = open_page(browser, hub, "carol", "policies", 'tr[data-kind="keypair"][data-policy="gold"]')
    text = page.inner_text("body")
    assert "Read only: only a superadmin changes resource policies." in text
    for kind in ("keypair", "user", "project"):
        form = page.locator(f".lf-policy-{kind}")
        buttons = form.locator("button")
        assert buttons.count() >= 2
        assert all(buttons.nth(i).is_disabled() for i in range(buttons.count())), kind
        inputs = form.locator("input[type=text], textarea")
        assert all(inputs.nth(i).is_disabled() for i in range(inputs.count())), kind
    # Only a superadmin chooses the keypair policies a domain's admins may give
    assert page.locator(".lf-domain-form").get_by_role("button", name="Save domain").is_disabled()
    shot(page, "policies-carol")
    page.close()


def test_the_monitors_buttons_are_disabled(hub, browser):
    page = open_page(browser, hub, "mona", "policies", 'tr[data-kind="keypair"][data-policy="gold"]')
    assert "Read only: a monitor changes nothing." in page.inner_text("body")
    for name, count in (("Save changes", 4), ("Delete", 4)):  # the idle checkers' Save and Delete too
        found = page.get_by_role("button", name=name)
        assert found.count() == count and all(found.nth(i).is_disabled() for i in range(count)), name
    # no new policy for a monitor
    assert page.get_by_role("button", name=re.compile(r"^Create .*policy$")).count() == 0
    assert page.locator(".lf-idle-create").is_disabled()
    shot(page, "policies-mona")
    page.close()
    page = open_page(browser, hub, "mona", "environments", ".lf-image-form")
    form = page.locator(".lf-image-form")
    buttons = form.locator("button")
    assert buttons.count() >= 2 and all(buttons.nth(i).is_disabled() for i in range(buttons.count()))
    # Every user's environment, with its owner, and no Delete for a monitor
    envs = page.locator(".lf-user-envs")
    owner = envs.locator(f'.lf-env-owner[data-environment="{hub.envs["team-tools"]["id"]}"]')
    owner.wait_for(timeout=WAIT_MS)
    assert owner.inner_text() == "project:acme/ml"
    assert "Read only: a monitor changes nothing." in envs.inner_text()
    assert envs.locator("button").count() == 0
    shot(page, "environments-mona")
    page.close()


# ---------------------------------------------------------------- environments


def test_a_superadmin_registers_and_removes_an_image_through_the_page(hub, browser):
    name = "labfleet-test/tiny:1"
    page = open_page(browser, hub, "root", "environments", ".lf-image-form")
    form = page.locator(".lf-image-form")
    choose(form, "Image", "(register a new image)", "Reference")
    field(form, "Reference").fill(name)
    field(form, "Display name").fill("Tiny test image")
    field(form, "Minimum").fill("cpu=1, mem=1g")
    form.get_by_text("cuda", exact=True).click()
    field(form, "Apps").fill("web:http:8080")
    # A slip the service catches: a project that does not exist. Each field is typed into once before
    # a click: ipywidgets holds a second change to a widget until the kernel has taken the first, and
    # a click is not held, so under load it could reach the kernel first.
    field(form, "Domains").fill("")
    field(form, "Projects").fill("acme/nope")
    form.get_by_role("button", name="Register image").click()
    page.wait_for_selector("text=The labfleet service said: no project acme/nope", timeout=WAIT_MS)
    assert hub.api("GET", f"/images/{quote(name, safe='')}", hub.root_token).status_code == 404
    field(form, "Projects").fill("acme/ml")
    form.get_by_role("button", name="Register image").click()
    page.wait_for_selector(f"text=Registered image {name}.", timeout=WAIT_MS)
    row = page.locator(f'tr[data-image="{name}"]')
    assert "cpu 1, mem 1 GiB" in row.inner_text() and "web (http 8080)" in row.inner_text()
    assert "projects acme/ml" in row.inner_text()
    image = hub.ok("GET", f"/images/{quote(name, safe='')}")
    assert image["display_name"] == "Tiny test image" and image["accelerators"] == ["cuda"]
    assert image["min_resource_slots"] == {"cpu": 1, "mem": GIB} and image["projects"] == ["acme/ml"]
    assert image["service_ports"] == [{"name": "web", "protocol": "http", "port": 8080}]
    shot(page, "environments-root")
    # The editor stays on the new image: remove it (a second click confirms)
    form = page.locator(".lf-image-form")
    assert field(form, "Image").input_value() == name
    form.get_by_role("button", name="Remove").click()
    form.get_by_role("button", name="Really remove?").click()
    page.wait_for_selector(f"text=Removed image {name}.", timeout=WAIT_MS)
    page.locator(f'tr[data-image="{name}"]').wait_for(state="detached", timeout=WAIT_MS)
    page.close()
    assert hub.api("GET", f"/images/{quote(name, safe='')}", hub.root_token).status_code == 404
    for action in ("image.register", "image.remove"):
        assert [a["actor"] for a in audit(hub, action, name)] == ["root"]


def test_a_superadmin_sees_the_users_environments_and_deletes_one(hub, browser):
    from playwright.sync_api import expect

    numpy, team = hub.envs["numpy"], hub.envs["team-tools"]
    page = open_page(browser, hub, "root", "environments", f'.lf-env-owner[data-environment="{numpy["id"]}"]')
    envs = page.locator(".lf-user-envs")
    for env, owner in ((numpy, "user:alice"), (team, "project:acme/ml")):
        assert envs.locator(f'.lf-env-owner[data-environment="{env["id"]}"]').inner_text() == owner
        status = envs.locator(f'.lf-env-status[data-environment="{env["id"]}"]').inner_text()
        assert status in ("QUEUED", "BUILDING", "FAILED"), status  # nothing builds it here
        assert envs.locator(f'.lf-env-size[data-environment="{env["id"]}"]').inner_text() == "—"
    assert "2 environments in the fleet" in envs.inner_text()
    bar = envs.locator('svg.lf-env-sizes g.lf-env-owner[data-owner="user:alice"]')
    assert (bar.get_attribute("data-bytes"), bar.get_attribute("data-count")) == ("0", "1")
    # A Delete on each row (drawn with its row's Promote, where it has one), and no Promote: only a
    # READY environment is promoted, and these are QUEUED or FAILED
    expect(envs.get_by_role("button", name="Delete")).to_have_count(2, timeout=WAIT_MS)
    assert envs.get_by_role("button", name="Promote").count() == 0
    assert envs.locator(".lf-env-promote").count() == 0
    shot(page, "environments-users-root")
    # Delete asks first; the second click deletes, and the page is built anew without it
    envs.locator('button[title="Delete environment user:alice/numpy"]').click()
    page.wait_for_selector("text=Delete environment user:alice/numpy? New sessions", timeout=WAIT_MS)
    assert hub.api("GET", f"/environments/{numpy['id']}", hub.root_token).status_code == 200
    envs.get_by_role("button", name="Really delete?").click()
    page.wait_for_selector("text=Deleted environment user:alice/numpy.", timeout=WAIT_MS)
    page.locator(f'.lf-env[data-environment="{numpy["id"]}"]').wait_for(state="detached", timeout=WAIT_MS)
    assert envs.locator(f'.lf-env[data-environment="{team["id"]}"]').count() == 1
    shot(page, "environments-users-root-deleted")
    page.close()
    assert hub.api("GET", f"/environments/{numpy['id']}", hub.root_token).status_code == 404
    assert hub.api("GET", f"/environments/{team['id']}", hub.root_token).status_code == 200
    assert [a["actor"] for a in audit(hub, "environment.delete", "user:alice/numpy")] == ["root"]


@pytest.mark.docker
def test_registering_reads_the_images_labels_from_docker(hub, browser):
    _run_script("docker.sh", 240)  # a Docker engine that answers: started here if it is not running
    name = f"labfleet-test/labelled:{uuid.uuid4().hex[:8]}"
    empty = subprocess.run(
        ["tar", "-cf", "-", "--files-from", "/dev/null"], capture_output=True, check=True, timeout=60
    )
    changes = [
        'LABEL ai.labfleet.display-name="Labelled image"',
        'LABEL ai.labfleet.min.cpu="2"',
        'LABEL ai.labfleet.service-ports="tensorboard:http:6006"',
    ]
    args = ["docker", "import"] + [a for c in changes for a in ("--change", c)] + ["-", name]
    subprocess.run(args, input=empty.stdout, capture_output=True, check=True, timeout=60)
    try:
        page = open_page(browser, hub, "root", "environments", ".lf-image-form")
        form = page.locator(".lf-image-form")
        choose(form, "Image", "(register a new image)", "Reference")
        field(form, "Reference").fill(name)
        form.get_by_text("read labels from Docker", exact=True).click()
        form.get_by_role("button", name="Register image").click()
        page.wait_for_selector(f"text=Registered image {name} with its labels from Docker.", timeout=WAIT_MS)
        row = page.locator(f'tr[data-image="{name}"]').inner_text()
        assert "Labelled image" in row and "cpu 2" in row and "tensorboard (http 6006)" in row
        page.close()
        image = hub.ok("GET", f"/images/{quote(name, safe='')}")
        assert image["display_name"] == "Labelled image" and image["min_resource_slots"] == {"cpu": 2}
        hub.ok("DELETE", f"/images/{quote(name, safe='')}")
    finally:
        subprocess.run(["docker", "rmi", "-f", name], capture_output=True, timeout=60)


# ---------------------------------------------------------------- storage


def test_the_storage_page_shows_the_local_host_and_a_folders_usage(hub, browser):
    page = open_page(browser, hub, "root", "storage", 'tr[data-folder="alice-data"]')
    host = page.locator('tr[data-host="local"]')
    assert host.count() == 1 and "active" in host.inner_text()
    folder = page.locator('tr[data-folder="alice-data"]').inner_text()
    assert "user:alice" in folder and "1.5 KiB" in folder
    assert "user alice: 1.5 KiB of 4 KiB, 1 of 5 folders" in folder
    assert page.locator('tr[data-folder="erin-data"]').count() == 1  # the whole fleet's
    # alice owns the first user folder: her quota scopes are drawn
    bar = page.locator('svg.lf-scopes g.lf-scope[data-kind="user"][data-name="alice"]')
    bar.wait_for(state="attached", timeout=WAIT_MS)
    assert (bar.get_attribute("data-used"), bar.get_attribute("data-limit")) == ("1536", "4096")
    assert "1.5 KiB of 4 KiB (38 %), 1 of 5 folders" in bar.inner_html()
    project = page.locator('svg.lf-scopes g.lf-scope[data-kind="project"][data-name="acme/ml"]')
    assert project.get_attribute("data-limit") == str(100 * GIB)
    assert re.search(r"1[–-]2 of 2 folders", page.inner_text("body"))
    shot(page, "storage-root")
    # Another person's quotas, by name
    user = page.locator(".widget-text", has_text="User").locator("input")
    user.fill("erin")
    page.get_by_role("button", name="Show quotas").click()
    page.locator('g.lf-scope[data-kind="user"][data-name="erin"]').wait_for(state="attached", timeout=WAIT_MS)
    page.close()


def test_a_domain_admins_storage_page_shows_only_their_domain(hub, browser):
    page = open_page(browser, hub, "carol", "storage", 'tr[data-folder="alice-data"]')
    text = page.inner_text("body")
    assert "Every folder of your domain." in text and "erin-data" not in text
    assert page.locator('tr[data-host="local"]').count() == 1
    shot(page, "storage-carol")
    # erin is another domain's: the service says there is no such user for carol
    user = page.locator(".widget-text", has_text="User").locator("input")
    user.fill("erin")
    page.get_by_role("button", name="Show quotas").click()
    page.wait_for_selector("text=The labfleet service said: no user 'erin'", timeout=WAIT_MS)
    page.close()
