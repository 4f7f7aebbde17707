"""Shared fixtures: a real Hub (tests/hubfixture.py) and a real PostgreSQL server."""

import pytest

from tests.browserfixture import chromium
from tests.hubfixture import start_hub
from tests.postgres_server import postgres_url  # noqa: F401  (a fixture)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = start_hub(tmp_path_factory.mktemp("hub"))
    yield h
    h.stop()


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium through Playwright, one per test module."""
    yield from chromium()
