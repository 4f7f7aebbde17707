"""The Maintenance, Information and Configurations pages' pure helpers, and their widgets built
against a fake client (no kernel, no service): what they say, what they send, what is disabled."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import ipywidgets as W
import pytest

from labfleet.console import configurations, information, maintenance
from labfleet.console.console import ServiceError

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=timezone.utc)


def walk(widget: W.Widget):
    yield widget
    for child in getattr(widget, "children", ()) or ():
        yield from walk(child)


def buttons(widget: W.Widget) -> dict[str, W.Button]:
    return {w.description: w for w in walk(widget) if isinstance(w, W.Button)}


def text_of(widget: W.Widget) -> str:
    return " ".join(w.value for w in walk(widget) if isinstance(w, W.HTML))


class FakeClient:
    """The console's client with canned answers; requests are logged."""

    def __init__(self, role: str, answers: dict[tuple[str, str], Any] | None = None) -> None:
        self.role = role
        self.answers = answers or {}
        self.log: list[tuple[str, str, Any]] = []

    @property
    def can_change(self) -> bool:
        return self.role in ("superadmin", "admin")

    def request(self, method: str, path: str, *, params=None, json=None, pages=False) -> Any:
        self.log.append((method, path, json))
        answer = self.answers.get((method, path))
        if isinstance(answer, Exception):
            raise answer
        return answer(json) if callable(answer) else answer

    def get(self, path: str, **params: Any) -> Any:
        self.log.append(("GET", path, params or None))
        answer = self.answers.get(("GET", path))
        return answer(params) if callable(answer) else answer

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, json=body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)


# ---------------------------------------------------------------- maintenance


def test_the_banner_preview_escapes_the_text_and_takes_the_hubs_colours():
    html = maintenance.banner_html(
        {
            "text": "<script>x</script>\nline 2",
            "level": "warning",
            "published_by": "root",
            "published_at": "2026-11-24T10:05:07.123+00:00",
        }
    )
    assert "Published by root on 2026-11-24 10:05 UTC." in html
    assert "&lt;script&gt;x&lt;/script&gt;\nline 2" in html and "<script>x" not in html
    assert 'data-level="warning"' in html and "#fff3cd" in html and "by root" in html
    assert "No announcement" in maintenance.banner_html(None)
    assert "No announcement" in maintenance.banner_html({"text": "  "})


def test_the_drift_table_says_amounts_in_their_units():
    drift = [
        {"scope_kind": "user", "scope": "alice", "slot": "mem", "stored_amount": 0, "true_amount": 2**31},
        {
            "scope_kind": "project",
            "scope": "acme/ml",
            "slot": "gpu.shares",
            "stored_amount": 0.75,
            "true_amount": 0.5,
        },
        {"scope_kind": "keypair", "scope": "AK1", "slot": "@sessions", "stored_amount": 3, "true_amount": 2},
    ]
    assert maintenance.drift_rows(drift) == [
        ["alice", "user", "mem", "0 GiB", "2 GiB", "+2 GiB"],
        ["acme/ml", "project", "gpu.shares", "0.75", "0.5", "-0.25"],
        ["AK1", "keypair", "@sessions", "3", "2", "-1"],
    ]
    html = maintenance.drift_html({"drift": drift, "repaired": 0, "dry_run": True})
    assert "Dry run: 3 ledger rows differ from the live sessions. Nothing was changed." in html
    assert "No drift" in maintenance.drift_html({"drift": [], "repaired": 0, "dry_run": True})
    assert "Repaired 1 ledger row" in maintenance.drift_html(
        {"drift": drift[:1], "repaired": 1, "dry_run": False}
    )


UNACCOUNTED = [
    {
        "user": "otto",
        "server": "stray",
        "started": (NOW - timedelta(hours=2)).isoformat(),
        "last_activity": (NOW - timedelta(minutes=3)).isoformat(),
        "last_session": {"id": "s1", "status": "ERROR", "status_reason": "<b>crashed</b>"},
        "stopped": False,
    },
    {"user": "carol", "server": "", "started": None, "last_activity": None, "last_session": None},
]


