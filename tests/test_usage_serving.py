"""Model serving's usage over time (labfleet.usage.serving_usage) on SQLite and PostgreSQL: the engine's
tick writes 15-minute rows per endpoint and token beside its cumulative columns; ``GET /api/usage``'s
serving part sums them over a period and in buckets, scoped like the rest of usage (a user their
own endpoints, a domain admin their domain's, a monitor all); ``/api/usage/me`` per period and day;
retention forgets them with the usage buckets."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from sqlalchemy import func, select

from labfleet.core import database
from labfleet.core.authz import Actor
from labfleet.core.models import Domain, Project, ServingEndpoint, ServingToken, ServingUsage, User
from labfleet.serving.controller import ServingController
from labfleet.tenancy import directory
from labfleet.tenancy.policies import ensure_default_keypair_policy
from labfleet.usage import records, serving_usage, stats
from labfleet.usage.serving_usage import Counts
from tests.dbfixture import fresh_db
from tests.postgres_server import fresh_database

CLI = Actor.cli()
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=timezone.utc)  # on a bucket boundary


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture(params=["sqlite", "postgres"])
def world(request, tmp_path, monkeypatch):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'lf.sqlite'}"
    else:
        url = fresh_database(request.getfixturevalue("postgres_url"), "usage_serving")
    engine, factory = fresh_db(url, tmp_path, monkeypatch)
    ids: dict[str, object] = {}
    with database.session_scope(factory) as db:
        ensure_default_keypair_policy(db)
        for d, p in (("acme", "ml"), ("beta", "web")):
            directory.create_domain(db, CLI, {"name": d})
            directory.create_project(db, CLI, {"domain": d, "name": p})
        for name, domain, project, role in [
            ("alice", "acme", "ml", "user"),
            ("carol", "acme", None, "admin"),
            ("erin", "beta", "web", "user"),
        ]:
            directory.create_user(
                db,
                CLI,
                {"username": name, "domain": domain, "role": role, "projects": [project] if project else []},
            )
        for name, owner, open_ in (("echo", "alice", False), ("pub", "alice", True), ("far", "erin", False)):
            user = db.scalars(select(User).where(User.username == owner)).one()
            project = db.scalars(select(Project).where(Project.domain_id == user.domain_id)).one()
            e = ServingEndpoint(
                id=str(uuid.uuid4()),
                name=name,
                user_id=user.id,
                project_id=project.id,
                domain_id=user.domain_id,
                folder_name="m",
                open_to_public=open_,
                status="READY",
            )
            db.add(e)
            db.flush()
            ids[name] = e.id
            if not open_:
                for i in (1, 2):
                    t = ServingToken(endpoint_id=e.id, token_hash="x", created_by=owner)
                    db.add(t)
                    db.flush()
                    ids[f"{name}-t{i}"] = t.id
        assert db.scalar(select(func.count()).select_from(Domain)) == 2
    yield factory, ids
    engine.dispose()


def tick(factory, ids, when, endpoint_counts, token_counts):
    with database.session_scope(factory) as db:
        return serving_usage.record(
            db,
            {ids[k]: c for k, c in endpoint_counts.items()},
            {ids[k]: c for k, c in token_counts.items()},
            when,
        )


def query(bucket="none", start=0.0, end=3 * 3600.0):
    return stats.UsageQuery("user", at(start), at(end), bucket)


def test_ticks_add_up_per_endpoint_token_and_bucket_in_every_scope(world):
    factory, ids = world
    # 09:00-09:15: echo 3 with token 1 (one failed), 1 with token 2; pub 2 without a token; far 1.
    assert (
        tick(
            factory,
            ids,
            at(10),
            {"echo": Counts(4, 1, 40.0), "pub": Counts(2, 0, 3.0), "far": Counts(1, 0, 5.0)},
            {"echo-t1": Counts(3, 1, 36.0), "echo-t2": Counts(1, 0, 4.0), "far-t1": Counts(1, 0, 5.0)},
        )
        == 4
    )
    # A second tick in the same quarter adds to the same rows; one in the next hour makes new ones.
    tick(factory, ids, at(800), {"echo": Counts(1, 0, 2.0)}, {"echo-t1": Counts(1, 0, 2.0)})
    tick(factory, ids, at(3700), {"echo": Counts(2, 2, 10.0)}, {"echo-t2": Counts(2, 2, 10.0)})
    with factory() as db:
        assert db.scalar(select(func.count()).select_from(ServingUsage)) == 5
        row = db.scalars(select(ServingUsage).where(ServingUsage.token_id == ids["echo-t1"])).one()
        assert (row.requests, row.errors, row.latency_ms_total, row.bucket_start) == (4, 1, 38.0, at(0))
        assert (row.endpoint, row.user, row.project, row.domain) == ("echo", "alice", "acme/ml", "acme")

        everything = serving_usage.report(db, CLI, query())
        assert (everything["requests"], everything["errors"]) == (10, 3)
        by_endpoint = {r["endpoint"]: r for r in everything["endpoints"]}
        assert by_endpoint["echo"] == {
            "endpoint": "echo",
            "endpoint_id": ids["echo"],
            "user": "alice",
            "project": "acme/ml",
            "domain": "acme",
            "bucket": None,
            "requests": 7,
            "errors": 3,
            "latency_ms_mean": round(52.0 / 7, 3),
        }
        assert (by_endpoint["pub"]["requests"], by_endpoint["pub"]["latency_ms_mean"]) == (2, 1.5)
        by_token = {r["token_id"]: r for r in everything["tokens"]}
        assert set(by_token) == {ids["echo-t1"], ids["echo-t2"], ids["far-t1"]}  # pub's had none
        assert (by_token[ids["echo-t2"]]["requests"], by_token[ids["echo-t2"]]["errors"]) == (3, 2)
        assert by_token[ids["echo-t2"]]["latency_ms_mean"] == round(14.0 / 3, 3)

        # Scopes: alice her endpoints, carol her domain's, erin hers; a monitor all.
        alice = Actor(name="alice", role="user", domain="acme")
        carol = Actor(name="carol", role="admin", domain="acme")
        erin = Actor(name="erin", role="user", domain="beta")
        mona = Actor(name="mona", role="monitor", domain="acme")
        for who, names, n in ((alice, {"echo", "pub"}, 9), (carol, {"echo", "pub"}, 9), (erin, {"far"}, 1)):
            mine = serving_usage.report(db, who, query())
            assert {r["endpoint"] for r in mine["endpoints"]} == names and mine["requests"] == n, who.name
            assert {r["endpoint"] for r in mine["tokens"]} <= names
        assert serving_usage.report(db, mona, query())["requests"] == 10

        # Buckets: by hour, echo 5 then 2; a period before any request is all zeros.
        hours = [
            r for r in serving_usage.report(db, CLI, query("hour"))["endpoints"] if r["endpoint"] == "echo"
        ]
        assert [(r["bucket"], r["requests"]) for r in hours] == [
            (at(0).isoformat(), 5),
            (at(3600).isoformat(), 2),
        ]
        quarters = serving_usage.report(db, CLI, query("15m"))["tokens"]
        assert [r["bucket"] for r in quarters if r["token_id"] == ids["echo-t2"]] == [
            at(0).isoformat(),
            at(3600).isoformat(),
        ]
        days = serving_usage.report(db, CLI, query("day"))["endpoints"]
        assert {r["bucket"] for r in days} == {datetime(2026, 11, 2, tzinfo=timezone.utc).isoformat()}
        empty = serving_usage.report(db, CLI, query(start=-7200, end=-3600))
        assert empty == {"requests": 0, "errors": 0, "latency_ms_mean": None, "endpoints": [], "tokens": []}
        # The period is widened to whole quarters: from 09:10 counts the 09:00 quarter.
        assert serving_usage.report(db, CLI, query(start=600, end=900))["requests"] == 8


def test_me_has_serving_per_period_and_per_day(world):
    factory, ids = world
    now = datetime.now(timezone.utc)
    tick(factory, ids, now - timedelta(days=2), {"echo": Counts(3, 1, 30.0)}, {"echo-t1": Counts(3, 1, 30.0)})
    tick(factory, ids, now - timedelta(days=10), {"pub": Counts(5, 0, 10.0)}, {})
    tick(factory, ids, now - timedelta(days=2), {"far": Counts(7, 0, 7.0)}, {"far-t1": Counts(7, 0, 7.0)})
    alice = Actor(name="alice", role="user", domain="acme")
    with factory() as db:
        me = serving_usage.add_to_me(db, alice, stats.me(db, alice, now))
    periods = {p["key"]: p["serving"] for p in me["periods"]}
    assert (periods["7d"]["requests"], periods["7d"]["errors"], periods["30d"]["requests"]) == (3, 1, 8)
    assert periods["7d"]["latency_ms_mean"] == 10.0
    assert [t["token_id"] for t in periods["7d"]["tokens"]] == [ids["echo-t1"]]
    daily = {d["bucket"][:10]: d["serving"]["requests"] for d in me["daily"]}
    assert daily[(now - timedelta(days=2)).date().isoformat()] == 3
    assert daily[(now - timedelta(days=10)).date().isoformat()] == 5
    assert sum(daily.values()) == 8  # erin's endpoint is not alice's


def test_the_engine_tick_keeps_its_counters_and_writes_the_rows(world):
    factory, ids = world
    engine = ServingController(factory, SimpleNamespace(api_url="", token=""), logging.getLogger("test"))
    for ms, err in ((4.0, False), (6.0, True)):
        engine.count(ids["echo"], ids["echo-t1"], ms, err)
    engine.count(ids["pub"], None, 2.0, False)
    engine._write_stats()
    engine._write_stats()  # nothing new: nothing written twice
    with factory() as db:
        e = db.get(ServingEndpoint, ids["echo"])
        assert (e.requests, e.errors, e.latency_ms_total) == (2, 1, 10.0)
        assert db.get(ServingToken, ids["echo-t1"]).requests == 2
        rows = {(u.endpoint, u.token_id): (u.requests, u.errors) for u in db.scalars(select(ServingUsage))}
        assert rows == {("echo", ids["echo-t1"]): (2, 1), ("pub", None): (1, 0)}
        # Retention forgets them with the usage buckets.
        records.purge(db, datetime.now(timezone.utc) + timedelta(hours=1))
        assert db.scalar(select(func.count()).select_from(ServingUsage)) == 0
