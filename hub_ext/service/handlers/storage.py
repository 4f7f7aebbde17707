"""REST handlers for storage: storage hosts, virtual folders, sharing and files.

File bodies are streamed both ways: uploads are written to a temp file as they arrive (the
folder's and the scope's room is reserved first, from Content-Length), downloads are sent in
chunks, directories as a tar made on the fly.  A signed (keypair) request that streams its
body signs an empty body: the signature covers the method, path and date.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

from tornado import web

from hub_ext.core.errors import Forbidden, InvalidInput, LabfleetError, NotFound
from hub_ext.core.models import VFolder, VFolderUpload
from hub_ext.core.validate import check_bool, check_fields, check_int
from hub_ext.service.base import APIHandler
from hub_ext.storage import folders as vfolders
from hub_ext.storage import hosts
from hub_ext.storage import quota as vfquota
from hub_ext.storage import sharing as vfshare
from hub_ext.storage import store as vfstore

MAX_UPLOAD = 1 << 40  # one request's body; the quotas are the real limit
CHUNK = 1 << 20


def _entry(e: vfstore.Entry) -> dict[str, Any]:
    return {"name": e.name, "path": e.path, "type": e.type, "size": e.size, "mtime": e.mtime}


def _trash_entry(t: vfstore.TrashEntry) -> dict[str, Any]:
    return t._asdict()


def _open_folder(db, actor, folder_id: str, level: str, right: str | None = None) -> tuple[VFolder, Any]:
    """The folder and its store, when the actor has ``level`` on its files (and ``right`` on its host)."""
    v, acc = vfolders.readable(db, actor, folder_id)
    if acc.permission is None:
        raise Forbidden(
            f"you cannot reach the files of vfolder {v.name}: its owner has not shared it with you"
        )
    if not acc.at_least(level):
        raise Forbidden(f"vfolder {v.name} is shared with you {acc.permission}; this needs {level}")
    vfolders.need_ready(v)
    if right is not None:
        hosts.need_right(vfolders.host_rights(db, actor, v), right, v.host)
    return v, vfolders.store_of(v)


def _free_disk(path: str) -> int | None:
    disk = hosts.disk_usage(path)
    return disk.free if disk else None


class VFolderAPIHandler(APIHandler):
    async def do(self, fn, *args, status: int = 200, rescan: str | None = None) -> None:
        """run() for operations that need no Hub sync; ``rescan`` names a folder to measure
        after the change, so the answer's caller sees the new usage."""
        await self.run(
            lambda db, actor, *a: (fn(db, actor, *a), None),
            *args,
            status=status,
            after_commit=(lambda: self.lf.folder_usage.rescan(rescan)) if rescan else None,
        )


# ---------------------------------------------------------------- storage hosts


class StorageHostListHandler(VFolderAPIHandler):
    async def get(self):
        def op(db, actor):
            user = vfolders.actor_user(db, actor)
            return [
                hosts.host_view(
                    db, h, rights=hosts.rights_for(actor, user, h, None), admin=actor.reads_everything
                )
                for h in hosts.list_hosts(db)
            ]

        await self.do(op)

    async def post(self):
        body = self.body
        await self.do(
            lambda db, a: hosts.host_view(db, hosts.create_host(db, a, body), admin=True), status=201
        )


class StorageHostHandler(VFolderAPIHandler):
    async def get(self, name):
        def op(db, actor):
            h = hosts.get_host(db, name)
            user = vfolders.actor_user(db, actor)
            return hosts.host_view(
                db, h, rights=hosts.rights_for(actor, user, h, None), admin=actor.reads_everything
            )

        await self.do(op)

    async def patch(self, name):
        body = self.body
        await self.do(lambda db, a: hosts.host_view(db, hosts.update_host(db, a, name, body), admin=True))

    async def delete(self, name):
        def op(db, actor):
            hosts.delete_host(db, actor, name)
            return {"deleted": name}

        await self.do(op)


# ---------------------------------------------------------------- folders


