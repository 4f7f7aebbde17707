"""Virtual folders on SQLite and on a real PostgreSQL server: uploads racing at a quota's
edge never pass it together, the folder count limit, mounts resolved for a session, and the
upload lifecycle (begin, append, finish, abort, expire)."""

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from threading import Barrier

import pytest
from sqlalchemy import func, select

from labfleet.core import database, unitofwork
from labfleet.core.authz import Actor
from labfleet.core.errors import Conflict, LabfleetError
from labfleet.core.models import VFolder, VFolderUpload
from labfleet.core.secretbox import ensure_key_file
from labfleet.storage import hosts, uploads, vfolders, vfquota
from labfleet.storage.rescans import FolderUsage
from labfleet.storage.store import FolderStore
from labfleet.tenancy import directory, policies
from labfleet.tenancy.policies import ensure_default_keypair_policy
from tests.postgres_server import fresh_database

CLI = Actor.cli()
LIMIT = 10_000


@pytest.fixture(params=["sqlite", "postgres"])
def world(request, tmp_path, monkeypatch):
    monkeypatch.setenv("LABFLEET_SECRET_KEY_FILE", str(tmp_path / "key"))
    ensure_key_file(tmp_path / "key")
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'lf.sqlite'}"
        engine = database.make_engine(url)
    else:
        url = fresh_database(
            request.getfixturevalue("postgres_url"), "vf_" + request.node.name[-10:].strip("[]-")
        )
        engine = database.make_engine(url, pool_size=30, max_overflow=10)
    database.upgrade(engine)
    factory = unitofwork.make_session_factory(engine)
    with database.session_scope(factory) as db:
        ensure_default_keypair_policy(db)
        hosts.ensure_host(
            db, {"name": "local", "path": str(tmp_path / "vf"), "default_permissions": list(hosts.RIGHTS)}
        )
        policies.create_policy(
            db, CLI, "user", {"name": "small", "max_quota_scope_size": LIMIT, "max_vfolder_count": 2}
        )
        directory.create_domain(db, CLI, {"name": "acme"})
        directory.create_project(db, CLI, {"domain": "acme", "name": "ml"})
        directory.create_user(
            db, CLI, {"username": "alice", "domain": "acme", "projects": ["ml"], "resource_policy": "small"}
        )
    yield factory
    engine.dispose()


def _actor(factory, name="alice"):
    with database.session_scope(factory) as db:
        return directory.actor_for(directory.get_user(db, name))


def test_racing_reservations_never_pass_the_scope_limit(world):
    factory = world
    alice = _actor(factory)
    with database.session_scope(factory) as db:
        a = vfolders.create(db, alice, {"name": "a"}, default_host="local").id
        b = vfolders.create(db, alice, {"name": "b"}, default_host="local").id
    # 30 uploads of 1,000 bytes into two folders of one scope (limit 10,000), all at once.
    barrier = Barrier(30)

    def one(i):
        barrier.wait()
        try:
            with database.session_scope(factory) as db:
                v, _ = vfolders.readable(db, alice, a if i % 2 else b)
                vfquota.reserve(db, v, alice.user_id, f"f{i}", 1000, None)
            return True
        except LabfleetError as e:
            assert e.status == 413 and "quota of user alice" in e.message, e.message
            return False

    with ThreadPoolExecutor(30) as pool:
        won = sum(pool.map(one, range(30)))
    assert won == 10
    with database.session_scope(factory) as db:
        assert db.scalar(select(func.sum(VFolderUpload.size))) == 10_000


def test_folder_count_limit_and_unique_names(world):
    factory = world
    alice = _actor(factory)
    with database.session_scope(factory) as db:
        vfolders.create(db, alice, {"name": "one"}, default_host="local")
    with pytest.raises(LabfleetError) as e, database.session_scope(factory) as db:
        vfolders.create(db, alice, {"name": "one"}, default_host="local")
    assert e.value.status == 409 and "already" in e.value.message
    with database.session_scope(factory) as db:
        vfolders.create(db, alice, {"name": ".two"}, default_host="local")
    with pytest.raises(LabfleetError) as e, database.session_scope(factory) as db:
        vfolders.create(db, alice, {"name": "three"}, default_host="local")
    assert e.value.status == 409 and "policy small" in e.value.message


