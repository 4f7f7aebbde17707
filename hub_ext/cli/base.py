"""The command base every ``labfleet`` command is built on.

A command is a :class:`Command` subclass: its name, a description, its positional
``arguments`` and its ``options`` (:class:`Option`), and a ``run()`` method. Commands are
grouped by :class:`Group` (``labfleet domain``, ...). :func:`dispatch` walks the groups to
the command named on the command line, parses its options with :mod:`argparse` (options
may come before or after the arguments) and runs it.

Errors are :class:`CliError` (exit 1: the operation was refused) or :class:`UsageError`
(exit 2: bad command line or bad input); ``main()`` prints either as one line.

What a command prints (tables, JSON, slots and sizes, the layout of help) is
:mod:`labfleet.cli.output`'s; this module only decides when.

Nothing here imports SQLAlchemy or the logic modules at import time: ``--help`` and usage
errors answer without loading them. Commands import what they use inside ``run()``.
"""

from __future__ import annotations

import argparse
import getpass
import os
import re
import secrets
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from labfleet.cli.output import (
    format_table,
    help_entries,
    help_examples,
    help_paragraph,
    json_text,
    shown_url,
)
from labfleet.core.authz import Actor
from labfleet.core.dburl import default_db_url, normalize_url
from labfleet.core.passwords import check_password_strength
from labfleet.core.slots import ResourceSlots, SlotError, parse_amount

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

# ---------------------------------------------------------------- errors


class CliError(Exception):
    """An error the command reports as one line, with an exit status (1: refused)."""

    code = 1

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class UsageError(CliError):
    """Bad command line: unknown command or option, missing or extra arguments, bad values."""

    code = 2


# ---------------------------------------------------------------- option values


def whole_number(s: str) -> int:
    try:
        return int(s.strip())
    except ValueError:
        raise ValueError(f"expected a whole number (got {s!r:.40})") from None


_SECONDS_RE = re.compile(r"^\s*(-?[0-9]+)\s*([smhd]?)\s*$")
_SECONDS_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(s: str) -> int:
    """A duration in seconds; ``90``, ``30m``, ``2h`` and ``1d`` are accepted."""
    m = _SECONDS_RE.match(s)
    if not m:
        raise ValueError(f"expected seconds, e.g. 3600, 30m, 2h or 1d (got {s!r:.40})")
    return int(m.group(1)) * _SECONDS_UNIT[m.group(2)]


def byte_size(s: str) -> int:
    """A size in bytes; ``1073741824``, ``512m`` and ``10g`` are accepted."""
    try:
        return int(parse_amount("mem", s))
    except SlotError:
        raise ValueError(f"expected a size in bytes, e.g. 1073741824, 512m or 10g (got {s!r:.40})") from None


def split_list(values: Iterable[str]) -> list[str]:
    """``--project a,b --project c`` -> ["a", "b", "c"]; empty items dropped."""
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def check_slots(value: str, option: str = "--slots") -> str:
    try:
        ResourceSlots.parse(value)
    except SlotError as e:
        raise UsageError(f"{option}: {e}") from None
    return value


ASK: Any = object()
"""The value of an option that may be given without a value (``--password`` alone: ask)."""


@dataclass(frozen=True)
class Option:
    """One ``--option`` of a command.

    ``metavar`` None makes it a flag: given, it stores ``const``. Several flags may share a
    ``dest`` (``--active`` / ``--inactive``). An option with a value may be given once, or
    repeated when ``repeat`` (its value is then a list). ``value_optional``: given alone, its
    value is :data:`ASK`. ``convert`` turns the text into the value; its ValueError is a
    usage error. ``default`` is the value when the option is not given.
    """

    flag: str
    help: str
    metavar: str | None = "TEXT"
    dest: str = ""
    const: Any = True
    repeat: bool = False
    value_optional: bool = False
    convert: Callable[[str], Any] | None = None
    default: Any = None

    @property
    def key(self) -> str:
        return self.dest or self.flag.lstrip("-").replace("-", "_")

    @property
    def synopsis(self) -> str:
        if self.metavar is None:
            return self.flag
        if self.value_optional:
            return f"{self.flag} [{self.metavar}]"
        return f"{self.flag} {self.metavar}"


def flag(name: str, help: str, dest: str = "", const: Any = True) -> Option:
    return Option(name, help, metavar=None, dest=dest, const=const)


DB_URL_OPTION = Option(
    "--db-url",
    """labfleet's database, as a SQLAlchemy URL: sqlite:///PATH or postgresql://USER@HOST/DB.
    Default: $LABFLEET_DB_URL, else labfleet.sqlite in the current directory.""",
    metavar="URL",
)
DEBUG_OPTION = flag("--debug", "Print the full traceback of an unexpected error.")
HELP_ENTRY = ("-h, --help", "Show this help and exit.")
COMMON_OPTIONS = (DB_URL_OPTION, DEBUG_OPTION)
JSON_OPTION = flag("--json", "Print JSON (a list of objects) instead of a table.")
ACTIVE_OPTIONS = (
    flag("--active", "Mark it active.", const=True),
    flag("--inactive", "Mark it inactive: no new sessions start in it.", dest="active", const=False),
)


