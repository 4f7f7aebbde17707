"""bubblewrap command lines for local sessions: a pure builder, and what it must show again.

The sandbox sees the host read-only, gets a private /tmp and /dev, its own /proc and PID
namespace, and writes only its home, the extra writable folders and its rw/wd mounts; ro
mounts are bound read-only, and ``hidden`` folders (a storage root) are not seen at all.  The
host network stays (the proxy reaches the server on 127.0.0.1).  The session command is
appended as one shell string (JupyterHub's ``shell_cmd``).

The private /tmp also hides what the session's Python needs when it lives under /tmp: a venv, and
the checkout an editable install points to (a clone under /tmp).  :func:`environment_sources`
finds where an environment's packages really live (its ``.pth`` files, editable finders, the links
of its JupyterLab extensions; it only reads those files) and :func:`under_private_tmp` keeps what
the private /tmp would hide, for ``bwrap_command(readonly=...)``.
"""

from __future__ import annotations

import ast
import glob
import json
import os
import re
from collections.abc import Iterable
from urllib.parse import unquote, urlparse

from .launch import Mount

PRIVATE_DIRS = ("/tmp", "/var/tmp")


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
    # The private /tmp hides what lives under it (a venv or a checkout in /tmp): show those again,
    # before hiding, so that what is hidden inside them (a state dir in a checkout) stays hidden.
    for path in readonly:
        args += ["--ro-bind", path, path]
    # Covered by an empty tmpfs; bind sources still come from the host, so a session's own folder
    # under a hidden root is mounted all the same.
    for path in hidden:
        args += ["--tmpfs", path]
    # Files (the Hub's secrets and DBs) read as empty.
    for path in hidden_files:
        args += ["--ro-bind", "/dev/null", path]
    args += ["--bind", home, home]
    for path in writable:
        args += ["--bind", path, path]
    for m in mounts:
        args += ["--ro-bind" if m.read_only else "--bind", m.source, m.target]
    args += ["--chdir", home, "--setenv", "HOME", home, "--", "/bin/sh", "-c"]
    return args


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


def under_private_tmp(paths: Iterable[str], private: Iterable[str] = PRIVATE_DIRS) -> list[str]:
    """The existing folders (or files) among ``paths``, resolved, that the sandbox's private /tmp
    would hide, without those inside another one (binding a folder shows what is in it)."""
    roots = tuple(p.rstrip("/") + "/" for p in private)
    out: list[str] = []
    for path in paths:
        real = os.path.realpath(path)
        if real.startswith(roots) and os.path.exists(real) and real not in out:
            out.append(real)
    return [p for p in out if not any(p != q and p.startswith(q + "/") for q in out)]


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