def test_mounts_for_a_session_include_dot_folders_and_refuse_the_unreachable(world):
    factory = world
    alice = _actor(factory)
    with database.session_scope(factory) as db:
        data = vfolders.create(db, alice, {"name": "data"}, default_host="local")
        dot = vfolders.create(db, alice, {"name": ".cfg"}, default_host="local")
        data_id, dot_id = data.id, dot.id
    with database.session_scope(factory) as db:
        user = directory.get_user(db, "alice")
        got = {v.id: perm for v, perm in vfolders.resolve_mounts(db, user, ["data"])}
        assert got == {data_id: "wd", dot_id: "wd"}
        assert {v.id for v, _ in vfolders.resolve_mounts(db, user, [])} == {dot_id}
        for bad, status in (["nope"], 404), (["../x"], 400), ([7], 400), (["data"] * 65, 400):
            with pytest.raises(LabfleetError) as e:
                vfolders.resolve_mounts(db, user, bad)
            assert e.value.status == status
        vfolders.trash(db, alice, data_id)
        with pytest.raises(LabfleetError) as e:
            vfolders.resolve_mounts(db, user, ["data"])
        assert e.value.status == 404


def test_host_rights_come_from_the_host_domain_project_and_keypair_policy(world, tmp_path):
    factory = world
    alice = _actor(factory)
    with database.session_scope(factory) as db:
        hosts.create_host(db, CLI, {"name": "nfs", "path": str(tmp_path / "nfs")})
    # No right at all on a host without defaults or grants.
    with pytest.raises(LabfleetError) as e, database.session_scope(factory) as db:
        vfolders.create(db, alice, {"name": "x", "host": "nfs"}, default_host="local")
    assert e.value.status == 403 and "create-vfolder" in e.value.message
    with database.session_scope(factory) as db:
        directory.update_domain(db, CLI, "acme", {"allowed_vfolder_hosts": {"nfs": ["create-vfolder"]}})
        fid = vfolders.create(db, alice, {"name": "x", "host": "nfs"}, default_host="local").id
    with database.session_scope(factory) as db:
        v, _ = vfolders.readable(db, alice, fid)
        assert vfolders.host_rights(db, alice, v) == {"create-vfolder"}
        user = directory.get_user(db, "alice")
        with pytest.raises(LabfleetError) as e:
            vfolders.resolve_mounts(db, user, ["x"])
        assert e.value.status == 403 and "mount-in-session" in e.value.message
        with pytest.raises(LabfleetError) as e:
            vfolders.trash(db, alice, fid)
        assert e.value.status == 403 and "delete-vfolder" in e.value.message
    # The keypair policy adds rights (a list of names: every right there).
    with database.session_scope(factory) as db:
        policies.update_policy(
            db, CLI, "keypair", "default", {"allowed_storage_hosts": {"nfs": ["mount-in-session"]}}
        )
    with database.session_scope(factory) as db:
        user = directory.get_user(db, "alice")
        assert [v.id for v, _ in vfolders.resolve_mounts(db, user, ["x"])] == [fid]
        policies.update_policy(db, CLI, "keypair", "default", {"allowed_storage_hosts": ["nfs"]})
    with database.session_scope(factory) as db:
        v, _ = vfolders.readable(db, alice, fid)
        assert vfolders.host_rights(db, alice, v) == set(hosts.RIGHTS)
        vfolders.trash(db, alice, fid)
    # A project's grant counts for that project's folders only; bad grants are refused.
    with database.session_scope(factory) as db:
        policies.update_policy(db, CLI, "keypair", "default", {"allowed_storage_hosts": []})
        directory.update_project(db, CLI, "acme", "ml", {"allowed_vfolder_hosts": {"nfs": ["upload-file"]}})
        directory.update_domain(db, CLI, "acme", {"allowed_vfolder_hosts": {}})
        pf = vfolders.create(
            db, CLI, {"name": "team", "project": "acme/ml", "host": "nfs"}, default_host="local"
        )
        assert vfolders.host_rights(db, alice, pf) == {"upload-file"}
        for bad in ({"nfs": ["fly"]}, {"NFS!": []}, ["nfs"], {"nfs": "upload-file"}):
            with pytest.raises(LabfleetError) as e:
                directory.update_domain(db, CLI, "acme", {"allowed_vfolder_hosts": bad})
            assert e.value.status == 400


