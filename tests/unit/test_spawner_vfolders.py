"""Virtual folders in the spawner: the option, the service's mounts as Mounts under ~/vfolders,
the admission body, the backends' mounts (local sandbox and symlinks, Docker binds) and the form."""

from __future__ import annotations

import asyncio
import os
import subprocess
from typing import Any
from unittest import mock

import pytest
from jupyterhub.spawner import SpawnException

from labfleet.core.http import HTTPReply
from labfleet.spawner.docker import LabfleetDockerSpawner
from labfleet.spawner.docker_config import container_config
from labfleet.spawner.form import render
from labfleet.spawner.homefolders import FOLDERS_ROOT
from labfleet.spawner.launch import Mount, build_launch, vfolder_mounts
from labfleet.spawner.local import LabfleetLocalSpawner, _bwrap_works, _link
from labfleet.spawner.mixin import LabfleetSpawnerMixin
from labfleet.spawner.options import MAX_VFOLDERS, OptionsError, options_from_form, parse_options
from labfleet.spawner.sandbox import SandboxSpec, sandbox_command

FID = "0f8c2a9e-4b1d-4c3a-9e6f-1a2b3c4d5e6f"
FID2 = "7d3e9b10-2c4f-4a8b-b1c2-d3e4f5a6b7c8"


# ------------------------------------------------------------------ the option


@pytest.mark.parametrize(
    "raw, expected",
    [
        (["data"], ("data",)),
        ([".config", "a_b.c-1", "x" * 64], (".config", "a_b.c-1", "x" * 64)),
        ([FID, "data"], (FID, "data")),
        ("data, .cache  models", ("data", ".cache", "models")),
        ([" data "], ("data",)),
        ([], ()),
    ],
)
def test_vfolders_are_names_or_ids(raw, expected):
    o = parse_options({"project": "ml", "vfolders": raw})
    assert o.vfolders == expected
    assert parse_options(o.to_json()) == o


@pytest.mark.parametrize(
    "value, words",
    [
        (["."], "'.' is not a folder name"),
        ([".."], "'..' is not a folder name"),
        (["../x"], "'../x' is not a folder name"),
        (["a/b"], "'a/b' is not a folder name"),
        (["a b"], "is not a folder name"),
        ([""], "'' is not a folder name"),
        (["x" * 65], "is not a folder name"),
        (["d\x00"], "is not a folder name"),
        ([1], "vfolder must be a name or id, not int"),
        ([None], "vfolder must be a name or id, not NoneType"),
        ({"a": 1}, "vfolders must be a list of folder names or ids"),
        (["a"] * (MAX_VFOLDERS + 1), f"at most {MAX_VFOLDERS} vfolders"),
        (["data", "models", "data"], "vfolder 'data' is named twice"),
        ([FID, FID], "named twice"),
    ],
)
def test_bad_vfolders_say_why(value, words):
    with pytest.raises(OptionsError) as e:
        parse_options({"project": "ml", "vfolders": value})
    assert words in str(e.value)


def test_form_checkboxes_become_the_vfolders_option():
    raw = options_from_form({"_xsrf": ["t"], "project": ["ml"], "vfolders": [FID, FID2, ""]})
    assert raw == {"project": "ml", "vfolders": [FID, FID2]}
    assert parse_options(raw).vfolders == (FID, FID2)
    # No box checked: the field is absent, and so is the option.
    assert parse_options(options_from_form({"project": ["ml"]})).vfolders == ()


# ------------------------------------------------------------------ the service's mounts


def _mount(name: str, source: str, permission: str = "rw", vid: str = FID) -> dict[str, Any]:
    return {"vfolder": vid, "name": name, "source": source, "permission": permission}


def test_reply_mounts_go_under_the_home_vfolders_with_their_permission():
    session = {
        "mounts": [
            _mount("ref", "/srv/vf/u/ref", "ro"),
            _mount("work", "/srv/vf/u/work", "rw", FID2),
            _mount("scratch", "/srv/vf/p/scratch", "wd"),
            _mount(".config", "/srv/vf/u/.config", "rw"),
        ]
    }
    assert vfolder_mounts(session, "/home/alice/vfolders/") == (
        Mount("/srv/vf/u/ref", "/home/alice/vfolders/ref", "ro"),
        Mount("/srv/vf/u/work", "/home/alice/vfolders/work", "rw"),
        Mount("/srv/vf/p/scratch", "/home/alice/vfolders/scratch", "wd"),
        Mount("/srv/vf/u/.config", "/home/alice/vfolders/.config", "rw"),
    )
    # A service from before virtual folders says nothing; an empty list is no folder either.
    assert (
        vfolder_mounts({}, "/home/alice/vfolders") == () and vfolder_mounts({"mounts": []}, "relative") == ()
    )


