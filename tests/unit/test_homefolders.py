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
