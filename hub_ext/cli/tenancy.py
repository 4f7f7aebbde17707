"""``labfleet domain``, ``labfleet project`` and ``labfleet user``: the tenants.

Every change goes through :mod:`labfleet.tenancy.directory`, like the REST API's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from labfleet.cli.base import (
    ACTIVE_OPTIONS,
    ASK,
    Command,
    Group,
    ListCommand,
    Option,
    UsageError,
    check_slots,
    flag,
    generate_password,
    is_tty,
    prompt_new_password,
    split_list,
)
from labfleet.cli.output import slots_text
from labfleet.core.authz import ROLES
from labfleet.core.passwords import check_password_strength
from labfleet.core.validate import parse_project_ref

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

DESCRIPTION_OPTION = Option("--description", "A description for people.", dest="description_text")

# ---------------------------------------------------------------- domains


def _cap_body(cmd: Command) -> dict[str, Any]:
    """--slots and --description, of a domain or a project."""
    body: dict[str, Any] = {}
    if cmd.opts.slots is not None:
        body["total_resource_slots"] = check_slots(cmd.opts.slots)
    if cmd.opts.description_text is not None:
        body["description"] = cmd.opts.description_text
    return body


def _domain_body(cmd: Command) -> dict[str, Any]:
    body = _cap_body(cmd)
    if cmd.opts.allowed_keypair_policies is not None:
        # '' clears the list; the names are checked (and must exist) in labfleet.tenancy.directory
        body["allowed_keypair_policies"] = split_list([cmd.opts.allowed_keypair_policies])
    return body


def _allowed_text(view: dict[str, Any]) -> str:
    return ", ".join(view["allowed_keypair_policies"]) or "none"


DOMAIN_OPTIONS = (
    Option(
        "--slots",
        "Total resource cap of the domain, e.g. cpu=64,mem=256g,gpu=4,gpu.shares=2.5.",
        metavar="SLOTS",
    ),
    DESCRIPTION_OPTION,
    Option(
        "--allowed-keypair-policies",
        """Keypair policies the domain's admins may give its users' keypairs, comma-separated, each
        an existing one; the first is the main keypair's policy of a user a domain admin creates
        without naming one. '' clears the list (the domain is then bounded by its caps only).""",
        metavar="POLICIES",
    ),
)


class DomainCreate(Command):
    name = "labfleet domain create"
    description = "Create a domain (a tenant): every user belongs to exactly one."
    examples = ("labfleet domain create acme --slots cpu=64,mem=256g,gpu=4 --description 'ACME Corp'",)
    arguments = ("NAME",)
    options = DOMAIN_OPTIONS

    def run(self) -> None:
        from labfleet.tenancy import directory

        body = {"name": self.args[0], **_domain_body(self)}
        view = self.transaction(
            lambda db: directory.domain_view(directory.create_domain(db, self.actor, body))
        )
        self.out(
            f"Created domain {view['name']} (slots: {slots_text(view['total_resource_slots'])}, "
            f"keypair policies its admins may give: {_allowed_text(view)})."
        )


class DomainList(ListCommand):
    name = "labfleet domain list"
    description = "List the domains."
    examples = ("labfleet domain list --json",)

    def run(self) -> None:
        from labfleet.tenancy import directory

        views = self.transaction(
            lambda db: [directory.domain_view(d, detail=True) for d in directory.list_domains(db, self.actor)]
        )
        self.emit(
            views,
            ["name", "active", "slots", "projects", "description"],
            lambda v: [
                v["name"],
                v["is_active"],
                slots_text(v["total_resource_slots"]),
                v.get("projects"),
                v["description"],
            ],
        )


class DomainUpdate(Command):
    name = "labfleet domain update"
    description = "Change a domain's resource cap, description, allowed keypair policies or state."
    examples = (
        "labfleet domain update acme --slots cpu=128,mem=512g,gpu=8 --inactive",
        "labfleet domain update acme --allowed-keypair-policies students,teachers",
    )
    arguments = ("NAME",)
    options = (*DOMAIN_OPTIONS, *ACTIVE_OPTIONS)

    def run(self) -> None:
        from labfleet.tenancy import directory

        body = _domain_body(self)
        if self.opts.active is not None:
            body["is_active"] = self.opts.active
        if not body:
            raise self.nothing_to_change(
                "give --slots, --description, --allowed-keypair-policies, --active or --inactive"
            )
        name = self.args[0]
        view = self.transaction(
            lambda db: directory.domain_view(directory.update_domain(db, self.actor, name, body))
        )
        self.out(
            f"Updated domain {view['name']} (slots: {slots_text(view['total_resource_slots'])}, "
            f"keypair policies its admins may give: {_allowed_text(view)}, "
            f"{'active' if view['is_active'] else 'inactive'})."
        )


class DomainDelete(Command):
    name = "labfleet domain delete"
    description = "Delete a domain and its projects. Refused while it still has users."
    arguments = ("NAME",)

    def run(self) -> None:
        from labfleet.tenancy import directory

        name = self.args[0]
        self.transaction(lambda db: directory.delete_domain(db, self.actor, name))
        self.out(f"Deleted domain {name}.")


DOMAIN = Group(
    "labfleet domain",
    "Manage domains (tenants).",
    {"create": DomainCreate, "list": DomainList, "update": DomainUpdate, "delete": DomainDelete},
)

# ---------------------------------------------------------------- projects

PROJECT_OPTIONS = (
    Option("--slots", "Total resource cap of the project, e.g. gpu=1,gpu.shares=1.5.", metavar="SLOTS"),
    DESCRIPTION_OPTION,
    Option(
        "--policy",
        "Name of a project resource policy (folders, storage); '' removes it.",
        metavar="POLICY",
    ),
)


def _project_body(cmd: Command) -> dict[str, Any]:
    body = _cap_body(cmd)
    if cmd.opts.policy is not None:
        body["resource_policy"] = cmd.opts.policy or None
    return body


class ProjectCreate(Command):
    name = "labfleet project create"
    description = "Create a project in a domain."
    examples = (
        "labfleet project create acme/vision --slots gpu=1,gpu.shares=2.5 --description 'Vision team'",
    )
    arguments = ("DOMAIN/PROJECT",)
    options = PROJECT_OPTIONS

    def run(self) -> None:
        from labfleet.tenancy import directory

        domain, project = parse_project_ref(self.args[0])
        body = {"domain": domain, "name": project, **_project_body(self)}
        view = self.transaction(
            lambda db: directory.project_view(directory.create_project(db, self.actor, body))
        )
        self.out(f"Created project {view['full_name']} (slots: {slots_text(view['total_resource_slots'])}).")


class ProjectList(ListCommand):
    name = "labfleet project list"
    description = "List the projects, of all domains or of one."
    examples = ("labfleet project list --domain acme",)
    options = (Option("--domain", "Only the projects of this domain.", metavar="DOMAIN"),)

    def run(self) -> None:
        from labfleet.tenancy import directory

        def work(db: Session) -> list[dict[str, Any]]:
            # An unknown domain is "not found": list_projects checks it.
            projects = directory.list_projects(db, self.actor, self.opts.domain)
            return [directory.project_view(p) for p in projects]

        self.emit(
            self.transaction(work),
            ["project", "active", "slots", "policy", "members", "description"],
            lambda v: [
                v["full_name"],
                v["is_active"],
                slots_text(v["total_resource_slots"]),
                v["resource_policy"],
                v["members"],
                v["description"],
            ],
        )


class ProjectUpdate(Command):
    name = "labfleet project update"
    description = "Change a project's resource cap, description, policy or state."
    examples = ("labfleet project update acme/vision --slots gpu.shares=3 --policy big-folders",)
    arguments = ("DOMAIN/PROJECT",)
    options = (*PROJECT_OPTIONS, *ACTIVE_OPTIONS)

    def run(self) -> None:
        from labfleet.tenancy import directory

        domain, project = parse_project_ref(self.args[0])
        body = _project_body(self)
        if self.opts.active is not None:
            body["is_active"] = self.opts.active
        if not body:
            raise self.nothing_to_change("give --slots, --description, --policy, --active or --inactive")
        view = self.transaction(
            lambda db: directory.project_view(directory.update_project(db, self.actor, domain, project, body))
        )
        self.out(f"Updated project {view['full_name']} (slots: {slots_text(view['total_resource_slots'])}).")


class ProjectDelete(Command):
    name = "labfleet project delete"
    description = "Delete a project (its members stay in the domain)."
    arguments = ("DOMAIN/PROJECT",)

    def run(self) -> None:
        from labfleet.tenancy import directory

        domain, project = parse_project_ref(self.args[0])
        members = self.transaction(lambda db: directory.delete_project(db, self.actor, domain, project))
        self.out(f"Deleted project {domain}/{project} ({len(members)} member(s) removed from it).")


class ProjectAddMember(Command):
    name = "labfleet project add-member"
    description = "Add a user of the project's domain to the project."
    examples = ("labfleet project add-member acme/vision alice",)
    arguments = ("DOMAIN/PROJECT", "USER")

    def run(self) -> None:
        from labfleet.tenancy import directory

        (domain, project), username = parse_project_ref(self.args[0]), self.args[1]
        self.transaction(
            lambda db: directory.add_member(db, self.actor, domain, project, {"username": username})
        )
        self.out(f"Added {username} to {domain}/{project}.")


class ProjectRemoveMember(Command):
    name = "labfleet project remove-member"
    description = "Remove a user from a project."
    examples = ("labfleet project remove-member acme/vision alice",)
    arguments = ("DOMAIN/PROJECT", "USER")

    def run(self) -> None:
        from labfleet.tenancy import directory

        (domain, project), username = parse_project_ref(self.args[0]), self.args[1]
        self.transaction(lambda db: directory.remove_member(db, self.actor, domain, project, username))
        self.out(f"Removed {username} from {domain}/{project}.")


PROJECT = Group(
    "labfleet project",
    "Manage projects (working units inside a domain) and their members.",
    {
        "create": ProjectCreate,
        "list": ProjectList,
        "update": ProjectUpdate,
        "delete": ProjectDelete,
        "add-member": ProjectAddMember,
        "remove-member": ProjectRemoveMember,
    },
)

# ---------------------------------------------------------------- users

USER_OPTIONS = (
    Option("--role", f"Role: {', '.join(ROLES)} (admin = domain admin).", metavar="ROLE"),
    Option(
        "--project",
        "A project DOMAIN/PROJECT the user works in; repeat the option (or use commas) for several.",
        metavar="DOMAIN/PROJECT",
        dest="projects",
        repeat=True,
    ),
    Option(
        "--password",
        """Password for logging in to the Hub. Given without a value, it is asked for on the
        terminal. A value is visible to other local users in the process list: prefer the prompt.""",
        metavar="PASSWORD",
        value_optional=True,
    ),
    Option("--email", "E-mail address.", metavar="EMAIL"),
    Option("--full-name", "Full name.", metavar="NAME"),
)


def _user_body(cmd: Command) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for key in ("role", "email", "full_name"):
        if getattr(cmd.opts, key) is not None:
            body[key] = getattr(cmd.opts, key)
    return body


class UserCreate(Command):
    name = "labfleet user create"
    summary = "Create a user in a domain."
    description = """Create a user in a domain (with its main keypair). Without --password it asks
    for one on a terminal; give --no-password for a user who logs in through another authenticator."""
    examples = (
        "labfleet user create alice --domain acme --project acme/vision --email alice@acme.test",
        "labfleet user create bob --domain acme --role admin --password",
        "labfleet user create carol --domain acme --no-password",
    )
    arguments = ("NAME",)
    options = (
        Option("--domain", "The user's domain (required).", metavar="DOMAIN"),
        *USER_OPTIONS,
        flag("--no-password", "Create the user without a password: they log in another way."),
        Option("--policy", "Name of a user resource policy (folders, storage).", metavar="POLICY"),
    )

    def run(self) -> None:
        from labfleet.tenancy import directory

        username, opts = self.args[0], self.opts
        if opts.domain is None:
            raise UsageError(f"{self.name}: --domain is required")
        body: dict[str, Any] = {"username": username, "domain": opts.domain, **_user_body(self)}
        if opts.projects:
            body["projects"] = split_list(opts.projects)
        if opts.policy:
            body["resource_policy"] = opts.policy
        if opts.no_password and opts.password is not None:
            raise UsageError("--password and --no-password exclude each other")
        if opts.password is not None and opts.password is not ASK:
            body["password"] = opts.password
        elif not opts.no_password:
            if not (opts.password is ASK or is_tty()):
                raise UsageError(
                    "no password: give --password PW (or --password alone on a terminal to be asked), "
                    "or --no-password for a user who logs in another way"
                )
            body["password"] = prompt_new_password(username)
        view = self.transaction(lambda db: directory.user_view(directory.create_user(db, self.actor, body)))
        projects = ", ".join(view["projects"]) or "none"
        self.out(
            f"Created user {view['username']} in domain {view['domain']} "
            f"(role {view['role']}, projects: {projects})."
        )


class UserList(ListCommand):
    name = "labfleet user list"
    description = "List the users, of all domains or of one."
    examples = ("labfleet user list --domain acme --json",)
    options = (Option("--domain", "Only the users of this domain.", metavar="DOMAIN"),)

    def run(self) -> None:
        from labfleet.tenancy import directory

        def work(db: Session) -> list[dict[str, Any]]:
            # An unknown domain is "not found": list_users checks it.
            return [directory.user_view(u) for u in directory.list_users(db, self.actor, self.opts.domain)]

        self.emit(
            self.transaction(work),
            ["user", "domain", "role", "status", "projects", "password", "email"],
            lambda v: [
                v["username"],
                v["domain"],
                v["role"],
                v["status"],
                v["projects"],
                v["has_password"],
                v["email"],
            ],
        )


class UserUpdate(Command):
    name = "labfleet user update"
    summary = "Change a user's role, projects, password, e-mail, name or state."
    description = """Change a user. --project replaces the whole list of projects (--project ''
    empties it); --policy '' removes the user's resource policy."""
    examples = (
        "labfleet user update alice --role admin --project acme/vision --project acme/nlp",
        "labfleet user update alice --password",
        "labfleet user update alice --activate",
    )
    arguments = ("NAME",)
    options = (
        *USER_OPTIONS,
        Option(
            "--policy",
            "Name of a user resource policy (folders, storage); '' removes it.",
            metavar="POLICY",
        ),
        Option("--domain", "Move the user to another domain (their projects are dropped).", metavar="DOMAIN"),
        flag("--activate", "Make an inactive user active again."),
    )

    def run(self) -> None:
        from labfleet.tenancy import directory

        username, opts = self.args[0], self.opts
        body = _user_body(self)
        if opts.projects is not None:
            body["projects"] = split_list(opts.projects)
        if opts.policy is not None:
            body["resource_policy"] = opts.policy or None
        if opts.domain is not None:
            body["domain"] = opts.domain
        if opts.activate:
            body["status"] = "active"
        if opts.password is ASK:
            body["password"] = prompt_new_password(username)
        elif opts.password is not None:
            body["password"] = opts.password
        if not body:
            raise self.nothing_to_change("see labfleet user update --help")
        view = self.transaction(
            lambda db: directory.user_view(directory.update_user(db, self.actor, username, body))
        )
        self.out(
            f"Updated user {view['username']} ({', '.join(body)}); "
            f"role {view['role']}, status {view['status']}."
        )