# ---------------------------------------------------------------- uploads (labfleet.storage.uploads)


def _usage(factory):
    return FolderUsage(factory, logging.getLogger("test.uploads"))


def _folder(factory, actor, name="up"):
    with database.session_scope(factory) as db:
        v = vfolders.create(db, actor, {"name": name}, default_host="local")
        return v.id, vfolders.store_of(v)


def _reserved(factory, name="alice"):
    with database.session_scope(factory) as db:
        return vfquota.scope_views(db, directory.get_user(db, name))[0]["reserved"]


def _rows(factory):
    with database.session_scope(factory) as db:
        return sorted(db.scalars(select(VFolderUpload.id)))


def _temp_files(store):
    return sorted(p.name for p in store.uploads_dir.iterdir())


def test_upload_begin_checks_rights_room_and_target(world):
    factory = world
    alice = _actor(factory)
    fid, store = _folder(factory, alice)
    (store.data_dir / "adir").mkdir()
    with database.session_scope(factory) as db:
        team = vfolders.create(
            db, CLI, {"name": "team", "project": "acme/ml", "permission": "ro"}, default_host="local"
        ).id
        directory.create_user(db, CLI, {"username": "bob", "domain": "acme"})
    bob = _actor(factory, "bob")
    refused = [
        (alice, team, "f", 1, 403, "shared with you ro; this needs rw"),
        (bob, fid, "f", 1, 404, "no vfolder"),
        (alice, fid, "", 1, 400, "not the folder itself"),
        (alice, fid, "f", None, 411, "Content-Length"),
        (alice, fid, "adir", 1, 409, "adir is a directory"),
        (alice, fid, "f", LIMIT + 1, 413, "quota of user alice"),
    ]
    for actor, folder, path, size, status, words in refused:
        with pytest.raises(LabfleetError) as e, database.session_scope(factory) as db:
            uploads.begin(db, actor, folder, path, size)
        assert (e.value.status, words in e.value.message) == (status, True), e.value.message
    assert _rows(factory) == [] and _temp_files(store) == []

    with database.session_scope(factory) as db:
        up, got = uploads.begin(db, alice, fid, "a//b.bin", 600)
        upload_id = up.id
        assert (up.path, up.size, got.root) == ("a/b.bin", 600, store.root)
        assert uploads.upload_view(up, 0) == {
            "id": upload_id,
            "path": "a/b.bin",
            "size": 600,
            "offset": 0,
            "reserved": 600,
            "complete": False,
        }
    assert _rows(factory) == [upload_id] and _temp_files(store) == [upload_id]
    assert (store.uploads_dir / upload_id).stat().st_size == 0
    assert _reserved(factory) == 600