class VFolderListHandler(VFolderAPIHandler):
    async def get(self):
        filters = {k: self.query_arg(k) for k in ("scope", "status", "domain")}

        def op(db, actor):
            user = vfolders.actor_user(db, actor)
            return [
                vfolders.folder_view(db, v, acc, user=user)
                for v, acc in vfolders.list_folders(db, actor, filters)
            ]

        await self.do(op)

    async def post(self):
        body = self.body

        def op(db, actor):
            v = vfolders.create(db, actor, body, default_host=self.lf.vfolder_default_host or None)
            acc = vfolders.access_of(actor, vfolders.facts_of(db, actor, v))
            return vfolders.folder_view(db, v, acc, user=vfolders.actor_user(db, actor))

        await self.do(op, status=201)


class VFolderUsageHandler(VFolderAPIHandler):
    """Usage against limits per quota scope: mine, or a user's for their admins."""

    async def get(self):
        username = self.query_arg("user")

        def op(db, actor):
            user = vfolders.actor_user(db, actor) if username is None else vfolders.find_user(db, username)
            if user is None:
                raise NotFound("give ?user=NAME: the Hub and the CLI have no folders of their own")
            if user.id != actor.user_id and not (
                actor.reads_everything or actor.is_domain_admin_of(user.domain.name)
            ):
                raise NotFound(f"no user {username!r}")
            return {"user": user.username, "scopes": vfquota.scope_views(db, user)}

        await self.do(op)


class VFolderHandler(VFolderAPIHandler):
    async def get(self, folder_id):
        def op(db, actor):
            v, acc = vfolders.readable(db, actor, folder_id)
            return vfolders.folder_view(db, v, acc, user=vfolders.actor_user(db, actor))

        await self.do(op)

    async def patch(self, folder_id):
        body = self.body

        def op(db, actor):
            v, acc = vfolders.update(db, actor, folder_id, body)
            return vfolders.folder_view(db, v, acc, user=vfolders.actor_user(db, actor))

        await self.do(op)

    async def delete(self, folder_id):
        def op(db, actor):
            v = vfolders.trash(db, actor, folder_id)
            return {"id": v.id, "name": v.name, "status": v.status}

        await self.do(op)


class VFolderActionHandler(VFolderAPIHandler):
    """POST /api/vfolders/{id}/restore | purge"""

    async def post(self, folder_id, action):
        def op(db, actor):
            if action == "restore":
                v = vfolders.restore(db, actor, folder_id)
                return {"id": v.id, "name": v.name, "status": v.status}
            return {"purged": vfolders.purge(db, actor, folder_id)}

        await self.do(op)


# ---------------------------------------------------------------- sharing


class VFolderInviteHandler(VFolderAPIHandler):
    async def post(self, folder_id):
        body = self.body
        await self.do(
            lambda db, a: vfshare.invitation_view(vfshare.invite(db, a, folder_id, body)), status=201
        )


class InvitationListHandler(VFolderAPIHandler):
    """Invitations I received or sent: pending ones, or ?state=all."""

    async def get(self):
        state = self.query_arg("state") or "pending"
        if state not in ("pending", "accepted", "declined", "cancelled", "all"):
            self.send_error_json(400, "state must be pending, accepted, declined, cancelled or all")
            return
        await self.do(
            lambda db, a: [
                vfshare.invitation_view(i)
                for i in vfshare.list_invitations(db, a, state=None if state == "all" else state)
            ]
        )


class InvitationAnswerHandler(VFolderAPIHandler):
    async def post(self, invitation_id, action):
        await self.do(
            lambda db, a: vfshare.invitation_view(vfshare.answer(db, a, invitation_id, action == "accept"))
        )


class InvitationHandler(VFolderAPIHandler):
    async def delete(self, invitation_id):
        await self.do(lambda db, a: vfshare.invitation_view(vfshare.cancel(db, a, invitation_id)))


class VFolderPermissionListHandler(VFolderAPIHandler):
    async def get(self, folder_id):
        await self.do(lambda db, a: vfshare.list_permissions(db, a, folder_id))