def test_the_servers_the_hub_runs_with_no_live_session_are_listed_then_stopped():
    """Issue 27: what a recalculation says of the Hub's servers that run no live session."""
    assert maintenance.unaccounted_rows(UNACCOUNTED, NOW) == [
        ["otto", "stray", "2 h 0 min ago", "3 min ago", "ERROR: <b>crashed</b>"],
        ["carol", "(default)", "never", "never", "none"],
    ]
    assert [r[-1] for r in maintenance.unaccounted_rows(UNACCOUNTED, NOW, repaired=True)] == [
        "the Hub refused",
        "the Hub refused",
    ]
    dry = maintenance.unaccounted_html({"dry_run": True, "unaccounted_servers": UNACCOUNTED}, NOW)
    assert "The Hub runs 2 servers with no live session" in dry and "The repair stops them." in dry
    assert "&lt;b&gt;crashed" in dry and "<b>crashed" not in dry and "<th>stop</th>" not in dry
    stopped = [{**UNACCOUNTED[0], "stopped": True}]
    done = maintenance.unaccounted_html({"dry_run": False, "unaccounted_servers": stopped}, NOW)
    assert "Asked the Hub to stop 1 server that ran with no live session" in done
    assert "<th>stop</th>" in done and "<td>stopped</td>" in done
    none = maintenance.unaccounted_html({"dry_run": True, "unaccounted_servers": []}, NOW)
    assert "Every server the Hub runs holds a live session." in none
    unread = maintenance.unaccounted_html({"dry_run": True, "unaccounted_servers": None}, NOW)
    assert "could not be read: they were not checked" in unread


def test_the_history_is_newest_first_with_a_word_on_each():
    entries = [
        {
            "timestamp": (NOW - timedelta(minutes=5)).isoformat(),
            "actor": "root",
            "action": "announcement.clear",
            "details": {"id": 3},
        },
        {
            "timestamp": (NOW - timedelta(minutes=1)).isoformat(),
            "actor": "root",
            "action": "maintenance.recalculate-usage",
            "details": {"drift": 0, "dry_run": True, "unaccounted_servers": 2},
        },
        {
            "timestamp": (NOW - timedelta(hours=1)).isoformat(),
            "actor": "root",
            "action": "announcement.publish",
            "details": {"level": "info", "text": "x" * 70},
        },
    ]
    rows = maintenance.history_rows(entries, NOW)
    assert [r[0] for r in rows] == ["1 min ago", "5 min ago", "1 h 0 min ago"]
    assert rows[0][3] == "dry run, 0 row(s) of drift, 2 server(s) with no live session"
    assert rows[1][3] == "taken down"
    assert rows[2][3] == "info: " + "x" * 60 + "…"


def _maintenance_client(role: str) -> FakeClient:
    state: dict[str, Any] = {
        "a": {"id": 1, "text": "old news", "level": "info", "published_at": NOW.isoformat()}
    }

    def put(body):
        if not body["text"].strip():
            raise ServiceError("text must not be blank; to take the announcement down, DELETE it", 400)
        state["a"] = {"id": 2, **body, "published_at": NOW.isoformat()}
        return {"announcement": state["a"]}

    def delete(_):
        state["a"] = None
        return {"announcement": None, "cleared": True}

    drift = [{"scope_kind": "user", "scope": "alice", "slot": "cpu", "stored_amount": 1, "true_amount": 0.5}]
    return FakeClient(
        role,
        {
            ("GET", "/announcement"): lambda _: {"announcement": state["a"]},
            ("PUT", "/announcement"): put,
            ("DELETE", "/announcement"): delete,
            ("POST", "/maintenance/recalculate-usage"): lambda b: {
                "drift": drift if b["dry_run"] else drift,
                "repaired": 0 if b["dry_run"] else 1,
                "dry_run": b["dry_run"],
            },
            ("GET", "/audit"): lambda _: [],
        },
    )


