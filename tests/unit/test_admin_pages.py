"""The Resource policies, Environments and Storage pages' pure parts, without a kernel: the forms'
text read into the API's bodies (slots, sizes, times, storage host grants, ports, lists) with good
and bad input, only what changed sent on an edit, the tables' rows, the quota bars' SVG; then each
page built against a stand-in service, its buttons clicked: what it sends, what it shows when the
form or the service says no, and that a domain admin's and a monitor's forms are read only."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import pytest

from labfleet.console import domains as D
from labfleet.console import environments as E
from labfleet.console import policies as P
from labfleet.console import storage as S
from labfleet.console import userenvs as U
from labfleet.console.console import ServiceError

GIB = 2**30
KEYPAIR = {
    "name": "default",
    "total_resource_slots": {"cpu": 8, "mem": 32 * GIB, "gpu.shares": 2.5},
    "default_for_unspecified": "UNLIMITED",
    "max_concurrent_sessions": 3,
    "max_pending_sessions": 0,
    "max_session_lifetime": 0,
    "idle_timeout": -1,
    "allowed_storage_hosts": ["local"],
}
FOLDER_POLICY = {"name": "small", "max_vfolder_count": 10, "max_quota_scope_size": GIB, "max_vfolder_size": 0}
USER_POLICY = {**FOLDER_POLICY, "max_keypairs": 10, "max_endpoints": 0, "max_replicas_per_endpoint": 0}
DOMAINS = [
    {"name": "acme", "total_resource_slots": {"cpu": 8}, "allowed_keypair_policies": [], "is_active": True},
    {"name": "beta", "total_resource_slots": {}, "allowed_keypair_policies": ["gold", "default"]},
]


# ---------------------------------------------------------------- policies: reading the form


def test_slots_text_becomes_the_api_body_and_leaves_amounts_to_the_service():
    assert P.parse_slots("cpu=8, mem=32g, gpu.shares=2.5") == {"cpu": 8, "mem": "32g", "gpu.shares": "2.5"}
    assert P.parse_slots("cpu = 2 ;\n gpu:A100=1") == {"cpu": 2, "gpu:A100": 1}
    assert P.parse_slots("") == {} and P.parse_slots("  ,  ") == {}
    # An amount the service will refuse goes through as written, for the service's own message
    assert P.parse_slots("mem=12zz") == {"mem": "12zz"}


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("cpu", "cannot read 'cpu': write NAME=AMOUNT"),
        ("cpu=", "cannot read 'cpu=': write NAME=AMOUNT"),
        ("=4", "cannot read '=4'"),
        ("cpu=1, cpu=2", "slot 'cpu' is given twice"),
    ],
)
def test_slots_text_that_cannot_be_read_says_why(text, said):
    with pytest.raises(P.FormError, match="total_resource_slots: " + said.replace("(", r"\(")):
        P.parse_slots(text)


def test_sizes_times_and_counts():
    assert P.parse_size("10g", "q") == 10 * GIB
    assert P.parse_size("512 MiB", "q") == 512 * 2**20
    assert P.parse_size("1.5t", "q") == 1.5 * 2**40
    assert P.parse_size("0", "q") == 0 and P.parse_size("-1", "q") == -1  # the service says no to -1
    for bad in ("12zz", "1.3b", "ten", ""):
        with pytest.raises(P.FormError, match="^q: "):
            P.parse_size(bad, "q")
    assert P.parse_duration("3600", "t") == 3600
    assert P.parse_duration("1h30m", "t") == 5400
    assert P.parse_duration("7d", "t") == 7 * 86400 and P.parse_duration("1w 2d", "t") == 9 * 86400
    assert P.parse_duration("-1", "t") == -1
    for bad in ("soon", "2x", "1h30", ""):
        with pytest.raises(P.FormError, match="^t: "):
            P.parse_duration(bad, "t")
    assert P.parse_count(" 12 ", "n") == 12
    with pytest.raises(P.FormError, match="'1.5' is not a whole number"):
        P.parse_count("1.5", "n")


def test_storage_host_grants():
    assert P.parse_hosts("local\nnfs") == ["local", "nfs"]
    assert P.parse_hosts("local; nfs: mount-in-session, download-file") == {
        "local": list(P.RIGHTS),
        "nfs": ["mount-in-session", "download-file"],
    }
    assert P.parse_hosts("") == []
    with pytest.raises(P.FormError, match="host 'local' is given twice"):
        P.parse_hosts("local\nlocal")
    with pytest.raises(P.FormError, match="cannot read 'two words'"):
        P.parse_hosts("two words")
    # and back: a host with every right is written bare
    assert P.fmt_hosts_text({"local": list(P.RIGHTS), "nfs": ["upload-file"]}) == "local\nnfs: upload-file"


def test_the_form_round_trips_a_policy_and_an_edit_sends_only_what_changed():
    form = P.form_values("keypair", KEYPAIR)
    assert form["total_resource_slots"] == "cpu=8, mem=32g, gpu.shares=2.5"
    assert (form["idle_timeout"], form["max_session_lifetime"]) == ("-1", "0")
    assert P.policy_body("keypair", form, KEYPAIR) == {}  # unchanged: nothing to send
    form.update(total_resource_slots="cpu=8, mem=34359738368, gpu.shares=2.50", max_concurrent_sessions="5")
    form["idle_timeout"] = "2h"
    assert P.policy_body("keypair", form, KEYPAIR) == {"max_concurrent_sessions": 5, "idle_timeout": 7200}
    form["total_resource_slots"] = "cpu=8, mem=12zz"
    assert P.policy_body("keypair", form, KEYPAIR)["total_resource_slots"] == {"cpu": 8, "mem": "12zz"}
    # A create sends every field
    body = P.policy_body("user", P.form_values("user", P.DEFAULTS["user"]))
    assert body == {
        "max_vfolder_count": 0,
        "max_quota_scope_size": 0,
        "max_vfolder_size": 0,
        "max_environments": 3,
        "max_environment_bytes": 0,
        "max_keypairs": 10,
        "max_endpoints": 0,
        "max_replicas_per_endpoint": 0,
    }
    # A project policy has no serving nor keypair limits, and the same environment limits
    project = P.policy_body("project", P.form_values("project", P.DEFAULTS["project"]))
    assert (project["max_environments"], project["max_environment_bytes"]) == (3, 0)
    assert "max_keypairs" not in P.policy_body("project", P.form_values("project", P.DEFAULTS["project"]))
    assert "max_endpoints" not in P.policy_body("project", P.form_values("project", P.DEFAULTS["project"]))
    folder = P.form_values("user", USER_POLICY)
    assert folder["max_quota_scope_size"] == "1g"
    folder["max_vfolder_size"] = "200m"
    folder["max_endpoints"] = "3"
    folder["max_keypairs"] = "0"
    assert (folder["max_environments"], folder["max_environment_bytes"]) == ("3", "0")  # the defaults
    folder["max_environment_bytes"] = "20g"
    assert P.policy_body("user", folder, USER_POLICY) == {
        "max_vfolder_size": 200 * 2**20,
        "max_environment_bytes": 20 * GIB,
        "max_endpoints": 3,
        "max_keypairs": 0,
    }
    folder["max_environments"] = "three"
    with pytest.raises(P.FormError, match="max_environments: 'three' is not a whole number"):
        P.policy_body("user", folder, USER_POLICY)
    folder["max_environments"] = "3"
    folder["max_vfolder_count"] = "many"
    with pytest.raises(P.FormError, match="max_vfolder_count: 'many' is not a whole number"):
        P.policy_body("user", folder, USER_POLICY)


def test_the_policy_tables_rows():
    (row,) = P.policy_rows("keypair", [KEYPAIR], {"default": 2})
    assert row == [
        "default",
        "cpu 8, mem 32 GiB, gpu.shares 2.5; others: no limit",
        "3",
        "no limit",
        "fleet default",
        "no limit",
        "local (every right)",
        "2 keypairs",
    ]
    limited = {
        **KEYPAIR,
        "default_for_unspecified": "LIMITED",
        "idle_timeout": 0,
        "max_session_lifetime": 5400,
    }
    limited["allowed_storage_hosts"] = {"nfs": ["download-file", "mount-in-session"]}
    (row,) = P.policy_rows("keypair", [limited], None)
    assert row[1].endswith("others: none") and row[4] == "never" and row[5] == "1 h 30 min"
    assert row[6] == "nfs (mount-in-session, download-file)" and row[7] == "—"
    # No environment limits given (an older service's answer): the defaults
    (row,) = P.policy_rows("project", [FOLDER_POLICY], {})
    assert row == ["small", "10", "1 GiB", "no limit", "3", "no limit", "nobody"]
    envs = {"max_environments": 0, "max_environment_bytes": 50 * GIB}
    assert P.policy_rows("user", [{**USER_POLICY, **envs, "max_keypairs": 3}], {"small": 1}) == [
        ["small", "10", "1 GiB", "no limit", "no limit", "50 GiB", "3", "no limit", "no limit", "1 user"]
    ]
    assert len(P.COLUMNS["user"]) == 10 and len(P.COLUMNS["project"]) == 7
    assert P.usage_counts(
        [{"resource_policy": "a"}, {"resource_policy": "a"}, {"resource_policy": None}]
    ) == {"a": 2}
    html = P.policies_html("user", [["<b>", "1", "2", "3", "4"]])
    assert 'data-policy="&lt;b&gt;"' in html and "<td><b>&lt;b&gt;</b></td>" in html


# ---------------------------------------------------------------- domains: keypair policies their admins may give


def test_a_domains_keypair_policies_in_the_form_and_the_table():
    assert D.parse_policy_names("gold, silver\nbronze;gold") == ["gold", "silver", "bronze"]
    assert D.parse_policy_names("  ") == []
    assert D.fmt_policy_names(["gold", "silver"]) == "gold, silver"
    # Only a changed list is sent; an emptied one clears it; order counts (the first is new users')
    assert D.domain_body("gold,default", DOMAINS[1]) == {}
    assert D.domain_body("default, gold", DOMAINS[1]) == {"allowed_keypair_policies": ["default", "gold"]}
    assert D.domain_body("", DOMAINS[1]) == {"allowed_keypair_policies": []}
    assert D.domain_rows(DOMAINS) == [
        ["acme", "cpu 8", "none: bounded by its caps (new users get default)", "active"],
        ["beta", "no cap", "gold, default (new users get gold)", "active"],
    ]
    html = D.domains_html([["<b>", "1", "2", "3"]])
    assert 'data-domain="&lt;b&gt;"' in html and "<td><b>&lt;b&gt;</b></td>" in html
    assert "No domain" in D.domains_html([])


# ---------------------------------------------------------------- environments


IMAGE = {
    "name": "labfleet/pytorch:2.5",
    "display_name": "PyTorch 2.5",
    "min_resource_slots": {"cpu": 1, "mem": 2 * GIB},
    "accelerators": ["cuda"],
    "service_ports": [{"name": "tensorboard", "protocol": "http", "port": 6006}],
    "projects": ["acme/ml"],
    "domains": [],
    "labels": {"ai.labfleet.display-name": "PyTorch 2.5", "maintainer": "x"},
    "is_active": True,
    "created_at": "2026-11-24T10:00:00+00:00",
}


def test_registering_reads_the_form_and_with_docker_labels_leaves_empty_fields_to_them():
    form = {
        "name": " labfleet/r:4 ",
        "display_name": "",
        "min_resource_slots": "cpu=1, mem=2g",
        "accelerators": [],
        "service_ports": "rstudio:http:8787\nshiny:http:3838",
        "projects": "acme/ml, acme/ml beta/web",
        "domains": "",
        "is_active": True,
    }
    assert E.register_body(form) == {
        "name": "labfleet/r:4",
        "min_resource_slots": {"cpu": 1, "mem": "2g"},
        "accelerators": [],
        "service_ports": ["rstudio:http:8787", "shiny:http:3838"],
        "projects": ["acme/ml", "beta/web"],
        "domains": [],
    }
    labelled = E.register_body({"name": "x:1", "inspect": True, "min_resource_slots": "", "is_active": False})
    assert labelled == {"name": "x:1", "inspect": True, "is_active": False}
    with pytest.raises(P.FormError, match="name: give the image's reference"):
        E.register_body({"name": "  "})
    with pytest.raises(P.FormError, match="service_ports: cannot read 'web:ftp:21'"):
        E.register_body({"name": "x:1", "service_ports": "web:ftp:21"})
    with pytest.raises(P.FormError, match="min_resource_slots: cannot read 'cpu'"):
        E.register_body({"name": "x:1", "min_resource_slots": "cpu"})


def test_an_image_edit_sends_only_what_changed():
    form = E.form_values(IMAGE)
    assert form["service_ports"] == "tensorboard:http:6006" and form["min_resource_slots"] == "cpu=1, mem=2g"
    assert E.image_patch(IMAGE, form) == {}
    form.update(
        display_name="PyTorch", domains="beta", accelerators=[], min_resource_slots="cpu=1, mem=2048m"
    )
    assert E.image_patch(IMAGE, form) == {"display_name": "PyTorch", "accelerators": [], "domains": ["beta"]}
    form["min_resource_slots"] = "mem=12zz"
    assert E.image_patch(IMAGE, form)["min_resource_slots"] == {"mem": "12zz"}


def test_the_images_rows():
    (row,) = E.image_rows([IMAGE])
    assert row == [
        "labfleet/pytorch:2.5",
        "PyTorch 2.5",
        "cpu 1, mem 2 GiB",
        "cuda",
        "tensorboard (http 6006)",
        "projects acme/ml",
        "active",
        "display-name=PyTorch 2.5",
        "2026-11-24 10:00",
    ]
    bare = {"name": "x:1", "is_active": False}
    assert E.image_rows([bare])[0][2:8] == ["none", "none", "none", "everyone", "inactive", "—"]
    assert E.image_path("repo/x:1") == "/images/repo%2Fx%3A1"
    assert 'data-image="x:1"' in E.images_html(E.image_rows([bare]))


# ---------------------------------------------------------------- storage


HOST = {
    "name": "local",
    "description": "this machine",
    "capacity": 0,
    "used": 3 * 2**20,
    "is_active": True,
    "disk": {"total": 100 * GIB, "free": 40 * GIB},
    "rights": ["create-vfolder", "mount-in-session"],
    "path": "/srv/vfolders",
    "default_permissions": ["mount-in-session"],
}
FOLDER = {
    "id": "f-1",
    "name": "data",
    "host": "local",
    "owner": "user:alice",
    "owner_kind": "user",
    "domain": "acme",
    "usage_mode": "general",
    "status": "READY",
    "created_at": "2026-11-24T10:00:00+00:00",
    "usage": {"bytes": 1536, "files": 2, "trash_bytes": 512, "scanned_at": None},
    "limits": {
        "max_size": 0,
        "scope": {
            "kind": "user",
            "name": "alice",
            "used": 1536,
            "limit": GIB,
            "folders": 1,
            "max_folders": 10,
        },
    },
}


def test_hosts_rows_and_table():
    (row,) = S.host_rows([HOST])
    assert row.used_text == "3 MiB, no cap" and row.disk_text == "40 GiB free of 100 GiB"
    assert row.rights == "create-vfolder, mount-in-session" and row.defaults == "mount-in-session"
    html = S.hosts_html([row])
    assert 'data-host="local"' in html and "/srv/vfolders" in html and 'style="width: 60.0%"' in html
    # A user-level answer has no path nor defaults, and a disk that could not be read
    plain = {k: v for k, v in HOST.items() if k not in ("path", "default_permissions")} | {"disk": None}
    (row,) = S.host_rows([plain])
    assert row.disk_text == "unreadable" and "path" not in S.hosts_html([row])


def test_folder_rows_paging_and_search():
    (row,) = S.folder_rows([FOLDER])
    assert row == [
        "data",
        "user:alice",
        "local",
        "general",
        "ready",
        "1.5 KiB (512 B in trash)",
        "2",
        "no limit",
        "user alice: 1.5 KiB of 1 GiB, 1 of 10 folders",
        "2026-11-24 10:00",
    ]
    assert S.page_text(20, 20, 57) == "21–40 of 57 folders" and S.page_text(0, 0, 0) == "no folder"
    assert S.matches(FOLDER, "ALICE") and not S.matches(FOLDER, "bob")
    assert S.first_owner([{"owner": "project:acme/ml", "owner_kind": "project"}, FOLDER]) == "alice"
    assert [S.list_scope(r) for r in ("superadmin", "monitor", "admin", "user")] == [
        "all",
        "all",
        "domain",
        "mine",
    ]


def test_quota_scopes_as_bars():
    usage = {
        "user": "alice",
        "scopes": [
            {"kind": "user", "name": "alice", "used": 900, "reserved": 100, "limit": 1000, "folders": 2,
             "max_folders": 2, "max_folder_size": 0},
            {"kind": "project", "name": "acme/ml", "used": 2 * GIB, "reserved": 0, "limit": 0, "folders": 1,
             "max_folders": 0, "max_folder_size": 0},
        ],
    }  # fmt: skip
    mine, project = S.scope_bars(usage)
    assert mine.fraction == 1.0 and mine.text == "900 B + 100 B reserved of 1000 B (100 %), 2 of 2 folders"
    assert project.fraction is None and project.text == "2 GiB, no limit, 1 folder"
    svg = S.scopes_svg([mine, project])
    root = ET.fromstring(svg)
    groups = [g for g in root.iter("{http://www.w3.org/2000/svg}g")]
    assert [
        (g.get("data-kind"), g.get("data-name"), g.get("data-used"), g.get("data-limit")) for g in groups
    ] == [
        ("user", "alice", "900", "1000"),
        ("project", "acme/ml", str(2 * GIB), "0"),
    ]
    assert "--jp-error-color1" in svg  # full
    assert "No quota scope." in S.scopes_svg([])


# ---------------------------------------------------------------- users' environments

ENVS = [
    {"id": "e-1", "name": "numpy", "owner": "user:alice", "base": "labfleet/pytorch:2.5", "status": "READY",
     "status_reason": "", "size_bytes": 3 * GIB, "created_at": "2026-11-24T10:00:00+00:00",
     "image": "labfleet-env:0a1b2c"},
    {"id": "e-2", "name": "<b>", "owner": "project:acme/ml", "base": "labfleet/pytorch:2.5", "status": "FAILED",
     "status_reason": "step 2 failed: " + "x" * 300, "size_bytes": 0, "created_at": None},
    {"id": "e-3", "name": "web", "owner": "user:alice", "base": "labfleet/pytorch:2.5", "status": "QUEUED",
     "status_reason": "", "size_bytes": 0, "created_at": "2026-11-25T10:00:00+00:00"},
]  # fmt: skip


def test_users_environments_rows_summary_and_bars():
    rows = U.env_rows(U.items_of({"items": ENVS}))
    assert [(r.label, r.status, r.size, r.created) for r in rows] == [
        ("user:alice/numpy", "READY", "3 GiB", "2026-11-24 10:00"),
        ("project:acme/ml/<b>", "FAILED", "—", "—"),
        ("user:alice/web", "QUEUED", "—", "2026-11-25 10:00"),
    ]
    assert U.items_of(ENVS) == ENVS and U.items_of({"items": None}) == []
    failed = U.status_html(rows[1])
    assert "lf-badge-bad" in failed and "&lt;b&gt;" not in failed  # the reason, not the name
    # cut in the cell, whole in the tooltip
    assert failed.count("x" * 300) == 1 and failed.endswith("x…</div>")
    assert "lf-badge-wait" in U.status_html(rows[2]) and "lf-env-reason" not in U.status_html(rows[2])
    assert U.summary(rows, "superadmin") == (
        "3 environments in the fleet: 1 ready, 1 queued or building, 1 failed; their images take 3 GiB."
    )
    assert U.summary(rows[:1], "admin").startswith("1 environment of your domain: 1 ready")
    assert U.summary([], "monitor").startswith("No environment in the fleet yet")
    owners = U.owner_sizes(rows)
    assert [(o.owner, o.bytes, o.count, o.text) for o in owners] == [
        ("user:alice", 3 * GIB, 2, "3 GiB, 2 environments (1 not built)"),
        ("project:acme/ml", 0, 1, "0 B, 1 environment (1 not built)"),
    ]
    root = ET.fromstring(U.sizes_svg(owners))
    groups = list(root.iter("{http://www.w3.org/2000/svg}g"))
    assert [(g.get("data-owner"), g.get("data-bytes"), g.get("data-count")) for g in groups] == [
        ("user:alice", str(3 * GIB), "2"),
        ("project:acme/ml", "0", "1"),
    ]
    many = [U.OwnerSize(f"user:u{i}", i, 1, 1) for i in range(20, 0, -1)]
    svg = U.sizes_svg(many, most=15)
    assert svg.count('class="lf-env-owner"') == 15 and "and 5 more owners: 15 B" in svg
    assert "No environment." in U.sizes_svg([])
    assert U.env_path("a/b") == "/environments/a%2Fb"
    assert U.read_only_reason("admin") == "" and "monitor" in U.read_only_reason("monitor")
    # Promote: a superadmin's, on a READY environment only
    assert [r.image for r in rows] == ["labfleet-env:0a1b2c", "", ""]
    assert [U.can_promote("superadmin", r) for r in rows] == [True, False, False]
    assert not any(U.can_promote(role, rows[0]) for role in ("admin", "monitor", "user"))
    assert U.promote_path("a/b") == "/environments/a%2Fb/image"
    assert U.promote_warning(rows[0]).startswith("Register image labfleet-env:0a1b2c for everyone?")
    # Registered already (promoted): no Promote, a badge that says so.
    (registered,) = U.env_rows([{**ENVS[0], "registered": True}])
    assert not U.can_promote("superadmin", registered) and not rows[0].registered
    assert "registered image" in U.status_html(registered)
    assert "registered image" not in U.status_html(rows[0])


# ---------------------------------------------------------------- the pages against a stand-in service


class FakeService:
    """What the pages call on their client, answering from lists as the service would."""

    def __init__(self, role: str = "superadmin") -> None:
        self.viewer = "viewer"
        self.role = role
        self.can_change = role in ("superadmin", "admin")
        self.policies: dict[str, list[dict[str, Any]]] = {
            "keypair": [dict(KEYPAIR)],
            "user": [dict(FOLDER_POLICY)],
            "project": [],
        }
        self.images = [dict(IMAGE)]
        self.environments = [dict(e) for e in ENVS]
        self.domains = [dict(d) for d in DOMAINS]
        self.sent: list[tuple[str, str, Any]] = []

    def get(self, path: str, **params: Any) -> Any:
        if path.startswith("/policies/"):
            return self.policies[path.split("/")[2]]
        if path == "/vfolders/usage":
            if params.get("user") == "nobody":
                raise ServiceError("no user 'nobody'", 404)
            return {"user": params["user"], "scopes": [{"kind": "user", "name": params["user"], "used": 5,
                    "reserved": 0, "limit": 10, "folders": 1, "max_folders": 0, "max_folder_size": 0}]}  # fmt: skip
        return {
            "/keypairs": [{"resource_policy": "default"}],
            "/idle-checkers": [],
            "/projects": [],
            "/images": self.images,
            "/environments": {"items": self.environments},
            "/storage-hosts": [HOST],
            "/domains": self.domains,
        }[path]

    def everything(self, path: str, **params: Any) -> list[Any]:
        if path == "/vfolders":
            return self.folders(params)
        return {"/users": [{"resource_policy": "small"}]}[path]

    def folders(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        every = [dict(FOLDER, id=f"f-{i}", name=f"d{i:02d}") for i in range(45)]
        # The service's search, by the rule tests/test_pagination.py holds its SQL to
        return [f for f in every if S.matches(f, params.get("search", ""))]

    def request(
        self, method: str, path: str, *, params: Any = None, json: Any = None, pages: bool = False
    ) -> Any:
        assert (method, path, pages) == ("GET", "/vfolders", True)
        items = self.folders(params)
        off, lim = params.get("offset", 0), params["limit"]
        return {"items": items[off : off + lim], "_pagination": {"total": len(items), "offset": off}}

    def _write(self, method: str, path: str, body: Any) -> Any:
        self.sent.append((method, path, body))
        if isinstance(body, dict) and any("12zz" in str(v) for v in body.values()):
            raise ServiceError("total_resource_slots: slot 'mem': cannot read '12zz' (write e.g. 512m)", 400)
        if isinstance(body, dict) and "nope" in body.get("allowed_keypair_policies", ()):
            raise ServiceError(
                "allowed_keypair_policies: no keypair policy named 'nope' (create it first)", 409
            )
        if path.startswith("/domains/"):
            (domain,) = [d for d in self.domains if d["name"] == path.split("/")[2]]
            domain.update(body)
        if method == "DELETE" and path.startswith("/environments/"):
            env_id = path.split("/")[2]
            if env_id == "e-3":
                raise ServiceError("environment web is being deleted already", 409)
            self.environments = [e for e in self.environments if e["id"] != env_id]
        if method == "POST" and path.startswith("/environments/") and path.endswith("/image"):
            return self.promote(path.split("/")[2])
        return body

    def promote(self, env_id: str) -> dict[str, Any]:
        """``POST /environments/{id}/image`` as the service answers it."""
        if self.role != "superadmin":
            raise ServiceError("only a superadmin promotes an environment to a registered image", 403)
        (env,) = [e for e in self.environments if e["id"] == env_id]
        if env["status"] != "READY":
            raise ServiceError(
                f"environment {env['name']} is {env['status']}: only a READY one is promoted", 409
            )
        if any(i["name"] == env["image"] for i in self.images):
            raise ServiceError(f"image {env['image']} is registered already", 409)
        shown = f"{env['name']} (from {env['owner']})"
        image = {**IMAGE, "name": env["image"], "display_name": shown, "projects": [], "labels": {}}
        self.images.append(image)
        return image

    def post(self, path: str, body: Any = None) -> Any:
        return self._write("POST", path, body)

    def patch(self, path: str, body: Any) -> Any:
        return self._write("PATCH", path, body)

    def delete(self, path: str) -> Any:
        return self._write("DELETE", path, None)


def widgets(root: Any) -> list[Any]:
    """Every widget under ``root``, depth first."""
    out = [root]
    for child in getattr(root, "children", ()):
        out += widgets(child)
    return out


def find(root: Any, cls: type, description: str) -> Any:
    (hit,) = [
        w for w in widgets(root) if isinstance(w, cls) and getattr(w, "description", None) == description
    ]
    return hit


def editor(root: Any, kind: str) -> Any:
    (box,) = [w for w in widgets(root) if f"lf-policy-{kind}" in getattr(w, "_dom_classes", ())]
    return box


def text_of(root: Any) -> str:
    return " ".join(str(getattr(w, "value", "")) for w in widgets(root) if hasattr(w, "value"))


def test_the_policies_page_sends_what_changed_and_shows_the_services_refusal():
    fake = FakeService()
    page = P.page(fake)
    assert "2 keypairs" not in text_of(page) and "1 keypair" in text_of(page) and "1 user" in text_of(page)
    form = editor(page, "keypair")
    find(form, P.W.Text, "Max sessions").value = "5"
    find(form, P.W.Button, "Save changes").click()
    assert fake.sent == [("PATCH", "/policies/keypair/default", {"max_concurrent_sessions": 5})]
    assert "Saved keypair policy default: max_concurrent_sessions." in text_of(page)
    # Bad input: the parser's message, nothing sent
    form = editor(page, "keypair")
    find(form, P.W.Text, "Total slots").value = "cpu"
    find(form, P.W.Button, "Save changes").click()
    assert "total_resource_slots: cannot read" in text_of(form) and len(fake.sent) == 1
    # An amount only the service can judge: its message
    find(form, P.W.Text, "Total slots").value = "cpu=8, mem=12zz"
    find(form, P.W.Button, "Save changes").click()
    assert "The labfleet service said: total_resource_slots: slot &#x27;mem&#x27;" in text_of(form)


def test_the_policies_page_creates_and_deletes_with_a_second_click():
    fake = FakeService()
    page = P.page(fake)
    form = editor(page, "project")  # no project policy yet: the form is a new one
    find(form, P.W.Text, "Name").value = "team"
    find(form, P.W.Text, "Storage quota").value = "100g"
    find(form, P.W.Button, "Create project policy").click()
    assert fake.sent[-1] == (
        "POST",
        "/policies/project",
        {
            "name": "team",
            "max_vfolder_count": 0,
            "max_quota_scope_size": 100 * GIB,
            "max_vfolder_size": 0,
            "max_environments": 3,
            "max_environment_bytes": 0,
        },
    )
    form = editor(page, "user")
    delete = find(form, P.W.Button, "Delete")
    delete.click()
    assert delete.description == "Really delete small?" and fake.sent[-1][0] == "POST"
    delete.click()
    assert fake.sent[-1] == ("DELETE", "/policies/user/small", None)


@pytest.mark.parametrize(("role", "why"), [("admin", "only a superadmin"), ("monitor", "a monitor changes")])
def test_policies_are_read_only_for_everyone_but_a_superadmin(role, why):
    page = P.page(FakeService(role))
    # No project policy: nothing to show in a read-only form, and no "new policy" to offer
    assert not [w for w in widgets(page) if "lf-policy-project" in getattr(w, "_dom_classes", ())]
    for kind in ("keypair", "user"):
        form = editor(page, kind)
        assert P.NEW not in [v for _, v in find(form, P.W.Dropdown, "Policy").options]
        assert why in text_of(form)
        inputs = [w for w in widgets(form) if isinstance(w, (P.W.Text, P.W.Textarea, P.W.Button))]
        assert inputs and all(w.disabled for w in inputs)


def domain_form(root: Any) -> Any:
    (box,) = [w for w in widgets(root) if "lf-domain-form" in getattr(w, "_dom_classes", ())]
    return box


def test_a_superadmin_chooses_a_domains_keypair_policies_on_the_policies_page():
    fake = FakeService()
    page = P.page(fake)
    assert "none: bounded by its caps (new users get default)" in text_of(page)
    form = domain_form(page)
    assert find(form, D.W.Text, "Keypair policies").value == ""  # acme, the first domain
    find(form, D.W.Text, "Keypair policies").value = "gold, nope"
    find(form, D.W.Button, "Save domain").click()
    assert "The labfleet service said: allowed_keypair_policies: no keypair policy named" in text_of(form)
    assert fake.domains[0]["allowed_keypair_policies"] == []
    find(form, D.W.Text, "Keypair policies").value = "gold"
    find(form, D.W.Button, "Save domain").click()
    assert fake.sent[-1] == ("PATCH", "/domains/acme", {"allowed_keypair_policies": ["gold"]})
    assert "Saved domain acme: keypair policies its admins may give: gold." in text_of(page)
    assert "gold (new users get gold)" in text_of(page)  # the table follows
    # Another domain's list in the form; saving what it already says sends nothing
    form = domain_form(page)
    find(form, D.W.Dropdown, "Domain").value = "beta"
    assert find(form, D.W.Text, "Keypair policies").value == "gold, default"
    sent = len(fake.sent)
    find(form, D.W.Button, "Save domain").click()
    assert len(fake.sent) == sent and "Nothing to save" in text_of(form)


@pytest.mark.parametrize(("role", "why"), [("admin", "only a superadmin"), ("monitor", "a monitor changes")])
def test_a_domains_keypair_policies_are_read_only_for_everyone_but_a_superadmin(role, why):
    form = domain_form(P.page(FakeService(role)))
    assert why in text_of(form)
    assert find(form, D.W.Text, "Keypair policies").disabled
    assert find(form, D.W.Button, "Save domain").disabled


def test_the_environments_page_registers_edits_and_removes():
    fake = FakeService()
    page = E.page(fake)
    form = next(w for w in widgets(page) if "lf-image-form" in getattr(w, "_dom_classes", ()))
    pick = find(form, E.W.Dropdown, "Image")
    assert pick.value == "labfleet/pytorch:2.5" and "display-name=PyTorch 2.5" in text_of(form)
    find(form, E.W.Text, "Display name").value = "Torch"
    find(form, E.W.Button, "Save changes").click()
    assert fake.sent == [("PATCH", "/images/labfleet%2Fpytorch%3A2.5", {"display_name": "Torch"})]
    form = next(w for w in widgets(page) if "lf-image-form" in getattr(w, "_dom_classes", ()))
    find(form, E.W.Dropdown, "Image").value = E.NEW
    find(form, E.W.Text, "Reference").value = "labfleet/r:4"
    find(form, E.W.Textarea, "Apps").value = "rstudio:http"
    find(form, E.W.Button, "Register image").click()
    assert "service_ports: cannot read &#x27;rstudio:http&#x27;" in text_of(form) and len(fake.sent) == 1
    find(form, E.W.Textarea, "Apps").value = "rstudio:http:8787"
    find(form, E.W.Button, "Register image").click()
    assert fake.sent[-1][:2] == ("POST", "/images") and fake.sent[-1][2]["service_ports"] == [
        "rstudio:http:8787"
    ]
    assert "Registered image labfleet/r:4." in text_of(page)
    form = next(w for w in widgets(page) if "lf-image-form" in getattr(w, "_dom_classes", ()))
    remove = find(form, E.W.Button, "Remove")
    remove.click()
    remove.click()
    assert fake.sent[-1][0] == "DELETE"


def test_the_environments_page_is_read_only_for_a_monitor():
    page = E.page(FakeService("monitor"))
    form = next(w for w in widgets(page) if "lf-image-form" in getattr(w, "_dom_classes", ()))
    assert E.NEW not in [v for _, v in find(form, E.W.Dropdown, "Image").options]  # nothing to register
    assert "An image in detail" in text_of(page)
    buttons = [w for w in widgets(form) if isinstance(w, E.W.Button)]
    assert buttons and all(b.disabled for b in buttons)
    # Every user's environment, and no Delete for a monitor
    text = text_of(page)
    assert "3 environments in the fleet" in text and "Read only: a monitor changes nothing." in text
    assert 'data-environment="e-1"' in text_of(page)
    assert not [w for w in widgets(page) if isinstance(w, E.W.Button) and w.description == "Delete"]


def env_delete(page: Any, label: str) -> Any:
    tip = f"Delete environment {label}"
    (b,) = [w for w in widgets(page) if isinstance(w, U.W.Button) and w.tooltip == tip]
    return b


def test_the_environments_page_deletes_a_users_environment_with_a_second_click():
    fake = FakeService()
    page = E.page(fake)
    assert "user:alice" in text_of(page) and "project:acme/ml" in text_of(page)
    delete = env_delete(page, "user:alice/numpy")
    delete.click()
    assert delete.description == "Really delete?" and "Delete environment user:alice/numpy?" in text_of(page)
    assert fake.sent == []
    delete.click()
    assert fake.sent == [("DELETE", "/environments/e-1", None)]
    assert "Deleted environment user:alice/numpy." in text_of(page)
    assert 'data-environment="e-1"' not in text_of(page)  # the page was built anew
    assert "2 environments in the fleet" in text_of(page)
    # A refusal: the service's words, the button asks again
    delete = env_delete(page, "user:alice/web")
    delete.click()
    assert "Its build stops." in text_of(page)
    delete.click()
    assert "The labfleet service said: environment web is being deleted already" in text_of(page)
    assert delete.description == "Delete" and 'data-environment="e-3"' in text_of(page)
    # Refresh clears the message
    find(page, E.W.Button, "Refresh").click()
    assert "The labfleet service said" not in text_of(page)


def promote_buttons(page: Any) -> list[Any]:
    return [w for w in widgets(page) if isinstance(w, U.W.Button) and "lf-env-promote" in w._dom_classes]


@pytest.mark.parametrize("role", ["superadmin", "admin", "monitor"])
def test_only_a_superadmin_gets_promote_and_only_on_a_ready_environment(role):
    page = E.page(FakeService(role))
    assert 'data-environment="e-1"' in text_of(page) and 'data-environment="e-3"' in text_of(page)
    tips = [b.tooltip for b in promote_buttons(page)]  # the READY one's, not the FAILED nor QUEUED one's
    assert tips == (
        ["Promote environment user:alice/numpy to a registered image"] if role == "superadmin" else []
    )


def test_a_superadmin_promotes_a_ready_environment_to_a_registered_image():
    fake = FakeService()
    page = E.page(fake)
    assert 'data-image="labfleet-env:0a1b2c"' not in text_of(page)
    (promote,) = promote_buttons(page)
    promote.click()
    assert promote.description == "Really promote?" and fake.sent == []
    assert "Register image labfleet-env:0a1b2c for everyone?" in text_of(page)
    promote.click()
    assert fake.sent == [("POST", "/environments/e-1/image", None)]
    text = text_of(page)
    assert "Promoted environment user:alice/numpy to registered image labfleet-env:0a1b2c." in text
    assert 'data-image="labfleet-env:0a1b2c"' in text  # the images table was built anew
    # Promoted already: the service's 409, the button asks again
    (promote,) = promote_buttons(page)
    promote.click()
    promote.click()
    assert fake.sent[-1] == ("POST", "/environments/e-1/image", None) and len(fake.sent) == 2
    assert "The labfleet service said: image labfleet-env:0a1b2c is registered already" in text_of(page)
    assert promote.description == "Promote" and "Promoted environment" not in text_of(page)
    assert len(fake.images) == 2


def test_the_storage_page_pages_folders_and_shows_quotas():
    page = S.page(FakeService())
    text = text_of(page)
    assert 'data-host="local"' in text and "Every folder of the fleet. 45 in all" in text
    assert "1–20 of 45 folders" in text and 'data-name="alice"' in text  # the first owner's quotas
    find(page, S.W.Button, "Next").click()
    assert "21–40 of 45 folders" in text_of(page)
    (search,) = [w for w in widgets(page) if isinstance(w, S.W.Text) and "search" in w.placeholder]
    search.value = "d4"
    assert "1–5 of 5 folders" in text_of(page) and find(page, S.W.Button, "Next").disabled
    user = find(page, S.W.Text, "User")
    user.value = "nobody"
    assert "The labfleet service said: no user &#x27;nobody&#x27;" in text_of(page)