class VFolderPermissionHandler(VFolderAPIHandler):
    async def put(self, folder_id, username):
        body = self.body
        await self.do(lambda db, a: vfshare.set_permission(db, a, folder_id, username, body))

    async def delete(self, folder_id, username):
        def op(db, actor):
            vfshare.revoke(db, actor, folder_id, username)
            return {"revoked": username}

        await self.do(op)


# ---------------------------------------------------------------- files


class _Upload:
    """A body being written into a folder's temp file."""

    def __init__(self, folder_id: str, store: vfstore.FolderStore, upload_id: str, fh, expected: int) -> None:
        self.folder_id = folder_id
        self.store = store
        self.id = upload_id
        self.fh = fh
        self.expected = expected  # bytes this request's body brings
        self.received = 0
        self.done = False

    def write(self, chunk: bytes) -> None:
        self.received += len(chunk)
        if self.received > self.expected:
            raise InvalidInput("the body is longer than its Content-Length")
        self.fh.write(chunk)

    def close(self) -> None:
        if not self.fh.closed:
            self.fh.close()


def _content_length(handler: APIHandler) -> int:
    raw = handler.request.headers.get("Content-Length")
    if raw is None or not raw.isdigit():
        raise LabfleetError("send the body with a Content-Length (chunked uploads: use /uploads)", 411)
    return int(raw)


def _finish_upload(db, v: VFolder, up: VFolderUpload, store: vfstore.FolderStore) -> vfstore.Entry:
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


