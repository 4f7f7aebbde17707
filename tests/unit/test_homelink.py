"""Folders never split in a home the user's Docker and Swarm sessions share: the folders mounted at
/vfolders/<name> (a root-owned tmpfs of the container's), the spawner's word to the session in its
environment, and the session linking ~/vfolders there when its server starts
(labfleet.session.homelink), saying on stderr what it moved aside or could not do."""

from __future__ import annotations

import io
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from labfleet.session.homelink import folders_home, link_home_folders
from labfleet.spawner.docker_config import container_config
from labfleet.spawner.homefolders import FOLDERS_ROOT, FOLDERS_ROOT_ENV, FOLDERS_TIDY_ENV
from labfleet.spawner.launch import Mount, build_launch
from labfleet.spawner.mixin import LabfleetSpawnerMixin
from labfleet.spawner.options import parse_options
from labfleet.spawner.swarm_config import ServiceMount, service_config

NOW_ASIDE = "vfolders-moved-aside-"
NODE_ID = "mj04adkh57559hq575bdruq1n"
LABELS = {"swarm.node_id": NODE_ID, "address": "10.77.0.2"}


def _env(home: Path, tidy: str = "1") -> dict[str, str]:
    return {
        FOLDERS_ROOT_ENV: FOLDERS_ROOT,
        FOLDERS_TIDY_ENV: tidy,
        "LABFLEET_VFOLDER_DIR": f"{home}/vfolders",
        "HOME": "/elsewhere",
    }


# ------------------------------------------------------------------ the session's side


def test_the_session_links_its_home_and_reports_what_it_moved_aside(tmp_path):
    home = tmp_path / "jovyan"
    (home / "vfolders" / "A").mkdir(parents=True)  # an old, empty mount point: removed
    (home / "vfolders" / "notes.txt").write_text("the user's own")
    err = io.StringIO()
    tidied = link_home_folders(_env(home), err)
    assert tidied is not None and tidied.linked and tidied.removed == 1
    assert os.readlink(home / "vfolders") == FOLDERS_ROOT
    (aside,) = [p for p in home.iterdir() if p.name.startswith(NOW_ASIDE)]
    assert (aside / "notes.txt").read_text() == "the user's own"
    assert err.getvalue() == (
        f"labfleet: moved aside in the home: vfolders/notes.txt -> {aside.name}/notes.txt (in {home})\n"
    )
    # Started again: the link is there, nothing to say.
    err = io.StringIO()
    assert link_home_folders(_env(home), err).linked and err.getvalue() == ""  # type: ignore[union-attr]


def test_while_another_session_runs_an_old_vfolders_stays_and_the_log_says_where_the_folders_are(tmp_path):
    home = tmp_path / "jovyan"
    (home / "vfolders" / "A").mkdir(parents=True)  # maybe the other session's
    err = io.StringIO()
    tidied = link_home_folders(_env(home, tidy="0"), err)
    assert tidied is not None and not tidied.linked and (home / "vfolders" / "A").is_dir()
    line = err.getvalue()
    assert (
        "another session of the user is running" in line and f"folders are at {FOLDERS_ROOT}/<name>" in line
    )
    assert f"(in {home})" in line


def test_no_word_from_the_spawner_touches_nothing(tmp_path):
    home = tmp_path / "jovyan"
    home.mkdir()
    err = io.StringIO()
    env = _env(home)
    del env[FOLDERS_ROOT_ENV]
    assert link_home_folders(env, err) is None
    assert link_home_folders({**env, FOLDERS_ROOT_ENV: "relative"}, err) is None
    assert list(home.iterdir()) == [] and err.getvalue() == ""


def test_a_missing_home_is_reported_not_raised(tmp_path):
    err = io.StringIO()
    tidied = link_home_folders(_env(tmp_path / "gone"), err)
    assert tidied is not None and not tidied.linked
    assert f"{tmp_path}/gone/vfolders could not be linked: No such file or directory" in err.getvalue()


def test_the_home_is_the_spawners_container_home_else_home():
    assert folders_home({"LABFLEET_VFOLDER_DIR": "/home/jovyan/vfolders", "HOME": "/x"}) == "/home/jovyan"
    assert folders_home({"LABFLEET_VFOLDER_DIR": "/home/jovyan/vfolders/", "HOME": "/x"}) == "/home/jovyan"
    assert folders_home({"LABFLEET_VFOLDER_DIR": "/data/folders", "HOME": "/x"}) == "/x"
    assert folders_home({"HOME": "/x"}) == "/x"


def test_the_extension_links_when_it_loads(tmp_path, monkeypatch, capsys):
    from labfleet.session.extension import LabfleetExtension

    home = tmp_path / "jovyan"
    home.mkdir()
    for k, v in _env(home).items():
        monkeypatch.setenv(k, v)
    for k in ("LABFLEET_SESSION_TYPE", "LABFLEET_COMMAND"):
        monkeypatch.delenv(k, raising=False)
    ext = LabfleetExtension()
    ext.initialize_settings()
    assert os.readlink(home / "vfolders") == FOLDERS_ROOT


# ------------------------------------------------------------------ the spawner's side


class _Backend:
    def get_env(self) -> dict[str, str]:
        return {}


class Linking(LabfleetSpawnerMixin, _Backend):
    lf_session_links_folders = True

    def lf_session_home(self) -> str:
        return "/home/jovyan"


def _server(active: bool, stopping: bool = False) -> Any:
    return SimpleNamespace(active=active, _stop_pending=stopping)


