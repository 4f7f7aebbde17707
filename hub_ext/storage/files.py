"""A folder's files through the API: who may do what to them (labfleet.storage.vfolders.open_files
decides), the store call that does it, and the views of entries.

Reading needs ``ro`` on the folder's files, creating and moving ``rw``, whatever removes or
replaces ``wd``; a download (a file, or a directory as tar) needs the ``download-file`` right
on the storage host too.  Purging the trash is for those who manage the folder.  Uploads are
labfleet.storage.uploads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy.orm import Session

from labfleet.core.authz import Actor
from labfleet.core.errors import Forbidden, InvalidInput, NotFound
from labfleet.storage import hosts, vfolders
from labfleet.storage.store import Entry, FolderStore, TrashEntry, check_relpath


def entry_view(e: Entry) -> dict[str, Any]:
    return {"name": e.name, "path": e.path, "type": e.type, "size": e.size, "mtime": e.mtime}


def trash_view(t: TrashEntry) -> dict[str, Any]:
    return t._asdict()


class Download(NamedTuple):
    """What a GET of a path sends: a directory's ``listing``, a ``file`` or a ``tar`` of a directory."""

    store: FolderStore
    rel: str
    kind: str
    name: str  # a tar's top member (the directory's name, the folder's for its root)


def download(db: Session, actor: Actor, folder_id: str, rel: str, *, archive: bool) -> Download:
    """What reading ``rel`` (normalised) gives the actor; a file or a tar needs ``download-file``."""
    v, store = vfolders.open_files(db, actor, folder_id, "ro")
    entry = store.stat(rel) if rel else None
    is_dir = entry is None or entry.type == "dir"
    if archive or not is_dir:
        hosts.need_right(vfolders.host_rights(db, actor, v), "download-file", v.host)
    if not is_dir:
        return Download(store, rel, "file", v.name)
    name = (entry.name if entry else v.name) or v.name
    return Download(store, rel, "tar" if archive else "listing", name)


def read_texts(
    db: Session, actor: Actor, folder_id: str, rel_dir: str, names: Sequence[str], max_bytes: int
) -> dict[str, str]:
    """The files ``names`` in the folder's directory ``rel_dir`` (those that exist) as UTF-8 text,
    read as a download of them would be (``ro`` on the folder, ``download-file`` on its host); at
    most ``max_bytes`` in all, else :class:`InvalidInput`."""
    v, store = vfolders.open_files(db, actor, folder_id, "ro")
    hosts.need_right(vfolders.host_rights(db, actor, v), "download-file", v.host)
    out: dict[str, str] = {}
    left = max_bytes
    for name in names:
        rel = f"{rel_dir.rstrip('/')}/{name}" if rel_dir else name
        try:
            fh, _ = store.open_read(rel)
        except NotFound:
            continue
        with fh:
            data = fh.read(left + 1)
        if len(data) > left:
            raise InvalidInput(f"the recipe's files in vfolder {v.name} are larger than {max_bytes} bytes")
        left -= len(data)
        try:
            out[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput(f"{rel} in vfolder {v.name} is not UTF-8 text") from None
    return out


def listing(d: Download) -> dict[str, Any]:
    return {"path": d.rel, "entries": [entry_view(e) for e in d.store.list_dir(d.rel)]}


def mkdir(db: Session, actor: Actor, folder_id: str, path: str, *, parents: bool) -> Entry:
    _, store = vfolders.open_files(db, actor, folder_id, "rw")
    return store.mkdir(check_relpath(path, allow_root=False), parents=parents)


def move(db: Session, actor: Actor, folder_id: str, src: str, dst: str, *, overwrite: bool) -> Entry:
    """Rename inside the folder; replacing what is at ``dst`` needs ``wd``."""
    _, store = vfolders.open_files(db, actor, folder_id, "wd" if overwrite else "rw")
    return store.move(src, dst, overwrite=overwrite)


def trash(db: Session, actor: Actor, folder_id: str, path: str) -> TrashEntry:
    """Move an entry to the folder's trash (it still counts against the limits until purged)."""
    _, store = vfolders.open_files(db, actor, folder_id, "wd")
    return store.trash(check_relpath(path, allow_root=False), by=actor.name)


def list_trash(db: Session, actor: Actor, folder_id: str) -> list[TrashEntry]:
    _, store = vfolders.open_files(db, actor, folder_id, "ro")
    return store.list_trash()


def restore(db: Session, actor: Actor, folder_id: str, trash_id: str, *, to: str | None) -> str:
    """Put a trashed entry back (at its old path, or ``to``); returns where."""
    _, store = vfolders.open_files(db, actor, folder_id, "wd")
    return store.restore(trash_id, to=to)


def purge(db: Session, actor: Actor, folder_id: str, trash_id: str) -> None:
    """Delete a trash entry for good: the owner's or an admin's call, shared or not."""
    v, acc = vfolders.readable(db, actor, folder_id)
    if not acc.manage:
        raise Forbidden(f"only the owner or an admin can purge vfolder {v.name}'s trash")
    vfolders.store_of(v).purge(trash_id)
