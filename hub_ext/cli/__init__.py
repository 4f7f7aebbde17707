"""The ``labfleet`` command: set up labfleet and manage tenants, policies and keypairs.

Built like ``jupyterhub``'s own command line: a traitlets :class:`Application` with
``subcommands``, each subcommand its own Application subclass, options as traits
with aliases and flags::

    labfleet init
    labfleet domain create acme --slots cpu=64,mem=256g,gpu=4
    labfleet project create acme/vision --slots gpu.shares=2.5
    labfleet user create alice --domain acme --project acme/vision
    labfleet keypair issue alice
    labfleet demo

Every change goes through the same logic functions as the REST API
(:mod:`hub_ext.tenancy.directory`, :mod:`hub_ext.tenancy.policies`, :mod:`hub_ext.tenancy.keypairs`), inside one
DB transaction that is rolled back on any error, so the CLI validates, authorizes
(as the trusted ``cli`` actor) and audits exactly like the service does.

Errors are one line on stderr, ``labfleet: error: <message>``, with exit status 2 for
bad usage or bad input and 1 for an operation that was refused (unknown target,
duplicate, conflict, uninitialized database).
"""

from __future__ import annotations

import getpass
import importlib
import json
import os
import re
import secrets
import sys
from collections.abc import Callable, Iterable
from decimal import Decimal
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

from traitlets import Bool, Int, List, TraitError, Unicode, default
from traitlets.config import Application
from traitlets.config.loader import ArgumentError, KVArgParseConfigLoader

try:
    from traitlets.config.loader import _DOT_REPLACEMENT
except ImportError:  # pragma: no cover - older or newer traitlets
    _DOT_REPLACEMENT = "__DOT__"

from hub_ext.core.authz import ROLES, Actor
from hub_ext.core.errors import LabfleetError
from hub_ext.core.passwords import check_password_strength, verify_password
from hub_ext.core.slots import ResourceSlots, SlotError, format_amount, parse_amount
from hub_ext.core.validate import parse_project_ref

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session


class _LazyModule:
    """A module imported on first use: --help and usage errors answer without loading
    SQLAlchemy, Alembic and cryptography (most of the command's start-up time)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)


dbmod: Any = _LazyModule("hub_ext.core.db")
images: Any = _LazyModule("hub_ext.compute.images")
keypairs: Any = _LazyModule("hub_ext.tenancy.keypairs")
policies: Any = _LazyModule("hub_ext.tenancy.policies")
secretbox: Any = _LazyModule("hub_ext.core.secretbox")
storage: Any = _LazyModule("hub_ext.storage.hosts")
tenancy: Any = _LazyModule("hub_ext.tenancy.directory")


def login_url() -> str:
    """Where scripts/up starts the Hub ($LABFLEET_IP, $LABFLEET_PORT), for the login hint."""
    ip = os.environ.get("LABFLEET_IP") or "127.0.0.1"
    host = "127.0.0.1" if ip in ("0.0.0.0", "*") else ip
    return f"http://{host}:{os.environ.get('LABFLEET_PORT') or 8000}/hub/login"


DEFAULT_ADMIN_USER = "admin"
DEFAULT_ADMIN_DOMAIN = "default"
DEMO_PASSWORD = "demo-password-1"

# ---------------------------------------------------------------- errors


class CliError(Exception):
    """An error the command reports as one line, with an exit status."""

    code = 1

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class UsageError(CliError):
    """Bad command line: unknown command or option, missing or extra arguments."""

    code = 2


def _lines(*lines: str) -> str:
    return "\n".join(lines)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _fail(message: str, code: int) -> None:
    print(f"labfleet: error: {_one_line(message)}", file=sys.stderr)
    sys.exit(code)


# ---------------------------------------------------------------- option traits


def _option(name: str | None) -> str:
    return "--" + (name or "").replace("_", "-")


class Text(Unicode):
    """A string option taken literally (traitlets' Unicode expands ``~`` and reads "None")."""

    def from_string(self, s: str) -> str:
        return s


class WholeNumber(Int):
    def from_string(self, s: str) -> int:
        try:
            return int(s.strip())
        except ValueError:
            raise ValueError(f"expected a whole number (got {s!r:.40})") from None


class Seconds(Int):
    """A duration in seconds; ``90``, ``30m``, ``2h`` and ``1d`` are accepted."""

    _RE = re.compile(r"^\s*(-?[0-9]+)\s*([smhd]?)\s*$")
    _UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}

    def from_string(self, s: str) -> int:
        m = self._RE.match(s)
        if not m:
            raise ValueError(f"expected seconds, e.g. 3600, 30m, 2h or 1d (got {s!r:.40})")
        return int(m.group(1)) * self._UNIT[m.group(2)]


class ByteSize(Int):
    """A size in bytes; ``1073741824``, ``512m`` and ``10g`` are accepted."""

    def from_string(self, s: str) -> int:
        try:
            amount = parse_amount("mem", s)
        except SlotError:
            raise ValueError(
                f"expected a size in bytes, e.g. 1073741824, 512m or 10g (got {s!r:.40})"
            ) from None
        return int(amount)


# ---------------------------------------------------------------- command-line parsing


class _ArgParser(KVArgParseConfigLoader.parser_class):  # type: ignore[misc,valid-type]
    """Raise instead of printing argparse's usage and exiting; allow options between arguments."""

    option_names: dict[str, str] = {}  # "--Class.trait" -> "--option", set by the loader

    def error(self, message: str):  # type: ignore[override]
        for long, short in sorted(self.option_names.items(), key=lambda kv: -len(kv[0])):
            message = message.replace(long, short)
        raise UsageError(message)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        return self.parse_intermixed_args(args, namespace)


class _Loader(KVArgParseConfigLoader):
    """traitlets' loader, made strict: only the documented options, and values that read."""

    parser_class = _ArgParser

    def _create_parser(self) -> None:
        super()._create_parser()
        self.parser.option_names = {f"--{target}": f"--{key}" for key, target in self.aliases.items()}

    def _parse_args(self, args: Any) -> Any:
        known = {*self.aliases, *self.flags}
        for arg in args:
            if arg == "--":
                break
            if not arg.startswith("-") or arg == "-" or re.match(r"^-[0-9.]", arg):
                continue
            key = arg.lstrip("-").partition("=")[0]
            if key not in known:
                raise UsageError(f"unknown option {arg.partition('=')[0]}")
        return super()._parse_args(args)

    def _handle_unrecognized_alias(self, arg: str) -> None:
        raise UsageError(f"unknown option --{arg}")

    def _convert_to_config(self) -> None:
        # Check every value here: errors raised later are wrapped and logged by traitlets.
        options = {target: f"--{key}" for key, target in self.aliases.items()}
        for dest, value in vars(self.parsed_data).items():
            if dest in ("extra_args", "_flags"):
                continue
            target = dest.replace(_DOT_REPLACEMENT, ".")
            option = options.get(target)
            trait = self.argparse_traits.get(target, (None,))[0]
            if option is None or trait is None:
                raise UsageError(f"unknown option --{target}")
            try:
                if isinstance(value, list) and hasattr(trait, "from_string_list"):
                    trait.from_string_list([str(v) for v in value])
                elif isinstance(value, list):
                    if len(value) > 1:
                        raise ValueError("given more than once")
                    trait.from_string(str(value[0]))
                else:
                    trait.from_string(str(value))
            except (ValueError, TraitError) as e:
                raise UsageError(f"{option}: {e}") from None
        super()._convert_to_config()


# ---------------------------------------------------------------- output helpers


def _slots_text(slots: Any) -> str:
    return ResourceSlots.parse(slots or {}).to_cli() or "-"


def _cell(value: Any, width: int | None = None) -> str:
    if value is None or value == "" or value == []:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    text = _one_line(str(value))
    if width and len(text) > width:
        text = text[: width - 3] + "..."
    return text


