"""The service side of the admin console's Maintenance, Information and Configurations pages, at the
DB and object level: the announcement (who may publish, bad input changes nothing, the audit, the
history), and the info and configuration answers (sources of each setting, no secret ever).

The real HTTP routes, the Hub's banner and the pages are in tests/test_admin_maintenance.py."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select

from labfleet.core import audit, database
from labfleet.core.authz import Actor
from labfleet.core.errors import Forbidden, InvalidInput
from labfleet.core.models import Announcement, AuditEntry
from labfleet.core.secretbox import ensure_key_file
from labfleet.service import fleetinfo
from labfleet.service.app import LabfleetService
from labfleet.tenancy import announcements
from tests.dbfixture import fresh_db
from tests.postgres_server import fresh_database, postgres_url  # noqa: F401  (a fixture)

ROOT = Actor(name="root", role="superadmin", domain="root", user_id=1)
CAROL = Actor(name="carol", role="admin", domain="acme", user_id=2)
MONA = Actor(name="mona", role="monitor", domain="root", user_id=3)
ALICE = Actor(name="alice", role="user", domain="acme", user_id=4)
HUB = Actor.hub()
METRICS = Actor(name="prometheus", role="monitor", kind="metrics")


@pytest.fixture(params=["sqlite", "postgres"])
def factory(request, tmp_path, monkeypatch):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'lf.sqlite'}"
    else:
        url = fresh_database(request.getfixturevalue("postgres_url"), "lf_console")
    engine, factory = fresh_db(url, tmp_path, monkeypatch)
    yield factory
    engine.dispose()


def _count(factory, model) -> int:
    with database.session_scope(factory) as db:
        return db.scalar(select(func.count()).select_from(model))


# ---------------------------------------------------------------- the announcement


def test_nothing_is_announced_at_first(factory):
    with database.session_scope(factory) as db:
        for who in (ROOT, CAROL, MONA, ALICE, HUB):
            assert announcements.current(db, who) == {"announcement": None}


def test_a_superadmin_publishes_and_everyone_reads_it(factory):
    with database.session_scope(factory) as db:
        out = announcements.publish(
            db, ROOT, {"text": "Maintenance <b>Friday</b>\n18:00 UTC", "level": "warning"}
        )
    a = out["announcement"]
    assert a["text"] == "Maintenance <b>Friday</b>\n18:00 UTC"  # kept as written: the pages escape it
    assert a["level"] == "warning" and a["published_by"] == "root"
    with database.session_scope(factory) as db:
        for who in (ROOT, CAROL, MONA, HUB):
            assert announcements.current(db, who)["announcement"] == a
        # A plain user reads what it says, not which superadmin said it.
        seen = announcements.current(db, ALICE)["announcement"]
        assert "published_by" not in seen and seen["text"] == a["text"]
        with pytest.raises(Forbidden):
            announcements.current(db, METRICS)
        (entry,) = audit.list_entries(db, ROOT, action="announcement.publish")
    assert entry.actor == "root" and entry.target == "announcement"
    assert entry.details["text"] == a["text"] and entry.details["level"] == "warning"


def test_the_level_defaults_to_info_and_a_new_one_replaces_the_old(factory):
    with database.session_scope(factory) as db:
        first = announcements.publish(db, ROOT, {"text": "first"})["announcement"]
    assert first["level"] == "info"
    with database.session_scope(factory) as db:
        second = announcements.publish(db, ROOT, {"text": "second", "level": "info"})["announcement"]
    with database.session_scope(factory) as db:
        assert announcements.current(db, ALICE)["announcement"]["text"] == "second"
        rows = list(db.scalars(select(Announcement).order_by(Announcement.id)))
        # The history stays: the first one was cleared by the second's publisher.
        assert [(r.text, r.cleared_by) for r in rows] == [("first", "root"), ("second", None)]
        (entry, _) = audit.list_entries(db, ROOT, action="announcement.publish")
        assert entry.details["replaced"] == first["id"] and entry.details["id"] == second["id"]


def test_clearing_takes_it_down_and_is_audited(factory):
    with database.session_scope(factory) as db:
        announcements.publish(db, ROOT, {"text": "going down at noon"})
    with database.session_scope(factory) as db:
        assert announcements.clear(db, ROOT) == {"announcement": None, "cleared": True}
    with database.session_scope(factory) as db:
        assert announcements.current(db, ALICE) == {"announcement": None}
        assert announcements.clear(db, ROOT) == {"announcement": None, "cleared": False}
        entries = audit.list_entries(db, ROOT, action="announcement.clear")
    assert [e.details["text"] for e in entries] == [None, "going down at noon"]
    assert all(e.actor == "root" for e in entries)


@pytest.mark.parametrize("who", [CAROL, MONA, ALICE, HUB, METRICS], ids=lambda a: a.name)
def test_only_a_superadmin_publishes_or_clears(factory, who):
    with database.session_scope(factory) as db:
        announcements.publish(db, ROOT, {"text": "kept"})
    audited = _count(factory, AuditEntry)
    with pytest.raises(Forbidden, match="only a superadmin"):
        with database.session_scope(factory) as db:
            announcements.publish(db, who, {"text": "mine now"})
    with pytest.raises(Forbidden, match="only a superadmin"):
        with database.session_scope(factory) as db:
            announcements.clear(db, who)
    with database.session_scope(factory) as db:
        assert announcements.current(db, ROOT)["announcement"]["text"] == "kept"
    assert _count(factory, AuditEntry) == audited
    with database.session_scope(factory) as db:  # the CLI may, like a superadmin
        assert announcements.clear(db, Actor.cli())["cleared"] is True


@pytest.mark.parametrize(
    "body,says",
    [
        ({"text": 42}, "text must be a string"),
        ({"text": ["a"]}, "text must be a string"),
        ({"text": None}, "text must be a string"),
        ({"text": "x" * 2001}, "text is longer than 2000 characters"),
        ({"text": "   \n\t"}, "text must not be blank"),
        ({"text": ""}, "text must not be blank"),
        ({"text": "a\x00b"}, "NUL"),
        ({"text": "hi", "level": "critical"}, "level must be one of info, warning"),
        ({"text": "hi", "level": 1}, "level must be one of info, warning"),
        ({"text": "hi", "color": "red"}, "unknown field(s) in request body: color"),
        ({"level": "info"}, "missing field(s) in request body: text"),
        (["text"], "request body must be a JSON object"),
        ("hello", "request body must be a JSON object"),
    ],
)
def test_bad_input_says_why_and_changes_nothing(factory, body, says):
    with database.session_scope(factory) as db:
        announcements.publish(db, ROOT, {"text": "before", "level": "warning"})
    audited = _count(factory, AuditEntry)
    with pytest.raises(InvalidInput) as e:
        with database.session_scope(factory) as db:
            announcements.publish(db, ROOT, body)
    assert says in e.value.message and e.value.status == 400
    with database.session_scope(factory) as db:
        now = announcements.current(db, ROOT)["announcement"]
    assert (now["text"], now["level"]) == ("before", "warning")
    assert _count(factory, Announcement) == 1 and _count(factory, AuditEntry) == audited


def test_the_longest_text_is_accepted(factory):
    with database.session_scope(factory) as db:
        out = announcements.publish(db, ROOT, {"text": "é" * 2000})
    assert len(out["announcement"]["text"]) == 2000


# ---------------------------------------------------------------- info and configuration

SERVICE_TOKEN = "svc-token-4f1c9e2ab7d34c55"
METRICS_TOKEN = "metrics-token-8d2e71c0aa"
DB_PASSWORD = "Pg-Secret-pw-93xQ"


def _service(tmp_path, monkeypatch, argv, db_url, *, config_file: str = ""):
    """A LabfleetService read as at start (command line, config file, environment), DB opened."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LABFLEET_SECRET_KEY_FILE", str(tmp_path / "key"))
    ensure_key_file(tmp_path / "key")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", SERVICE_TOKEN)
    monkeypatch.setenv("LABFLEET_METRICS_TOKEN", METRICS_TOKEN)
    monkeypatch.setenv("LABFLEET_IDLE_TIMEOUT", "900")
    monkeypatch.setenv("LABFLEET_DB_URL", db_url)
    monkeypatch.delenv("JUPYTERHUB_SERVICE_NAME", raising=False)
    monkeypatch.delenv("JUPYTERHUB_API_URL", raising=False)
    for name in (
        "LABFLEET_SCHEDULE_INTERVAL",
        "LABFLEET_IDLE_CHECK_INTERVAL",
        "LABFLEET_LIFETIME_CHECK_INTERVAL",
    ):
        monkeypatch.delenv(name, raising=False)
    if config_file:
        (tmp_path / "labfleet_service_config.py").write_text(config_file)
    app = LabfleetService()
    mock = '--LabfleetService.mock_devices={"model": "A100-80GB", "memory": "80g", "count": 2}'
    app.initialize(["--LabfleetService.device_plugins=mock", mock, *argv])
    return app


