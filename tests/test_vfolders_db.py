"""Virtual folders on SQLite and on a real PostgreSQL server: uploads racing at a quota's
edge never pass it together, the folder count limit, and mounts resolved for a session."""

from concurrent.futures import ThreadPoolExecutor
from threading import Barrier

import pytest
from sqlalchemy import func, select

from hub_ext.core import db as lfdb
from hub_ext.core.authz import Actor
from hub_ext.core.errors import LabfleetError
from hub_ext.core.models import VFolderUpload
from hub_ext.core.secretbox import ensure_key_file
from hub_ext.storage import folders as vfolders
from hub_ext.storage import hosts
from hub_ext.storage import quota as vfquota
from hub_ext.tenancy import directory, policies
from hub_ext.tenancy.policies import ensure_default_keypair_policy
from tests.postgres_server import fresh_database

CLI = Actor.cli()
LIMIT = 10_000


@pytest.fixture(params=["sqlite", "postgres"])
def world(request, tmp_path, monkeypatch):
    monkeypatch.setenv("LABFLEET_SECRET_KEY_FILE", str(tmp_path / "key"))
    ensure_key_file(tmp_path / "key")
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'lf.sqlite'}"
        engine = lfdb.make_engine(url)
    else:
        url = fresh_database(
            request.getfixturevalue("postgres_url"), "vf_" + request.node.name[-10:].strip("[]-")
        )
        engine = lfdb.make_engine(url, pool_size=30, max_overflow=10)
    lfdb.upgrade(engine)
    factory = lfdb.make_session_factory(engine)
    with lfdb.session_scope(factory) as db:
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
    with lfdb.session_scope(factory) as db:
        return directory.actor_for(directory.get_user(db, name))


def test_racing_reservations_never_pass_the_scope_limit(world):
    factory = world
    alice = _actor(factory)
    with lfdb.session_scope(factory) as db:
        a = vfolders.create(db, alice, {"name": "a"}, default_host="local").id
        b = vfolders.create(db, alice, {"name": "b"}, default_host="local").id
    # 30 uploads of 1,000 bytes into two folders of one scope (limit 10,000), all at once.
    barrier = Barrier(30)

    def one(i):
        barrier.wait()
        try:
            with lfdb.session_scope(factory) as db:
                v, _ = vfolders.readable(db, alice, a if i % 2 else b)
                vfquota.reserve(db, v, alice.user_id, f"f{i}", 1000, None)
            return True
        except LabfleetError as e:
            assert e.status == 413 and "quota of user alice" in e.message, e.message
            return False

    with ThreadPoolExecutor(30) as pool:
        won = sum(pool.map(one, range(30)))
    assert won == 10
    with lfdb.session_scope(factory) as db:
        assert db.scalar(select(func.sum(VFolderUpload.size))) == 10_000


def test_folder_count_limit_and_unique_names(world):
    factory = world
    alice = _actor(factory)
    with lfdb.session_scope(factory) as db:
        vfolders.create(db, alice, {"name": "one"}, default_host="local")
    with pytest.raises(LabfleetError) as e, lfdb.session_scope(factory) as db:
        vfolders.create(db, alice, {"name": "one"}, default_host="local")
    assert e.value.status == 409 and "already" in e.value.message
    with lfdb.session_scope(factory) as db:
        vfolders.create(db, alice, {"name": ".two"}, default_host="local")
    with pytest.raises(LabfleetError) as e, lfdb.session_scope(factory) as db:
        vfolders.create(db, alice, {"name": "three"}, default_host="local")
    assert e.value.status == 409 and "policy small" in e.value.message


def test_mounts_for_a_session_include_dot_folders_and_refuse_the_unreachable(world):
    factory = world
    alice = _actor(factory)
    with lfdb.session_scope(factory) as db:
        data = vfolders.create(db, alice, {"name": "data"}, default_host="local")
        dot = vfolders.create(db, alice, {"name": ".cfg"}, default_host="local")
        data_id, dot_id = data.id, dot.id
    with lfdb.session_scope(factory) as db:
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
    with lfdb.session_scope(factory) as db:
        hosts.create_host(db, CLI, {"name": "nfs", "path": str(tmp_path / "nfs")})
    # No right at all on a host without defaults or grants.
    with pytest.raises(LabfleetError) as e, lfdb.session_scope(factory) as db:
        vfolders.create(db, alice, {"name": "x", "host": "nfs"}, default_host="local")
    assert e.value.status == 403 and "create-vfolder" in e.value.message
    with lfdb.session_scope(factory) as db:
        directory.update_domain(db, CLI, "acme", {"allowed_vfolder_hosts": {"nfs": ["create-vfolder"]}})
        fid = vfolders.create(db, alice, {"name": "x", "host": "nfs"}, default_host="local").id
    with lfdb.session_scope(factory) as db:
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
    with lfdb.session_scope(factory) as db:
        policies.update_policy(
            db, CLI, "keypair", "default", {"allowed_storage_hosts": {"nfs": ["mount-in-session"]}}
        )
    with lfdb.session_scope(factory) as db:
        user = directory.get_user(db, "alice")
        assert [v.id for v, _ in vfolders.resolve_mounts(db, user, ["x"])] == [fid]
        policies.update_policy(db, CLI, "keypair", "default", {"allowed_storage_hosts": ["nfs"]})
    with lfdb.session_scope(factory) as db:
        v, _ = vfolders.readable(db, alice, fid)
        assert vfolders.host_rights(db, alice, v) == set(hosts.RIGHTS)
        vfolders.trash(db, alice, fid)
    # A project's grant counts for that project's folders only; bad grants are refused.
    with lfdb.session_scope(factory) as db:
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