@pytest.mark.parametrize(
    "mounts, words",
    [
        ([_mount("../x", "/srv/x")], "'../x' is not a valid folder name"),
        ([_mount("a/b", "/srv/x")], "'a/b' is not a valid folder name"),
        ([_mount("..", "/srv/x")], "'..' is not a valid folder name"),
        ([_mount(".", "/srv/x")], "'.' is not a valid folder name"),
        ([_mount("", "/srv/x")], "is not a valid folder name"),
        ([{"source": "/srv/x", "permission": "rw"}], "None' is not a valid folder name"),
        ([_mount("d", "srv/x")], "source 'srv/x' is not an absolute path"),
        ([_mount("d", "")], "is not an absolute path"),
        ([{"name": "d", "permission": "rw"}], "is not an absolute path"),
        ([_mount("d", "/srv/../etc")], "has a '..' component"),
        ([_mount("d", "/srv/x\x00")], "is not an absolute path"),
        ([_mount("d", "/srv/x", "rwx")], "permission must be one of ro, rw, wd, not 'rwx'"),
        ([_mount("d", "/srv/x"), _mount("d", "/srv/y", "ro", FID2)], "two folders are named 'd'"),
        (["d"], "a mount must be an object"),
        ({"d": "/srv/x"}, "mounts must be a list"),
    ],
)
def test_bad_reply_mounts_are_refused(mounts, words):
    with pytest.raises(ValueError) as e:
        vfolder_mounts({"mounts": mounts}, "/home/alice/vfolders")
    assert words in str(e.value)


def test_a_folder_cannot_cover_a_backend_mount_or_go_under_a_relative_home():
    session = {"mounts": [_mount("data", "/srv/vf/data")]}
    with pytest.raises(ValueError, match="already a mount of this hub"):
        vfolder_mounts(session, "/home/alice/vfolders", taken=["/home/alice/vfolders/data"])
    with pytest.raises(ValueError, match="absolute path"):
        vfolder_mounts(session, "home/alice/vfolders")


# ------------------------------------------------------------------ the mixin


class _Backend:
    """What the mixin calls on the JupyterHub spawner below it."""

    async def start(self):
        return "http://127.0.0.1:9"


class FakeSpawner(LabfleetSpawnerMixin, _Backend):
    name = "a"
    lf_username = "alice"  # type: ignore[assignment]
    _log_name = "alice/a"

    def __init__(self, session: dict[str, Any], **kwargs):
        super().__init__(**kwargs)
        self.session = session
        self.calls: list[tuple[str, str, Any]] = []

    async def lf_call(self, method, path, body=None):
        self.calls.append((method, path, body))
        if method == "POST":
            return HTTPReply(201, dict(self.session))
        return HTTPReply(200, {})

    def lf_session_home(self) -> str:
        return "/home/alice"


def _session(**extra):
    return {
        "id": "s1",
        "name": "a",
        "user": "alice",
        "project": "acme/ml",
        "status": "SCHEDULED",
        "node": "n1",
        "image": "local/host",
        "slots": {"cpu": 1},
        "devices": [],
        **extra,
    }


def test_admission_body_names_the_folders_only_when_there_are_some():
    sp = FakeSpawner(_session())
    body = sp._lf_admission_body(parse_options({"project": "ml", "vfolders": ["data", FID]}))
    assert body["vfolders"] == ["data", FID] and body["project"] == "ml" and body["username"] == "alice"
    assert "vfolders" not in sp._lf_admission_body(parse_options({"project": "ml"}))