async def test_upload_append_and_finish_a_resumable_upload(world):
    factory = world
    alice = _actor(factory)
    usage = _usage(factory)
    fid, store = _folder(factory, alice)
    with database.session_scope(factory) as db:
        upload_id = uploads.begin(db, alice, fid, "d/r.bin", 10)[0].id
        # Touched by every chunk, so an upload in use never expires.
        db.get(VFolderUpload, upload_id).updated_at = datetime.now(timezone.utc) - timedelta(hours=1)

    body = uploads.append(usage, alice, fid, upload_id, 0, 4)
    assert _reserved(factory) == 10  # the whole size while a request writes it
    with database.session_scope(factory) as db:
        assert uploads.expire(db, 60) == []
    body.write(b"abc")
    body.write(b"d")
    with pytest.raises(LabfleetError) as e:
        body.write(b"e")
    assert e.value.status == 400 and "longer than its Content-Length" in e.value.message
    done = await uploads.finish(usage, body)
    assert (done.offset, done.entry, done.view["complete"], body.done) == (4, None, False, True)
    # The request is over: the upload holds what it received, not its whole size.
    assert done.view["reserved"] == 4 and _reserved(factory) == 4
    with database.session_scope(factory) as db:
        assert uploads.status(db, alice, fid, upload_id)["offset"] == 4

    # A wrong offset is refused with the right one; a chunk past the size, or without its
    # position or length, is refused before anything is written.
    for offset, length, status in ((0, 1, 409), (5, 1, 409)):
        with pytest.raises(uploads.ChunkRefused) as e:
            uploads.append(usage, alice, fid, upload_id, offset, length)
        assert (e.value.status, e.value.offset) == (status, 4)
    for offset, length, status in ((4, 7, 400), (None, 1, 400), (4, None, 411)):
        with pytest.raises(LabfleetError) as e:
            uploads.append(usage, alice, fid, upload_id, offset, length)
        assert e.value.status == status and not isinstance(e.value, uploads.ChunkRefused)
    assert (store.uploads_dir / upload_id).read_bytes() == b"abcd"

    assert _reserved(factory) == 4  # refused chunks held nothing more

    # A dropped chunk keeps what arrived, and holds only that: its connection is gone.
    body = uploads.append(usage, alice, fid, upload_id, 4, 6)
    assert _reserved(factory) == 10
    body.write(b"ef")
    uploads.abandon(usage, body)
    uploads.abandon(usage, body)  # the error and the closed connection may both say so
    assert (store.uploads_dir / upload_id).read_bytes() == b"abcdef"
    assert _rows(factory) == [upload_id] and _reserved(factory) == 6

    # Resuming needs room for the rest again: taken meanwhile, the chunk is refused (413) before
    # anything is written, and the upload goes on holding what it has.
    with database.session_scope(factory) as db:
        other = uploads.begin(db, alice, fid, "other.bin", LIMIT - 6 - 3)[0].id
    with pytest.raises(LabfleetError) as e:
        uploads.append(usage, alice, fid, upload_id, 6, 4)
    assert e.value.status == 413 and "quota of user alice" in e.value.message, e.value.message
    assert _reserved(factory) == LIMIT - 3 and (store.uploads_dir / upload_id).read_bytes() == b"abcdef"
    with database.session_scope(factory) as db:
        uploads.cancel(db, alice, fid, other)

    body = uploads.append(usage, alice, fid, upload_id, 6, 4)
    body.write(b"ghij")
    done = await uploads.finish(usage, body)
    assert done.offset == 10 and done.entry is not None
    assert done.view["complete"] is True and done.view["entry"]["path"] == "d/r.bin"
    assert done.view["entry"]["size"] == 10
    assert (store.data_dir / "d" / "r.bin").read_bytes() == b"abcdefghij"
    assert _rows(factory) == [] and _temp_files(store) == [] and _reserved(factory) == 0
    with database.session_scope(factory) as db:
        v = db.get(VFolder, fid)
        assert (v.usage_bytes, v.usage_files) == (10, 1)  # counted, then measured
        with pytest.raises(LabfleetError) as e:
            uploads.status(db, alice, fid, upload_id)
        assert e.value.status == 404


async def test_whole_file_upload_finishes_under_the_folder_lock(world):
    factory = world
    alice = _actor(factory)
    usage = _usage(factory)
    fid, store = _folder(factory, alice)
    (store.data_dir / "old.bin").write_bytes(b"x" * 100)
    await usage.rescan(fid)

    body = uploads.start(usage, alice, fid, "old.bin", 30)
    assert body.whole and _reserved(factory) == 30
    body.write(b"y" * 30)
    # While a rescan holds the folder's lock, the upload waits: the rescan's measurement,
    # taken before the file landed, can never overwrite what the upload adds.
    async with usage.lock(fid):
        task = asyncio.ensure_future(uploads.finish(usage, body))
        await asyncio.sleep(0.2)
        assert not task.done()
        assert (store.data_dir / "old.bin").read_bytes() == b"x" * 100
        assert _rows(factory) == [body.id]
    done = await task
    assert done.entry is not None and done.entry.size == 30 and body.done
    assert (store.data_dir / "old.bin").read_bytes() == b"y" * 30
    with database.session_scope(factory) as db:
        assert db.get(VFolder, fid).usage_bytes == 30  # the new size replaces the old one
    assert _rows(factory) == [] and _temp_files(store) == [] and _reserved(factory) == 0


