"""The admin console (``labfleet-admin``: Voila dashboards as a Hub service) in a real Hub with
Chromium: who gets in, what each sees, and that its actions are the viewer's own.

- superadmin, domain admin and monitor open the front page (counts read as themselves); a plain user
  gets 403;
- the sessions page shows a domain admin only their domain's sessions, disables the monitor's
  stop buttons, and a superadmin's stop through the page ends the session, audited with the
  superadmin as the actor;
- the dashboards' kernels never see the service's own token, and nobody but the console reaches
  them: their connection files are in the console's private runtime directory in the state
  directory (0700, the files 0600), and their channels are unix sockets there, not TCP ports.
Screenshots go to test-artifacts/admin/.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import time
from pathlib import Path

import psutil
import pytest
from jupyter_core.paths import jupyter_runtime_dir

from labfleet.console.kernels import kernel_environment
from tests.browserfixture import WAIT_MS, create_people, hub_login
from tests.hubfixture import start_hub

pytestmark = pytest.mark.hub

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("LABFLEET_TEST_ARTIFACTS", REPO / "test-artifacts")) / "admin"
PASSWORD = "console-password-1"
PEOPLE = [
    ("carol", "acme", "admin", []),
    ("dave", "beta", "admin", []),
    ("mona", "acme", "monitor", []),
    ("alice", "acme", "user", ["ml"]),
    ("erin", "beta", "user", ["web"]),
]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    state = tmp_path_factory.mktemp("admin")
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
        ]:
            assert h.api("POST", path, root, json=body).status_code == 201
        create_people(h, root, PEOPLE, PASSWORD)
        h.sessions = {}
        for user, project in (("alice", "acme/ml"), ("erin", "beta/web")):
            r = h.api(
                "POST",
                "/sessions",
                h.service_token,
                json={"username": user, "project": project, "slots": {"cpu": 0.1}},
            )
            assert r.status_code == 201, r.text
            h.sessions[user] = r.json()["id"]
        h.root_token = root
        yield h
    finally:
        h.stop()


def login(browser, hub, name: str):
    return hub_login(browser, hub, name, PASSWORD)


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


@pytest.mark.parametrize("name, role", [("root", "superadmin"), ("carol", "admin"), ("mona", "monitor")])
def test_admins_and_monitors_open_the_console_as_themselves(hub, browser, name, role):
    page = login(browser, hub, name)
    t = time.monotonic()
    page.goto(f"{hub.url}/services/labfleet-admin/")
    page.wait_for_selector(".lf-card", timeout=WAIT_MS)
    took = time.monotonic() - t
    text = page.inner_text("body")
    assert f"Viewing as {name} ({role})" in text
    assert "Users" in text and "Sessions" in text and "Statistics" in text
    # What each may see: the superadmin and the monitor every live session, carol her domain's
    sessions = page.locator(".lf-card", has_text="Sessions").locator(".lf-count").inner_text()
    assert sessions == ("1" if name == "carol" else "2"), (name, sessions)
    # A way back to the Hub and to the Fleet home, who is looking, and Logout
    top = page.locator(".lf-top")
    assert top.locator("a", has_text="Hub").get_attribute("href") == "/hub/home"
    assert top.locator("a", has_text="Fleet home").get_attribute("href") == "/services/labfleet/"
    assert top.locator(".lf-viewer").inner_text() == name
    assert top.locator("a", has_text="Logout").get_attribute("href") == "/hub/logout"
    shot(page, f"index-{name}")
    if name == "mona":
        top.locator("a", has_text="Logout").click()
        page.wait_for_selector("#login_submit", timeout=WAIT_MS)
    page.close()
    assert took < 60


def _console_and_kernels(hub) -> tuple[psutil.Process, list[psutil.Process]]:
    """The admin console's server (found by its service URL) and its dashboards' kernels."""
    url = f"http://127.0.0.1:{hub.env['LABFLEET_ADMIN_PORT']}"
    for proc in psutil.process_iter(["cmdline"]):
        if "labfleet.console" not in (proc.info["cmdline"] or []):
            continue
        try:
            if proc.environ().get("JUPYTERHUB_SERVICE_URL") != url:
                continue
            kernels = [k for k in proc.children(recursive=True) if "ipykernel_launcher" in k.cmdline()]
        except psutil.Error:
            continue
        return proc, kernels
    raise AssertionError(f"no admin console serves {url}")


def test_the_dashboards_kernels_are_reachable_by_the_console_only(hub, browser):
    page = login(browser, hub, "root")
    page.goto(f"{hub.url}/services/labfleet-admin/")
    page.wait_for_selector(".lf-card", timeout=WAIT_MS)
    console, kernels = _console_and_kernels(hub)
    assert kernels, "the open page has no kernel"
    private = hub.state / "admin-runtime"  # not root's ~/.local/share/jupyter/runtime
    info = private.stat()
    assert stat.S_IMODE(info.st_mode) & 0o777 == 0o700 and info.st_uid == os.geteuid(), oct(info.st_mode)
    assert (private / f"jpserver-{console.pid}.json").is_file()  # the console's own runtime files too
    for kernel in kernels:
        cmd = kernel.cmdline()
        connection = Path(cmd[cmd.index("-f") + 1])
        assert connection.parent == private, connection
        assert not (Path(jupyter_runtime_dir()) / connection.name).exists()
        assert stat.S_IMODE(connection.stat().st_mode) == 0o600, oct(connection.stat().st_mode)
        spec = json.loads(connection.read_text())
        assert spec["transport"] == "ipc" and spec["ip"].startswith(f"{private}/"), spec
        for channel in ("shell", "iopub", "stdin", "control", "hb"):
            assert stat.S_ISSOCK(Path(f"{spec['ip']}-{spec[channel + '_port']}").stat().st_mode), channel
        # No channel of the kernel on TCP: the one TCP listener ipykernel keeps is its pipe for the
        # output of forked subprocesses (127.0.0.1), which drops every message that lacks a random
        # key the kernel never writes anywhere; it runs no code.
        listening = [c for c in kernel.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        assert len(listening) <= 1 and all(c.laddr.ip == "127.0.0.1" for c in listening), listening
    page.close()


def test_a_plain_user_gets_403(hub, browser):
    page = login(browser, hub, "alice")
    response = page.goto(f"{hub.url}/services/labfleet-admin/sessions")
    assert response is not None and response.status == 403
    shot(page, "index-alice-403")
    page.close()


def _sessions_page(browser, hub, name):
    page = login(browser, hub, name)
    page.goto(f"{hub.url}/services/labfleet-admin/sessions")
    page.wait_for_selector("text=Viewing as", timeout=WAIT_MS)
    page.wait_for_selector("text=session", timeout=WAIT_MS)
    return page


def _stop_button(page, sid):
    """The stop button on the session's row of the grid (7 cells a row, the button last)."""
    cell = page.locator(".widget-gridbox > .widget-html", has_text=sid[:8])
    cell.wait_for(timeout=WAIT_MS)
    return cell.locator("xpath=following-sibling::*[6]")