def test_a_superadmin_publishes_checks_drift_then_repairs():
    client = _maintenance_client("superadmin")
    page = maintenance.page(client)
    b = buttons(page)
    assert not b["Publish"].disabled and not b["Clear"].disabled
    assert b["Repair the ledger"].disabled  # only after a dry run found drift
    text = next(w for w in walk(page) if isinstance(w, W.Textarea))
    assert text.value == "old news"
    # Bad input: the service's message, nothing else happens
    text.value = "   "
    b["Publish"].click()
    assert "The labfleet service said: text must not be blank" in text_of(page)
    text = next(w for w in walk(page) if isinstance(w, W.Textarea))
    text.value = "Maintenance at 18:00"
    level = next(w for w in walk(page) if isinstance(w, W.Dropdown))
    level.value = "warning"
    buttons(page)["Publish"].click()
    assert ("PUT", "/announcement", {"text": "Maintenance at 18:00", "level": "warning"}) in client.log
    assert "Published: the announcement shows on the Hub" in text_of(page)
    assert 'data-level="warning"' in text_of(page)  # the page rebuilt with the new one
    buttons(page)["Check for drift (dry run)"].click()
    assert "Dry run: 1 ledger row differs" in text_of(page)
    assert not buttons(page)["Repair the ledger"].disabled
    buttons(page)["Repair the ledger"].click()
    assert ("POST", "/maintenance/recalculate-usage", {"dry_run": False}) in client.log
    assert "Repaired 1 ledger row" in text_of(page)
    buttons(page)["Clear"].click()
    assert "Cleared: no announcement is shown any more." in text_of(page)
    assert buttons(page)["Clear"].disabled  # nothing left to clear


def test_the_repair_is_offered_when_a_dry_run_finds_only_servers_with_no_live_session():
    client = _maintenance_client("superadmin")
    client.answers[("POST", "/maintenance/recalculate-usage")] = lambda b: {
        "drift": [],
        "repaired": 0,
        "dry_run": b["dry_run"],
        "unaccounted_servers": [{**UNACCOUNTED[0], "stopped": not b["dry_run"]}],
    }
    page = maintenance.page(client)
    buttons(page)["Check for drift (dry run)"].click()
    assert "No drift" in text_of(page) and "The Hub runs 1 server with no live session" in text_of(page)
    assert not buttons(page)["Repair the ledger"].disabled
    buttons(page)["Repair the ledger"].click()
    assert ("POST", "/maintenance/recalculate-usage", {"dry_run": False}) in client.log
    assert "Asked the Hub to stop 1 server" in text_of(page)


@pytest.mark.parametrize(
    "role,why", [("admin", "only a superadmin"), ("monitor", "a monitor changes nothing")]
)
def test_everyone_else_reads_with_the_actions_disabled(role, why):
    client = _maintenance_client(role)
    page = maintenance.page(client)
    b = buttons(page)
    for name in ("Publish", "Clear", "Check for drift (dry run)", "Repair the ledger"):
        assert b[name].disabled, name
    assert why in text_of(page) and "old news" in text_of(page)
    assert not b["Refresh"].disabled
    assert all(method == "GET" for method, _, _ in client.log)


# ---------------------------------------------------------------- information

