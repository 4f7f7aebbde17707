"""Sandbox command lines for local sessions: a pure builder, and what the runtime needs.

A local session is a tenant.  :func:`sandbox_command` builds its command line:

- as root (the embedded Hub): ``nsenter`` into the session's own network namespace
  (:mod:`labfleet.spawner.sessionnet`), then bubblewrap, privileged, builds a root of its own, then
  ``setpriv`` runs the session as the unprivileged session account with no capability at all
  (bounding set empty) and ``no_new_privs``, then a second bubblewrap, unprivileged, takes away
  its right to make user namespaces (unless ``user_namespaces``).  The mounts belong to the host's
  user namespace: the session cannot unmount, remount or add one;
- as any other user: bubblewrap in a user namespace of its own, every capability dropped, on the
  host's network (no namespace can be made without root; the README says so).

What the session sees: the system (``/usr``, ``/etc``, ``/sys`` read-only, the ``/bin``-style links),
the runtime it needs read-only (the Python environment, what its installs point to: ``runtime``),
private ``/dev``, ``/proc``, ``/dev/shm``, ``/tmp`` and ``/var/tmp`` (tmpfs of ``tmp_size`` bytes each), its home
read-write, its folders with their mode (in a tmpfs of its own, ``folders_root``), and its devices.  Nothing else of the host: not ``/root``,
not other homes, not ``/run`` (the Docker socket, the network namespaces), not the state directory.
``hidden`` folders and ``hidden_files`` inside the runtime (a state directory inside a checkout) are
covered.  The session command is appended as one shell string (JupyterHub's ``shell_cmd``).
"""

from __future__ import annotations

import ast
import glob
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from .launch import GPUAssignment, Mount

PRIVATE_DIRS = ("/tmp", "/var/tmp")  # private, the session's to write, bounded
SYSTEM_DIRS = ("/usr", "/etc", "/sys")  # read-only, at the same place
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")  # links into /usr, or folders
DEFAULT_TMP_SIZE = 1 << 30
NVIDIA_CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")


@dataclass(frozen=True)
class SandboxSpec:
    """What one session's sandbox holds (plain values; :func:`sandbox_command` turns it into argv)."""

    home: str
    system: tuple[tuple[str, str], ...] = ()  # (path, link target or "" for a folder): system_layout()
    runtime: tuple[str, ...] = ()  # host paths bound read-only at the same place
    hidden: tuple[str, ...] = ()  # folders covered by an empty tmpfs
    hidden_files: tuple[str, ...] = ()  # files that read as empty
    mounts: tuple[Mount, ...] = ()
    # A tmpfs of the session's own holding its folders' mounts (labfleet.spawner.homefolders), read-only
    # once they are in: the session cannot add to it. Empty: none.
    folders_root: str = ""
    writable: tuple[str, ...] = ()  # more host folders bound read-write
    devices: tuple[str, ...] = ()  # device nodes (a GPU's) bound into the private /dev
    tmp_size: int = DEFAULT_TMP_SIZE
    hostname: str = ""
    uid: int | None = None  # the session account: set when the Hub runs as root
    gid: int | None = None
    netns: str | None = None  # the session's network namespace (a path under /run/netns)
    user_namespaces: bool = False  # may the session make user namespaces of its own


def system_layout(root: str = "/") -> tuple[tuple[str, str], ...]:
    """The system folders and links of this machine as :class:`SandboxSpec` takes them."""
    out: list[tuple[str, str]] = []
    for path in (*SYSTEM_DIRS, *SYSTEM_LINKS):
        host = os.path.join(root, path.lstrip("/"))
        if os.path.islink(host):
            out.append((path, os.readlink(host)))
        elif os.path.isdir(host):
            out.append((path, ""))
    return tuple(out)


def gpu_device_nodes(gpus: Iterable[GPUAssignment], dev: str = "/dev") -> tuple[str, ...]:
    """The device nodes of a session's GPUs (``nvidia<index>``) and the driver's control nodes, those
    this machine has: all the session's private /dev holds of its GPUs (no other GPU's node)."""
    gpus = list(gpus)
    if not gpus:
        return ()
    control = [os.path.join(dev, os.path.basename(d)) for d in NVIDIA_CONTROL_DEVICES]
    nodes = [os.path.join(dev, f"nvidia{g.index}") for g in gpus]
    return tuple(d for d in (*control, *nodes) if os.path.exists(d))


