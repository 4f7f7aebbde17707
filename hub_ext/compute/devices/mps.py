"""The node's NVIDIA MPS daemon: whether it should run, a supervisor that runs it, and its state.

A node limits the sessions that hold a fraction of a GPU through MPS when its own daemon runs
(``nvidia-cuda-mps-control -d`` as root, with a pipe and a log directory of its own: only the
daemon's uid or root may change its settings). The node's setting ``mps`` says when:

- ``auto``: where the nvidia plugin finds GPUs MPS can share (whole GPUs, not MIG instances) and the
  control binary is on PATH; otherwise ``off``, with the reason;
- ``on``: required; ``failed``, with the reason, when it cannot run;
- ``off``: never.

:func:`decide` (pure) turns the setting, the devices and the binary into "run it" or a final
:class:`MpsStatus`. :class:`MpsSupervisor` (the I/O edge) starts the daemon, checks it on every
:meth:`~MpsSupervisor.check`, restarts it after a crash with :func:`backoff`, and stops it
(``quit`` written to the control binary's stdin, same environment) on :meth:`~MpsSupervisor.stop`.

Alive means: the control daemon's pid file, ``nvidia-cuda-mps-control.pid`` in the pipe directory
(the daemon writes it there at start and removes it on ``quit``), names a process that exists. A
stand-in control binary emulates exactly that (tests/mps_control_standin.py).

The state a node reports (:class:`MpsStatus`): ``on`` (the daemon runs; ``pipe_dir`` is where its
clients reach it), ``off`` (not wanted or not possible under ``auto``; ``reason`` says which) or
``failed`` (wanted and not running; ``reason`` says why).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labfleet.compute.devices.base import DeviceInfo, NodeInfo, plugin_for_device

log = logging.getLogger(__name__)

MPS_MODES = ("auto", "on", "off")
MPS_STATES = ("on", "off", "failed")
CONTROL_BINARY = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
# Where a node's daemon keeps its pipes and logs unless the node's options say otherwise.
DEFAULT_PIPE_DIR = "/run/labfleet/mps"
DEFAULT_LOG_DIR = "/var/log/labfleet/mps"
MAX_REASON = 500


@dataclass(frozen=True)
class MpsStatus:
    """What a node reports of its MPS daemon: ``state`` (one of :data:`MPS_STATES`), why it is not
    ``on`` (``reason``), and where its clients reach it (``pipe_dir``, when ``on``)."""

    state: str
    reason: str | None = None
    pipe_dir: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason, "pipe_dir": self.pipe_dir}


def check_mode(value: str) -> str:
    """The ``mps`` setting, or ValueError with the choices."""
    if value not in MPS_MODES:
        raise ValueError(f"mps must be one of {', '.join(MPS_MODES)}, not {value!r:.40}")
    return value


def nvidia_devices(info: NodeInfo) -> list[DeviceInfo] | None:
    """The devices the nvidia plugin found on a node; ``None`` when the node does not use that plugin."""
    if "nvidia" not in info.plugin.split(","):
        return None
    return [d for d in info.devices if plugin_for_device(d.uuid) == "nvidia"]


def decide(mode: str, devices: Sequence[DeviceInfo] | None, binary: str | None) -> MpsStatus | None:
    """Whether the daemon should run: ``None`` (run it), or the node's final status.

    ``devices``: what the nvidia plugin found (``None``: the node does not use the nvidia plugin);
    ``binary``: the control binary's path, ``None`` when it is not on PATH.
    """
    check_mode(mode)
    if mode == "off":
        return MpsStatus("off", "MPS is off on this node (mps=off)")
    if devices is None:
        return MpsStatus(
            "failed" if mode == "on" else "off", "the node does not use the nvidia device plugin"
        )
    shareable = [d for d in devices if d.kind == "gpu"]
    if not shareable:
        why = (
            "MIG instances only: MPS does not share them"
            if devices
            else "no NVIDIA GPU found by the nvidia plugin"
        )
        return MpsStatus("failed" if mode == "on" else "off", f"no GPU MPS can share ({why})")
    if binary is None:
        why = f"{CONTROL_BINARY} is not on PATH"
        return MpsStatus("failed" if mode == "on" else "off", why)
    return None


def backoff(failures: int, *, base: float = 1.0, cap: float = 300.0) -> float:
    """Seconds to wait before restarting a daemon that died ``failures`` times in a row:
    ``base``, doubled after each further failure, at most ``cap``; 0 before any failure."""
    if failures <= 0:
        return 0.0
    return min(cap, base * 2 ** min(failures - 1, 62))


def find_binary(name: str = CONTROL_BINARY) -> str | None:
    """The control binary's path: ``name`` itself when it is a path, else looked up on PATH."""
    if os.sep in name:
        return name if os.access(name, os.X_OK) else None
    return shutil.which(name)


