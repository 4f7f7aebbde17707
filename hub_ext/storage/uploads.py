"""Uploads into a folder, from the reservation to the file in place.

    begin   check the caller's rights and the room left, reserve the upload's whole size (a
            ``vfolder_uploads`` row, labfleet.storage.vfquota.reserve) and make its temp file
    append  write a request's bytes at the upload's offset (a ``Body``; one writer at a time);
            a resumable upload reserves its whole size again for the request (quota.hold), and
            when the request ends unfinished (done or dropped) holds only what it received
            (quota.let_go): a client gone keeps no room it does not use
    finish  under the folder's lock (FolderUsage.lock) the reservation becomes usage and the file
            moves into place, so a rescan measured before it landed can never undercount it
    abort   the temp file and the reservation go: the one way out for an error, a client gone, a
            cancel (DELETE) and an expiry
    expire  abort the uploads idle for longer than the service's expiry

A whole-file upload (a PUT of the file) is ``start`` (begin, then a body from offset 0) and
``finish``, and leaves nothing behind when it does not complete.  A resumable upload is ``begin``
(POST .../uploads), then bodies at increasing offsets (``append``, PATCH), each keeping what
arrived when its request drops, and finishes with its last byte.

``begin``, ``status``, ``cancel``, ``abort`` and ``expire`` work in the caller's transaction.
The streaming steps (``start``, ``append``, ``finish``, ``abandon``) span several: they take the
service's FolderUsage (labfleet.storage.rescans), which holds the session factory and the locks.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session

from labfleet.core import database
from labfleet.core.authz import Actor
from labfleet.core.errors import InvalidInput, LabfleetError, NotFound
from labfleet.core.models import VFolder, VFolderUpload
from labfleet.storage import hosts, vfolders, vfquota
from labfleet.storage.files import entry_view
from labfleet.storage.store import Entry, FolderStore, check_relpath

if TYPE_CHECKING:
    from labfleet.storage.rescans import FolderUsage

MAX_UPLOAD = 1 << 40  # one upload's size; the quotas are the real limit


class LengthRequired(LabfleetError):
    status = 411


class ChunkRefused(LabfleetError):
    """The temp file cannot take a chunk now (another request writes it, it is at another offset,
    or it is gone); ``offset`` is where the upload stands."""

    def __init__(self, message: str, status: int, offset: int) -> None:
        super().__init__(message, status)
        self.offset = offset


class Body:
    """One request's bytes, appended to an upload's temp file as they arrive.

    ``whole``: the body is the whole file (it started the upload and must finish it).
    """

    def __init__(
        self, folder_id: str, store: FolderStore, upload_id: str, fh: BinaryIO, expected: int, *, whole: bool
    ) -> None:
        self.folder_id = folder_id
        self.store = store
        self.id = upload_id
        self.fh = fh
        self.expected = expected  # bytes this request's body brings
        self.whole = whole
        self.received = 0
        self.done = False  # finished, or abandoned

    def write(self, chunk: bytes) -> None:
        self.received += len(chunk)
        if self.received > self.expected:
            raise InvalidInput("the body is longer than its Content-Length")
        try:
            self.fh.write(chunk)
        except OSError as e:
            raise LabfleetError(f"could not write the upload: {e.strerror}", 500) from None

    def close(self) -> None:
        if not self.fh.closed:
            self.fh.close()


class Progress(NamedTuple):
    """Where an upload stands once a body is in: its view, its offset, and the file when complete."""

    view: dict[str, Any]
    offset: int
    entry: Entry | None


def upload_view(up: VFolderUpload, offset: int) -> dict[str, Any]:
    """An upload in progress: where it stands, and what it holds of the limits now."""
    return {
        "id": up.id,
        "path": up.path,
        "size": up.size,
        "offset": offset,
        "reserved": up.reserved,
        "complete": False,
    }


# ---------------------------------------------------------------- in the caller's transaction


def begin(
    db: Session, actor: Actor, folder_id: str, path: str, size: int | None
) -> tuple[VFolderUpload, FolderStore]:
    """Reserve ``size`` bytes for an upload to ``path`` and make its empty temp file.

    Needs ``rw`` on the folder's files and the ``upload-file`` right on its host.  ``size`` is
    None when the request did not say how long its body is (refused, 411).
    """
    v, store = vfolders.open_files(db, actor, folder_id, "rw", "upload-file")
    rel = check_relpath(path, allow_root=False)
    if size is None:
        raise LengthRequired("send the body with a Content-Length (chunked uploads: use /uploads)")
    try:
        if store.stat(rel).type == "dir":
            raise LabfleetError(f"{rel} is a directory", 409)
    except NotFound:
        pass
    up = vfquota.reserve(db, v, actor.user_id, rel, size, hosts.free_disk(v.host.path))
    store.upload_begin(up.id)
    return up, store


def find(
    db: Session, actor: Actor, folder_id: str, upload_id: str, right: str | None = None
) -> tuple[VFolderUpload, FolderStore]:
    """An upload in progress in a folder the actor may write (and ``right`` on its host)."""
    v, store = vfolders.open_files(db, actor, folder_id, "rw", right)
    return vfquota.get_upload(db, v, upload_id), store


def in_progress(db: Session, actor: Actor, folder_id: str) -> list[dict[str, Any]]:
    """The uploads in progress in a folder the actor may write, oldest first: each holds its
    whole size while a request writes it, what it received otherwise, until it finishes, is
    cancelled (DELETE) or expires."""
    v, store = vfolders.open_files(db, actor, folder_id, "rw")
    rows = db.scalars(
        select(VFolderUpload).where(VFolderUpload.vfolder_id == v.id).order_by(VFolderUpload.created_at)
    )

    def offset(upload_id: str) -> int:
        try:
            return store.upload_offset(upload_id)
        except NotFound:  # its temp file went meanwhile (finished, cancelled)
            return 0

    return [
        {
            **upload_view(up, offset(up.id)),
            "created_at": up.created_at.isoformat(),
            "updated_at": up.updated_at.isoformat(),
        }
        for up in rows
    ]


def status(db: Session, actor: Actor, folder_id: str, upload_id: str) -> dict[str, Any]:
    """Where an upload stands: the offset to resume from."""
    up, store = find(db, actor, folder_id, upload_id)
    return upload_view(up, store.upload_offset(up.id))


def cancel(db: Session, actor: Actor, folder_id: str, upload_id: str) -> None:
    up, store = find(db, actor, folder_id, upload_id)
    abort(db, store, up.id)


def abort(db: Session, store: FolderStore, upload_id: str) -> None:
    """Cancel an upload: its temp file goes, then its reservation (either may be gone already)."""
    store.upload_abort(upload_id)
    row = db.get(VFolderUpload, upload_id)
    if row is not None:
        db.delete(row)


def expire(db: Session, idle: float) -> list[str]:
    """Abort the uploads nobody wrote to for ``idle`` seconds; returns their ids."""
    gone = []
    for up in vfquota.expired_uploads(db, idle):
        abort(db, vfolders.store_of(db.get(VFolder, up.vfolder_id)), up.id)  # type: ignore[arg-type]
        gone.append(up.id)
    return gone


def _move_into_place(db: Session, v: VFolder, up: VFolderUpload, store: FolderStore) -> Entry:
    """Move the finished temp file into place and turn its reservation into usage."""
    try:
        old = store.stat(up.path)
    except NotFound:
        old = None
    if old is not None and old.type == "dir":
        raise LabfleetError(f"{up.path} is a directory", 409)
    entry = store.upload_finish(up.id, up.path, overwrite=True, parents=True)
    db.delete(up)
    # Counted now, so the room this upload took is never free in between; the rescan corrects it.
    v.usage_bytes += entry.size - (old.size if old is not None and old.type == "file" else 0)
    return entry


def _rows(db: Session, folder_id: str, upload_id: str) -> tuple[VFolder, VFolderUpload]:
    v = db.get(VFolder, folder_id)
    row = db.get(VFolderUpload, upload_id)
    if v is None or row is None:
        raise NotFound("the folder or the upload went away meanwhile")
    return v, row


# ---------------------------------------------------------------- streaming (several transactions)


def start(usage: FolderUsage, actor: Actor, folder_id: str, path: str, size: int | None) -> Body:
    """A whole-file upload: ``begin``, then its body from offset 0."""
    with database.session_scope(usage.session_factory) as db:
        up, store = begin(db, actor, folder_id, path, size)
        upload_id, expected = up.id, up.size
    try:
        fh = store.upload_open(upload_id, 0)
    except (LabfleetError, OSError):
        with database.session_scope(usage.session_factory) as db:
            abort(db, store, upload_id)
        raise
    return Body(folder_id, store, upload_id, fh, expected, whole=True)


def append(
    usage: FolderUsage,
    actor: Actor,
    folder_id: str,
    upload_id: str,
    offset: int | None,
    length: int | None,
) -> Body:
    """The next chunk of a resumable upload: ``length`` bytes from ``offset``, which must be
    where the upload stands (else ChunkRefused, with the right offset).  None: not given."""
    with database.session_scope(usage.session_factory) as db:
        up, store = find(db, actor, folder_id, upload_id, "upload-file")
        if offset is None:
            raise InvalidInput("send the chunk's position in an Upload-Offset header")
        if length is None:
            raise LengthRequired("send the body with a Content-Length (chunked uploads: use /uploads)")
        if offset + length > up.size:
            raise InvalidInput(f"the chunk ends at {offset + length}, past the upload's size {up.size}")
        up.updated_at = datetime.now(timezone.utc)
    try:
        fh = store.upload_open(upload_id, offset)
    except LabfleetError as e:
        raise ChunkRefused(e.message, e.status, store.upload_offset(upload_id)) from None
    try:
        # Under the writer lock: the room for the rest, before any of the body is read.
        with database.session_scope(usage.session_factory) as db:
            v, row = _rows(db, folder_id, upload_id)
            vfquota.hold(db, v, row, hosts.free_disk(v.host.path))
    except BaseException:
        fh.close()
        raise
    return Body(folder_id, store, upload_id, fh, length, whole=False)


def _let_go(usage: FolderUsage, body: Body) -> tuple[VFolderUpload | None, int]:
    """A resumable upload's request ends: what arrived is flushed, and the upload holds only that
    (quota.let_go), before its writer lock goes.  Returns its row as it is now (None: gone) and
    its offset; the temp file is closed."""
    try:
        try:
            body.fh.flush()
        except OSError:
            pass  # what did not reach the file is not there: the offset says so
        offset = body.store.upload_offset(body.id)
        with database.session_scope(usage.session_factory) as db:
            row = db.get(VFolderUpload, body.id)
            if row is not None:
                vfquota.let_go(row, offset)
                db.flush()
                db.expunge(row)
        return row, offset
    finally:
        body.close()


def abandon(usage: FolderUsage, body: Body) -> None:
    """The body will not complete (an error, the client gone).  A whole file leaves nothing: it
    is aborted.  A resumable upload keeps what arrived, and holds only that; its status tells
    where to resume."""
    if body.done:
        return
    if not body.whole:
        body.done = True
        try:
            _let_go(usage, body)
        except NotFound:
            pass  # cancelled meanwhile: nothing is left to hold
        return
    body.done = True
    body.close()
    with database.session_scope(usage.session_factory) as db:
        abort(db, body.store, body.id)


async def finish(usage: FolderUsage, body: Body) -> Progress:
    """The body is in.  Once the upload has all its bytes, under the folder's lock: its
    reservation becomes usage and the file moves into place; then the folder is measured.

    A whole file that cannot finish is aborted (and the error raised); a resumable upload stays
    as it is, to be resumed or cancelled.
    """
    if body.whole:
        body.close()
        try:
            if body.received != body.expected:
                raise InvalidInput(f"received {body.received} of {body.expected} bytes")
            offset = body.expected
            async with usage.lock(body.folder_id):
                with database.session_scope(usage.session_factory) as db:
                    v, row = _rows(db, body.folder_id, body.id)
                    view = upload_view(row, offset)
                    entry: Entry | None = _move_into_place(db, v, row, body.store)
            body.done = True
        except LabfleetError:
            abandon(usage, body)
            raise
    else:
        body.done = True
        held, offset = _let_go(usage, body)
        if held is None:
            raise NotFound("the upload went away meanwhile (cancelled or expired)")
        view = upload_view(held, offset)
        entry = None
        if offset == held.size:
            async with usage.lock(body.folder_id):
                with database.session_scope(usage.session_factory) as db:
                    v, current = _rows(db, body.folder_id, body.id)
                    entry = _move_into_place(db, v, current, body.store)
    if entry is not None:
        view["entry"] = entry_view(entry)
        view["complete"] = True
        await usage.rescan(body.folder_id)
    return Progress(view, offset, entry)