def test_a_domain_admin_sees_only_their_domain(hub, browser):
    page = _sessions_page(browser, hub, "carol")
    page.wait_for_selector(f"text={hub.sessions['alice'][:8]}", timeout=WAIT_MS)
    assert hub.sessions["erin"][:8] not in page.inner_text("body")
    # Named as user/server, the whole id in the title of its short form
    cell = page.locator(".widget-gridbox > .widget-html", has_text=hub.sessions["alice"][:8])
    assert cell.locator(".lf-session").inner_text() == "alice/(default)"
    assert cell.locator(".lf-session-id").get_attribute("title") == hub.sessions["alice"]
    shot(page, "sessions-carol")
    page.close()


def _signed_cookie_value(raw: str) -> str | None:
    """The value of a tornado signed cookie (format 2: ``2|1:0|len:ts|len:name|len:b64|sig``),
    read without checking its signature (the test only wants what the console's server holds)."""
    fields = raw.strip('"').split("|")
    if len(fields) != 6 or fields[0] != "2":
        return None
    try:
        return base64.b64decode(fields[4].split(":", 1)[1]).decode()
    except (ValueError, IndexError):
        return None


def _the_kernels_token(hub, page) -> str:
    """The token carol's dashboard kernels call the service with: the one the Hub gave the console
    when she logged in to it (``viewer.viewer_of`` hands it to each kernel), kept in the console's
    signed login cookie."""
    for cookie in page.context.cookies():
        token = _signed_cookie_value(cookie["value"])
        if token and hub.api("GET", "/me", token).status_code == 200:
            return token
    raise AssertionError(f"no console login cookie among {[c['name'] for c in page.context.cookies()]}")


