"""REST handlers for storage: storage hosts, virtual folders, sharing and files.

File bodies are streamed both ways: uploads are written to a temp file as they arrive (the
folder's and the scope's room is reserved first, from Content-Length), downloads are sent in
chunks, directories as a tar made on the fly.  A signed (keypair) request that streams its
body signs an empty body: the signature covers the method, path and date.
"""

from __future__ import annotations

from urllib.parse import quote

from tornado import web

from labfleet.core.errors import InvalidInput, LabfleetError
from labfleet.core.validate import check_bool, check_fields, check_int
from labfleet.service.base import APIHandler
from labfleet.storage import files as vffiles
from labfleet.storage import hosts, uploads, vfolders
from labfleet.storage import sharing as vfshare
from labfleet.storage.store import FolderStore, check_relpath, iter_tar

CHUNK = 1 << 20


class VFolderAPIHandler(APIHandler):
    async def do(self, fn, *args, status: int = 200, rescan: str | None = None) -> None:
        """Answer what ``run(fn, *args)`` returns; ``rescan`` names a folder to measure after the
        change, so the answer's caller sees the new usage."""
        self.write_json(
            await self.run(
                fn, *args, after_commit=(lambda: self.lf.folder_usage.rescan(rescan)) if rescan else None
            ),
            status,
        )


# ---------------------------------------------------------------- storage hosts


class StorageHostListHandler(VFolderAPIHandler):
    async def get(self):
        default = self.lf.vfolder_default_host

        def op(db, a):
            # Which one a folder made without a host goes to: clients offer each host once, that one first.
            return [
                dict(hosts.view_for(db, a, h), is_default=h.name == default) for h in hosts.list_hosts(db)
            ]

        await self.do(op)

    async def post(self):
        body = self.get_json_body()
        await self.do(
            lambda db, a: hosts.host_view(db, hosts.create_host(db, a, body), admin=True), status=201
        )


class StorageHostHandler(VFolderAPIHandler):
    async def get(self, name):
        await self.do(lambda db, a: hosts.view_for(db, a, hosts.get_host(db, name)))

    async def patch(self, name):
        await self.do(
            lambda db, a: hosts.host_view(
                db, hosts.update_host(db, a, name, self.get_json_body(required=True)), admin=True
            )
        )

    async def delete(self, name):
        def op(db, actor):
            hosts.delete_host(db, actor, name)
            return {"deleted": name}

        await self.do(op)


# ---------------------------------------------------------------- folders


class VFolderListHandler(VFolderAPIHandler):
    async def get(self):
        def op(db, actor):
            filters = {k: self.query_arg(k) for k in ("scope", "status", "domain", "search")}
            for name in ("scope", "status"):
                if filters[name] == "":  # not "the default": an empty choice is a mistake
                    raise InvalidInput(f"{name} must not be empty: leave it out for the default")
            offset, limit = self.get_api_pagination()
            return self.paginated_model(
                vfolders.page_folder_views(db, actor, filters, offset=offset, limit=limit)
            )

        await self.do(op)

    async def post(self):
        body = self.get_json_body()
        if isinstance(body, dict) and not isinstance(body.get("host", ""), str):
            self.send_error_json(400, "host must be the name of a storage host")
            return

        default_host = self.lf.vfolder_default_host or None
        await self.do(
            lambda db, a: vfolders.view_for(db, a, vfolders.create(db, a, body, default_host=default_host)),
            status=201,
        )


class VFolderUsageHandler(VFolderAPIHandler):
    """Usage against limits per quota scope: mine, or a user's for their admins."""

    async def get(self):
        await self.do(lambda db, a: vfolders.scope_usage(db, a, self.query_arg("user")))


class VFolderHandler(VFolderAPIHandler):
    async def get(self, folder_id):
        await self.do(lambda db, a: vfolders.view_for(db, a, *vfolders.readable(db, a, folder_id)))

    async def patch(self, folder_id):
        await self.do(
            lambda db, a: vfolders.view_for(
                db, a, *vfolders.update(db, a, folder_id, self.get_json_body(required=True))
            )
        )

    async def delete(self, folder_id):
        await self.do(lambda db, a: vfolders.status_view(vfolders.trash(db, a, folder_id)))


class VFolderActionHandler(VFolderAPIHandler):
    """POST /api/vfolders/{id}/restore | purge"""

    async def post(self, folder_id, action):
        def op(db, actor):
            if action == "restore":
                return vfolders.status_view(vfolders.restore(db, actor, folder_id))
            return {"purged": vfolders.purge(db, actor, folder_id)}

        await self.do(op)


# ---------------------------------------------------------------- sharing


