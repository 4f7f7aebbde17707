"""The Fleet sidebar in a real browser: Debian's Chromium driven by Playwright, against the real Hub.

alice logs in on the Hub's login page, starts a session with 0.5 of a mock GPU from the spawn form, opens
the Fleet sidebar in JupyterLab, where the Start section's import form shows the service's refusal of a
file:// URL and follows an import of a repository (from a git server on 127.0.0.1) to its report and "Open",
and a folder's "Share as a link" dialog writes the Hub's import link and badges; she sees her session's
resources and the quota bars, her usage plotted (the
service's own numbers for the session that runs; then a month of sample numbers, a refusal and an empty
history, answered by the browser in the service's place), opens a mounted folder
in the file browser, creates a folder, starts a second session from the sidebar (with the new folder, which
its own file browser then shows) and stops it, builds an environment in My Environments (no Docker engine
here: it FAILS saying why, its log readable) and deletes it, saves this session as an environment from
This session (it FAILS saying why; a second save under the same name is refused inline), opens TensorBoard from the Apps list, and reads
the status bar, which opens the Fleet panel when clicked (or with Enter or Space). The new-session,
new-folder and new-environment forms fit the panel at its default width (no input or select runs past it, no text under a select's
arrow). Screenshots of the sidebar and the forms (light and dark themes) go to test-artifacts/browser/.

"Warn first": an idle checker with a short timeout, bound to a project of its own, brings a session's
idle reclamation within 10 minutes: the sidebar and the status bar count down to it, a notification
comes 5 minutes before it, and "I'm still here" (the notification's button, then the sidebar's) resets
the idle timer; the warning goes when the answer moves the deadline out of the last 10 minutes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.browserfixture import wait_landed
from tests.gitserver import GitServer, make_work_tree
from tests.hubfixture import start_hub

pytestmark = pytest.mark.hub

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("LABFLEET_TEST_ARTIFACTS", REPO / "test-artifacts")) / "browser"
APPS_BIN = REPO / ".labfleet-tools" / "apps" / "bin"
PASSWORD = "alice-password-1"
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    state = tmp_path_factory.mktemp("browser")
    # The service accrues the sessions' usage every 2 s (15 by default): the Usage section has numbers soon.
    # Imports may fetch from the test's git server on 127.0.0.1.
    env = {"LABFLEET_SAMPLE_INTERVAL": "2", "LABFLEET_IMPORT_ALLOWED_HOSTS": "127.0.0.1"}
    # No Docker engine for environment builds, whatever runs on this machine: a build FAILS at once, saying so.
    env["DOCKER_HOST"] = f"unix://{state}/no-docker-engine.sock"
    if APPS_BIN.is_dir():  # the app launchers find TensorBoard on the session's PATH
        env["PATH"] = f"{APPS_BIN}{os.pathsep}{os.environ['PATH']}"
    hub = start_hub(state, env=env)
    root = hub.wait_token("root")
    for path, body in [
        ("/domains", {"name": "acme", "total_resource_slots": {"gpu.shares": 4}}),
        ("/projects", {"domain": "acme", "name": "ml", "total_resource_slots": {"gpu.shares": 2}}),
        ("/users", {"username": "alice", "domain": "acme", "projects": ["ml"], "password": PASSWORD}),
    ]:
        r = hub.api("POST", path, root, json=body)
        assert r.status_code == 201, r.text
    r = hub.api("PATCH", "/policies/keypair/default", root, json={"max_session_lifetime": 8 * 3600})
    assert r.status_code == 200, r.text
    alice = hub.wait_token("alice")
    folder = hub.api("POST", "/vfolders", alice, json={"name": "data"}).json()
    put = hub.api("PUT", f"/vfolders/{folder['id']}/files/readme.txt", alice, data=b"hello from data\n")
    assert put.status_code == 201, put.text
    yield hub
    for server in ("work", "second"):
        hub.hub_api("DELETE", f"/users/alice/servers/{server}")
    hub.stop()


def tid(name: str) -> str:
    return f'[data-testid="{name}"]'


def shot(page, name: str, locator=None) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    (locator or page).screenshot(path=str(path))
    return path


def open_lab(page, url: str):
    page.goto(url)
    # JupyterLab's <body> counts as hidden: wait for the shell to be attached, then for the launcher.
    page.wait_for_selector("#jp-main-dock-panel", state="attached", timeout=WAIT_MS)
    page.wait_for_selector(".jp-DirListing-content", state="attached", timeout=WAIT_MS)


def open_fleet(page):
    tab = page.locator('li[data-id="labfleet-sidebar"]')
    tab.wait_for(state="attached", timeout=WAIT_MS)
    if "lm-mod-current" not in (tab.get_attribute("class") or ""):
        tab.click()
    page.wait_for_selector(tid("lf-sidebar"), timeout=WAIT_MS)
    return page.locator("#labfleet-sidebar")


def expand(page, section: str):
    toggle = page.locator(tid(f"lf-section-toggle-{section}"))
    if toggle.get_attribute("aria-expanded") != "true":
        toggle.click()
    page.wait_for_selector(f"{tid(f'lf-section-{section}')}.lf-open", timeout=WAIT_MS)


# Every text input and select of a form, measured in the page: each lies within the panel (its right
# edge at most the panel's content edge, a scrollbar left out), its content does not overflow it
# (scrollWidth), its text (a select's choice, an input's value and placeholder) fits between its
# paddings, or for a select ends in an ellipsis, and a select's arrow sits in its right padding, clear
# of the text. Returns the problems found, in words.
FITS_JS = """
([form, panel]) => {
  const px = v => parseFloat(v) || 0;
  const pr = panel.getBoundingClientRect();
  const panelRight = pr.left + panel.clientLeft + panel.clientWidth;
  const ctx = document.createElement('canvas').getContext('2d');
  const problems = [];
  const fr = form.getBoundingClientRect();
  if (fr.right > panelRight + 0.5) {
    problems.push(`the form's right edge ${fr.right} is past the panel's ${panelRight}`);
  }
  const fields = form.querySelectorAll('input:not([type=checkbox]):not([type=hidden]), select');
  if (!fields.length) {
    problems.push('no input or select in the form');
  }
  for (const el of fields) {
    const name = el.dataset.testid || el.id || el.tagName;
    const r = el.getBoundingClientRect();
    const cs = getComputedStyle(el);
    if (r.width < 40) {
      problems.push(`${name}: only ${r.width}px wide`);
    }
    if (r.right > panelRight + 0.5 || r.right > fr.right + 0.5 || r.left < pr.left) {
      problems.push(`${name}: ${r.left}..${r.right} is not within the panel (${pr.left}..${panelRight})`);
    }
    if (el.scrollWidth > el.clientWidth + 1) {
      problems.push(`${name}: scrollWidth ${el.scrollWidth} > clientWidth ${el.clientWidth}`);
    }
    ctx.font = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
    const room = el.clientWidth - px(cs.paddingLeft) - px(cs.paddingRight);
    const texts = el.tagName === 'SELECT'
      ? [el.selectedOptions[0] ? el.selectedOptions[0].text : '']
      : [el.value, el.placeholder];
    for (const text of texts.filter(Boolean)) {
      const w = ctx.measureText(text).width;
      const ellipsis = el.tagName === 'SELECT' && cs.textOverflow === 'ellipsis' && cs.overflowX !== 'visible';
      if (w > room + 1 && !ellipsis) {
        problems.push(`${name}: "${text}" needs ${w.toFixed(1)}px, has ${room}px`);
      }
    }
    if (el.tagName === 'SELECT') {
      const arrow = el.parentElement.querySelector('svg');
      const ar = arrow ? arrow.getBoundingClientRect() : null;
      const textRight = r.left + el.clientLeft + el.clientWidth - px(cs.paddingRight);
      if (!ar || ar.right > r.right + 0.5 || ar.left < textRight - 0.5) {
        problems.push(`${name}: the arrow (${ar && ar.left}..${ar && ar.right}) is not in the select's right padding (${textRight}..${r.right})`);
      }
    }
  }
  return problems;
}
"""


def assert_fits(page, form_selector: str):
    form = page.locator(form_selector)
    form.wait_for(timeout=WAIT_MS)
    problems = page.evaluate(
        FITS_JS, [form.element_handle(), page.locator("#labfleet-sidebar").element_handle()]
    )
    assert problems == [], f"{form_selector} does not fit the panel: {problems}"


def usage_sample(now: datetime) -> dict:
    """A month of `GET /api/usage/me` for the screenshots: half a GPU most working days, one whole-GPU run."""
    hour = 3600.0
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)

    def figures(sessions, gpu, gpu_used, cpu, cpu_used):
        eff = lambda a, u: round(u / a, 4) if a else None  # noqa: E731
        return {
            "sessions": sessions,
            "allocated": {"cpu": cpu * hour, "mem": cpu * 4 * 2**30 * hour, "gpu.shares": gpu * hour},
            "used": {
                "cpu": cpu_used * hour,
                "mem": cpu_used * 3 * 2**30 * hour,
                "mem_peak": 3 * 2**30 if sessions else 0,
                "gpu.shares": gpu_used * hour,
                "gpu_mem_peak": 20 * 2**30 if gpu else 0,
            },
            "efficiency": {
                "cpu": eff(cpu, cpu_used),
                "mem": eff(cpu, cpu_used),
                "gpu.shares": eff(gpu, gpu_used),
            },
        }

    daily = []
    for i in range(30):
        day = today - timedelta(days=29 - i)
        if i == 12:
            f = figures(1, 8, 7.2, 16, 12)  # a whole GPU for a day's training run
        elif day.weekday() < 5 and i % 3:
            f = figures(1, 0.5 * (2 + i % 4), 0.25 * (1 + i % 5), 2 + i % 4, 0.8 + 0.3 * (i % 5))
        else:
            f = figures(0, 0, 0, 0, 0)
        daily.append({"bucket": day.isoformat(), **f})

    def period(key, label, days):
        part = daily[-days:]
        tot = {k: sum(d["allocated"][k] for d in part) / hour for k in ("cpu", "gpu.shares")}
        used = {k: sum(d["used"][k] for d in part) / hour for k in ("cpu", "gpu.shares")}
        return {
            "key": key,
            "label": label,
            "start": (now - timedelta(days=days)).isoformat(),
            "end": now.isoformat(),
            **figures(
                sum(d["sessions"] for d in part),
                tot["gpu.shares"],
                used["gpu.shares"],
                tot["cpu"],
                used["cpu"],
            ),
        }

    periods = [
        period("7d", "last 7 days", 7),
        period("30d", "last 30 days", 30),
        period("month", now.strftime("%B %Y"), now.day),
    ]
    return {"user": "alice", "now": now.isoformat(), "periods": periods, "daily": daily}


def answer_usage(page, status: int, body: dict) -> None:
    """The browser answers `labfleet/api/usage/me` itself from now on (until `page.unroute`)."""
    page.route(
        "**/labfleet/api/usage/me*",
        lambda route: route.fulfill(status=status, content_type="application/json", body=json.dumps(body)),
    )


def refresh_until(page, selector: str, timeout: float = 60.0):
    """Press the panel's refresh button until `selector` shows (the usage poll waits a minute otherwise)."""
    deadline = time.monotonic() + timeout
    while not page.locator(selector).count():
        assert time.monotonic() < deadline, f"{selector} did not show within {timeout}s"
        page.locator(tid("lf-refresh")).click()
        time.sleep(1)
    return page.locator(selector)


