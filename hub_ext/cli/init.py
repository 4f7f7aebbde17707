"""``labfleet init`` and ``labfleet demo``: set labfleet up, and seed demo tenants.

The start-up steps (secret key file, schema, default rows) are :mod:`labfleet.core.bootstrap`'s,
the same the labfleet service runs; the first superadmin is made here.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from labfleet.cli.base import (
    ASK,
    CliError,
    Command,
    Option,
    UsageError,
    generate_password,
    is_tty,
    login_url,
    prompt_new_password,
    sqlite_file,
)
from labfleet.cli.output import format_table, shown_url
from labfleet.core.passwords import check_password_strength, verify_password

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

DEFAULT_ADMIN_USER = "admin"
DEFAULT_ADMIN_DOMAIN = "default"
DEMO_PASSWORD = "demo-password-1"


class InitSteps(Command):
    """Shared by ``init`` and ``demo``: key file, schema, default rows, first superadmin."""

    def init_steps(
        self,
        *,
        admin_user: str | None,
        admin_domain: str,
        password: str | None,
        ask: bool,
        interactive: bool = True,
    ) -> Engine:
        """Returns the engine on the (upgraded) database; prints what it did and how to log in."""
        if password is not None:
            problem = check_password_strength(password)
            if problem:
                raise UsageError(f"admin password: {problem}")
        elif ask and not is_tty():
            raise UsageError(
                "cannot ask for the admin password: stdin is not a terminal (give it as a value)"
            )
        from sqlalchemy import select

        from labfleet.core import bootstrap, database, secretbox
        from labfleet.core.models import User
        from labfleet.tenancy import directory

        probe = database.make_engine(self.db_url)
        try:
            key_path = bootstrap.ensure_secret_key(probe)
        except bootstrap.SecretKeyLost as e:
            raise CliError(str(e)) from None
        finally:
            probe.dispose()
        if os.environ.get(secretbox.KEY_ENV):
            self.out(f"Secret key: from ${secretbox.KEY_ENV}")
        else:
            self.out(f"Secret key: {key_path} (the labfleet service must use the same file; back it up)")

        opened = bootstrap.open_database(self.db_url)  # schema to head, default rows seeded
        engine = opened.engine
        self.out(f"Database: {shown_url(engine)} {opened.state}")

        name = admin_user or DEFAULT_ADMIN_USER

        def existing(db: Session) -> tuple[list[str], dict[str, Any] | None]:
            supers = list(
                db.scalars(select(User.username).where(User.role == "superadmin").order_by(User.username))
            )
            named = directory.get_user(db, name)
            return supers, (directory.user_view(named) if named else None)

        supers, named = self.transaction(existing, engine)
        if named is not None:
            what = "superadmin" if named["role"] == "superadmin" else f"user (role {named['role']})"
            self.out(f"The {what} {name!r} already exists: left unchanged.")
            return engine
        if supers and admin_user is None:
            self.out(f"Superadmin(s) already exist ({', '.join(supers)}): left unchanged.")
            return engine

        generated = False
        if password is None:
            if ask or (interactive and is_tty()):
                password = prompt_new_password(name)
            else:
                password = generate_password()
                generated = True

        def create(db: Session) -> None:
            if directory.get_domain(db, admin_domain) is None:
                directory.create_domain(
                    db, self.actor, {"name": admin_domain, "description": "Created by labfleet init"}
                )
            directory.create_user(
                db,
                self.actor,
                {"username": name, "domain": admin_domain, "role": "superadmin", "password": password},
            )

        self.transaction(create, engine)
        self.out(f"Created the superadmin {name!r} in domain {admin_domain!r}.")
        self.out("")
        self.out(f"Log in at {login_url()}")
        self.out(f"  user:     {name}")
        if generated:
            self.out(f"  password: {password}")
            self.out(
                f"  (generated: note it now, it is not shown again; `labfleet user passwd {name}` sets a new one)"
            )
        else:
            self.out("  password: the one you gave")
        return engine


class Init(InitSteps):
    name = "labfleet init"
    summary = "Create or upgrade the database and the first superadmin."
    description = """Set up labfleet: create the secret key file, create or upgrade the database
    schema, the default keypair policy and resource group, the admin domain and a superadmin. Safe to run again:
    it upgrades the schema and leaves an existing superadmin as it is. Without --admin-password
    it asks for one on a terminal, or generates a strong one (printed once) when stdin is not a
    terminal (CI)."""
    examples = (
        "labfleet init",
        "labfleet init --admin-user root --admin-domain ops",
        "labfleet init --db-url postgresql://labfleet@db/labfleet",
    )
    options = (
        Option(
            "--admin-user",
            f"Name of the superadmin to create (default {DEFAULT_ADMIN_USER!r}).",
            metavar="NAME",
        ),
        Option(
            "--admin-password",
            """Password of the new superadmin. Given without a value, it is asked for on the
            terminal. A value is visible to other local users in the process list: prefer the
            prompt.""",
            metavar="PASSWORD",
            value_optional=True,
        ),
        Option(
            "--admin-domain",
            f"Domain of the new superadmin, created if missing (default {DEFAULT_ADMIN_DOMAIN!r}).",
            metavar="DOMAIN",
            default=DEFAULT_ADMIN_DOMAIN,
        ),
    )

    def run(self) -> None:
        password = self.opts.admin_password
        engine = self.init_steps(
            admin_user=self.opts.admin_user,
            admin_domain=self.opts.admin_domain,
            password=None if password is ASK else password,
            ask=password is ASK,
        )
        engine.dispose()


DEMO_DOMAIN = ("demo", "cpu=32,mem=128g,gpu=2,gpu.shares=2")
DEMO_PROJECTS = (
    ("ml-team", "gpu.shares=1.5", "Demo: machine-learning team"),
    ("research", "gpu.shares=1", "Demo: research"),
)
DEMO_USERS: tuple[tuple[str, str, list[str]], ...] = (
    ("alice", "user", ["demo/ml-team", "demo/research"]),
    ("bob", "user", ["demo/ml-team"]),
    ("carol", "admin", []),
    ("mona", "monitor", []),
)


class Demo(InitSteps):
    name = "labfleet demo"
    summary = "Seed demo tenants and users and print their logins."
    description = f"""Seed demo tenants: domain 'demo' ({DEMO_DOMAIN[1]}), projects demo/ml-team and
    demo/research, users alice (both projects), bob (ml-team), carol (domain admin of demo) and mona
    (monitor), all with one known demo password, and print the logins. Initializes the database
    first if needed. Safe to run again: what exists is left as it is."""
    examples = ("labfleet demo", "labfleet demo --password another-demo-pw")
    options = (
        Option(
            "--password",
            f"Password of the demo users (default {DEMO_PASSWORD!r}; printed: a demo, not for real use).",
            metavar="PASSWORD",
            default=DEMO_PASSWORD,
        ),
    )

    def run(self) -> None:
        from labfleet.core import database

        problem = check_password_strength(self.opts.password)
        if problem:
            raise UsageError(f"--password: {problem}")
        path = sqlite_file(self.db_url)
        fresh = path is not None and not path.exists()
        if not fresh:
            probe = database.make_engine(self.db_url)
            fresh = not database.is_initialized(probe)
            probe.dispose()
        if fresh:
            engine = self.init_steps(
                admin_user=None,
                admin_domain=DEFAULT_ADMIN_DOMAIN,
                password=None,
                ask=False,
                interactive=False,
            )
            self.out("")
        else:
            engine = self.open_engine()
        try:
            rows = self.transaction(self.seed, engine)
        finally:
            engine.dispose()
        self.out("Demo tenants: domain demo, projects demo/ml-team and demo/research.")
        self.out(f"Log in at {login_url()} as:")
        self.out(format_table(["user", "role", "projects", "password", "state"], rows))

    def seed(self, db: Session) -> list[list[Any]]:
        from labfleet.tenancy import directory

        actor, password = self.actor, self.opts.password
        dname, dslots = DEMO_DOMAIN
        if directory.get_domain(db, dname) is None:
            directory.create_domain(
                db,
                actor,
                {"name": dname, "total_resource_slots": dslots, "description": "Demo tenant (labfleet demo)"},
            )
        for pname, pslots, pdesc in DEMO_PROJECTS:
            if directory.get_project(db, dname, pname) is None:
                directory.create_project(
                    db,
                    actor,
                    {"domain": dname, "name": pname, "total_resource_slots": pslots, "description": pdesc},
                )
        rows = []
        for username, role, projects in DEMO_USERS:
            u = directory.get_user(db, username)
            if u is None:
                body = {"username": username, "domain": dname, "role": role, "password": password}
                if projects:
                    body["projects"] = projects
                u = directory.create_user(db, actor, body)
                state, shown = "created", password
            else:
                state = "existed" if u.domain.name == dname else f"existed (domain {u.domain.name})"
                shown = password if verify_password(password, u.password_hash) else "(changed)"
            label = "domain admin" if u.role == "admin" else u.role
            rows.append([u.username, label, [p.full_name for p in u.projects], shown, state])
        return rows