async def test_abort_frees_the_reserved_room(world):
    factory = world
    alice = _actor(factory)
    usage = _usage(factory)
    fid, store = _folder(factory, alice)

    def room_for(size):
        try:
            with database.session_scope(factory) as db:
                return uploads.begin(db, alice, fid, f"f{size}", size)[0].id
        except LabfleetError as e:
            assert e.status == 413, e.message
            return None

    first = room_for(LIMIT)
    assert first is not None and room_for(1) is None
    with database.session_scope(factory) as db:
        uploads.abort(db, store, first)
    assert _reserved(factory) == 0 and _rows(factory) == [] and _temp_files(store) == []
    second = room_for(LIMIT)
    assert second is not None
    with database.session_scope(factory) as db:
        uploads.abort(db, store, second)
        uploads.abort(db, store, second)  # twice: nothing left to remove, no error

    # A whole file that falls short frees its room too, and leaves nothing.
    body = uploads.start(usage, alice, fid, "short.bin", LIMIT)
    body.write(b"z" * 10)
    with pytest.raises(LabfleetError) as e:
        await uploads.finish(usage, body)
    assert e.value.status == 400 and e.value.message == f"received 10 of {LIMIT} bytes"
    assert _reserved(factory) == 0 and _rows(factory) == [] and _temp_files(store) == []
    assert list(store.data_dir.iterdir()) == []
    assert room_for(LIMIT) is not None


def test_expire_aborts_idle_uploads_only(world):
    factory = world
    alice = _actor(factory)
    fid, store = _folder(factory, alice)
    with database.session_scope(factory) as db:
        old = uploads.begin(db, alice, fid, "old.bin", 100)[0]
        old.updated_at = datetime.now(timezone.utc) - timedelta(hours=2)
        fresh = uploads.begin(db, alice, fid, "fresh.bin", 100)[0].id
        old_id = old.id
    with database.session_scope(factory) as db:
        assert uploads.expire(db, 3600) == [old_id]
    assert _rows(factory) == [fresh] and _temp_files(store) == [fresh] and _reserved(factory) == 100


async def test_every_way_out_of_an_upload_is_the_one_abort(world, monkeypatch):
    """An error, a client gone, a cancel and an expiry all end in uploads.abort, which frees
    the room and removes the temp file."""
    factory = world
    alice = _actor(factory)
    usage = _usage(factory)
    fid, store = _folder(factory, alice)
    aborted: list[str] = []
    real_abort = uploads.abort

    def spy(db, store, upload_id):
        aborted.append(upload_id)
        real_abort(db, store, upload_id)

    monkeypatch.setattr(uploads, "abort", spy)

    # An error: the temp file cannot be opened once reserved.
    def refuse(self, upload_id, offset):
        raise Conflict(f"upload {upload_id} is being written by another request")

    with monkeypatch.context() as m:
        m.setattr(FolderStore, "upload_open", refuse)
        with pytest.raises(LabfleetError) as e:
            uploads.start(usage, alice, fid, "err.bin", 10)
        assert e.value.status == 409
    assert len(aborted) == 1
    # An error: a whole file whose body is short.
    short = uploads.start(usage, alice, fid, "short.bin", 10)
    short.write(b"1")
    with pytest.raises(LabfleetError):
        await uploads.finish(usage, short)
    # The client gone mid-body (once only, however often the handler is told).
    gone = uploads.start(usage, alice, fid, "gone.bin", 10)
    gone.write(b"12345")
    uploads.abandon(usage, gone)
    uploads.abandon(usage, gone)
    assert gone.done and gone.fh.closed
    # A cancel (DELETE), by someone who may write the folder.
    with database.session_scope(factory) as db:
        cancelled = uploads.begin(db, alice, fid, "cancel.bin", 10)[0].id
    with database.session_scope(factory) as db:
        uploads.cancel(db, alice, fid, cancelled)
    # An expiry, from the service's housekeeping.
    with database.session_scope(factory) as db:
        idle = uploads.begin(db, alice, fid, "idle.bin", 10)[0]
        idle.updated_at = datetime.now(timezone.utc) - timedelta(days=2)
        idle_id = idle.id
    await usage.housekeeping()

    assert aborted[1:] == [short.id, gone.id, cancelled, idle_id]
    assert _rows(factory) == [] and _temp_files(store) == [] and _reserved(factory) == 0
    assert list(store.data_dir.iterdir()) == []
