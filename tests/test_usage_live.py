"""``GET /api/usage/live`` (hub_ext/service/handlers/usage.py), on a real database: the trusted
sampler's last reading of each live session, read only, scoped as ``GET /api/usage`` (a user their
own sessions, a domain admin their domain's, monitors and superadmins everything); sessions that
ended or were never sampled are left out; each row as the spec's ``LiveUsage`` says."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from labfleet.core import database
from labfleet.core.authz import Actor
from labfleet.core.models import UsageSessionState
from labfleet.core.pages import page_of
from labfleet.usage.stats import live_query, live_view
from tests.dbfixture import fresh_db

NOW = datetime(2026, 11, 28, 3, 0, tzinfo=timezone.utc)
GiB = 2**30
SPEC = Path(__file__).resolve().parents[1] / "hub_ext" / "service" / "openapi.yaml"


def state(sid: str, user: str, domain: str, **kw) -> UsageSessionState:
    return UsageSessionState(
        session_id=sid,
        user=user,
        project=f"{domain}/ml",
        domain=domain,
        resource_group="default",
        held_from=NOW - timedelta(hours=1),
        accrued_until=NOW,
        **kw,
    )


@pytest.fixture
def factory(tmp_path, monkeypatch):
    engine, factory = fresh_db(f"sqlite:///{tmp_path / 'lf.sqlite'}", tmp_path, monkeypatch)
    sampled = NOW - timedelta(seconds=5)
    with database.session_scope(factory) as db:
        db.add_all(
            [
                state("s-alice", "alice", "acme", sampled_at=sampled, cpu_now=0.5, gpu_mem_now=30.0 * GiB),
                state("s-bob", "bob", "acme", sampled_at=sampled, mem_now=1.0 * GiB),
                state("s-gina", "gina", "globex", sampled_at=sampled, gpu_now=0.9, gpu_mem_now=4.0 * GiB),
                # Ended (its end is accrued), ending (held_until set), never sampled: not live readings
                state("s-done", "alice", "acme", sampled_at=sampled, finished=True, held_until=NOW),
                state("s-ending", "alice", "acme", sampled_at=sampled, held_until=NOW),
                state("s-new", "alice", "acme"),
            ]
        )
    yield factory
    engine.dispose()


def read(factory, actor: Actor, offset: int = 0, limit: int = 200):
    with database.session_scope(factory) as db:
        return page_of(db, live_query(actor), offset, limit).map(live_view)


def test_each_reader_gets_the_live_sessions_in_their_reach(factory):
    everything = ["s-alice", "s-bob", "s-gina"]
    for actor, ids in [
        (Actor(name="root", role="superadmin"), everything),
        (Actor(name="mona", role="monitor", domain="acme"), everything),
        (Actor.hub(), everything),
        (Actor(name="carol", role="admin", domain="acme"), ["s-alice", "s-bob"]),
        (Actor(name="dave", role="admin", domain="globex"), ["s-gina"]),
        (Actor(name="alice", role="user", domain="acme"), ["s-alice"]),
        (Actor(name="erin", role="user", domain="acme"), []),
    ]:
        page = read(factory, actor)
        assert [r["session"] for r in page.items] == ids, actor.name
        assert page.total == len(ids)


def test_a_row_is_the_last_reading_as_the_spec_says(factory):
    (row,) = read(factory, Actor(name="alice", role="user", domain="acme")).items
    assert row == {
        "session": "s-alice",
        "user": "alice",
        "project": "acme/ml",
        "domain": "acme",
        "resource_group": "default",
        "sampled_at": (NOW - timedelta(seconds=5)).isoformat(),
        "cpu": 0.5,
        "mem": None,
        "gpu": None,
        "gpu_mem": 30.0 * GiB,
    }
    schema = yaml.safe_load(SPEC.read_text())["components"]["schemas"]["LiveUsage"]
    assert set(schema["required"]) == set(row) == set(schema["properties"])
    spec = yaml.safe_load(SPEC.read_text())["paths"]["/usage/live"]["get"]
    assert "post" not in yaml.safe_load(SPEC.read_text())["paths"]["/usage/live"]  # read only
    assert spec["responses"]["200"]["content"]["application/json"]["schema"]["items"] == {
        "$ref": "#/components/schemas/LiveUsage"
    }


def test_pages_in_session_order(factory):
    root = Actor(name="root", role="superadmin")
    first, second = read(factory, root, 0, 2), read(factory, root, 2, 2)
    assert [r["session"] for r in first.items + second.items] == ["s-alice", "s-bob", "s-gina"]
    assert (first.total, first.next_offset, second.next_offset) == (3, 2, None)
