"""``git`` for imports, run so that neither a remote server nor a user's files take the service over.

Two kinds of run, both blocking (callers put them on a thread):

- **network runs** (clone, fetch) by the service itself, into a staging directory only the service
  writes: no system or global config, hooks off, no redirects, only ``http``, ``https`` and ``git``,
  the host pinned to the addresses :func:`labfleet.storage.importsafety.check_url` checked (a DNS
  answer that changes in between cannot send git to loopback), no prompt, and a user's token only
  through ``GIT_ASKPASS`` in git's own environment (never in argv or a URL).  Watched for time and
  for the bytes it writes.
- **runs in a user's checkout** (the merge of a re-sync): the checkout is the user's, so is its
  ``.git`` (config, hooks, alternates), which could run commands.  So these run in a bubblewrap
  sandbox with no network, as the folder's owner (the uid a session writes as), seeing only the
  checkout and the staged upstream (read-only) and ``/usr``: whatever the user's config makes git
  do, it does as the user, to the user's own files.

The argv builders are pure; :func:`run_watched` and :func:`run_in_checkout` are the edges.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from labfleet.core.errors import InvalidInput, LabfleetError

GIT = "git"
BWRAP = "bwrap"
SETPRIV = "setpriv"
CHECKOUT = "/import/repo"  # where the user's checkout is inside the sandbox
UPSTREAM = "/import/upstream"  # the staged upstream, read-only inside the sandbox
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
BOT = ("-c", "user.email=import@labfleet.invalid", "-c", "user.name=labfleet import")
OUTPUT_LIMIT = 64 * 1024
# Said by a refusal to the user; the output of git stays in the service's log.
ASKPASS_SCRIPT = """#!/bin/sh
case "$1" in
  Username*|username*) printf '%s\\n' "$LABFLEET_GIT_USERNAME" ;;
  *) printf '%s\\n' "$LABFLEET_GIT_TOKEN" ;;
esac
"""


class ImportFailed(LabfleetError):
    """A fetch that did not work: the message says why, in the user's words."""

    status = 422


class TooLarge(LabfleetError):
    status = 413


class TooSlow(LabfleetError):
    status = 408


@dataclass(frozen=True)
class Pin:
    """``host:port:address`` for curl (git's ``http.curloptResolve``): the name resolves to the
    addresses that were checked, and nothing else."""

    host: str
    port: int
    addresses: tuple[str, ...]

    def option(self) -> str:
        shown = ",".join(f"[{a}]" if ipaddress.ip_address(a).version == 6 else a for a in self.addresses)
        return f"{self.host}:{self.port}:{shown}"


def pin_of(url: str, addresses: Sequence[str]) -> Pin | None:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not addresses:
        return None
    host = (parts.hostname or "").lower()
    try:
        ipaddress.ip_address(host)
        return None  # a literal address needs no pin
    except ValueError:
        pass
    return Pin(host, parts.port or (443 if scheme == "https" else 80), tuple(addresses))


def network_config(pin: Pin | None) -> list[str]:
    """``-c`` options of every network run."""
    out = [
        "-c", "core.hooksPath=/dev/null",
        "-c", "http.followRedirects=false",
        "-c", "protocol.allow=never",
        "-c", "protocol.http.allow=always",
        "-c", "protocol.https.allow=always",
        "-c", "protocol.git.allow=always",
        "-c", "credential.helper=",
        "-c", "core.askPass=",
        "-c", "submodule.recurse=false",
        "-c", "advice.detachedHead=false",
    ]  # fmt: skip
    if pin is not None:
        out += ["-c", f"http.curloptResolve={pin.option()}"]
    return out


