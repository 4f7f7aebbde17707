"""Shared fixtures: a real Hub (tests/hubfixture.py) and a real PostgreSQL server."""

import pytest

from labfleet.hub.configure import interruptible_children
from tests.browserfixture import chromium
from tests.hubfixture import start_hub
from tests.postgres_server import postgres_url  # noqa: F401  (a fixture)


def pytest_configure(config):
    # A run started in the background (CI) inherits SIGINT ignored; the processes the tests start
    # (Hubs, services, agents, CLIs) must stop when interrupted, as they would from a terminal.
    interruptible_children()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = start_hub(tmp_path_factory.mktemp("hub"))
    yield h
    h.stop()


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium through Playwright, one per test module."""
    yield from chromium()