INFO = {
    "checked_at": NOW.isoformat(),
    "status": "degraded",
    "versions": {
        "Python": "3.11.2",
        "tornado": "6.5",
        "labfleet": "0.1.0",
        "JupyterHub": "6.1.1",
        "Voila": None,
    },
    "hub": {"status": "ok", "round_trip_ms": 3.21, "version": "6.1.1", "message": "answered in 3.21 ms"},
    "database": {
        "status": "ok",
        "round_trip_ms": 0.42,
        "message": "a query answered in 0.42 ms",
        "dialect": "sqlite",
        "driver": "pysqlite",
        "server_version": "SQLite 3.40.1",
        "schema_revision": "0009",
        "schema_head": "0009",
    },
    "service": {
        "status": "ok",
        "node": "hub-1",
        "pid": 42,
        "started_at": NOW.isoformat(),
        "uptime": 3725,
        "jobs": [
            {
                "name": "schedule",
                "interval": 5,
                "runs": 12,
                "failures": 0,
                "running": False,
                "last_error": None,
            },
            {
                "name": "usage",
                "interval": 15,
                "runs": 3,
                "failures": 1,
                "running": True,
                "last_error": "OSError: <boom>",
            },
        ],
    },
    "nodes": [
        {
            "name": "hub-1",
            "resource_group": "default",
            "status": "ALIVE",
            "plugin": "mock",
            "devices": 2,
            "last_seen": (NOW - timedelta(seconds=20)).isoformat(),
            "seen_ago": 20,
        },
        {
            "name": "gpu-7",
            "resource_group": "a100",
            "status": "LOST",
            "plugin": "nvidia",
            "devices": 8,
            "last_seen": (NOW - timedelta(hours=3)).isoformat(),
            "seen_ago": 10800,
        },
    ],
}


def test_the_status_board_colours_each_part():
    tiles = {name: (state, tone, lines) for name, state, tone, lines in information.tiles(INFO, NOW)}
    assert tiles["Fleet"][:2] == ("degraded", "warn")
    assert tiles["Database"][:2] == ("ok", "ok") and "SQLite 3.40.1" in tiles["Database"][2]
    assert tiles["Hub API"][2][0] == "JupyterHub 6.1.1"
    assert tiles["Nodes"][:2] == ("1 of 2 alive", "warn") and tiles["Nodes"][2] == ["10 devices in reach"]
    assert tiles["labfleet service"][1] == "warn"  # a job failed
    assert "up 1 h 2 min on hub-1 (pid 42)" in tiles["labfleet service"][2]
    html = information.board_html(INFO, NOW)
    assert 'data-part="Nodes" data-tone="warn"' in html
    assert information.tone("failed") == "bad" and information.tone("LOST") == "bad"


def test_versions_nodes_and_jobs_tables():
    rows = information.version_rows(INFO)
    assert rows[:3] == [
        ("labfleet", "0.1.0"),
        ("JupyterHub", "6.1.1"),
        ("JupyterHub (the running Hub)", "6.1.1"),
    ]
    assert ("Voila", "not installed") in rows and ("DB server", "SQLite 3.40.1") in rows
    assert rows[-1] == ("DB schema", "0009 (this code: 0009)")
    nodes = information.node_rows(INFO, NOW)
    assert (
        nodes[1][:2] == ["gpu-7", "a100"] and "lf-pill-bad" in nodes[1][2] and nodes[1][5] == "3 h 0 min ago"
    )
    jobs = information.job_rows(INFO)
    assert jobs[1] == ["usage", "every 15 s", "3 (running)", "1", "OSError: <boom>"]
    html = information.table_html(["job", "a", "b", "c", "last error"], jobs)
    assert "OSError: &lt;boom&gt;" in html


def test_the_information_page_builds():
    page = information.page(FakeClient("monitor", {("GET", "/info"): INFO}))
    text = text_of(page)
    assert "lf-board" in text and "gpu-7" in text and "SQLite 3.40.1" in text and "schedule" in text


# ---------------------------------------------------------------- configurations

