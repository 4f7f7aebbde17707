"""Usage records and statistics (labfleet.usage.accrual, .records, .stats) on SQLite and PostgreSQL.

Sessions are admitted and released with the real ``sessions`` module; their status history is then
moved to fixed times, so each accrual's expected figures can be written down exactly.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm.attributes import flag_modified

from labfleet.compute import nodes, sessions
from labfleet.compute.devices.base import DeviceInfo, NodeInfo
from labfleet.core import database
from labfleet.core.authz import Actor
from labfleet.core.errors import InvalidInput, NotFound
from labfleet.core.models import ComputeSession, UsageBucket, UsageDay, UsageSessionState
from labfleet.tenancy import directory
from labfleet.tenancy.policies import ensure_default_keypair_policy
from labfleet.usage import accrual, records, stats
from labfleet.usage.sampler import GpuReading, Reading
from tests.dbfixture import fresh_db
from tests.postgres_server import fresh_database

CLI = Actor.cli()
GiB = 2**30
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=timezone.utc)  # a Monday, on a bucket boundary


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# ---------------------------------------------------------------- pure arithmetic


def test_split_cuts_at_15_minute_boundaries():
    assert accrual.split(at(600), at(2000)) == [(at(0), 300.0), (at(900), 900.0), (at(1800), 200.0)]
    assert accrual.split(at(10), at(10)) == []
    assert accrual.floor_bucket(at(899)) == at(0) and accrual.floor_bucket(at(900)) == at(900)
    assert accrual.floor_bucket(at(5000), 86400) == datetime(2026, 11, 2, tzinfo=timezone.utc)


def test_held_interval_from_the_status_history():
    def h(*pairs):
        return [{"status": s, "at": at(t).isoformat()} for s, t in pairs]

    ran = h(("PENDING", 0), ("SCHEDULED", 30), ("RUNNING", 40), ("TERMINATED", 100))
    assert accrual.held_interval(ran, "TERMINATED", at(100)) == (at(30), at(100))
    live = h(("SCHEDULED", 5), ("RUNNING", 9))
    assert accrual.held_interval(live, "RUNNING", at(9)) == (at(5), None)
    # Cancelled while queued: it never held anything
    assert accrual.held_interval(h(("PENDING", 0), ("CANCELLED", 9)), "CANCELLED", at(9)) is None
    # A history without times falls back to the status change
    assert accrual.held_interval([{"status": "RUNNING"}], "RUNNING", at(7)) == (at(7), None)


def test_alloc_rates_count_a_whole_device_as_one_share():
    assert accrual.alloc_rates({"cpu": "2", "mem": str(4 * GiB), "gpu": "1"}) == {
        "cpu": 2.0,
        "mem": 4.0 * GiB,
        "gpu.shares": 1.0,
    }
    assert accrual.alloc_rates({"gpu.shares": "0.5", "cpu": "0.25"})["gpu.shares"] == 0.5
    assert accrual.alloc_rates({"cpu": "bad"}) == {"cpu": 0.0, "mem": 0.0, "gpu.shares": 0.0}


def test_used_amounts_take_cpu_as_a_counter_and_memory_as_a_rate():
    first = accrual.used_amounts(
        at(60), 30.0, 1e9, [40.0], [2e9], prev_at=None, prev_cpu=None, held_from=at(0), max_gap=30
    )
    assert first is not None
    # The first reading counts the counter from the start, memory for at most max_gap
    assert (first.cpu, first.cpu_from, first.mem, first.rect_from) == (30.0, at(0), 30e9, at(30))
    assert first.gpu == pytest.approx(0.4 * 30) and first.gpu_now == pytest.approx(0.4)
    nxt = accrual.used_amounts(
        at(75), 36.0, 1e9, [None], [None], prev_at=at(60), prev_cpu=30.0, held_from=at(0), max_gap=30
    )
    assert nxt is not None and nxt.cpu == 6.0 and nxt.cpu_now == pytest.approx(0.4) and nxt.gpu == 0.0
    # A counter that went back (the server restarted) counts nothing and is the new baseline
    reset = accrual.used_amounts(
        at(90), 2.0, None, [], [], prev_at=at(75), prev_cpu=36.0, held_from=at(0), max_gap=30
    )
    assert reset is not None and reset.cpu == 0.0 and reset.cpu_total == 2.0
    assert (
        accrual.used_amounts(
            at(75), 1.0, 1.0, [], [], prev_at=at(75), prev_cpu=0, held_from=at(0), max_gap=30
        )
        is None
    )


def test_efficiency_is_none_where_nothing_was_allocated():
    assert accrual.efficiency({"cpu": 10.0, "gpu.shares": 0.0}, {"cpu": 5.0, "gpu.shares": 3.0}) == {
        "cpu": 0.5,
        "gpu.shares": None,
    }


@pytest.mark.parametrize(
    "args, message",
    [
        ({"group_by": "team"}, "group_by must be one of"),
        ({"bucket": "week"}, "bucket must be one of"),
        ({"format": "xml"}, "format must be one of json, csv"),
        ({"start": "yesterday"}, "start must be an ISO 8601 time"),
        ({"end": "2026-13-01"}, "end must be an ISO 8601 time"),
        ({"start": "2026-11-02T00:00:00Z", "end": "2026-11-01T00:00:00Z"}, "end must be after start"),
        ({"start": "2020-01-01T00:00:00Z", "end": "2026-01-01T00:00:00Z"}, "at most 400 days"),
        ({"start": "2026-01-01T00:00:00Z", "end": "2026-03-01T00:00:00Z", "bucket": "15m"}, "more than 3000"),
        ({"start": "0001-01-01T00:00:00+14:00"}, "out of range"),
        ({"start": "1800-01-01T00:00:00Z"}, "between the years"),
        ({"grup_by": "user"}, "unknown query argument(s) grup_by"),
    ],
)
def test_bad_queries_are_refused_with_a_message(args, message):
    with pytest.raises(InvalidInput) as e:
        stats.parse_query(args, T0)
    assert message in e.value.message


def test_a_query_defaults_to_users_over_the_last_30_days():
    q = stats.parse_query({"start": None}, T0)
    assert (q.group_by, q.bucket, q.format, q.end, q.start) == (
        "user",
        "none",
        "json",
        T0,
        T0 - timedelta(days=30),
    )
    z = stats.parse_query({"start": "2026-11-01T00:00:00Z", "end": "2026-11-01T12:00:00+02:00"}, T0)
    assert z.start == datetime(2026, 11, 1, tzinfo=timezone.utc) and z.end == datetime(
        2026, 11, 1, 10, tzinfo=timezone.utc
    )


# ---------------------------------------------------------------- a fleet in a real database


@pytest.fixture(params=["sqlite", "postgres"])
def factory(request, tmp_path, monkeypatch):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'lf.sqlite'}"
    else:
        url = fresh_database(request.getfixturevalue("postgres_url"), "usage_records")
    engine, factory = fresh_db(url, tmp_path, monkeypatch)
    with database.session_scope(factory) as db:
        ensure_default_keypair_policy(db)
        nodes.ensure_default_group(db)
        directory.create_domain(db, CLI, {"name": "acme"})
        directory.create_domain(db, CLI, {"name": "beta"})
        directory.create_project(db, CLI, {"domain": "acme", "name": "ml"})
        directory.create_project(db, CLI, {"domain": "beta", "name": "web"})
        for name, domain, project, role in [
            ("alice", "acme", "ml", "user"),
            ("bob", "acme", "ml", "user"),
            ("carol", "acme", None, "admin"),
            ("erin", "beta", "web", "user"),
            ("dave", "beta", None, "admin"),
            ("mona", "acme", None, "monitor"),
        ]:
            directory.create_user(
                db,
                CLI,
                {"username": name, "domain": domain, "role": role, "projects": [project] if project else []},
            )
        devs = [DeviceInfo(f"GPU-mock-{i}", i, "A100-80GB", 80 * GiB) for i in range(2)]
        nodes.register_node(
            db, NodeInfo(name="n1", cpu=64, mem=512 * GiB, devices=devs, plugin="mock", reason=None)
        )
    yield factory
    engine.dispose()


def start(factory, user="alice", project="acme/ml", held_at=0.0, **slots) -> str:
    """Admit a session and move its placement to ``held_at`` seconds after T0."""
    with database.session_scope(factory) as db:
        s = sessions.admit(db, CLI, {"project": project, "username": user, "slots": slots})
        assert s.status == "SCHEDULED", s.status_reason
        sid = s.id
    with database.session_scope(factory) as db:
        s = db.get(ComputeSession, sid)
        s.status_history = [{"status": "SCHEDULED", "at": at(held_at).isoformat(), "reason": ""}]
        s.status_changed_at = at(held_at)
        flag_modified(s, "status_history")
    return sid


def end(factory, sid: str, ended_at: float, status: str = "TERMINATED") -> None:
    with database.session_scope(factory) as db:
        s = db.get(ComputeSession, sid)
        assert sessions.release(db, s, status, "stopped")
        s.status_history = [*s.status_history[:-1], {**s.status_history[-1], "at": at(ended_at).isoformat()}]
        s.status_changed_at = at(ended_at)
        flag_modified(s, "status_history")


def accrue(factory, now: float, readings=(), **kw) -> records.Accrued:
    with database.session_scope(factory) as db:
        return records.accrue(db, readings, at(now), **kw)


def totals(factory, sid: str) -> dict[str, float]:
    with factory() as db:
        b = UsageBucket
        row = db.execute(
            select(
                func.sum(b.alloc_cpu),
                func.sum(b.alloc_gpu),
                func.sum(b.used_cpu),
                func.sum(b.used_mem),
                func.sum(b.used_gpu),
            ).where(b.session_id == sid)
        ).one()
    return dict(
        zip(
            ("alloc_cpu", "alloc_gpu", "used_cpu", "used_mem", "used_gpu"),
            (x or 0.0 for x in row),
            strict=True,
        )
    )


def reading(sid: str, t: float, cpu: float, mem: float = 0.0, gpus=()) -> Reading:
    return Reading(sid, at(t).timestamp(), True, cpu, int(mem), tuple(gpus))


def test_half_a_gpu_accrues_half_a_share_a_second_and_a_cpu_session_none(factory):
    half = start(factory, held_at=0, **{"gpu.shares": 0.5, "cpu": 1})
    cpu_only = start(factory, user="bob", held_at=0, cpu=2)
    done = accrue(factory, 1000)
    assert set(done.started) == {half, cpu_only} and done.finished == []
    assert totals(factory, half)["alloc_gpu"] == pytest.approx(500.0)
    assert totals(factory, half)["alloc_cpu"] == pytest.approx(1000.0)
    assert totals(factory, cpu_only)["alloc_gpu"] == 0.0 and totals(factory, cpu_only)[
        "alloc_cpu"
    ] == pytest.approx(2000.0)
    end(factory, half, 1500)
    done = accrue(factory, 2000)
    assert done.finished == [half]
    assert totals(factory, half)["alloc_gpu"] == pytest.approx(750.0)  # 0.5 x 1500 s, not a second more
    # Cut at the bucket boundaries: 900 s in the first bucket, 600 s in the second
    with factory() as db:
        rows = db.execute(
            select(UsageBucket.bucket_start, UsageBucket.alloc_gpu)
            .where(UsageBucket.session_id == half)
            .order_by(UsageBucket.bucket_start)
        ).all()
    assert [(b, pytest.approx(v)) for b, v in rows] == [(at(0), 450.0), (at(900), 300.0)]
    accrue(factory, 3000)
    assert totals(factory, half)["alloc_gpu"] == pytest.approx(750.0)  # finished: nothing more
    assert totals(factory, cpu_only)["alloc_cpu"] == pytest.approx(6000.0)


def test_a_session_that_started_and_ended_between_two_runs_is_accounted(factory):
    accrue(factory, 0)
    sid = start(factory, held_at=100, gpu=1)
    end(factory, sid, 400, "ERROR")
    done = accrue(factory, 1000)
    assert sid in done.started and sid in done.finished
    assert totals(factory, sid)["alloc_gpu"] == pytest.approx(300.0)  # a whole device: 1 share a second


def test_a_session_cancelled_while_queued_holds_nothing(factory):
    start(factory, held_at=0, gpu=2)  # both devices
    with database.session_scope(factory) as db:
        queued = sessions.admit(db, CLI, {"project": "acme/ml", "username": "bob", "slots": {"gpu": 1}})
        assert queued.status == "PENDING"
        qid = queued.id
    with database.session_scope(factory) as db:
        sessions.terminate(db, CLI, qid)
    accrue(factory, 600)
    with factory() as db:
        assert db.get(UsageSessionState, qid) is None
    assert totals(factory, qid)["alloc_gpu"] == 0.0


def test_readings_add_what_was_used(factory):
    sid = start(factory, held_at=0, cpu=2, **{"gpu.shares": 0.5})
    accrue(factory, 10)
    gpu = (GpuReading("GPU-mock-0", 40.0, 2 * GiB),)
    accrue(factory, 30, [reading(sid, 30, cpu=15.0, mem=GiB, gpus=gpu)], max_gap=30)
    accrue(factory, 60, [reading(sid, 60, cpu=45.0, mem=2 * GiB, gpus=gpu)], max_gap=30)
    t = totals(factory, sid)
    assert t["used_cpu"] == pytest.approx(45.0)  # the counter, from the placement on
    assert t["used_mem"] == pytest.approx(30 * GiB + 30 * 2 * GiB)
    assert t["used_gpu"] == pytest.approx(0.4 * 60)  # 40 % of the device for 60 s
    with factory() as db:
        st = db.get(UsageSessionState, sid)
        assert (st.cpu_now, st.mem_now, st.gpu_now, st.mem_peak, st.gpu_mem_peak) == (
            pytest.approx(1.0),
            2 * GiB,
            pytest.approx(0.4),
            2 * GiB,
            2 * GiB,
        )
    # A dead reading counts nothing and clears the figures of now
    accrue(factory, 90, [Reading(sid, at(90).timestamp(), False, None, None, (), "gone")])
    assert totals(factory, sid)["used_cpu"] == pytest.approx(45.0)
    with factory() as db:
        assert db.get(UsageSessionState, sid).cpu_now is None


def test_the_report_groups_scopes_and_reaches_now(factory):
    a = start(factory, held_at=0, **{"gpu.shares": 0.5})
    b = start(factory, user="bob", held_at=0, gpu=1)
    e = start(factory, user="erin", project="beta/web", held_at=0, cpu=4)
    accrue(factory, 1800)
    end(factory, b, 1800)
    accrue(factory, 1800)
    q = stats.UsageQuery("user", at(0), at(3600), "none")

    def rows(actor, query=q, now=2700):
        with factory() as db:
            return {r[query.group_by]: r for r in stats.report(db, actor, query, at(now))["rows"]}

    everything = rows(CLI)
    assert set(everything) == {"alice", "bob", "erin"}
    # alice's session still runs: 1800 s accrued, 900 s more up to "now"
    assert everything["alice"]["allocated"]["gpu.shares"] == pytest.approx(0.5 * 2700)
    assert everything["bob"]["allocated"]["gpu.shares"] == pytest.approx(1800.0)
    assert everything["erin"]["allocated"]["cpu"] == pytest.approx(4 * 2700)
    assert everything["alice"]["sessions"] == 1 and everything["alice"]["efficiency"]["cpu"] is None
    user = lambda n, d, role="user": Actor(name=n, role=role, domain=d)  # noqa: E731
    assert set(rows(user("alice", "acme"))) == {"alice"}
    assert set(rows(user("erin", "beta"))) == {"erin"}
    assert set(rows(user("carol", "acme", "admin"))) == {"alice", "bob"}
    assert set(rows(user("dave", "beta", "admin"))) == {"erin"}
    assert set(rows(user("mona", "acme", "monitor"))) == {"alice", "bob", "erin"}
    assert set(rows(user("root", "acme", "superadmin"))) == {"alice", "bob", "erin"}
    by_project = rows(CLI, stats.UsageQuery("project", at(0), at(3600), "none"))
    assert by_project["acme/ml"]["sessions"] == 2 and by_project["beta/web"]["sessions"] == 1
    by_session = rows(CLI, stats.UsageQuery("session", at(0), at(3600), "none"))
    assert set(by_session) == {a, b, e}
    # 15-minute buckets: alice's last, not yet accrued, bucket comes from the live tail
    quarter = [
        r for r in rows(user("alice", "acme"), stats.UsageQuery("user", at(0), at(3600), "15m")).values()
    ]
    with factory() as db:
        buckets = stats.report(
            db, user("alice", "acme"), stats.UsageQuery("user", at(0), at(3600), "15m"), at(2700)
        )["rows"]
    assert [r["bucket"] for r in buckets] == [at(0).isoformat(), at(900).isoformat(), at(1800).isoformat()]
    assert [r["allocated"]["gpu.shares"] for r in buckets] == [pytest.approx(450.0)] * 3
    assert all(r["sessions"] == 1 for r in buckets) and quarter
    # Hours and days fold the buckets on either database
    with factory() as db:
        hours = stats.report(db, CLI, stats.UsageQuery("domain", at(0), at(3600), "hour"), at(2700))["rows"]
        days = stats.report(db, CLI, stats.UsageQuery("domain", at(-86400), at(3600), "day"), at(2700))[
            "rows"
        ]
    assert [(r["domain"], r["bucket"]) for r in hours] == [
        ("acme", at(0).isoformat()),
        ("beta", at(0).isoformat()),
    ]
    assert [r["bucket"] for r in days] == [datetime(2026, 11, 2, tzinfo=timezone.utc).isoformat()] * 2
    assert days[0]["allocated"]["gpu.shares"] == pytest.approx(0.5 * 2700 + 1800)


def test_csv_has_a_header_and_the_same_rows(factory):
    start(factory, held_at=0, cpu=1, **{"gpu.shares": 0.25})
    accrue(factory, 900)
    with factory() as db:
        answer = stats.report(db, CLI, stats.UsageQuery("user", at(0), at(900), "none", "csv"), at(900))
    lines = stats.as_csv(answer).splitlines()
    assert lines[0].split(",")[:5] == ["user", "bucket", "sessions", "allocated_cpu", "allocated_mem"]
    assert "allocated_gpu_shares" in lines[0] and "efficiency_gpu_shares" in lines[0]
    assert lines[1].startswith("alice,,1,900.0,0.0,225.0,")
    assert len(lines) == 2


def test_my_usage_has_three_periods_and_30_days(factory):
    start(factory, held_at=0, gpu=1)
    accrue(factory, 3600)
    with factory() as db:
        mine = stats.me(db, Actor(name="alice", role="admin", domain="acme"), at(3600))
        others = stats.me(db, Actor(name="bob", role="user", domain="acme"), at(3600))
        with pytest.raises(NotFound):
            stats.me(db, CLI, at(3600))
    assert [p["key"] for p in mine["periods"]] == ["7d", "30d", "month"]
    assert mine["periods"][2]["label"] == "November 2026"
    assert all(p["allocated"]["gpu.shares"] == pytest.approx(3600.0) for p in mine["periods"])
    assert (
        len(mine["daily"]) == 30
        and mine["daily"][-1]["bucket"] == datetime(2026, 11, 2, tzinfo=timezone.utc).isoformat()
    )
    assert mine["daily"][-1]["allocated"]["gpu.shares"] == pytest.approx(3600.0)
    assert sum(d["allocated"]["gpu.shares"] for d in mine["daily"][:-1]) == 0
    # An admin's own view is their own, and bob has nothing
    assert others["periods"][0]["allocated"]["gpu.shares"] == 0 and others["periods"][0]["sessions"] == 0


def test_records_outlive_the_user_and_retention_purges_them(factory):
    sid = start(factory, user="bob", held_at=0, gpu=1)
    accrue(factory, 900)
    end(factory, sid, 900)  # a user is deleted once their sessions are over
    with database.session_scope(factory) as db:
        directory.delete_user(db, CLI, "bob")
    done = accrue(factory, 1800)
    assert sid in done.finished
    assert totals(factory, sid)["alloc_gpu"] == pytest.approx(900.0)  # nothing past its end
    with factory() as db:
        rows = stats.report(db, CLI, stats.UsageQuery("user", at(0), at(3600), "none"), at(3600))["rows"]
    assert [r["user"] for r in rows] == ["bob"]
    done = accrue(factory, 3 * 86400, retention_days=1)
    assert done.purged == 1
    with factory() as db:
        assert db.scalar(select(func.count()).select_from(UsageBucket)) == 0
        assert db.get(UsageSessionState, sid) is None


def test_targets_are_the_holding_sessions_of_the_node_with_a_runtime(factory):
    a = start(factory, held_at=0, **{"gpu.shares": 0.5})
    b = start(factory, user="bob", held_at=0, cpu=1)
    start(factory, user="erin", project="beta/web", held_at=0, cpu=1)  # no runtime reported
    with database.session_scope(factory) as db:
        sessions.update_status(db, Actor.hub(), a, {"status": "RUNNING", "runtime": {"pid": 4242}})
        sessions.update_status(db, Actor.hub(), b, {"status": "RUNNING", "runtime": {"container": "ab" * 32}})
        with pytest.raises(InvalidInput):
            sessions.update_status(
                db, Actor.hub(), b, {"status": "RUNNING", "runtime": {"pid": 1, "container": "ab" * 6}}
            )
    for bad in (
        {"pid": 0},
        {"pid": True},
        {"container": "../x"},
        {"container": "AB" * 8},
        {},
        [],
        {"cmd": "x"},
    ):
        with pytest.raises(InvalidInput):
            sessions.check_runtime(bad)
    with factory() as db:
        got = {t.session_id: t for t in records.targets_on(db, "n1")}
        assert records.targets_on(db, "elsewhere") == []
    assert set(got) == {a, b}
    assert got[a].pid == 4242 and len(got[a].devices) == 1 and got[a].devices[0].startswith("GPU-mock-")
    assert got[b].container == "ab" * 32 and got[b].devices == ()


def test_the_daily_rollup_agrees_with_the_15_minute_buckets(factory):
    """Whole days come from usage_days, the range's ends from usage_buckets: the same sums as
    the 15-minute buckets alone, for any range."""
    long = start(factory, held_at=-2 * 86400 - 1234, cpu=1, **{"gpu.shares": 0.75})
    accrue(factory, 20000, [reading(long, 20000, cpu=5000.0, mem=GiB)], max_gap=30)
    with factory() as db:
        days = {
            b: (a, u)
            for b, a, u in db.execute(
                select(UsageDay.bucket_start, UsageDay.alloc_gpu, UsageDay.used_cpu).where(
                    UsageDay.session_id == long
                )
            )
        }
        assert len(days) == 3 and sum(a for a, _ in days.values()) == pytest.approx(
            0.75 * (2 * 86400 + 1234 + 20000)
        )
        for s_, e_ in [
            (-2 * 86400 - 5000, 20000),
            (-86400 + 17, 15000),
            (-3 * 86400, -86400 - 3600),
            (-100, 50),
        ]:
            q_none = stats.UsageQuery("user", at(s_), at(e_), "none")
            q_15m = stats.UsageQuery("user", at(s_), at(e_), "15m") if e_ - s_ <= 31 * 86400 else None
            (whole,) = stats.report(db, CLI, q_none, at(20000))["rows"]
            quarters = stats.report(db, CLI, q_15m, at(20000))["rows"]
            for slot in ("cpu", "mem", "gpu.shares"):
                assert whole["allocated"][slot] == pytest.approx(
                    sum(r["allocated"][slot] for r in quarters)
                ), (s_, e_)
                assert whole["used"][slot] == pytest.approx(
                    sum(r["used"][slot] for r in quarters), abs=1e-3 * len(quarters)
                ), (s_, e_)
            by_day = stats.report(db, CLI, stats.UsageQuery("user", at(s_), at(e_), "day"), at(20000))["rows"]
            assert sum(r["allocated"]["gpu.shares"] for r in by_day) == pytest.approx(
                whole["allocated"]["gpu.shares"]
            )
            assert whole["sessions"] == 1
