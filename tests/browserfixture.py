"""Chromium for the browser tests (Debian's, through Playwright) and the steps they share: log in
through the Hub's form, open an admin console page, take a whole-page screenshot, create people.

The module-scoped ``browser`` fixture lives in tests/conftest.py and comes from :func:`chromium`.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tests.hubfixture import ADMIN_PASSWORD

CHROMIUM = "/usr/bin/chromium"
# Debian's Chromium, headless, with nothing that phones home (NOTES.md).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--disable-dev-shm-usage",
]
WAIT_MS = 60_000
# Where a login lands: the Fleet home (the Hub's default_url), or the Hub page it was sent from;
# not the login form itself, nor a step of the service's OAuth login on the way.
LANDED = re.compile(r".*/(services/labfleet/(?!oauth_callback)|hub/(?!login|api/oauth2)).*")


def wait_landed(page: Any) -> None:
    """Wait until the login form's answer has landed (the Fleet home or a Hub page)."""
    page.wait_for_url(LANDED, timeout=WAIT_MS)


def chromium() -> Iterator[Any]:
    """A launched Chromium for as long as the generator is open."""
    from playwright.sync_api import sync_playwright

    assert shutil.which(CHROMIUM), "Chromium is missing: bash scripts/setup.sh --test installs it"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def hub_login(browser: Any, hub: Any, name: str, password: str, *, width: int = 1280, own_context=False):
    """A new page logged in to the Hub as ``name`` through its login form (``root`` uses the
    admin password whatever ``password`` says). ``own_context``: a fresh browser context (its
    own cookies), for a test that logs several people in at once."""
    viewport = {"width": width, "height": 900}
    page = (
        browser.new_context(viewport=viewport).new_page()
        if own_context
        else browser.new_page(viewport=viewport)
    )
    page.set_default_timeout(WAIT_MS)
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", name)
    page.fill("#password_input", ADMIN_PASSWORD if name == "root" else password)
    page.click("#login_submit")
    wait_landed(page)
    return page


def console_page(page: Any, hub: Any, path: str, ready: str) -> Any:
    """Open the admin console's ``path`` on a logged-in ``page`` and wait for ``ready``; the
    service must not have refused anything the page asked."""
    page.goto(f"{hub.url}/services/labfleet-admin/{path}")
    page.wait_for_selector("text=Viewing as", timeout=WAIT_MS)
    page.wait_for_selector(ready, state="attached", timeout=WAIT_MS)
    assert "The labfleet service said" not in page.inner_text("body")
    return page


def whole_page_shot(page: Any, path: Path, *, width: int = 1400, max_height: int = 6000) -> None:
    """A screenshot of the whole page: Voila scrolls inside the page, so the viewport grows to it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    height = page.evaluate("Math.max(...Array.from(document.querySelectorAll('*'), e => e.scrollHeight))")
    page.set_viewport_size({"width": width, "height": min(max(int(height) + 40, 900), max_height)})
    page.screenshot(path=str(path), full_page=True)


def create_people(
    hub: Any, token: str, people: Iterable[tuple[str, str, str, list[str]]], password: str
) -> None:
    """(name, domain, role, projects) each made a labfleet user with ``password``."""
    for name, domain, role, projects in people:
        body = {"username": name, "domain": domain, "role": role, "projects": projects, "password": password}
        r = hub.api("POST", "/users", token, json=body)
        assert r.status_code == 201, r.text