class UserDeactivate(Command):
    name = "labfleet user deactivate"
    description = "Deactivate a user: they can no longer log in or use their keypairs."
    arguments = ("NAME",)

    def run(self) -> None:
        from labfleet.tenancy import directory

        username = self.args[0]
        self.transaction(lambda db: directory.update_user(db, self.actor, username, {"status": "inactive"}))
        self.out(f"Deactivated user {username}.")


class UserPasswd(Command):
    name = "labfleet user passwd"
    summary = "Set a user's password (e.g. a lost superadmin password)."
    description = """Set a new password for a user: asked for twice on a terminal, given with
    --password PASSWORD, or, when stdin is not a terminal and no password is given, generated and
    printed once. Nothing else about the user changes; the change goes to the audit log. For the
    superadmin made by scripts/up, run it in .labfleet-state/ (where its database is)."""
    examples = (
        "labfleet user passwd admin",
        "labfleet user passwd alice --password",
        "labfleet user passwd admin </dev/null    # generate one and print it",
    )
    arguments = ("NAME",)
    options = (
        Option(
            "--password",
            """The new password. Given without a value, it is asked for on the terminal. A value is
            visible to other local users in the process list: prefer the prompt.""",
            metavar="PASSWORD",
            value_optional=True,
        ),
    )

    def run(self) -> None:
        from labfleet.tenancy import directory

        username, given = self.args[0], self.opts.password
        if given is not None and given is not ASK:
            problem = check_password_strength(given)
            if problem:
                raise UsageError(f"--password: {problem}")
        # An unknown user fails before anyone is asked for a password.
        status = self.transaction(lambda db: directory.readable_user(db, self.actor, username).status)
        generated = False
        if given is ASK or (given is None and is_tty()):
            password = prompt_new_password(username)
        elif given is not None:
            password = given
        else:
            password = generate_password()
            generated = True
        self.transaction(lambda db: directory.update_user(db, self.actor, username, {"password": password}))
        self.out(f"Set a new password for {username}.")
        if generated:
            self.out(f"  password: {password}")
            self.out("  (generated: note it now, it is not shown again)")
        if status != "active":
            self.out(
                f"{username} is {status}: `labfleet user update {username} --activate` lets them log in."
            )


USER = Group(
    "labfleet user",
    "Manage users.",
    {
        "create": UserCreate,
        "list": UserList,
        "update": UserUpdate,
        "passwd": UserPasswd,
        "deactivate": UserDeactivate,
    },
)