def fleet_panel_closed(page):
    """Collapse the left area if the Fleet panel is open there (a click on its tab toggles it)."""
    tab = page.locator('li[data-id="labfleet-sidebar"]')
    if "lm-mod-current" in (tab.get_attribute("class") or ""):
        tab.click()
    page.locator("#labfleet-sidebar").wait_for(state="hidden", timeout=WAIT_MS)


def test_the_fleet_sidebar_in_jupyterlab(hub, browser, tmp_path):
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()

    # Log in and start a session with half a mock GPU and the folder `data` from the spawn form.
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", "alice")
    page.fill("#password_input", PASSWORD)
    page.click("#login_submit")
    wait_landed(page)
    page.goto(f"{hub.url}/hub/spawn/alice/work")
    page.select_option("#lf-project", "acme/ml")
    page.fill("#lf-gpu", "0.5")
    # Before Start, the form says what Start would do (the service judges, changing nothing).
    expect(page.locator("#lf-preview")).to_have_attribute("data-outcome", "starts")
    expect(page.locator("#lf-preview")).to_contain_text("starts now: fits on")
    page.fill("#lf-gpu", "3")  # more GPUs than any node has: refused before it is sent
    expect(page.locator("#lf-preview")).to_have_attribute("data-outcome", "refused")
    page.fill("#lf-gpu", "0.5")
    page.locator(".lf-vfolder", has_text="data").locator("input").check()
    page.click('form#spawn_form input[type="submit"], form#spawn_form button[type="submit"]')
    page.wait_for_url("**/user/alice/work/**", timeout=WAIT_MS)
    open_lab(page, f"{hub.url}/user/alice/work/lab")
    sidebar = open_fleet(page)

    # Start, the first section: importing from a URL the service does not take shows its refusal, in its words.
    expand(page, "start")
    start = page.locator(tid("lf-section-start"))
    expect(start).to_be_visible()
    page.fill(tid("lf-import-url"), "file:///etc/passwd")
    page.locator(tid("lf-import-submit")).click()
    expect(page.locator(tid("lf-import-error"))).to_contain_text("url: file scheme; an import fetches only")
    expect(page.locator(tid("lf-import-job"))).to_have_count(0)
    page.locator(f"{tid('lf-import-advanced')} > summary").click()  # branch, path to open
    assert_fits(page, tid("lf-import-form"))
    shot(page, "sidebar-start-light", start)
    # A repository from a git server on 127.0.0.1 into `data`, which this session mounts: the job is asked about
    # every second; once done, its report, and "Open" opens the file here.
    with GitServer(tmp_path / "srv") as git_server:
        url = git_server.publish(
            make_work_tree(tmp_path / "w", {"intro.md": "# Intro\n", "a.py": "x = 1\n"}), "course.git"
        )
        page.fill(tid("lf-import-url"), url)
        page.locator(tid("lf-import-folder")).select_option(label="data")
        page.fill(tid("lf-import-open-path"), "intro.md")
        page.locator(tid("lf-import-submit")).click()
        expect(page.locator(tid("lf-import-job"))).to_have_attribute("data-status", "done", timeout=WAIT_MS)
    expect(page.locator(tid("lf-import-status"))).to_have_text("Imported into folder data")
    expect(page.locator(tid("lf-import-report-counts"))).to_have_text("1 updated, 0 kept, 0 renamed")
    page.locator(f"{tid('lf-import-report-names')} > summary").click()
    shot(page, "sidebar-start-done-light", start)
    page.locator(tid("lf-import-open")).click()
    current_tab = page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current")
    expect(current_tab).to_contain_text("intro.md")
    current_tab.locator(".lm-TabBar-tabCloseIcon").click()  # the launcher is in front again
    # The file browser went to the folder: back to the root, where the Folders step below starts.
    expect(page.locator(".jp-FileBrowser .jp-BreadCrumbs")).to_contain_text("course")
    page.locator(".jp-FileBrowser .jp-BreadCrumbs-home").click()
    expect(page.locator(".jp-FileBrowser .jp-BreadCrumbs")).not_to_contain_text("data")
    open_fleet(page)
    page.locator(tid("lf-section-toggle-start")).click()  # out of the way of the next screenshots
    # "Share as a link" (a folder's action): the Hub's import link and badges in a dialog.
    page.locator(tid("lf-folder-data")).locator(tid("lf-folder-share-link")).click()
    dialog = page.locator(".jp-Dialog")
    dialog.locator(tid("lf-share-link-url")).fill("https://git.example.org/course.git")
    dialog.locator(tid("lf-share-link-open")).fill("intro.ipynb")
    link = f"{hub.url}/hub/labfleet/import?url=https%3A%2F%2Fgit.example.org%2Fcourse.git&open=intro.ipynb"
    expect(dialog.locator(tid("lf-share-link-plain"))).to_have_value(link)
    badge = f"{hub.url}/services/labfleet/static/badge.svg"
    expect(dialog.locator(tid("lf-share-link-markdown"))).to_have_value(
        f"[![Run on labfleet]({badge})]({link})"
    )
    shot(page, "dialog-share-link-light", dialog.locator(".jp-Dialog-content"))
    dialog.locator(".jp-mod-accept").click()
    expect(dialog).to_have_count(0)

    # This session: project, resources and the device share.
    expand(page, "session")
    expect(page.locator(tid("lf-this-project"))).to_contain_text("acme/ml")
    expect(page.locator(tid("lf-this-devices"))).to_contain_text("0.5 of GPU 0")
    expect(page.locator(tid("lf-this-devices"))).to_contain_text("A100")
    # How the share holds: the mock node runs no MPS daemon, so the frameworks' caps only.
    share = page.locator(tid("lf-this-gpu-share"))
    expect(share).to_contain_text("0.5 of a GPU")
    expect(share).to_contain_text("framework caps only (advisory)")
    expect(page.locator(tid("lf-this-time-left"))).to_contain_text("7h 5")  # of an 8-hour lifetime
    # Quota: a bar per slot for me, the project and the domain; the project has 0.5 of 2 GPU shares in use.
    expand(page, "quota")
    bar = page.locator(f'{tid("lf-quota-project-gpu.shares")} .lf-bar[role="progressbar"]')
    expect(bar).to_have_attribute("aria-valuenow", "25")  # percent
    expect(bar).to_have_attribute("aria-valuetext", "0.5 / 2 · 1.5 left")
    expect(page.locator(tid("lf-quota-domain"))).to_be_visible()
    expect(page.locator(tid("lf-quota-keypair"))).to_be_visible()
    # Beside what the quota allows, what the fleet can give one session now, this session's group first: of
    # the Hub host's two mock GPUs, this session holds half of GPU 0, so 1 whole GPU (GPU 1) is free.
    free = page.locator(f"{tid('lf-quota-free')} [data-group]").first
    expect(free).to_have_attribute("data-own", "true")
    expect(free).to_have_text(
        re.compile(
            r"^Free now in default \(this session's group\): [\d.]+ cores?, [\d.]+ [KMGT]?i?B, "
            r"1 whole GPU, up to 1 of one GPU$"
        )
    )
    shot(page, "sidebar-session-quota-light", sidebar)

    # Usage: the service's own numbers for the session that runs (it accrues every 2 s here): a pair of bars
    # (allocated, used) per period for GPU-hours and CPU-hours, and a bar a day for the last 30 days.
    expand(page, "usage")
    gpu_week = refresh_until(page, tid("lf-usage-gpu-7d"))
    assert float(gpu_week.get_attribute("data-allocated")) > 0
    expect(page.locator(tid("lf-error-usage"))).to_have_count(0)
    expect(page.locator(tid("lf-usage-gpu-30d"))).to_be_visible()
    expect(page.locator(tid("lf-usage-cpu-7d"))).to_be_visible()
    gpu_days = page.locator(f"{tid('lf-usage-gpu-daily')} {tid('lf-usage-day')}")
    expect(gpu_days).to_have_count(30)
    assert float(gpu_days.last.get_attribute("data-allocated")) > 0  # today
    usage = page.locator(tid("lf-section-usage"))
    usage.scroll_into_view_if_needed()
    shot(page, "sidebar-usage-light", usage)
    # A month of numbers (answered by the browser in the service's place): the plots at their fullest.
    answer_usage(page, 200, usage_sample(datetime.now(timezone.utc)))
    refresh_until(page, f'{tid("lf-usage-gpu-daily-top")}:has-text("10 h")')
    # The bars fit the panel: each plot lies within the section, the 30 days take its width.
    box, chart = usage.bounding_box(), page.locator(f"{tid('lf-usage-gpu-daily')} svg").bounding_box()
    assert (
        box
        and chart
        and chart["x"] >= box["x"]
        and chart["x"] + chart["width"] <= box["x"] + box["width"] + 0.5
    )
    assert chart["width"] > 150, chart
    shot(page, "sidebar-usage-sample-light", usage)
    # The service refuses: its words, no plot.
    page.unroute("**/labfleet/api/usage/me*")
    answer_usage(page, 403, {"message": "usage statistics are not enabled for domain acme"})
    expect(refresh_until(page, tid("lf-error-usage"))).to_have_text(
        "usage statistics are not enabled for domain acme"
    )
    shot(page, "sidebar-usage-error-light", usage)
    # Nothing yet: said so.
    page.unroute("**/labfleet/api/usage/me*")
    empty = usage_sample(datetime.now(timezone.utc))
    for f in [*empty["periods"], *empty["daily"]]:
        f.update(sessions=0, allocated={}, used={}, efficiency={})
    answer_usage(page, 200, empty)
    expect(refresh_until(page, tid("lf-usage-empty"))).to_contain_text("No usage yet")
    expect(page.locator(tid("lf-error-usage"))).to_have_count(0)
    shot(page, "sidebar-usage-empty-light", usage)
    page.unroute("**/labfleet/api/usage/me*")
    refresh_until(page, tid("lf-usage-gpu-7d"))

    # Folders: the mounted one opens in the file browser.
    expand(page, "folders")
    data = page.locator(tid("lf-folder-data"))
    expect(data).to_have_attribute("data-mounted", "true")
    data.locator(tid("lf-folder-open")).click()
    expect(page.locator(".jp-DirListing-content")).to_contain_text("readme.txt")
    expect(page.locator(".jp-FileBrowser .jp-BreadCrumbs")).to_contain_text("data")
    open_fleet(page)
    # The new-folder form fits the panel at its default width; a new folder appears in the list.
    page.locator(tid("lf-folder-create-toggle")).click()
    assert_fits(page, tid("lf-folder-create"))
    page.locator(tid("lf-folder-create")).scroll_into_view_if_needed()
    shot(page, "form-new-folder-light", page.locator(tid("lf-folder-create")))
    shot(page, "sidebar-new-folder-light", sidebar)
    page.fill(tid("lf-folder-create-name"), "results")
    page.locator(tid("lf-folder-create-submit")).click()
    expect(page.locator(tid("lf-folder-results"))).to_be_visible()
    shot(page, "sidebar-folders-light", sidebar)

    # Sessions: start a second one with the new folder; the cost shows before it is sent.
    expand(page, "sessions")
    expect(page.locator(tid("lf-session-work"))).to_have_attribute("data-status", "RUNNING")
    page.locator(tid("lf-new-session-toggle")).click()
    expect(page.locator(tid("lf-ns-image"))).to_be_visible()  # the choices are loaded
    assert_fits(page, tid("lf-new-session-form"))
    page.fill(tid("lf-ns-name"), "second")
    page.select_option(tid("lf-ns-project"), "acme/ml")
    page.fill(tid("lf-ns-gpu"), "0.25")
    page.locator(tid("lf-ns-vfolder-results")).check()
    expect(page.locator(tid("lf-ns-cost"))).to_contain_text("0.25")
    # Beside the quota, what the group can give now; and, before Start, what Start would do.
    expect(page.locator(tid("lf-ns-free"))).to_contain_text("whole GPU")
    expect(page.locator(tid("lf-ns-preview"))).to_have_attribute("data-outcome", "starts")
    expect(page.locator(tid("lf-ns-preview"))).to_contain_text("starts now: fits on")
    assert_fits(page, tid("lf-new-session-form"))
    page.locator(tid("lf-new-session-form")).scroll_into_view_if_needed()
    shot(page, "form-new-session-light", page.locator(tid("lf-new-session-form")))
    shot(page, "sidebar-new-session-light", sidebar)
    page.locator(tid("lf-ns-submit")).click()
    second = page.locator(tid("lf-session-second"))
    expect(second).to_have_attribute("data-status", "RUNNING", timeout=90_000)
    expect(page.locator(tid("lf-ns-started"))).to_have_count(0)  # the row now says how it stands
    shot(page, "sidebar-sessions-light", sidebar)
    # The second session's own file browser shows the new folder.
    other = context.new_page()
    open_lab(other, f"{hub.url}/user/alice/second/lab/tree/vfolders")
    expect(other.locator(".jp-DirListing-content")).to_contain_text("results")
    other.close()
    # Stop it from the sidebar (with a confirmation).
    second.locator(tid("lf-session-stop")).click()
    dialog = page.locator(".jp-Dialog")
    if dialog.count():
        dialog.locator(".jp-mod-accept").click()
    expect(page.locator(tid("lf-session-second"))).to_have_count(0, timeout=90_000)

    # My Environments: a refusal in the service's words, then a build of a requirements.txt on the registered
    # base (the launch options' images less `env:...`). With no Docker engine it FAILS saying why, its log
    # stays to read; then it is deleted (with a confirmation).
    expand(page, "environments")
    envs = page.locator(tid("lf-section-environments"))
    expect(page.locator(tid("lf-environments-empty"))).to_be_visible()
    page.locator(tid("lf-env-build-toggle")).click()
    expect(page.locator(f'{tid("lf-env-base")} option[value="local/host"]')).to_have_count(1)
    expect(page.locator(f'{tid("lf-env-base")} option[value^="env:"]')).to_have_count(0)
    page.fill(tid("lf-env-name"), "Bad Name")
    page.locator(tid("lf-env-submit")).click()
    expect(page.locator(tid("lf-env-form-error"))).to_contain_text("name must be 1-64 lower-case letters")
    expect(page.locator(tid("lf-environments-empty"))).to_be_visible()  # nothing recorded
    page.fill(tid("lf-env-name"), "my-env")
    page.select_option(tid("lf-env-project"), "acme/ml")
    page.fill(tid("lf-env-requirements"), "numpy\n")
    page.locator(f"{tid('lf-env-more')} > summary").click()
    page.fill(tid("lf-env-apt"), "less\n")
    assert_fits(page, tid("lf-env-form"))
    envs.scroll_into_view_if_needed()
    shot(page, "sidebar-environments-form-light", envs)
    page.locator(tid("lf-env-submit")).click()
    row = page.locator(tid("lf-env-my-env"))
    expect(row).to_have_attribute("data-status", re.compile("^(QUEUED|BUILDING|FAILED)$"))
    expect(row.locator(tid("lf-env-meta"))).to_have_text("project acme/ml · local/host")
    row.locator(tid("lf-env-log-toggle")).click()
    expect(row).to_have_attribute("data-status", "FAILED")
    expect(row.locator(tid("lf-env-reason"))).to_contain_text("Docker engine")
    expect(row.locator(tid("lf-env-log-text"))).to_contain_text("labfleet: FAILED")
    expect(row.locator(tid("lf-env-log"))).to_have_attribute("data-live", "false")
    expect(page.locator(tid("lf-section-badge-environments"))).to_have_text("1")
    envs.scroll_into_view_if_needed()
    shot(page, "sidebar-environments-light", envs)
    row.locator(tid("lf-env-delete")).click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("Delete environment my-env?")
    dialog.locator(".jp-mod-accept").click()
    expect(row).to_have_count(0)
    expect(page.locator(tid("lf-environments-empty"))).to_be_visible()
    # Save as environment (This session): the service takes the session the Lab runs in by its id and My
    # Environments opens with the new one; a local session has no container (and here no engine either), so
    # its build FAILS saying why. A second save under the same name: the service's refusal, inline.
    page.locator(tid("lf-save-env-toggle")).click()
    page.fill(tid("lf-save-env-name"), "saved-env")
    expect(page.locator(tid("lf-save-env-project"))).to_have_value("")  # personal by default
    page.locator(tid("lf-save-env-submit")).click()
    saved = page.locator(tid("lf-env-saved-env"))
    expect(saved).to_have_attribute("data-status", re.compile("^(QUEUED|BUILDING|FAILED)$"))
    # Followed by offset (the Lab's proxy passes the log's size on); its last line asks the list again.
    with page.expect_response(lambda r: "/environments/" in r.url and "offset=" in r.url) as logs:
        saved.locator(tid("lf-env-log-toggle")).click()
    assert int(logs.value.headers["x-log-size"]) >= 0, logs.value.headers
    expect(saved).to_have_attribute("data-status", "FAILED")
    expect(saved.locator(tid("lf-env-reason"))).to_contain_text(re.compile("container|Docker engine"))
    expect(saved.locator(tid("lf-env-log-text"))).to_contain_text("labfleet: FAILED")
    note = page.locator(tid("lf-save-env-saved"))
    expect(note).to_have_attribute("data-status", "FAILED")
    expect(note).to_contain_text("Saved as saved-env: FAILED: ")
    page.locator(tid("lf-save-env-toggle")).click()
    page.fill(tid("lf-save-env-name"), "saved-env")
    page.locator(tid("lf-save-env-submit")).click()
    expect(page.locator(tid("lf-save-env-error"))).to_contain_text(
        "already have an environment named saved-env"
    )
    expect(page.locator("li.lf-environment")).to_have_count(1)  # nothing recorded
    assert_fits(page, tid("lf-save-env-form"))
    page.locator(tid("lf-save-env-form")).scroll_into_view_if_needed()
    shot(page, "sidebar-save-as-environment-light", sidebar)
    page.locator(tid("lf-save-env-cancel")).click()
    saved.scroll_into_view_if_needed()
    shot(page, "sidebar-saved-as-environment-light", sidebar)
    saved.locator(tid("lf-env-delete")).click()
    page.locator(".jp-Dialog .jp-mod-accept").click()
    expect(page.locator(tid("lf-environments-empty"))).to_be_visible()
    page.locator(tid("lf-section-toggle-environments")).click()  # collapsed, as at first

    # Apps: TensorBoard opens in a new tab through the proxy.
    expand(page, "apps")
    app = page.locator(tid("lf-app-tensorboard"))
    expect(app).to_be_visible()
    with context.expect_page() as popup:
        app.click()
    tab = popup.value
    tab.wait_for_load_state("domcontentloaded", timeout=WAIT_MS)
    assert "/user/alice/work/tensorboard/" in tab.url
    expect(tab.locator("body")).to_contain_text("TensorBoard", timeout=WAIT_MS)
    tab.close()

    # The JupyterLab launcher lists the apps too (jupyter-server-proxy's cards).
    expect(page.locator(".jp-LauncherCard", has_text="TensorBoard").first).to_be_visible()
    shot(page, "lab-launcher-light")
    # A Fleet section in the launcher: the Start section's three ways in. Import from URL opens the Fleet
    # panel (closed here first) at the Start section, its URL field focused.
    launcher_fleet = page.locator(
        ".jp-Launcher-section", has=page.locator(".jp-Launcher-sectionTitle", has_text=re.compile("^Fleet$"))
    )
    fleet_cards = launcher_fleet.locator('.jp-LauncherCard[data-category="Fleet"]')
    expect(fleet_cards.locator(".jp-LauncherCard-label")).to_have_text(
        ["Import from URL", "New session", "New folder"]
    )
    launcher_fleet.scroll_into_view_if_needed()
    shot(page, "launcher-fleet-light", launcher_fleet)
    fleet_panel_closed(page)
    expect(page.locator(tid("lf-section-start"))).not_to_have_class(re.compile(r"\blf-open\b"))
    fleet_cards.filter(has_text="Import from URL").click()
    expect(page.locator(f"{tid('lf-section-start')}.lf-open")).to_be_visible()
    expect(page.locator(tid("lf-import-url"))).to_be_focused()
    page.locator(tid("lf-section-toggle-start")).click()  # as it was, for the screenshots below

    # The status bar shows the session's GPU share and use.
    status = page.locator(tid("lf-statusbar"))
    expect(status).to_contain_text("GPU")
    assert "A100" in (status.get_attribute("title") or "")
    # The whole item is a button that opens the Fleet panel: a click anywhere on it (here its corner,
    # outside the text), Enter and Space.
    item = page.locator(".jp-StatusBar-Item.lf-statusbar")
    expect(item).to_have_attribute("role", "button")
    expect(item).to_have_attribute("tabindex", "0")
    expect(item).to_have_attribute("aria-label", re.compile(r"Open the Fleet panel.*GPU"))
    fleet = page.locator("#labfleet-sidebar")
    fleet_panel_closed(page)
    item.click(position={"x": 2, "y": 2})
    expect(fleet).to_be_visible()
    expect(page.locator('li[data-id="labfleet-sidebar"]')).to_have_class(re.compile("lm-mod-current"))
    shot(page, "lab-statusbar-opened-fleet-light")
    for key in ("Enter", "Space"):
        fleet_panel_closed(page)
        item.focus()
        page.keyboard.press(key)
        expect(fleet).to_be_visible()
        # focus moves into the panel, so that Tab goes on through its controls
        assert page.evaluate("document.querySelector('#labfleet-sidebar').contains(document.activeElement)")

    # The dark theme: the sidebar follows JupyterLab's variables.
    page.keyboard.press("Control+Shift+C")  # the command palette
    page.fill(".lm-CommandPalette-input", "Use Theme: JupyterLab Dark")
    page.keyboard.press("Enter")
    page.wait_for_function("document.body.dataset.jpThemeLight === 'false'", timeout=WAIT_MS)
    time.sleep(0.5)  # the theme's stylesheet applies after the attribute changes
    shot(page, "sidebar-dark", sidebar)
    shot(page, "lab-dark")
    # The usage plots in the dark theme, with the month of sample numbers.
    answer_usage(page, 200, usage_sample(datetime.now(timezone.utc)))
    expand(page, "usage")
    refresh_until(page, f'{tid("lf-usage-gpu-daily-top")}:has-text("10 h")')
    page.locator(tid("lf-section-usage")).scroll_into_view_if_needed()
    shot(page, "sidebar-usage-sample-dark", page.locator(tid("lf-section-usage")))
    page.unroute("**/labfleet/api/usage/me*")
    # Both forms in the dark theme: they fit as well.
    expand(page, "sessions")
    page.locator(tid("lf-new-session-toggle")).click()
    expect(page.locator(tid("lf-ns-image"))).to_be_visible()
    assert_fits(page, tid("lf-new-session-form"))
    page.locator(tid("lf-new-session-form")).scroll_into_view_if_needed()
    shot(page, "form-new-session-dark", page.locator(tid("lf-new-session-form")))
    page.locator(tid("lf-new-session-form")).get_by_role("button", name="Cancel").click()
    expect(page.locator(tid("lf-new-session-form"))).to_have_count(0)
    expand(page, "folders")
    page.locator(tid("lf-folder-create-toggle")).click()
    assert_fits(page, tid("lf-folder-create"))
    page.locator(tid("lf-folder-create")).scroll_into_view_if_needed()
    shot(page, "form-new-folder-dark", page.locator(tid("lf-folder-create")))
    shot(page, "sidebar-new-folder-dark", sidebar)
    page.locator(tid("lf-folder-create-toggle")).click()
    # The status bar item with the keyboard focus on it, then the panel it opened.
    fleet_panel_closed(page)
    page.keyboard.press("Shift")  # a key first: the focus ring shows as after Tab, not as after a click
    item.focus()
    shot(page, "statusbar-focused-dark", page.locator(".jp-StatusBar-Widget"))
    page.keyboard.press("Enter")
    expect(fleet).to_be_visible()
    shot(page, "lab-statusbar-opened-fleet-dark")

    # The notebook widgets, rendered by Voila inside the session with the real service.
    home = hub.state / "homes" / "alice"
    shutil.copy(REPO / "widgets" / "examples" / "fleet.ipynb", home / "fleet.ipynb")
    voila = context.new_page()
    voila.goto(f"{hub.url}/user/alice/work/voila/render/fleet.ipynb")
    expect(voila.locator(".labfleet-widget").first).to_be_visible(timeout=90_000)
    expect(voila.locator("body")).to_contain_text("acme/ml")
    expect(voila.locator("body")).not_to_contain_text("Traceback")
    time.sleep(1)  # the widgets' first refresh fills their rows
    shot(voila, "voila-widgets", None)
    context.close()


