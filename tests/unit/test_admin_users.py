"""The Users page's pure helpers (admin_dashboards/users.py) without a kernel or a service: the CSV
parser and its row checks, the list's search and pages, what an edit sends; and the page's widgets
against a stand-in for the service (what is sent, what is disabled for a monitor)."""

from __future__ import annotations

from typing import Any

import pytest

import labfleet.console.console as console
from labfleet.console import userforms as F
from labfleet.console import users as U
from labfleet.console.console import ServiceError

HEADER = "username,email,domain,role,projects,password\n"


def parse(body: str, **kw: Any) -> F.CsvImport:
    return F.parse_csv(HEADER + body, **kw)


# ---------------------------------------------------------------- good rows


def test_good_rows_become_the_service_bodies():
    out = parse(
        "jdoe,jdoe@example.org,acme,user,ml;vision,secret-pass-1\n"
        "kim,,acme,admin,,\n"
        "lee,lee@example.org,acme,,acme/ml,\n"
    )
    assert out.problems == [] and [r.problems for r in out.rows] == [[], [], []]
    assert [r.line for r in out.ready] == [2, 3, 4]
    assert out.rows[0].body == {
        "username": "jdoe",
        "email": "jdoe@example.org",
        "domain": "acme",
        "role": "user",
        "projects": ["acme/ml", "acme/vision"],
        "password": "secret-pass-1",
    }
    # Empty optional cells are left out: the service's defaults apply (role user, no password)
    assert out.rows[1].body == {"username": "kim", "domain": "acme", "role": "admin"}
    assert out.rows[2].body["projects"] == ["acme/ml"] and "role" not in out.rows[2].body
    assert out.summary() == "3 row(s): 3 ready."


def test_headers_are_read_as_people_write_them():
    out = F.parse_csv(
        "User name, E-mail ,Full name,Project\njdoe,j@x.org,Jane Doe,ml\n", default_domain="acme"
    )
    assert out.columns == ["username", "email", "full_name", "projects"]
    assert out.rows[0].body == {
        "username": "jdoe",
        "email": "j@x.org",
        "full_name": "Jane Doe",
        "domain": "acme",
        "projects": ["acme/ml"],
    }


def test_the_default_domain_fills_rows_without_one_and_a_cell_wins():
    out = F.parse_csv("username,domain\na,\nb,beta\n", default_domain="acme")
    assert [r.body["domain"] for r in out.rows] == ["acme", "beta"]


def test_blank_lines_comments_bom_and_short_rows_are_fine():
    out = F.parse_csv(
        "\ufeff# users for the spring course\nusername,email,role\n\njdoe\n  \nkim,k@x.org\n", "acme"
    )
    assert [r.body["username"] for r in out.ready] == ["jdoe", "kim"]
    assert [r.line for r in out.rows] == [4, 6]  # lines as the file numbers them


def test_role_and_status_are_case_blind_and_domain_admin_means_admin():
    out = F.parse_csv("username,role,status\na,Domain Admin,INACTIVE\nb,Monitor,active\n", "acme")
    assert [(r.body["role"], r.body["status"]) for r in out.rows] == [
        ("admin", "inactive"),
        ("monitor", "active"),
    ]


def test_a_password_is_taken_as_typed():
    out = parse('jdoe,,acme,user,," secret with spaces "\n')
    assert out.rows[0].body["password"] == " secret with spaces "


# ---------------------------------------------------------------- malformed rows


@pytest.mark.parametrize(
    "row, problem",
    [
        ("Jane Doe,,acme,user,,", "username must be 1-128 lower-case letters"),
        (",j@x.org,acme,user,,", "username is missing"),
        ("jdoe,,acme,boss,,", "role must be one of superadmin, admin, user, monitor (got 'boss')"),
        ("jdoe,,Acme Corp,user,,", "domain must be 1-64 lower-case letters"),
        ("jdoe,not-an-address,acme,user,,", "email must look like name@example.org"),
        ("jdoe,,acme,user,,short", "password must be at least 8 characters"),
        ("jdoe,,acme,user,beta/web,", "project beta/web is not in the user's domain 'acme'"),
        ("jdoe,,acme,user,ML!,", "project must be 1-64 lower-case letters"),
        ("jdoe,,,user,,", "domain is missing"),
    ],
)
def test_a_malformed_row_says_what_is_wrong(row, problem):
    out = parse(row + "\n" + "kim,,acme,user,,\n")
    bad, good = out.rows
    assert any(problem in p for p in bad.problems), bad.problems
    assert not bad.ok and good.ok
    assert [r.line for r in out.ready] == [3]  # the good row is still created
    assert out.summary() == "2 row(s): 1 ready, 1 with problems (not created)."