class _Once(argparse.Action):
    """Store an option's value; a second one is an error rather than silently winning."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        if getattr(namespace, self.dest, None) is not None:
            raise UsageError(f"{option_string}: given more than once")
        setattr(namespace, self.dest, values)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, raising a UsageError instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:  # documented as the method to override
        raise UsageError(message)


def _add(parser: _Parser, option: Option) -> None:
    if option.metavar is None:
        parser.add_argument(
            option.flag, dest=option.key, action="store_const", const=option.const, default=None
        )
    elif option.repeat:
        parser.add_argument(option.flag, dest=option.key, action="append", metavar=option.metavar)
    else:
        parser.add_argument(
            option.flag,
            dest=option.key,
            action=_Once,
            nargs="?" if option.value_optional else None,
            const=ASK if option.value_optional else None,
            default=None,
            metavar=option.metavar,
        )


def _convert(option: Option, value: Any) -> Any:
    if option.convert is None or value is None or value is ASK:
        return value
    try:
        if isinstance(value, list):
            return [option.convert(v) for v in value]
        return option.convert(value)
    except ValueError as e:
        raise UsageError(f"{option.flag}: {e}") from None


def _looks_like_option(arg: str) -> bool:
    return arg.startswith("-") and arg != "-" and not arg[1:2].isdigit() and arg[1:2] != "."


def _wants_help(argv: Sequence[str]) -> bool:
    for arg in argv:
        if arg == "--":
            return False
        if arg in ("-h", "--help"):
            return True
    return False


# ---------------------------------------------------------------- the Hub


def login_url() -> str:
    """Where scripts/up starts the Hub ($LABFLEET_IP, $LABFLEET_PORT), for the login hint."""
    ip = os.environ.get("LABFLEET_IP") or "127.0.0.1"
    host = "127.0.0.1" if ip in ("0.0.0.0", "*") else ip
    return f"http://{host}:{os.environ.get('LABFLEET_PORT') or 8000}/hub/login"


# ---------------------------------------------------------------- passwords


def is_tty() -> bool:
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def prompt_new_password(username: str) -> str:
    if not is_tty():
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


# ---------------------------------------------------------------- database


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL (None for another database, memory or a file: URI)."""
    from sqlalchemy.engine import make_url

    try:
        u = make_url(normalize_url(url))
    except Exception:
        return None
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    if u.database.startswith("file:"):
        return None
    return Path(u.database)


# ---------------------------------------------------------------- commands


