"""``python -m labfleet.console``: the admin console's server (``jupyterhub-singleuser`` with the
console's config), which stops when the Hub that started it dies, as the labfleet service does: a
console left behind by a killed Hub would keep its port, and the next Hub could not start it.

Its Jupyter runtime directory ($JUPYTER_RUNTIME_DIR, which the Hub sets to ``admin-runtime`` in
the state directory) holds the dashboards' kernels' connection files (their HMAC keys) and their
ZeroMQ unix sockets (``KernelManager.transport = "ipc"``, jupyter_server_config.py): it is made
private here, before the server starts, so only the console's own user reaches a kernel."""

import hashlib
import os
import stat
import sys
import tempfile

from jupyterhub.singleuser import main

from labfleet.service.app import exit_with_parent_signal

# A unix socket's path has at most 107 bytes; a kernel's are "<dir>/kernel-<uuid>-ipc-<n>".
MAX_SOCKET_PATH = 107
SOCKET_NAME_LEN = len("/kernel-00000000-0000-0000-0000-000000000000-ipc-99")
STALE_PREFIXES = ("kernel-", "jpserver-")  # what an earlier console of this directory left behind


def _made_private(path: str) -> bool:
    """``path`` is (now) a directory of this user's, mode 0700, not a link, cleared of an earlier
    console's kernel files and sockets; False where it cannot be (someone else's, not a directory)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        return False
    os.chmod(path, 0o700)
    for name in os.listdir(path):
        if name.startswith(STALE_PREFIXES):
            try:
                os.unlink(os.path.join(path, name))
            except OSError:
                pass
    return True


def private_runtime_dir(wanted: str | None) -> str:
    """The console's runtime directory: ``wanted`` made private (:func:`_made_private`). Where it is
    too long a path for the kernels' sockets: a short one in the temporary directory, the same for
    the same ``wanted`` (no leftovers pile up), private too; failing that, a fresh one."""
    if wanted:
        wanted = os.path.abspath(wanted)
        if len(wanted) + SOCKET_NAME_LEN <= MAX_SOCKET_PATH and _made_private(wanted):
            return wanted
        digest = hashlib.sha256(wanted.encode()).hexdigest()[:12]
        short = os.path.join(tempfile.gettempdir(), f"lfadmin-{os.geteuid()}-{digest}")
        if len(short) + SOCKET_NAME_LEN <= MAX_SOCKET_PATH and _made_private(short):
            print(f"labfleet-admin: runtime directory {short} ({wanted} cannot serve)", file=sys.stderr)
            return short
    return tempfile.mkdtemp(prefix="lfadmin-")  # 0700, ours


if __name__ == "__main__":
    exit_with_parent_signal()
    os.environ["JUPYTER_RUNTIME_DIR"] = private_runtime_dir(os.environ.get("JUPYTER_RUNTIME_DIR"))
    sys.exit(main())