def test_a_bad_status_is_refused():
    out = F.parse_csv("username,status\njdoe,sleeping\n", "acme")
    assert out.rows[0].problems == ["status must be one of active, inactive (got 'sleeping')"]


def test_a_row_with_more_values_than_columns_is_malformed():
    out = parse("jdoe,j@x.org,acme,user,ml,secret-pass-1,extra\n")
    assert out.rows[0].problems[0] == "7 values but the header names 6 columns"
    assert out.ready == []


def test_every_problem_of_a_row_is_listed():
    (row,) = parse("Bad,nope,acme,boss,,short\n").rows
    assert len(row.problems) == 4, row.problems


def test_duplicates_in_the_file_and_existing_users():
    out = parse("jdoe,,acme,user,,\nkim,,acme,user,,\njdoe,,acme,admin,,\n", existing={"kim"})
    assert out.rows[0].ok
    assert out.rows[1].problems == ["user 'kim' already exists"]
    assert out.rows[2].problems == ["username 'jdoe' is already on line 2"]
    assert [r.body["username"] for r in out.ready] == ["jdoe"]


# ---------------------------------------------------------------- files that are wrong as a whole


@pytest.mark.parametrize(
    "text, problem",
    [
        ("", "the file is empty"),
        ("\n# only a comment\n", "the file is empty"),
        ("username,slots\njdoe,cpu=4\n", "unknown column(s) 'slots' on line 1"),
        ("jdoe,j@x.org,acme\n", "unknown column(s) 'jdoe', 'j@x.org', 'acme'"),
        ("email,domain\nj@x.org,acme\n", "there is no username column"),
        ("username,email,e-mail\njdoe,a@b.c,a@b.c\n", "column(s) email named twice"),
        ('username,email\njdoe,"a@b.c\n', "this is not CSV"),
    ],
)
def test_a_wrong_file_creates_nothing(text, problem):
    out = F.parse_csv(text, "acme")
    assert any(problem in p for p in out.problems), out.problems
    assert out.ready == []
    assert out.summary().startswith("Nothing can be created from this file")


def test_too_many_rows_or_bytes():
    rows = "".join(f"u{i}\n" for i in range(F.MAX_CSV_ROWS + 1))
    assert "at most 1000 users at once" in F.parse_csv("username\n" + rows, "acme").problems[0]
    huge = "username\n" + "x" * (F.MAX_CSV_BYTES + 1)
    assert "larger than" in F.parse_csv(huge, "acme").problems[0]


# ---------------------------------------------------------------- the form, the list, the edits


def test_check_user_takes_the_forms_values():
    body, problems = F.check_user(
        {
            "username": "  jdoe ",
            "domain": "acme",
            "role": "user",
            "projects": ["acme/ml", "acme/ml"],
            "password": "",
            "resource_policy": F.NONE,
        }
    )
    assert problems == []
    assert body == {"username": "jdoe", "domain": "acme", "role": "user", "projects": ["acme/ml"]}
    assert F.check_user({"username": "x", "domain": "acme", "resource_policy": "Bad Policy"})[1] == [
        "resource_policy must be 1-64 lower-case letters, digits, '-' or '_', starting and ending "
        "with a letter or digit (got 'Bad Policy')"
    ]


def test_split_projects():
    assert F.split_projects("ml; vision |acme/nlp  cv,x") == ["ml", "vision", "acme/nlp", "cv", "x"]
    assert F.split_projects(["a", " ", "b"]) == ["a", "b"]