def _by_name(settings):
    return {s["name"]: s for s in settings}


def test_each_setting_says_where_it_came_from(tmp_path, monkeypatch):
    app = _service(
        tmp_path,
        monkeypatch,
        ["--LabfleetService.idle_check_interval=7"],
        f"sqlite:///{tmp_path / 'lf.sqlite'}",
        config_file="c.LabfleetService.schedule_interval = 3\nc.LabfleetService.idle_check_interval = 11\n",
    )
    try:
        with database.session_scope(app.session_factory) as db:
            answer = fleetinfo.configuration_answer(db, MONA, app)
    finally:
        app.engine.dispose()
    s = _by_name(answer["settings"])
    assert (s["idle_check_interval"]["value"], s["idle_check_interval"]["source"]) == (7.0, "command line")
    assert (s["schedule_interval"]["value"], s["schedule_interval"]["source"]) == (3.0, "config file")
    assert s["schedule_interval"]["source_detail"].endswith("labfleet_service_config.py")
    assert s["idle_timeout"] | {"help": ""} == s["idle_timeout"] | {
        "value": 900.0,
        "source": "environment",
        "source_detail": "LABFLEET_IDLE_TIMEOUT",
        "section": "idle reclamation",
        "help": "",
    }
    assert s["sample_interval"]["source"] == "default" and s["sample_interval"]["environment"] == [
        "LABFLEET_SAMPLE_INTERVAL"
    ]
    assert s["device_plugins"]["value"] == ["mock"] and s["device_plugins"]["section"] == "node"
    assert s["usage_retention_days"]["source"] == "default" and s["usage_retention_days"]["value"] == 400
    assert s["idle_check_interval"]["environment"] == [
        "LABFLEET_IDLE_CHECK_INTERVAL",
        "LABFLEET_LIFETIME_CHECK_INTERVAL",
    ]
    # Honestly: nothing changes while the service runs; what does is state in the DB.
    assert not any(x["changes_at_run_time"] for x in answer["settings"])
    assert any("/api/storage-hosts" in r["where"] for r in answer["run_time"])
    assert [h["name"] for h in answer["storage_hosts"]] == ["local"] and "path" in answer["storage_hosts"][0]
    assert answer["sections"][0] == "scheduler" and "security" in answer["sections"]
    # Secrets: told as set or not, never shown
    assert s["service_token"]["value"] == "(set, hidden)" and s["service_token"]["secret"]
    assert s["metrics_token"]["value"] == "(set, hidden)"
    text = json.dumps(answer)
    assert SERVICE_TOKEN not in text and METRICS_TOKEN not in text


