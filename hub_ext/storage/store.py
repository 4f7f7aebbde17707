"""Filesystem layer of virtual folders: browse, upload, move, trash and tar one folder.

One folder lives in ``<root>`` (``<host path>/<folder id>``)::

    data/      the user's files; bind-mounted into sessions
    trash/     <trash id>/payload + <trash id>/meta.json for deleted entries
    uploads/   in-progress upload temp files, named by upload id

Sessions can put symlinks (pointing anywhere) and other odd entries into ``data/`` at
any time, including while a call here runs.  So paths are never handed to the kernel
whole: every component is opened with ``O_NOFOLLOW`` relative to the fd of its parent,
and symlinks are resolved here, lexically, against the folder's own tree.  A link whose
target stays inside ``data/`` is followed; one that leaves it is refused.  Only the
folder's own dirs (``data``, ``trash``, ``uploads``) are opened by path.

Plain synchronous functions, no database: the service runs the heavy ones in a thread.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import stat
import tarfile
import time
import uuid
from collections.abc import Generator, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from labfleet.core.errors import Conflict, Forbidden, InvalidInput, LabfleetError, NotFound
from labfleet.storage.fdops import (
    DIR_FLAGS,
    NotRegular,
    iter_tree,
    open_regular,
    rename_noreplace,
    rmtree_at,
    tree_size,
)

MAX_COMPONENT_BYTES = 255
MAX_PATH_BYTES = 4096
# Like the kernel's limit: stops link loops (a -> b -> a) without refusing sane chains.
MAX_SYMLINKS = 40

DIR_MODE = 0o775
FILE_MODE = 0o664

_UPLOAD_ID_RE = re.compile(r"[0-9a-f]{32}")
_TRASH_ID_RE = re.compile(r"[0-9a-f]{32}")


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _parse_iso(value: str) -> float:
    if value.endswith("Z"):
        value = value[:-1] + "+00:00"
    dt = datetime.fromisoformat(value)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


# ---------------------------------------------------------------------------- paths


def check_relpath(path: str, *, allow_root: bool = True) -> str:
    """Normalise a user-given path inside a folder; "" is the folder root.

    Empty and "." components are dropped ("a//b/./c/" -> "a/b/c").  Refused: non-str,
    NUL, text that is not encodable as UTF-8, absolute paths, "..", over-long names.
    """
    if not isinstance(path, str):
        raise InvalidInput("path must be a string")
    if "\x00" in path:
        raise InvalidInput("path contains a NUL character")
    try:
        raw = path.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput("path is not valid Unicode text (lone surrogate)") from None
    if len(raw) > MAX_PATH_BYTES:
        raise InvalidInput(f"path is longer than {MAX_PATH_BYTES} bytes")
    if path.startswith("/"):
        raise InvalidInput("path must be relative to the folder, not absolute")
    parts: list[str] = []
    for comp in path.split("/"):
        if comp in ("", "."):
            continue
        if comp == "..":
            raise InvalidInput("path must not contain '..'")
        if len(comp.encode("utf-8")) > MAX_COMPONENT_BYTES:
            raise InvalidInput(f"path component longer than {MAX_COMPONENT_BYTES} bytes: {comp[:32]!r}...")
        parts.append(comp)
    if not parts and not allow_root:
        raise InvalidInput("path must name an entry inside the folder, not the folder itself")
    return "/".join(parts)


def _split(rel: str) -> list[str]:
    return rel.split("/") if rel else []


def _join(*parts: str) -> str:
    return "/".join(p for p in parts if p)


def _where(rel: str, real: list[str], name: str) -> str:
    """Message prefix naming the failing component when it is not rel itself."""
    here = _join(*real, name)
    return f"{rel}: " if here == rel else f"{rel}: {here} "


def _check_id(value: str, what: str) -> str:
    if not isinstance(value, str) or not (_UPLOAD_ID_RE if what == "upload" else _TRASH_ID_RE).fullmatch(
        value
    ):
        raise InvalidInput(f"invalid {what} id (expected 32 lowercase hex digits)")
    return value


# ---------------------------------------------------------------------------- records


class Entry(NamedTuple):
    name: str
    path: str  # relative to data/, as the caller named it (normalised)
    type: str  # "file" | "dir" | "symlink" | "other"
    size: int
    mtime: float
    mode: int  # permission bits (stat.S_IMODE of the lstat mode)


class TrashEntry(NamedTuple):
    id: str
    path: str
    type: str
    size: int
    files: int
    deleted_at: str
    deleted_by: str


class Usage(NamedTuple):
    bytes: int
    files: int
    trash_bytes: int
    trash_files: int


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def _entry(name: str, path: str, st: os.stat_result) -> Entry:
    return Entry(name, path, _kind(st.st_mode), st.st_size, st.st_mtime, stat.S_IMODE(st.st_mode))


# ---------------------------------------------------------------------------- errors


@contextlib.contextmanager
def _translate(what: str) -> Iterator[None]:
    """OS errors -> labfleet errors that name the user's path (never a host path)."""
    try:
        yield
    except LabfleetError:
        raise
    except FileNotFoundError:
        raise NotFound(f"{what or '/'}: no such file or directory") from None
    except FileExistsError:
        raise Conflict(f"{what}: already exists") from None
    except NotADirectoryError:
        raise InvalidInput(f"{what}: not a directory") from None
    except IsADirectoryError:
        raise InvalidInput(f"{what}: is a directory") from None
    except PermissionError:
        raise Forbidden(f"{what or '/'}: permission denied on the storage host") from None
    except OSError as e:
        if e.errno == errno.ENOTEMPTY:
            raise Conflict(f"{what}: directory not empty") from None
        if e.errno == errno.ELOOP:
            raise InvalidInput(f"{what}: too many levels of symbolic links") from None
        if e.errno == errno.ENAMETOOLONG:
            raise InvalidInput(f"{what}: name too long") from None
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise LabfleetError("no space left on the folder's storage", 507) from None
        if e.errno == errno.EINVAL:
            raise InvalidInput(f"{what}: invalid operation (e.g. moving a directory into itself)") from None
        raise