def network_env(
    home: str, askpass: str | None = None, credential: tuple[str, str] | None = None
) -> dict[str, str]:
    """The whole environment of a network run (nothing of the service's own)."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "LANG": "C",
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ALLOW_PROTOCOL": "http:https:git",
        "GIT_PROTOCOL_FROM_USER": "0",
    }
    if askpass and credential is not None:
        env.update(GIT_ASKPASS=askpass, LABFLEET_GIT_USERNAME=credential[0], LABFLEET_GIT_TOKEN=credential[1])
    return env


def clone_argv(
    url: str, dest: str, pin: Pin | None, *, bare: bool = False, branch: str | None = None
) -> list[str]:
    args = [GIT, *network_config(pin), "clone", "--no-recurse-submodules", "--quiet"]
    if bare:
        args.append("--bare")
    if branch:
        args += ["--branch", branch]
    return [*args, "--", url, dest]


def sandbox_argv(
    checkout: str,
    upstream: str | None,
    git_args: Sequence[str],
    *,
    uid: int | None,
    gid: int | None,
    root: bool,
) -> list[str]:
    """bwrap around one command in the user's checkout: no network, ``/usr`` and the checkout only.

    As root, bwrap builds the sandbox and ``setpriv`` runs the command as the folder's owner with no
    capability; otherwise bwrap runs in a user namespace of its own with every capability dropped.
    """
    args = [BWRAP, "--ro-bind", "/usr", "/usr"]
    for link in SYSTEM_LINKS:
        target = os.path.realpath(link)
        if target != link and target.startswith("/usr/"):
            args += ["--symlink", target, link]
    args += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--perms", "0755", "--dir", "/import"]
    args += ["--bind", checkout, CHECKOUT]
    if upstream is not None:
        args += ["--ro-bind", upstream, UPSTREAM]
    # Not --unshare-all as root: a user namespace of its own would not map the owner's uid.
    args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--unshare-cgroup-try"]
    args += ["--die-with-parent", "--new-session", "--chdir", CHECKOUT, "--clearenv"]
    for k, v in checkout_env().items():
        args += ["--setenv", k, v]
    if root and uid is not None:
        drop = [
            SETPRIV,
            f"--reuid={uid}",
            f"--regid={gid if gid is not None else uid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
        ]
        return [*args, "--", *drop, "--", *git_args]
    return [*args, "--unshare-user", "--cap-drop", "ALL", "--", *git_args]


def checkout_env() -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": "/tmp",
        "LANG": "C",
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
    }


# ---------------------------------------------------------------- the edges


def tree_bytes(path: str) -> int:
    """Bytes of regular files under ``path`` (links not followed)."""
    total = 0
    for top, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(top, name))
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def _tail(data: bytes, secrets: Sequence[str]) -> str:
    text = data[-OUTPUT_LIMIT:].decode("utf-8", "replace")
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    return text


def run_watched(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    watch: str,
    max_bytes: int,
    timeout: float,
    secrets: Sequence[str] = (),
    cwd: str | None = None,
) -> str:
    """Run a network command; kill it when it has run ``timeout`` seconds or written more than
    ``max_bytes`` (0: no limit) under ``watch``.  Its output (secrets masked), or a refusal."""
    started = time.monotonic()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            list(argv), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        why: LabfleetError | None = None
        try:
            while proc.poll() is None:
                try:
                    proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if time.monotonic() - started > timeout:
                    why = TooSlow(f"the fetch took longer than {int(timeout)} s and was stopped")
                elif max_bytes and os.path.exists(watch) and tree_bytes(watch) > max_bytes:
                    why = TooLarge(
                        f"the fetch passed {max_bytes} bytes, the room left in the folder, and was stopped"
                    )
                if why is not None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    break
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        out.seek(0)
        text = _tail(out.read(), secrets)
    if why is not None:
        raise why
    if proc.returncode != 0:
        raise ImportFailed(explain(text))
    return text


def explain(output: str) -> str:
    """git's complaint in a person's words (the first line that says what went wrong)."""
    low = output.lower()
    if "authentication failed" in low or "could not read username" in low or "401" in low or "403" in low:
        return "the server refused access: a private repository needs your credential for its host"
    if (
        "not found" in low
        or "does not appear to be a git repository" in low
        or "repository" in low
        and "not" in low
    ):
        return "no git repository at that address"
    if "redirect" in low:
        return "the server answered with a redirect: import the address it points to instead"
    if "could not resolve" in low or "couldn't connect" in low or "failed to connect" in low:
        return "the host could not be reached"
    for line in output.splitlines():
        if line.startswith(("fatal:", "error:")):
            return line.split(":", 1)[1].strip()[:300]
    return (output.strip().splitlines() or ["git failed"])[-1][:300]


def run_in_checkout(argv: Sequence[str], fd: int, timeout: float = 300) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of one sandboxed command whose checkout is the directory ``fd`` (bound
    as ``/proc/self/fd/<fd>``: the directory that was opened, whatever its path became); the caller
    judges the code."""
    if shutil.which(BWRAP) is None:
        raise ImportFailed("updating a checkout needs bubblewrap (bwrap) on the service's machine")
    try:
        done = subprocess.run(
            list(argv), stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, pass_fds=(fd,),
            env={"PATH": "/usr/bin:/bin"},
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise TooSlow(f"updating the checkout took longer than {int(timeout)} s") from None
    out, err = (x.decode("utf-8", "replace") for x in (done.stdout, done.stderr))
    return done.returncode, out, err[-OUTPUT_LIMIT:]


def write_askpass(directory: str) -> str:
    """The askpass script in a directory only the service reads (0700), executable."""
    path = os.path.join(directory, "askpass")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700)
    with os.fdopen(fd, "w") as f:
        f.write(ASKPASS_SCRIPT)
    return path


def chown_tree(path: str, uid: int, gid: int) -> None:
    """Give what a network run wrote (in staging, the service's own) to the folder's owner."""
    for top, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(top, name), uid, gid)
    os.lchown(path, uid, gid)


def check_branch(value: object) -> str | None:
    """A branch or tag name a user gives (``None``: the repository's default)."""
    if value is None or value == "":
        return None
    if (
        not isinstance(value, str)
        or len(value) > 200
        or value.startswith("-")
        or any(c.isspace() or ord(c) < 32 or c in "~^:?*[\\" for c in value)
        or ".." in value
    ):
        raise InvalidInput("branch must be a branch or tag name of the repository")
    return value