class _StreamingHandler(VFolderAPIHandler):
    upload: _Upload | None = None
    # A refusal decided before the body arrived.  It is sent once the body has been read: an
    # answer sent earlier makes tornado drop the connection, which the Hub's proxy may be
    # reusing for the next request.  (To be refused before sending a big body, POST /uploads.)
    refusal: LabfleetError | None = None

    async def prepare(self) -> None:
        try:
            self.actor = await self.authenticate()
            # Bodies of any size, for callers who may upload; others keep tornado's limit.
            self.request.connection.set_max_body_size(MAX_UPLOAD)
            if self.request.method in ("PUT", "PATCH"):
                await self.begin_body()
        except LabfleetError as e:
            if self.request.method in ("PUT", "PATCH"):
                self.refusal = e
            else:
                self.send_error_json(e.status, e.message)

    def refuse_late(self) -> bool:
        if self.refusal is None:
            return False
        self.send_error_json(self.refusal.status, self.refusal.message)
        return True

    async def begin_body(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def data_received(self, chunk: bytes) -> None:
        up = self.upload
        if up is None or up.done or self.refusal is not None:
            return  # refused: the body is read and dropped
        try:
            up.write(chunk)
        except LabfleetError as e:
            self.abandon()
            self.refusal = e
        except OSError as e:
            self.abandon()
            self.refusal = LabfleetError(f"could not write the upload: {e.strerror}", 500)

    def abandon(self) -> None:
        """The body will not complete: what to do with the temp file (see subclasses)."""

    def on_connection_close(self) -> None:
        if self.upload is not None and not self.upload.done:
            self.abandon()
        super().on_connection_close()


@web.stream_request_body
class FilesHandler(_StreamingHandler):
    """GET lists a directory (or sends a file, or a directory as ?archive=tar), PUT uploads a
    whole file (Content-Length required), DELETE moves an entry to the folder's trash."""

    _reservation: str | None = None

    def _rel(self, raw: str | None, *, allow_root: bool = True) -> str:
        return vfstore.check_relpath(raw or "", allow_root=allow_root)

    async def begin_body(self) -> None:
        folder_id, raw = self.path_args
        with self.db() as db:
            v, store = _open_folder(db, self.actor, folder_id, "rw", "upload-file")
            rel = self._rel(raw, allow_root=False)
            size = _content_length(self)
            try:
                if store.stat(rel).type == "dir":
                    raise LabfleetError(f"{rel} is a directory", 409)
            except NotFound:
                pass
            up = vfquota.reserve(db, v, self.actor.user_id, rel, size, _free_disk(v.host.path))
            store.upload_begin(up.id)
            upload_id = up.id
        self._reservation = upload_id
        try:
            fh = store.upload_open(upload_id, 0)
        except (LabfleetError, OSError):
            store.upload_abort(upload_id)
            self._drop_reservation()
            raise
        self.upload = _Upload(folder_id, store, upload_id, fh, size)

    def abandon(self) -> None:
        # A whole-file PUT that fails leaves nothing: no temp file, no reservation.
        up = self.upload
        if up is None or up.done:
            return
        up.done = True
        up.close()
        up.store.upload_abort(up.id)
        self._drop_reservation()

    def _drop_reservation(self) -> None:
        if self._reservation is None:
            return
        with self.db() as db:
            row = db.get(VFolderUpload, self._reservation)
            if row is not None:
                db.delete(row)
        self._reservation = None

    async def put(self, folder_id, raw):
        up = self.upload
        if self.refuse_late() or up is None:
            return
        up.close()
        try:
            if up.received != up.expected:
                raise InvalidInput(f"received {up.received} of {up.expected} bytes")
            # Under the folder's lock: a rescan measured before this file was in place must not
            # overwrite the usage it adds (its reservation is gone from here on).
            async with self.lf.folder_usage.lock(folder_id):
                with self.db() as db:
                    v = db.get(VFolder, folder_id)
                    row = db.get(VFolderUpload, up.id)
                    if v is None or row is None:
                        raise NotFound("the folder or the upload went away meanwhile")
                    entry = _finish_upload(db, v, row, up.store)
            up.done = True
            self._reservation = None
        except LabfleetError as e:
            self.abandon()
            self.send_error_json(e.status, e.message)
            return
        await self.lf.folder_usage.rescan(folder_id)
        self.write_json(_entry(entry), 201)

    async def get(self, folder_id, raw):
        try:
            rel = self._rel(raw)
            archive = self.query_arg("archive")
            if archive not in (None, "tar"):
                raise InvalidInput("archive must be tar")
            with self.db() as db:
                v, store = _open_folder(db, self.actor, folder_id, "ro")
                entry = store.stat(rel) if rel else None
                is_dir = entry is None or entry.type == "dir"
                if archive or not is_dir:
                    hosts.need_right(vfolders.host_rights(db, self.actor, v), "download-file", v.host)
                name = v.name
            if is_dir and not archive:
                listing = [_entry(e) for e in store.list_dir(rel)]
                self.write_json({"path": rel, "entries": listing})
                return
            if is_dir:
                await self._send_tar(store, rel, (entry.name if entry else name) or name)
            else:
                await self._send_file(store, rel)
        except LabfleetError as e:
            if self._headers_written:
                raise
            self.send_error_json(e.status, e.message)

    async def _send_file(self, store: vfstore.FolderStore, rel: str) -> None:
        fh, st = store.open_read(rel)
        with fh:
            self.set_header("Content-Type", "application/octet-stream")
            self.set_header("Content-Length", str(st.st_size))
            self.set_header("Content-Disposition", _attachment(rel.rsplit("/", 1)[-1]))
            left = st.st_size
            while left > 0:
                chunk = fh.read(min(CHUNK, left))
                if not chunk:
                    break  # shrank while sent: the client sees a short body
                left -= len(chunk)
                self.write(chunk)
                await self.flush()
        self.finish()

    async def _send_tar(self, store: vfstore.FolderStore, rel: str, name: str) -> None:
        self.set_header("Content-Type", "application/x-tar")
        self.set_header("Content-Disposition", _attachment(f"{name}.tar"))
        for chunk in vfstore.iter_tar(store, rel, arcname=name, chunk_size=CHUNK):
            self.write(chunk)
            await self.flush()
        self.finish()

    async def delete(self, folder_id, raw):
        def op(db, actor):
            _, store = _open_folder(db, actor, folder_id, "wd", None)
            return _trash_entry(store.trash(self._rel(raw, allow_root=False), by=actor.name))

        await self.do(op, rescan=folder_id)


def _attachment(filename: str) -> str:
    ascii_name = filename.encode("ascii", "replace").decode().replace('"', "_").replace("?", "_")
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(filename)}"


