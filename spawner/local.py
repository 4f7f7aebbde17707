"""The local backend: one ``jupyterhub-singleuser`` process per session on the Hub host.

The embedded default.  Each user gets a home under ``home_dir_template``; where bubblewrap
(``bwrap``) is installed the process runs in a sandbox: the system read-only, a private /tmp,
its own /proc, and only the session's home and its mounts writable.  Devices and shares reach it
through the environment (CUDA_VISIBLE_DEVICES by UUID, LABFLEET_GPU_SHARES, MPS limits).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from jupyterhub.spawner import SimpleLocalProcessSpawner
from traitlets import Bool, List, Unicode

from .launch import LaunchSpec, Mount
from .mixin import LabfleetSpawnerMixin
from .sandbox import bwrap_command, environment_sources, under_private_tmp


class LabfleetLocalSpawner(LabfleetSpawnerMixin, SimpleLocalProcessSpawner):
    """labfleet sessions as local processes, sandboxed with bubblewrap when it is there."""

    sandbox = Unicode(
        "auto",
        help="""Run sessions inside bubblewrap: `auto` (when `bwrap` is found and works), `yes` (a spawn
        fails without it), `no`.""",
    ).tag(config=True)

    bwrap_path = Unicode("bwrap", help="The bubblewrap program (a name on PATH or a full path).").tag(
        config=True
    )

    sandbox_writable = List(
        Unicode(),
        help="""Extra host directories the sandboxed session may write (besides its home, its run
        directory and its mounts), e.g. a shared scratch space.""",
    ).tag(config=True)

    sandbox_share_net = Bool(
        True,
        help="""Keep the host's network in the sandbox. The Hub's proxy reaches the server on 127.0.0.1,
        so a session without the host network would be unreachable; turn off only with another route.""",
    ).tag(config=True)

    extra_mounts = List(
        help="""Host folders to mount in every session, as {"source": "/abs/host/dir", "target":
        "name or /abs/path", "mode": "ro"|"rw"|"wd"}; a relative target is under the session's home.""",
    ).tag(config=True)

    sandbox_hidden = List(
        Unicode(),
        help="""Host paths the sandboxed session must not see: a directory is covered by an empty
        tmpfs, a file reads as empty. E.g. the virtual-folder storage root and the homes, which the
        read-only view of the host would otherwise show whole (the session's own home and folders
        are still mounted from there), and the Hub's secrets and DBs.""",
    ).tag(config=True)

    _log_file = None

    def _bwrap(self) -> str | None:
        if self.sandbox == "no":
            return None
        path = shutil.which(self.bwrap_path)
        if path and _bwrap_works(path):
            return path
        if self.sandbox == "yes":
            raise RuntimeError(f"sandbox = yes, but {self.bwrap_path!r} is missing or cannot run here")
        return None

    def lf_own_pid_namespace(self) -> bool:
        return self._bwrap() is not None  # bwrap --unshare-pid

    def lf_session_home(self) -> str:
        # The sandbox binds the host home at the same path: the session sees it there too.
        return str(self.home_dir)

    def lf_mounts(self, options) -> tuple[Mount, ...]:
        out = []
        for m in self.extra_mounts:
            target = str(m["target"])
            if not target.startswith("/"):
                target = f"{self.lf_session_home().rstrip('/')}/{target}"
            out.append(Mount(source=str(m["source"]), target=target, mode=m.get("mode", "rw")))
        return tuple(out)

    async def lf_prepare(self, launch: LaunchSpec) -> None:
        # A few mkdirs and one cached bwrap probe: quick enough to run on the loop.
        self._prepare(launch)

    def _prepare(self, launch: LaunchSpec) -> None:
        home = Path(self.home_dir)
        home.mkdir(parents=True, exist_ok=True)
        log_path = self.session_log_path
        if log_path is not None:
            # The process writes its output straight into the session's log file.
            self._log_file = open(log_path, "ab", buffering=0)  # closed after Popen
            self.popen_kwargs = {"stdout": self._log_file, "stderr": subprocess.STDOUT}
        bwrap = self._bwrap()
        if bwrap:
            for m in launch.mounts:
                if m.target.startswith(str(home) + "/"):
                    target = Path(m.target)
                    if target.is_symlink():
                        target.unlink()  # left by a session without the sandbox: bind a real directory
                    # The mount point (and ~/vfolders/) exists on the host, owned by the user.
                    target.mkdir(parents=True, exist_ok=True)
            self.shell_cmd = bwrap_command(
                bwrap,
                home=str(home),
                mounts=launch.mounts,
                writable=list(self.sandbox_writable),
                readonly=_hidden_by_private_tmp(self.get_env()),
                hidden=[h for h in self.sandbox_hidden if os.path.isdir(h)],
                hidden_files=[h for h in self.sandbox_hidden if os.path.isfile(h)],
                share_net=self.sandbox_share_net,
            )
        else:
            self.shell_cmd = []
            if launch.mounts:
                # Without a sandbox a mount is a symlink, and ro cannot be enforced: say so.
                for m in launch.mounts:
                    _link(Path(m.target), m.source, self.log)
                self.log.warning("labfleet: no sandbox for %s; mounts are plain symlinks", self._log_name)

    def lf_runtime(self) -> dict[str, Any] | None:
        """The server's root process (bwrap's, when sandboxed): the sampler walks its tree."""
        return {"pid": self.pid} if self.pid else None

    async def _signal(self, sig):
        """Signal the whole sandbox: bwrap, and the server in its own PID namespace.

        bwrap does not pass signals on, so a signal to its pid alone would leave the server
        running; they share a process group (JupyterHub starts a new session for each server, so
        the group is the server's alone, also after a Hub restart).
        """
        try:
            leader = os.getpgid(self.pid) == self.pid
        except ProcessLookupError:
            return False
        if not leader:
            return await super()._signal(sig)
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return False
        except PermissionError:
            return await super()._signal(sig)
        return True

    async def start(self):
        try:
            return await super().start()
        finally:
            if self._log_file is not None:
                self._log_file.close()  # the child has its own copy
                self._log_file = None


