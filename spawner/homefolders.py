"""``~/vfolders`` in a home that a user's sessions share: a link, never a mount point.

A sandboxed local session mounts its folders at :data:`FOLDERS_ROOT`, a tmpfs of its own that the
session cannot add to (:mod:`labfleet.spawner.sandbox`), and its home holds one link,
``vfolders -> /vfolders``.  Each session resolves the link in its own sandbox, so it sees its own
folders and no other session's: a folder mounted in one session never shows up as an empty,
writable directory in another, where a file written would stay in the home and never reach the
folder (a "split" folder).  Nothing is created on the host for a mount, so nothing is left behind.

The home is the user's: whatever is there may change under us, from a running session.  Every
step works on directory descriptors opened without following links (``O_NOFOLLOW``), so a link the
user planted is moved like any file and never followed by the Hub (which may be root).  Nothing is
deleted but empty directories (the old mount points) and the link this module made; anything
else found in the old ``~/vfolders`` is moved aside to ``~/vfolders-moved-aside-<time>/`` and
reported.

Docker and Swarm sessions mount their folders at :data:`FOLDERS_ROOT` too (a small root-owned
tmpfs of the container's) and make the link themselves when their server starts
(``labfleet.session.homelink``, told by :data:`FOLDERS_ROOT_ENV` and :data:`FOLDERS_TIDY_ENV`).
There this module runs as the session's unprivileged user, and an old ``~/vfolders`` that Docker
made in a shared home volume holds mount points owned by root (``vfolders`` itself too), which
that user cannot remove: the whole ``~/vfolders`` is then renamed aside in the home (a rename in
the same directory needs no write permission on the directory moved) and reported.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from dataclasses import dataclass, field

from .launch import VFOLDERS_DIR

FOLDERS_ROOT = "/vfolders"  # inside a session: its folders' mounts, and nothing else
ASIDE_PREFIX = "vfolders-moved-aside-"
# Set by the Docker and Swarm backends, read by the session's server extension (labfleet.session.homelink):
FOLDERS_ROOT_ENV = "LABFLEET_FOLDERS_ROOT"  # where the session's folders are mounted: link ~/vfolders there
FOLDERS_TIDY_ENV = "LABFLEET_FOLDERS_TIDY"  # "1": no other server of the user runs, an old ~/vfolders may go


@dataclass
class Tidied:
    """What :func:`link_folders` did to a home."""

    linked: bool = False  # <home>/vfolders is the link now
    removed: int = 0  # empty directories removed (old mount points)
    moved: list[str] = field(default_factory=list)  # "old path -> new path", relative to the home
    left: str = ""  # why the link could not be made, when it was not


def _open_dir(name: str, dir_fd: int | None = None) -> int:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(name, flags, dir_fd=dir_fd)


def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


class _Aside:
    """``~/vfolders-moved-aside-<time>/``, made on first use and owned like the home."""

    def __init__(self, home_fd: int, when: float) -> None:
        self.home_fd = home_fd
        self.stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(when))
        self.name = ""
        self.fd: int | None = None
        self.moved = 0  # entries moved into it

    def open(self) -> int:
        if self.fd is None:
            owner = os.fstat(self.home_fd)
            for n in range(100):
                name = ASIDE_PREFIX + self.stamp + (f"-{n}" if n else "")
                try:
                    os.mkdir(name, 0o700, dir_fd=self.home_fd)  # never follows: EEXIST on a link
                except FileExistsError:
                    continue
                self.fd = _open_dir(name, self.home_fd)
                os.fchown(self.fd, owner.st_uid, owner.st_gid)
                self.name = name
                break
            else:
                raise OSError(errno.EEXIST, "no free name to move the old folders' leftovers aside")
        return self.fd

    def move(self, name: str, from_fd: int, shown: str, out: Tidied) -> None:
        os.rename(name, name, src_dir_fd=from_fd, dst_dir_fd=self.open())
        self.moved += 1
        out.moved.append(f"{shown} -> {self.name}/{name}")

    def rename_whole(self, out: Tidied) -> None:
        """``~/vfolders`` itself, renamed to ``~/vfolders-moved-aside-<time>[-n]`` beside it.

        For an old ``~/vfolders`` the caller may not change (root's mount points, made by Docker in
        a shared home): renaming a directory within its parent needs write permission on the
        parent only, where moving it into another directory would need it on the directory too
        (its ``..`` changes).  The name is taken first with an empty directory of ours, which the
        rename then replaces: nothing of the user's is ever replaced (a rename onto a directory
        that is not empty fails)."""
        if self.fd is not None and not self.moved:
            # Made for a first move that failed: still empty, and ours; the rename takes its name.
            os.close(self.fd)
            self.fd = None
            try:
                os.rename(VFOLDERS_DIR, self.name, src_dir_fd=self.home_fd, dst_dir_fd=self.home_fd)
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):  # else something was put there meanwhile
                    os.rmdir(self.name, dir_fd=self.home_fd)  # still our empty one
                    raise
            else:
                out.moved.append(f"{VFOLDERS_DIR} -> {self.name}")
                return
        for n in range(100):
            name = ASIDE_PREFIX + self.stamp + (f"-{n}" if n else "")
            try:
                os.mkdir(name, 0o700, dir_fd=self.home_fd)
            except FileExistsError:
                continue
            try:
                os.rename(VFOLDERS_DIR, name, src_dir_fd=self.home_fd, dst_dir_fd=self.home_fd)
            except OSError:
                os.rmdir(name, dir_fd=self.home_fd)  # still our empty one
                raise
            out.moved.append(f"{VFOLDERS_DIR} -> {name}")
            return
        raise OSError(errno.EEXIST, "no free name to move the old folders aside")

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


def link_folders(
    home: str, root: str = FOLDERS_ROOT, *, tidy: bool = True, now: float | None = None
) -> Tidied:
    """Make ``<home>/vfolders`` the link to ``root``.

    ``tidy``: clear what is in the way first (old mount points, a link or a file of the user's);
    leave it off while another session of the user runs, since an old mount point may still be in
    use (removing it would unmount it there).  Then a ``vfolders`` that is in the way is left as
    it is and :attr:`Tidied.left` says so.
    """
    out = Tidied()
    home_fd = _open_dir(home)
    aside = _Aside(home_fd, time.time() if now is None else now)
    try:
        st = _lstat(VFOLDERS_DIR, home_fd)
        if st is not None and stat.S_ISLNK(st.st_mode) and os.readlink(VFOLDERS_DIR, dir_fd=home_fd) == root:
            out.linked = True
            return out
        if st is not None and not tidy:
            out.left = f"~/{VFOLDERS_DIR} is in the way and another session of the user is running"
            return out
        try:
            if st is not None and stat.S_ISDIR(st.st_mode):
                try:
                    _clear(home_fd, aside, out)
                    os.rmdir(VFOLDERS_DIR, dir_fd=home_fd)
                except PermissionError:  # EACCES, EPERM: e.g. root's mount points, made by Docker
                    aside.rename_whole(out)
            elif st is not None:  # a file or a link of the user's own: moved as it is, never followed
                aside.move(VFOLDERS_DIR, home_fd, VFOLDERS_DIR, out)
        except OSError as e:  # busy (a mount on the host), or changed under us: left for next time
            out.left = f"~/{VFOLDERS_DIR} could not be cleared: {os.strerror(e.errno or 0)}"
            return out
        os.symlink(root, VFOLDERS_DIR, dir_fd=home_fd)
        out.linked = True
        return out
    finally:
        aside.close()
        os.close(home_fd)


def _clear(home_fd: int, aside: _Aside, out: Tidied) -> None:
    """Empty the old ``~/vfolders``: its empty directories removed, anything else moved aside."""
    folders_fd = _open_dir(VFOLDERS_DIR, home_fd)
    try:
        for name in sorted(os.listdir(folders_fd)):
            entry = _lstat(name, folders_fd)
            if entry is not None and stat.S_ISDIR(entry.st_mode):
                try:
                    os.rmdir(name, dir_fd=folders_fd)  # only an empty one
                    out.removed += 1
                    continue
                except OSError as e:
                    if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                        raise
            aside.move(name, folders_fd, f"{VFOLDERS_DIR}/{name}", out)
    finally:
        os.close(folders_fd)


def unlink_folders(home: str, root: str = FOLDERS_ROOT) -> bool:
    """Remove ``<home>/vfolders`` if it is the link :func:`link_folders` made (the user's last
    session stopped); anything else there stays. Whether it was removed."""
    try:
        home_fd = _open_dir(home)
    except FileNotFoundError:
        return False
    try:
        st = _lstat(VFOLDERS_DIR, home_fd)
        if st is None or not stat.S_ISLNK(st.st_mode) or os.readlink(VFOLDERS_DIR, dir_fd=home_fd) != root:
            return False
        os.unlink(VFOLDERS_DIR, dir_fd=home_fd)
        return True
    finally:
        os.close(home_fd)