def test_the_kernels_own_credentials_are_refused_for_another_domain(hub, browser):
    page = _sessions_page(browser, hub, "carol")
    token = _the_kernels_token(hub, page)
    page.close()
    assert hub.api("GET", "/me", token).json()["username"] == "carol"
    # Her own domain answers; beta's session, user and domain do not, and nothing is created there
    assert hub.api("GET", f"/sessions/{hub.sessions['alice']}", token).status_code == 200
    assert hub.api("GET", f"/sessions/{hub.sessions['erin']}", token).status_code in (403, 404)
    assert hub.api("GET", "/users/dave", token).status_code in (403, 404)
    sessions = hub.api("GET", "/sessions", token, params={"limit": 1000}).json()
    assert hub.sessions["erin"] not in {s["id"] for s in sessions}
    body = {"username": "mallory", "domain": "beta", "role": "user", "password": PASSWORD}
    assert hub.api("POST", "/users", token, json=body).status_code in (403, 404)
    assert hub.api("GET", "/users/mallory", hub.root_token).status_code == 404
    r = hub.api("PATCH", "/domains/beta", token, json={"description": "carol was here"})
    assert r.status_code in (403, 404)
    assert hub.api("GET", "/domains/beta", hub.root_token).json().get("description") != "carol was here"
    # The token reaches the labfleet service only: not the Hub's API
    assert hub.hub_api("GET", "/users", token).status_code == 403


def test_the_monitor_reads_everything_and_its_buttons_are_disabled(hub, browser):
    page = _sessions_page(browser, hub, "mona")
    for user in ("alice", "erin"):
        assert _stop_button(page, hub.sessions[user]).is_disabled()
    shot(page, "sessions-mona")
    page.close()


def test_a_stop_through_the_page_is_the_viewers_own(hub, browser):
    sid = hub.sessions["alice"]
    page = _sessions_page(browser, hub, "root")
    _stop_button(page, sid).click()  # it asks first
    page.wait_for_selector("text=Stop alice/(default)? Its server and kernels end", timeout=WAIT_MS)
    assert _stop_button(page, sid).inner_text().strip() == "Really stop?"
    shot(page, "sessions-root-confirm")
    assert hub.api("GET", f"/sessions/{sid}", hub.root_token).json()["status"] != "TERMINATED"
    _stop_button(page, sid).click()
    page.wait_for_selector(f"text=Stopped session alice/(default) ({sid})", timeout=WAIT_MS)
    # The list follows: a stopped session is no longer live
    page.locator(".widget-gridbox > .widget-html", has_text=sid[:8]).wait_for(
        state="detached", timeout=WAIT_MS
    )
    shot(page, "sessions-root-stopped")
    page.close()
    assert hub.api("GET", f"/sessions/{sid}", hub.root_token).json()["status"] == "TERMINATED"
    audit = hub.api("GET", "/audit", hub.root_token, params={"limit": 1000}).json()
    (entry,) = [a for a in audit if a["action"] == "session.terminate" and a["target"] == sid]
    assert entry["actor"] == "root"


def test_kernels_get_no_token_of_the_services():
    env = kernel_environment(
        {
            "JUPYTERHUB_API_TOKEN": "s",
            "JPY_API_TOKEN": "s",
            "LABFLEET_SERVICE_TOKEN": "s",
            "OAUTH_SECRET": "s",
            "PATH": "/bin",
        }
    )
    assert env == {"PATH": "/bin"}


def test_the_hubs_user_api_leaves_what_labfleet_owns_to_labfleet(hub):
    carol = hub.wait_token("carol")
    refused = [
        hub.hub_api("PATCH", "/users/alice", carol, json={"name": "alice2"}),
        hub.hub_api("DELETE", "/users/alice", carol),
        hub.hub_api("POST", "/users/newbie", carol),
        hub.hub_api("POST", "/users", carol, json={"usernames": ["newbie"]}),
        hub.hub_api("PATCH", "/users/alice", json={"admin": True}),  # the Hub's own admin token
    ]
    for r in refused:
        assert r.status_code == 403, r.text
        assert "labfleet manages users" in r.json()["message"], r.text
    assert hub.hub_api("GET", "/users/alice").json()["name"] == "alice"
    assert hub.hub_api("GET", "/users/alice2").status_code == 404
    # What labfleet does still reaches the Hub (the service creates its users there)
    assert (
        hub.api("POST", "/users", hub.root_token, json={"username": "zoe", "domain": "acme"}).status_code
        == 201
    )
    hub.wait_user("zoe")
    # A domain admin's Hub still lists their domain's users only
    names = {u["name"] for u in hub.hub_api("GET", "/users", carol).json()}
    assert "alice" in names and "erin" not in names and "dave" not in names