CONF = {
    "settings": [
        {
            "name": "schedule_interval",
            "section": "scheduler",
            "value": 2.0,
            "source": "command line",
            "source_detail": None,
            "environment": ["LABFLEET_SCHEDULE_INTERVAL"],
            "help": "Seconds between two services.",
            "secret": False,
            "changes_at_run_time": False,
        },
        {
            "name": "idle_timeout",
            "section": "idle reclamation",
            "value": 900.0,
            "source": "environment",
            "source_detail": "LABFLEET_IDLE_TIMEOUT",
            "environment": ["LABFLEET_IDLE_TIMEOUT"],
            "help": "Seconds without activity.",
            "secret": False,
            "changes_at_run_time": False,
        },
        {
            "name": "storage_hosts",
            "section": "storage",
            "value": [{"name": "local", "path": "/srv/vf"}],
            "source": "config file",
            "source_detail": "/srv/labfleet_service_config.py",
            "environment": [],
            "help": "Storage hosts added at start.",
            "secret": False,
            "changes_at_run_time": False,
        },
        {
            "name": "service_token",
            "section": "security",
            "value": "(set, hidden)",
            "source": "environment",
            "source_detail": "JUPYTERHUB_API_TOKEN",
            "environment": ["JUPYTERHUB_API_TOKEN"],
            "help": "This service's token.",
            "secret": True,
            "changes_at_run_time": False,
        },
        {
            "name": "new_knob",
            "section": "other",
            "value": "",
            "source": "default",
            "source_detail": None,
            "environment": [],
            "help": "Something new.",
            "secret": False,
            "changes_at_run_time": False,
        },
    ],
    "sections": ["scheduler", "idle reclamation", "storage", "security", "other"],
    "config_file": {"name": "labfleet_service_config.py", "loaded": ["/srv/labfleet_service_config.py"]},
    "storage_hosts": [
        {
            "name": "local",
            "path": "/srv/vf",
            "is_active": True,
            "capacity": 0,
            "used": 2**30,
            "disk": {"total": 2**40, "free": 2**39},
            "default_permissions": ["create-vfolder"],
        }
    ],
    "run_time": [{"what": "storage hosts", "where": "/api/storage-hosts (superadmins)", "note": "n"}],
    "restart": "Restart the Hub.",
}


def test_settings_are_grouped_searched_and_shown_with_their_source():
    groups = configurations.by_section(CONF["settings"], CONF["sections"])
    assert [name for name, _ in groups] == ["scheduler", "idle reclamation", "storage", "security", "other"]
    assert [n for n, _ in configurations.by_section(CONF["settings"], CONF["sections"], "environment")] == [
        "idle reclamation",
        "security",
    ]
    assert configurations.by_section(CONF["settings"], CONF["sections"], "LABFLEET_SCHEDULE") == [
        ("scheduler", [CONF["settings"][0]])
    ]
    assert configurations.by_section(CONF["settings"], CONF["sections"], "nothing-like-this") == []
    html = configurations.settings_html(groups)
    assert html.count('class="lf-section-row"') == 5 and ">Idle reclamation<" in html
    assert 'data-setting="idle_timeout" data-source="environment"' in html
    assert "lf-src-env" in html and "LABFLEET_IDLE_TIMEOUT" in html and "lf-src-file" in html
    assert configurations.fmt_value("") == '""' and configurations.fmt_value([1, 2]) == "[1, 2]"
    assert configurations.fmt_value(5.0) == "5" and configurations.fmt_value(0.25) == "0.25"
    # The variables a default reads, when the help does not name them already
    assert configurations.help_line(CONF["settings"][0]).endswith(
        "Default read from $LABFLEET_SCHEDULE_INTERVAL."
    )
    assert configurations.help_line(CONF["settings"][1]) == "Seconds without activity."
    assert (
        configurations.fmt_value("x" * 500).endswith("…") and len(configurations.fmt_value("x" * 500)) == 160
    )
    assert configurations.source_counts(CONF["settings"]) == (
        "1 from the command line, 1 from the config file, 2 from the environment, 1 defaults"
    )


def test_the_configurations_page_builds_and_filters():
    page = configurations.page(FakeClient("admin", {("GET", "/configuration"): CONF}))
    text = text_of(page)
    assert "5 settings" in text and "None of these changes while the service runs" in text
    assert "/api/storage-hosts" in text and "/srv/vf" in text and "512 GiB" in text
    search = next(w for w in walk(page) if isinstance(w, W.Text))
    search.value = "idle"
    text = text_of(page)
    assert "idle_timeout" in text and "schedule_interval" not in text
    search.value = "zzz"
    assert "No setting matches “zzz”." in text_of(page)
