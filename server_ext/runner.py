"""The in-session runners for batch and inference sessions: process management and the state file.

A labfleet spawner starts JupyterLab for every session and says in the environment what the session is
(see :class:`SessionEnv`). For ``batch`` and ``inference`` sessions this module runs the session's command
next to the Lab: its output goes to a log file in the Lab's root folder (so the user sees it in the file
browser while it runs) and to the server's own stdout (so the per-session log the spawner captures has it),
and its life is recorded in ``<run dir>/runner.json``.

An inference session that is a replica of a model-serving endpoint (the labfleet service answers its
replica credential) runs its command behind an authenticating front (:mod:`labfleet.session.front`): the command
listens on the session's loopback at a port of its own (``$PORT``), the front on the replica's port
(``$LABFLEET_INFERENCE_PORT``) on every address of the session (``$LABFLEET_INFERENCE_HOST``, default
``0.0.0.0``), and only calls with the credential (the endpoint's router) get through. The session's own
``labfleet/inference/`` page calls the command on the loopback, behind the server's authentication.

No tornado and no jupyter-server here: the extension (``labfleet.session.extension``) decides what happens when the
command ends (stop the server with the command's exit code), the handlers only read :meth:`Runner.snapshot`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from labfleet.core.vocab import COMMAND_SESSION_TYPES
from labfleet.spawner.launch import GPU_ENFORCEMENT_ENV, GPU_MEMORY_LIMIT_ENV, GPU_MPS_WITHHELD_ENV

from .front import ReplicaFront, credential_source

# The exit code of a session whose command is empty or missing, or otherwise unusable (a bad port):
# 2 is the shell's "misuse" code, distinct from anything the command itself could have returned.
EXIT_BAD_COMMAND = 2
# The exit code when no shell can be started at all: 127 is the shell's own "command not found".
EXIT_CANNOT_START = 127

# How much of the log GET /labfleet/runner returns: enough for the end of a traceback, small enough for JSON.
OUTPUT_TAIL_BYTES = 64 * 1024

# A line longer than this is passed on in pieces, so one endless line cannot hold the log back.
_CHUNK = 64 * 1024

# After the command exits, how long its output pipe may stay open (a background child of the command holding
# it) before the runner stops waiting for the rest of the output and records the exit.
_DRAIN_TIMEOUT = 5.0


def _now() -> str:
    """UTC, ISO 8601 with a Z: the format the rest of labfleet's JSON uses for instants."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def exit_code_of(returncode: int) -> int:
    """A process's exit code as a shell reports it: asyncio gives ``-N`` for "killed by signal N", the
    shell (and the spawner reading our own exit status) expects ``128 + N``."""
    return 128 - returncode if returncode < 0 else returncode


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` to ``path`` so that a reader sees either the old or the new file, never half of one:
    write a temporary file in the same folder (same file system), then rename it over the old one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_tail(path: Path | str | None, limit: int = OUTPUT_TAIL_BYTES) -> str:
    """The last ``limit`` bytes of a log, as text (a multi-byte character cut at the start is replaced, not
    an error); empty when there is no log yet."""
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            data = f.read()
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it), for the inference command to bind."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


async def port_is_listening(port: int, host: str = "127.0.0.1", timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections on ``host:port`` (the inference command is up)."""
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


@dataclass(frozen=True)
class SessionEnv:
    """What the spawner told this session through its environment (the contract with the spawner side)."""

    session_id: str
    type: str
    command: str
    project: str
    image: str
    gpu_shares: str
    run_dir: Path
    linger: float
    inference_port: str
    inference_host: str = "0.0.0.0"  # where a replica's front listens (the command: the loopback)
    # A fraction of one device: its bytes (None: unknown) and how it is held, "mps" or "caps" ("": whole
    # devices or none).
    gpu_memory_limit: int | None = None
    gpu_enforcement: str = ""
    gpu_mps_withheld: str = ""  # why the backend gave the session no MPS where its node runs it

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> SessionEnv:
        env = os.environ if environ is None else environ
        session_id = env.get("LABFLEET_SESSION_ID", "").strip()
        # A plain JupyterLab (no labfleet spawner) has no type: it is an interactive session.
        stype = env.get("LABFLEET_SESSION_TYPE", "").strip().lower() or "interactive"
        run_dir = env.get("LABFLEET_RUN_DIR", "").strip()
        if not run_dir:
            run_dir = os.path.join("~", ".labfleet", session_id or "session")
        try:
            linger = max(0.0, float(env.get("LABFLEET_BATCH_LINGER", "") or 2))
        except ValueError:
            linger = 2.0
        return cls(
            session_id=session_id,
            type=stype,
            command=env.get("LABFLEET_COMMAND", ""),
            project=env.get("LABFLEET_PROJECT", ""),
            image=env.get("LABFLEET_IMAGE", ""),
            gpu_shares=env.get("LABFLEET_GPU_SHARES", ""),
            run_dir=Path(run_dir).expanduser(),
            linger=linger,
            inference_port=env.get("LABFLEET_INFERENCE_PORT", "").strip(),
            inference_host=env.get("LABFLEET_INFERENCE_HOST", "").strip() or "0.0.0.0",
            gpu_memory_limit=_bytes(env.get(GPU_MEMORY_LIMIT_ENV, "")),
            gpu_enforcement=env.get(GPU_ENFORCEMENT_ENV, "").strip(),
            gpu_mps_withheld=env.get(GPU_MPS_WITHHELD_ENV, "").strip(),
        )


def _bytes(value: str) -> int | None:
    """A whole number of bytes the spawner wrote, or None."""
    value = value.strip()
    return int(value) if value.isascii() and value.isdigit() else None


def _shell() -> str:
    """bash when the image has it (what users write their command lines for), else POSIX sh."""
    bash = "/bin/bash"
    return bash if os.access(bash, os.X_OK) else "/bin/sh"


class Runner:
    """Runs one session's command (``batch`` or ``inference``) and keeps its state file.

    ``on_exit(exit_code)`` is called once, when the command has ended (or could not start) and its state
    is recorded; the extension uses it to stop the server with that code.
    """

    def __init__(
        self,
        session: SessionEnv,
        root_dir: Path | str,
        *,
        url_path: str = "",
        on_exit: Callable[[int], Any] | None = None,
        stdout: Any = None,
        log: logging.Logger | None = None,
        replica_credential: Callable[[], Awaitable[str | None]] | None | bool = True,
    ) -> None:
        """``replica_credential``: how an inference session learns that it is a replica, and its
        credential (None: it is not); True (default): ask the labfleet service when this is a labfleet
        session (:func:`labfleet.session.front.credential_source`); None or False: never a replica."""
        if session.type not in COMMAND_SESSION_TYPES:
            raise ValueError(f"no runner for session type {session.type!r}")
        self.session = session
        self.type = session.type
        self.root_dir = Path(root_dir)
        self.log_path = self.root_dir / f"labfleet-{self.type}.log"
        self.state_path = session.run_dir / "runner.json"
        self.url_path = url_path
        self.on_exit = on_exit
        # None: the interpreter's stdout at the time of writing (pytest swaps it; a saved one goes stale).
        self._stdout = stdout
        self.log = log or logging.getLogger("labfleet.runner")
        self.port: int | None = None  # where the command listens
        self.front: ReplicaFront | None = None  # a replica's front, on the replica's port
        if replica_credential is True:
            replica_credential = credential_source(log=self.log) if session.type == "inference" else None
        self._replica_credential = replica_credential or None
        self._ready = False  # the inference port has accepted a connection
        self._log_broken = False
        self.proc: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None
        self._done = asyncio.Event()
        self.state: dict[str, Any] = {
            "type": self.type,
            "command": session.command,
            "state": "pending",
            "pid": None,
            "started_at": None,
            "ended_at": None,
            "exit_code": None,
            "log": str(self.log_path),
        }
        if self.type == "inference":
            self.state.update(port=None, url_path=url_path)

    # -- state -------------------------------------------------------------------------------------------

    def _update(self, **changes: Any) -> None:
        """Change the state and write the state file at once: the spawner side and the user may read it at
        any moment, and it must outlive this process if the server is killed."""
        self.state.update(changes)
        try:
            write_json_atomic(self.state_path, self.state)
        except OSError as e:
            # A read-only or full run dir must not kill the command; the endpoint still has the state.
            self.log.warning("labfleet runner: cannot write %s: %s", self.state_path, e)

    def snapshot(self, tail: bool = True) -> dict[str, Any]:
        """The state for GET /labfleet/runner: the state file's keys, plus the end of the log."""
        out = dict(self.state)
        if tail:
            out["output_tail"] = read_tail(self.log_path)
        return out

    @property
    def exit_code(self) -> int | None:
        return self.state["exit_code"]

    async def not_ready_reason(self) -> str | None:
        """Why the inference command cannot take a request now (None: it can). The port is probed until it
        answered once; after that a refused connection only happens once the command has exited, and the
        state says so, so a request costs no extra connection."""
        state = self.state["state"]
        if state == "pending":
            return f"the {self.type} command has not started yet"
        if state != "running":
            return f"the {self.type} command is not running ({state}, exit code {self.exit_code})"
        if self._ready:
            return None
        if self.port is None or not await port_is_listening(self.port):
            return f"the {self.type} command is starting: nothing listens on 127.0.0.1:{self.port} yet"
        self._ready = True
        return None

    async def wait(self) -> int | None:
        """Until the command has ended and its exit is recorded; its exit code."""
        await self._done.wait()
        return self.exit_code

    # -- output ------------------------------------------------------------------------------------------

    def _emit(self, logf: Any, data: bytes) -> None:
        """One line (or piece of an endless one) to the log file and to the server's stdout, flushed, so both
        show progress while the command runs. Small blocking writes: cheaper than a thread per line."""
        try:
            logf.write(data)
            logf.flush()
        except OSError as e:
            # A full disk must not stop the reading: an unread pipe would block the command itself.
            if not self._log_broken:  # once, not once per line
                self.log.warning("labfleet runner: cannot write %s: %s", self.log_path, e)
            self._log_broken = True
        out = self._stdout or sys.stdout
        try:
            buf = getattr(out, "buffer", None)
            if buf is not None:
                buf.write(data)
            else:  # a text-only stream (pytest's capture): decode what the command wrote
                out.write(data.decode("utf-8", errors="replace"))
            out.flush()
        except (OSError, ValueError):
            # A closed or broken stdout (the spawner went away) must not stop the log file or the command.
            pass

    def _open_log(self) -> Any:
        """The log, appended to (a restarted runner keeps what an earlier one wrote). Opening a local file is
        quick enough to do on the event loop, like the line writes."""
        return open(self.log_path, "ab")

    def _message(self, text: str) -> None:
        """A line from labfleet itself in the log (why the command did not start, how it ended)."""
        with self._open_log() as logf:
            self._emit(logf, f"[labfleet] {text}\n".encode())

    async def _pump(self, stream: asyncio.StreamReader, logf: Any) -> None:
        buf = b""
        while True:
            chunk = await stream.read(_CHUNK)
            if not chunk:
                break
            buf += chunk
            # Pass on every complete line as soon as it arrives; keep the unfinished rest for later.
            *lines, buf = buf.split(b"\n")
            for line in lines:
                self._emit(logf, line + b"\n")
            if len(buf) >= _CHUNK:
                self._emit(logf, buf)
                buf = b""
        if buf:
            self._emit(logf, buf)

    # -- life cycle --------------------------------------------------------------------------------------

    def _fail(self, code: int, message: str) -> None:
        self.log.error("labfleet %s runner: %s", self.type, message)
        try:
            self.root_dir.mkdir(parents=True, exist_ok=True)
            self._message(message)
        except OSError as e:
            self.log.warning("labfleet runner: cannot write %s: %s", self.log_path, e)
        self._update(state="failed-to-start", started_at=_now(), ended_at=_now(), exit_code=code)
        self._finish()

    def _finish(self) -> None:
        self._close_front()
        self._done.set()
        atexit.unregister(self._kill_at_exit)
        if self.on_exit is not None:
            self.on_exit(self.state["exit_code"])

    def _inference_port(self) -> int:
        if not self.session.inference_port:
            return free_port()
        port = int(self.session.inference_port)  # ValueError: reported as a bad setting by start()
        if not 0 < port < 65536:
            raise ValueError(f"port {port} out of range")
        return port

    async def start(self) -> None:
        """Start the command; returns once it runs (or has failed to start). Its end is watched in the
        background; :meth:`wait` waits for it."""
        command = self.session.command
        if not command.strip():
            self._fail(EXIT_BAD_COMMAND, f"LABFLEET_COMMAND is empty: a {self.type} session needs a command")
            return
        env = dict(os.environ)
        # Python commands otherwise buffer their stdout on a pipe, and the log would show nothing until exit.
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self.type == "inference":
            try:
                self.port = self._inference_port()
            except ValueError as e:
                self._fail(
                    EXIT_BAD_COMMAND, f"LABFLEET_INFERENCE_PORT={self.session.inference_port!r} is bad: {e}"
                )
                return
            if self._replica_credential is not None and not await self._start_front():
                return
            env["PORT"] = str(self.port)
            # A plain replace, not str.format: shell command lines are full of braces (${VAR}, awk '{...}').
            command = command.replace("{port}", str(self.port))
            self.state.update(port=self.port, command=command)
        self.root_dir.mkdir(parents=True, exist_ok=True)
        shell = _shell()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                shell,
                "-c",
                command,
                cwd=str(self.root_dir),
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                # Its own process group: stopping the session stops everything the command started.
                start_new_session=True,
            )
        except OSError as e:
            self._fail(EXIT_CANNOT_START, f"cannot start {shell} -c {command!r}: {e}")
            return
        # If the interpreter exits without the extension's cleanup, the command must not outlive the session.
        atexit.register(self._kill_at_exit)
        self.log.info("labfleet %s runner: started pid %s: %s", self.type, self.proc.pid, command)
        self._update(state="running", pid=self.proc.pid, started_at=_now())
        self._task = asyncio.create_task(self._watch())

    async def _start_front(self) -> bool:
        """A replica: the command moves to a loopback port of its own, the front takes the replica's port.
        False when the session cannot serve (it has failed: no credential, the port taken)."""
        assert self._replica_credential is not None and self.port is not None
        try:
            credential = await self._replica_credential()
        except Exception as e:
            self._fail(EXIT_BAD_COMMAND, f"cannot start the replica's front: {e}")
            return False
        if not credential:
            return True  # a plain inference session: the command listens on its port itself
        outer = self.port
        front = ReplicaFront(credential, free_port(), log=self.log)
        try:
            await front.start(self.session.inference_host, outer)
        except OSError as e:
            self._fail(
                EXIT_BAD_COMMAND,
                f"the replica's front cannot listen on {self.session.inference_host}:{outer}: {e}",
            )
            return False
        self.front, self.port = front, front.inner_port
        self.state.update(front={"host": self.session.inference_host, "port": outer})
        self.log.info(
            "labfleet inference runner: replica front on %s:%s, the command on 127.0.0.1:%s",
            self.session.inference_host,
            outer,
            self.port,
        )
        return True

    def _close_front(self) -> None:
        if self.front is not None:
            self.front.close()  # connections are refused from now on: the router tries another replica

    async def _watch(self) -> None:
        proc, stdout = self.proc, self.proc.stdout if self.proc is not None else None
        assert proc is not None and stdout is not None
        with self._open_log() as logf:
            pump = asyncio.create_task(self._pump(stdout, logf))
            returncode = await proc.wait()
            self._close_front()
            try:
                # The rest of the output; a background child still holding the pipe open is not waited for.
                await asyncio.wait_for(asyncio.shield(pump), _DRAIN_TIMEOUT)
            except asyncio.TimeoutError:
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pump
            code = exit_code_of(returncode)
            self._emit(logf, f"[labfleet] {self.type} command exited with code {code}\n".encode())
        self.log.info("labfleet %s runner: pid %s exited with code %s", self.type, proc.pid, code)
        self._update(state="exited", ended_at=_now(), exit_code=code)
        self._finish()

    def _signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        # The whole group (the command's children too); after the shell itself has exited, its children
        # may still run in the group, and they must go as well.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def _kill_at_exit(self) -> None:
        self._signal_group(signal.SIGKILL)

    async def stop(self, timeout: float = 5.0) -> None:
        """Stop the command (the session is being stopped): SIGTERM to its process group, SIGKILL after
        ``timeout`` seconds; returns once its exit is recorded."""
        if self.proc is None:
            return
        if not self._done.is_set():
            self.log.info("labfleet %s runner: stopping pid %s", self.type, self.proc.pid)
            self._signal_group(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(self._done.wait()), timeout)
            except asyncio.TimeoutError:
                self._signal_group(signal.SIGKILL)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._done.wait(), timeout)
        else:
            # The shell is gone but a background child of it may live on in the group.
            self._signal_group(signal.SIGKILL)