@pytest.mark.parametrize("name, sees", [("carol", True), ("mona", True), ("root", True), ("alice", False)])
def test_the_hubs_pages_link_the_console_for_those_who_may_open_it(hub, browser, name, sees):
    page = login(browser, hub, name)
    page.goto(f"{hub.url}/hub/home")
    page.wait_for_selector("nav", timeout=WAIT_MS)
    link = page.locator("a.nav-link", has_text="Fleet admin")
    assert link.count() == (1 if sees else 0)
    # One way to the console (the Hub's Services menu leaves it out), and to the Fleet home for all
    assert page.locator("nav a[href*='services/labfleet-admin']").count() == (1 if sees else 0)
    fleet = page.locator("nav a[href$='services/labfleet/']")
    assert fleet.count() == 1 and fleet.inner_text() == "Fleet"
    assert page.locator("nav a.nav-link[href$='/hub/admin']").count() == (1 if name != "alice" else 0)
    if sees and name == "carol":
        shot(page, "hub-navbar-carol")
        link.click()
        page.wait_for_selector(".lf-card", timeout=WAIT_MS)
    page.close()


def test_the_statistics_page_plots_usage_and_exports_csv(hub, browser):
    deadline = time.monotonic() + 60  # the service's usage job accrues the live sessions
    while not hub.api("GET", "/usage", hub.root_token).json()["rows"]:
        assert time.monotonic() < deadline, "no usage accrued"
        time.sleep(1)
    page = login(browser, hub, "root")
    page.goto(f"{hub.url}/services/labfleet-admin/statistics")
    page.wait_for_selector("text=Top users by GPU time held", timeout=WAIT_MS)
    page.wait_for_selector(".labfleet-usage", timeout=WAIT_MS)
    page.locator(".labfleet-usage svg:visible").first.wait_for(timeout=WAIT_MS)  # a plot is drawn
    link = page.locator("a[download]")
    link.wait_for(timeout=WAIT_MS)
    assert link.get_attribute("download") == "labfleet-usage-project.csv"
    assert link.get_attribute("href").startswith("data:text/csv;base64,")
    body = page.inner_text("body")
    assert "erin" in body and "Viewing as root (superadmin)" in body
    shot(page, "statistics-root")
    page.close()


PAGES = ["admin", "users", "sessions", "scheduler", "resources", "policies", "environments", "storage"]
PAGES += ["statistics", "configurations", "maintenance", "information", "serving"]


VIEWERS = {"root": "superadmin", "carol": "admin", "mona": "monitor"}


def test_every_page_opens_for_each_kind_of_admin(hub, browser):
    """Each page renders as each kind of viewer (no error from the service, no traceback) and is
    saved. The three viewers, each in a browser context of their own, ask for a page at once; then
    each of their pages is checked."""
    pages = {name: login(browser, hub, name) for name in VIEWERS}
    answers: dict[str, list[int]] = {name: [] for name in VIEWERS}  # their documents' statuses, in order
    for name, page in pages.items():
        page.on(
            "response",
            lambda r, seen=answers[name]: (
                seen.append(r.status) if r.request.is_navigation_request() else None
            ),
        )
    for key in PAGES:
        for name, page in pages.items():  # all three on their way before any is waited for
            answers[name].clear()
            # The old document is marked: the new one (after any redirect) is not.
            page.evaluate(
                "url => { window.lfLeaving = true; window.location.href = url }",
                f"{hub.url}/services/labfleet-admin/{key}",
            )
        for name, page in pages.items():
            page.wait_for_function("() => !window.lfLeaving && document.readyState === 'complete'")
            assert answers[name] and answers[name][-1] == 200, (name, key, answers[name])
            page.wait_for_selector(f"text=Viewing as {name} ({VIEWERS[name]})", timeout=WAIT_MS)
            page.wait_for_load_state("networkidle", timeout=WAIT_MS)
            text = page.inner_text("body")
            assert "Traceback" not in text and "The labfleet service said" not in text, (
                name,
                key,
                text[:500],
            )
            if (
                key == "resources"
            ):  # sessions over their GPU share (none here), each group's policy in the form
                assert "Sessions over their GPU share" in text and "Over GPU share" in text, text[:2000]
            shot(page, f"page-{key}-{name}")
    for page in pages.values():
        page.close()