async def test_start_sends_the_folders_and_mounts_what_the_service_placed(tmp_path):
    mounts = [_mount("data", "/srv/vf/data", "ro"), _mount(".cache", "/srv/vf/.cache", "wd", FID2)]
    sp = FakeSpawner(_session(mounts=mounts), session_log_dir=str(tmp_path))
    sp.lf_options = parse_options({"project": "ml", "vfolders": ["data"]})
    assert await sp.start() == "http://127.0.0.1:9"
    method, path, body = sp.calls[0]
    assert (method, path, body["vfolders"]) == ("POST", "/sessions", ["data"])
    assert sp.lf_launch is not None
    assert sp.lf_launch.mounts == (
        Mount("/srv/vf/data", "/home/alice/vfolders/data", "ro"),
        Mount("/srv/vf/.cache", "/home/alice/vfolders/.cache", "wd"),
    )
    assert [c[2]["status"] for c in sp.calls if c[0] == "PATCH"] == ["PREPARING", "RUNNING"]


async def test_a_bad_reply_mount_fails_the_spawn_and_gives_the_allocation_back(tmp_path):
    sp = FakeSpawner(_session(mounts=[_mount("../../etc", "/srv/vf/x")]), session_log_dir=str(tmp_path))
    sp.lf_options = parse_options({"project": "ml"})
    with pytest.raises(SpawnException) as e:
        await sp.start()
    assert e.value.status_code == 502
    assert "cannot mount the session's virtual folders" in str(e.value) and "../../etc" in str(e.value)
    (patch,) = [c for c in sp.calls if c[0] == "PATCH"]
    assert patch[2]["status"] == "ERROR" and sp.lf_session_id is None and sp.lf_launch is None


def test_backend_mounts_come_first_and_a_folder_may_not_cover_one():
    class WithOwn(FakeSpawner):
        def lf_mounts(self, options):
            return (Mount("/srv/shared", "/home/alice/vfolders/shared", "ro"),)

    options = parse_options({"project": "ml"})
    sp = WithOwn(_session())
    ok = sp.lf_session_mounts(_session(mounts=[_mount("mine", "/srv/vf/mine")]), options)
    assert [m.target for m in ok] == ["/home/alice/vfolders/shared", "/home/alice/vfolders/mine"]
    assert sp.lf_session_mounts(_session(), options) == ok[:1]  # an older service: no "mounts"
    with pytest.raises(SpawnException, match="already a mount of this hub"):
        sp.lf_session_mounts(_session(mounts=[_mount("shared", "/srv/vf/s")]), options)


def test_a_backend_without_a_home_fails_only_when_there_is_a_folder():
    class NoHome(LabfleetSpawnerMixin):
        pass

    options = parse_options({"project": "ml"})
    assert NoHome().lf_session_mounts(_session(mounts=[]), options) == ()
    with pytest.raises(NotImplementedError):
        NoHome().lf_session_mounts(_session(mounts=[_mount("d", "/srv/d")]), options)


# ------------------------------------------------------------------ backends


def _local(tmp_path, **kwargs) -> LabfleetLocalSpawner:
    # No control groups and the host's network: these tests run the sandbox by hand, not under a Hub.
    kwargs = {"cgroup_parent": "", "session_network": "host", **kwargs}
    user = mock.Mock()
    user.name = "alice"
    return LabfleetLocalSpawner(home_dir=str(tmp_path / "home" / "alice"), user=user, **kwargs)


def test_local_home_and_relative_extra_mounts(tmp_path):
    sp = _local(tmp_path, extra_mounts=[{"source": "/srv/x", "target": "x", "mode": "ro"}])
    home = str(tmp_path / "home" / "alice")
    assert sp.lf_session_home() == home
    assert sp.lf_mounts(None) == (Mount("/srv/x", f"{home}/x", "ro"),)


def test_local_without_sandbox_links_the_folders_under_vfolders(tmp_path):
    src = {n: tmp_path / "store" / n for n in ("data", "new", "other")}
    for p in src.values():
        p.mkdir(parents=True)
    sp = _local(tmp_path, sandbox="no")
    home = tmp_path / "home" / "alice"
    (home / "vfolders" / "mine").mkdir(parents=True)
    (home / "vfolders" / "mine" / "notes.txt").write_text("the user's own")
    (home / "vfolders" / "data").symlink_to(src["other"])  # a stale link of an earlier session
    (home / "vfolders" / "new").mkdir()  # an empty mount point of a sandboxed session
    session = _session(
        mounts=[
            _mount("data", str(src["data"]), "ro"),
            _mount("new", str(src["new"])),
            _mount("mine", str(src["other"])),
        ]
    )
    options = parse_options({"project": "ml"})
    asyncio.run(sp.lf_prepare(build_launch(session, options, mounts=sp.lf_session_mounts(session, options))))
    assert (home / "vfolders" / "data").resolve() == src["data"]
    assert (home / "vfolders" / "new").resolve() == src["new"]
    # The user's own folder of that name stays as it was.
    assert not (home / "vfolders" / "mine").is_symlink()
    assert (home / "vfolders" / "mine" / "notes.txt").read_text() == "the user's own"


