"""The ``labfleet`` command (``labfleet.cli``), run the way a shell runs it.

Each test has its own SQLite database and secret key file in its tmp dir.  A database
initialized with a few tenants is made once per module and copied into each test's dir, so
only the tests about ``init`` and ``demo`` pay for creating one.

Commands run in this process (``Cli.run``): ``main(argv)`` with the environment, working
directory, stdin (not a terminal), stdout, stderr, logging, warnings, signal handlers and argv of
a process of their own, its exit status from ``SystemExit``, and after it everything it leaves
behind undone (its database engines disposed, traitlets singletons, logging, the environment and
the rest as they were), so no command sees another's state.  A new Python process costs ~0.5 s a
command; this costs what the command does.  ``test_the_real_command`` and the terminal test run
the real ``python -m labfleet.cli`` as a subprocess, and check that it answers as ``Cli.run``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import traceback
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from labfleet.core.passwords import verify_password

REPO = Path(__file__).resolve().parents[1]
LOGIN_URL = "http://127.0.0.1:8000/hub/login"
DB_FILE = "labfleet.sqlite"
KEY_FILE = "labfleet_secret.key"
ENTRY_POINT = [sys.executable, "-m", "labfleet.cli"]


class Cli:
    """Runs ``labfleet`` against the database and key file in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.db = directory / DB_FILE
        self.key = directory / KEY_FILE
        env = {k: v for k, v in os.environ.items() if not k.startswith("LABFLEET_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env["LABFLEET_DB_URL"] = f"sqlite:///{self.db}"
        env["LABFLEET_SECRET_KEY_FILE"] = str(self.key)
        self.env = env

    def run(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """``labfleet ARGS``, in this process as in a process of its own (see the module's doc)."""
        return run_in_process(list(args), env or self.env, self.dir)

    def run_process(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """``labfleet ARGS`` as a new process: the real entry point, ``python -m labfleet.cli``."""
        return subprocess.run(
            [*ENTRY_POINT, *args],
            cwd=self.dir,
            env=env or self.env,
            stdin=subprocess.DEVNULL,  # not a TTY: nothing may prompt
            capture_output=True,
            text=True,
            timeout=120,
        )

    def run_many(self, commands: list[list[str]]) -> list[subprocess.CompletedProcess]:
        """Run independent commands, one after the other."""
        return [self.run(*args) for args in commands]

    def __call__(self, *args: str) -> str:
        p = self.run(*args)
        assert p.returncode == 0, f"labfleet {' '.join(args)} failed ({p.returncode}): {p.stderr}"
        return p.stdout

    def json(self, *args: str):
        return json.loads(self(*args, "--json"))

    def fails(self, *args: str, code: int | None = None) -> str:
        """Run a command that must fail with one error line; return that line."""
        p = self.run(*args)
        assert p.returncode != 0, f"labfleet {' '.join(args)} should fail: {p.stdout}"
        if code is not None:
            assert p.returncode == code, (
                f"labfleet {' '.join(args)}: exit {p.returncode}, want {code}: {p.stderr}"
            )
        lines = p.stderr.splitlines()
        assert len(lines) == 1, f"labfleet {' '.join(args)}: want one error line, got {p.stderr!r}"
        assert lines[0].startswith("labfleet: error: "), lines[0]
        return lines[0]

    def dump(self) -> list[str]:
        """Every row of every table (audit log included), read directly from the file."""
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        try:
            return list(conn.iterdump())
        finally:
            conn.close()

    def snapshot(self) -> dict:
        """What ``list --json`` shows of everything, and every row of every table."""
        snap = {what: self.json(what, "list") for what in ("domain", "project", "user")}
        snap["dump"] = self.dump()
        return snap

    def sql(self, query: str, *params) -> list[tuple]:
        """Read the database file directly (never to write: the CLI is the only writer here)."""
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        try:
            return conn.execute(query, params).fetchall()
        finally:
            conn.close()

    def password_hash(self, username: str) -> str | None:
        rows = self.sql("SELECT password_hash FROM users WHERE username = ?", username)
        return rows[0][0] if rows else None


# ---------------------------------------------------------------- in this process, as a process

_ONE_AT_A_TIME = threading.Lock()  # a command owns the process's environment, directory and streams

# The warning filters of a Python started without -W or PYTHONWARNINGS, the first that matches wins.
_PYTHON_WARNING_FILTERS = (
    ("default", DeprecationWarning, "__main__"),
    ("ignore", DeprecationWarning, ""),
    ("ignore", PendingDeprecationWarning, ""),
    ("ignore", ImportWarning, ""),
    ("ignore", ResourceWarning, ""),
)


def run_in_process(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    """``python -m labfleet.cli ARGS`` with ``env`` in ``cwd``, stdin not a terminal, run here."""
    from labfleet.cli import main

    # A process's stdout and stderr, when pipes: UTF-8 text over bytes (stderr never fails to encode).
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace", write_through=True)
    with _ONE_AT_A_TIME, _as_its_own_process(args, env, cwd, out, err):
        try:
            main(args)
            code = 0
        except SystemExit as e:  # as the interpreter turns it into an exit status
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code & 0xFF
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except Exception:  # uncaught: the traceback on stderr, exit status 1
            traceback.print_exc()
            code = 1
    return subprocess.CompletedProcess([*ENTRY_POINT, *args], code, _read(out), _read(err))


def _read(pipe: io.TextIOWrapper) -> str:
    """What ``subprocess.run(text=True)`` reads from a pipe: decoded, with universal newlines."""
    return pipe.buffer.getvalue().decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


@contextlib.contextmanager
def _as_its_own_process(
    args: Sequence[str], env: dict[str, str], cwd: Path, out: io.TextIOWrapper, err: io.TextIOWrapper
) -> Iterator[None]:
    """What a command sees of its process is its own while it runs, and left as it was after."""
    import labfleet.cli
    from labfleet.core import database

    engines = []
    make_engine = database.make_engine

    def make_and_keep_engine(*a, **kw):
        engine = make_engine(*a, **kw)
        engines.append(engine)
        return engine

    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_streams = sys.stdin, sys.stdout, sys.stderr
    saved_argv = sys.argv
    saved_umask = os.umask(0)
    os.umask(saved_umask)
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    saved_logging = _logging_state()
    singletons = _traitlets_singletons()
    stdin = open(os.devnull)
    try:
        with warnings.catch_warnings():
            warnings.resetwarnings()
            for action, category, module in reversed(_PYTHON_WARNING_FILTERS):  # each goes first
                warnings.filterwarnings(action, category=category, module=module)
            warnings.showwarning = _show_warning_on_stderr
            os.environ.clear()
            os.environ.update(env)
            os.chdir(cwd)
            sys.stdin, sys.stdout, sys.stderr = stdin, out, err
            sys.argv = [str(Path(labfleet.cli.__file__).with_name("__main__.py")), *args]  # as with -m
            database.make_engine = make_and_keep_engine
            yield
    finally:
        database.make_engine = make_engine
        for engine in engines:  # as the process's exit would: every connection closed
            engine.dispose()
        for cls, instance in _traitlets_singletons().items():
            if instance is not singletons.get(cls):
                cls._instance = singletons.get(cls)
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        stdin.close()
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        os.umask(saved_umask)
        for s, handler in saved_signals.items():
            if signal.getsignal(s) is not handler:
                signal.signal(s, handler)
        _restore_logging(saved_logging)


def _show_warning_on_stderr(message, category, filename, lineno, file=None, line=None) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def _traitlets_singletons() -> dict[type, object]:
    """Each traitlets singleton class that holds an instance now, with it (none: traitlets not loaded)."""
    configurable = sys.modules.get("traitlets.config.configurable")
    if configurable is None:
        return {}
    held, todo = {}, [configurable.SingletonConfigurable]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__dict__.get("_instance") is not None:
            held[cls] = cls.__dict__["_instance"]
    return held


def _loggers() -> list[logging.Logger]:
    return [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]


def _logging_state() -> tuple[int, dict]:
    """The level logging is disabled at, and each logger's handlers, level, propagate and disabled."""
    return logging.root.manager.disable, {
        lg: (list(lg.handlers), lg.level, lg.propagate, lg.disabled) for lg in _loggers()
    }


def _restore_logging(saved: tuple[int, dict]) -> None:
    """Logging as it was: what a command configured is undone (a new logger: as a new one is)."""
    disable, loggers = saved
    if logging.root.manager.disable != disable:
        logging.disable(disable)
    for lg in _loggers():
        state = loggers.get(lg, ([], logging.NOTSET, True, False))
        if (lg.handlers, lg.level, lg.propagate, lg.disabled) == state:
            continue
        handlers, level, propagate, disabled = state
        for handler in lg.handlers:
            if handler not in handlers:
                handler.close()
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate, lg.disabled = propagate, disabled


def _generated_password(output: str) -> str:
    m = re.search(r"password: (\S+)\n\s+\(generated", output)
    assert m, output
    return m.group(1)


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """Made once: init, domain acme (cpu=8), project acme/vision, user alice (no password) in it."""
    d = tmp_path_factory.mktemp("cli-template")
    cli = Cli(d)
    cli("init")
    cli("domain", "create", "acme", "--slots", "cpu=8")
    cli("project", "create", "acme/vision")
    cli("user", "create", "alice", "--domain", "acme", "--project", "acme/vision", "--no-password")
    return d


@pytest.fixture
def cli(tmp_path, template) -> Cli:
    for f in template.iterdir():
        if f.name.startswith(DB_FILE) or f.name == KEY_FILE:
            shutil.copy2(f, tmp_path / f.name)
    return Cli(tmp_path)


@pytest.fixture
def fresh(tmp_path) -> Cli:
    return Cli(tmp_path)


def _by(items: list[dict], key: str) -> dict[str, dict]:
    return {item[key]: item for item in items}


# ---------------------------------------------------------------- init


def test_uninitialized_database_says_run_init(fresh):
    line = fresh.fails("domain", "list", code=1)
    assert "labfleet init" in line
    assert not fresh.db.exists(), "asking must not create a database file"


def test_init_creates_everything_and_is_idempotent(fresh):
    out = fresh("init")
    assert LOGIN_URL in out
    assert "user:     admin" in out
    password = _generated_password(out)
    assert len(password) >= 16
    assert stat.S_IMODE(fresh.key.stat().st_mode) == 0o600
    assert verify_password(password, fresh.password_hash("admin"))
    users = fresh.json("user", "list")
    assert [(u["username"], u["role"], u["domain"]) for u in users] == [("admin", "superadmin", "default")]
    assert fresh.sql("SELECT name, default_for_unspecified FROM keypair_resource_policies") == [
        ("default", "UNLIMITED")
    ]
    key, dump = fresh.key.read_bytes(), fresh.dump()

    again = fresh("init")
    assert "already exists" in again and "left unchanged" in again
    assert password not in again
    assert fresh.dump() == dump  # nothing changed, the admin's password hash included
    assert fresh.key.read_bytes() == key


def test_init_with_given_password_never_prints_it(fresh):
    out = fresh(
        "init", "--admin-user", "root", "--admin-domain", "ops", "--admin-password", "correct-horse-1"
    )
    assert "correct-horse-1" not in out
    assert "user:     root" in out
    assert verify_password("correct-horse-1", fresh.password_hash("root"))
    assert fresh.sql("SELECT name FROM domains") == [("ops",)]


# ---------------------------------------------------------------- domains


def test_domain_commands(cli):
    out = cli(
        "domain", "create", "beta", "--slots", "cpu=8,mem=32g,gpu=1,gpu.shares=2.5", "--description", "Beta"
    )
    assert "beta" in out
    beta = _by(cli.json("domain", "list"), "name")["beta"]
    assert beta["total_resource_slots"] == {"cpu": 8, "mem": 32 * 2**30, "gpu": 1, "gpu.shares": 2.5}
    assert beta["description"] == "Beta" and beta["is_active"] is True

    table = cli("domain", "list").splitlines()
    assert table[0].split() == ["NAME", "ACTIVE", "SLOTS", "PROJECTS", "DESCRIPTION"]
    assert table[1].split()[:4] == ["acme", "yes", "cpu=8", "vision"]
    assert table[2].split() == ["beta", "yes", "cpu=8,gpu=1,gpu.shares=2.5,mem=32g", "-", "Beta"]

    # options may come before the argument, and the database may be named before the command
    cli("--db-url", f"sqlite:///{cli.db}", "domain", "update", "--inactive", "beta", "--slots", "cpu=16")
    beta = _by(cli.json("domain", "list"), "name")["beta"]
    assert beta["total_resource_slots"] == {"cpu": 16} and beta["is_active"] is False

    cli("domain", "delete", "beta")
    assert [d["name"] for d in cli.json("domain", "list")] == ["acme", "default"]


# ---------------------------------------------------------------- projects


def test_project_commands(cli):
    cli("project", "create", "acme/nlp", "--slots", "gpu.shares=1.5", "--description", "NLP team")
    cli("policy", "create", "project", "big", "--max-quota-scope-size", "1t")
    cli("project", "add-member", "acme/nlp", "alice")
    projects = _by(cli.json("project", "list", "--domain", "acme"), "full_name")
    assert set(projects) == {"acme/vision", "acme/nlp"}
    assert projects["acme/nlp"]["members"] == ["alice"]
    assert projects["acme/nlp"]["total_resource_slots"] == {"gpu.shares": 1.5}
    assert projects["acme/nlp"]["description"] == "NLP team"

    cli("project", "update", "acme/nlp", "--slots", "gpu=1", "--policy", "big", "--inactive")
    cli("project", "remove-member", "acme/nlp", "alice")
    nlp = _by(cli.json("project", "list"), "full_name")["acme/nlp"]
    assert nlp["total_resource_slots"] == {"gpu": 1}
    assert nlp["resource_policy"] == "big" and nlp["is_active"] is False
    assert nlp["members"] == []

    cli("project", "delete", "acme/nlp")
    table = cli("project", "list").splitlines()
    assert table[0].split()[:3] == ["PROJECT", "ACTIVE", "SLOTS"]
    assert [line.split()[0] for line in table[1:]] == ["acme/vision"]


# ---------------------------------------------------------------- users


def test_user_commands(cli):
    cli("project", "create", "acme/nlp")
    out = cli(
        "user", "create", "anna", "--domain", "acme", "--project", "acme/vision", "--project", "acme/nlp",
        "--email", "anna@acme.test", "--full-name", "Anna A", "--password", "anna-password-1",
    )  # fmt: skip
    assert "anna-password-1" not in out
    assert verify_password("anna-password-1", cli.password_hash("anna"))
    cli("user", "create", "bob", "--domain", "acme", "--role", "admin", "--no-password")

    users = _by(cli.json("user", "list", "--domain", "acme"), "username")
    assert set(users) == {"alice", "anna", "bob"}
    assert users["anna"]["projects"] == ["acme/nlp", "acme/vision"]
    assert users["anna"]["email"] == "anna@acme.test" and users["anna"]["full_name"] == "Anna A"
    assert users["bob"]["role"] == "admin" and users["bob"]["has_password"] is False
    table = cli("user", "list")
    assert table.splitlines()[0].split()[:4] == ["USER", "DOMAIN", "ROLE", "STATUS"]
    assert "anna-password-1" not in table and "pbkdf2" not in table

    # --project replaces the whole list
    cli("user", "update", "anna", "--project", "acme/nlp", "--role", "monitor", "--email", "a@acme.test")
    cli("user", "deactivate", "anna")
    anna = _by(cli.json("user", "list"), "username")["anna"]
    assert anna["projects"] == ["acme/nlp"] and anna["role"] == "monitor" and anna["email"] == "a@acme.test"
    assert anna["status"] == "inactive"
    cli("user", "update", "anna", "--activate")
    assert _by(cli.json("user", "list"), "username")["anna"]["status"] == "active"


def test_user_passwd_sets_a_new_password_and_audits_it(cli):
    old_hash = cli.password_hash("admin")
    out = cli("user", "passwd", "admin", "--password", "new-admin-password-1")
    assert "Set a new password for admin." in out and "new-admin-password-1" not in out
    # The service's password login checks the hash with verify_password: the new one gets in.
    assert verify_password("new-admin-password-1", cli.password_hash("admin"))
    assert cli.password_hash("admin") != old_hash
    # Audited like every CLI write, without the password.
    (actor, target, details), *_ = cli.sql(
        "SELECT actor, target, details FROM audit_log WHERE action = 'user.update' ORDER BY id DESC"
    )
    assert (actor, target, json.loads(details)) == ("cli", "admin", {"password": "***"})
    assert not any("new-admin-password-1" in row for row in cli.dump())
    # stdin is not a terminal and no password is given: one is generated and printed once.
    out = cli("user", "passwd", "alice")
    generated = _generated_password(out)
    assert len(generated) >= 16 and verify_password(generated, cli.password_hash("alice"))
    assert verify_password("new-admin-password-1", cli.password_hash("admin"))  # the others unchanged
    # An unknown user: one line, exit 1, nothing written.
    before = cli.dump()
    line = cli.fails("user", "passwd", "nobody", code=1)
    assert line == "labfleet: error: no user 'nobody'"
    assert cli.dump() == before
    assert "labfleet user passwd NAME" in cli("user", "passwd", "--help")


def test_user_passwd_asks_on_a_terminal(cli):
    """On a terminal the password is asked for twice (not echoed, not printed)."""
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "labfleet.cli", "user", "passwd", "alice"],
        cwd=cli.dir,
        env=cli.env,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,  # the pty becomes its terminal (getpass reads /dev/tty)
    )
    os.close(slave)
    seen = b""
    try:
        for prompt in (b"New password for alice: ", b"Repeat the password: "):
            while prompt not in seen:
                chunk = os.read(master, 1024)
                assert chunk, seen
                seen += chunk
            os.write(master, b"typed-password-1\n")
        assert proc.wait(60) == 0, seen
        while True:
            try:
                chunk = os.read(master, 1024)
            except OSError:  # EIO: the process is gone
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert b"Set a new password for alice." in seen and b"typed-password-1" not in seen
    assert verify_password("typed-password-1", cli.password_hash("alice"))


# ---------------------------------------------------------------- policies


def test_policy_commands(cli):
    cli(
        "policy", "create", "keypair", "students", "--slots", "cpu=4,mem=16g,gpu.shares=0.5",
        "--default-for-unspecified", "LIMITED", "--max-concurrent-sessions", "2", "--max-pending-sessions", "1",
        "--max-session-lifetime", "1d", "--idle-timeout", "30m", "--allowed-storage-hosts", "local,nfs",
    )  # fmt: skip
    cli("policy", "create", "user", "standard", "--max-vfolder-count", "10", "--max-quota-scope-size", "10g")
    cli("policy", "create", "project", "team", "--max-vfolder-count", "5")

    kp = _by(cli.json("policy", "list", "keypair"), "name")
    assert set(kp) == {"default", "students"}
    assert kp["students"] == {
        "name": "students",
        "total_resource_slots": {"cpu": 4, "mem": 16 * 2**30, "gpu.shares": 0.5},
        "default_for_unspecified": "LIMITED",
        "max_concurrent_sessions": 2,
        "max_pending_sessions": 1,
        "max_session_lifetime": 86400,
        "idle_timeout": 1800,
        "allowed_storage_hosts": ["local", "nfs"],
    }
    table = cli("policy", "list", "user").splitlines()
    assert table[0].split() == ["NAME", "VFOLDERS", "QUOTA", "FOLDER-SIZE"]
    assert table[1].split() == ["standard", "10", "10g", "unlimited"]

    cli("policy", "update", "keypair", "students", "--max-concurrent-sessions", "3", "--idle-timeout", "-1")
    cli("policy", "delete", "project", "team")
    students = _by(cli.json("policy", "list", "keypair"), "name")["students"]
    assert students["max_concurrent_sessions"] == 3 and students["idle_timeout"] == -1
    assert cli.sql("SELECT name FROM project_resource_policies") == []
    assert "cannot be deleted" in cli.fails("policy", "delete", "keypair", "default", code=1)
    # Model serving's limits are a user policy's
    cli("policy", "update", "user", "standard", "--max-endpoints", "2", "--max-replicas-per-endpoint", "4")
    standard = _by(cli.json("policy", "list", "user"), "name")["standard"]
    assert (standard["max_endpoints"], standard["max_replicas_per_endpoint"]) == (2, 4)
    refused = cli.fails("policy", "create", "project", "p2", "--max-endpoints", "1")
    assert "--max-endpoints: only for user policies, not project policies" in refused
    assert cli.sql("SELECT name FROM project_resource_policies WHERE name = 'p2'") == []


# ---------------------------------------------------------------- keypairs


def test_keypair_secret_is_shown_once_and_stored_encrypted(cli):
    cli("policy", "create", "keypair", "small", "--slots", "cpu=2")
    out = cli("keypair", "issue", "alice", "--policy", "small", "--rate-limit", "100")
    access = re.search(r"access key: (AK[A-Z0-9]{18})\b", out).group(1)
    secret = re.search(r"secret key: ([A-Za-z0-9]{40})\b", out).group(1)
    assert out.count(secret) == 1

    listed = cli.json("keypair", "list", "--user", "alice")
    assert {k["access_key"]: k["resource_policy"] for k in listed if not k["is_main"]} == {access: "small"}
    assert all("secret_key" not in k for k in listed)
    assert secret not in json.dumps(listed)
    table = cli("keypair", "list")
    assert access in table and secret not in table

    for f in cli.dir.iterdir():
        if f.name.startswith(DB_FILE):
            assert secret.encode() not in f.read_bytes(), f"secret stored in plain text in {f.name}"

    cli("keypair", "update", access, "--rate-limit", "5")
    cli("keypair", "revoke", access)
    assert cli.sql("SELECT is_active, rate_limit FROM keypairs WHERE access_key = ?", access) == [(0, 5)]
    (main,) = [k["access_key"] for k in listed if k["is_main"]]
    assert "main keypair" in cli.fails("keypair", "revoke", main, code=1)


# ---------------------------------------------------------------- demo


def test_demo_seeds_once_and_then_leaves_everything_as_is(fresh):
    out = fresh("demo")
    assert "demo-password-1" in out and LOGIN_URL in out
    _generated_password(out)  # the DB was not initialized: init ran first and told the admin's password
    logins = {line.split()[0] for line in out.splitlines() if "demo-password-1" in line}
    assert logins == {"alice", "bob", "carol", "mona"}

    snap = fresh.snapshot()
    demo = _by(snap["domain"], "name")["demo"]
    assert demo["total_resource_slots"] == {"cpu": 32, "mem": 128 * 2**30, "gpu": 2, "gpu.shares": 2}
    projects = _by(snap["project"], "full_name")
    assert projects["demo/ml-team"]["total_resource_slots"] == {"gpu.shares": 1.5}
    assert projects["demo/research"]["total_resource_slots"] == {"gpu.shares": 1}
    users = _by(snap["user"], "username")
    assert users["alice"]["projects"] == ["demo/ml-team", "demo/research"]
    assert users["bob"]["projects"] == ["demo/ml-team"]
    assert users["carol"]["role"] == "admin" and users["carol"]["domain"] == "demo"
    assert users["mona"]["role"] == "monitor"
    assert verify_password("demo-password-1", fresh.password_hash("bob"))

    again = fresh("demo")
    assert "existed" in again and "created" not in again
    assert "demo-password-1" in again
    assert fresh.snapshot() == snap


# ---------------------------------------------------------------- bad input

BAD = [
    # (arguments, exit status, a piece of the message); the template has acme, acme/vision, alice
    (["domain", "create", "acme"], 1, "already exists"),
    (["project", "create", "nope/x"], 1, "no domain 'nope'"),
    (["user", "create", "zed", "--domain", "nope", "--no-password"], 1, "no domain 'nope'"),
    (["domain", "create", "x", "--slots", "cpu=1,mem=12zz"], 2, "12zz"),
    (["user", "create", "zed", "--domain", "acme", "--role", "boss", "--no-password"], 2, "role"),
    (
        ["user", "create", "zed", "--domain", "acme", "--project", "acme/nope", "--no-password"],
        2,
        "acme/nope",
    ),
    (["user", "create", "zed", "--domain", "acme"], 2, "--no-password"),
    (["frobnicate"], 2, "unknown command 'frobnicate'"),
    (["domain", "frobnicate"], 2, "unknown command 'frobnicate'"),
    (["domain"], 2, "missing command"),
    (["domain", "create"], 2, "missing NAME"),
    (["project", "add-member", "acme/vision"], 2, "missing USER"),
    (["domain", "create", "a", "b"], 2, "unexpected argument"),
    (["domain", "create", "x", "--bogus", "1"], 2, "unknown option --bogus"),
    (["domain", "create", "x", "--slots"], 2, "--slots"),
    (["domain", "create", "Bad_Name"], 2, "domain name"),
    (["project", "create", "acme"], 2, "DOMAIN/PROJECT"),
    (["policy", "create", "keypair", "p", "--max-concurrent-sessions", "abc"], 2, "whole number"),
    (["policy", "create", "user", "p", "--slots", "cpu=1"], 2, "only for keypair"),
    (["domain", "delete", "acme"], 1, "still has"),
    (["keypair", "revoke", "AKNOPE"], 1, "no keypair"),
    (["init", "--admin-password", "short"], 2, "at least 8"),
    (["user", "passwd", "nobody", "--password", "long-enough-1"], 1, "no user 'nobody'"),
    (["user", "passwd", "nobody"], 1, "no user 'nobody'"),
    (["user", "passwd", "admin", "--password", "short"], 2, "at least 8"),
    (["user", "passwd", "admin", "--password"], 2, "not a terminal"),
    (["user", "passwd"], 2, "missing NAME"),
]


def test_bad_input_gives_one_error_line_and_changes_nothing(cli):
    before = cli.snapshot()
    problems = []
    # None of them may write; the snapshot catches any that did.
    for (args, code, piece), p in zip(BAD, cli.run_many([args for args, _, _ in BAD]), strict=True):
        lines = p.stderr.splitlines()
        if (
            p.returncode != code
            or len(lines) != 1
            or not lines[0].startswith("labfleet: error: ")
            or piece not in lines[0]
        ):
            problems.append(
                f"labfleet {' '.join(args)}: exit {p.returncode} (want {code}), stderr {p.stderr!r}"
            )
    assert not problems, "\n".join(problems)
    assert cli.snapshot() == before


def test_help_and_version(cli):
    p = cli.run("--help")
    assert p.returncode == 0
    for command in ("init", "domain", "project", "user", "policy", "keypair", "demo"):
        assert f"\n{command}\n" in p.stdout
    out = cli("domain", "create", "--help")
    assert "Usage: labfleet domain create NAME" in out and "--slots" in out
    assert cli("help", "user", "create").startswith("Usage: labfleet user create NAME")
    assert re.match(r"^\d+\.\d+", cli("--version"))


# ---------------------------------------------------------------- the real command

REAL = [
    # (arguments, exit status): what the real command answers, and Cli.run the same
    (["--version"], 0),
    (["domain", "list", "--json"], 0),
    (["domain", "create", "acme"], 1),  # refused: it exists
    (["frobnicate"], 2),  # bad usage
    (["user", "passwd", "alice", "--password"], 2),  # it would ask: stdin is no terminal
    (["user", "create", "zed", "--domain", "acme"], 2),  # no password given, none to ask on
]


def test_the_real_command(cli, tmp_path):
    """``python -m labfleet.cli`` as a process of its own (stdin not a terminal): its exit statuses,
    its one error line, no prompt; and ``Cli.run`` answers each exactly as it does."""
    (tmp_path / "none").mkdir()
    fresh = Cli(tmp_path / "none")
    before = cli.dump()
    with ThreadPoolExecutor(max_workers=8) as pool:  # none of them writes: side by side
        uninitialized = pool.submit(fresh.run_process, "domain", "list")
        real = list(pool.map(lambda command: cli.run_process(*command[0]), REAL))
    problems = []
    for (args, code), p in zip(REAL, real, strict=True):
        lines = p.stderr.splitlines()
        if p.returncode != code or (
            code and (len(lines) != 1 or not lines[0].startswith("labfleet: error: "))
        ):
            problems.append(
                f"labfleet {' '.join(args)}: exit {p.returncode} (want {code}), stderr {p.stderr!r}"
            )
        here = cli.run(*args)
        if (here.returncode, here.stdout, here.stderr) != (p.returncode, p.stdout, p.stderr):
            problems.append(f"labfleet {' '.join(args)}: in this process {here}, as a process {p}")
    assert not problems, "\n".join(problems)
    assert re.match(r"^\d+\.\d+", real[0].stdout) and json.loads(real[1].stdout)
    assert cli.dump() == before
    # No database: one line saying what to do, exit 1, and no file made by asking.
    p = uninitialized.result()
    assert p.returncode == 1 and "labfleet init" in p.stderr and len(p.stderr.splitlines()) == 1, p
    assert not fresh.db.exists()


# ---------------------------------------------------------------- images


def test_image_commands(cli):
    out = cli(
        "image",
        "register",
        "repo/torch:2.5",
        "--display-name",
        "Torch",
        "--min",
        "cpu=1,mem=2g",
        "--accelerators",
        "cuda",
        "--ports",
        "tensorboard:http:6006",
        "--projects",
        "acme/vision",
    )
    assert "Registered image repo/torch:2.5 (Torch)" in out
    (img,) = cli.json("image", "list")
    assert img["min_resource_slots"] == {"cpu": 1, "mem": 2 * 2**30}
    assert img["service_ports"] == [{"name": "tensorboard", "protocol": "http", "port": 6006}]
    assert img["projects"] == ["acme/vision"] and img["accelerators"] == ["cuda"]
    # Bad input: one line, non-zero, nothing registered.
    assert "not a valid image reference" in cli.fails("image", "register", "bad image")
    assert "name:protocol:port" in cli.fails("image", "register", "repo/x:1", "--ports", "tb:ftp:1")
    assert "unknown accelerator" in cli.fails("image", "register", "repo/x:1", "--accelerators", "tpu")
    assert "no project acme/nope" in cli.fails("image", "register", "repo/x:1", "--projects", "acme/nope")
    assert "already registered" in cli.fails("image", "register", "repo/torch:2.5")
    assert [i["name"] for i in cli.json("image", "list")] == ["repo/torch:2.5"]
    cli("image", "remove", "repo/torch:2.5")
    assert cli.json("image", "list") == []
    assert "no image" in cli.fails("image", "remove", "repo/torch:2.5")


def test_storage_host_commands(cli, tmp_path):
    root = tmp_path / "nfs"
    out = cli(
        "storage-host", "add", "nfs", "--path", str(root), "--capacity", "1g", "--rights", "mount-in-session"
    )
    assert "Added storage host nfs" in out and root.is_dir()
    (host,) = cli.json("storage-host", "list")
    assert host["capacity"] == 2**30 and host["default_permissions"] == ["mount-in-session"]
    # Bad input: one line, non-zero, nothing added.
    assert "--path is required" in cli.fails("storage-host", "add", "x")
    assert "absolute" in cli.fails("storage-host", "add", "x", "--path", "relative/dir")
    assert "unknown right" in cli.fails(
        "storage-host", "add", "x", "--path", str(tmp_path / "x"), "--rights", "fly"
    )
    assert "already exists" in cli.fails("storage-host", "add", "nfs", "--path", str(root))
    assert [h["name"] for h in cli.json("storage-host", "list")] == ["nfs"]
    # A user policy's per-folder limit.
    cli("policy", "create", "user", "small", "--max-vfolder-size", "2g")
    (pol,) = [p for p in cli.json("policy", "list", "user") if p["name"] == "small"]
    assert pol["max_vfolder_size"] == 2 * 2**30
    cli("storage-host", "remove", "nfs")
    assert cli.json("storage-host", "list") == []
    assert "no storage host" in cli.fails("storage-host", "remove", "nfs")