def _link(target: Path, source: str, log) -> None:
    """``target`` as a symlink to ``source``: a stale link (another folder of that name before, or
    an empty mount point of a sandboxed session) is replaced; the user's own files never are."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink():
        if os.readlink(target) == source:
            return
        target.unlink()
    elif target.is_dir():
        try:
            target.rmdir()  # only when empty
        except OSError:
            log.warning("labfleet: %s is a folder of its own, not mounting %s there", target, source)
            return
    elif target.exists():
        log.warning("labfleet: %s is a file, not mounting %s there", target, source)
        return
    target.symlink_to(source)


def _hidden_by_private_tmp(env: dict[str, str]) -> list[str]:
    """Folders the session needs that live under /tmp or /var/tmp, which the sandbox's private /tmp
    would hide: its Python environments (the Hub's, and a venv whose ``bin`` is on its PATH), what
    their installs point to (an editable install's checkout, linked JupyterLab extensions), and the
    folders on its PATH and PYTHONPATH."""
    wanted = [sys.prefix, sys.base_prefix]
    for var in ("PATH", "PYTHONPATH"):
        wanted += [p for p in env.get(var, "").split(os.pathsep) if p]
    prefixes = [sys.prefix]
    for entry in env.get("PATH", "").split(os.pathsep):
        parent = os.path.dirname(entry.rstrip("/"))
        if entry and os.path.isfile(os.path.join(parent, "pyvenv.cfg")) and parent not in prefixes:
            prefixes.append(parent)
    for prefix in prefixes:
        wanted += environment_sources(prefix)
    return under_private_tmp(wanted)


def _bwrap_works(path: str) -> bool:
    """bwrap can be installed yet refused by the kernel (no user namespaces): try it once."""
    cached = _BWRAP_OK.get(path)
    if cached is None:
        try:
            r = subprocess.run(
                [path, "--ro-bind", "/", "/", "--dev", "/dev", "--", "/bin/true"],
                capture_output=True,
                timeout=10,
            )
            cached = r.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            cached = False
        _BWRAP_OK[path] = cached
    return cached


_BWRAP_OK: dict[str, bool] = {}
