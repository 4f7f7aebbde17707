"""~/vfolders in a shared home (labfleet.spawner.homefolders), on a real filesystem: the link to
the sandbox's folder root, old mount points cleared, the user's files moved aside and never
deleted, and links the user planted never followed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from labfleet.spawner.homefolders import FOLDERS_ROOT, link_folders, unlink_folders
from labfleet.spawner.launch import Mount
from labfleet.spawner.sandbox import SandboxSpec, sandbox_command

NOW = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
ASIDE = "vfolders-moved-aside-20270115-080000"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "homes" / "alice"
    h.mkdir(parents=True)
    return h


def _tree(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (links not followed): relative path -> content, link target or '/'."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            out[rel] = f"-> {os.readlink(p)}" if p.is_symlink() else ("/" if p.is_dir() else p.read_text())
    return out


def test_a_fresh_home_gets_the_link_and_a_second_call_changes_nothing(home):
    first = link_folders(str(home), now=NOW)
    assert first.linked and first.moved == [] and first.removed == 0
    assert os.readlink(home / "vfolders") == FOLDERS_ROOT
    again = link_folders(str(home), now=NOW)
    assert again.linked and _tree(home) == {"vfolders": f"-> {FOLDERS_ROOT}"}


def test_old_mount_points_go_and_the_users_files_are_moved_aside_intact(home):
    old = home / "vfolders"
    (old / "data").mkdir(parents=True)  # an empty mount point an old session left
    (old / "work").mkdir()
    (old / "split").mkdir()
    (old / "split" / "results.csv").write_text("a file that never reached the folder")
    (old / "notes.txt").write_text("the user's own")
    (old / "shortcut").symlink_to("/etc")  # a link: moved as a link, never followed
    tidied = link_folders(str(home), now=NOW)
    assert tidied.linked and tidied.removed == 2 and not tidied.left
    assert sorted(tidied.moved) == [
        f"vfolders/notes.txt -> {ASIDE}/notes.txt",
        f"vfolders/shortcut -> {ASIDE}/shortcut",
        f"vfolders/split -> {ASIDE}/split",
    ]
    assert _tree(home) == {
        "vfolders": f"-> {FOLDERS_ROOT}",
        ASIDE: "/",
        f"{ASIDE}/notes.txt": "the user's own",
        f"{ASIDE}/shortcut": "-> /etc",
        f"{ASIDE}/split": "/",
        f"{ASIDE}/split/results.csv": "a file that never reached the folder",
    }
    assert (home / ASIDE).stat().st_uid == home.stat().st_uid


def test_a_planted_link_is_moved_aside_and_what_it_points_to_is_never_touched(home, tmp_path):
    outside = tmp_path / "outside"  # stands for /etc: a place the Hub (root) must never write to
    (outside / "keep").mkdir(parents=True)
    (outside / "passwd").write_text("root:x:0:0")
    before = _tree(outside)
    (home / "vfolders").symlink_to("../../outside")  # relative: it would resolve inside a sandbox too
    tidied = link_folders(str(home), now=NOW)
    assert tidied.moved == [f"vfolders -> {ASIDE}/vfolders"]
    assert _tree(outside) == before
    assert os.readlink(home / ASIDE / "vfolders") == "../../outside"
    assert os.readlink(home / "vfolders") == FOLDERS_ROOT


def test_a_file_in_the_way_is_moved_aside_and_an_earlier_aside_folder_is_kept(home):
    (home / ASIDE).mkdir()
    (home / ASIDE / "earlier").write_text("from an earlier tidy")
    (home / "vfolders").write_text("a file named vfolders")
    tidied = link_folders(str(home), now=NOW)
    assert tidied.moved == [f"vfolders -> {ASIDE}-1/vfolders"]
    assert (home / ASIDE / "earlier").read_text() == "from an earlier tidy"
    assert (home / f"{ASIDE}-1" / "vfolders").read_text() == "a file named vfolders"


def test_without_tidy_what_is_in_the_way_stays_and_the_reason_is_given(home):
    (home / "vfolders" / "data").mkdir(parents=True)  # maybe a mount point of a running session
    tidied = link_folders(str(home), tidy=False, now=NOW)
    assert not tidied.linked and "another session" in tidied.left
    assert _tree(home) == {"vfolders": "/", "vfolders/data": "/"}


def test_unlink_removes_only_the_link_it_made(home):
    assert unlink_folders(str(home)) is False  # nothing there
    link_folders(str(home), now=NOW)
    assert unlink_folders(str(home)) is True and _tree(home) == {}
    (home / "vfolders").symlink_to("/srv/elsewhere")  # the user's own link
    assert unlink_folders(str(home)) is False and os.readlink(home / "vfolders") == "/srv/elsewhere"
    (home / "vfolders").unlink()
    (home / "vfolders").mkdir()
    assert unlink_folders(str(home)) is False and (home / "vfolders").is_dir()
    assert unlink_folders(str(home / "gone")) is False


def test_the_sandbox_mounts_folders_in_a_tmpfs_of_its_own_made_read_only_once_they_are_in():
    cmd = sandbox_command(
        "bwrap",
        SandboxSpec(
            home="/h/alice",
            system=(("/usr", ""),),
            mounts=(
                Mount("/srv/vf/u/d", f"{FOLDERS_ROOT}/d", "ro"),
                Mount("/srv/vf/u/e", f"{FOLDERS_ROOT}/e"),
            ),
            folders_root=FOLDERS_ROOT,
        ),
    )
    text = " ".join(cmd)
    tmpfs = text.index(f"--perms 0755 --tmpfs {FOLDERS_ROOT}")
    assert tmpfs < text.index(f"--ro-bind /srv/vf/u/d {FOLDERS_ROOT}/d")
    assert text.index(f"--bind /srv/vf/u/e {FOLDERS_ROOT}/e") < text.index(f"--remount-ro {FOLDERS_ROOT}")
    assert text.index("--bind /h/alice /h/alice") < tmpfs
    # Without folders the root is there all the same: ~/vfolders never dangles into the home.
    bare = " ".join(sandbox_command("bwrap", SandboxSpec(home="/h/alice", folders_root=FOLDERS_ROOT)))
    assert f"--tmpfs {FOLDERS_ROOT}" in bare and f"--remount-ro {FOLDERS_ROOT}" in bare


# ------------------------------------------------------------------ an old ~/vfolders the user cannot clear

NOBODY = 65534


def _unprivileged(home: Path) -> tuple[int, int] | None:
    """The (uid, gid) that runs link_folders below: nobody when the test runs as root (root could clear
    anything), else None (the test's own user, kept out by the modes)."""
    if os.geteuid() != 0:
        return None
    os.chown(home, NOBODY, NOBODY)
    return NOBODY, NOBODY


def _link_as(account: tuple[int, int] | None, home: Path, **kw):
    """link_folders(home) as ``account`` (a forked child that drops to it), else here."""
    if account is None:
        return link_folders(str(home), **kw)
    import json
    from dataclasses import asdict

    from labfleet.spawner.homefolders import Tidied

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(account[1])
            os.setuid(account[0])
            out = link_folders(str(home), **kw)
            os.write(write, json.dumps(asdict(out)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        raw = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and raw, "link_folders failed in the child"
    return Tidied(**json.loads(raw))


@pytest.fixture
def open_home():
    """A home the unprivileged child can reach (pytest's tmp dirs are 0700 root's)."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="lf-homefolders-"))
    os.chmod(base, 0o711)
    h = base / "alice"
    h.mkdir()
    yield h
    for dirpath, dirnames, _ in os.walk(base):  # as the test user: give back what the modes took
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o755)
    shutil.rmtree(base)


def test_an_old_vfolders_of_roots_mount_points_is_renamed_aside_whole_and_nothing_is_deleted(open_home):
    """What Docker leaves in a shared home volume: ``vfolders`` and its mount points made by root
    (0755), which the session's user cannot empty. Renamed aside within the home instead (no write
    permission on it needed), beside an earlier aside folder of the same second, which stays."""
    home = open_home
    account = _unprivileged(home)
    old = home / "vfolders"
    (old / "x").mkdir(parents=True)  # an empty mount point
    (old / "split").mkdir()
    (old / "split" / "results.csv").write_text("the user's, written before the folder split")
    (old / "notes.txt").write_text("the user's own")  # tried first: the aside folder made for it is used
    (home / ASIDE).mkdir()  # an earlier aside folder: kept as it is
    (home / ASIDE / "earlier").write_text("from an earlier tidy")
    if account is None:
        os.chmod(old, 0o555)  # the test's own user may not change it either
    else:
        os.chown(home / ASIDE, *account)
        os.chown(home / ASIDE / "earlier", *account)
    tidied = _link_as(account, home, now=NOW)
    assert tidied.linked and not tidied.left, tidied
    assert tidied.moved == [f"vfolders -> {ASIDE}-1"] and tidied.removed == 0
    assert os.readlink(home / "vfolders") == FOLDERS_ROOT
    assert _tree(home) == {
        "vfolders": f"-> {FOLDERS_ROOT}",
        ASIDE: "/",
        f"{ASIDE}/earlier": "from an earlier tidy",
        f"{ASIDE}-1": "/",
        f"{ASIDE}-1/notes.txt": "the user's own",
        f"{ASIDE}-1/x": "/",
        f"{ASIDE}-1/split": "/",
        f"{ASIDE}-1/split/results.csv": "the user's, written before the folder split",
    }


def test_a_root_owned_mount_point_that_is_not_empty_sends_the_whole_old_vfolders_aside(open_home):
    """``vfolders`` is the user's, but a mount point inside it is root's and holds a nested one: it
    cannot be moved into another folder (its ``..`` would change), so the whole ``vfolders`` goes."""
    home = open_home
    account = _unprivileged(home)
    old = home / "vfolders"
    (old / "outer" / "inner").mkdir(parents=True)
    (old / "notes.txt").write_text("the user's own")
    if account is None:
        os.chmod(old / "outer", 0o555)
    else:
        os.chown(old, *account)
        os.chown(old / "notes.txt", *account)
    tidied = _link_as(account, home, now=NOW)
    assert tidied.linked and not tidied.left, tidied
    # The user's file went first (into the aside folder), then the rest, whole, beside it.
    assert tidied.moved == [f"vfolders/notes.txt -> {ASIDE}/notes.txt", f"vfolders -> {ASIDE}-1"]
    assert _tree(home) == {
        "vfolders": f"-> {FOLDERS_ROOT}",
        ASIDE: "/",
        f"{ASIDE}/notes.txt": "the user's own",
        f"{ASIDE}-1": "/",
        f"{ASIDE}-1/outer": "/",
        f"{ASIDE}-1/outer/inner": "/",
    }


def test_a_home_the_user_may_not_write_is_left_as_it_is_with_the_reason(open_home):
    home = open_home
    account = _unprivileged(home)
    (home / "vfolders" / "x").mkdir(parents=True)
    os.chmod(home, 0o555)  # not even the home may change (a read-only home)
    if account is None:
        os.chmod(home / "vfolders", 0o555)
    tidied = _link_as(account, home, now=NOW)
    assert not tidied.linked and tidied.moved == []
    assert tidied.left == "~/vfolders could not be cleared: Permission denied"
    assert _tree(home) == {"vfolders": "/", "vfolders/x": "/"}
