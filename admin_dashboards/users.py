"""The admin console's Users page: users in reach, one or many new users, edits, keypairs.

``notebooks/users.ipynb`` is one cell that calls :func:`show`; everything else lives here so that it
can be read, tested and reused. Two halves:

- **Pure helpers** (no widgets, no service) in :mod:`labfleet.console.userforms`: the CSV import
  and its row checks, the list's search and pages, what an edit changes.
- **The page** (:class:`UsersPage`): ipywidgets built from :mod:`labfleet.console.console`'s parts.
  Every call goes through ``client()``, as the viewer: the service decides what a domain admin or a
  monitor may see and do, and its refusals are shown in its own words. Buttons that change something
  are disabled for monitors (``client().can_change``); the service refuses them anyway.

The service's user list filters (domain, search, role, status) and pages (offset/limit) in its
DB; :func:`matches` is the same rule in Python (a test holds the two together).
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import ipywidgets as W
from IPython.display import display

from labfleet.console.console import ServiceError, client, confirm_first, grid, header, message
from labfleet.console.userforms import (
    ALL,
    ANY,
    CSV_COLUMNS,
    DEFAULT_RATE_LIMIT,
    MAX_CSV_BYTES,
    MAX_RATE_LIMIT,
    NONE,
    PAGE_SIZES,
    ROLES,
    STATUSES,
    CsvImport,
    check_rate_limit,
    check_user,
    grantable_roles,
    page_label,
    parse_csv,
    user_changes,
)
from labfleet.core.passwords import check_password_strength

# ---------------------------------------------------------------- the page (widgets, as the viewer)

STYLE = """<style>
.lf-hint { color: var(--jp-ui-font-color2, #666); font-size: var(--jp-ui-font-size1, 13px); }
.lf-users h3 { font-size: var(--jp-content-font-size2, 1.2em); margin: 0.8em 0 0.3em 0; }
.lf-secret { border: 2px solid var(--jp-warn-color1, #f57c00); background: var(--jp-warn-color3, #fff3e0);
  border-radius: 4px; padding: 8px 12px; margin: 6px 0; color: var(--jp-ui-font-color1, #222);
  font-family: var(--jp-ui-font-family, sans-serif); }
.lf-secret code { font-family: var(--jp-code-font-family, monospace); font-size: 1.05em;
  background: var(--jp-layout-color1, #fff); padding: 1px 4px; user-select: all; }
.lf-secret th { text-align: left; padding-right: 12px; }
.lf-badge-inactive { color: var(--jp-ui-font-color2, #777); font-style: italic; }
.lf-users-panel { border: 1px solid var(--jp-border-color2, #ddd); border-radius: 4px; padding: 6px 12px;
  margin-top: 8px; background: var(--jp-layout-color1, #fff); }
</style>"""


def _hint(text: str) -> str:
    """A quiet line of explanation (HTML), in JupyterLab's secondary text colour."""
    return f'<div class="lf-admin lf-users"><div class="lf-hint">{html.escape(text)}</div></div>'


def _html(text: str, cls: str = "") -> Any:
    """An escaped text cell, with a CSS class (``lf-error``, ``lf-ok``...)."""
    body = html.escape(text)
    return W.HTML(f'<span class="{cls}">{body}</span>' if cls else body)


class ProjectChecks(W.HBox):
    """A user's projects as one checkbox each: a click adds or removes that project alone (a
    multi-select drops every other choice on a plain click). ``options``: (label, value) pairs;
    ``value``: the checked values, as a tuple, like a SelectMultiple's. Laid out as the other
    fields are: the description in the label column, the boxes beside it."""

    def __init__(self, description: str = "Projects") -> None:
        super().__init__()
        self.add_class("lf-project-checks")
        self.add_class("widget-inline-hbox")  # ipywidgets' own label column
        self._boxes: list[tuple[str, W.Checkbox]] = []
        self._list = W.VBox()
        self.children = [W.Label(description), self._list]

    @property
    def options(self) -> list[tuple[str, str]]:
        return [(box.description, value) for value, box in self._boxes]

    @options.setter
    def options(self, pairs: Sequence[tuple[str, str]]) -> None:
        keep = set(self.value)
        self._boxes = [
            (value, W.Checkbox(value=value in keep, description=label, indent=False))
            for label, value in pairs
        ]
        empty = [W.HTML('<div class="lf-hint">no project in this domain</div>')] if not pairs else []
        self._list.children = [*empty, *(box for _, box in self._boxes)]

    @property
    def value(self) -> tuple[str, ...]:
        return tuple(value for value, box in self._boxes if box.value)

    @value.setter
    def value(self, chosen: Sequence[str]) -> None:
        wanted = set(chosen)
        for value, box in self._boxes:
            box.value = value in wanted


class UsersPage:
    """The widgets of the Users page and what their buttons do, as the viewer."""

    def __init__(self, page_size: int = 20) -> None:
        """Read what the forms offer (domains, projects, policies in the viewer's reach) and the
        first page of users; raises ServiceError when the viewer may read none of it."""
        self.c = client()
        self.can_change = self.c.can_change
        self.offset = 0
        self.editing: dict[str, Any] | None = None
        self.csv: CsvImport | None = None
        self._policies: dict[str, list[str]] = {}
        domains = [d["name"] for d in self.c.get("/domains")]
        self.domains = domains
        mine = (self.c.me().get("domain") or {}).get("name")
        home = mine if mine in domains else (domains[0] if domains else None)
        roles = grantable_roles(self.c.role)
        lay = W.Layout

        # -- the list
        self.search = W.Text(
            description="Search",
            placeholder="name or e-mail",
            continuous_update=False,
            layout=lay(width="280px"),
        )
        self.search.add_class("lf-users-search")
        self.domain_filter = W.Dropdown(options=[ALL, *domains], value=ALL, description="Domain")
        self.role_filter = W.Dropdown(options=[ANY, *ROLES], value=ANY, description="Role")
        self.status_filter = W.Dropdown(options=[ANY, *STATUSES], value=ANY, description="Status")
        for w in (self.domain_filter, self.role_filter, self.status_filter):
            w.layout = lay(width="220px")
        self.page_size = W.Dropdown(
            options=PAGE_SIZES, value=page_size, description="Per page", layout=lay(width="160px")
        )
        self.prev = self._button("‹ Previous", "Previous page", self._prev, writes=False)
        self.next = self._button("Next ›", "Next page", self._next, writes=False)
        self.where = W.HTML()
        self.where.add_class("lf-users-where")
        self.listing = W.VBox()
        self.list_note = W.HTML()
        self.editor = W.VBox()
        for w in (self.search, self.domain_filter, self.role_filter, self.status_filter, self.page_size):
            w.observe(self._filters_changed, "value")

        # -- one new user
        self.new_username = W.Text(description="Username", placeholder="lower-case, e.g. jdoe")
        self.new_email = W.Text(description="E-mail", placeholder="optional")
        self.new_full_name = W.Text(description="Full name", placeholder="optional")
        self.new_domain = W.Dropdown(options=domains, value=home, description="Domain")
        self.new_role = W.Dropdown(options=roles, value="user", description="Role")
        self.new_projects = ProjectChecks()
        self.new_password = W.Password(description="Password", placeholder="optional: 8+ characters")
        self.new_policy = W.Dropdown(options=[NONE], value=NONE, description="Policy")
        for w in (self.new_username, self.new_email, self.new_full_name, self.new_password):
            w.layout = lay(width="360px")
        for w, cls in (
            (self.new_username, "lf-new-username"),
            (self.new_email, "lf-new-email"),
            (self.new_domain, "lf-new-domain"),
            (self.new_role, "lf-new-role"),
            (self.new_projects, "lf-new-projects"),
            (self.new_password, "lf-new-password"),
        ):
            w.add_class(cls)
        self.create_note = W.HTML()
        self.new_domain.observe(lambda _: self._safely(self._domain_chosen, self.create_note), "value")
        self.create_button = self._button(
            "Create user", "Create this user", self._create_one, style="primary"
        )
        self.create_button.add_class("lf-create-user")

        # -- many new users from a CSV
        self.csv_text = W.Textarea(
            placeholder="username,email,domain,role,projects,password\njdoe,jdoe@example.org,acme,user,ml,",
            layout=lay(width="760px", height="160px"),
        )
        self.csv_text.add_class("lf-csv-text")
        self.csv_upload = W.FileUpload(
            accept=".csv,text/csv,text/plain", multiple=False, description="Open CSV"
        )
        self.csv_upload.add_class("lf-csv-upload")
        self.csv_upload.observe(self._uploaded, "value")
        self.csv_domain = W.Dropdown(
            options=[NONE, *domains],
            value=home or NONE,
            description="Domain for rows without one",
            style={"description_width": "initial"},
        )
        self.csv_domain.layout = lay(width="360px", margin="2px 0 2px 16px")
        self.csv_domain.add_class("lf-csv-domain")
        self.csv_text.observe(self._csv_edited, "value")
        self.csv_domain.observe(self._csv_edited, "value")
        self.preview_button = self._button("Preview", "Check every row", self._preview, writes=False)
        self.preview_button.add_class("lf-csv-preview")
        self.import_button = self._button("Create users", "Create the rows without problems", self._import)
        self.import_button.add_class("lf-csv-create")
        self.import_button.disabled = True
        self.csv_note = W.HTML()
        self.csv_table = W.VBox()

        # -- keypairs
        self.kp_user = W.Text(description="User", placeholder="username", continuous_update=False)
        self.kp_user.add_class("lf-kp-user")
        self.kp_user.observe(lambda _: self._show_keypairs(), "value")
        self.kp_show = self._button(
            "Show", "Show this user's keypairs", lambda: self._show_keypairs(), writes=False
        )
        self.kp_policy = W.Dropdown(options=["default"], value="default", description="Policy")
        self.kp_rate = W.BoundedIntText(
            value=DEFAULT_RATE_LIMIT,
            min=1,
            max=MAX_RATE_LIMIT,
            description="Rate limit",
            layout=lay(width="240px"),
        )
        self.kp_issue = self._button(
            "Issue keypair", "Issue a new keypair for this user", self._issue, style="primary"
        )
        self.kp_issue.add_class("lf-kp-issue")
        self.kp_secret = W.VBox()
        self.kp_list = W.VBox()
        self.kp_note = W.HTML()

        if not self.can_change:  # a monitor reads: nothing to fill in where nothing can be sent
            for w in (
                self.new_username,
                self.new_email,
                self.new_full_name,
                self.new_domain,
                self.new_role,
                self.new_projects,
                self.new_password,
                self.new_policy,
                self.kp_policy,
                self.kp_rate,
            ):
                w.disabled = True
            self.list_note.value = _hint(f"Read only: as a {self.c.role} you see users and change nothing.")
            self.create_note.value = self.list_note.value

        self.tabs = W.Tab(
            children=[self._list_tab(), self._create_tab(), self._csv_tab(), self._keypair_tab()],
            titles=("Users", "Create user", "Import CSV", "Keypairs"),
        )
        self._fill_projects(self.new_projects, self.new_domain.value)
        self.new_policy.options = [NONE, *self._policy_names("user")]
        self.kp_policy.options = self._policy_names("keypair") or ["default"]
        self.kp_policy.value = "default" if "default" in self.kp_policy.options else self.kp_policy.options[0]
        self.refresh()

    # ---- building blocks

    def _button(
        self, label: str, tip: str, action: Callable[[], Any], *, writes: bool = True, style: str = ""
    ) -> Any:
        """A button whose ``action`` runs with errors shown on the page; one that writes is disabled
        for viewers who may change nothing (monitors)."""
        b = W.Button(
            description=label, tooltip=tip, button_style=style, disabled=writes and not self.can_change
        )
        b.on_click(lambda _: self._safely(action))
        return b

    def _safely(self, action: Callable[[], Any], note: Any = None) -> None:
        """Run ``action``; a refusal of the service (or a failure) becomes a message, not a silent
        traceback in the kernel's log."""
        note = note if note is not None else self._current_note()
        try:
            action()
        except ServiceError as e:
            note.value = message(f"The labfleet service said: {e.message}", error=True).value
        except Exception as e:  # noqa: BLE001 (a page shows what went wrong rather than nothing)
            note.value = message(f"Something went wrong: {type(e).__name__}: {e}", error=True).value

    def _current_note(self) -> Any:
        """The message line of the tab in front, where a button's answer belongs."""
        return [self.list_note, self.create_note, self.csv_note, self.kp_note][self.tabs.selected_index or 0]

    def _policy_names(self, kind: str) -> list[str]:
        """Names of the ``kind`` (user, keypair) policies, read once per page."""
        if kind not in self._policies:
            try:
                self._policies[kind] = sorted(p["name"] for p in self.c.get(f"/policies/{kind}"))
            except ServiceError:
                self._policies[kind] = []
        return self._policies[kind]

    def _domain_chosen(self) -> None:
        """Another domain in the form: offer its projects."""
        self._fill_projects(self.new_projects, self.new_domain.value)

    def _fill_projects(self, select: Any, domain: str | None, chosen: Sequence[str] = ()) -> None:
        """Offer ``domain``'s projects (values ``domain/name``) in ``select``, with ``chosen`` selected."""
        options: list[tuple[str, str]] = []
        if domain:
            options = [
                (p["name"], f"{p['domain']}/{p['name']}") for p in self.c.get("/projects", domain=domain)
            ]
        known = {v for _, v in options}
        options += [(ref, ref) for ref in chosen if ref not in known]  # keep what the user has
        select.value = ()
        select.options = options
        select.value = tuple(ref for ref in chosen)

    @staticmethod
    def _section(title: str, hint: str = "") -> Any:
        tip = f'<div class="lf-hint">{html.escape(hint)}</div>' if hint else ""
        return W.HTML(f'<div class="lf-admin lf-users"><h3>{html.escape(title)}</h3>{tip}</div>')

    def _list_tab(self) -> Any:
        return W.VBox(
            [
                W.HBox([self.search, self.domain_filter, self.role_filter, self.status_filter]),
                self.list_note,
                self.listing,
                W.HBox([self.prev, self.next, self.where, self.page_size]),
                self.editor,
            ]
        )

    def _create_tab(self) -> Any:
        return W.VBox(
            [
                self._section(
                    "A new user",
                    "Without a password the user logs in through the Hub's authenticator only. "
                    "The user gets a main keypair with the default policy.",
                ),
                self.new_username,
                self.new_email,
                self.new_full_name,
                self.new_domain,
                self.new_role,
                self.new_projects,
                self.new_password,
                self.new_policy,
                self.create_button,
                self.create_note,
            ]
        )

    def _csv_tab(self) -> Any:
        return W.VBox(
            [
                self._section(
                    "Many users from a CSV file",
                    "First line: the columns, from " + ", ".join(CSV_COLUMNS) + ". Only username is "
                    "required (and domain, unless chosen below). Several projects: separate them with ';'. "
                    "Preview checks every row; rows with problems are not created.",
                ),
                W.HBox([self.csv_upload, self.csv_domain]),
                self.csv_text,
                W.HBox([self.preview_button, self.import_button]),
                self.csv_note,
                self.csv_table,
            ]
        )

    def _keypair_tab(self) -> Any:
        return W.VBox(
            [
                self._section(
                    "Keypairs",
                    "An access key and a secret key for scripts and the API (requests signed with "
                    "HMAC-SHA256). The secret key is shown once, when issued. Rate limit: requests per "
                    "15 minutes.",
                ),
                W.HBox([self.kp_user, self.kp_show]),
                self.kp_note,
                self.kp_secret,
                self.kp_list,
                self._section("A new keypair", "For the user above, with this policy and rate limit."),
                W.HBox([self.kp_policy, self.kp_rate, self.kp_issue]),
            ]
        )

    def widgets(self) -> list[Any]:
        """What the notebook displays: the header, the page's styles and its tabs."""
        return [
            header(
                "Users", "Users in reach: search, create one or many (CSV), edit roles, projects, keypairs."
            ),
            W.HTML(STYLE),
            self.tabs,
        ]

    # ---- the list

    def _filters_changed(self, _: Any = None) -> None:
        """A new search or filter starts again on the first page."""
        self.offset = 0
        self.refresh()

    def _prev(self) -> None:
        """The page before this one."""
        self.offset = max(0, self.offset - self.page_size.value)
        self.refresh()

    def _next(self) -> None:
        """The page after this one."""
        self.offset += self.page_size.value
        self.refresh()

    def fetch(self) -> tuple[list[dict[str, Any]], int]:
        """(this page's users, how many match in all): the service filters and pages."""
        filters = {
            "domain": None if self.domain_filter.value == ALL else self.domain_filter.value,
            "role": None if self.role_filter.value == ANY else self.role_filter.value,
            "status": None if self.status_filter.value == ANY else self.status_filter.value,
            "search": self.search.value.strip() or None,
        }
        params = {k: v for k, v in filters.items() if v}
        limit = self.page_size.value
        answer = self.c.request(
            "GET", "/users", params={**params, "offset": self.offset, "limit": limit}, pages=True
        )
        total = int(answer["_pagination"]["total"])
        if not answer["items"] and self.offset and total:  # the last page emptied: go back one
            self.offset = max(0, (total - 1) // limit * limit)
            return self.fetch()
        return answer["items"], total

    def refresh(self) -> None:
        """Read the page of users again (after every change, so the list shows what is)."""
        try:
            users, total = self.fetch()
        except ServiceError as e:
            self.listing.children = [message(f"The labfleet service said: {e.message}", error=True)]
            return
        self.listing.children = [self._user_grid(users) if users else message("No user matches.")]
        # the place in the list last, once the list shows it
        label = html.escape(page_label(self.offset, len(users), total))
        self.where.value = f'<span class="lf-admin">&nbsp; Users {label}</span>'
        self.prev.disabled = self.offset == 0
        self.next.disabled = self.offset + len(users) >= total

    def _user_grid(self, users: list[dict[str, Any]]) -> W.GridBox:
        """The users of this page, a row each, with their Edit, Keypairs and (De)activate buttons."""
        rows = []
        for u in users:
            name = u["username"]
            active = u["status"] == "active"
            edit = self._button("Edit", f"Edit {name}", partial(self._edit, u))
            keys = self._button(
                "Keypairs", f"Keypairs of {name}", partial(self._open_keypairs, name), writes=False
            )
            toggle = self._button(
                "Deactivate" if active else "Activate",
                f"{'Deactivate' if active else 'Activate'} {name}",
                partial(self._set_status, name, "inactive" if active else "active"),
            )
            if name == self.c.viewer and active:  # no locking oneself out from here
                toggle.disabled = True
            for b in (edit, keys, toggle):
                b.layout.width = "auto"
            rows.append(
                [
                    name,
                    u.get("email") or "—",
                    u["domain"],
                    u["role"],
                    ", ".join(u.get("projects") or []) or "—",
                    _html(u["status"], "" if active else "lf-badge-inactive"),
                    u.get("resource_policy") or "—",
                    edit,
                    keys,
                    toggle,
                ]
            )
        table = grid(["user", "e-mail", "domain", "role", "projects", "status", "policy", "", "", ""], rows)
        table.add_class("lf-users-list")
        return table

    def _set_status(self, name: str, status: str) -> None:
        """Deactivate (the user can no longer log in or use keypairs) or activate again."""
        self.c.patch(f"/users/{name}", {"status": status})
        self.refresh()  # the list first, then the note that says it changed
        verb = "Deactivated" if status == "inactive" else "Activated"
        self.list_note.value = message(f"{verb} {name}.").value

    # ---- editing one user

    def _edit(self, user: dict[str, Any]) -> None:
        """Open the editor under the list for ``user``: role, projects, status, policy, password."""
        self.editing = user
        name = user["username"]
        roles = list(grantable_roles(self.c.role))
        if user["role"] not in roles:
            roles.append(user["role"])
        self.edit_role = W.Dropdown(options=roles, value=user["role"], description="Role")
        self.edit_status = W.Dropdown(options=STATUSES, value=user["status"], description="Status")
        self.edit_projects = ProjectChecks()
        self._fill_projects(self.edit_projects, user["domain"], user.get("projects") or [])
        policies = [NONE, *self._policy_names("user")]
        current = user.get("resource_policy") or NONE
        if current not in policies:
            policies.append(current)
        self.edit_policy = W.Dropdown(options=policies, value=current, description="Policy")
        self.edit_password = W.Password(description="Password", placeholder="unchanged")
        save = self._button("Save", f"Save {name}", self._save, style="primary")
        save.add_class("lf-edit-save")
        close = self._button("Close", "Close the editor", self._close_editor, writes=False)
        self.editor.children = [
            W.VBox(
                [
                    self._section(f"Edit {name}", f"Domain {user['domain']}. Only what you change is sent."),
                    self.edit_role,
                    self.edit_status,
                    self.edit_projects,
                    self.edit_policy,
                    self.edit_password,
                    W.HBox([save, close]),
                ]
            )
        ]
        self.editor.children[0].add_class("lf-users-panel")

    def _close_editor(self) -> None:
        """Close the editor without sending anything."""
        self.editing = None
        self.editor.children = []

    def _save(self) -> None:
        """Send what the editor changed (PATCH /users/{name}); nothing when nothing changed."""
        if self.editing is None:
            return
        name = self.editing["username"]
        body = user_changes(
            self.editing,
            role=self.edit_role.value,
            status=self.edit_status.value,
            projects=list(self.edit_projects.value),
            resource_policy=self.edit_policy.value,
            password=self.edit_password.value,
        )
        if not body:
            self.list_note.value = message(f"Nothing to change for {name}.").value
            return
        if "password" in body and (problem := check_password_strength(body["password"])):
            self.list_note.value = message(problem, error=True).value
            return
        self.c.patch(f"/users/{name}", body)
        changed = ", ".join(k.replace("_", " ") for k in body)
        self.list_note.value = message(f"Saved {name}: {changed}.").value
        self._close_editor()
        self.refresh()

    # ---- one new user

    def _create_one(self) -> None:
        """Create the user of the form: checked here first (the service's own rules), then sent;
        the service's refusal (a name taken, a domain out of reach) is shown in its words."""
        body, problems = check_user(
            {
                "username": self.new_username.value,
                "email": self.new_email.value,
                "full_name": self.new_full_name.value,
                "domain": self.new_domain.value or "",
                "role": self.new_role.value,
                "projects": list(self.new_projects.value),
                "password": self.new_password.value,
                "resource_policy": self.new_policy.value,
            }
        )
        if problems:
            self.create_note.value = message("Not created: " + "; ".join(problems), error=True).value
            return
        try:
            made = self.c.post("/users", body)
        except ServiceError as e:
            self.create_note.value = message(f"The labfleet service said: {e.message}", error=True).value
            return
        self.create_note.value = message(f"Created user {made['username']} in domain {made['domain']}.").value
        for w in (self.new_username, self.new_email, self.new_full_name, self.new_password):
            w.value = ""
        self.new_projects.value = ()
        self.refresh()

    # ---- many new users

    def _uploaded(self, change: Any) -> None:
        """A file chosen with "Open CSV" goes into the text box, where it can be read and fixed."""
        files = change["new"] or ()
        if not files:
            return
        f = files[0]
        content = bytes(f["content"])
        if len(content) > MAX_CSV_BYTES:
            self.csv_note.value = message(
                f"{f['name']} is larger than {MAX_CSV_BYTES // 1000} kB.", error=True
            ).value
            return
        try:
            self.csv_text.value = content.decode("utf-8-sig")
        except UnicodeDecodeError:
            self.csv_note.value = message(f"{f['name']} is not UTF-8 text.", error=True).value

    def _csv_edited(self, _: Any = None) -> None:
        """A changed file needs a new preview before anything is created."""
        self.csv = None
        self.import_button.disabled = True
        if self.csv_table.children:
            self.csv_note.value = _hint("Changed: preview again.")
            self.csv_table.children = []

    def _preview(self) -> None:
        """Parse the CSV and show each row with its problems; arm the create button for the rows
        without any (the users in reach are read to flag names already taken)."""
        default = None if self.csv_domain.value == NONE else self.csv_domain.value
        existing = {u["username"] for u in self.c.everything("/users")}
        self.csv = parsed = parse_csv(self.csv_text.value, default, existing)
        self.csv_note.value = message(parsed.summary(), error=bool(parsed.problems or not parsed.ready)).value
        self.csv_table.children = [self._csv_grid(parsed, {})] if parsed.rows else []
        self.import_button.description = f"Create {len(parsed.ready)} user(s)"
        self.import_button.disabled = not (self.can_change and parsed.ready)

    def _csv_grid(self, parsed: CsvImport, results: Mapping[int, tuple[bool, str]]) -> Any:
        """The preview: one line per row with what it would create and its problems (or, after the
        import, what the service answered)."""
        lines = []
        for r in parsed.rows:
            b = r.body
            if r.line in results:
                ok, text = results[r.line]
                verdict = _html(text, "lf-ok" if ok else "lf-error")
            elif r.problems:
                verdict = _html("; ".join(r.problems), "lf-error")
            else:
                verdict = _html("ready", "lf-ok")
            lines.append(
                [
                    r.line,
                    b.get("username") or r.fields.get("username") or "—",
                    b.get("email", "—"),
                    b.get("domain", "—"),
                    b.get("role", "user"),
                    ", ".join(b.get("projects", [])) or "—",
                    "set" if b.get("password") else "—",
                    verdict,
                ]
            )
        g = grid(["line", "username", "e-mail", "domain", "role", "projects", "password", "check"], lines)
        g.add_class("lf-csv-preview-table")
        return g

    def _import(self) -> None:
        """Create every ready row, one request each: a refusal is that row's, the others go on."""
        parsed = self.csv
        if parsed is None or not parsed.ready:
            return
        self.import_button.disabled = True  # once per preview: no double creation
        results: dict[int, tuple[bool, str]] = {}
        for r in parsed.ready:
            try:
                self.c.post("/users", r.body)
                results[r.line] = (True, "created")
            except ServiceError as e:
                results[r.line] = (False, f"The labfleet service said: {e.message}")
        made = sum(ok for ok, _ in results.values())
        refused = len(results) - made
        skipped = len(parsed.rows) - len(parsed.ready)
        text = f"Created {made} user(s)"
        if refused:
            text += f"; the service refused {refused}"
        if skipped:
            text += f"; {skipped} row(s) with problems not created"
        self.csv_note.value = message(text + ".", error=bool(refused or not made)).value
        self.csv_table.children = [self._csv_grid(parsed, results)]
        self.refresh()

    # ---- keypairs

    def _open_keypairs(self, name: str) -> None:
        """The Keypairs tab, showing ``name``'s keypairs (the Keypairs button of a user's row)."""
        self.tabs.selected_index = 3
        if self.kp_user.value == name:
            self._show_keypairs()
        else:
            self.kp_user.value = name  # observed: shows them

    def _show_keypairs(self, keep_secret: bool = False) -> None:
        """List the chosen user's keypairs with their policy, rate limit and a revoke button."""
        if not keep_secret:
            self.kp_secret.children = []
        name = self.kp_user.value.strip()
        if not name:
            self.kp_list.children = [message("Choose a user (or press Keypairs on the user's row).")]
            return
        try:
            keys = self.c.get("/keypairs", username=name)
        except ServiceError as e:
            self.kp_list.children = [message(f"The labfleet service said: {e.message}", error=True)]
            return
        if not keys:
            self.kp_list.children = [message(f"{name} has no keypair in your reach.")]
            return
        policies = self._policy_names("keypair")
        rows = []
        for k in keys:
            ak = k["access_key"]
            options = policies if k["resource_policy"] in policies else [*policies, k["resource_policy"]]
            policy = W.Dropdown(options=options, value=k["resource_policy"], layout=W.Layout(width="140px"))
            rate = W.BoundedIntText(
                value=k["rate_limit"], min=1, max=MAX_RATE_LIMIT, layout=W.Layout(width="110px")
            )
            policy.disabled = rate.disabled = not self.can_change or not k["is_active"]
            save = self._button(
                "Set",
                f"Set the policy and rate limit of {ak}",
                partial(self._set_keypair_from, ak, policy, rate),
            )
            revoke = W.Button(
                description="Revoke",
                tooltip=f"Revoke {ak}",
                button_style="danger",
                disabled=not self.can_change,
            )
            confirm_first(  # asked first: a revoked keypair never signs again
                revoke,
                partial(self._safely, partial(self._revoke, ak), self.kp_note),
                f"Revoke keypair {ak}? It signs no request any more, for good.",
                lambda text, error: setattr(self.kp_note, "value", message(text, error=error).value),
            )
            save.disabled = save.disabled or not k["is_active"]
            revoke.disabled = revoke.disabled or k["is_main"] or not k["is_active"]
            for b in (save, revoke):
                b.layout.width = "auto"
            rows.append(
                [
                    _html(ak, "" if k["is_active"] else "lf-badge-inactive"),
                    "main" if k["is_main"] else "",
                    "active" if k["is_active"] else "revoked",
                    policy,
                    rate,
                    save,
                    (k.get("created_at") or "—")[:19].replace("T", " "),
                    (k.get("last_used") or "never")[:19].replace("T", " "),
                    revoke,
                ]
            )
        g = grid(["access key", "", "state", "policy", "rate limit", "", "created", "last used", ""], rows)
        g.add_class("lf-kp-list")
        self.kp_list.children = [g]

    def _issue(self) -> None:
        """Issue a keypair for the chosen user and show its secret key once, in a box that stays
        until it is hidden or the keypairs of another user are shown (the service never shows it
        again)."""
        name = self.kp_user.value.strip()
        if not name:
            self.kp_note.value = message("Choose a user first.", error=True).value
            return
        if problem := check_rate_limit(self.kp_rate.value):
            self.kp_note.value = message(problem, error=True).value
            return
        kp = self.c.post(
            "/keypairs",
            {"username": name, "resource_policy": self.kp_policy.value, "rate_limit": self.kp_rate.value},
        )
        box = W.HTML(
            '<div class="lf-secret"><b>New keypair for '
            f"{html.escape(name)}. Copy the secret key now: it is shown this once, and never again.</b>"
            f'<table><tr><th>Access key</th><td><code class="lf-access-key">{html.escape(kp["access_key"])}</code></td></tr>'
            f'<tr><th>Secret key</th><td><code class="lf-secret-key">{html.escape(kp["secret_key"])}</code></td></tr>'
            "</table></div>"
        )
        hide = W.Button(
            description="I have copied it: hide",
            tooltip="Hide the secret key for good",
            layout=W.Layout(width="auto"),
        )
        hide.add_class("lf-secret-hide")
        hide.on_click(lambda _: setattr(self.kp_secret, "children", []))
        self._show_keypairs()
        self.kp_secret.children = [box, W.HBox([hide])]
        self.kp_note.value = message(f"Issued keypair {kp['access_key']} for {name}.").value

    def _set_keypair_from(self, access_key: str, policy: W.Dropdown, rate: W.BoundedIntText) -> None:
        """The Set button of a keypair's row: the values of its row's policy and rate limit."""
        self._set_keypair(access_key, policy.value, rate.value)

    def _set_keypair(self, access_key: str, policy: str, rate: int) -> None:
        """Give a keypair another resource policy and rate limit (requests per 15 minutes)."""
        if problem := check_rate_limit(rate):
            self.kp_note.value = message(problem, error=True).value
            return
        self.c.patch(f"/keypairs/{access_key}", {"resource_policy": policy, "rate_limit": rate})
        self._show_keypairs(keep_secret=True)
        self.kp_note.value = message(
            f"Keypair {access_key}: policy {policy}, {rate} requests per 15 minutes."
        ).value

    def _revoke(self, access_key: str) -> None:
        """Revoke a keypair: it signs no request any more (the main keypair cannot be revoked)."""
        self.c.delete(f"/keypairs/{access_key}")
        self._show_keypairs()
        self.kp_note.value = message(f"Revoked keypair {access_key}: it signs no request any more.").value


def show() -> None:
    """The notebook's one call: build the page as the viewer and display it (or the service's
    refusal, when the viewer may not read users)."""
    try:
        page = UsersPage()
    except ServiceError as e:
        display(header("Users"), message(f"The labfleet service said: {e.message}", error=True))
        return
    display(*page.widgets())