class VFolderInviteHandler(VFolderAPIHandler):
    async def post(self, folder_id):
        body = self.get_json_body()
        await self.do(
            lambda db, a: vfshare.invitation_view(vfshare.invite(db, a, folder_id, body)), status=201
        )


class InvitationListHandler(VFolderAPIHandler):
    """Invitations I received or sent: pending ones, or ?state=all."""

    async def get(self):
        def op(db, actor):
            state = self.query_arg("state")
            if state is None:
                state = "pending"
            if state not in ("pending", "accepted", "declined", "cancelled", "all"):
                raise InvalidInput("state must be pending, accepted, declined, cancelled or all")
            return [
                vfshare.invitation_view(i)
                for i in vfshare.list_invitations(db, actor, state=None if state == "all" else state)
            ]

        await self.do(op)


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
        body = self.get_json_body()
        await self.do(lambda db, a: vfshare.set_permission(db, a, folder_id, username, body))

    async def delete(self, folder_id, username):
        def op(db, actor):
            vfshare.revoke(db, actor, folder_id, username)
            return {"revoked": username}

        await self.do(op)


# ---------------------------------------------------------------- files


def _content_length(handler: APIHandler) -> int | None:
    """The body's length, None when the request does not say (the upload refuses it: 411)."""
    raw = handler.request.headers.get("Content-Length")
    return int(raw) if raw is not None and raw.isdigit() else None


class _StreamingHandler(VFolderAPIHandler):
    """Streams a PUT or PATCH body into an upload (labfleet.storage.uploads) as it arrives."""

    upload: uploads.Body | None = None
    # The method whose body is the upload's; any other is answered by its own handler (405 where
    # the handler has none), its body never streamed into an upload.
    body_method = "PUT"
    # A refusal decided while the body arrived (more bytes than said, the disk): sent once it is in.
    # One decided from the headers (rights, quota, Content-Length) is sent at once, before the body
    # is read, saying Connection: close (see APIHandler._close_if_body_unread).
    refusal: LabfleetError | None = None

    async def prepare(self) -> None:
        self.actor = await self.authenticate()
        # Bodies of any size, for callers who may upload; others keep tornado's limit.
        self.request.connection.set_max_body_size(uploads.MAX_UPLOAD)  # type: ignore[union-attr]
        if self.request.method == self.body_method:
            self.upload = self.begin_body()

    def refuse_late(self) -> bool:
        if self.refusal is None:
            return False
        self.send_error_json(self.refusal.status, self.refusal.message)
        return True

    def begin_body(self) -> uploads.Body:  # pragma: no cover - overridden
        raise NotImplementedError

    def data_received(self, chunk: bytes) -> None:
        up = self.upload
        if up is None or up.done or self.refusal is not None:
            return  # refused: the body is read and dropped
        try:
            up.write(chunk)
        except LabfleetError as e:
            uploads.abandon(self.lf.folder_usage, up)
            self.refusal = e

    def on_connection_close(self) -> None:
        if self.upload is not None and not self.upload.done:
            uploads.abandon(self.lf.folder_usage, self.upload)
        super().on_connection_close()

    async def finish_body(self) -> uploads.Progress | None:
        """The body is in: finish the upload, or answer why not (then None)."""
        up = self.upload
        if self.refuse_late() or up is None:
            return None
        try:
            return await uploads.finish(self.lf.folder_usage, up)
        except LabfleetError as e:
            self.send_error_json(e.status, e.message)
            return None


@web.stream_request_body
class FilesHandler(_StreamingHandler):
    """GET lists a directory (or sends a file, or a directory as ?archive=tar), PUT uploads a
    whole file (Content-Length required), DELETE moves an entry to the folder's trash."""

    def begin_body(self) -> uploads.Body:
        folder_id, raw = self.path_args
        return uploads.start(self.lf.folder_usage, self.actor, folder_id, raw or "", _content_length(self))

    async def put(self, folder_id, raw):
        done = await self.finish_body()
        if done is not None and done.entry is not None:
            self.write_json(vffiles.entry_view(done.entry), 201)

    async def get(self, folder_id, raw):
        if self.refuse_late():
            return
        try:
            rel = check_relpath(raw or "")
            archive = self.query_arg("archive")
            if archive not in (None, "tar"):
                raise InvalidInput("archive must be tar")
            with self.db() as db:
                d = vffiles.download(db, self.actor, folder_id, rel, archive=archive is not None)
            if d.kind == "listing":
                self.write_json(vffiles.listing(d))
            elif d.kind == "tar":
                await self._send_tar(d.store, d.rel, d.name)
            else:
                await self._send_file(d.store, d.rel)
        except LabfleetError as e:
            if self._headers_written:
                raise
            self.send_error_json(e.status, e.message)

    async def _send_file(self, store: FolderStore, rel: str) -> None:
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

    async def _send_tar(self, store: FolderStore, rel: str, name: str) -> None:
        self.set_header("Content-Type", "application/x-tar")
        self.set_header("Content-Disposition", _attachment(f"{name}.tar"))
        for chunk in iter_tar(store, rel, arcname=name, chunk_size=CHUNK):
            self.write(chunk)
            await self.flush()
        self.finish()

    async def delete(self, folder_id, raw):
        if self.refuse_late():
            return
        await self.do(
            lambda db, a: vffiles.trash_view(vffiles.trash(db, a, folder_id, raw or "")), rescan=folder_id
        )


