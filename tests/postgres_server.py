"""A real, throwaway PostgreSQL server for the test suite.

Use from a conftest (``pytest_plugins = ["tests.postgres_server"]``) or import the fixture into a test module
(``from tests.postgres_server import postgres_url  # noqa: F401``).

``postgres_url`` (session scope) starts one server per test session from the Debian server binaries under
``/usr/lib/postgresql/<version>/bin`` (newest version): a temporary data directory, trust authentication on
127.0.0.1 only, a free TCP port, the unix socket inside the temporary directory. It yields a SQLAlchemy URL
``postgresql+psycopg://postgres@127.0.0.1:PORT/labfleet_test`` and stops the server and removes the directory
at the end of the session. ``fresh_database(url, name)`` gives a test its own empty database on that server.

PostgreSQL refuses to run as root: when the tests run as root, the server runs as the ``postgres`` system
user (``runuser -u postgres --``); otherwise as the current user.

Environment:
  LABFLEET_PG_BINDIR           use the server binaries in this directory
  LABFLEET_TEST_POSTGRES_URL   use this already running server instead of starting one (a SQLAlchemy URL of
                               a superuser; the fixture creates ``labfleet_test`` on it)

If the binaries are missing the fixture fails (never skips): run ``bash scripts/setup.sh --test``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = [
    "PostgresServer",
    "PostgresServerError",
    "find_pg_bindir",
    "fresh_database",
    "postgres_url",
    "running_postgres",
]

SETUP_HINT = "run `bash scripts/setup.sh --test` (installs the Debian `postgresql` package)"
TEST_DATABASE = "labfleet_test"
SERVER_USER = "postgres"  # database superuser name, and the system user the server runs as under root
_REQUIRED_BINARIES = ("initdb", "pg_ctl", "postgres")


class PostgresServerError(RuntimeError):
    """The throwaway server could not be found, started or used."""


# ---------------------------------------------------------------------------------------------------------
# finding the binaries
# ---------------------------------------------------------------------------------------------------------
def _version_key(bindir: str) -> tuple[int, ...]:
    # /usr/lib/postgresql/15/bin -> (15,); /usr/lib/postgresql/9.6/bin -> (9, 6)
    name = Path(bindir).parent.name
    return tuple(int(p) for p in re.findall(r"\d+", name)) or (0,)


def find_pg_bindir() -> Path:
    """The directory holding initdb, pg_ctl and postgres (newest installed version); raises if none."""
    override = os.environ.get("LABFLEET_PG_BINDIR")
    candidates = [override] if override else sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key)
    for bindir in reversed(candidates):
        if all(os.access(os.path.join(bindir, b), os.X_OK) for b in _REQUIRED_BINARIES):
            return Path(bindir)
    where = f"LABFLEET_PG_BINDIR={override}" if override else "/usr/lib/postgresql/*/bin"
    raise PostgresServerError(
        f"PostgreSQL server binaries ({', '.join(_REQUIRED_BINARIES)}) not found in {where}: {SETUP_HINT}"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _traversable_by_others(path: Path) -> bool:
    """Whether another user can reach ``path`` (every ancestor has the x bit for others)."""
    path = path.resolve()
    for p in [path, *path.parents]:
        if not os.stat(p).st_mode & 0o001:
            return False
    return True


def _psycopg():
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise PostgresServerError(f"psycopg (3) is not installed in this Python: {SETUP_HINT}") from exc
    return psycopg


# ---------------------------------------------------------------------------------------------------------
# the server
# ---------------------------------------------------------------------------------------------------------
class PostgresServer:
    """One throwaway PostgreSQL cluster in a temporary directory, listening on 127.0.0.1 only."""

    def __init__(self, bindir: Path | None = None, start_timeout: float = 60.0):
        self.bindir = bindir or find_pg_bindir()
        self.start_timeout = start_timeout
        self.port: int | None = None
        self.tmpdir: Path | None = None
        self._run_as: str | None = None  # system user to run the server as (None: current user)

    # -- paths ------------------------------------------------------------------------------------------
    @property
    def datadir(self) -> Path:
        assert self.tmpdir is not None
        return self.tmpdir / "data"

    @property
    def logfile(self) -> Path:
        assert self.tmpdir is not None
        return self.tmpdir / "postgres.log"

    def url(self, database: str = TEST_DATABASE) -> str:
        return f"postgresql+psycopg://{SERVER_USER}@127.0.0.1:{self.port}/{database}"

    # -- helpers ----------------------------------------------------------------------------------------
    def _cmd(self, *args: str) -> list[str]:
        if self._run_as is None:
            return list(args)
        return ["runuser", "-u", self._run_as, "--", *args]

    def _run(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        cmd = self._cmd(*args)
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        env.pop("PGDATA", None)
        proc = subprocess.run(
            cmd,
            cwd=self.tmpdir,  # the server user must be able to enter the working directory
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise PostgresServerError(
                f"{' '.join(cmd)} failed with exit {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
                + self._log_tail()
            )
        return proc

    def _log_tail(self, lines: int = 30) -> str:
        try:
            text = self.logfile.read_text(errors="replace")
        except OSError:
            return ""
        return "\n--- postgres.log (tail) ---\n" + "\n".join(text.splitlines()[-lines:])

    def _chown(self, path: Path) -> None:
        if self._run_as is not None:
            pw = pwd.getpwnam(self._run_as)
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def _write(self, path: Path, text: str, append: bool = False) -> None:
        with open(path, "a" if append else "w") as f:
            f.write(text)
        self._chown(path)

    # -- life cycle -------------------------------------------------------------------------------------
    def start(self) -> PostgresServer:
        if os.geteuid() == 0:
            try:
                pwd.getpwnam(SERVER_USER)
            except KeyError:
                raise PostgresServerError(
                    f"running as root but there is no `{SERVER_USER}` system user to run the server as "
                    f"(PostgreSQL refuses to run as root): {SETUP_HINT}"
                ) from None
            if shutil.which("runuser") is None:
                raise PostgresServerError("running as root and `runuser` (util-linux) is missing")
            self._run_as = SERVER_USER
        parent = Path(os.environ.get("LABFLEET_PG_TMPDIR") or tempfile.gettempdir())
        if self._run_as is not None and not _traversable_by_others(parent):
            parent = Path("/tmp")
        self.tmpdir = Path(tempfile.mkdtemp(prefix="labfleet-pg-", dir=parent))
        try:
            self._chown(self.tmpdir)
            self._initdb()
            last_error: Exception | None = None
            for _attempt in range(5):  # the free port may be taken between probing and binding
                self.port = _free_port()
                try:
                    self._start_once()
                    break
                except PostgresServerError as exc:
                    last_error = exc
                    if "could not bind" not in str(exc) and "Address already in use" not in str(exc):
                        raise
            else:
                raise PostgresServerError(f"could not find a free port: {last_error}")
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _initdb(self) -> None:
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.datadir),
            "-U",
            SERVER_USER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        )
        # trust, and only over the unix socket in the temporary directory and 127.0.0.1
        self._write(
            self.datadir / "pg_hba.conf",
            "# written by tests/postgres_server.py\nlocal all all trust\nhost  all all 127.0.0.1/32 trust\n",
        )

    def _start_once(self) -> None:
        assert self.tmpdir is not None
        self._write(
            self.datadir / "postgresql.auto.conf",
            "# written by tests/postgres_server.py (throwaway test server: durability off)\n"
            "listen_addresses = '127.0.0.1'\n"
            f"port = {self.port}\n"
            f"unix_socket_directories = '{self.tmpdir}'\n"
            "max_connections = 200\n"
            "shared_buffers = 32MB\n"
            "fsync = off\n"
            "synchronous_commit = off\n"
            "full_page_writes = off\n"
            "log_min_messages = warning\n",
        )
        with contextlib.suppress(FileNotFoundError):
            self.logfile.unlink()
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.datadir),
            "-l",
            str(self.logfile),
            "-w",
            "-t",
            str(int(self.start_timeout)),
            "start",
            timeout=self.start_timeout + 30,
        )

    def _wait_ready(self) -> None:
        psycopg = _psycopg()
        deadline = time.monotonic() + self.start_timeout
        while True:
            try:
                with psycopg.connect(
                    host="127.0.0.1", port=self.port, user=SERVER_USER, dbname="postgres", connect_timeout=5
                ) as conn:
                    conn.execute("select 1")
                return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise PostgresServerError(
                        f"PostgreSQL on 127.0.0.1:{self.port} does not accept connections: {exc}"
                        + self._log_tail()
                    ) from exc
                time.sleep(0.1)

    def _postmaster_pid(self) -> int | None:
        try:
            return int((self.datadir / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None

    def stop(self) -> None:
        """Stop the server (fast shutdown) and remove the temporary directory; safe to call twice."""
        if self.tmpdir is None:
            return
        try:
            if (self.datadir / "postmaster.pid").exists():
                try:
                    self._run(
                        str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", "fast", "-w", "stop"
                    )
                except (PostgresServerError, subprocess.TimeoutExpired):
                    pid = self._postmaster_pid()
                    if pid:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
        finally:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running_postgres(**kwargs) -> Iterator[PostgresServer]:
    """``with running_postgres() as server: server.url()`` outside pytest (benchmarks, scripts)."""
    server = PostgresServer(**kwargs)
    server.start()
    try:
        yield server
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------------------
# databases
# ---------------------------------------------------------------------------------------------------------
def fresh_database(admin_url: str, name: str) -> str:
    """Create an empty database ``name`` on the server of ``admin_url`` (dropped first if it exists).

    ``admin_url`` is a SQLAlchemy URL of a superuser on that server (e.g. the ``postgres_url`` fixture's
    value); returns the same URL pointing at the new database.
    """
    from sqlalchemy.engine import make_url

    psycopg = _psycopg()
    from psycopg import sql

    url = make_url(admin_url)
    with psycopg.connect(
        host=url.host or "127.0.0.1",
        port=url.port or 5432,
        user=url.username or SERVER_USER,
        password=url.password,
        dbname="postgres",
        autocommit=True,
        connect_timeout=10,
    ) as conn:
        ident = sql.Identifier(name)
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0 ENCODING 'UTF8'").format(ident))
    return url.set(database=name).render_as_string(hide_password=False)


# ---------------------------------------------------------------------------------------------------------
# the fixture; one server per process even if the fixture is registered twice (conftest plugin + import)
# ---------------------------------------------------------------------------------------------------------
_shared_lock = threading.Lock()
_shared_server: PostgresServer | None = None
_shared_users = 0


def _acquire_server() -> PostgresServer:
    global _shared_server, _shared_users
    with _shared_lock:
        if _shared_server is None:
            _shared_server = PostgresServer().start()
        _shared_users += 1
        return _shared_server


def _release_server() -> None:
    global _shared_server, _shared_users
    with _shared_lock:
        _shared_users -= 1
        if _shared_users <= 0 and _shared_server is not None:
            _shared_server.stop()
            _shared_server = None
            _shared_users = 0


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """SQLAlchemy URL of database ``labfleet_test`` on a throwaway PostgreSQL server (started once)."""
    external = os.environ.get("LABFLEET_TEST_POSTGRES_URL")
    error: str | None = None
    server: PostgresServer | None = None
    url = ""
    try:
        if external:
            url = fresh_database(external, TEST_DATABASE)
        else:
            server = _acquire_server()
    except PostgresServerError as exc:
        error = str(exc)
    if error is not None:  # outside the except block: no chained traceback in the report
        pytest.fail(f"cannot start the test PostgreSQL server: {error}", pytrace=False)
    if server is None:
        yield url
        return
    try:
        yield fresh_database(server.url(), TEST_DATABASE)
    finally:
        _release_server()