@pytest.mark.parametrize("who", [ALICE, HUB, METRICS], ids=lambda a: a.name)
def test_only_admins_and_monitors_read_info_and_configuration(tmp_path, monkeypatch, who):
    app = _service(tmp_path, monkeypatch, [], f"sqlite:///{tmp_path / 'lf.sqlite'}")
    try:
        with database.session_scope(app.session_factory) as db:
            with pytest.raises(Forbidden):
                fleetinfo.configuration_answer(db, who, app)
            with pytest.raises(Forbidden):
                fleetinfo.info_answer(db, who, app, database={}, hub={}, now=datetime.now(timezone.utc))
            # A domain admin reads both (the storage hosts without their paths)
            answer = fleetinfo.configuration_answer(db, CAROL, app)
            assert answer["storage_hosts"] and "path" not in answer["storage_hosts"][0]
    finally:
        app.engine.dispose()


def test_no_secret_leaks_from_a_postgres_service(tmp_path, monkeypatch, postgres_url):  # noqa: F811
    """The DB URL carries a password (the test server trusts 127.0.0.1, so any password works)."""
    from sqlalchemy.engine import make_url

    url = make_url(fresh_database(postgres_url, "lf_console_secret")).set(password=DB_PASSWORD)
    app = _service(tmp_path, monkeypatch, [], url.render_as_string(hide_password=False))
    assert DB_PASSWORD in app.db_url
    try:
        db_info = {**fleetinfo.db_health(app.engine), **fleetinfo.db_server(app.engine)}
        hub = asyncio.run(fleetinfo.hub_health("", ""))
        now = datetime.now(timezone.utc)
        with database.session_scope(app.session_factory) as db:
            info = fleetinfo.info_answer(db, ROOT, app, database=db_info, hub=hub, now=now)
            config = fleetinfo.configuration_answer(db, ROOT, app)
    finally:
        app.engine.dispose()
    for answer in (info, config):
        text = json.dumps(answer)
        for secret in (SERVICE_TOKEN, METRICS_TOKEN, DB_PASSWORD):
            assert secret not in text
    db_url = _by_name(config["settings"])["db_url"]
    assert db_url["source"] == "environment" and db_url["source_detail"] == "LABFLEET_DB_URL"
    assert db_url["value"].startswith("postgresql+psycopg://postgres:***@127.0.0.1:")
    # What the information says of this DB and this service
    assert info["database"]["status"] == "ok" and info["database"]["round_trip_ms"] >= 0
    assert info["database"]["server_version"].startswith("PostgreSQL ")
    assert info["database"]["schema_revision"] == info["database"]["schema_head"]
    assert info["hub"]["status"] == "not configured" and info["status"] == "ok"
    assert info["versions"]["labfleet"] and info["versions"]["SQLAlchemy"] and info["versions"]["JupyterHub"]
    assert info["versions"]["JupyterLab"] and info["versions"]["Voila"]
    (node,) = info["nodes"]
    assert node["status"] == "ALIVE" and node["plugin"] == "mock" and node["seen_ago"] < 120