USER = {
    "username": "jdoe",
    "full_name": "Jane Doe",
    "email": "jane@example.org",
    "role": "user",
    "status": "active",
    "domain": "acme",
    "projects": ["acme/ml"],
    "resource_policy": None,
}


@pytest.mark.parametrize(
    "search, role, status, found",
    [
        ("", None, None, True),
        ("JANE", None, None, True),
        ("example.org doe", None, None, True),
        ("jane bob", None, None, False),
        ("", "user", "active", True),
        ("", "admin", None, False),
        ("", None, "inactive", False),
    ],
)
def test_matches(search, role, status, found):
    assert F.matches(USER, search, role, status) is found


def test_page_label():
    assert F.page_label(0, 20, 57) == "1–20 of 57"
    assert F.page_label(40, 17, 57) == "41–57 of 57"
    assert F.page_label(0, 0, 0) == "no users"


def test_grantable_roles():
    assert F.grantable_roles("superadmin") == F.ROLES
    assert F.grantable_roles("admin") == ("user", "admin")


def test_user_changes_sends_only_what_differs():
    same = dict(role="user", status="active", projects=["acme/ml"], resource_policy=F.NONE)
    assert F.user_changes(USER, **same) == {}
    assert F.user_changes(USER, **{**same, "status": "inactive", "projects": []}) == {
        "status": "inactive",
        "projects": [],
    }
    assert F.user_changes(USER, **{**same, "resource_policy": "big"}, password="new-pass-12") == {
        "resource_policy": "big",
        "password": "new-pass-12",
    }
    assert F.user_changes({**USER, "resource_policy": "big"}, **same) == {"resource_policy": None}


def test_check_rate_limit():
    assert F.check_rate_limit(100) is None
    assert "between 1 and 10000000" in F.check_rate_limit(0)
    assert F.check_rate_limit(True) == "rate limit must be a whole number"


# ---------------------------------------------------------------- the page against a stand-in service


class FakeService:
    """What UsersPage calls on ``client()``, answering from lists like the service would."""

    def __init__(self, role: str = "superadmin", domain: str = "root") -> None:
        self.viewer = "viewer"
        self.role = role
        self.can_change = role in ("superadmin", "admin")
        self.users = [
            {**USER, "username": f"u{i:02d}", "email": f"u{i:02d}@example.org"} for i in range(25)
        ] + [{**USER, "username": "zed", "role": "admin", "email": "zed@example.org"}]
        self.sent: list[tuple[str, str, Any]] = []
        self._domain = domain

    def me(self) -> dict[str, Any]:
        return {"domain": {"name": self._domain}}

    def request(
        self, method: str, path: str, *, params: Any = None, json: Any = None, pages: bool = False
    ) -> Any:
        assert (method, path, pages) == ("GET", "/users", True)
        off, lim = params["offset"], params["limit"]
        # The service's filters, by the rule tests/test_pagination.py holds its SQL to
        found = [
            u
            for u in self.users
            if F.matches(u, params.get("search", ""), params.get("role"), params.get("status"))
            and params.get("domain") in (None, u.get("domain"))
        ]
        nxt = {"offset": off + lim, "limit": lim, "url": ""} if off + lim < len(found) else None
        return {
            "items": found[off : off + lim],
            "_pagination": {"offset": off, "limit": lim, "total": len(found), "next": nxt},
        }

    def everything(self, path: str, **params: Any) -> list[Any]:
        assert path == "/users"
        return list(self.users)

    def get(self, path: str, **params: Any) -> Any:
        return {
            "/domains": [{"name": "acme"}, {"name": "root"}],
            "/projects": [{"domain": "acme", "name": "ml"}],
            "/policies/user": [{"name": "big"}],
            "/policies/keypair": [{"name": "default"}],
            "/keypairs": [],
        }[path]

    def post(self, path: str, body: Any = None) -> Any:
        self.sent.append(("POST", path, body))
        if body.get("username") == "taken":
            raise ServiceError("user 'taken' already exists", 409)
        return {**body, "domain": body.get("domain")}

    def patch(self, path: str, body: Any) -> Any:
        self.sent.append(("PATCH", path, body))
        return {}