class MkdirHandler(VFolderAPIHandler):
    async def post(self, folder_id):
        body = self.body

        def op(db, actor):
            b = check_fields(body, required=["path"], optional=["parents"])
            parents = check_bool(b.get("parents", False), "parents")
            _, store = _open_folder(db, actor, folder_id, "rw")
            return _entry(store.mkdir(vfstore.check_relpath(b["path"], allow_root=False), parents=parents))

        await self.do(op, status=201)


class MoveHandler(VFolderAPIHandler):
    async def post(self, folder_id):
        body = self.body

        def op(db, actor):
            b = check_fields(body, required=["from", "to"], optional=["overwrite"])
            overwrite = check_bool(b.get("overwrite", False), "overwrite")
            src = vfstore.check_relpath(b["from"], allow_root=False)
            dst = vfstore.check_relpath(b["to"], allow_root=False)
            _, store = _open_folder(db, actor, folder_id, "wd" if overwrite else "rw")
            return _entry(store.move(src, dst, overwrite=overwrite))

        await self.do(op)


class TrashListHandler(VFolderAPIHandler):
    async def get(self, folder_id):
        def op(db, actor):
            _, store = _open_folder(db, actor, folder_id, "ro")
            return [_trash_entry(t) for t in store.list_trash()]

        await self.do(op)


class TrashRestoreHandler(VFolderAPIHandler):
    async def post(self, folder_id, trash_id):
        body = self.body

        def op(db, actor):
            b = check_fields(body, optional=["to"])
            to = vfstore.check_relpath(b["to"], allow_root=False) if "to" in b else None
            _, store = _open_folder(db, actor, folder_id, "wd")
            return {"restored": store.restore(trash_id, to=to)}

        await self.do(op, rescan=folder_id)


class TrashEntryHandler(VFolderAPIHandler):
    async def delete(self, folder_id, trash_id):
        def op(db, actor):
            v, acc = vfolders.readable(db, actor, folder_id)
            if not acc.manage:
                raise Forbidden(f"only the owner or an admin can purge vfolder {v.name}'s trash")
            vfolders.store_of(v).purge(trash_id)
            return {"purged": trash_id}

        await self.do(op, rescan=folder_id)


# ---------------------------------------------------------------- resumable uploads


def _upload_view(up: VFolderUpload, offset: int) -> dict[str, Any]:
    return {"id": up.id, "path": up.path, "size": up.size, "offset": offset, "complete": False}


class UploadListHandler(VFolderAPIHandler):
    """POST {path, size}: reserve the room and start a resumable upload."""

    async def post(self, folder_id):
        body = self.body

        def op(db, actor):
            b = check_fields(body, required=["path", "size"])
            rel = vfstore.check_relpath(b["path"], allow_root=False)
            size = check_int(b["size"], "size", maximum=MAX_UPLOAD)
            v, store = _open_folder(db, actor, folder_id, "rw", "upload-file")
            try:
                if store.stat(rel).type == "dir":
                    raise LabfleetError(f"{rel} is a directory", 409)
            except NotFound:
                pass
            up = vfquota.reserve(db, v, actor.user_id, rel, size, _free_disk(v.host.path))
            store.upload_begin(up.id)
            return _upload_view(up, 0)

        await self.do(op, status=201)