def _attachment(filename: str) -> str:
    ascii_name = filename.encode("ascii", "replace").decode().replace('"', "_").replace("?", "_")
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(filename)}"


class MkdirHandler(VFolderAPIHandler):
    async def post(self, folder_id):
        body = self.get_json_body()

        def op(db, actor):
            b = check_fields(body, required=["path"], optional=["parents"])
            parents = check_bool(b.get("parents", False), "parents")
            return vffiles.entry_view(vffiles.mkdir(db, actor, folder_id, b["path"], parents=parents))

        await self.do(op, status=201)


class MoveHandler(VFolderAPIHandler):
    async def post(self, folder_id):
        body = self.get_json_body()

        def op(db, actor):
            b = check_fields(body, required=["from", "to"], optional=["overwrite"])
            overwrite = check_bool(b.get("overwrite", False), "overwrite")
            src = check_relpath(b["from"], allow_root=False)
            dst = check_relpath(b["to"], allow_root=False)
            return vffiles.entry_view(vffiles.move(db, actor, folder_id, src, dst, overwrite=overwrite))

        await self.do(op)


class TrashListHandler(VFolderAPIHandler):
    async def get(self, folder_id):
        await self.do(lambda db, a: [vffiles.trash_view(t) for t in vffiles.list_trash(db, a, folder_id)])


class TrashRestoreHandler(VFolderAPIHandler):
    async def post(self, folder_id, trash_id):
        body = self.get_json_body()

        def op(db, actor):
            b = check_fields(body, optional=["to"])
            to = check_relpath(b["to"], allow_root=False) if "to" in b else None
            return {"restored": vffiles.restore(db, actor, folder_id, trash_id, to=to)}

        await self.do(op, rescan=folder_id)


class TrashEntryHandler(VFolderAPIHandler):
    async def delete(self, folder_id, trash_id):
        def op(db, actor):
            vffiles.purge(db, actor, folder_id, trash_id)
            return {"purged": trash_id}

        await self.do(op, rescan=folder_id)


# ---------------------------------------------------------------- resumable uploads


class UploadListHandler(VFolderAPIHandler):
    """GET: the uploads in progress (what each reserves, where it stands); POST {path, size}:
    reserve the room and start a resumable upload."""

    async def get(self, folder_id):
        await self.do(lambda db, a: uploads.in_progress(db, a, folder_id))

    async def post(self, folder_id):
        body = self.get_json_body()

        def op(db, actor):
            b = check_fields(body, required=["path", "size"])
            rel = check_relpath(b["path"], allow_root=False)
            size = check_int(b["size"], "size", maximum=uploads.MAX_UPLOAD)
            up, _ = uploads.begin(db, actor, folder_id, rel, size)
            return uploads.upload_view(up, 0)

        await self.do(op, status=201)


@web.stream_request_body
class UploadHandler(_StreamingHandler):
    """GET: where an upload stands; PATCH with Upload-Offset: the next chunk; DELETE: cancel.

    A dropped PATCH keeps what arrived: GET tells the offset to resume from."""

    body_method = "PATCH"

    def begin_body(self) -> uploads.Body:
        folder_id, upload_id = self.path_args
        raw = self.request.headers.get("Upload-Offset", "")
        offset = int(raw) if raw.isdigit() else None
        try:
            return uploads.append(
                self.lf.folder_usage, self.actor, folder_id, upload_id, offset, _content_length(self)
            )
        except uploads.ChunkRefused as e:
            self.set_header("Upload-Offset", str(e.offset))
            raise

    async def get(self, folder_id, upload_id):
        if self.refuse_late():
            return
        await self.do(lambda db, a: uploads.status(db, a, folder_id, upload_id))

    async def patch(self, folder_id, upload_id):
        done = await self.finish_body()
        if done is not None:
            self.set_header("Upload-Offset", str(done.offset))
            self.write_json(done.view)

    async def delete(self, folder_id, upload_id):
        if self.refuse_late():
            return

        def op(db, actor):
            uploads.cancel(db, actor, folder_id, upload_id)
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