# ---------------------------------------------------------------------------- the store


class FolderStore:
    """The files of one virtual folder on this storage host."""

    def __init__(self, root: str | os.PathLike[str], *, owner: tuple[int, int] | None = None) -> None:
        self.root = Path(os.fspath(root))
        self.owner = owner
        self._data_real: str | None = None

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def trash_dir(self) -> Path:
        return self.root / "trash"

    @property
    def uploads_dir(self) -> Path:
        return self.root / "uploads"

    # -- setup

    def create(self) -> None:
        """Make root, data/, trash/ and uploads/ (idempotent)."""
        self.root.parent.mkdir(parents=True, exist_ok=True)
        for d in (self.root, self.data_dir, self.trash_dir, self.uploads_dir):
            try:
                os.mkdir(d, DIR_MODE)
            except FileExistsError:
                if not d.is_dir() or d.is_symlink():
                    raise Conflict(f"folder storage is broken: {d.name} is not a directory") from None
                continue
            fd = os.open(d, DIR_FLAGS)
            try:
                self._own(fd, DIR_MODE)
            finally:
                os.close(fd)

    def exists(self) -> bool:
        return self.data_dir.is_dir() and not self.data_dir.is_symlink()

    def destroy(self) -> None:
        """rm -rf the whole folder (symlinks are removed, never what they point to)."""
        try:
            pfd = os.open(self.root.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            rmtree_at(pfd, self.root.name)
        finally:
            os.close(pfd)

    # -- internals

    def _own(self, fd: int, mode: int) -> None:
        # exact modes (no umask) and the session's uid, so the session can change what we made
        os.fchmod(fd, mode)
        if self.owner is not None and os.geteuid() == 0:
            os.fchown(fd, *self.owner)

    def _open_top(self, d: Path) -> int:
        try:
            return os.open(d, DIR_FLAGS)
        except FileNotFoundError:
            raise NotFound("the folder's storage does not exist") from None

    def _link_parts(self, rel: str, link: str, real: list[str], target: str) -> list[str]:
        """Data-relative components a symlink at real/link points to; refuses the outside."""
        if target.startswith("/"):
            if self._data_real is None:
                self._data_real = os.path.realpath(self.data_dir)
            base = self._data_real
            if target != base and not target.startswith(base + "/"):
                raise InvalidInput(f"{rel}: symbolic link {_join(*real, link)!r} points outside the folder")
            return _split(target[len(base) :].strip("/"))
        return [*real, *target.split("/")]

    def _walk(self, rel: str, comps: list[str], *, create: bool = False) -> tuple[int, list[str]]:
        """Open the directory data/<comps>: (fd, its real data-relative components).

        Symlinks on the way are resolved here (".." lexically against the real path) and
        followed only while they stay inside data/; with create, missing dirs are made.
        """
        fds = [self._open_top(self.data_dir)]
        real: list[str] = []
        todo = list(reversed(comps))
        links = 0
        try:
            while todo:
                name = todo.pop()
                if name in ("", "."):
                    continue
                if name == "..":
                    if not real:
                        raise InvalidInput(f"{rel}: a symbolic link on the way points outside the folder")
                    os.close(fds.pop())
                    real.pop()
                    continue
                try:
                    fd = os.open(name, DIR_FLAGS, dir_fd=fds[-1])
                except FileNotFoundError:
                    if not create:
                        raise NotFound(f"{_where(rel, real, name)}does not exist") from None
                    with contextlib.suppress(FileExistsError):
                        self._mkdir_at(fds[-1], name)
                    fd = os.open(name, DIR_FLAGS, dir_fd=fds[-1])
                except OSError as e:
                    if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    st = os.stat(name, dir_fd=fds[-1], follow_symlinks=False)
                    if not stat.S_ISLNK(st.st_mode) and not stat.S_ISDIR(st.st_mode):
                        raise InvalidInput(f"{_where(rel, real, name)}not a directory") from None
                    # a link, or a dir again (swapped under us): either way bounded by the count
                    links += 1
                    if links > MAX_SYMLINKS:
                        raise InvalidInput(f"{rel}: too many levels of symbolic links") from None
                    if stat.S_ISDIR(st.st_mode):
                        todo.append(name)
                        continue
                    try:
                        target = os.readlink(name, dir_fd=fds[-1])
                    except OSError as le:
                        if le.errno != errno.EINVAL:
                            raise
                        todo.append(name)  # swapped back to a non-link since the lstat: look again
                        continue
                    parts = self._link_parts(rel, name, real, target)
                    # restart from data/ along the link's (real) target path
                    for f in fds[1:]:
                        os.close(f)
                    del fds[1:]
                    real = []
                    todo.extend(reversed(parts))
                    continue
                fds.append(fd)
                real.append(name)
            return fds.pop(), real
        finally:
            for f in fds:
                os.close(f)

    def _parent(self, rel: str, *, create: bool = False) -> tuple[int, list[str], str]:
        """(fd of the parent dir, its real components, last name) for a non-root rel."""
        comps = _split(rel)
        fd, real = self._walk(rel, comps[:-1], create=create)
        return fd, real, comps[-1]

    def _mkdir_at(self, dir_fd: int, name: str) -> None:
        os.mkdir(name, DIR_MODE, dir_fd=dir_fd)
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)  # O_NOFOLLOW: a swapped-in link fails here
        try:
            self._own(fd, DIR_MODE)
        finally:
            os.close(fd)

    def _open_file(self, rel: str) -> tuple[int, os.stat_result]:
        """Open data/<rel> for reading, following symlinks that stay inside data/."""
        comps = _split(rel)
        for _ in range(MAX_SYMLINKS + 1):
            if not comps or comps[-1] in ("", ".", ".."):
                # a link to a directory (e.g. "..") is still checked for escaping first
                os.close(self._walk(rel, comps)[0])
                raise InvalidInput(f"{rel}: is a directory")
            fd, real = self._walk(rel, comps[:-1])
            try:
                return open_regular(fd, comps[-1])
            except NotRegular as e:
                if stat.S_ISDIR(e.st.st_mode):
                    raise InvalidInput(f"{rel}: is a directory") from None
                if not stat.S_ISLNK(e.st.st_mode):
                    raise InvalidInput(f"{rel}: not a regular file") from None
                try:
                    target = os.readlink(comps[-1], dir_fd=fd)
                except OSError as oe:
                    if oe.errno != errno.EINVAL:
                        raise
                    continue  # no longer a link: look again
                comps = self._link_parts(rel, comps[-1], real, target)
            finally:
                os.close(fd)
        raise InvalidInput(f"{rel}: too many levels of symbolic links")

    def _open_dir(self, rel: str) -> tuple[int, list[str]]:
        return self._walk(rel, _split(rel))

    def _open_trash_item(self, trash_id: str) -> int:
        tfd = self._open_top(self.trash_dir)
        try:
            return os.open(trash_id, DIR_FLAGS, dir_fd=tfd)
        except FileNotFoundError:
            raise NotFound(f"no trash entry {trash_id}") from None
        finally:
            os.close(tfd)

    def _read_meta(self, item_fd: int) -> dict[str, Any]:
        fd = os.open("meta.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=item_fd)
        with os.fdopen(fd, "rb") as f:
            meta = json.loads(f.read(1 << 20))
        if not isinstance(meta, dict):
            raise ValueError("meta.json is not an object")
        return meta

    # -- reading

    def stat(self, rel: str) -> Entry:
        """lstat of one entry (a symlink is reported as itself)."""
        rel = check_relpath(rel)
        with _translate(rel):
            if not rel:
                fd = self._open_top(self.data_dir)
                try:
                    return _entry("", "", os.fstat(fd))
                finally:
                    os.close(fd)
            fd, _, name = self._parent(rel)
            try:
                return _entry(name, rel, os.stat(name, dir_fd=fd, follow_symlinks=False))
            finally:
                os.close(fd)

    def list_dir(self, rel: str = "") -> list[Entry]:
        """Entries of a directory, sorted by name (a link to a dir inside is listed through)."""
        rel = check_relpath(rel)
        with _translate(rel):
            fd, _ = self._open_dir(rel)
            try:
                out: list[Entry] = []
                with os.scandir(fd) as it:
                    for de in it:
                        try:
                            st = de.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        out.append(_entry(de.name, _join(rel, de.name), st))
            finally:
                os.close(fd)
        out.sort(key=lambda e: e.name)
        return out

    def open_read(self, rel: str) -> tuple[BinaryIO, os.stat_result]:
        """A regular file opened for reading, with its fstat."""
        rel = check_relpath(rel, allow_root=False)
        with _translate(rel):
            fd, st = self._open_file(rel)
            return os.fdopen(fd, "rb"), st

    # -- changing

    def mkdir(self, rel: str, *, parents: bool = False) -> Entry:
        rel = check_relpath(rel, allow_root=False)
        with _translate(rel):
            fd, real, name = self._parent(rel, create=parents)
            try:
                try:
                    self._mkdir_at(fd, name)
                except FileExistsError:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if parents and stat.S_ISDIR(st.st_mode):
                        return _entry(name, rel, st)
                    raise Conflict(f"{rel}: already exists") from None
                return _entry(name, rel, os.stat(name, dir_fd=fd, follow_symlinks=False))
            finally:
                os.close(fd)

    def move(self, src: str, dst: str, *, overwrite: bool = False) -> Entry:
        """Rename within data/ (a symlink is moved as itself)."""
        src = check_relpath(src, allow_root=False)
        dst = check_relpath(dst, allow_root=False)
        with _translate(src):
            sfd, sreal, sname = self._parent(src)
        try:
            with _translate(dst):
                dfd, dreal, dname = self._parent(dst)
            try:
                with _translate(src):
                    sst = os.stat(sname, dir_fd=sfd, follow_symlinks=False)
                spath, dpath = [*sreal, sname], [*dreal, dname]
                if spath == dpath:
                    return _entry(dname, dst, sst)
                if stat.S_ISDIR(sst.st_mode) and dpath[: len(spath)] == spath:
                    raise InvalidInput(f"cannot move {src} into itself ({dst})")
                with _translate(dst):
                    if not overwrite:
                        try:
                            rename_noreplace(sfd, sname, dfd, dname)
                        except FileExistsError:
                            raise Conflict(f"{dst}: already exists") from None
                    else:
                        try:
                            dst_st = os.stat(dname, dir_fd=dfd, follow_symlinks=False)
                        except FileNotFoundError:
                            pass
                        else:
                            if stat.S_ISDIR(dst_st.st_mode) != stat.S_ISDIR(sst.st_mode):
                                kind = "a directory" if stat.S_ISDIR(dst_st.st_mode) else "not a directory"
                                raise Conflict(f"{dst}: already exists and is {kind}")
                        os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
                    return _entry(dname, dst, os.stat(dname, dir_fd=dfd, follow_symlinks=False))
            finally:
                os.close(dfd)
        finally:
            os.close(sfd)

    def place(self, src_fd: int, src_name: str, rel: str) -> bool:
        """Move ``src_name`` (a file or a tree the service staged, its owner set already) from the
        directory ``src_fd`` to data/<rel>, making missing parents; never replaces: False when
        something is at data/<rel> already (the user's, left as it is)."""
        rel = check_relpath(rel, allow_root=False)
        with _translate(rel):
            pfd, _, name = self._parent(rel, create=True)
            try:
                rename_noreplace(src_fd, src_name, pfd, name)
                return True
            except FileExistsError:
                return False
            finally:
                os.close(pfd)

    def open_dir(self, rel: str) -> int:
        """An fd of the directory data/<rel> (links inside data/ followed, never out of it)."""
        with _translate(rel):
            return self._open_dir(rel)[0]

    # -- trash

    def trash(self, rel: str, *, by: str) -> TrashEntry:
        """Move an entry (a symlink as itself, never its target) to trash/<id>/payload."""
        rel = check_relpath(rel, allow_root=False)
        with _translate(rel):
            pfd, _, name = self._parent(rel)
            tfd = self._open_top(self.trash_dir)
            try:
                os.stat(name, dir_fd=pfd, follow_symlinks=False)  # NotFound before making trash/<id>
                trash_id = uuid.uuid4().hex
                self._mkdir_at(tfd, trash_id)
                ifd = os.open(trash_id, DIR_FLAGS, dir_fd=tfd)
                try:
                    try:
                        os.rename(name, "payload", src_dir_fd=pfd, dst_dir_fd=ifd)
                    except OSError:
                        os.rmdir(trash_id, dir_fd=tfd)
                        raise
                    # measured after the move: out of the session's reach, so it holds still
                    st = os.stat("payload", dir_fd=ifd, follow_symlinks=False)
                    size, files = tree_size(ifd, "payload")
                    item = TrashEntry(trash_id, rel, _kind(st.st_mode), size, files, _now_iso(), by)
                    self._write_meta(ifd, item)
                finally:
                    os.close(ifd)
            finally:
                os.close(tfd)
                os.close(pfd)
        return item

    def _write_meta(self, item_fd: int, item: TrashEntry) -> None:
        body = json.dumps(
            {
                "path": item.path,
                "type": item.type,
                "size": item.size,
                "files": item.files,
                "deleted_at": item.deleted_at,
                "deleted_by": item.deleted_by,
            }
        ).encode()
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open("meta.json.tmp", flags, FILE_MODE, dir_fd=item_fd)
        try:
            os.write(fd, body)
            self._own(fd, FILE_MODE)
        finally:
            os.close(fd)
        os.replace("meta.json.tmp", "meta.json", src_dir_fd=item_fd, dst_dir_fd=item_fd)

    def _trash_item(self, tfd: int, trash_id: str) -> TrashEntry | None:
        try:
            ifd = os.open(trash_id, DIR_FLAGS, dir_fd=tfd)
        except OSError:
            return None
        try:
            m = self._read_meta(ifd)
            return TrashEntry(
                trash_id,
                str(m["path"]),
                str(m["type"]),
                int(m["size"]),
                int(m["files"]),
                str(m["deleted_at"]),
                str(m["deleted_by"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None  # half-written (crash during trash()); purge_trash_older_than cleans it
        finally:
            os.close(ifd)

    def _trash_ids(self, tfd: int) -> list[str]:
        return [n for n in os.listdir(tfd) if _TRASH_ID_RE.fullmatch(n)]

    def list_trash(self) -> list[TrashEntry]:
        """Trash entries, newest first."""
        tfd = self._open_top(self.trash_dir)
        try:
            items = [it for n in self._trash_ids(tfd) if (it := self._trash_item(tfd, n)) is not None]
        finally:
            os.close(tfd)
        items.sort(key=lambda t: (t.deleted_at, t.id), reverse=True)
        return items

    def restore(self, trash_id: str, *, to: str | None = None) -> str:
        """Put a trashed entry back at its original path (or `to`); returns that path."""
        _check_id(trash_id, "trash")
        ifd = self._open_trash_item(trash_id)
        try:
            try:
                meta = self._read_meta(ifd)
                target = check_relpath(to if to is not None else meta["path"], allow_root=False)
            except (OSError, ValueError, KeyError, TypeError):
                raise NotFound(f"trash entry {trash_id} is incomplete") from None
            with _translate(target):
                pfd, _, name = self._parent(target, create=True)
                try:
                    try:
                        rename_noreplace(ifd, "payload", pfd, name)
                    except FileExistsError:
                        raise Conflict(f"{target}: already exists; restore it elsewhere") from None
                finally:
                    os.close(pfd)
        finally:
            os.close(ifd)
        self._remove_trash_item(trash_id)
        return target

    def _remove_trash_item(self, trash_id: str) -> None:
        tfd = self._open_top(self.trash_dir)
        try:
            rmtree_at(tfd, trash_id)
        finally:
            os.close(tfd)

    def purge(self, trash_id: str) -> None:
        """Delete a trash entry for good."""
        _check_id(trash_id, "trash")
        if not os.path.lexists(self.trash_dir / trash_id):
            raise NotFound(f"no trash entry {trash_id}")
        self._remove_trash_item(trash_id)

    def purge_trash_older_than(self, seconds: float, now: float | None = None) -> int:
        """Purge entries deleted more than `seconds` before `now`; returns how many."""
        cutoff = (time.time() if now is None else now) - seconds
        tfd = self._open_top(self.trash_dir)
        try:
            old: list[str] = []
            for n in self._trash_ids(tfd):
                item = self._trash_item(tfd, n)
                try:
                    when = (
                        _parse_iso(item.deleted_at)
                        if item is not None
                        else os.stat(n, dir_fd=tfd, follow_symlinks=False).st_mtime
                    )
                except (OSError, ValueError):
                    continue
                if when < cutoff:
                    old.append(n)
        finally:
            os.close(tfd)
        for n in old:
            self._remove_trash_item(n)
        return len(old)

    def usage(self) -> Usage:
        """Apparent size and count of regular files in data/ and in the trash."""
        dfd = self._open_top(self.data_dir)
        size = files = 0
        try:
            for _, _, _, st in iter_tree(dfd):
                if stat.S_ISREG(st.st_mode):
                    size += st.st_size
                    files += 1
        finally:
            os.close(dfd)
        tsize = tfiles = 0
        tfd = self._open_top(self.trash_dir)
        try:
            for n in self._trash_ids(tfd):
                try:
                    ifd = os.open(n, DIR_FLAGS, dir_fd=tfd)
                except OSError:
                    continue
                try:
                    s, f = tree_size(ifd, "payload")
                except FileNotFoundError:
                    continue
                finally:
                    os.close(ifd)
                tsize += s
                tfiles += f
        finally:
            os.close(tfd)
        return Usage(size, files, tsize, tfiles)

    # -- uploads

    def upload_begin(self, upload_id: str) -> None:
        """Create the empty temp file of a new resumable upload."""
        _check_id(upload_id, "upload")
        ufd = self._open_top(self.uploads_dir)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                fd = os.open(upload_id, flags, FILE_MODE, dir_fd=ufd)
            except FileExistsError:
                raise Conflict(f"upload {upload_id} already exists") from None
            try:
                self._own(fd, FILE_MODE)
            finally:
                os.close(fd)
        finally:
            os.close(ufd)

    def upload_offset(self, upload_id: str) -> int:
        """Bytes received so far."""
        _check_id(upload_id, "upload")
        ufd = self._open_top(self.uploads_dir)
        try:
            return os.stat(upload_id, dir_fd=ufd, follow_symlinks=False).st_size
        except FileNotFoundError:
            raise NotFound(f"no upload {upload_id}") from None
        finally:
            os.close(ufd)

    def _open_upload(self, upload_id: str, flags: int) -> int:
        """Open the temp file and lock it: one writer (or finisher) per upload at a time."""
        ufd = self._open_top(self.uploads_dir)
        try:
            fd = os.open(upload_id, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=ufd)
        except FileNotFoundError:
            raise NotFound(f"no upload {upload_id}") from None
        finally:
            os.close(ufd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise Conflict(f"upload {upload_id} is being written by another request") from None
        return fd

    def upload_open(self, upload_id: str, offset: int) -> BinaryIO:
        """The temp file opened for appending; `offset` must equal what was received so far.

        The file stays locked against other writers until the returned file is closed.
        """
        _check_id(upload_id, "upload")
        fd = self._open_upload(upload_id, os.O_WRONLY | os.O_APPEND)
        size = os.fstat(fd).st_size
        if offset != size:
            os.close(fd)
            raise Conflict(f"upload {upload_id} is at offset {size}, not {offset}; resume from {size}")
        return os.fdopen(fd, "ab")

    def upload_finish(
        self, upload_id: str, rel: str, *, overwrite: bool = True, parents: bool = True
    ) -> Entry:
        """Move the finished temp file to data/<rel>; an existing symlink there is replaced, not followed."""
        _check_id(upload_id, "upload")
        rel = check_relpath(rel, allow_root=False)
        fd = self._open_upload(upload_id, os.O_RDONLY)
        try:
            self._own(fd, FILE_MODE)
            ufd = self._open_top(self.uploads_dir)
            try:
                with _translate(rel):
                    pfd, _, name = self._parent(rel, create=parents)
                    try:
                        try:
                            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
                        except FileNotFoundError:
                            pass
                        else:
                            if stat.S_ISDIR(st.st_mode):
                                raise InvalidInput(f"{rel}: is a directory")
                            if not overwrite:
                                raise Conflict(f"{rel}: already exists")
                        if overwrite:
                            os.rename(upload_id, name, src_dir_fd=ufd, dst_dir_fd=pfd)
                        else:
                            try:
                                rename_noreplace(ufd, upload_id, pfd, name)
                            except FileExistsError:
                                raise Conflict(f"{rel}: already exists") from None
                        return _entry(name, rel, os.stat(name, dir_fd=pfd, follow_symlinks=False))
                    finally:
                        os.close(pfd)
            finally:
                os.close(ufd)
        finally:
            os.close(fd)

    def upload_abort(self, upload_id: str) -> None:
        _check_id(upload_id, "upload")
        ufd = self._open_top(self.uploads_dir)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(upload_id, dir_fd=ufd)
        finally:
            os.close(ufd)

    def upload_ids(self) -> list[tuple[str, int, float]]:
        """(id, size, mtime) of every temp file, for expiring abandoned uploads."""
        ufd = self._open_top(self.uploads_dir)
        out: list[tuple[str, int, float]] = []
        try:
            for n in sorted(os.listdir(ufd)):
                if not _UPLOAD_ID_RE.fullmatch(n):
                    continue
                try:
                    st = os.stat(n, dir_fd=ufd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    out.append((n, st.st_size, st.st_mtime))
        finally:
            os.close(ufd)
        return out


# ---------------------------------------------------------------------------- tar


def iter_tar(
    store: FolderStore, rel: str = "", *, chunk_size: int = 1 << 20, arcname: str | None = None
) -> Generator[bytes, None, None]:
    """Stream a POSIX/PAX tar of directory `rel`, without building it in memory or on disk.

    Members are "<arcname>/..." (default: the directory's name, or the folder id for the
    root; "" for no prefix).  Directories and regular files only: symlinks and special
    files are skipped, never followed.  A file that changes size while being read is
    cut or zero-padded to the size in its header, so the archive stays valid.  Chunks are
    at most chunk_size bytes (a single header over that is yielded whole).
    """
    if chunk_size < 1:
        raise ValueError("chunk_size must be positive")
    rel = check_relpath(rel)
    if arcname is None:
        arcname = _split(rel)[-1] if rel else store.root.name
    base = check_relpath(arcname)
    buf = bytearray()
    total = 0

    def put(piece: bytes) -> Iterator[bytes]:
        nonlocal total
        total += len(piece)
        if buf and len(buf) + len(piece) > chunk_size:
            yield bytes(buf)
            buf.clear()
        if len(piece) >= chunk_size:
            yield piece
        else:
            buf.extend(piece)

    def header(name: str, st: os.stat_result, kind: bytes, size: int) -> bytes:
        ti = tarfile.TarInfo(name)
        ti.type = kind
        ti.size = size
        ti.mode = stat.S_IMODE(st.st_mode)
        ti.mtime = int(st.st_mtime)  # a float mtime would cost a PAX record per member
        ti.uid, ti.gid = st.st_uid, st.st_gid
        return ti.tobuf(tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")

    with _translate(rel):
        top_fd, _ = store._open_dir(rel)
    try:
        if base:
            yield from put(header(base, os.fstat(top_fd), tarfile.DIRTYPE, 0))
        for dir_fd, path, name, st in iter_tree(top_fd):
            member = _join(base, path)
            if stat.S_ISDIR(st.st_mode):
                yield from put(header(member, st, tarfile.DIRTYPE, 0))
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            try:
                fd, fst = open_regular(dir_fd, name)
            except (NotRegular, FileNotFoundError, PermissionError):
                continue
            try:
                size = fst.st_size
                yield from put(header(member, fst, tarfile.REGTYPE, size))
                left = size
                while left:
                    data = os.read(fd, min(chunk_size, left))
                    if not data:
                        break  # shrank while we read: zero-fill below
                    left -= len(data)
                    yield from put(data)
                while left:
                    n = min(chunk_size, left)
                    yield from put(bytes(n))
                    left -= n
                yield from put(bytes(-size % tarfile.BLOCKSIZE))
            finally:
                os.close(fd)
    finally:
        os.close(top_fd)
    yield from put(bytes(2 * tarfile.BLOCKSIZE))
    yield from put(bytes(-total % tarfile.RECORDSIZE))
    if buf:
        yield bytes(buf)
