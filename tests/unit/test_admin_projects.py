"""The Domains & Projects page's pure parts, without a kernel: each cap beside what is held now, the
forms' text read into the API's bodies (caps in the console's slot format, one member at a time),
who may change what; then the page built against a stand-in service, its buttons clicked: what it
sends (a member removed only on the second click), what it shows when the service says no, and
that a monitor's controls are disabled."""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as W
import pytest

from labfleet.console import projects as PR
from labfleet.console.console import FormError, ServiceError

GIB = 2**30
DOMAINS = [
    {"name": "acme", "total_resource_slots": {"cpu": 64, "gpu.shares": 4}, "in_use": {"gpu.shares": 1.5}},
    {"name": "beta", "total_resource_slots": {}, "in_use": {}, "is_active": False},
]
PROJECTS = [
    {
        "domain": "acme",
        "name": "ml",
        "full_name": "acme/ml",
        "total_resource_slots": {"gpu.shares": 2, "mem": 32 * GIB},
        "in_use": {"gpu.shares": 1.5, "cpu": 0.5, "mem": 4 * GIB},
        "members": ["bob", "alice"],
        "is_active": True,
    },
    {
        "domain": "acme",
        "name": "empty",
        "full_name": "acme/empty",
        "total_resource_slots": {},
        "in_use": {},
        "members": [],
        "is_active": True,
    },
]


# ---------------------------------------------------------------- caps beside their use


def test_each_cap_has_its_use_beside_it_and_held_slots_without_a_cap_show_too():
    lines = PR.cap_lines(PROJECTS[0]["total_resource_slots"], PROJECTS[0]["in_use"])
    assert [ln["slot"] for ln in lines] == ["cpu", "mem", "gpu.shares"]  # known slots first
    by = {ln["slot"]: ln for ln in lines}
    assert by["gpu.shares"]["text"] == "1.5 of 2" and by["gpu.shares"]["cap"] == 2
    assert by["mem"]["text"] == "4 GiB of 32 GiB"
    assert by["cpu"]["text"] == "0.5 (no cap)" and by["cpu"]["cap"] is None
    # A capped slot nothing holds reads 0 of its cap
    (line,) = PR.cap_lines({"gpu": 2}, {})
    assert line["text"] == "0 of 2" and line["used"] == 0


def test_the_cap_cell_draws_a_meter_per_capped_slot_and_says_no_cap():
    cell = PR.caps_html({"gpu.shares": 2}, {"gpu.shares": 2, "cpu": 1})
    assert 'data-slot="gpu.shares"' in cell and "lf-meter lf-over" in cell and "2 of 2" in cell
    assert 'data-slot="cpu"' in cell and "1 (no cap)" in cell
    assert PR.caps_html({}, {}) == '<span class="lf-muted">no cap</span>'
    assert "&lt;b&gt;" in PR.caps_html({"<b>": 1}, {})  # names from the service are escaped


def test_the_tables_rows():
    rows = PR.domain_rows(DOMAINS, PROJECTS)
    assert [(r["name"], r["projects"], r["active"]) for r in rows] == [("acme", 2, True), ("beta", 0, False)]
    table = PR.domains_html(rows)
    assert 'data-domain="acme"' in table and "1.5 of 4" in table and "inactive" in table
    prows = PR.project_rows(PROJECTS)
    assert [r["full_name"] for r in prows] == ["acme/empty", "acme/ml"]  # by domain, then name
    assert prows[1]["members"] == ["alice", "bob"]
    table = PR.projects_html(prows)
    assert 'data-project="acme/ml"' in table and "alice, bob" in table and "none" in table
    assert "No project in your reach" in PR.projects_html([])
    assert "No domain in your reach" in PR.domains_html([])


# ---------------------------------------------------------------- the forms' bodies


def test_a_cap_is_written_as_on_the_policies_page_and_only_a_change_is_sent():
    before = PROJECTS[0]
    assert PR.cap_body("gpu.shares=2, mem=32g", before) == {}  # the same cap, written as people do
    assert PR.cap_body("mem=32g; gpu.shares=2.0", before) == {}
    assert PR.cap_body("gpu.shares=0.5, mem=32g", before) == {
        "total_resource_slots": {"gpu.shares": "0.5", "mem": "32g"}
    }
    assert PR.cap_body("", before) == {"total_resource_slots": {}}  # empty: no cap at all
    assert PR.cap_body("", PROJECTS[1]) == {}
    # Amounts are the service's to judge: a bad one is sent, and the service says what is wrong
    assert PR.cap_body("mem=12zz", before) == {"total_resource_slots": {"mem": "12zz"}}
    with pytest.raises(FormError, match="write NAME=AMOUNT"):
        PR.cap_body("gpu.shares", before)
    with pytest.raises(FormError, match="given twice"):
        PR.cap_body("cpu=1, cpu=2", before)