class Command:
    """A command that does something: ``labfleet domain create NAME [options]``.

    Subclasses set ``name`` (the whole command line prefix), ``description`` (and a shorter
    ``summary`` for their group's list when the description is long), ``arguments`` (names of
    the positional arguments, all required), ``options`` and ``examples``, and define ``run``.
    """

    name: ClassVar[str] = "labfleet"
    summary: ClassVar[str] = ""
    description: ClassVar[str] = ""
    arguments: ClassVar[tuple[str, ...]] = ()
    options: ClassVar[tuple[Option, ...]] = ()
    examples: ClassVar[tuple[str, ...]] = ()

    def __init__(self, args: Sequence[str], opts: argparse.Namespace) -> None:
        self.args = list(args)
        self.opts = opts
        self.db_url: str = opts.db_url or default_db_url()

    # -- command line

    @classmethod
    def all_options(cls) -> tuple[Option, ...]:
        return (*cls.options, *COMMON_OPTIONS)

    @classmethod
    def usage(cls) -> str:
        return " ".join([cls.name, *cls.arguments, "[options]"])

    @classmethod
    def help_text(cls) -> str:
        options = [*((o.synopsis, o.help) for o in cls.all_options()), HELP_ENTRY]
        return "\n".join(
            [
                f"Usage: {cls.usage()}",
                "",
                help_paragraph(cls.description),
                "",
                *help_entries(
                    "Options (before or after the arguments)" if cls.arguments else "Options", options
                ),
                *help_examples(cls.examples),
            ]
        )

    @classmethod
    def parse(cls, argv: Sequence[str], given: Mapping[str, Any]) -> Command:
        """The command for ``argv`` (what follows its name); ``given``: options named before it."""
        parser = _Parser(prog=cls.name, add_help=False, allow_abbrev=False)
        parser.add_argument("arguments", nargs="*")
        options = cls.all_options()
        for option in options:
            _add(parser, option)
        opts, unknown = parser.parse_known_intermixed_args(list(argv))
        for arg in unknown:
            if _looks_like_option(arg):
                raise UsageError(f"unknown option {arg.partition('=')[0]}")
        args = opts.arguments + unknown
        del opts.arguments
        for option in options:
            value = _convert(option, getattr(opts, option.key))
            if value is None:
                value = given.get(option.key, option.default)
            setattr(opts, option.key, value)
        want, got = len(cls.arguments), len(args)
        if got < want:
            missing = " ".join(cls.arguments[got:])
            raise UsageError(f"{cls.name}: missing {missing} (usage: {cls.usage()})")
        if got > want:
            extra = " ".join(args[want:])
            raise UsageError(f"{cls.name}: unexpected argument(s) {extra!r} (usage: {cls.usage()})")
        return cls(args, opts)

    def run(self) -> None:  # pragma: no cover - every command overrides it
        raise NotImplementedError

    # -- database

    @property
    def actor(self) -> Actor:
        return Actor.cli()

    def open_engine(self, *, require_current: bool = True) -> Engine:
        """An engine on the database, which must exist and (by default) be at the current schema."""
        from labfleet.core import bootstrap, database

        path = sqlite_file(self.db_url)
        if path is not None and not path.exists():
            # Do not leave an empty database file behind just by asking.
            raise CliError(f"no labfleet database at {path}: run `labfleet init` first (or give --db-url)")
        engine = database.make_engine(self.db_url)
        if require_current:
            current, head = bootstrap.schema_revisions(engine)
            if current is None:
                engine.dispose()
                raise CliError(
                    f"the database {shown_url(engine)} is not initialized: run `labfleet init` first"
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
        from labfleet.core import database, unitofwork

        own = engine is None
        engine = engine or self.open_engine()
        try:
            with database.session_scope(unitofwork.make_session_factory(engine)) as db:
                return work(db)
        finally:
            if own:
                engine.dispose()

    # -- output

    def out(self, text: str = "") -> None:
        print(text)

    def nothing_to_change(self, options: str) -> UsageError:
        return UsageError(f"{self.name}: nothing to change ({options})")


class ListCommand(Command):
    """A command that lists things: a table, or JSON with ``--json``."""

    @classmethod
    def all_options(cls) -> tuple[Option, ...]:
        return (*cls.options, JSON_OPTION, *COMMON_OPTIONS)

    def emit(
        self, views: list[dict[str, Any]], headers: list[str], row: Callable[[dict[str, Any]], list[Any]]
    ) -> None:
        if self.opts.json:
            self.out(json_text(views))
        else:
            self.out(format_table(headers, (row(v) for v in views)))


@dataclass(frozen=True)
class Group:
    """A command made of commands: ``labfleet domain``, or ``labfleet`` itself."""

    name: str
    description: str
    commands: Mapping[str, type[Command] | Group]
    summary: str = ""
    examples: tuple[str, ...] = ()
    version: Callable[[], str] | None = None  # the top level: --version prints what it returns

    def usage(self) -> str:
        return f"{self.name} COMMAND [options]"

    def help_text(self) -> str:
        commands = [(name, c.summary or c.description) for name, c in self.commands.items()]
        options = [(o.synopsis, o.help) for o in COMMON_OPTIONS]
        if self.version is not None:
            options.append(("--version", "Print labfleet's version and exit."))
        options.append(HELP_ENTRY)
        return "\n".join(
            [
                f"Usage: {self.usage()}",
                "",
                help_paragraph(self.description),
                "",
                *help_entries("Commands", commands),
                "",
                *help_entries("Options", options),
                "",
                f"Run `{self.name} COMMAND --help` for the arguments and options of a command.",
                *help_examples(self.examples),
            ]
        )


def dispatch(root: Group, argv: Sequence[str]) -> None:
    """Find the command ``argv`` names, parse its options and run it (or print help)."""
    rest = list(argv)
    given: dict[str, Any] = {}
    node: type[Command] | Group = root
    while isinstance(node, Group):
        if not rest:
            names = ", ".join(node.commands)
            raise UsageError(f"{node.name}: missing command, one of: {names} (see {node.name} --help)")
        arg = rest.pop(0)
        if arg in ("-h", "--help"):
            print(node.help_text())
            return
        if arg == "--version" and node.version is not None:
            print(node.version())
            return
        if arg == "help":  # `labfleet help user create` is `labfleet user create --help`
            rest.append("--help")
            continue
        if arg.startswith("-"):
            # --db-url and --debug may come before the command: `labfleet --db-url URL domain list`
            key, eq, value = arg.partition("=")
            if key == DB_URL_OPTION.flag:
                if not eq:
                    if not rest:
                        raise UsageError(f"{key} needs a value")
                    value = rest.pop(0)
                given[DB_URL_OPTION.key] = value
            elif arg == DEBUG_OPTION.flag:
                given[DEBUG_OPTION.key] = True
            else:
                raise UsageError(f"unknown option {arg} (give command options after the command)")
            continue
        sub = node.commands.get(arg)
        if sub is None:
            names = ", ".join(node.commands)
            raise UsageError(f"{node.name}: unknown command {arg!r}; commands: {names}")
        node = sub
    if _wants_help(rest):
        print(node.help_text())
        return
    node.parse(rest, given).run()