def test_scrub_replaces_secrets_anywhere():
    value = {"a": ["x tok-123456 y", {"tok-123456": 1}], "b": 2, "c": None}
    assert fleetinfo.scrub(value, ["tok-123456"]) == {"a": ["x *** y", {"***": 1}], "b": 2, "c": None}
    env = {
        "LABFLEET_SERVICE_TOKEN": "abcdef-token",
        "LABFLEET_SECRET_KEY_FILE": "/srv/key",
        "SOME_PASSWORD": "hunter2-long",
        "PATH": "/usr/bin",
    }

    class App:
        service_token = "svc-abcdef"
        metrics_token = ""
        db_url = "postgresql://lf:pw-9876@db/lf"

    assert set(fleetinfo.secrets_of(App(), env)) == {"abcdef-token", "hunter2-long", "svc-abcdef", "pw-9876"}


def test_node_health_and_the_overall_status_are_pure():
    now = datetime(2026, 11, 24, 12, 0, tzinfo=timezone.utc)
    views = [
        {
            "name": "a",
            "resource_group": "default",
            "status": "ALIVE",
            "plugin": "mock",
            "devices": [{}, {}],
            "last_seen": (now - timedelta(seconds=30)).isoformat(),
        },
        {
            "name": "b",
            "resource_group": "gpu",
            "status": "LOST",
            "plugin": "nvidia",
            "devices": [],
            "last_seen": None,
        },
    ]
    got = fleetinfo.node_health(views, now)
    assert [(n["name"], n["devices"], n["seen_ago"]) for n in got] == [("a", 2, 30.0), ("b", 0, None)]
    ok = {"status": "ok"}
    assert fleetinfo.overall({"database": ok, "hub": ok}, got[:1]) == "ok"
    assert fleetinfo.overall({"database": ok, "hub": ok}, got) == "degraded"
    assert fleetinfo.overall({"database": ok, "hub": {"status": "failed"}}, got[:1]) == "degraded"
    assert fleetinfo.overall({"database": {"status": "failed"}, "hub": ok}, []) == "failed"


def test_the_hub_health_check_says_when_the_hub_does_not_answer():
    from tests.hubfixture import free_port

    got = asyncio.run(fleetinfo.hub_health(f"http://127.0.0.1:{free_port()}/hub/api", "t", timeout=2))
    assert got["status"] == "failed" and got["version"] is None and got["message"]