def test_new_project_and_domain_bodies():
    assert PR.new_project_body("acme", " vision ", "gpu=1") == {
        "domain": "acme",
        "name": "vision",
        "total_resource_slots": {"gpu": 1},
    }
    assert PR.new_project_body("acme", "vision", "", " Seeing ") == {
        "domain": "acme",
        "name": "vision",
        "description": "Seeing",
    }
    assert PR.new_domain_body("gamma", "cpu=16, mem=64g") == {
        "name": "gamma",
        "total_resource_slots": {"cpu": 16, "mem": "64g"},
    }
    for call in (lambda: PR.new_project_body("acme", " ", ""), lambda: PR.new_domain_body("", "")):
        with pytest.raises(FormError, match="write the"):
            call()


def test_members_are_added_one_at_a_time():
    assert PR.member_name(" carol ", ["alice"]) == "carol"
    with pytest.raises(FormError, match="already a member"):
        PR.member_name("alice", ["alice"])
    for text in ("a b", "a,b"):
        with pytest.raises(FormError, match="one user at a time"):
            PR.member_name(text, [])
    with pytest.raises(FormError, match="write the user name"):
        PR.member_name("", [])


def test_who_may_change_what():
    assert PR.read_only_reason("superadmin", "domain") == PR.read_only_reason("superadmin", "project") == ""
    assert PR.read_only_reason("admin", "project") == ""
    assert "only a superadmin" in PR.read_only_reason("admin", "domain")
    assert "monitor" in PR.read_only_reason("monitor", "project")
    assert PR.member_path("acme", "ml", "a@b") == "/projects/acme/ml/members/a%40b"
    assert PR.project_path("a/b", "c") == "/projects/a%2Fb/c"
    assert PR.domain_path("acme") == "/domains/acme"


# ---------------------------------------------------------------- the page against a stand-in service


class FakeService:
    def __init__(self, role: str = "superadmin") -> None:
        self.viewer, self.role = "viewer", role
        self.can_change = role in ("superadmin", "admin")
        self.domains = [dict(d) for d in DOMAINS]
        self.projects = [dict(p, members=list(p["members"])) for p in PROJECTS]
        self.sent: list[tuple[str, str, Any]] = []

    def get(self, path: str, **params: Any) -> Any:
        return {"/domains": self.domains, "/projects": self.projects}[path]

    def _write(self, method: str, path: str, body: Any) -> Any:
        self.sent.append((method, path, body))
        if self.role == "monitor":
            raise ServiceError("monitors cannot change anything", 403)
        if body and body.get("username") == "erin":
            raise ServiceError("user 'erin' is in domain 'beta', not 'acme'", 400)
        parts = path.split("/")
        if method == "DELETE" and len(parts) == 6:
            (p,) = [p for p in self.projects if p["name"] == parts[3]]
            p["members"].remove(parts[5])
        if method == "POST" and path.endswith("/members"):
            (p,) = [p for p in self.projects if p["name"] == parts[3]]
            p["members"].append(body["username"])
        if method == "PATCH" and parts[1] == "projects":
            (p,) = [p for p in self.projects if p["name"] == parts[3]]
            p.update(body)
        return body

    def post(self, path: str, body: Any = None) -> Any:
        return self._write("POST", path, body)

    def patch(self, path: str, body: Any) -> Any:
        return self._write("PATCH", path, body)

    def delete(self, path: str) -> Any:
        return self._write("DELETE", path, None)


def widgets(root: Any) -> list[Any]:
    out = [root]
    for child in getattr(root, "children", ()):
        out += widgets(child)
    return out


def with_class(root: Any, cls: str) -> list[Any]:
    return [w for w in widgets(root) if cls in getattr(w, "_dom_classes", ())]


def one(root: Any, cls: str) -> Any:
    (hit,) = with_class(root, cls)
    return hit


def text_of(root: Any) -> str:
    """What the page says (its HTML unescaped)."""
    return html.unescape(" ".join(str(getattr(w, "value", "")) for w in widgets(root) if hasattr(w, "value")))


def pick_project(page: Any, full: str) -> None:
    one(page, "lf-project-pick").value = full


