"""bubblewrap command lines for local sessions: a pure builder, no I/O.

The sandbox sees the host read-only, gets a private /tmp and /dev, its own /proc and PID
namespace, and writes only its home, the extra writable folders and its rw/wd mounts; ro
mounts are bound read-only, and ``hidden`` folders (a storage root) are not seen at all.  The
host network stays (the proxy reaches the server on 127.0.0.1).  The session command is
appended as one shell string (JupyterHub's ``shell_cmd``).
"""

from __future__ import annotations

from collections.abc import Iterable

from .launch import Mount


def bwrap_command(
    bwrap: str,
    *,
    home: str,
    mounts: Iterable[Mount] = (),
    writable: Iterable[str] = (),
    readonly: Iterable[str] = (),
    hidden: Iterable[str] = (),
    hidden_files: Iterable[str] = (),
    share_net: bool = True,
) -> list[str]:
    """``shell_cmd`` for LocalProcessSpawner: bwrap's arguments, then ``/bin/sh -c``."""
    args = [
        bwrap,
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--tmpfs", "/tmp",
        "--tmpfs", "/var/tmp",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
    ]  # fmt: skip
    if not share_net:
        args.append("--unshare-net")
    # Covered by an empty tmpfs; bind sources still come from the host, so a session's own folder
    # under a hidden root is mounted all the same.
    for path in hidden:
        args += ["--tmpfs", path]
    # Files (the Hub's secrets and DBs) read as empty.
    for path in hidden_files:
        args += ["--ro-bind", "/dev/null", path]
    # The private /tmp hides what lives under it (a venv or a checkout in /tmp): show those again.
    for path in readonly:
        args += ["--ro-bind", path, path]
    args += ["--bind", home, home]
    for path in writable:
        args += ["--bind", path, path]
    for m in mounts:
        args += ["--ro-bind" if m.read_only else "--bind", m.source, m.target]
    args += ["--chdir", home, "--setenv", "HOME", home, "--", "/bin/sh", "-c"]
    return args
