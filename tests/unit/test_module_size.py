"""The house rule: no module over 1,000 lines (split by what the parts are, as the packages are)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("hub_ext", "spawner", "server_ext", "widgets", "admin_dashboards", "benchmarks")
MAX_LINES = 1000


def test_no_module_is_over_a_thousand_lines():
    too_long = {
        str(path.relative_to(REPO)): n
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert too_long == {}, f"modules over {MAX_LINES} lines: {too_long}"