COUNTDOWN = re.compile(r"^(\d):(\d\d)$")


def countdown_seconds(page) -> int:
    """The sidebar's idle countdown (M:SS) in seconds."""
    text = page.locator(tid("lf-idle-countdown")).inner_text().strip()
    m = COUNTDOWN.match(text)
    assert m, f"the countdown reads {text!r}, not M:SS"
    return int(m.group(1)) * 60 + int(m.group(2))


def is_still_here(response) -> bool:
    """The POST of "I'm still here" (the page adds a query to every URL it asks, against caches)."""
    return "/labfleet/session/still-here" in response.url and response.request.method == "POST"


def toast_settled(page, toast) -> None:
    """Wait until a notification toast has slid in (its whole box within the window)."""
    width = page.viewport_size["width"]
    deadline = time.monotonic() + 10
    while True:
        box = toast.bounding_box()
        if box and box["x"] >= 0 and box["x"] + box["width"] <= width:
            time.sleep(0.3)
            if toast.bounding_box() == box:
                return
        assert time.monotonic() < deadline, f"the toast did not settle: {box}"
        time.sleep(0.1)


def use_theme(page, theme: str) -> None:
    """Switch JupyterLab's theme from the command palette ("JupyterLab Light", "JupyterLab Dark"); a
    user's choice stays in their settings, so a test that wants one theme says so."""
    light = "true" if "Light" in theme else "false"
    if page.evaluate("document.body.dataset.jpThemeLight") == light:
        return
    page.keyboard.press("Control+Shift+C")  # the command palette
    page.fill(".lm-CommandPalette-input", f"Use Theme: {theme}")
    page.keyboard.press("Enter")
    page.wait_for_function(f"document.body.dataset.jpThemeLight === '{light}'", timeout=WAIT_MS)
    time.sleep(0.5)  # the theme's stylesheet applies after the attribute changes