class MpsSupervisor:
    """Runs one MPS control daemon and says how it is (``status``).

    ``binary``: the control binary (a path; ``None`` when missing); ``pipe_dir``, ``log_dir``:
    the daemon's own directories (created). ``clock``: seconds, monotonic (tests pass their own).
    """

    def __init__(
        self,
        binary: str | None,
        pipe_dir: str,
        log_dir: str,
        *,
        base_delay: float = 1.0,
        max_delay: float = 300.0,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.binary, self.pipe_dir, self.log_dir = binary, pipe_dir, log_dir
        self.base_delay, self.max_delay, self.timeout = base_delay, max_delay, timeout
        self.clock = clock
        self.failures = 0  # deaths (or failed starts) in a row
        self.next_try = 0.0
        self.running = False
        self.stopped = False
        self.status = MpsStatus("off", "not started yet")

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, PIPE_ENV: self.pipe_dir, LOG_ENV: self.log_dir}

    def pid(self) -> int | None:
        """The control daemon's pid from its pid file, ``None`` when there is none."""
        try:
            return int((Path(self.pipe_dir) / PID_FILE).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def alive(self) -> bool:
        pid = self.pid()
        if pid is None or pid <= 0:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # exists, another uid's
            pass
        try:  # a zombie nobody reaped yet is dead too
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return True

    def _control(self, args: list[str], stdin: str | None = None) -> tuple[int, str]:
        assert self.binary is not None
        try:
            done = subprocess.run(
                [self.binary, *args],
                input=stdin,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=self.timeout,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return -1, str(e)
        return done.returncode, (done.stderr or done.stdout or "").strip()

    def _failed(self, reason: str) -> MpsStatus:
        self.failures += 1
        delay = backoff(self.failures, base=self.base_delay, cap=self.max_delay)
        self.next_try = self.clock() + delay
        self.running = False
        self.status = MpsStatus("failed", f"{reason[: MAX_REASON - 40]}; retrying in {delay:g} s")
        log.warning("MPS daemon: %s (retry in %g s)", reason, delay)
        return self.status

    def start(self) -> MpsStatus:
        """Start the daemon now (unless it already runs)."""
        self.stopped = False
        if self.binary is None:
            self.status = MpsStatus("failed", f"{CONTROL_BINARY} is not on PATH")
            return self.status
        if self.alive():
            self.running = True
            self.status = MpsStatus("on", None, self.pipe_dir)
            return self.status
        for d in (self.pipe_dir, self.log_dir):
            Path(d).mkdir(parents=True, exist_ok=True)
        code, out = self._control(["-d"])
        if code != 0:
            return self._failed(f"{CONTROL_BINARY} -d exited {code}: {out[:200]}".rstrip(": "))
        deadline = self.clock() + self.timeout
        while not self.alive():
            if self.clock() >= deadline:
                return self._failed(f"{CONTROL_BINARY} -d started no daemon (no live pid in {PID_FILE})")
            time.sleep(0.05)
        if self.failures:
            log.info("MPS daemon restarted after %d failure(s)", self.failures)
        self.running = True
        self.status = MpsStatus("on", None, self.pipe_dir)
        log.info("MPS daemon runs (pid %s, pipes in %s)", self.pid(), self.pipe_dir)
        return self.status

    def check(self) -> MpsStatus:
        """The daemon's state now; a dead one is restarted once its backoff has passed."""
        if self.stopped or self.binary is None:
            return self.status
        if self.running:
            if self.alive():
                self.failures = 0
                return self.status
            self._failed("the MPS daemon died")
        if self.clock() >= self.next_try:
            return self.start()
        return self.status

    def stop(self) -> MpsStatus:
        """Stop the daemon (``quit`` to the control binary) and report ``off``."""
        self.stopped = True
        if self.binary is not None and self.alive():
            code, out = self._control([], stdin="quit\n")
            if code != 0:
                log.warning("MPS daemon: quit exited %s: %s", code, out)
        self.running = False
        self.status = MpsStatus("off", "the node stopped its MPS daemon")
        return self.status


def node_mps(
    mode: str,
    devices: Sequence[DeviceInfo] | None,
    *,
    binary: str = CONTROL_BINARY,
    pipe_dir: str,
    log_dir: str,
    **supervisor: Any,
) -> tuple[MpsStatus, MpsSupervisor | None]:
    """Decide and, where the daemon should run, start it: the node's status and its supervisor
    (``None`` when nothing runs)."""
    path = find_binary(binary)
    final = decide(mode, devices, path)
    if final is not None:
        return final, None
    sup = MpsSupervisor(path, pipe_dir, log_dir, **supervisor)
    return sup.start(), sup
