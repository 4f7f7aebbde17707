"""``~/vfolders`` as the link to the session's folder root, made by the session when its server starts.

The Docker and Swarm backends mount a session's virtual folders at ``/vfolders/<name>`` (a small
root-owned tmpfs of the container's), never inside the home, and say so in the environment:
``LABFLEET_FOLDERS_ROOT`` (the root) and ``LABFLEET_FOLDERS_TIDY`` (``1`` when no other server of
the user runs, so an old ``~/vfolders`` may be cleared).  A home that the user's sessions share
(a volume per user) then shows each session its own folders through one link, and holds no
mount point of another session's (:mod:`labfleet.spawner.homefolders`, which does the work).

What was moved aside in the home, and why ``~/vfolders`` could not be linked, is written to the
server's stderr, which the backend keeps in the session's log.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TextIO

from labfleet.spawner.homefolders import FOLDERS_ROOT_ENV, FOLDERS_TIDY_ENV, Tidied, link_folders
from labfleet.spawner.launch import VFOLDERS_DIR

FOLDER_DIR_ENV = "LABFLEET_VFOLDER_DIR"  # <home>/vfolders, where the file browser shows the folders


def folders_home(environ: Mapping[str, str]) -> str:
    """The home that holds the ``vfolders`` link: the parent of ``$LABFLEET_VFOLDER_DIR`` (the
    spawner's ``<container_home>/vfolders``), else ``$HOME``."""
    where = environ.get(FOLDER_DIR_ENV, "")
    if where.startswith("/") and os.path.basename(where.rstrip("/")) == VFOLDERS_DIR:
        return os.path.dirname(where.rstrip("/"))
    return environ.get("HOME") or os.path.expanduser("~")


def notes(tidied: Tidied, root: str) -> list[str]:
    """What a person should know of :func:`link_folders`' work, one line each."""
    out = [f"moved aside in the home: {line}" for line in tidied.moved]
    if tidied.left:
        out.append(f"{tidied.left}; the session's folders are at {root}/<name>")
    return out


def link_home_folders(environ: Mapping[str, str] | None = None, err: TextIO | None = None) -> Tidied | None:
    """Link ``~/vfolders`` to ``$LABFLEET_FOLDERS_ROOT`` when the spawner set it (None otherwise:
    the backend mounts the folders in the home itself, or this is no labfleet session); what was
    moved aside or left is written to ``err`` (stderr). Never raises for the home's state."""
    environ = os.environ if environ is None else environ
    err = sys.stderr if err is None else err
    root = environ.get(FOLDERS_ROOT_ENV, "")
    if not root.startswith("/"):
        return None
    home = folders_home(environ)
    try:
        tidied = link_folders(home, root, tidy=environ.get(FOLDERS_TIDY_ENV) == "1")
    except OSError as e:  # no home, a home the session may not write, ...
        tidied = Tidied(left=f"{home}/{VFOLDERS_DIR} could not be linked: {e.strerror or e}")
    for line in notes(tidied, root):
        print(f"labfleet: {line} (in {home})", file=err, flush=True)
    return tidied
