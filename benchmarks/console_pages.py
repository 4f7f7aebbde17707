#!/usr/bin/env python3
"""Admin console page times: how long each Voila dashboard takes to show, cold and warm.

Method: a real Hub (tests/hubfixture.py: the embedded config, SQLite, two mock GPUs) with a domain,
a project, ``--users`` users and a few sessions holding GPU shares; root logs in with Debian's
Chromium (Playwright) and opens each page of the console ``--repeat`` times. A page counts as shown
when its viewer line ("Viewing as ...") and its own content are visible (the widgets are drawn in
the browser, after Voila ran the notebook in a fresh kernel). The first opening of the first page
also starts the console's jupyter-server (its first Voila import and template), hence "cold";
the others are warm. Times are wall-clock from ``page.goto`` to the content, in seconds.

Usage::

    python benchmarks/console_pages.py [--repeat 3] [--users 50] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.hubfixture import ADMIN_PASSWORD, start_hub  # noqa: E402
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS  # noqa: E402

# page -> a selector that is there once the page's own content is drawn
PAGES = {
    "admin": ".lf-card",
    "sessions": ".widget-gridbox",
    "resources": "text=GPU occupancy",
    "scheduler": "text=Viewing as",
    "statistics": "text=Top users by GPU-hours held",
    "users": "text=Viewing as",
    "policies": "text=Viewing as",
    "environments": "text=Viewing as",
    "storage": "text=Viewing as",
    "maintenance": "text=Viewing as",
    "information": "text=Viewing as",
    "configurations": "text=Viewing as",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--users", type=int, default=50)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    state = Path(tempfile.mkdtemp(prefix="lf-console-bench-"))
    hub = start_hub(state)
    try:
        root = hub.wait_token("root")
        for path, body in [("/domains", {"name": "acme"}), ("/projects", {"domain": "acme", "name": "ml"})]:
            assert hub.api("POST", path, root, json=body).status_code == 201
        for i in range(args.users):
            body = {"username": f"user{i:03d}", "domain": "acme", "projects": ["ml"]}
            assert hub.api("POST", "/users", root, json=body).status_code == 201
        for i in range(4):
            body = {
                "username": f"user{i:03d}",
                "project": "acme/ml",
                "slots": {"gpu.shares": 0.25, "cpu": 0.5},
            }
            assert hub.api("POST", "/sessions", hub.service_token, json=body).status_code == 201
        times: dict[str, list[float]] = {p: [] for p in PAGES}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{hub.url}/hub/login")
            page.fill("#username_input", "root")
            page.fill("#password_input", ADMIN_PASSWORD)
            page.click("#login_submit")
            page.wait_for_url("**/hub/**", timeout=60_000)
            for _ in range(args.repeat):
                for name, selector in PAGES.items():
                    t = time.monotonic()
                    response = page.goto(f"{hub.url}/services/labfleet-admin/{name}")
                    if response is None or response.status >= 400:
                        continue  # a page not built yet
                    page.wait_for_selector("text=Viewing as", timeout=60_000)
                    page.wait_for_selector(selector, timeout=60_000)
                    times[name].append(time.monotonic() - t)
            browser.close()
    finally:
        hub.stop()
    out = {
        name: {
            "cold_s": round(ts[0], 2),
            "warm_median_s": round(statistics.median(ts[1:]), 2) if len(ts) > 1 else None,
            "warm_max_s": round(max(ts[1:]), 2) if len(ts) > 1 else None,
        }
        for name, ts in times.items()
        if ts
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{'page':16s} {'first':>8s} {'warm p50':>9s} {'warm max':>9s}")
        for name, r in out.items():
            print(f"{name:16s} {r['cold_s']:8.2f} {r['warm_median_s'] or 0:9.2f} {r['warm_max_s'] or 0:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
