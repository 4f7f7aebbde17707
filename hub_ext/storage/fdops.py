"""Low-level, fd-relative file system steps for the folder store (labfleet.storage.store).

Nothing here follows a symlink or hands the kernel a whole path: entries are opened relative
to their parent's fd with ``O_NOFOLLOW``, trees are walked and removed holding one directory fd
at a time (however deep a session made them), and a rename can refuse to replace.  Errors are
plain OSErrors; the store turns them into messages that name the user's path.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from collections.abc import Iterator
from typing import Any

from labfleet.core.errors import Conflict

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
O_PATH: int = getattr(os, "O_PATH", 0)
# Re-opening an O_PATH fd through /proc opens exactly the inode that was checked.
PROC_FD = "/proc/self/fd"


def _load_renameat2() -> Any:
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_renameat2 = _load_renameat2()
_RENAME_NOREPLACE = 1


def rename_noreplace(src_fd: int, src: str, dst_fd: int, dst: str) -> None:
    """rename() that raises FileExistsError instead of replacing (atomically where the fs can)."""
    if _renameat2 is not None:
        if _renameat2(src_fd, os.fsencode(src), dst_fd, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        # ENOSYS/EINVAL: no renameat2 or no flag support on this fs -> check, then rename
        if err not in (errno.ENOSYS, errno.EINVAL):
            raise OSError(err, os.strerror(err), dst)
    try:
        os.stat(dst, dir_fd=dst_fd, follow_symlinks=False)
    except FileNotFoundError:
        os.rename(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
    else:
        raise FileExistsError(errno.EEXIST, "File exists", dst)


def ident(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


class NotRegular(Exception):
    def __init__(self, st: os.stat_result) -> None:
        super().__init__()
        self.st = st


def open_regular(dir_fd: int, name: str) -> tuple[int, os.stat_result]:
    """Open dir_fd/name for reading if (and only if) it is a regular file.

    Raises NotRegular (with its lstat) for anything else, symlinks included, without
    ever opening a device or FIFO for I/O (that can block or have side effects).
    """
    if O_PATH and os.path.isdir(PROC_FD):
        pfd = os.open(name, O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            st = os.fstat(pfd)
            if not stat.S_ISREG(st.st_mode):
                raise NotRegular(st)
            fd = os.open(f"{PROC_FD}/{pfd}", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            os.close(pfd)
    else:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(st)
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    fst = os.fstat(fd)
    if not stat.S_ISREG(fst.st_mode) or ident(fst) != ident(st):
        os.close(fd)
        raise NotRegular(fst)  # swapped between the check and the open
    return fd, fst


def iter_tree(top_fd: int, top: str = "") -> Iterator[tuple[int, str, str, os.stat_result]]:
    """Pre-order walk below directory top_fd (which stays open): (dir_fd, path, name, lstat).

    Symlinks are reported, never followed; other file systems are not entered.  Only
    one directory fd is held however deep the tree (a session can make it very deep):
    going back up opens ".." and checks it is the directory we came from.  dir_fd is
    valid until the generator is resumed.
    """
    top_st = os.fstat(top_fd)
    fd = os.dup(top_fd)
    frames: list[tuple[tuple[int, int], list[str], str]] = []
    try:
        frames.append((ident(top_st), sorted(os.listdir(fd), reverse=True), top))
        while frames:
            _, names, here = frames[-1]
            if not names:
                frames.pop()
                if frames:
                    try:
                        up = os.open("..", DIR_FLAGS, dir_fd=fd)
                    except OSError:
                        up = -1  # the directory was removed under us
                    if up < 0 or ident(os.fstat(up)) != frames[-1][0]:
                        if up >= 0:
                            os.close(up)
                        raise Conflict(
                            "the folder changed during the scan (a directory was moved); try again"
                        )
                    os.close(fd)
                    fd = up
                continue
            name = names.pop()
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            path = f"{here}/{name}" if here else name
            yield fd, path, name, st
            if not stat.S_ISDIR(st.st_mode) or st.st_dev != top_st.st_dev:
                continue
            try:
                sub = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue  # gone, or swapped for a symlink/file since the lstat
            try:
                if ident(os.fstat(sub)) != ident(st):
                    raise FileNotFoundError
                subnames = sorted(os.listdir(sub), reverse=True)
            except OSError:
                os.close(sub)
                continue
            os.close(fd)
            fd = sub
            frames.append((ident(st), subnames, path))
    finally:
        os.close(fd)


def tree_size(dir_fd: int, name: str) -> tuple[int, int]:
    """(bytes, regular files) of dir_fd/name, not following symlinks."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISREG(st.st_mode):
        return st.st_size, 1
    if not stat.S_ISDIR(st.st_mode):
        return 0, 0
    size = files = 0
    fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    try:
        for _, _, _, est in iter_tree(fd):
            if stat.S_ISREG(est.st_mode):
                size += est.st_size
                files += 1
    finally:
        os.close(fd)
    return size, files


def _clear_files(fd: int) -> list[str]:
    """Unlink every non-directory in fd; return the names of its subdirectories."""
    subdirs: list[str] = []
    with os.scandir(fd) as it:
        for de in it:
            if de.is_dir(follow_symlinks=False):
                subdirs.append(de.name)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(de.name, dir_fd=fd)
    return subdirs


def rmtree_at(dir_fd: int, name: str) -> None:
    """rm -rf dir_fd/name: never follows symlinks, no recursion, one dir fd at a time.

    shutil.rmtree recurses (Python 3.11) and fails on a tree a session made deep enough,
    which would leave the folder impossible to purge.
    """
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
        return
    fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    try:
        frames = [(ident(os.fstat(fd)), name, _clear_files(fd))]
        while frames:
            subdirs = frames[-1][2]
            if subdirs:
                sub = subdirs.pop()
                try:
                    cfd = os.open(sub, DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    continue
                except OSError as e:
                    if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(sub, dir_fd=fd)  # swapped for a link/file since the scan
                    continue
                os.close(fd)
                fd = cfd
                frames.append((ident(os.fstat(fd)), sub, _clear_files(fd)))
                continue
            _, here, _ = frames.pop()
            if not frames:
                os.rmdir(here, dir_fd=dir_fd)
                break
            up = os.open("..", DIR_FLAGS, dir_fd=fd)
            if ident(os.fstat(up)) != frames[-1][0]:
                os.close(up)
                raise Conflict("the folder changed while it was being removed; try again")
            os.close(fd)
            fd = up
            os.rmdir(here, dir_fd=fd)
    finally:
        os.close(fd)