@web.stream_request_body
class UploadHandler(_StreamingHandler):
    """GET: where an upload stands; PATCH with Upload-Offset: the next chunk; DELETE: cancel.

    A dropped PATCH keeps what arrived: GET tells the offset to resume from."""

    async def begin_body(self) -> None:
        folder_id, upload_id = self.path_args
        with self.db() as db:
            v, store = _open_folder(db, self.actor, folder_id, "rw", "upload-file")
            up = vfquota.get_upload(db, v, upload_id)
            raw = self.request.headers.get("Upload-Offset", "")
            if not raw.isdigit():
                raise InvalidInput("send the chunk's position in an Upload-Offset header")
            offset = int(raw)
            length = _content_length(self)
            if offset + length > up.size:
                raise InvalidInput(f"the chunk ends at {offset + length}, past the upload's size {up.size}")
            up.updated_at = datetime.now(timezone.utc)
        try:
            fh = store.upload_open(upload_id, offset)
        except LabfleetError:
            self.set_header("Upload-Offset", str(store.upload_offset(upload_id)))
            raise
        self.upload = _Upload(folder_id, store, upload_id, fh, length)

    def abandon(self) -> None:
        # Keep what arrived: the client resumes from GET's offset.
        if self.upload is not None:
            self.upload.close()

    async def get(self, folder_id, upload_id):
        def op(db, actor):
            v, store = _open_folder(db, actor, folder_id, "rw")
            up = vfquota.get_upload(db, v, upload_id)
            return _upload_view(up, store.upload_offset(up.id))

        await self.do(op)

    async def patch(self, folder_id, upload_id):
        up = self.upload
        if self.refuse_late() or up is None:
            return
        up.close()
        up.done = True
        try:
            offset = up.store.upload_offset(upload_id)
            async with self.lf.folder_usage.lock(folder_id):  # see FilesHandler.put
                with self.db() as db:
                    v = db.get(VFolder, folder_id)
                    row = db.get(VFolderUpload, upload_id)
                    if v is None or row is None:
                        raise NotFound("the folder or the upload went away meanwhile")
                    view = _upload_view(row, offset)
                    if offset == row.size:
                        view["entry"] = _entry(_finish_upload(db, v, row, up.store))
                        view["complete"] = True
        except LabfleetError as e:
            self.send_error_json(e.status, e.message)
            return
        self.set_header("Upload-Offset", str(offset))
        if view["complete"]:
            await self.lf.folder_usage.rescan(folder_id)
        self.write_json(view)

    async def delete(self, folder_id, upload_id):
        def op(db, actor):
            v, store = _open_folder(db, actor, folder_id, "rw")
            up = vfquota.get_upload(db, v, upload_id)
            store.upload_abort(up.id)
            db.delete(up)
            return {"cancelled": upload_id}

        await self.do(op)


def routes(api: str) -> list[tuple]:
    """Storage hosts, folders, invitations, permissions, files, trash and uploads under ``api``."""
    fid = r"([^/]+)"
    return [
        (api + r"/storage-hosts", StorageHostListHandler),
        (api + r"/storage-hosts/([^/]+)", StorageHostHandler),
        (api + r"/vfolders", VFolderListHandler),
        (api + r"/vfolders/usage", VFolderUsageHandler),
        (api + r"/vfolder-invitations", InvitationListHandler),
        (api + r"/vfolder-invitations/([^/]+)/(accept|decline)", InvitationAnswerHandler),
        (api + r"/vfolder-invitations/([^/]+)", InvitationHandler),
        (api + rf"/vfolders/{fid}", VFolderHandler),
        (api + rf"/vfolders/{fid}/(restore|purge)", VFolderActionHandler),
        (api + rf"/vfolders/{fid}/invitations", VFolderInviteHandler),
        (api + rf"/vfolders/{fid}/permissions", VFolderPermissionListHandler),
        (api + rf"/vfolders/{fid}/permissions/([^/]+)", VFolderPermissionHandler),
        (api + rf"/vfolders/{fid}/files/?(.*)", FilesHandler),
        (api + rf"/vfolders/{fid}/mkdir", MkdirHandler),
        (api + rf"/vfolders/{fid}/move", MoveHandler),
        (api + rf"/vfolders/{fid}/trash", TrashListHandler),
        (api + rf"/vfolders/{fid}/trash/([^/]+)", TrashEntryHandler),
        (api + rf"/vfolders/{fid}/trash/([^/]+)/restore", TrashRestoreHandler),
        (api + rf"/vfolders/{fid}/uploads", UploadListHandler),
        (api + rf"/vfolders/{fid}/uploads/([^/]+)", UploadHandler),
    ]