def test_a_linking_backend_mounts_under_the_root_and_tells_the_session_whether_to_tidy():
    sp = Linking()
    sp.user = SimpleNamespace(name="alice", spawners={"": sp})
    assert sp.lf_folders_dir() == FOLDERS_ROOT
    env = sp.get_env()
    assert env[FOLDERS_ROOT_ENV] == FOLDERS_ROOT and env[FOLDERS_TIDY_ENV] == "1"
    assert env["LABFLEET_VFOLDER_DIR"] == "/home/jovyan/vfolders"  # where the file browser shows them
    # Another server of the user runs or starts: an old ~/vfolders may be its mount points.
    sp.user.spawners["b"] = _server(active=True)
    assert sp.get_env()[FOLDERS_TIDY_ENV] == "0"
    sp.user.spawners["b"] = _server(active=True, stopping=True)
    sp.user.spawners["c"] = _server(active=False)
    assert sp.get_env()[FOLDERS_TIDY_ENV] == "1"


def test_other_backends_mount_in_the_home_and_say_nothing():
    class InHome(Linking):
        lf_session_links_folders = False

    sp = InHome()
    assert sp.lf_folders_dir() == "/home/jovyan/vfolders"
    assert FOLDERS_ROOT_ENV not in sp.get_env() and FOLDERS_TIDY_ENV not in sp.get_env()


def _spec(mounts=()):
    session = {
        "id": "s-1",
        "name": "a",
        "user": "alice",
        "project": "acme/ml",
        "node": "node-2",
        "slots": {"cpu": "1"},
        "devices": [],
    }
    options = parse_options({"project": "acme/ml", "image": "lab/py:1"})
    return build_launch(session, options, mounts=tuple(mounts), in_container=True)


def test_docker_gets_a_root_owned_tmpfs_root_that_no_mount_may_cover():
    folders = [Mount("/srv/vf/a", f"{FOLDERS_ROOT}/a", "ro")]
    cfg = container_config(_spec(folders), folders_root=FOLDERS_ROOT)
    assert cfg.extra_host_config["tmpfs"] == {FOLDERS_ROOT: "mode=0755,size=1048576"}
    assert cfg.volumes == {"/srv/vf/a": {"bind": f"{FOLDERS_ROOT}/a", "mode": "ro"}}
    # With no folder the root is there all the same: ~/vfolders never dangles.
    assert container_config(_spec(), folders_root=FOLDERS_ROOT).extra_host_config["tmpfs"]
    with pytest.raises(ValueError, match="a mount covers the folders' root"):
        container_config(_spec([Mount("/srv/x", FOLDERS_ROOT, "rw")]), folders_root=FOLDERS_ROOT)
    for bad in ("vfolders", "/"):
        with pytest.raises(ValueError, match="absolute path other than /"):
            container_config(_spec(), folders_root=bad)


def test_a_swarm_service_mounts_the_folders_under_the_root_in_a_tmpfs_of_its_own():
    cfg = service_config(
        _spec([Mount("/srv/vf/a", f"{FOLDERS_ROOT}/a", "wd")]), LABELS, folders_root=FOLDERS_ROOT
    )
    assert cfg.mounts == [
        ServiceMount("", FOLDERS_ROOT, False, type="tmpfs", tmpfs_mode=0o755, tmpfs_size=2**20),
        ServiceMount("/srv/vf/a", f"{FOLDERS_ROOT}/a", False),
    ]
    assert "tmpfs" not in cfg.dropped


async def test_the_swarm_spawner_puts_the_folders_under_the_root_in_the_task_it_creates():
    from labfleet.spawner.swarm import LabfleetSwarmSpawner

    spawner = LabfleetSwarmSpawner(node_labels={"node-2": LABELS}, network_name="host")
    spawner.user = SimpleNamespace(name="alice", url="/user/alice/", settings={})
    assert spawner.lf_folders_dir() == FOLDERS_ROOT
    session = {"mounts": [{"vfolder": "f1", "name": "data", "source": "/srv/vf/data", "permission": "ro"}]}
    mounts = spawner.lf_session_mounts(session, parse_options({"project": "acme/ml"}))
    assert [m.target for m in mounts] == [f"{FOLDERS_ROOT}/data"]

    class Reply:
        code, data, message, ok = 200, [], "", True

    async def lf_call(method, path, body=None):
        return Reply()

    created: dict[str, Any] = {}

    async def docker_call(method, *args, **kwargs):
        assert method == "create_service", method
        created.update(kwargs)
        return {"ID": "svc"}

    async def command():
        return ["jupyterhub-singleuser"]

    spawner.lf_call = lf_call  # type: ignore[method-assign]
    spawner.docker = docker_call  # type: ignore[method-assign]
    spawner.get_command = command  # type: ignore[method-assign]
    spawner.get_env = lambda: {}  # type: ignore[method-assign]
    await spawner.lf_prepare(_spec(mounts))
    await spawner.create_object()
    got = created["task_template"]["ContainerSpec"]["Mounts"]
    assert got == [
        {
            "Target": FOLDERS_ROOT,
            "Source": None,
            "Type": "tmpfs",
            "ReadOnly": False,
            "TmpfsOptions": {"Mode": 0o755, "SizeBytes": 2**20},
        },
        {"Target": f"{FOLDERS_ROOT}/data", "Source": "/srv/vf/data", "Type": "bind", "ReadOnly": True},
    ]
