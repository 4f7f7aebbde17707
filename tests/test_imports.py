"""Import & Run in the service (labfleet.storage.imports) against a git server on 127.0.0.1 that the
test starts (git's dumb HTTP protocol): a clone with its history into a new folder, owned by the
folder's uid; the same link again re-syncs with nbgitpuller's rules (the user's edits win, a file
in the way renamed, the upstream commit brought in) and reports it; a private repository refused
without the user's credential and cloned with it, the token nowhere in views or the audit log;
a notebook, an archive with a ``../`` entry (refused, nothing written); refusals before anything
is fetched (file://, loopback not allowed, an unknown project, no room)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import zipfile

import pytest
from sqlalchemy import select

from labfleet.core import database, unitofwork
from labfleet.core.authz import Actor
from labfleet.core.errors import Forbidden, InvalidInput, LabfleetError, NotFound
from labfleet.core.models import AuditEntry, ImportCredential, VFolder
from labfleet.core.secretbox import SecretBox, ensure_key_file
from labfleet.storage import hosts, importcreds, vfolders
from labfleet.storage.imports import Imports
from labfleet.storage.importsafety import parse_allowed
from labfleet.tenancy import directory, policies
from labfleet.tenancy.policies import ensure_default_keypair_policy
from tests.gitserver import GitServer, commit, git, make_work_tree

CLI = Actor.cli()
OWNER = 1000  # the uid sessions write as: what the clone is handed to
TOKEN = "glpat-TEST-9f8e7d6c5b4a3"
NOTEBOOK = json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setenv("LABFLEET_SECRET_KEY_FILE", str(tmp_path / "key"))
    ensure_key_file(tmp_path / "key")
    engine = database.make_engine(f"sqlite:///{tmp_path / 'lf.sqlite'}")
    database.upgrade(engine)
    factory = unitofwork.make_session_factory(engine)
    with database.session_scope(factory) as db:
        ensure_default_keypair_policy(db)
        hosts.ensure_host(
            db,
            {
                "name": "local",
                "path": str(tmp_path / "vf"),
                "default_permissions": list(hosts.RIGHTS),
                "owner_uid": OWNER,
                "owner_gid": OWNER,
            },
        )
        policies.create_policy(db, CLI, "user", {"name": "small", "max_quota_scope_size": 400_000})
        directory.create_domain(db, CLI, {"name": "acme"})
        directory.create_project(db, CLI, {"domain": "acme", "name": "ml"})
        directory.create_user(
            db, CLI, {"username": "alice", "domain": "acme", "projects": ["ml"], "resource_policy": "small"}
        )
        alice = directory.actor_for(directory.get_user(db, "alice"))
    rescanned: list[str] = []

    async def rescan(folder_id):
        rescanned.append(folder_id)

    imports = Imports(
        factory,
        logging.getLogger("test-imports"),
        box=SecretBox(),
        allowed=lambda: parse_allowed("127.0.0.1"),
        default_host=lambda: "local",
        rescan=rescan,
        timeout=60,
    )
    with GitServer(tmp_path / "srv", token=TOKEN) as server:
        yield factory, imports, alice, server, tmp_path
    engine.dispose()


async def _run(factory, imports, actor, body):
    with database.session_scope(factory) as db:
        job = imports.start(db, actor, body)
    for _ in range(600):
        if job.finished:
            break
        await asyncio.sleep(0.1)
    # The job's own task ends with the rescan and the audit entry: let it.
    await asyncio.gather(*list(imports._tasks))
    return job.view()


def _data(factory, name):
    with database.session_scope(factory) as db:
        v = db.scalar(select(VFolder).where(VFolder.name == name))
        return None if v is None else vfolders.store_of(v).data_dir


async def test_clone_then_resync_keeps_the_users_edits(world):
    factory, imports, alice, server, tmp = world
    work = make_work_tree(
        tmp / "teacher", {"lesson.ipynb": NOTEBOOK, "README.md": "read me\n", "data/a.csv": "x,y\n1,2\n"}
    )
    url = server.publish(work, "course.git")

    first = await _run(factory, imports, alice, {"url": url, "open": "lesson.ipynb", "project": "ml"})
    assert first["status"] == "done", first
    assert first["folder"]["name"] == "course" and first["path"] == "lesson.ipynb"
    assert first["session"] == {"project": "acme/ml"}
    data = _data(factory, "course")
    assert (data / "lesson.ipynb").read_text() == NOTEBOOK
    # With its history, and the files are the session's to change.
    assert git("log", "--format=%s", cwd=data).split() == ["first"]
    assert (data / "README.md").stat().st_uid == OWNER and (data / ".git" / "HEAD").stat().st_uid == OWNER

    # Upstream moves on; the student edits README and makes a file where upstream adds one.
    commit(work, {"README.md": "read me, v2\n", "new.txt": "from upstream\n"}, "second")
    server.publish(work, "course.git")
    (data / "README.md").write_text("my notes\n")
    (data / "new.txt").write_text("mine\n")
    os.chown(data / "new.txt", OWNER, OWNER)

    # The checkout's .git is the user's: a command it names runs as the user, in the sandbox, never
    # as the service on the host.
    host_mark = tmp / "host-mark"
    config = data / ".git" / "config"
    config.write_text(
        config.read_text() + f'[core]\n\tfsmonitor = "touch {host_mark}; id -u > /import/repo/who; true"\n'
    )

    again = await _run(factory, imports, alice, {"url": url})
    assert again["status"] == "done", again["message"]
    assert again["resync"] is True
    report = again["report"]
    assert (
        "README.md" in report["kept"] and "README.md" in report["updated"] and "new.txt" in report["updated"]
    )
    assert len(report["renamed"]) == 1 and report["renamed"][0].startswith("new.txt -> new__")
    assert (data / "README.md").read_text() == "my notes\n"  # the user's edit won
    assert (data / "new.txt").read_text() == "from upstream\n"
    moved = report["renamed"][0].split(" -> ")[1]
    assert (data / moved).read_text() == "mine\n"
    assert "second" in git("log", "--format=%s", cwd=data).split()
    assert (data / "new.txt").stat().st_uid == OWNER
    assert not host_mark.exists()
    assert (data / "who").exists()  # git ran the command: as the folder's owner, in the sandbox
    assert (data / "who").read_text().strip() == str(OWNER)
    assert "updated 2, kept 1" in again["message"]

    with database.session_scope(factory) as db:
        runs = db.scalars(select(AuditEntry).where(AuditEntry.action == "import.run")).all()
        assert [(r.details["resync"], r.success) for r in runs] == [(False, True), (True, True)]


async def test_private_repository_needs_the_users_credential_and_never_shows_it(world):
    factory, imports, alice, server, tmp = world
    url = server.publish(make_work_tree(tmp / "w", {"secret.py": "x = 1\n"}), "private/secret.git")

    refused = await _run(factory, imports, alice, {"url": url})
    assert refused["status"] == "failed" and "credential" in refused["message"], refused
    assert _data(factory, "secret") is None  # nothing created

    with database.session_scope(factory) as db:
        importcreds.put(db, alice, "127.0.0.1", {"token": TOKEN}, imports.box)
    with database.session_scope(factory) as db:
        assert importcreds.list_mine(db, alice)[0]["host"] == "127.0.0.1"
        assert TOKEN not in json.dumps(importcreds.list_mine(db, alice))
        stored = db.scalars(select(ImportCredential)).one()
        assert TOKEN not in stored.token_encrypted  # sealed
    done = await _run(factory, imports, alice, {"url": url})
    assert done["status"] == "done", done
    data = _data(factory, "secret")
    assert (data / "secret.py").read_text() == "x = 1\n"
    assert TOKEN not in (data / ".git" / "config").read_text()  # the clone's remote carries no token
    assert any(auth for path, auth in server.requests if path.startswith("/private/"))
    assert TOKEN not in json.dumps(done)
    with database.session_scope(factory) as db:
        entries = db.scalars(select(AuditEntry)).all()
        assert TOKEN not in json.dumps([(e.action, e.target, e.details) for e in entries])
        assert {"import.credential.set", "import.run"} <= {e.action for e in entries}


async def test_a_notebook_and_archives(world):
    factory, imports, alice, server, tmp = world
    (tmp / "srv").mkdir(exist_ok=True)
    (tmp / "srv" / "intro.ipynb").write_text(NOTEBOOK)
    nb = await _run(factory, imports, alice, {"url": f"{server.url}/intro.ipynb"})
    assert nb["status"] == "done" and nb["path"] == "intro.ipynb", nb
    assert (_data(factory, "intro") / "intro.ipynb").read_text() == NOTEBOOK

    good = io.BytesIO()
    with zipfile.ZipFile(good, "w") as z:
        z.writestr("set/one.txt", "1")
        z.writestr("set/two.txt", "2")
    (tmp / "srv" / "set.zip").write_bytes(good.getvalue())
    ok = await _run(factory, imports, alice, {"url": f"{server.url}/set.zip", "folder": "intro"})
    assert ok["status"] == "done", ok
    assert (_data(factory, "intro") / "set" / "set" / "two.txt").read_text() == "2"

    evil = io.BytesIO()
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("fine.txt", "ok")
        z.writestr("../escape.txt", "out")
    (tmp / "srv" / "evil.zip").write_bytes(evil.getvalue())
    bad = await _run(factory, imports, alice, {"url": f"{server.url}/evil.zip"})
    assert bad["status"] == "failed" and "outside the folder" in bad["message"], bad
    assert _data(factory, "evil") is None
    assert not list(tmp.rglob("escape.txt")) and not list(tmp.rglob("fine.txt"))


async def test_refusals_before_anything_is_fetched(world):
    factory, imports, alice, server, tmp = world
    url = server.publish(make_work_tree(tmp / "w", {"big.bin": "x" * 500_000}), "big.git")
    cases = [
        ({"url": "file:///etc/passwd"}, InvalidInput, "scheme"),
        ({"url": "http://localhost:1/x.git"}, Forbidden, "not a public address"),
        ({"url": url, "project": "nope"}, NotFound, "no project acme/nope"),
        ({"url": url, "folder": "../x"}, InvalidInput, "folder"),
        ({"url": url, "branch": "--upload-pack=touch /tmp/x"}, InvalidInput, "branch"),
    ]
    for body, error, words in cases:
        with database.session_scope(factory) as db, pytest.raises(error) as e:
            imports.start(db, alice, body)
        assert words in e.value.message
    # A domain's own rules (a superadmin's): a denied host, or one off its allow list, is refused.
    for rules, words in [
        ({"deny": ["127.0.0.1"]}, "does not import from 127.0.0.1"),
        ({"allow": ["*.example.org"]}, "imports only from *.example.org"),
    ]:
        with database.session_scope(factory) as db:
            directory.update_domain(db, CLI, "acme", {"import_hosts": rules})
        with database.session_scope(factory) as db, pytest.raises(Forbidden) as e:
            imports.start(db, alice, {"url": url})
        assert words in e.value.message
    with database.session_scope(factory) as db:
        directory.update_domain(db, CLI, "acme", {"import_hosts": {"allow": ["127.0.0.1"]}})
        with pytest.raises(InvalidInput):
            directory.update_domain(db, CLI, "acme", {"import_hosts": {"allow": ["http://x"]}})
    with database.session_scope(factory) as db:
        monitor = Actor(name="mona", role="monitor")
        with pytest.raises(LabfleetError):
            imports.start(db, monitor, {"url": url})
    # Not a repository: said so, nothing made.
    nothing = await _run(factory, imports, alice, {"url": f"{server.url}/nothing.git"})
    assert nothing["status"] == "failed" and "no git repository" in nothing["message"], nothing
    # Over the room left (the user's quota scope is 400,000 bytes): stopped, no folder left behind.
    over = await _run(factory, imports, alice, {"url": url})
    assert over["status"] == "failed" and "bytes" in over["message"], over
    assert _data(factory, "big") is None
    assert not imports.jobs[over["id"]].folder_id
    with database.session_scope(factory) as db:
        assert db.scalars(select(VFolder)).all() == []