def test_the_page_edits_a_cap_and_adds_and_removes_members_one_at_a_time():
    svc = FakeService("admin")
    page = PR.page(svc)
    pick_project(page, "acme/ml")
    assert one(page, "lf-project-cap").value == "mem=32g, gpu.shares=2"
    # Saving what is there sends nothing
    one(page, "lf-project-save").click()
    assert svc.sent == [] and "Nothing to save" in text_of(page)
    one(page, "lf-project-cap").value = "gpu.shares=0.5, mem=32g"
    one(page, "lf-project-save").click()
    assert svc.sent[-1] == (
        "PATCH",
        "/projects/acme/ml",
        {"total_resource_slots": {"gpu.shares": "0.5", "mem": "32g"}},
    )
    assert "Saved project acme/ml: cap mem=32g, gpu.shares=0.5." in text_of(page)
    # The page was built again with the same project chosen
    assert one(page, "lf-project-pick").value == "acme/ml"
    # Add: one name, sent; then a name the service refuses, in its own words
    one(page, "lf-member-name").value = "carol"
    one(page, "lf-member-add").click()
    assert svc.sent[-1] == ("POST", "/projects/acme/ml/members", {"username": "carol"})
    assert "Added carol to acme/ml." in text_of(page)
    one(page, "lf-member-name").value = "erin"
    one(page, "lf-member-add").click()
    assert "The labfleet service said: user 'erin' is in domain 'beta'" in text_of(page)
    # Remove: the first click asks, the second removes that one member only
    removes = with_class(page, "lf-member-remove")
    assert [b.tooltip for b in removes] == [f"Remove {u} from acme/ml" for u in ("alice", "bob", "carol")]
    n = len(svc.sent)
    removes[1].click()
    assert len(svc.sent) == n and removes[1].description == "Really remove?"
    assert "Remove bob from acme/ml? Their new sessions may not use it. Click again to go on." in text_of(
        page
    )
    removes[1].click()
    assert svc.sent[-1] == ("DELETE", "/projects/acme/ml/members/bob", None)
    assert svc.projects[0]["members"] == ["alice", "carol"]
    assert "Removed bob from acme/ml." in text_of(page)


def test_a_form_that_cannot_be_read_sends_nothing_and_says_why():
    svc = FakeService("superadmin")
    page = PR.page(svc)
    pick_project(page, "acme/ml")
    one(page, "lf-project-cap").value = "gpu.shares"
    one(page, "lf-project-save").click()
    assert "write NAME=AMOUNT" in text_of(page)
    one(page, "lf-new-domain-name").value = ""
    one(page, "lf-create-domain").click()
    assert "write the domain's name" in text_of(page)
    assert svc.sent == []
    # A superadmin creates a domain and a project
    one(page, "lf-new-domain-name").value = "gamma"
    one(page, "lf-new-domain-cap").value = "gpu=2"
    one(page, "lf-create-domain").click()
    assert svc.sent[-1] == ("POST", "/domains", {"name": "gamma", "total_resource_slots": {"gpu": 2}})
    one(page, "lf-new-project-name").value = "vision"
    one(page, "lf-create-project").click()
    assert svc.sent[-1] == ("POST", "/projects", {"domain": "acme", "name": "vision"})


def test_a_domain_admin_may_not_change_a_domain_and_a_monitor_nothing():
    admin = PR.page(FakeService("admin"))
    assert "only a superadmin changes a domain" in text_of(admin)
    for cls in ("lf-domain-cap", "lf-domain-save", "lf-create-domain"):  # no domain form, only why
        assert with_class(admin, cls) == [], cls
    assert not one(admin, "lf-project-save").disabled and not one(admin, "lf-member-add").disabled
    svc = FakeService("monitor")
    mona = PR.page(svc)
    assert "a monitor changes nothing" in text_of(mona)
    pick_project(mona, "acme/ml")
    controls = [
        "lf-domain-save",
        "lf-create-domain",
        "lf-project-cap",
        "lf-project-save",
        "lf-project-delete",
        "lf-member-name",
        "lf-member-add",
        "lf-create-project",
    ]
    for cls in controls:
        assert one(mona, cls).disabled, cls
    assert all(b.disabled for b in with_class(mona, "lf-member-remove"))
    assert not one(mona, "lf-project-pick").disabled  # reading is fine
    assert svc.sent == []


def test_deleting_a_project_asks_twice():
    svc = FakeService("superadmin")
    page = PR.page(svc)
    pick_project(page, "acme/empty")
    delete = one(page, "lf-project-delete")
    delete.click()
    assert svc.sent == [] and delete.description == "Really delete project?"
    delete.click()
    assert svc.sent == [("DELETE", "/projects/acme/empty", None)]
    assert isinstance(page, W.VBox)