def test_link_keeps_a_right_link_and_refuses_a_file(tmp_path):
    log = mock.Mock()
    target = tmp_path / "vfolders" / "d"
    _link(target, "/srv/d", log)
    _link(target, "/srv/d", log)
    assert target.readlink().as_posix() == "/srv/d" and not log.warning.called
    f = tmp_path / "vfolders" / "f"
    f.write_text("x")
    _link(f, "/srv/f", log)
    assert f.read_text() == "x" and log.warning.called


def test_sandbox_binds_folders_from_a_storage_root_it_does_not_show():
    cmd = sandbox_command(
        "bwrap",
        SandboxSpec(
            home="/h/alice",
            system=(("/usr", ""),),
            mounts=(Mount("/srv/vf/u/d", "/h/alice/vfolders/d", "ro"),),
            hidden=("/srv/vf",),
        ),
    )
    text = " ".join(cmd)
    assert "--ro-bind /srv/vf/u/d /h/alice/vfolders/d" in text and "--tmpfs /srv/vf" not in text
    assert text.index("--bind /h/alice /h/alice") < text.index("/srv/vf/u/d")


@pytest.mark.skipif(not _bwrap_works("/usr/bin/bwrap"), reason="bubblewrap cannot run here")
def test_sandboxed_ro_folder_is_read_only_and_rw_is_writable(tmp_path):
    store = tmp_path / "store"
    for n in ("ro", "rw"):
        (store / n).mkdir(parents=True)
    sp = _local(tmp_path, sandbox="yes", bwrap_path="/usr/bin/bwrap")
    account = sp._account()
    if account is not None:  # as root the session runs as the session account: the folders are its
        for n in ("ro", "rw"):
            os.chown(store / n, *account)
    sp.get_env = lambda: {}  # type: ignore[method-assign]
    session = _session(
        mounts=[_mount("ro", str(store / "ro"), "ro"), _mount("rw", str(store / "rw"), "wd", FID2)]
    )
    options = parse_options({"project": "ml"})
    asyncio.run(sp.lf_prepare(build_launch(session, options, mounts=sp.lf_session_mounts(session, options))))
    home = tmp_path / "home" / "alice"
    # No mount point on the host: ~/vfolders is the link to the sandbox's own folder root.
    assert os.readlink(home / "vfolders") == FOLDERS_ROOT and not (store / "ro" / "f").exists()
    script = (
        "cd ~/vfolders && ls; (echo x > ro/f) 2>/dev/null; echo ro=$?; echo y > rw/f; echo rw=$?;"
        " (echo z > new) 2>/dev/null; echo new=$?"
    )
    out = subprocess.run([*sp.shell_cmd, script], capture_output=True, text=True, timeout=30)
    assert out.stdout.split()[:2] == ["ro", "rw"], out  # the session's folders, and nothing else
    assert "ro=1" in out.stdout or "ro=2" in out.stdout, out
    assert "rw=0" in out.stdout, out
    assert "new=0" not in out.stdout, out  # the folder root takes no file of the session's
    assert not (store / "ro" / "f").exists() and (store / "rw" / "f").read_text() == "y\n"
    assert sorted(p.name for p in home.iterdir()) == ["vfolders"]  # nothing else made in the home