def _inside(path: str, folders: Iterable[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def _outermost(paths: Iterable[str]) -> list[str]:
    """Absolute, normalised, deduplicated paths without those inside another one, by depth."""
    clean = sorted({os.path.normpath(p) for p in paths if p.startswith("/") and p != "/"})
    out: list[str] = []
    for p in clean:
        if not _inside(p, out):
            out.append(p)
    return sorted(out, key=lambda p: (p.count("/"), p))


def sandbox_command(
    bwrap: str, spec: SandboxSpec, *, nsenter: str = "nsenter", setpriv: str = "setpriv"
) -> list[str]:
    """``shell_cmd`` for LocalProcessSpawner: the sandbox's argv, ending in ``/bin/sh -c``."""
    args: list[str] = [bwrap]
    # What the sandbox holds so far: (folder, True when its contents come from the host).
    layers: list[tuple[str, bool]] = []

    def layer(d: str) -> tuple[str, bool] | None:
        """The deepest (latest) layer that holds ``d``."""
        best: tuple[str, bool] | None = None
        for path, from_host in layers:
            if _inside(d, [path]) and (best is None or len(path) >= len(best[0])):
                best = (path, from_host)
        return best

    def exists(d: str) -> bool:
        top = layer(d)
        return top is not None and (top[1] or top[0] == d)

    def shown(d: str) -> bool:
        """Whether the sandbox shows the host's ``d`` at this point."""
        top = layer(d)
        return top is not None and top[1]

    def parents(path: str) -> None:
        # bwrap makes missing parents 0700 root: the session account could not cross them.
        parts = path.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/" + "/".join(parts[:i])
            if not exists(d):
                args.extend(["--perms", "0755", "--dir", d])
                layers.append((d, False))

    def bind(option: str, source: str, target: str) -> None:
        parents(target)
        args.extend([option, source, target])
        layers.append((target, True))

    for path, target in spec.system:
        if target:
            args.extend(["--symlink", target, path])
        else:
            bind("--ro-bind", path, path)
    args += ["--dev", "/dev", "--proc", "/proc"]
    for path in ("/dev/shm", *PRIVATE_DIRS):  # shared memory (PyTorch's DataLoader, gunicorn) too
        parents(path)
        args += ["--size", str(spec.tmp_size), "--perms", "1777", "--tmpfs", path]
        layers.append((path, False))
    early = [p for p in _outermost(r for r in spec.runtime if not _inside(r, spec.hidden)) if not shown(p)]
    late = _outermost(r for r in spec.runtime if _inside(r, spec.hidden))
    for path in early:
        bind("--ro-bind", path, path)
    # Covered only where the sandbox would show them; bind sources still come from the host, so the
    # session's own folder under a hidden root is mounted all the same.
    for path in _outermost(spec.hidden):
        if shown(path):
            args += ["--perms", "0755", "--tmpfs", path]
            layers.append((path, False))
    for path in spec.hidden_files:
        if shown(path):
            args += ["--ro-bind", "/dev/null", path]
    for path in late:  # what the runtime needs from inside a hidden folder comes back
        bind("--ro-bind", path, path)
    bind("--bind", spec.home, spec.home)
    for path in spec.writable:
        bind("--bind", path, path)
    if spec.folders_root:
        parents(spec.folders_root)
        args += ["--perms", "0755", "--tmpfs", spec.folders_root]
        layers.append((spec.folders_root, False))
    for m in spec.mounts:
        bind("--ro-bind" if m.read_only else "--bind", m.source, m.target)
    if spec.folders_root:
        args += ["--remount-ro", spec.folders_root]
    for dev in spec.devices:
        args += ["--dev-bind", dev, dev]
    args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if spec.hostname:
        args += ["--hostname", spec.hostname]
    args += ["--chdir", spec.home, "--setenv", "HOME", spec.home]
    if spec.uid is None:
        # Not root: a user namespace of our own, and nothing of what it grants kept.
        return [*args, "--unshare-user", "--cap-drop", "ALL", "--", "/bin/sh", "-c"]
    drop = [
        setpriv,
        f"--reuid={spec.uid}",
        f"--regid={spec.gid if spec.gid is not None else spec.uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
    ]
    prefix = [nsenter, f"--net={spec.netns}"] if spec.netns else []
    # A user namespace of its own would give the session every capability there (over locked
    # mounts, but a large part of the kernel): a second, unprivileged bwrap takes the last one.
    # (--dev-bind: a plain bind is nodev, and /dev/null and the GPUs would be refused.)
    no_userns = [] if spec.user_namespaces else [bwrap, "--dev-bind", "/", "/", "--unshare-user"]
    no_userns += ["--disable-userns", "--cap-drop", "ALL", "--"] if no_userns else []
    return [*prefix, *args, "--", *drop, "--", *no_userns, "/bin/sh", "-c"]


# ---------------------------------------------------------------- where installed packages live

_PTH_IMPORT = re.compile(r"^import[ \t]")
_IMPORTED = re.compile(r"\bimport\s+([A-Za-z_][\w.]*)")


def site_packages_sources(site_packages: str) -> list[str]:
    """The folders outside ``site_packages`` that its installs import from or point to.

    - path lines of ``.pth`` files (as ``site`` reads them: relative to the folder), such as an
      editable install's checkout (hatchling's ``_editable_impl_<name>.pth``);
    - absolute paths in the editable finders that ``.pth`` import lines load (setuptools'
      ``__editable___<name>_finder.py`` MAPPING, hatchling/editables' ``_editable_impl_<name>.py``);
    - ``*.egg-link`` targets (``setup.py develop``) and the source folder of each editable install's
      ``direct_url.json`` (PEP 610).

    Reads those small files only; a missing or unreadable one counts as empty.
    """
    out: list[str] = []
    finders: list[str] = []
    for pth in sorted(glob.glob(os.path.join(glob.escape(site_packages), "*.pth"))):
        for line in _read(pth).splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if _PTH_IMPORT.match(line):
                finders += [m.split(".")[0] for m in _IMPORTED.findall(line)]
                continue
            out.append(os.path.normpath(os.path.join(site_packages, line)))
    for pattern in ("__editable__*finder.py", "_editable_impl_*.py"):
        finders += [
            os.path.basename(f)[:-3] for f in glob.glob(os.path.join(glob.escape(site_packages), pattern))
        ]
    for module in dict.fromkeys(finders):
        out += _absolute_strings(_read(os.path.join(site_packages, module + ".py")))
    for link in sorted(glob.glob(os.path.join(glob.escape(site_packages), "*.egg-link"))):
        first = _read(link).splitlines()[:1]
        if first and first[0].strip():
            out.append(os.path.normpath(os.path.join(site_packages, first[0].strip())))
    for direct in sorted(
        glob.glob(os.path.join(glob.escape(site_packages), "*.dist-info", "direct_url.json"))
    ):
        try:
            info = json.loads(_read(direct) or "{}")
        except ValueError:
            continue
        url = urlparse(str(info.get("url", ""))) if isinstance(info, dict) else None
        dir_info = info.get("dir_info") if isinstance(info, dict) else None
        if url and url.scheme == "file" and isinstance(dir_info, dict) and dir_info.get("editable"):
            out.append(os.path.normpath(unquote(url.path)))
    return list(dict.fromkeys(p for p in out if os.path.isabs(p)))


def link_targets(directory: str, depth: int = 2) -> list[str]:
    """Where the symbolic links in ``directory`` (and its subfolders, ``depth`` levels) point: the
    JupyterLab extensions a development install links into ``share/jupyter/labextensions``."""
    out: list[str] = []
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return out
    for entry in entries:
        if entry.is_symlink():
            out.append(os.path.realpath(entry.path))
        elif depth > 1 and entry.is_dir(follow_symlinks=False):
            out += link_targets(entry.path, depth - 1)
    return out


def environment_sources(prefix: str) -> list[str]:
    """What the Python environment at ``prefix`` (a venv) needs besides its own folder: the sources of
    its site-packages (:func:`site_packages_sources`) and its linked JupyterLab extensions."""
    out: list[str] = []
    for lib in ("lib", "lib64"):
        pattern = os.path.join(glob.escape(prefix), lib, "python*", "site-packages")
        for site_packages in sorted(glob.glob(pattern)):
            out += site_packages_sources(site_packages)
    out += link_targets(os.path.join(prefix, "share", "jupyter", "labextensions"))
    return list(dict.fromkeys(out))


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(1_000_000)
    except OSError:
        return ""


def _absolute_strings(source: str) -> list[str]:
    """The string literals of a Python module that are absolute paths (an editable finder's map)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("/"):
            path = os.path.normpath(node.value)
            # editables maps a package to its __init__.py: the package is the folder.
            out.append(os.path.dirname(path) if os.path.basename(path) == "__init__.py" else path)
    return out
