"""Where sessions' logs are kept: one folder, one file per session id.

The spawners (in the Hub) write a session's backend output there, and the service serves it at
``GET /api/sessions/{id}/logs``: two processes, one setting.  Both take it from :class:`SessionLogs`
(``configure()`` gives both the same folder) and name a session's file with :func:`log_file`.

Pure: traitlets and the standard library (the Hub imports it).
"""

from __future__ import annotations

from pathlib import Path

from traitlets import HasTraits, Unicode, default

from labfleet.core.envtraits import env_value

ENV = "LABFLEET_SESSION_LOG_DIR"


class SessionLogs(HasTraits):
    """The ``session_log_dir`` option, shared by the service and the spawners: a mixin, so each
    lists it in its own section (``c.LabfleetService.``, ``c.LabfleetSpawnerMixin.``)."""

    session_log_dir = Unicode(
        help="""Folder of the sessions' logs, one file per session id: the spawners write each
        session's backend output there (process output, container logs), and the labfleet service
        serves it at /api/sessions/{id}/logs. Default: `session-logs` in the working directory.""",
    ).tag(config=True, env=ENV)

    @default("session_log_dir")
    def _default_session_log_dir(self) -> str:
        return env_value(self, "session_log_dir") or str(Path.cwd() / "session-logs")


def log_file(folder: str | Path, session_id: str) -> Path:
    """The log file of session ``session_id`` in ``folder``."""
    return Path(folder) / f"{session_id}.log"


def read_from(path: str | Path, offset: int, limit: int) -> tuple[bytes, int]:
    """(at most ``limit`` bytes of the log file at ``path`` from byte ``offset``, its size now): a
    follower asks again from ``offset`` + what it got. Nothing when it is absent (size 0)."""
    path = Path(path)
    if not path.is_file():
        return b"", 0
    with path.open("rb") as f:
        size = f.seek(0, 2)
        f.seek(min(offset, size))
        return f.read(limit), size


def read_tail(path: str | Path, limit: int) -> bytes:
    """The last ``limit`` bytes of the log file at ``path`` (all of a shorter one); none when it is absent."""
    path = Path(path)
    if not path.is_file():
        return b""
    with path.open("rb") as f:
        size = f.seek(0, 2)
        f.seek(max(0, size - limit))
        return f.read(limit)