def test_docker_mounts_folders_under_their_own_root_as_binds_never_in_the_home():
    sp = LabfleetDockerSpawner(user=mock.Mock(), container_home="/home/jovyan/")
    assert sp.lf_session_home() == "/home/jovyan/" and sp.lf_folders_dir() == FOLDERS_ROOT
    session = _session(
        mounts=[
            _mount("ref", "/srv/vf/ref", "ro"),
            _mount("work", "/srv/vf/work", "rw"),
            _mount("scratch", "/srv/vf/scratch", "wd"),
        ]
    )
    options = parse_options({"project": "ml", "image": "repo/x:1"})
    spec = build_launch(session, options, mounts=sp.lf_session_mounts(session, options), in_container=True)
    cfg = sp.lf_container_config(spec)
    assert cfg.volumes == {
        "/srv/vf/ref": {"bind": "/vfolders/ref", "mode": "ro"},
        "/srv/vf/work": {"bind": "/vfolders/work", "mode": "rw"},
        "/srv/vf/scratch": {"bind": "/vfolders/scratch", "mode": "rw"},
    }
    # The root: a small tmpfs of the container's, root's and read-only to the session user.
    assert cfg.extra_host_config["tmpfs"] == {FOLDERS_ROOT: "mode=0755,size=1048576"}
    assert container_config(spec).extra_host_config.get("tmpfs") is None  # the pure builder's default


# ------------------------------------------------------------------ the form

CHOICES = {
    "projects": [{"name": "acme/ml", "left": {}}, {"name": "acme/web", "left": {}}],
    "images": [],
    "resource_groups": [],
}


def _folder(fid, name, **extra):
    return {
        "id": fid,
        "name": name,
        "owner": "user:alice",
        "permission": "rw",
        "usage_mode": "general",
        "host": "local",
        "auto": False,
        "mountable": True,
        **extra,
    }


def test_form_offers_one_checkbox_per_mountable_folder():
    folders = [
        _folder(FID, "data"),
        _folder(FID2, "ref", owner="project:acme/ml", permission="ro", usage_mode="model"),
        _folder("11111111-2222-4333-8444-555555555555", "elsewhere", mountable=False),
    ]
    html = render({**CHOICES, "vfolders": folders}, previous={"vfolders": [FID2]})
    assert '<fieldset class="mb-3" id="lf-vfolders">' in html and "Virtual folders" in html
    assert f'name="vfolders" value="{FID}">' in html
    assert f'name="vfolders" value="{FID2}" checked>' in html  # chosen the last time
    assert "elsewhere" not in html  # the storage host does not let this user mount it
    assert '<span class="badge text-bg-secondary">read-only</span>' in html and "read-write" in html
    assert "project acme/ml" in html and 'data-project="acme/ml"' in html and "model" in html


def test_form_shows_automatic_folders_checked_and_does_not_send_them():
    html = render({**CHOICES, "vfolders": [_folder(FID, ".config", auto=True)]})
    (row,) = [line for line in html.splitlines() if "lf-vf-0" in line and "<input" in line]
    assert "checked disabled" in row and "name=" not in row and FID not in html
    assert "mounted automatically" in html and ".config" in html


def test_form_escapes_folder_names_and_owners():
    evil = '"><script>alert(1)</script>'
    html = render({**CHOICES, "vfolders": [_folder(FID + evil, evil, owner="user:" + evil)]})
    assert "<script>alert(1)</script>" not in html and '"><script' not in html
    assert "&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in html


@pytest.mark.parametrize("folders", [None, [], [_folder(FID, "x", mountable=False)]])
def test_no_fieldset_without_folders_to_offer(folders):
    choices = dict(CHOICES) if folders is None else {**CHOICES, "vfolders": folders}
    assert "lf-vfolders" not in render(choices)


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root Hub switches sessions to the session account")
def test_a_root_hub_refuses_to_start_a_session_as_root(tmp_path):
    # No such account: the spawn fails with how to make one, it never falls back to root.
    sp = _local(tmp_path, session_user="labfleet-no-such-account")
    with pytest.raises(SpawnException, match="useradd") as e:
        sp._account()
    assert e.value.status_code == 503
    # A missing bubblewrap, too.
    sp = _local(tmp_path, bwrap_path="/nonexistent/bwrap")
    with pytest.raises(SpawnException, match="never run unsandboxed as root"):
        sp._bwrap()


def test_bad_session_network_settings_fail_the_spawn_with_the_reason(tmp_path):
    sp = _local(tmp_path, session_network="isolated", session_subnet="10.1.2.3/24")
    sp.user.settings = {"proxy": mock.Mock(public_url="http://127.0.0.1:8000/")}
    if os.geteuid() == 0:
        with pytest.raises(SpawnException, match="session subnet .* host bits"):
            sp._network()
    sp = _local(tmp_path, session_network="sideways")
    sp.user.settings = {}
    if os.geteuid() == 0:
        with pytest.raises(SpawnException, match="isolated or host"):
            sp._network()