def test_a_plain_user_gets_403_on_every_page(hub, browser):
    page = login(browser, hub, "alice")
    for key in PAGES:
        response = page.goto(f"{hub.url}/services/labfleet-admin/{key}")
        assert response is not None and response.status == 403, key
    page.close()


# What JupyterHub's admin page (/hub/admin) offers that labfleet or the Hub refuses the viewer.
ALWAYS_REFUSED = ["Add Users", "Edit User", "Delete user"]
SERVER_BUTTONS = ["Start All", "Stop All", "Start Server", "Stop Server", "Spawn Page"]
GROUP_CHANGES = ["New Group", "Add user", "Add Item", "Apply", "Delete Group"]
HUB_ADMIN = {
    "mona": ALWAYS_REFUSED + ["Shutdown Hub"] + SERVER_BUTTONS,
    "carol": ALWAYS_REFUSED + ["Shutdown Hub"],
    "root": ALWAYS_REFUSED,
}


def buttons(page) -> set[str]:
    return {t.strip() for t in page.locator("#react-admin-hook button:visible").all_inner_texts()}


@pytest.mark.parametrize("name", ["mona", "carol", "root"])
def test_the_hub_admin_page_offers_only_what_the_viewer_may_do(hub, browser, name):
    page = login(browser, hub, name)
    page.goto(f"{hub.url}/hub/admin")
    page.wait_for_selector("#react-admin-hook >> text=alice", timeout=WAIT_MS)
    page.wait_for_selector("#react-admin-hook button:has-text('Manage Groups')", timeout=WAIT_MS)
    shown = buttons(page)
    assert not shown & set(HUB_ADMIN[name]), (name, shown)
    if name != "mona":  # what they may do is still there
        assert {"Start All", "Stop All", "Start Server", "Spawn Page"} <= shown, shown
    assert ("Shutdown Hub" in shown) == (name == "root")
    # The note says where users are managed, and links the console's Users page
    note = page.locator("#labfleet-admin-note")
    assert "labfleet manages users" in note.inner_text()
    assert note.locator("a").get_attribute("href") == "/services/labfleet-admin/users"
    assert ("Read only" in note.inner_text()) == (name == "mona")
    shot(page, f"hub-admin-{name}")
    # The app draws again (a search, another view and back): what was hidden stays hidden
    page.fill("input[name=user_search]", "ali")
    page.wait_for_selector("[data-testid=user-row-alice]", timeout=WAIT_MS)
    page.wait_for_selector("[data-testid=user-row-carol]", state="detached", timeout=WAIT_MS)
    page.click("#react-admin-hook button:has-text('Manage Groups')")
    page.click("#react-admin-hook a:has-text('domain:acme')")
    page.wait_for_selector("#react-admin-hook >> text=Editing Group", timeout=WAIT_MS)
    group = buttons(page)
    assert (group & set(GROUP_CHANGES)) == (set(GROUP_CHANGES) - {"New Group"} if name == "root" else set())
    page.go_back()
    page.go_back()
    page.wait_for_selector("[data-testid=user-row-alice]", timeout=WAIT_MS)
    assert not buttons(page) & set(HUB_ADMIN[name]), buttons(page)
    page.close()


def test_the_hub_admin_page_shows_labfleets_reason_for_a_refusal(hub, browser):
    page = login(browser, hub, "root")
    # The form is only reached by its address now; trying it shows why labfleet refuses.
    page.goto(f"{hub.url}/hub/admin#/add-users")
    page.fill("#add-user-textarea", "newbie")
    page.click("#react-admin-hook button:has-text('Add Users')")
    alert = page.locator("#labfleet-admin-error")
    alert.wait_for(state="visible", timeout=WAIT_MS)
    text = alert.inner_text()
    assert "(403)" in text and "labfleet manages users: create users in the Fleet admin console" in text, text
    assert hub.hub_api("GET", "/users/newbie").status_code == 404
    shot(page, "hub-admin-refused-root")
    alert.locator("button[aria-label=Close]").click()
    alert.wait_for(state="hidden", timeout=WAIT_MS)
    page.close()