def format_table(headers: list[str], rows: Iterable[Iterable[Any]]) -> str:
    """Plain aligned columns, two spaces apart, header in upper case."""
    cells = [[_cell(c, 48) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in cells:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def _unlimited(n: int | None, zero: str = "unlimited") -> str:
    return zero if not n else str(n)


def _bytes_text(n: int | None) -> str:
    return "unlimited" if not n else format_amount("mem", Decimal(n))


def _split_list(values: Iterable[str]) -> list[str]:
    """``--project a,b --project c`` -> ["a", "b", "c"]; empty items dropped."""
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def _check_slots_option(value: str, option: str = "--slots") -> str:
    try:
        ResourceSlots.parse(value)
    except SlotError as e:
        raise UsageError(f"{option}: {e}") from None
    return value


def _project_ref(value: str) -> tuple[str, str]:
    return parse_project_ref(value)


def _is_tty() -> bool:
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def prompt_new_password(username: str) -> str:
    if not _is_tty():
        raise UsageError("cannot ask for a password: stdin is not a terminal (give the password as a value)")
    password = getpass.getpass(f"New password for {username}: ")
    problem = check_password_strength(password)
    if problem:
        raise UsageError(problem)
    if getpass.getpass("Repeat the password: ") != password:
        raise UsageError("the two passwords differ")
    return password


def generate_password() -> str:
    return secrets.token_urlsafe(18)  # 24 characters, 144 bits


# ---------------------------------------------------------------- database helpers


def _sqlite_file(url: str) -> Path | None:
    from sqlalchemy.engine import make_url

    try:
        u = make_url(dbmod.normalize_url(url))
    except Exception:
        return None
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    if u.database.startswith("file:"):
        return None
    return Path(u.database)


def _schema_revisions(engine: Engine) -> tuple[str | None, str | None]:
    """(revision the database is at, revision this code expects)."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(dbmod.alembic_config(engine)).get_current_head()
    if not dbmod.is_initialized(engine):
        return None, head
    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    return current, head


def _shown_url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=True)


def _secret_key_present() -> bool:
    return bool(os.environ.get(secretbox.KEY_ENV)) or secretbox.key_file_path().exists()


# ---------------------------------------------------------------- base classes


class LabfleetCommand(Application):
    """Base of every labfleet (sub)command: the database option and the error rules."""

    option_description = "Options may come before or after the arguments."

    # Positional arguments, by name (for usage messages); leaves check the count.
    arguments: ClassVar[tuple[str, ...]] = ()

    db_url = Text(
        help="""URL of labfleet's database (SQLAlchemy form), e.g.
        sqlite:////srv/labfleet/labfleet.sqlite or postgresql://labfleet@db/labfleet.
        Default: $LABFLEET_DB_URL, else labfleet.sqlite in the current directory.""",
    ).tag(config=True)

    debug = Bool(False, help="Print full tracebacks for unexpected errors.").tag(config=True)

    @default("db_url")
    def _db_url_default(self) -> str:
        return dbmod.default_db_url()

    aliases = {"db-url": "LabfleetCommand.db_url"}
    flags = {
        "debug": (
            {"LabfleetCommand": {"debug": True}},
            "Print the full traceback of an unexpected error.",
        )
    }

    # -- command line

    def _create_loader(self, argv, aliases, flags, classes):  # type: ignore[override]
        return _Loader(argv, aliases, flags, classes=classes, log=self.log, subcommands=self.subcommands)

    def initialize(self, argv: list[str] | None = None) -> None:  # type: ignore[override]
        # Not wrapped in catch_config_error: main() reports every error as one line.
        self.parse_command_line(argv)

    def initialize_subcommand(self, subc: str, argv: list[str] | None = None) -> None:  # type: ignore[override]
        subapp, _ = self.subcommands[subc]
        # A plain instance, not a singleton: main() can run twice in one process (tests, tools).
        self.subapp = subapp(parent=self)
        self.subapp.initialize(argv)

    def parse_command_line(self, argv: list[str] | None = None) -> None:  # type: ignore[override]
        # Application's version is wrapped in catch_config_error (logs and exits 1): call the
        # undecorated one, so that main() reports every error as one line.
        Application.parse_command_line.__wrapped__(self, argv)  # type: ignore[attr-defined]
        if self.subapp is None and not self.subcommands:
            self._check_arguments()

    def _check_arguments(self) -> None:
        want, got = len(self.arguments), len(self.extra_args)
        if got < want:
            missing = " ".join(self.arguments[got:])
            raise UsageError(f"{self.name}: missing {missing} (usage: {self.usage()})")
        if got > want:
            extra = " ".join(self.extra_args[want:])
            raise UsageError(f"{self.name}: unexpected argument(s) {extra!r} (usage: {self.usage()})")

    def usage(self) -> str:
        if self.subcommands:
            return f"{self.name} COMMAND [options]"
        return " ".join([self.name, *self.arguments, "[options]"])

    # -- help: a usage line first; no "--Class.trait" equivalents (only the options are accepted)

    def emit_description(self):  # type: ignore[override]
        yield f"Usage: {self.usage()}"
        yield ""
        yield from super().emit_description()

    def emit_options_help(self):  # type: ignore[override]
        for line in super().emit_options_help():
            if "Equivalent to:" not in line:
                yield line

    def emit_help_epilogue(self, classes: bool):  # type: ignore[override]
        yield from ()

    def start(self) -> None:
        if self.subapp is not None:
            self.subapp.start()
            return
        if self.subcommands:
            names = ", ".join(self.subcommands)
            if self.extra_args:
                raise UsageError(f"{self.name}: unknown command {self.extra_args[0]!r}; commands: {names}")
            raise UsageError(f"{self.name}: missing command, one of: {names} (see {self.name} --help)")
        self.run()

    def run(self) -> None:  # pragma: no cover - every leaf overrides it
        raise NotImplementedError

    # -- database

    @property
    def actor(self) -> Actor:
        return Actor.cli()

    def open_engine(self, *, require_current: bool = True) -> Engine:
        path = _sqlite_file(self.db_url)
        if path is not None and not path.exists():
            # Do not leave an empty database file behind just by asking.
            raise CliError(f"no labfleet database at {path}: run `labfleet init` first (or give --db-url)")
        engine = dbmod.make_engine(self.db_url)
        if require_current:
            current, head = _schema_revisions(engine)
            if current is None:
                engine.dispose()
                raise CliError(
                    f"the database {_shown_url(engine)} is not initialized: run `labfleet init` first"
                )
            if current != head:
                engine.dispose()
                raise CliError(
                    f"the database schema is at revision {current}, this labfleet needs {head}: "
                    "run `labfleet init` to upgrade it"
                )
        return engine

    def transaction(self, work: Callable[[Session], Any], engine: Engine | None = None) -> Any:
        """Run ``work(db)`` in one transaction: committed if it returns, rolled back if it raises."""
        own = engine is None
        engine = engine or self.open_engine()
        try:
            with dbmod.session_scope(dbmod.make_session_factory(engine)) as db:
                return work(db)
        finally:
            if own:
                engine.dispose()

    # -- output

    def out(self, text: str = "") -> None:
        print(text)


class ListCommand(LabfleetCommand):
    """A command that lists things: a table, or JSON with --json."""

    json = Bool(False, help="Print JSON (a list of objects) instead of a table.").tag(config=True)

    flags = {
        **LabfleetCommand.flags,
        "json": ({"ListCommand": {"json": True}}, "Print machine-readable JSON instead of a table."),
    }

    def emit(
        self, views: list[dict[str, Any]], headers: list[str], row: Callable[[dict[str, Any]], list[Any]]
    ) -> None:
        if self.json:
            self.out(json.dumps(views, indent=2, sort_keys=True))
        else:
            self.out(format_table(headers, (row(v) for v in views)))


class GroupCommand(LabfleetCommand):
    """A command made of subcommands (``labfleet domain``, ...)."""


_ACTIVE_FLAGS = {
    "active": ({"LabfleetCommand": {"active": True}}, "Mark it active."),
    "inactive": ({"LabfleetCommand": {"active": False}}, "Mark it inactive: no new sessions start in it."),
}


def _active_trait() -> Bool:
    return Bool(None, allow_none=True, help="Set by --active / --inactive.").tag(config=True)


# ---------------------------------------------------------------- init


class InitSteps(LabfleetCommand):
    """Shared by ``init`` and ``demo``: key file, schema, default policy, first superadmin."""

    def init_steps(
        self,
        *,
        admin_user: str | None,
        admin_domain: str,
        password: str | None,
        ask: bool,
        interactive: bool = True,
    ) -> Engine:
        """Returns the (upgraded) engine; prints what it did and how to log in."""
        if password is not None:
            problem = check_password_strength(password)
            if problem:
                raise UsageError(f"admin password: {problem}")
        elif ask and not _is_tty():
            raise UsageError(
                "cannot ask for the admin password: stdin is not a terminal (give it as a value)"
            )
        from sqlalchemy import func, select

        from hub_ext.core.models import Keypair, User

        engine = dbmod.make_engine(self.db_url)
        before, head = _schema_revisions(engine)

        if not _secret_key_present():
            if before is not None:
                n = self.transaction(lambda db: db.scalar(select(func.count()).select_from(Keypair)), engine)
                if n:
                    raise CliError(
                        f"the secret key is missing ({secretbox.key_file_path()}) but the database holds {n} "
                        f"keypair(s) sealed with it: restore the key file or set ${secretbox.KEY_ENV}; "
                        "a new key would make them unusable"
                    )
        key_path = secretbox.ensure_key_file()
        if os.environ.get(secretbox.KEY_ENV):
            self.out(f"Secret key: from ${secretbox.KEY_ENV}")
        else:
            self.out(f"Secret key: {key_path} (the labfleet service must use the same file; back it up)")

        dbmod.upgrade(engine)
        if before is None:
            state = f"created at schema revision {head}"
        elif before != head:
            state = f"upgraded from schema revision {before} to {head}"
        else:
            state = f"already at schema revision {head}"
        self.out(f"Database: {_shown_url(engine)} {state}")

        def existing(db: Session) -> tuple[list[str], dict[str, Any] | None]:
            policies.ensure_default_keypair_policy(db)
            supers = list(
                db.scalars(select(User.username).where(User.role == "superadmin").order_by(User.username))
            )
            named = tenancy.get_user(db, admin_user or DEFAULT_ADMIN_USER)
            return supers, (tenancy.user_view(named) if named else None)

        supers, named = self.transaction(existing, engine)
        name = admin_user or DEFAULT_ADMIN_USER
        if named is not None:
            what = "superadmin" if named["role"] == "superadmin" else f"user (role {named['role']})"
            self.out(f"The {what} {name!r} already exists: left unchanged.")
            return engine
        if supers and admin_user is None:
            self.out(f"Superadmin(s) already exist ({', '.join(supers)}): left unchanged.")
            return engine

        generated = False
        if password is None:
            if ask or (interactive and _is_tty()):
                password = prompt_new_password(name)
            else:
                password = generate_password()
                generated = True

        def create(db: Session) -> None:
            if tenancy.get_domain(db, admin_domain) is None:
                tenancy.create_domain(
                    db, self.actor, {"name": admin_domain, "description": "Created by labfleet init"}
                )
            tenancy.create_user(
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
            self.out("  (generated: note it now, it is not shown again)")
        else:
            self.out("  password: the one you gave")
        return engine


class InitApp(InitSteps):
    name = "labfleet init"
    description = """Set up labfleet: create the secret key file, create or upgrade the database
    schema, the default keypair policy, the admin domain and a superadmin. Safe to run again:
    it upgrades the schema and leaves an existing superadmin as it is. Without --admin-password
    it asks for one on a terminal, or generates a strong one (printed once) when stdin is not a
    terminal (CI)."""
    examples = _lines(
        "labfleet init",
        "labfleet init --admin-user root --admin-domain ops",
        "labfleet init --db-url postgresql://labfleet@db/labfleet",
    )

    admin_user = Text(
        None, allow_none=True, help=f"Name of the superadmin to create (default {DEFAULT_ADMIN_USER!r})."
    ).tag(config=True)
    admin_password = Text(
        None,
        allow_none=True,
        help="""Password of the new superadmin. Given without a value, it is asked for.
        Visible to other local users in the process list: prefer the prompt.""",
    ).tag(config=True)
    ask_password = Bool(False, help="Ask for the superadmin's password.").tag(config=True)
    admin_domain = Text(DEFAULT_ADMIN_DOMAIN, help="Domain of the new superadmin (created if missing).").tag(
        config=True
    )

    aliases = {
        **LabfleetCommand.aliases,
        "admin-user": "InitApp.admin_user",
        "admin-password": "InitApp.admin_password",
        "admin-domain": "InitApp.admin_domain",
    }
    flags = {
        **LabfleetCommand.flags,
        "admin-password": ({"InitApp": {"ask_password": True}}, "Ask for the superadmin's password."),
    }

    def run(self) -> None:
        engine = self.init_steps(
            admin_user=self.admin_user,
            admin_domain=self.admin_domain,
            password=self.admin_password,
            ask=self.ask_password,
        )
        engine.dispose()


# ---------------------------------------------------------------- domains


def _domain_row(v: dict[str, Any]) -> list[Any]:
    return [
        v["name"],
        v["is_active"],
        _slots_text(v["total_resource_slots"]),
        v.get("projects"),
        v["description"],
    ]


_DOMAIN_HEADERS = ["name", "active", "slots", "projects", "description"]


class DomainOptions(LabfleetCommand):
    slots = Text(
        None,
        allow_none=True,
        help="Total resource cap of the domain, e.g. cpu=64,mem=256g,gpu=4,gpu.shares=2.5.",
    ).tag(config=True)
    description_text = Text(None, allow_none=True, help="A description for people.").tag(config=True)

    aliases = {
        **LabfleetCommand.aliases,
        "slots": "DomainOptions.slots",
        "description": "DomainOptions.description_text",
    }

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if self.slots is not None:
            body["total_resource_slots"] = _check_slots_option(self.slots)
        if self.description_text is not None:
            body["description"] = self.description_text
        return body


class DomainCreate(DomainOptions):
    name = "labfleet domain create"
    description = "Create a domain (a tenant): every user belongs to exactly one."
    examples = "labfleet domain create acme --slots cpu=64,mem=256g,gpu=4 --description 'ACME Corp'"
    arguments = ("NAME",)

    def run(self) -> None:
        body = {"name": self.extra_args[0], **self.body()}
        view = self.transaction(lambda db: tenancy.domain_view(tenancy.create_domain(db, self.actor, body)))
        self.out(f"Created domain {view['name']} (slots: {_slots_text(view['total_resource_slots'])}).")


class DomainList(ListCommand):
    name = "labfleet domain list"
    description = "List the domains."
    examples = "labfleet domain list --json"

    def run(self) -> None:
        views = self.transaction(
            lambda db: [tenancy.domain_view(d, detail=True) for d in tenancy.list_domains(db, self.actor)]
        )
        self.emit(views, _DOMAIN_HEADERS, _domain_row)


class DomainUpdate(DomainOptions):
    name = "labfleet domain update"
    description = "Change a domain's resource cap, description or state."
    examples = "labfleet domain update acme --slots cpu=128,mem=512g,gpu=8 --inactive"
    arguments = ("NAME",)
    active = _active_trait()
    flags = {**LabfleetCommand.flags, **_ACTIVE_FLAGS}

    def run(self) -> None:
        body = self.body()
        if self.active is not None:
            body["is_active"] = self.active
        if not body:
            raise UsageError(
                f"{self.name}: nothing to change (give --slots, --description, --active or --inactive)"
            )
        name = self.extra_args[0]
        view = self.transaction(
            lambda db: tenancy.domain_view(tenancy.update_domain(db, self.actor, name, body))
        )
        self.out(
            f"Updated domain {view['name']} (slots: {_slots_text(view['total_resource_slots'])}, "
            f"{'active' if view['is_active'] else 'inactive'})."
        )


class DomainDelete(LabfleetCommand):
    name = "labfleet domain delete"
    description = "Delete a domain and its projects. Refused while it still has users."
    arguments = ("NAME",)

    def run(self) -> None:
        name = self.extra_args[0]
        self.transaction(lambda db: tenancy.delete_domain(db, self.actor, name))
        self.out(f"Deleted domain {name}.")


class DomainApp(GroupCommand):
    name = "labfleet domain"
    description = "Manage domains (tenants)."
    subcommands = {
        "create": (DomainCreate, DomainCreate.description),
        "list": (DomainList, DomainList.description),
        "update": (DomainUpdate, DomainUpdate.description),
        "delete": (DomainDelete, DomainDelete.description),
    }


# ---------------------------------------------------------------- projects


def _project_row(v: dict[str, Any]) -> list[Any]:
    return [
        v["full_name"],
        v["is_active"],
        _slots_text(v["total_resource_slots"]),
        v["resource_policy"],
        v["members"],
        v["description"],
    ]


_PROJECT_HEADERS = ["project", "active", "slots", "policy", "members", "description"]


class ProjectOptions(LabfleetCommand):
    slots = Text(
        None, allow_none=True, help="Total resource cap of the project, e.g. gpu=1,gpu.shares=1.5."
    ).tag(config=True)
    description_text = Text(None, allow_none=True, help="A description for people.").tag(config=True)
    policy = Text(
        None, allow_none=True, help="Name of a project resource policy (folders, storage); '' removes it."
    ).tag(config=True)

    aliases = {
        **LabfleetCommand.aliases,
        "slots": "ProjectOptions.slots",
        "description": "ProjectOptions.description_text",
        "policy": "ProjectOptions.policy",
    }

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if self.slots is not None:
            body["total_resource_slots"] = _check_slots_option(self.slots)
        if self.description_text is not None:
            body["description"] = self.description_text
        if self.policy is not None:
            body["resource_policy"] = self.policy or None
        return body


class ProjectCreate(ProjectOptions):
    name = "labfleet project create"
    description = "Create a project in a domain."
    examples = "labfleet project create acme/vision --slots gpu=1,gpu.shares=2.5 --description 'Vision team'"
    arguments = ("DOMAIN/PROJECT",)

    def run(self) -> None:
        domain, project = _project_ref(self.extra_args[0])
        body = {"domain": domain, "name": project, **self.body()}
        view = self.transaction(lambda db: tenancy.project_view(tenancy.create_project(db, self.actor, body)))
        self.out(f"Created project {view['full_name']} (slots: {_slots_text(view['total_resource_slots'])}).")


class ProjectList(ListCommand):
    name = "labfleet project list"
    description = "List the projects, of all domains or of one."
    examples = "labfleet project list --domain acme"
    domain = Text(None, allow_none=True, help="Only the projects of this domain.").tag(config=True)
    aliases = {**LabfleetCommand.aliases, "domain": "ProjectList.domain"}

    def run(self) -> None:
        def work(db: Session) -> list[dict[str, Any]]:
            # An unknown domain is "not found": list_projects checks it.
            return [tenancy.project_view(p) for p in tenancy.list_projects(db, self.actor, self.domain)]

        self.emit(self.transaction(work), _PROJECT_HEADERS, _project_row)


class ProjectUpdate(ProjectOptions):
    name = "labfleet project update"
    description = "Change a project's resource cap, description, policy or state."
    examples = "labfleet project update acme/vision --slots gpu.shares=3 --policy big-folders"
    arguments = ("DOMAIN/PROJECT",)
    active = _active_trait()
    flags = {**LabfleetCommand.flags, **_ACTIVE_FLAGS}

    def run(self) -> None:
        domain, project = _project_ref(self.extra_args[0])
        body = self.body()
        if self.active is not None:
            body["is_active"] = self.active
        if not body:
            raise UsageError(
                f"{self.name}: nothing to change (give --slots, --description, --policy, --active or --inactive)"
            )
        view = self.transaction(
            lambda db: tenancy.project_view(tenancy.update_project(db, self.actor, domain, project, body))
        )
        self.out(f"Updated project {view['full_name']} (slots: {_slots_text(view['total_resource_slots'])}).")


class ProjectDelete(LabfleetCommand):
    name = "labfleet project delete"
    description = "Delete a project (its members stay in the domain)."
    arguments = ("DOMAIN/PROJECT",)

    def run(self) -> None:
        domain, project = _project_ref(self.extra_args[0])
        members = self.transaction(lambda db: tenancy.delete_project(db, self.actor, domain, project))
        self.out(f"Deleted project {domain}/{project} ({len(members)} member(s) removed from it).")


class ProjectAddMember(LabfleetCommand):
    name = "labfleet project add-member"
    description = "Add a user of the project's domain to the project."
    examples = "labfleet project add-member acme/vision alice"
    arguments = ("DOMAIN/PROJECT", "USER")

    def run(self) -> None:
        (domain, project), username = _project_ref(self.extra_args[0]), self.extra_args[1]
        self.transaction(
            lambda db: tenancy.add_member(db, self.actor, domain, project, {"username": username})
        )
        self.out(f"Added {username} to {domain}/{project}.")


class ProjectRemoveMember(LabfleetCommand):
    name = "labfleet project remove-member"
    description = "Remove a user from a project."
    examples = "labfleet project remove-member acme/vision alice"
    arguments = ("DOMAIN/PROJECT", "USER")

    def run(self) -> None:
        (domain, project), username = _project_ref(self.extra_args[0]), self.extra_args[1]
        self.transaction(lambda db: tenancy.remove_member(db, self.actor, domain, project, username))
        self.out(f"Removed {username} from {domain}/{project}.")


class ProjectApp(GroupCommand):
    name = "labfleet project"
    description = "Manage projects (working units inside a domain) and their members."
    subcommands = {
        "create": (ProjectCreate, ProjectCreate.description),
        "list": (ProjectList, ProjectList.description),
        "update": (ProjectUpdate, ProjectUpdate.description),
        "delete": (ProjectDelete, ProjectDelete.description),
        "add-member": (ProjectAddMember, ProjectAddMember.description),
        "remove-member": (ProjectRemoveMember, ProjectRemoveMember.description),
    }


# ---------------------------------------------------------------- users


def _user_row(v: dict[str, Any]) -> list[Any]:
    return [v["username"], v["domain"], v["role"], v["status"], v["projects"], v["has_password"], v["email"]]


_USER_HEADERS = ["user", "domain", "role", "status", "projects", "password", "email"]


class UserOptions(LabfleetCommand):
    role = Text(None, allow_none=True, help=f"Role: {', '.join(ROLES)} (admin = domain admin).").tag(
        config=True
    )
    projects = List(
        Text(),
        default_value=None,
        allow_none=True,
        help="A project DOMAIN/PROJECT the user works in; repeat the option (or use commas) for several.",
    ).tag(config=True)
    password = Text(
        None,
        allow_none=True,
        help="""Password for logging in to the Hub. Given without a value, it is asked for.
        Visible to other local users in the process list: prefer the prompt.""",
    ).tag(config=True)
    ask_password = Bool(False, help="Ask for the password.").tag(config=True)
    email = Text(None, allow_none=True, help="E-mail address.").tag(config=True)
    full_name = Text(None, allow_none=True, help="Full name.").tag(config=True)
    policy = Text(None, allow_none=True, help="Name of a user resource policy (folders, storage).").tag(
        config=True
    )

    aliases = {
        **LabfleetCommand.aliases,
        "role": "UserOptions.role",
        "project": "UserOptions.projects",
        "password": "UserOptions.password",
        "email": "UserOptions.email",
        "full-name": "UserOptions.full_name",
        "policy": "UserOptions.policy",
    }
    flags = {
        **LabfleetCommand.flags,
        "password": ({"UserOptions": {"ask_password": True}}, "Ask for the password on the terminal."),
    }

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if self.role is not None:
            body["role"] = self.role
        if self.email is not None:
            body["email"] = self.email
        if self.full_name is not None:
            body["full_name"] = self.full_name
        return body


class UserCreate(UserOptions):
    name = "labfleet user create"
    description = """Create a user in a domain (with its main keypair). Without --password it asks
    for one on a terminal; give --no-password for a user who logs in through another authenticator."""
    examples = _lines(
        "labfleet user create alice --domain acme --project acme/vision --email alice@acme.test",
        "labfleet user create bob --domain acme --role admin --password",
        "labfleet user create carol --domain acme --no-password",
    )
    arguments = ("NAME",)

    domain = Text(None, allow_none=True, help="The user's domain (required).").tag(config=True)
    no_password = Bool(False, help="Create the user without a password.").tag(config=True)

    aliases = {**UserOptions.aliases, "domain": "UserCreate.domain"}
    flags = {
        **UserOptions.flags,
        "no-password": ({"UserCreate": {"no_password": True}}, "No password: the user logs in another way."),
    }

    def run(self) -> None:
        username = self.extra_args[0]
        if self.domain is None:
            raise UsageError(f"{self.name}: --domain is required")
        body: dict[str, Any] = {"username": username, "domain": self.domain, **self.body()}
        if self.projects:
            body["projects"] = _split_list(self.projects)
        if self.policy:
            body["resource_policy"] = self.policy
        given = self.password is not None or self.ask_password
        if self.no_password and given:
            raise UsageError("--password and --no-password exclude each other")
        if self.password is not None:
            body["password"] = self.password
        elif not self.no_password:
            if not (self.ask_password or _is_tty()):
                raise UsageError(
                    "no password: give --password PW (or --password alone on a terminal to be asked), "
                    "or --no-password for a user who logs in another way"
                )
            body["password"] = prompt_new_password(username)
        view = self.transaction(lambda db: tenancy.user_view(tenancy.create_user(db, self.actor, body)))
        projects = ", ".join(view["projects"]) or "none"
        self.out(
            f"Created user {view['username']} in domain {view['domain']} (role {view['role']}, projects: {projects})."
        )


class UserList(ListCommand):
    name = "labfleet user list"
    description = "List the users, of all domains or of one."
    examples = "labfleet user list --domain acme --json"
    domain = Text(None, allow_none=True, help="Only the users of this domain.").tag(config=True)
    aliases = {**LabfleetCommand.aliases, "domain": "UserList.domain"}

    def run(self) -> None:
        def work(db: Session) -> list[dict[str, Any]]:
            # An unknown domain is "not found": list_users checks it.
            return [tenancy.user_view(u) for u in tenancy.list_users(db, self.actor, self.domain)]

        self.emit(self.transaction(work), _USER_HEADERS, _user_row)


class UserUpdate(UserOptions):
    name = "labfleet user update"
    description = """Change a user. --project replaces the whole list of projects (--project ''
    empties it); --policy '' removes the user's resource policy."""
    examples = _lines(
        "labfleet user update alice --role admin --project acme/vision --project acme/nlp",
        "labfleet user update alice --password",
        "labfleet user update alice --activate",
    )
    arguments = ("NAME",)

    activate = Bool(False, help="Make an inactive user active again.").tag(config=True)
    domain = Text(
        None, allow_none=True, help="Move the user to another domain (their projects are dropped)."
    ).tag(config=True)
    aliases = {**UserOptions.aliases, "domain": "UserUpdate.domain"}
    flags = {
        **UserOptions.flags,
        "activate": ({"UserUpdate": {"activate": True}}, "Make an inactive user active again."),
    }

    def run(self) -> None:
        username = self.extra_args[0]
        body = self.body()
        if self.projects is not None:
            body["projects"] = _split_list(self.projects)
        if self.policy is not None:
            body["resource_policy"] = self.policy or None
        if self.domain is not None:
            body["domain"] = self.domain
        if self.activate:
            body["status"] = "active"
        if self.password is not None:
            body["password"] = self.password
        elif self.ask_password:
            body["password"] = prompt_new_password(username)
        if not body:
            raise UsageError(f"{self.name}: nothing to change (see labfleet user update --help)")
        view = self.transaction(
            lambda db: tenancy.user_view(tenancy.update_user(db, self.actor, username, body))
        )
        changed = ", ".join("password" if k == "password" else k for k in body)
        self.out(
            f"Updated user {view['username']} ({changed}); role {view['role']}, status {view['status']}."
        )


class UserDeactivate(LabfleetCommand):
    name = "labfleet user deactivate"
    description = "Deactivate a user: they can no longer log in or use their keypairs."
    arguments = ("NAME",)

    def run(self) -> None:
        username = self.extra_args[0]
        self.transaction(lambda db: tenancy.update_user(db, self.actor, username, {"status": "inactive"}))
        self.out(f"Deactivated user {username}.")


class UserApp(GroupCommand):
    name = "labfleet user"
    description = "Manage users."
    subcommands = {
        "create": (UserCreate, "Create a user in a domain."),
        "list": (UserList, UserList.description),
        "update": (UserUpdate, "Change a user's role, projects, password, e-mail, name or state."),
        "deactivate": (UserDeactivate, UserDeactivate.description),
    }


# ---------------------------------------------------------------- resource policies

_KEYPAIR_ONLY = (
    "slots",
    "default_for_unspecified",
    "max_concurrent_sessions",
    "max_pending_sessions",
    "max_session_lifetime",
    "idle_timeout",
    "allowed_storage_hosts",
)
_FOLDER_ONLY = ("max_vfolder_count", "max_quota_scope_size", "max_vfolder_size")


def _policy_row(kind: str) -> Callable[[dict[str, Any]], list[Any]]:
    if kind == "keypair":

        def row(v: dict[str, Any]) -> list[Any]:
            idle = v["idle_timeout"]
            return [
                v["name"],
                _slots_text(v["total_resource_slots"]),
                v["default_for_unspecified"],
                _unlimited(v["max_concurrent_sessions"]),
                _unlimited(v["max_pending_sessions"]),
                _unlimited(v["max_session_lifetime"], "off"),
                "default" if idle < 0 else ("never" if idle == 0 else idle),
                v["allowed_storage_hosts"],
            ]

        return row
    return lambda v: [
        v["name"],
        _unlimited(v["max_vfolder_count"]),
        _bytes_text(v["max_quota_scope_size"]),
        _bytes_text(v["max_vfolder_size"]),
    ]


def _policy_headers(kind: str) -> list[str]:
    if kind == "keypair":
        return ["name", "slots", "unspecified", "sessions", "pending", "lifetime", "idle", "storage-hosts"]
    return ["name", "vfolders", "quota", "folder-size"]


class PolicyOptions(LabfleetCommand):
    slots = Text(None, allow_none=True, help="(keypair) Total slots of all the keypair's sessions.").tag(
        config=True
    )
    default_for_unspecified = Text(
        None,
        allow_none=True,
        help="(keypair) LIMITED: slots not named in --slots are zero; UNLIMITED: they have no limit.",
    ).tag(config=True)
    max_concurrent_sessions = WholeNumber(
        None, allow_none=True, help="(keypair) Running sessions at once (0 = unlimited)."
    ).tag(config=True)
    max_pending_sessions = WholeNumber(
        None, allow_none=True, help="(keypair) Queued sessions at once (0 = unlimited)."
    ).tag(config=True)
    max_session_lifetime = Seconds(
        None, allow_none=True, help="(keypair) Seconds a session may live, e.g. 86400 or 1d (0 = no limit)."
    ).tag(config=True)
    idle_timeout = Seconds(
        None,
        allow_none=True,
        help="(keypair) Seconds of idleness before a session is reclaimed, e.g. 30m (0 = never, -1 = fleet default).",
    ).tag(config=True)
    allowed_storage_hosts = Text(
        None,
        allow_none=True,
        help="(keypair) Storage hosts its user has every right on, comma-separated; '' for none.",
    ).tag(config=True)
    max_vfolder_count = WholeNumber(
        None, allow_none=True, help="(user, project) Virtual folders it may own (0 = unlimited)."
    ).tag(config=True)
    max_quota_scope_size = ByteSize(
        None, allow_none=True, help="(user, project) Storage quota in bytes, e.g. 10g (0 = unlimited)."
    ).tag(config=True)
    max_vfolder_size = ByteSize(
        None, allow_none=True, help="(user, project) One folder's size limit, e.g. 2g (0 = only the quota)."
    ).tag(config=True)

    aliases = {
        **LabfleetCommand.aliases,
        **{_option(t)[2:]: f"PolicyOptions.{t}" for t in _KEYPAIR_ONLY + _FOLDER_ONLY},
    }

    def kind(self) -> str:
        return policies.parse_kind(self.extra_args[0])

    def body(self, kind: str) -> dict[str, Any]:
        wrong = _FOLDER_ONLY if kind == "keypair" else _KEYPAIR_ONLY
        given = [_option(t) for t in wrong if getattr(self, t) is not None]
        if given:
            applies = "user and project" if kind == "keypair" else "keypair"
            raise UsageError(f"{', '.join(given)}: only for {applies} policies, not {kind} policies")
        body: dict[str, Any] = {}
        for trait in _KEYPAIR_ONLY + _FOLDER_ONLY:
            value = getattr(self, trait)
            if value is None:
                continue
            if trait == "slots":
                body["total_resource_slots"] = _check_slots_option(value)
            elif trait == "allowed_storage_hosts":
                body[trait] = _split_list([value])
            elif trait == "default_for_unspecified":
                body[trait] = value.upper()
            else:
                body[trait] = value
        return body


class PolicyCreate(PolicyOptions):
    name = "labfleet policy create"
    description = """Create a resource policy: keypair (slots, sessions, lifetimes, storage hosts),
    user or project (folder count, storage quota)."""
    examples = _lines(
        "labfleet policy create keypair students --slots cpu=4,mem=16g,gpu.shares=0.5 --default-for-unspecified LIMITED --max-concurrent-sessions 2 --idle-timeout 30m",
        "labfleet policy create user standard --max-vfolder-count 10 --max-quota-scope-size 50g",
    )
    arguments = ("KIND", "NAME")

    def run(self) -> None:
        kind = self.kind()
        body = {"name": self.extra_args[1], **self.body(kind)}
        view = self.transaction(
            lambda db: policies.policy_view(kind, policies.create_policy(db, self.actor, kind, body))
        )
        self.out(f"Created {kind} resource policy {view['name']}.")


class PolicyList(ListCommand):
    name = "labfleet policy list"
    description = "List the resource policies of one kind: keypair, user or project."
    examples = "labfleet policy list keypair"
    arguments = ("KIND",)

    def run(self) -> None:
        kind = policies.parse_kind(self.extra_args[0])
        views = self.transaction(
            lambda db: [policies.policy_view(kind, p) for p in policies.list_policies(db, self.actor, kind)]
        )
        self.emit(views, _policy_headers(kind), _policy_row(kind))


class PolicyUpdate(PolicyOptions):
    name = "labfleet policy update"
    description = "Change a resource policy."
    examples = "labfleet policy update keypair students --max-concurrent-sessions 3"
    arguments = ("KIND", "NAME")

    def run(self) -> None:
        kind, name = self.kind(), self.extra_args[1]
        body = self.body(kind)
        if not body:
            raise UsageError(f"{self.name}: nothing to change (see labfleet policy update --help)")
        self.transaction(lambda db: policies.update_policy(db, self.actor, kind, name, body))
        self.out(f"Updated {kind} resource policy {name}.")


class PolicyDelete(LabfleetCommand):
    name = "labfleet policy delete"
    description = "Delete a resource policy that nothing uses."
    arguments = ("KIND", "NAME")

    def run(self) -> None:
        kind, name = policies.parse_kind(self.extra_args[0]), self.extra_args[1]
        self.transaction(lambda db: policies.delete_policy(db, self.actor, kind, name))
        self.out(f"Deleted {kind} resource policy {name}.")


class PolicyApp(GroupCommand):
    name = "labfleet policy"
    description = "Manage resource policies (kinds: keypair, user, project)."
    subcommands = {
        "create": (PolicyCreate, "Create a keypair, user or project resource policy."),
        "list": (PolicyList, PolicyList.description),
        "update": (PolicyUpdate, PolicyUpdate.description),
        "delete": (PolicyDelete, PolicyDelete.description),
    }


# ---------------------------------------------------------------- keypairs


def _keypair_row(v: dict[str, Any]) -> list[Any]:
    return [
        v["access_key"],
        v["username"],
        v["resource_policy"],
        v["is_main"],
        v["is_active"],
        v["rate_limit"],
        v["created_at"],
        v["last_used"],
    ]


_KEYPAIR_HEADERS = ["access-key", "user", "policy", "main", "active", "rate-limit", "created", "last-used"]


class KeypairOptions(LabfleetCommand):
    policy = Text(None, allow_none=True, help="Name of a keypair resource policy (default: 'default').").tag(
        config=True
    )
    rate_limit = WholeNumber(None, allow_none=True, help="Requests allowed per 15-minute window.").tag(
        config=True
    )
    aliases = {
        **LabfleetCommand.aliases,
        "policy": "KeypairOptions.policy",
        "rate-limit": "KeypairOptions.rate_limit",
    }

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if self.policy is not None:
            body["resource_policy"] = self.policy
        if self.rate_limit is not None:
            body["rate_limit"] = self.rate_limit
        return body


class KeypairIssue(KeypairOptions):
    name = "labfleet keypair issue"
    description = """Issue a keypair for a user and print its access key and secret key. The secret
    is shown this once and stored only encrypted: note it now."""
    examples = "labfleet keypair issue alice --policy students --rate-limit 1000"
    arguments = ("USER",)
    json = Bool(False, help="Print the keypair (with its secret) as JSON.").tag(config=True)
    flags = {**LabfleetCommand.flags, "json": ({"KeypairIssue": {"json": True}}, "Print JSON.")}

    def run(self) -> None:
        body = {"username": self.extra_args[0], **self.body()}

        def work(db: Session) -> dict[str, Any]:
            kp, secret = keypairs.issue(db, self.actor, body)
            return keypairs.keypair_view(kp, secret)

        view = self.transaction(work)  # committed before the secret is shown
        if self.json:
            self.out(json.dumps(view, indent=2, sort_keys=True))
            return
        self.out(
            f"Issued a keypair for {view['username']} "
            f"(policy {view['resource_policy']}, {view['rate_limit']} requests per 15 minutes)."
        )
        self.out(f"access key: {view['access_key']}")
        self.out(f"secret key: {view['secret_key']}")
        self.out("The secret key is shown only this once: store it now.")


class KeypairList(ListCommand):
    name = "labfleet keypair list"
    description = "List keypairs (never their secrets)."
    examples = "labfleet keypair list --user alice"
    user = Text(None, allow_none=True, help="Only this user's keypairs.").tag(config=True)
    aliases = {**LabfleetCommand.aliases, "user": "KeypairList.user"}

    def run(self) -> None:
        def work(db: Session) -> list[dict[str, Any]]:
            if self.user is not None:
                tenancy.readable_user(db, self.actor, self.user)
            return [keypairs.keypair_view(kp) for kp in keypairs.list_keypairs(db, self.actor, self.user)]

        self.emit(self.transaction(work), _KEYPAIR_HEADERS, _keypair_row)


class KeypairUpdate(KeypairOptions):
    name = "labfleet keypair update"
    description = "Change a keypair's resource policy, rate limit or state."
    examples = "labfleet keypair update AKXXXXXXXXXXXXXXXXXX --policy students"
    arguments = ("ACCESS_KEY",)
    active = _active_trait()
    flags = {**LabfleetCommand.flags, **_ACTIVE_FLAGS}

    def run(self) -> None:
        body = self.body()
        if self.active is not None:
            body["is_active"] = self.active
        if not body:
            raise UsageError(
                f"{self.name}: nothing to change (give --policy, --rate-limit, --active or --inactive)"
            )
        key = self.extra_args[0]
        self.transaction(lambda db: keypairs.update(db, self.actor, key, body))
        self.out(f"Updated keypair {key}.")


class KeypairRevoke(LabfleetCommand):
    name = "labfleet keypair revoke"
    description = "Revoke a keypair: requests signed with it are refused from now on."
    arguments = ("ACCESS_KEY",)

    def run(self) -> None:
        key = self.extra_args[0]
        self.transaction(lambda db: keypairs.revoke(db, self.actor, key))
        self.out(f"Revoked keypair {key}.")


class KeypairApp(GroupCommand):
    name = "labfleet keypair"
    description = "Manage keypairs (access key + secret key for signed API requests)."
    subcommands = {
        "issue": (KeypairIssue, "Issue a keypair for a user (the secret is shown once)."),
        "list": (KeypairList, KeypairList.description),
        "update": (KeypairUpdate, KeypairUpdate.description),
        "revoke": (KeypairRevoke, KeypairRevoke.description),
    }


# ---------------------------------------------------------------- images


def _image_row(v: dict[str, Any]) -> list[Any]:
    ports = ",".join(f"{p['name']}:{p['protocol']}:{p['port']}" for p in v["service_ports"])
    return [
        v["name"],
        v["display_name"],
        _slots_text(v["min_resource_slots"]),
        ",".join(v["accelerators"]) or "-",
        ports or "-",
        ",".join(v["projects"] + v["domains"]) or "everyone",
    ]


class ImageRegister(LabfleetCommand):
    name = "labfleet image register"
    description = "Register an image (environment) that sessions may start."
    examples = (
        "labfleet image register repo/pytorch:2.5 --display-name 'PyTorch 2.5' --min cpu=1,mem=2g "
        "--accelerators cuda --ports tensorboard:http:6006 --projects acme/ml\n"
        "labfleet image register labfleet/singleuser:test --from-docker"
    )
    arguments = ("IMAGE",)
    display_name = Text(None, allow_none=True, help="The name people see on the spawn form.").tag(config=True)
    min_slots = Text(None, allow_none=True, help="Minimum resources of a session, e.g. cpu=1,mem=2g.").tag(
        config=True
    )
    accelerators = Text(None, allow_none=True, help="Accelerators it can use, comma-separated (cuda).").tag(
        config=True
    )
    ports = Text(None, allow_none=True, help="Service ports, name:protocol:port comma-separated.").tag(
        config=True
    )
    projects = Text(
        None, allow_none=True, help="Only these projects (DOMAIN/PROJECT, comma-separated) may use it."
    ).tag(config=True)
    domains = Text(None, allow_none=True, help="Only these domains (comma-separated) may use it.").tag(
        config=True
    )
    from_docker = Bool(False, help="Read the image's ai.labfleet.* labels from the local Docker engine.").tag(
        config=True
    )
    aliases = {
        **LabfleetCommand.aliases,
        "display-name": "ImageRegister.display_name",
        "min": "ImageRegister.min_slots",
        "accelerators": "ImageRegister.accelerators",
        "ports": "ImageRegister.ports",
        "projects": "ImageRegister.projects",
        "domains": "ImageRegister.domains",
    }
    flags = {
        **LabfleetCommand.flags,
        "from-docker": ({"ImageRegister": {"from_docker": True}}, "Read the labels from Docker."),
    }

    def run(self) -> None:
        body: dict[str, Any] = {"name": self.extra_args[0]}
        if self.display_name is not None:
            body["display_name"] = self.display_name
        if self.min_slots is not None:
            body["min_resource_slots"] = _check_slots_option(self.min_slots, "--min")
        for option, key in (
            ("accelerators", "accelerators"),
            ("projects", "projects"),
            ("domains", "domains"),
        ):
            value = getattr(self, option)
            if value is not None:
                body[key] = _split_list([value])
        if self.ports is not None:
            body["service_ports"] = _split_list([self.ports])
        labels = images.docker_labels(body["name"]) if self.from_docker else None
        view = self.transaction(lambda db: images.image_view(images.register(db, self.actor, body, labels)))
        self.out(f"Registered image {view['name']} ({view['display_name']}).")


class ImageList(ListCommand):
    name = "labfleet image list"
    description = "List the registered images."

    def run(self) -> None:
        views = self.transaction(
            lambda db: [images.image_view(i) for i in images.list_images(db, self.actor)]
        )
        self.emit(views, ["image", "display name", "min", "accelerators", "ports", "for"], _image_row)


class ImageRemove(LabfleetCommand):
    name = "labfleet image remove"
    description = "Remove an image from the registry; running sessions keep running."
    arguments = ("IMAGE",)

    def run(self) -> None:
        name = self.extra_args[0]
        self.transaction(lambda db: images.remove(db, self.actor, name))
        self.out(f"Removed image {name}.")


class ImageApp(GroupCommand):
    name = "labfleet image"
    description = "Manage images (environments)."
    subcommands = {
        "register": (ImageRegister, ImageRegister.description),
        "list": (ImageList, ImageList.description),
        "remove": (ImageRemove, ImageRemove.description),
    }


# ---------------------------------------------------------------- storage hosts


def _host_row(v: dict[str, Any]) -> list[Any]:
    return [
        v["name"],
        v["path"],
        _bytes_text(v["capacity"]),
        format_amount("mem", Decimal(v["used"])),
        ",".join(v["default_permissions"]) or "-",
        "yes" if v["is_active"] else "no",
    ]


class StorageHostAdd(LabfleetCommand):
    name = "labfleet storage-host add"
    description = """Add a storage host: a directory where virtual folders live (local, or a file
    system mounted at the same path on every node)."""
    examples = _lines(
        "labfleet storage-host add nfs --path /mnt/nfs/vfolders --capacity 10t",
        "labfleet storage-host add scratch --path /srv/scratch --rights create-vfolder,mount-in-session,upload-file,download-file",
    )
    arguments = ("NAME",)
    path = Text(None, allow_none=True, help="The host's root directory (absolute).").tag(config=True)
    capacity = ByteSize(
        None, allow_none=True, help="What it may hold, e.g. 10t (0 = what the disk has)."
    ).tag(config=True)
    rights = Text(
        None,
        allow_none=True,
        help="Rights everyone has on it, comma-separated (default none: grant them to domains, "
        "projects or keypair policies).",
    ).tag(config=True)
    owner = Text(
        None,
        allow_none=True,
        help="UID:GID that owns what the API writes (the sessions' user, e.g. 1000:1000).",
    ).tag(config=True)
    aliases = {
        **LabfleetCommand.aliases,
        "path": "StorageHostAdd.path",
        "capacity": "StorageHostAdd.capacity",
        "rights": "StorageHostAdd.rights",
        "owner": "StorageHostAdd.owner",
    }

    def run(self) -> None:
        if self.path is None:
            raise UsageError("--path is required")
        body: dict[str, Any] = {"name": self.extra_args[0], "path": self.path}
        if self.capacity is not None:
            body["capacity"] = self.capacity
        if self.rights is not None:
            body["default_permissions"] = _split_list([self.rights])
        if self.owner is not None:
            uid, _, gid = self.owner.partition(":")
            if not uid.isdigit() or (gid and not gid.isdigit()):
                raise UsageError("--owner takes UID or UID:GID, in numbers")
            body["owner_uid"], body["owner_gid"] = int(uid), int(gid or uid)
        view = self.transaction(
            lambda db: storage.host_view(db, storage.create_host(db, self.actor, body), admin=True)
        )
        self.out(f"Added storage host {view['name']} at {view['path']}.")


class StorageHostList(ListCommand):
    name = "labfleet storage-host list"
    description = "List the storage hosts, their capacity, use and default rights."

    def run(self) -> None:
        views = self.transaction(
            lambda db: [storage.host_view(db, h, admin=True) for h in storage.list_hosts(db)]
        )
        self.emit(views, ["name", "path", "capacity", "used", "everyone may", "active"], _host_row)


class StorageHostRemove(LabfleetCommand):
    name = "labfleet storage-host remove"
    description = "Remove a storage host that holds no folder (its directory is left on disk)."
    arguments = ("NAME",)

    def run(self) -> None:
        name = self.extra_args[0]
        self.transaction(lambda db: storage.delete_host(db, self.actor, name))
        self.out(f"Removed storage host {name}.")


class StorageHostApp(GroupCommand):
    name = "labfleet storage-host"
    description = "Manage storage hosts (where virtual folders live)."
    subcommands = {
        "add": (StorageHostAdd, StorageHostAdd.description),
        "list": (StorageHostList, StorageHostList.description),
        "remove": (StorageHostRemove, StorageHostRemove.description),
    }


# ---------------------------------------------------------------- demo

DEMO_DOMAIN = ("demo", "cpu=32,mem=128g,gpu=2,gpu.shares=2")
DEMO_PROJECTS = (
    ("ml-team", "gpu.shares=1.5", "Demo: machine-learning team"),
    ("research", "gpu.shares=1", "Demo: research"),
)
DEMO_USERS = (
    ("alice", "user", ["demo/ml-team", "demo/research"]),
    ("bob", "user", ["demo/ml-team"]),
    ("carol", "admin", []),
    ("mona", "monitor", []),
)


class DemoApp(InitSteps):
    name = "labfleet demo"
    description = f"""Seed demo tenants: domain 'demo' ({DEMO_DOMAIN[1]}), projects demo/ml-team and
    demo/research, users alice (both projects), bob (ml-team), carol (domain admin of demo) and mona
    (monitor), all with one known demo password, and print the logins. Initializes the database
    first if needed. Safe to run again: what exists is left as it is."""
    examples = _lines("labfleet demo", "labfleet demo --password another-demo-pw")

    password = Text(
        DEMO_PASSWORD, help="Password of the demo users (printed: a demo, not for real use)."
    ).tag(config=True)
    aliases = {**LabfleetCommand.aliases, "password": "DemoApp.password"}

    def run(self) -> None:
        problem = check_password_strength(self.password)
        if problem:
            raise UsageError(f"--password: {problem}")
        path = _sqlite_file(self.db_url)
        fresh = path is not None and not path.exists()
        if not fresh:
            probe = dbmod.make_engine(self.db_url)
            fresh = not dbmod.is_initialized(probe)
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
        actor = self.actor
        dname, dslots = DEMO_DOMAIN
        if tenancy.get_domain(db, dname) is None:
            tenancy.create_domain(
                db,
                actor,
                {"name": dname, "total_resource_slots": dslots, "description": "Demo tenant (labfleet demo)"},
            )
        for pname, pslots, pdesc in DEMO_PROJECTS:
            if tenancy.get_project(db, dname, pname) is None:
                tenancy.create_project(
                    db,
                    actor,
                    {"domain": dname, "name": pname, "total_resource_slots": pslots, "description": pdesc},
                )
        rows = []
        for username, role, projects in DEMO_USERS:
            u = tenancy.get_user(db, username)
            if u is None:
                body = {"username": username, "domain": dname, "role": role, "password": self.password}
                if projects:
                    body["projects"] = projects
                u = tenancy.create_user(db, actor, body)
                state, shown = "created", self.password
            else:
                state = "existed" if u.domain.name == dname else f"existed (domain {u.domain.name})"
                shown = self.password if verify_password(self.password, u.password_hash) else "(changed)"
            label = "domain admin" if u.role == "admin" else u.role
            rows.append([u.username, label, [p.full_name for p in u.projects], shown, state])
        return rows


# ---------------------------------------------------------------- the command


class LabfleetApp(LabfleetCommand):
    name = "labfleet"
    description = """Set up and manage labfleet, the multi-tenant GPU platform on JupyterHub:
    domains, projects, users, resource policies and keypairs. Every command goes through the
    same checks as the REST API and records its change in the audit log.
    Run `labfleet COMMAND --help` for the options of a command."""
    examples = _lines(
        "labfleet init",
        "labfleet demo",
        "labfleet domain create acme --slots cpu=64,mem=256g,gpu=4",
        "labfleet project create acme/vision --slots gpu.shares=2.5",
        "labfleet user create alice --domain acme --project acme/vision",
        "labfleet keypair issue alice",
        "labfleet --db-url sqlite:////srv/labfleet/labfleet.sqlite domain list",
    )
    subcommands = {
        "init": (InitApp, "Create or upgrade the database and the first superadmin."),
        "domain": (DomainApp, DomainApp.description),
        "project": (ProjectApp, ProjectApp.description),
        "user": (UserApp, UserApp.description),
        "policy": (PolicyApp, PolicyApp.description),
        "keypair": (KeypairApp, KeypairApp.description),
        "image": (ImageApp, ImageApp.description),
        "storage-host": (StorageHostApp, StorageHostApp.description),
        "demo": (DemoApp, "Seed demo tenants and users and print their logins."),
    }

    @default("version")
    def _version_default(self) -> str:
        try:
            from importlib.metadata import PackageNotFoundError, version
        except ImportError:  # pragma: no cover
            return "0.1.0"
        try:
            return version("labfleet")
        except PackageNotFoundError:  # running from a source checkout
            return "0.1.0"

    def parse_command_line(self, argv: list[str] | None = None) -> None:  # type: ignore[override]
        """Global options may come before the command: ``labfleet --db-url URL domain list``."""
        argv = list(sys.argv[1:] if argv is None else argv)
        while argv and argv[0].startswith("--") and argv[0] not in ("--help", "--help-all", "--version"):
            opt = argv.pop(0)
            key, eq, value = opt[2:].partition("=")
            if key == "db-url":
                if not eq:
                    if not argv:
                        raise UsageError("--db-url needs a value")
                    value = argv.pop(0)
                self.config.LabfleetCommand.db_url = value
            elif key == "debug" and not eq:
                self.config.LabfleetCommand.debug = True
            else:
                raise UsageError(f"unknown option {opt} (give command options after the command)")
        super().parse_command_line(argv)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        app = LabfleetApp()
        app.initialize(argv)
        app.start()
    except CliError as e:
        _fail(e.message, e.code)
    except LabfleetError as e:
        # 400: the input is wrong (usage); 403/404/409: the operation was refused.
        _fail(e.message, 2 if e.status == 400 else 1)
    except (TraitError, ArgumentError) as e:
        _fail(str(e), 2)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except BrokenPipeError:
        # The reader went away (`labfleet user list | head`): stop quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except Exception as e:
        # Only modules already loaded can have raised their errors: no import needed to check.
        box, sa_exc = sys.modules.get("hub_ext.core.secretbox"), sys.modules.get("sqlalchemy.exc")
        if box is not None and isinstance(e, box.SecretKeyMissing):
            _fail(str(e), 1)
        if debug:
            raise
        if sa_exc is not None and isinstance(e, sa_exc.SQLAlchemyError):
            cause = getattr(e, "orig", None) or e
            first = str(cause).splitlines()[0] if str(cause) else ""
            _fail(f"database error: {type(cause).__name__}: {first}", 1)
        _fail(f"unexpected {type(e).__name__}: {e} (run again with --debug for the traceback)", 1)


if __name__ == "__main__":
    main()
