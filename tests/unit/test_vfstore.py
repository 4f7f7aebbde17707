"""Virtual-folder filesystem layer: paths, symlink confinement (also under races), trash, uploads, tar."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from labfleet.core.errors import Conflict, InvalidInput, NotFound
from labfleet.storage import fdops
from labfleet.storage import store as vfstore
from labfleet.storage.store import FolderStore, check_relpath, iter_tar

# ---------------------------------------------------------------------------- fixtures


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the folder that must never be reached through it."""
    d = tmp_path / "outside"
    d.mkdir()
    (d / "secret.txt").write_text("top secret")
    (d / "sub").mkdir()
    (d / "sub" / "deep.txt").write_text("deep secret")
    return d


@pytest.fixture
def store(tmp_path: Path) -> FolderStore:
    s = FolderStore(tmp_path / "host" / "f00d")
    s.create()
    return s


def write(store: FolderStore, rel: str, data: bytes | str) -> Path:
    p = store.data_dir / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    p.write_bytes(data)
    return p


def read_all(store: FolderStore, rel: str) -> bytes:
    f, _ = store.open_read(rel)
    with f:
        return f.read()


def new_id() -> str:
    return uuid.uuid4().hex


# ---------------------------------------------------------------------------- check_relpath


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("", ""),
        (".", ""),
        ("./", ""),
        ("a", "a"),
        ("a/", "a"),
        ("a//b/./c/", "a/b/c"),
        ("dir/file.txt", "dir/file.txt"),
        ("..a/b..", "..a/b.."),
        ("ü/日本語.txt", "ü/日本語.txt"),
        ("x" * 255, "x" * 255),
        ("é" * 127, "é" * 127),  # 254 bytes
    ],
)
def test_check_relpath_accepts(given: str, expected: str) -> None:
    assert check_relpath(given) == expected


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("a\x00b", "NUL"),
        ("/etc/passwd", "absolute"),
        ("/", "absolute"),
        ("..", "'..'"),
        ("a/../../etc", "'..'"),
        ("a/..", "'..'"),
        ("x" * 256, "255 bytes"),
        ("é" * 128, "255 bytes"),  # 128 characters, 256 bytes
        ("a/" * 2048 + "b", "4096 bytes"),  # 4097 bytes
        ("bad\udcffname", "surrogate"),
        (b"bytes", "string"),
        (None, "string"),
    ],
)
def test_check_relpath_refuses(bad: object, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        check_relpath(bad)  # type: ignore[arg-type]


def test_check_relpath_root_only_when_allowed() -> None:
    for root in ("", ".", "./."):
        with pytest.raises(InvalidInput, match="not the folder itself"):
            check_relpath(root, allow_root=False)
    assert check_relpath("a", allow_root=False) == "a"
    assert len(("a/" * 2047 + "bc").encode()) == 4096
    assert check_relpath("a/" * 2047 + "bc").endswith("a/bc")


# ---------------------------------------------------------------------------- layout, listing, stat


def test_create_is_idempotent_and_lays_out_dirs(tmp_path: Path) -> None:
    s = FolderStore(tmp_path / "h" / "id1")
    assert not s.exists()
    s.create()
    s.create()
    assert s.exists()
    for d in (s.data_dir, s.trash_dir, s.uploads_dir):
        assert d.is_dir()
        assert d.stat().st_mode & 0o777 == 0o775
    assert s.list_dir() == []
    assert s.usage() == vfstore.Usage(0, 0, 0, 0)


def test_missing_storage_is_not_found(tmp_path: Path) -> None:
    s = FolderStore(tmp_path / "nope")
    with pytest.raises(NotFound):
        s.list_dir()
    with pytest.raises(NotFound):
        s.list_trash()


def test_list_dir_sizes_types_and_sorting(store: FolderStore) -> None:
    write(store, "b.txt", "hello")
    write(store, "a.bin", b"\0" * 1000)
    write(store, "sub/inner.txt", "x")
    os.symlink("b.txt", store.data_dir / "c-link")
    os.mkfifo(store.data_dir / "d-fifo")
    entries = store.list_dir()
    assert [e.name for e in entries] == ["a.bin", "b.txt", "c-link", "d-fifo", "sub"]
    by = {e.name: e for e in entries}
    assert by["a.bin"].type == "file" and by["a.bin"].size == 1000
    assert by["b.txt"].size == 5 and by["b.txt"].path == "b.txt"
    assert by["c-link"].type == "symlink" and by["c-link"].size == len("b.txt")
    assert by["d-fifo"].type == "other"
    assert by["sub"].type == "dir"
    assert by["b.txt"].mtime == pytest.approx(os.lstat(store.data_dir / "b.txt").st_mtime)
    assert by["b.txt"].mode == os.lstat(store.data_dir / "b.txt").st_mode & 0o7777
    inner = store.list_dir("sub/")
    assert [(e.name, e.path, e.size) for e in inner] == [("inner.txt", "sub/inner.txt", 1)]


def test_list_dir_errors(store: FolderStore) -> None:
    write(store, "f.txt", "x")
    with pytest.raises(NotFound):
        store.list_dir("missing")
    with pytest.raises(InvalidInput, match="not a directory"):
        store.list_dir("f.txt")
    with pytest.raises(InvalidInput, match="not a directory"):
        store.list_dir("f.txt/below")


def test_stat_does_not_follow_final_symlink(store: FolderStore, outside: Path) -> None:
    write(store, "f.txt", "12345")
    os.symlink(outside / "secret.txt", store.data_dir / "s")
    assert store.stat("f.txt").size == 5
    e = store.stat("s")
    assert e.type == "symlink" and e.size == len(str(outside / "secret.txt"))
    assert store.stat("").type == "dir"
    with pytest.raises(NotFound):
        store.stat("nope")


def test_open_read_regular_file(store: FolderStore) -> None:
    write(store, "d/f.bin", b"\x01\x02\x03")
    f, st = store.open_read("d/f.bin")
    with f:
        assert f.read() == b"\x01\x02\x03"
    assert st.st_size == 3
    with pytest.raises(InvalidInput, match="directory"):
        store.open_read("d")
    with pytest.raises(InvalidInput):
        store.open_read("")
    with pytest.raises(NotFound):
        store.open_read("d/none")


def test_open_read_refuses_fifo_without_blocking(store: FolderStore) -> None:
    os.mkfifo(store.data_dir / "pipe")
    with pytest.raises(InvalidInput, match="not a regular file"):
        store.open_read("pipe")


# ---------------------------------------------------------------------------- symlink confinement


def test_symlink_inside_is_followed(store: FolderStore) -> None:
    write(store, "real/data.txt", "inside")
    os.symlink("real/data.txt", store.data_dir / "rel-link")
    os.symlink("../real/data.txt", store.data_dir / "real" / "up-link")
    os.symlink(str(store.data_dir / "real" / "data.txt"), store.data_dir / "abs-link")
    os.symlink("real", store.data_dir / "dir-link")
    os.symlink("rel-link", store.data_dir / "chain")
    for rel in ("rel-link", "real/up-link", "abs-link", "dir-link/data.txt", "chain", "dir-link/up-link"):
        assert read_all(store, rel) == b"inside", rel
    assert [e.name for e in store.list_dir("dir-link")] == ["data.txt", "up-link"]
    assert store.list_dir("dir-link")[0].path == "dir-link/data.txt"


@pytest.mark.parametrize(
    "target",
    ["{outside}/secret.txt", "../../../outside/secret.txt", "/etc/passwd", "real/../../x", ".."],
)
def test_open_read_refuses_links_leaving_the_folder(store: FolderStore, outside: Path, target: str) -> None:
    write(store, "real/x", "ok")
    os.symlink(target.format(outside=outside), store.data_dir / "link")
    with pytest.raises(InvalidInput, match="points outside the folder"):
        store.open_read("link")


def test_link_loop_is_refused(store: FolderStore) -> None:
    os.symlink("b", store.data_dir / "a")
    os.symlink("a", store.data_dir / "b")
    with pytest.raises(InvalidInput, match="too many levels"):
        store.open_read("a")
    with pytest.raises(InvalidInput, match="too many levels"):
        store.list_dir("a")


def test_dir_link_to_outside_refused_everywhere(store: FolderStore, outside: Path) -> None:
    os.symlink(outside, store.data_dir / "out")
    os.symlink("/etc", store.data_dir / "etc")
    write(store, "mine.txt", "mine")
    uid = new_id()
    store.upload_begin(uid)
    with store.upload_open(uid, 0) as f:
        f.write(b"payload")

    for link in ("out", "etc"):
        with pytest.raises(InvalidInput, match="outside"):
            store.list_dir(link)
        with pytest.raises(InvalidInput, match="outside"):
            store.stat(f"{link}/secret.txt")
        with pytest.raises(InvalidInput, match="outside"):
            store.open_read(f"{link}/secret.txt" if link == "out" else f"{link}/passwd")
        with pytest.raises(InvalidInput, match="outside"):
            store.mkdir(f"{link}/newdir")
        with pytest.raises(InvalidInput, match="outside"):
            store.mkdir(f"{link}/a/b", parents=True)
        with pytest.raises(InvalidInput, match="outside"):
            store.upload_finish(uid, f"{link}/dropped.txt")
        with pytest.raises(InvalidInput, match="outside"):
            store.move("mine.txt", f"{link}/mine.txt")
        with pytest.raises(InvalidInput, match="outside"):
            store.move(f"{link}/secret.txt", "stolen.txt")
        with pytest.raises(InvalidInput, match="outside"):
            store.trash(f"{link}/secret.txt", by="mallory")
        with pytest.raises(InvalidInput, match="outside"):
            list(iter_tar(store, link))

    # nothing happened outside, and the upload and the file are still ours
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt", "sub"]
    assert (outside / "secret.txt").read_text() == "top secret"
    assert store.upload_offset(uid) == len(b"payload")
    assert read_all(store, "mine.txt") == b"mine"
    assert not (store.data_dir / "stolen.txt").exists()

    # the links themselves are entries of the folder
    by = {e.name: e for e in store.list_dir()}
    assert by["out"].type == "symlink" and by["etc"].type == "symlink"


def test_trash_symlink_removes_the_link_not_the_target(store: FolderStore, outside: Path) -> None:
    os.symlink(outside, store.data_dir / "out")
    os.symlink(outside / "secret.txt", store.data_dir / "file-link")
    t1 = store.trash("out", by="alice")
    t2 = store.trash("file-link", by="alice")
    assert (t1.type, t1.size, t1.files) == ("symlink", 0, 0)
    assert t2.type == "symlink"
    assert store.list_dir() == []
    assert (outside / "secret.txt").read_text() == "top secret"
    assert (outside / "sub" / "deep.txt").exists()
    store.purge(t1.id)
    store.purge(t2.id)
    assert (outside / "secret.txt").read_text() == "top secret"
    assert (outside / "sub" / "deep.txt").exists()


def test_upload_finish_replaces_a_symlink_instead_of_writing_through_it(
    store: FolderStore, outside: Path
) -> None:
    os.symlink(outside / "secret.txt", store.data_dir / "target.txt")
    uid = new_id()
    store.upload_begin(uid)
    with store.upload_open(uid, 0) as f:
        f.write(b"new content")
    e = store.upload_finish(uid, "target.txt", overwrite=True)
    assert e.type == "file" and e.size == len(b"new content")
    assert not (store.data_dir / "target.txt").is_symlink()
    assert (outside / "secret.txt").read_text() == "top secret"


def test_move_of_a_symlink_moves_the_link(store: FolderStore, outside: Path) -> None:
    os.symlink(outside, store.data_dir / "out")
    store.mkdir("d")
    e = store.move("out", "d/out2")
    assert e.type == "symlink"
    assert os.readlink(store.data_dir / "d" / "out2") == str(outside)
    assert (outside / "secret.txt").exists()


def _swap_in_link_on_open(monkeypatch: pytest.MonkeyPatch, victim: Path, target: Path, name: str) -> None:
    """Make the next os.open of `name` (relative to a dir fd) find a symlink to `target` instead."""
    real_open = os.open
    done: list[int] = []

    def racing_open(path, flags, mode=0o777, *, dir_fd=None):  # type: ignore[no-untyped-def]
        if not done and path == name and dir_fd is not None:
            done.append(1)
            victim.rename(victim.with_name(victim.name + ".moved"))
            os.symlink(target, victim)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", racing_open)


def test_race_dir_swapped_for_symlink_before_open(
    store: FolderStore, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(store, "sub/secret.txt", "mine")
    _swap_in_link_on_open(monkeypatch, store.data_dir / "sub", outside, "sub")
    with pytest.raises(InvalidInput, match="outside"):
        store.open_read("sub/secret.txt")
    monkeypatch.undo()
    assert (store.data_dir / "sub").is_symlink()  # the swap did happen
    assert read_all(store, "sub.moved/secret.txt") == b"mine"


def test_race_file_swapped_for_symlink_before_open(
    store: FolderStore, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(store, "f.txt", "mine")
    _swap_in_link_on_open(monkeypatch, store.data_dir / "f.txt", outside / "secret.txt", "f.txt")
    with pytest.raises(InvalidInput, match="outside"):
        store.open_read("f.txt")


def test_race_parent_swapped_during_mkdir(
    store: FolderStore, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.mkdir("a")
    _swap_in_link_on_open(monkeypatch, store.data_dir / "a", outside, "a")
    with pytest.raises(InvalidInput, match="outside"):
        store.mkdir("a/b")
    monkeypatch.undo()
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt", "sub"]


def test_race_threaded_swapping_never_escapes(store: FolderStore, outside: Path) -> None:
    """A 'session' flips data/d between a real dir and a link to outside while we read."""
    write(store, "d/secret.txt", "inside")
    stop = threading.Event()
    d = store.data_dir / "d"
    parked = store.data_dir / "parked"

    def flipper() -> None:
        while not stop.is_set():
            d.rename(parked)
            os.symlink(outside, d)
            os.unlink(d)
            parked.rename(d)
            time.sleep(0.0002)  # let the reader win sometimes too

    t = threading.Thread(target=flipper)
    t.start()
    seen = set()
    try:
        for _ in range(3000):
            try:
                seen.add(read_all(store, "d/secret.txt"))
            except (InvalidInput, NotFound):
                seen.add(b"refused")
            try:
                for e in store.list_dir("d"):
                    assert e.name == "secret.txt"
            except (InvalidInput, NotFound):
                pass
    finally:
        stop.set()
        t.join()
    assert b"top secret" not in seen
    assert b"inside" in seen


# ---------------------------------------------------------------------------- mkdir, move


def test_mkdir(store: FolderStore) -> None:
    e = store.mkdir("a")
    assert (e.name, e.path, e.type) == ("a", "a", "dir")
    assert (store.data_dir / "a").stat().st_mode & 0o777 == 0o775
    with pytest.raises(Conflict):
        store.mkdir("a")
    assert store.mkdir("a", parents=True).type == "dir"
    with pytest.raises(NotFound):
        store.mkdir("x/y")
    assert store.mkdir("x/y/z", parents=True).path == "x/y/z"
    assert (store.data_dir / "x" / "y" / "z").is_dir()
    write(store, "f", "1")
    with pytest.raises(Conflict):
        store.mkdir("f", parents=True)
    with pytest.raises(InvalidInput, match="not a directory"):
        store.mkdir("f/sub")
    with pytest.raises(InvalidInput):
        store.mkdir("")


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_owner_is_applied_when_root(tmp_path: Path) -> None:
    s = FolderStore(tmp_path / "owned", owner=(4321, 4322))
    s.create()
    assert (s.data_dir.stat().st_uid, s.data_dir.stat().st_gid) == (4321, 4322)
    s.mkdir("a/b", parents=True)
    assert (s.data_dir / "a").stat().st_uid == 4321
    assert (s.data_dir / "a" / "b").stat().st_gid == 4322
    uid = new_id()
    s.upload_begin(uid)
    assert (s.uploads_dir / uid).stat().st_uid == 4321
    s.upload_finish(uid, "n/up.txt")
    st = (s.data_dir / "n" / "up.txt").stat()
    assert (st.st_uid, st.st_mode & 0o777) == (4321, 0o664)
    assert (s.data_dir / "n").stat().st_uid == 4321


def test_move_round_trip_and_conflicts(store: FolderStore) -> None:
    write(store, "a.txt", "A")
    write(store, "b.txt", "B")
    store.mkdir("dir")
    e = store.move("a.txt", "dir/a2.txt")
    assert (e.path, e.type, e.size) == ("dir/a2.txt", "file", 1)
    assert not (store.data_dir / "a.txt").exists()
    assert read_all(store, "dir/a2.txt") == b"A"

    with pytest.raises(Conflict):
        store.move("b.txt", "dir/a2.txt")
    assert read_all(store, "dir/a2.txt") == b"A"
    store.move("b.txt", "dir/a2.txt", overwrite=True)
    assert read_all(store, "dir/a2.txt") == b"B"

    with pytest.raises(NotFound):
        store.move("nope", "x")
    with pytest.raises(NotFound):
        store.move("dir/a2.txt", "missing/parent.txt")
    with pytest.raises(InvalidInput, match="into itself"):
        store.move("dir", "dir/inner")
    store.mkdir("dir/deeper")
    with pytest.raises(InvalidInput, match="into itself"):
        store.move("dir", "dir/deeper/x")
    with pytest.raises(InvalidInput):
        store.move("", "x")
    with pytest.raises(InvalidInput):
        store.move("dir", "")
    # file over a directory and a directory over a non-empty one are refused
    write(store, "f", "f")
    with pytest.raises(Conflict):
        store.move("f", "dir", overwrite=True)
    store.mkdir("other")
    with pytest.raises(Conflict):
        store.move("other", "dir", overwrite=True)
    # a directory onto an empty one is a plain rename
    store.mkdir("empty")
    store.move("dir", "empty", overwrite=True)
    assert read_all(store, "empty/a2.txt") == b"B"
    assert store.move("f", "f").path == "f"


def test_move_through_inside_dir_link_into_itself_is_refused(store: FolderStore) -> None:
    store.mkdir("a/b", parents=True)
    os.symlink("a/b", store.data_dir / "alias")
    with pytest.raises(InvalidInput):
        store.move("a", "alias/x")
    assert (store.data_dir / "a" / "b").is_dir()


# ---------------------------------------------------------------------------- trash


def test_trash_restore_purge_round_trip(store: FolderStore) -> None:
    write(store, "d/one.txt", "1" * 10)
    write(store, "d/sub/two.txt", "2" * 20)
    write(store, "top.txt", "t" * 5)

    item = store.trash("d", by="alice")
    assert (item.path, item.type, item.size, item.files, item.deleted_by) == ("d", "dir", 30, 2, "alice")
    assert item.deleted_at.endswith("Z")
    assert not (store.data_dir / "d").exists()
    meta = json.loads((store.trash_dir / item.id / "meta.json").read_text())
    assert meta["path"] == "d" and meta["deleted_by"] == "alice" and meta["size"] == 30

    item2 = store.trash("top.txt", by="bob")
    listed = store.list_trash()
    assert [t.id for t in listed] == [item2.id, item.id]  # newest first
    assert listed[1] == item

    # restore to the original path (parents recreated) ...
    store.mkdir("d")
    with pytest.raises(Conflict):
        store.restore(item.id)
    (store.data_dir / "d").rmdir()
    assert store.restore(item.id) == "d"
    assert read_all(store, "d/sub/two.txt") == b"2" * 20
    assert [t.id for t in store.list_trash()] == [item2.id]
    with pytest.raises(NotFound):
        store.restore(item.id)

    # ... or elsewhere, with missing parents created
    assert store.restore(item2.id, to="new/place/top.txt") == "new/place/top.txt"
    assert read_all(store, "new/place/top.txt") == b"ttttt"

    item3 = store.trash("new", by="carol")
    store.purge(item3.id)
    assert store.list_trash() == []
    assert not (store.trash_dir / item3.id).exists()
    with pytest.raises(NotFound):
        store.purge(item3.id)
    with pytest.raises(InvalidInput):
        store.purge("../data")
    with pytest.raises(InvalidInput):
        store.restore("ABC")
    with pytest.raises(InvalidInput):
        store.purge(item3.id + "\n")


def test_trash_refuses_root_and_missing(store: FolderStore) -> None:
    with pytest.raises(InvalidInput):
        store.trash("", by="x")
    with pytest.raises(InvalidInput):
        store.trash(".", by="x")
    with pytest.raises(NotFound):
        store.trash("nothing", by="x")
    assert list(store.trash_dir.iterdir()) == []


def test_restore_to_original_recreates_parents(store: FolderStore) -> None:
    write(store, "a/b/c.txt", "c")
    item = store.trash("a/b/c.txt", by="x")
    store.trash("a", by="x")
    assert store.restore(item.id) == "a/b/c.txt"
    assert read_all(store, "a/b/c.txt") == b"c"


def test_purge_trash_older_than(store: FolderStore) -> None:
    for name in ("x", "y"):
        write(store, name, name)
    ix = store.trash("x", by="u")
    iy = store.trash("y", by="u")
    # make x look a day old
    meta_path = store.trash_dir / ix.id / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["deleted_at"] = "2020-01-01T00:00:00Z"
    meta_path.write_text(json.dumps(meta))
    now = vfstore._parse_iso("2020-01-02T00:00:00Z")
    assert store.purge_trash_older_than(86400 + 60, now=now) == 0
    assert store.purge_trash_older_than(86400 - 60, now=now) == 1
    assert [t.id for t in store.list_trash()] == [iy.id]
    assert store.purge_trash_older_than(3600) == 0
    assert store.purge_trash_older_than(3600, now=vfstore._parse_iso(iy.deleted_at) + 3601) == 1
    assert store.list_trash() == []


# ---------------------------------------------------------------------------- usage


def test_usage_counts_regular_files_only(store: FolderStore, outside: Path) -> None:
    write(store, "a", b"a" * 100)
    write(store, "d/b", b"b" * 50)
    write(store, "d/e/c", b"c" * 7)
    os.symlink(outside, store.data_dir / "out")  # never followed
    os.symlink("a", store.data_dir / "a-link")
    assert store.usage() == vfstore.Usage(157, 3, 0, 0)
    store.trash("d", by="u")
    assert store.usage() == vfstore.Usage(100, 1, 57, 2)
    store.trash("out", by="u")
    assert store.usage() == vfstore.Usage(100, 1, 57, 2)


def test_deep_tree_walk_uses_few_fds(store: FolderStore) -> None:
    # deeper than anything a recursive walker or an fd-per-level walker would survive cheaply
    fd = os.open(store.data_dir, os.O_RDONLY)
    try:
        for _ in range(1200):
            os.mkdir("d", dir_fd=fd)
            nfd = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        with open(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "wb") as f:
            f.write(b"z" * 9)
    finally:
        os.close(fd)
    try:
        before = len(os.listdir("/proc/self/fd"))
        assert store.usage().bytes == 9
        names = tarfile.open(fileobj=io.BytesIO(b"".join(iter_tar(store, arcname="")))).getnames()
        assert len(names) == 1201
        assert len(os.listdir("/proc/self/fd")) == before
        # trash + purge and destroy cope too (shutil.rmtree would hit the recursion limit)
        item = store.trash("d", by="u")
        assert (item.size, item.files) == (9, 1)
        assert store.usage().trash_bytes == 9
        store.purge(item.id)
        assert store.usage() == vfstore.Usage(0, 0, 0, 0)
    finally:
        store.destroy()  # else pytest's own tmp cleanup (shutil.rmtree) fails on it later
    assert not store.root.exists()


# ---------------------------------------------------------------------------- uploads


def test_resumable_upload(store: FolderStore) -> None:
    payload = os.urandom(300_000)
    uid = new_id()
    store.upload_begin(uid)
    with pytest.raises(Conflict):
        store.upload_begin(uid)
    assert store.upload_offset(uid) == 0
    with store.upload_open(uid, 0) as f:
        f.write(payload[:100_000])
    assert store.upload_offset(uid) == 100_000

    with pytest.raises(Conflict, match="100000") as exc:
        store.upload_open(uid, 50_000)
    assert exc.value.status == 409
    with pytest.raises(Conflict, match="100000"):
        store.upload_open(uid, 0)

    f = store.upload_open(uid, 100_000)
    with pytest.raises(Conflict, match="another request"):
        store.upload_open(uid, 100_000)  # one writer at a time
    with f:
        f.write(payload[100_000:])
    assert store.upload_offset(uid) == len(payload)
    assert [(i, n) for i, n, _ in store.upload_ids()] == [(uid, len(payload))]

    e = store.upload_finish(uid, "up/loaded.bin")
    assert (e.path, e.type, e.size) == ("up/loaded.bin", "file", len(payload))
    assert hashlib.sha256(read_all(store, "up/loaded.bin")).digest() == hashlib.sha256(payload).digest()
    assert list(store.uploads_dir.iterdir()) == []
    with pytest.raises(NotFound):
        store.upload_offset(uid)


def test_upload_finish_rules(store: FolderStore) -> None:
    def staged(data: bytes) -> str:
        uid = new_id()
        store.upload_begin(uid)
        with store.upload_open(uid, 0) as f:
            f.write(data)
        return uid

    store.mkdir("dir")
    write(store, "exists.txt", "old")
    u = staged(b"new")
    with pytest.raises(InvalidInput, match="is a directory"):
        store.upload_finish(u, "dir")
    with pytest.raises(Conflict):
        store.upload_finish(u, "exists.txt", overwrite=False)
    with pytest.raises(NotFound):
        store.upload_finish(u, "no/parent.txt", parents=False)
    assert not (store.data_dir / "no").exists()
    with pytest.raises(InvalidInput):
        store.upload_finish(u, "")
    assert store.upload_offset(u) == 3  # still there after the refusals
    store.upload_finish(u, "exists.txt")
    assert read_all(store, "exists.txt") == b"new"
    with pytest.raises(NotFound):
        store.upload_finish(u, "again.txt")
    # finishing while a writer holds the upload is refused
    u2 = staged(b"")
    with store.upload_open(u2, 0):
        with pytest.raises(Conflict):
            store.upload_finish(u2, "busy.txt")


def test_upload_abort_and_ids(store: FolderStore) -> None:
    uid = new_id()
    store.upload_begin(uid)
    with store.upload_open(uid, 0) as f:
        f.write(b"partial")
    (store.uploads_dir / "not-an-upload").write_text("ignored")
    assert [i for i, _, _ in store.upload_ids()] == [uid]
    store.upload_abort(uid)
    store.upload_abort(uid)  # already gone: fine
    assert [p.name for p in store.uploads_dir.iterdir()] == ["not-an-upload"]
    with pytest.raises(NotFound):
        store.upload_open(uid, 0)


@pytest.mark.parametrize("bad", ["", "xyz", "A" * 32, "0" * 31, "0" * 33, "../" + "0" * 29, "0" * 32 + "\n"])
def test_upload_ids_are_validated(store: FolderStore, bad: str) -> None:
    with pytest.raises(InvalidInput, match="upload id"):
        store.upload_begin(bad)
    with pytest.raises(InvalidInput, match="upload id"):
        store.upload_offset(bad)


# ---------------------------------------------------------------------------- tar


def test_iter_tar_names_contents_and_skips(store: FolderStore, outside: Path) -> None:
    write(store, "proj/a.txt", "alpha")
    write(store, "proj/sub/b.bin", b"\x00\xff" * 1000)
    (store.data_dir / "proj" / "empty").mkdir()
    os.symlink(outside / "secret.txt", store.data_dir / "proj" / "evil")
    os.symlink(outside, store.data_dir / "proj" / "evil-dir")
    os.symlink("a.txt", store.data_dir / "proj" / "inside-link")
    os.mkfifo(store.data_dir / "proj" / "fifo")
    write(store, "elsewhere.txt", "not in proj")

    tf = tarfile.open(fileobj=io.BytesIO(b"".join(iter_tar(store, "proj"))))
    members = {m.name: m for m in tf.getmembers()}
    assert sorted(members) == ["proj", "proj/a.txt", "proj/empty", "proj/sub", "proj/sub/b.bin"]
    assert members["proj/sub"].isdir() and members["proj/a.txt"].isfile()
    assert tf.extractfile("proj/a.txt").read() == b"alpha"  # type: ignore[union-attr]
    assert tf.extractfile("proj/sub/b.bin").read() == b"\x00\xff" * 1000  # type: ignore[union-attr]


def test_iter_tar_root_arcname_and_unicode(store: FolderStore) -> None:
    write(store, "x.txt", "x")
    write(store, "ü/日本.txt", "jp")
    names = tarfile.open(fileobj=io.BytesIO(b"".join(iter_tar(store)))).getnames()
    assert sorted(names) == ["f00d", "f00d/x.txt", "f00d/ü", "f00d/ü/日本.txt"]
    names = tarfile.open(fileobj=io.BytesIO(b"".join(iter_tar(store, arcname="dl")))).getnames()
    assert sorted(names) == ["dl", "dl/x.txt", "dl/ü", "dl/ü/日本.txt"]
    names = tarfile.open(fileobj=io.BytesIO(b"".join(iter_tar(store, arcname="")))).getnames()
    assert sorted(names) == ["x.txt", "ü", "ü/日本.txt"]
    with pytest.raises(InvalidInput):
        list(iter_tar(store, "x.txt"))
    with pytest.raises(NotFound):
        list(iter_tar(store, "missing"))


def test_iter_tar_streams_big_file_in_chunks(store: FolderStore) -> None:
    big = os.urandom(5 * 1024 * 1024)
    write(store, "big/blob", big)
    write(store, "big/small", "s")
    chunk_size = 64 * 1024
    chunks = list(iter_tar(store, "big", chunk_size=chunk_size))
    assert len(chunks) > 10
    assert max(len(c) for c in chunks) <= chunk_size
    data = b"".join(chunks)
    assert len(data) % tarfile.RECORDSIZE == 0
    tf = tarfile.open(fileobj=io.BytesIO(data))
    assert hashlib.sha256(tf.extractfile("big/blob").read()).digest() == hashlib.sha256(big).digest()  # type: ignore[union-attr]


@pytest.mark.parametrize("change", ["shrink", "grow"])
def test_iter_tar_file_changing_while_read_stays_valid(store: FolderStore, change: str) -> None:
    original = os.urandom(1024 * 1024)
    p = write(store, "d/f", original)
    it = iter_tar(store, "d", chunk_size=64 * 1024)
    got = [next(it), next(it), next(it)]  # some of f's data is out
    if change == "shrink":
        with open(p, "r+b") as f:
            f.truncate(100_000)
    else:
        with open(p, "ab") as f:
            f.write(b"more" * 1000)
    got.extend(it)
    tf = tarfile.open(fileobj=io.BytesIO(b"".join(got)))
    member = tf.getmember("d/f")
    assert member.size == len(original)
    body = tf.extractfile(member).read()  # type: ignore[union-attr]
    assert len(body) == len(original)
    if change == "shrink":
        assert body[:100_000] == original[:100_000]
        assert body[-1000:] == b"\0" * 1000
    else:
        assert body == original


def test_iter_tar_closes_fds_when_abandoned(store: FolderStore) -> None:
    write(store, "d/a", os.urandom(300_000))
    before = len(os.listdir("/proc/self/fd"))
    it = iter_tar(store, "d", chunk_size=4096)
    next(it)
    next(it)
    it.close()
    assert len(os.listdir("/proc/self/fd")) == before


# ---------------------------------------------------------------------------- destroy


def test_destroy_removes_folder_but_not_link_targets(store: FolderStore, outside: Path) -> None:
    write(store, "a/b/c.txt", "c")
    os.symlink(outside, store.data_dir / "out")
    os.symlink(outside / "secret.txt", store.data_dir / "a" / "s")
    write(store, "t.txt", "t")
    item = store.trash("t.txt", by="u")
    os.symlink(outside, store.trash_dir / item.id / "payload-link")
    store.upload_begin(new_id())
    store.destroy()
    assert not store.root.exists()
    assert not store.exists()
    assert (outside / "secret.txt").read_text() == "top secret"
    assert (outside / "sub" / "deep.txt").exists()
    store.destroy()  # already gone: fine


def test_restore_through_outside_link_is_refused(store: FolderStore, outside: Path) -> None:
    write(store, "f.txt", "f")
    item = store.trash("f.txt", by="u")
    os.symlink(outside, store.data_dir / "out")
    with pytest.raises(InvalidInput, match="outside"):
        store.restore(item.id, to="out/f.txt")
    assert not (outside / "f.txt").exists()
    assert [t.id for t in store.list_trash()] == [item.id]
    assert store.restore(item.id, to="back.txt") == "back.txt"


def test_open_read_without_proc_fallback(
    store: FolderStore, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fdops, "PROC_FD", "/nonexistent-proc")
    write(store, "a.txt", "A")
    os.symlink("a.txt", store.data_dir / "in")
    os.symlink(outside / "secret.txt", store.data_dir / "out")
    os.mkfifo(store.data_dir / "pipe")
    assert read_all(store, "a.txt") == b"A"
    assert read_all(store, "in") == b"A"
    with pytest.raises(InvalidInput, match="outside"):
        store.open_read("out")
    with pytest.raises(InvalidInput, match="not a regular file"):
        store.open_read("pipe")