@pytest.fixture
def service(monkeypatch):
    def make(role: str = "superadmin") -> FakeService:
        fake = FakeService(role)
        monkeypatch.setattr(console, "_current", fake)
        return fake

    return make


def test_the_list_pages_through_the_service_and_searches_in_the_kernel(service):
    service()
    page = U.UsersPage(page_size=10)
    assert "1–10 of 26" in page.where.value and page.prev.disabled and not page.next.disabled
    page.next.click()
    assert "11–20 of 26" in page.where.value
    page.search.value = "zed"  # a search reads every user in reach, filters and pages here
    assert "1–1 of 1" in page.where.value and page.next.disabled
    page.search.value = ""
    page.role_filter.value = "admin"
    assert "1–1 of 1" in page.where.value


def test_a_monitor_gets_every_writing_button_disabled(service):
    service("monitor")
    page = U.UsersPage()
    assert page.create_button.disabled and page.import_button.disabled and page.kp_issue.disabled
    buttons = [w for w in page.listing.children[0].children if isinstance(w, U.W.Button)]
    writes = [b for b in buttons if not b.description == "Keypairs"]
    assert writes and all(b.disabled for b in writes)
    assert not any(b.disabled for b in buttons if b.description == "Keypairs")
    assert page.new_role.options == F.ROLES


def test_the_import_creates_the_ready_rows_and_shows_each_answer(service):
    fake = service()
    page = U.UsersPage()
    page.csv_text.value = HEADER + "new1,,acme,user,ml,\nBAD,,acme,user,,\ntaken,,acme,user,,\n"
    page.preview_button.click()
    assert "3 row(s): 2 ready, 1 with problems" in page.csv_note.value
    assert page.import_button.description == "Create 2 user(s)" and not page.import_button.disabled
    page.import_button.click()
    assert [b["username"] for _, _, b in fake.sent] == ["new1", "taken"]
    assert (
        "Created 1 user(s); the service refused 1; 1 row(s) with problems not created." in page.csv_note.value
    )
    cells = " ".join(getattr(w, "value", "") for w in page.csv_table.children[0].children)
    assert "The labfleet service said: user &#x27;taken&#x27; already exists" in cells
    assert page.import_button.disabled  # once per preview
    page.csv_text.value += "more,,acme,user,,\n"
    assert page.csv_table.children == () and "preview again" in page.csv_note.value


def test_the_form_checks_before_it_sends_and_a_domain_admin_gives_only_user_or_admin(service):
    fake = service("admin")
    page = U.UsersPage()
    assert page.new_role.options == ("user", "admin")
    page.new_username.value = "Not Valid"
    page.create_button.click()
    assert "Not created: username must be" in page.create_note.value and fake.sent == []
    page.new_username.value = "okname"
    page.new_domain.value = "acme"
    page.new_projects.value = ("acme/ml",)
    page.create_button.click()
    assert fake.sent == [
        ("POST", "/users", {"username": "okname", "domain": "acme", "role": "user", "projects": ["acme/ml"]})
    ]
    assert "Created user okname" in page.create_note.value


def test_an_edit_sends_what_changed(service):
    fake = service()
    page = U.UsersPage()
    page._edit(dict(fake.users[0]))
    page.edit_status.value = "inactive"
    page.edit_policy.value = "big"
    page._save()
    assert fake.sent == [("PATCH", "/users/u00", {"status": "inactive", "resource_policy": "big"})]


def test_projects_are_checked_one_by_one_and_a_click_keeps_the_others():
    checks = U.ProjectChecks()
    checks.options = [("ml", "acme/ml"), ("vision", "acme/vision"), ("nlp", "acme/nlp")]
    checks.value = ("acme/ml",)
    vision = next(box for box in checks.children[1].children if getattr(box, "description", "") == "vision")
    vision.value = True  # one click: ml stays
    assert checks.value == ("acme/ml", "acme/vision")
    checks.options = [("ml", "acme/ml"), ("cv", "acme/cv")]  # another domain's list keeps what is still there
    assert checks.value == ("acme/ml",)
    assert [label for label, _ in checks.options] == ["ml", "cv"]