def set_idle_timeout(hub, root: str, name: str, timeout: float) -> None:
    r = hub.api("PATCH", f"/idle-checkers/{name}", root, json={"options": {"timeout": timeout}})
    assert r.status_code == 200, r.text


def test_the_idle_warning_in_jupyterlab(hub, browser):
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    root = hub.wait_token("root")
    # A project of its own, so that the short idle timeout below applies to this test's session only.
    r = hub.api("POST", "/projects", root, json={"domain": "acme", "name": "idle"})
    assert r.status_code == 201, r.text
    r = hub.api("POST", "/projects/acme/idle/members", root, json={"username": "alice"})
    assert r.status_code == 201, r.text
    checker = "browser-idle"
    # 9 minutes without activity: the deadline is inside the last 10 minutes from the start.
    r = hub.api(
        "POST",
        "/idle-checkers",
        root,
        json={
            "name": checker,
            "kind": "activity",
            "options": {"timeout": 540},
            "bindings": [{"scope": "project", "name": "acme/idle"}],
        },
    )
    assert r.status_code == 201, r.text
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    try:
        r = hub.hub_api("POST", "/users/alice/servers/idle", json={"project": "acme/idle"})
        assert r.status_code in (201, 202), r.text
        page.goto(f"{hub.url}/hub/login")
        page.fill("#username_input", "alice")
        page.fill("#password_input", PASSWORD)
        page.click("#login_submit")
        wait_landed(page)
        deadline = time.monotonic() + 90
        while not (hub.hub_api("GET", "/users/alice").json()["servers"].get("idle") or {}).get("ready"):
            assert time.monotonic() < deadline, f"the session never became ready\n{hub.log_text()[-3000:]}"
            time.sleep(0.3)
        open_lab(page, f"{hub.url}/user/alice/idle/lab")
        use_theme(page, "JupyterLab Light")  # the sidebar test leaves alice's Lab dark
        sidebar = open_fleet(page)
        expand(page, "session")
        expect(page.locator(tid("lf-this-project"))).to_have_text("acme/idle")

        # The warning: a countdown under 10:00 that ticks in the page, why, and the button.
        warning = page.locator(tid("lf-idle-warning"))
        expect(warning).to_be_visible()
        expect(page.locator(tid("lf-idle-title"))).to_contain_text(
            "This session will be stopped for inactivity in "
        )
        first = countdown_seconds(page)
        assert 0 < first < 600, first
        time.sleep(2.2)
        second = countdown_seconds(page)
        assert 1 <= first - second <= 4, (first, second)
        expect(page.locator(tid("lf-idle-why"))).to_contain_text(f'the idle checker "{checker}"')
        expect(page.locator(tid("lf-idle-why"))).to_contain_text("9 minutes without activity")
        expect(page.locator(tid("lf-section-badge-session"))).to_have_text(
            re.compile(r"^idle: stops in \d:\d\d$")
        )
        expect(page.locator(tid("lf-still-here"))).to_have_text("I'm still here")
        shot(page, "sidebar-idle-warning-light", sidebar)
        shot(page, "sidebar-idle-warning-section-light", page.locator(tid("lf-section-session")))
        # The status bar counts down as well.
        status_idle = page.locator(tid("lf-statusbar-idle"))
        expect(status_idle).to_have_text(re.compile(r"^idle: stops in \d:\d\d$"))
        expect(page.locator(".jp-StatusBar-Item.lf-statusbar")).to_have_attribute(
            "aria-label", re.compile(r"stopped for inactivity in about \d+ min\)$")
        )
        shot(page, "statusbar-idle-warning-light", page.locator(".jp-StatusBar-Left"))
        shot(page, "lab-idle-warning-light")

        # 5 minutes or less: a notification with its own "I'm still here"; its click resets the idle timer.
        set_idle_timeout(hub, root, checker, 290)
        toast = page.locator(".Toastify__toast", has_text="will be stopped for inactivity in")
        expect(toast).to_be_visible()
        expect(toast).to_contain_text(re.compile(r"in about \d minutes? \(at "))
        # JupyterLab's own question about its news, when it shows, is answered: not in the picture.
        news = page.locator(".Toastify__toast", has_text="official Jupyter news")
        if news.count():
            news.get_by_role("button", name="No", exact=True).click()
            expect(news).to_have_count(0)
        toast_settled(page, toast)
        shot(page, "lab-idle-notification-light")
        shot(page, "toast-idle-notification-light", toast)
        with page.expect_response(is_still_here) as answer:
            toast.locator(".jp-toast-button", has_text="I'm still here").click()
        assert answer.value.status == 200, answer.value.text()
        idle = answer.value.json()
        assert idle["idle_for"] < 5 and idle["timeout"] == 290, idle
        expect(toast).to_have_count(0)
        # Still inside the window (the rule's timeout is under 10 minutes): the countdown starts again.
        expect(page.locator(tid("lf-idle-countdown"))).to_have_text(re.compile(r"^4:[45]\d$"))
        # The warning in the dark theme.
        use_theme(page, "JupyterLab Dark")
        shot(page, "sidebar-idle-warning-dark", page.locator(tid("lf-section-session")))
        shot(page, "statusbar-idle-warning-dark", page.locator(".jp-StatusBar-Left"))
        use_theme(page, "JupyterLab Light")

        # A timeout just over 10 minutes: the warning shows once 5 s have gone without activity, and
        # "I'm still here" in the sidebar moves the deadline out of the last 10 minutes: the warning goes.
        set_idle_timeout(hub, root, checker, 605)
        expect(page.locator(tid("lf-idle-countdown"))).to_have_text(re.compile(r"^9:\d\d$"), timeout=90_000)
        with page.expect_response(is_still_here) as answer:
            page.locator(tid("lf-still-here")).click()
        assert answer.value.status == 200, answer.value.text()
        idle = answer.value.json()
        reclaim_at = datetime.fromisoformat(idle["reclaim_at"])
        assert (reclaim_at - datetime.now(timezone.utc)).total_seconds() > 600, idle
        expect(warning).to_have_count(0)
        expect(status_idle).to_have_count(0)
        expect(page.locator(tid("lf-section-badge-session"))).to_have_text("RUNNING")
        shot(page, "sidebar-idle-after-still-here-light", sidebar)
        # The service recorded both, as the user's own.
        audit = hub.api("GET", "/audit", root, params={"action": "session.still-here"})
        assert audit.status_code == 200, audit.text
        assert len([row for row in audit.json() if "alice" in row["actor"]]) >= 2, audit.json()
    finally:
        context.close()
        hub.api("DELETE", f"/idle-checkers/{checker}", root)
        hub.hub_api("DELETE", "/users/alice/servers/idle")
