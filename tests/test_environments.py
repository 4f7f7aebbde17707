"""My Environments in the service, on SQLite (labfleet.compute.environments, labfleet.compute.envqueue):
who creates, sees and deletes what; the limits of the user's and the project's policies; refusals that
record nothing; a recipe built before READY at once with its image; a build's CPU and memory held
in its creator's quota while it runs (and given back however it ends); and the build queue without a
Docker engine (one build per user, at most ``max_running``; the build FAILED, saying why, its log
kept). A real build through the queue is in tests/test_envbuild_docker.py."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from decimal import Decimal

import pytest
from sqlalchemy import func, select

from labfleet.compute import buildcharge, launchoptions, nodes, sessions
from labfleet.compute import environments as E
from labfleet.compute.devices.base import NodeInfo
from labfleet.compute.environments import Built, Facts
from labfleet.compute.envqueue import BuildLog, Builds, EngineUnavailable
from labfleet.compute.quota import me_view
from labfleet.core import database, usage_ledger
from labfleet.core.authz import Actor
from labfleet.core.envmodels import Environment
from labfleet.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from labfleet.core.models import AuditEntry
from labfleet.core.sessionlogs import read_tail
from labfleet.tenancy import directory, policies
from labfleet.tenancy.policies import ensure_default_keypair_policy
from tests.dbfixture import fresh_db

CLI = Actor.cli()
BASE = "labfleet/singleuser:test"
RESTRICTED = "registry.example.org/team/cuda:12"  # for project acme/other only
GIB = 2**30
RECIPE = {"requirements.txt": "numpy==2.1.0\n", "apt.txt": "curl\n"}
PEOPLE = {
    "alice": {"domain": "acme", "projects": ["ml"]},
    "bob": {"domain": "acme", "projects": ["ml"]},
    "carol": {"domain": "acme", "projects": ["other"]},
    "dan": {"domain": "acme", "role": "admin"},
    "eve": {"domain": "beta", "role": "admin"},
    "mo": {"domain": "beta", "role": "monitor"},
    "root": {"domain": "beta", "role": "superadmin"},
}


@pytest.fixture
def world(tmp_path, monkeypatch):
    yield from _world(f"sqlite:///{tmp_path / 'lf.sqlite'}", tmp_path, monkeypatch)


@pytest.fixture(params=["sqlite", "postgres"])
def any_world(request, tmp_path, monkeypatch):
    """The world on SQLite, and on PostgreSQL (where the ledger's rows are locked)."""
    if request.param == "sqlite":
        yield from _world(f"sqlite:///{tmp_path / 'lf.sqlite'}", tmp_path, monkeypatch)
        return
    from tests.postgres_server import fresh_database

    url = fresh_database(request.getfixturevalue("postgres_url"), "envs_charge")
    yield from _world(url, tmp_path, monkeypatch)


def _world(url, tmp_path, monkeypatch):
    engine, factory = fresh_db(url, tmp_path, monkeypatch)
    with database.session_scope(factory) as db:
        ensure_default_keypair_policy(db)
        for d in ("acme", "beta"):
            directory.create_domain(db, CLI, {"name": d})
        for p in ("ml", "other"):
            directory.create_project(db, CLI, {"domain": "acme", "name": p})
        for name, body in PEOPLE.items():
            directory.create_user(db, CLI, {"username": name, **body})
        from labfleet.compute import images

        images.register(db, CLI, {"name": BASE})
        images.register(db, CLI, {"name": RESTRICTED, "projects": ["acme/other"]})
        actors = {name: directory.actor_for(directory.get_user(db, name)) for name in PEOPLE}
    yield factory, actors, tmp_path
    engine.dispose()


def create(factory, actor, **body):
    body.setdefault("base", BASE)
    with database.session_scope(factory) as db:
        return E.view(E.create(db, actor, body))


def count(factory) -> int:
    with database.session_scope(factory) as db:
        return db.scalar(select(func.count()).select_from(Environment))


def names_seen(factory, actor) -> list[str]:
    with database.session_scope(factory) as db:
        return sorted(e.name for e in E.list_environments(db, actor))


def built(factory, env_id, size=1000, image=None) -> None:
    """The queue's part: the environment BUILDING, then READY with an image of ``size`` bytes."""
    with database.session_scope(factory) as db:
        order = E.start_build(db, env_id, "node1")
        assert order is not None
        status = E.finish_build(db, env_id, Built(image or order.tag, "sha256:" + "a" * 64, size, False))
        assert status == "READY"


# ---------------------------------------------------------------- pure


def test_who_sees_and_deletes_what():
    personal = Facts("user", "alice", "acme", frozenset(), "alice")
    shared = Facts("project", "acme/ml", "acme", frozenset({"alice", "bob"}), "alice")
    people = {
        "alice": Actor("alice", "user", "acme"),
        "bob": Actor("bob", "user", "acme"),
        "dan": Actor("dan", "admin", "acme"),
        "eve": Actor("eve", "admin", "beta"),
        "mo": Actor("mo", "monitor", "beta"),
        "root": Actor("root", "superadmin", "beta"),
    }
    sees = {n for n, a in people.items() if E.may_see(a, personal)}
    assert sees == {"alice", "dan", "mo", "root"}
    assert {n for n, a in people.items() if E.may_delete(a, personal)} == {"alice", "dan", "root"}
    assert {n for n, a in people.items() if E.may_see(a, shared)} == {"alice", "bob", "dan", "mo", "root"}
    assert {n for n, a in people.items() if E.may_delete(a, shared)} == {"alice", "dan", "root"}
    # A creator who left the project no longer deletes it.
    left = Facts("project", "acme/ml", "acme", frozenset({"bob"}), "alice")
    assert not E.may_delete(people["alice"], left) and not E.may_see(people["alice"], left)


def test_tags_and_log_files(tmp_path, monkeypatch):
    assert E.image_tag("ab" * 32) == f"labfleet/env:{'ab' * 32}"
    assert E.build_log_file(tmp_path, "x") == tmp_path / "environments" / "x.log"
    monkeypatch.setattr("labfleet.compute.envqueue.MAX_LOG_BYTES", 40)
    with BuildLog(tmp_path / "logs" / "e.log") as out:
        for i in range(10):
            out.write(f"line {i}")
    text = (tmp_path / "logs" / "e.log").read_text().splitlines()
    assert text[:3] == ["line 0", "line 1", "line 2"] and "the log is cut here" in text[-1]
    assert len(text) == len([t for t in text if t.startswith("line")]) + 1
    # What GET .../logs answers: the last bytes; nothing before the build starts.
    assert read_tail(tmp_path / "logs" / "e.log", 8) == b"goes on\n"
    assert read_tail(tmp_path / "logs" / "none.log", 7) == b""


# ---------------------------------------------------------------- create, list, delete


def test_a_personal_and_a_project_environment_seen_by_whom_they_should(world):
    factory, who, _ = world
    mine = create(factory, who["alice"], name="mine", files=RECIPE)
    assert mine["status"] == "QUEUED" and mine["owner"] == "user:alice" and mine["project"] is None
    assert mine["files"] == RECIPE and mine["base"] == BASE and mine["image"] is None
    assert len(mine["recipe_hash"]) == 64 and mine["creator"] == "alice" and mine["domain"] == "acme"
    shared = create(factory, who["alice"], name="shared", project="ml", files={"postBuild": "echo hi\n"})
    assert shared["owner"] == "project:acme/ml" and shared["owner_kind"] == "project"
    create(factory, who["carol"], name="mine")  # a name is unique per owner only

    assert names_seen(factory, who["alice"]) == ["mine", "shared"]
    assert names_seen(factory, who["bob"]) == ["shared"]
    assert names_seen(factory, who["carol"]) == ["mine"]
    assert names_seen(factory, who["dan"]) == ["mine", "mine", "shared"]  # the domain's
    assert names_seen(factory, who["eve"]) == []  # another domain's admin
    assert names_seen(factory, who["mo"]) == names_seen(factory, who["root"]) == ["mine", "mine", "shared"]
    with database.session_scope(factory) as db:
        with pytest.raises(NotFound):
            E.readable(db, who["bob"], mine["id"])
        with pytest.raises(NotFound):
            E.readable(db, who["eve"], shared["id"])
        with pytest.raises(NotFound):
            E.readable(db, who["alice"], "../etc")
        assert E.readable(db, who["bob"], shared["id"]).name == "shared"
        actions = [a for (a,) in db.execute(select(AuditEntry.action).order_by(AuditEntry.id))]
        assert actions.count("environment.create") == 3

    # Deleting: a member who did not create it may not; the creator and the domain's admin may.
    with database.session_scope(factory) as db:
        with pytest.raises(Forbidden, match="only its creator"):
            E.delete(db, who["bob"], shared["id"])
        with pytest.raises(Forbidden):
            E.delete(db, who["mo"], mine["id"])
        with pytest.raises(NotFound):
            E.delete(db, who["carol"], mine["id"])
    with database.session_scope(factory) as db:
        gone = E.delete(db, who["alice"], shared["id"])
        assert gone.name == "shared" and gone.image is None  # never built
        E.delete(db, who["dan"], mine["id"])
    assert names_seen(factory, who["root"]) == ["mine"]
    with database.session_scope(factory) as db:
        assert db.scalar(select(func.count()).where(AuditEntry.action == "environment.delete")) == 2


@pytest.mark.parametrize(
    ("who", "body", "error", "message"),
    [
        ("alice", {"name": "Bad Name"}, InvalidInput, "name must be"),
        ("alice", {"name": "x", "project": "nope"}, NotFound, "no project acme/nope of yours"),
        ("alice", {"name": "x", "project": "other"}, NotFound, "no project acme/other of yours"),
        ("alice", {"name": "x", "base": "no/such:image"}, InvalidInput, "not a registered image you may use"),
        ("alice", {"name": "x", "base": RESTRICTED}, InvalidInput, "in any of your projects"),
        ("alice", {"name": "x", "project": "ml", "base": RESTRICTED}, InvalidInput, "in project acme/ml"),
        ("alice", {"name": "x", "base": "UPPER:case"}, InvalidInput, "is not an image reference"),
        ("alice", {"name": "x", "files": {"apt.txt": "curl; rm -rf /\n"}}, InvalidInput, "apt.txt line 1"),
        ("alice", {"name": "x", "files": {"setup.py": ""}}, InvalidInput, "not a recipe file"),
        ("alice", {"name": "x", "files": {"environment.yml": "name: x\n"}}, InvalidInput, "needs a base"),
        ("alice", {"name": "x", "files": {"requirements.txt": "-e .\n"}}, InvalidInput, "requirements.txt"),
        ("alice", {"name": "x", "files": {"postBuild": "x" * 300_000}}, InvalidInput, "over the limit"),
        ("alice", {"name": "x", "files": "numpy"}, InvalidInput, "mapping of file name"),
        ("alice", {"name": "x", "colour": "red"}, InvalidInput, "unknown field"),
        ("mo", {"name": "x"}, Forbidden, "monitors read"),
        ("cli", {"name": "x"}, Forbidden, "sign in as a user"),
    ],
)
def test_bad_requests_are_refused_and_record_nothing(world, who, body, error, message):
    factory, actors, _ = world
    actor = CLI if who == "cli" else actors[who]
    body = {"base": BASE, **body}
    with pytest.raises(error, match=message):
        with database.session_scope(factory) as db:
            E.create(db, actor, body)
    assert count(factory) == 0


def test_carol_may_use_her_projects_image_and_names_are_unique_per_owner(world):
    factory, who, _ = world
    create(factory, who["carol"], name="cuda", base=RESTRICTED)  # personal: one of her projects may
    create(factory, who["carol"], name="cuda", project="other", base=RESTRICTED)
    with pytest.raises(Conflict, match="you already have an environment named cuda"):
        create(factory, who["carol"], name="cuda")
    with pytest.raises(Conflict, match="project acme/other already has an environment named cuda"):
        create(factory, who["carol"], name="cuda", project="other", base=RESTRICTED)
    assert count(factory) == 2


def test_limits_of_the_users_and_the_projects_policies(world):
    factory, who, _ = world
    for i in range(3):  # no policy: three, like Backend.AI's default
        create(factory, who["alice"], name=f"e{i}", files={"postBuild": f"echo {i}\n"})
    with pytest.raises(Conflict, match="you already have 3 environment"):
        create(factory, who["alice"], name="e3")
    assert count(factory) == 3
    # A project environment counts against the project's limit, not the user's.
    create(factory, who["alice"], name="p0", project="ml")
    with database.session_scope(factory) as db:
        policies.create_policy(db, CLI, "user", {"name": "roomy", "max_environments": 0})
        policies.create_policy(
            db, CLI, "project", {"name": "small", "max_environments": 5, "max_environment_bytes": 1500}
        )
        view = policies.policy_view("project", policies.get_policy(db, CLI, "project", "small"))
        assert (view["max_environments"], view["max_environment_bytes"]) == (5, 1500)
        assert (
            policies.policy_view("user", policies.get_policy(db, CLI, "user", "roomy"))["max_environments"]
            == 0
        )
        directory.update_user(db, CLI, "alice", {"resource_policy": "roomy"})
        directory.update_project(db, CLI, "acme", "ml", {"resource_policy": "small"})
    create(factory, who["alice"], name="e3")  # 0: no limit
    # Bytes: the images of the project's environments take 1000 of 1500.
    p1 = create(factory, who["bob"], name="p1", project="ml", files={"postBuild": "echo p1\n"})
    built(factory, p1["id"], size=1000)
    p2 = create(factory, who["bob"], name="p2", project="ml", files={"postBuild": "echo p2\n"})
    # Its image would take the project past its bytes: built, but FAILED, and why.
    with database.session_scope(factory) as db:
        E.start_build(db, p2["id"], "node1")
        assert E.finish_build(db, p2["id"], Built("labfleet/env:x", "sha256:1", 600, False)) == "FAILED"
        env = db.get(Environment, p2["id"])
        assert env.image is None and "more than the 1.5 KiB policy small allows" in env.status_reason
    # The same recipe as p1 again (READY at once) would pass the limit: refused in the request.
    with pytest.raises(Conflict, match="take 1000 B and this one's 1000 B, and policy small allows 1.5 KiB"):
        create(factory, who["bob"], name="p3", project="ml", files={"postBuild": "echo p1\n"})
    with database.session_scope(factory) as db:
        policies.update_policy(db, CLI, "project", "small", {"max_environment_bytes": 1000})
    with pytest.raises(Conflict, match="take 1000 B, and policy small allows 1000 B in all"):
        create(factory, who["bob"], name="p4", project="ml")


def test_a_recipe_built_before_is_ready_at_once_with_its_image(world):
    factory, who, _ = world
    first = create(factory, who["alice"], name="first", files=RECIPE)
    built(factory, first["id"], size=4242)
    # The same files in another order, with CRLF line ends: the same recipe, for another user.
    crlf = {name: text.replace("\n", "\r\n") for name, text in reversed(RECIPE.items())}
    again = create(factory, who["carol"], name="again", files=crlf)
    assert again["status"] == "READY" and again["recipe_hash"] == first["recipe_hash"]
    assert again["image"] == E.image_tag(first["recipe_hash"]) and again["size_bytes"] == 4242
    assert "is reused" in again["status_reason"] and again["finished_at"]
    # Another base: another recipe, built.
    other = create(factory, who["carol"], name="other", base=RESTRICTED, files=RECIPE)
    assert other["status"] == "QUEUED" and other["recipe_hash"] != first["recipe_hash"]
    with database.session_scope(factory) as db:
        builds = db.scalars(select(AuditEntry).where(AuditEntry.action == "environment.build")).all()
        assert [(b.actor, b.details["reused"], b.success) for b in builds] == [
            ("alice", False, True),
            ("carol", True, True),
        ]
        # The image is in use while one of them has it.
        assert E.image_in_use(db, again["image"])
        E.delete(db, who["alice"], first["id"])
        assert E.image_in_use(db, again["image"])
        E.delete(db, who["carol"], again["id"])
        assert not E.image_in_use(db, again["image"])


def test_sessions_start_from_an_environment_only_for_whom_it_is(world):
    """``env:<id>`` as a session's image: admission's base and the image run, or a refusal; and the
    launch options offer exactly what admission accepts."""
    from labfleet.compute.launchoptions import environment_rows

    factory, who, _ = world
    mine = create(factory, who["alice"], name="mine", files=RECIPE)
    team = create(factory, who["bob"], name="team", project="ml", files={"apt.txt": "git\n"})
    other = create(factory, who["carol"], name="other", base=RESTRICTED, project="other", files=RECIPE)

    def image_for(user, project, env_id):
        with database.session_scope(factory) as db:
            return E.session_image(db, user, project, f"env:{env_id}")

    # Not built yet: a conflict that says so.
    with pytest.raises(Conflict, match="mine is QUEUED: sessions start from it once it is READY"):
        image_for("alice", "ml", mine["id"])
    for env in (mine, team, other):
        built(factory, env["id"], image=f"{E.IMAGE_REPOSITORY}:{env['name']}")
    tags = {name: f"{E.IMAGE_REPOSITORY}:{name}" for name in ("mine", "team")}
    assert image_for("alice", "ml", _id(factory, "mine")) == (BASE, tags["mine"])
    assert image_for("bob", "acme/ml", _id(factory, "team")) == (BASE, tags["team"])
    assert image_for("alice", "ml", _id(factory, "team")) == (BASE, tags["team"])  # a member
    # Anyone else's, or a project environment in another project: as if it did not exist.
    for user, project, name in (
        ("bob", "ml", "mine"),  # alice's own
        ("carol", "other", "team"),  # not her project's
        ("dan", "ml", "mine"),  # an admin sees it; sessions are its owner's
        ("alice", "ml", "other"),  # carol's project's
    ):
        with pytest.raises(NotFound, match="no environment"):
            image_for(user, project, _id(factory, name))
    with pytest.raises(NotFound):
        image_for("alice", "ml", "not-a-uuid")
    # The launch options offer each to its users, in the projects where admission takes it.
    with database.session_scope(factory) as db:
        alice = directory.get_user(db, "alice")
        rows = {r["environment"]["name"]: r for r in environment_rows(db, alice, ["acme/ml"])}
        carol = directory.get_user(db, "carol")
        carols = {
            r["environment"]["name"]: r["projects"] for r in environment_rows(db, carol, ["acme/other"])
        }
    assert sorted(rows) == ["mine", "team"] and rows["team"]["projects"] == ["acme/ml"]
    assert (
        rows["mine"]["name"] == f"env:{_id(factory, 'mine')}"
        and "my environment" in rows["mine"]["display_name"]
    )
    assert carols == {"other": ["acme/other"]}


def test_save_as_environment_refuses_what_is_not_a_running_session_of_the_callers(world):
    factory, who, _ = world
    import uuid

    cases = [
        ({"name": "x", "session": str(uuid.uuid4())}, NotFound, "no session"),
        ({"name": "x", "session": "../etc"}, NotFound, "no session"),
        ({"name": "x", "session": str(uuid.uuid4()), "base": BASE}, InvalidInput, "base"),
        ({"session": str(uuid.uuid4())}, InvalidInput, "name"),
    ]
    for body, error, words in cases:
        with database.session_scope(factory) as db, pytest.raises(error, match=words):
            E.create(db, who["alice"], body)
    with database.session_scope(factory) as db, pytest.raises(Forbidden):
        E.create(db, who["mo"], {"name": "x", "session": str(uuid.uuid4())})
    assert count(factory) == 0


def start(factory, env_id, cpu=2.0, mem=4 * GIB):
    """The queue's start of a build: BUILDING, its cores and bytes held, in one transaction."""
    with database.session_scope(factory) as db:
        return buildcharge.hold(db, E.start_build(db, env_id, "n1"), cpu, mem)


def keypair_quota(factory, **slots) -> None:
    with database.session_scope(factory) as db:
        policies.update_policy(db, CLI, "keypair", "default", {"total_resource_slots": slots})


def used(factory, username) -> dict:
    """What /api/me says the user's quotas use: the keypair's, the domain's, each project's."""
    with database.session_scope(factory) as db:
        q = me_view(db, username)["quota"]
    return {
        "keypair": q["keypair"]["used"],
        "domain": q["domain"]["used"],
        **{name: p["used"] for name, p in q["projects"].items()},
    }


def left(factory, username, project=None) -> dict:
    """What the spawn form (and a build) sees left, cpu and mem."""
    with database.session_scope(factory) as db:
        user = directory.get_user(db, username)
        p = next(p for p in user.projects if p.full_name == project) if project else None
        got = launchoptions.quota_left(db, user, p)
    return {"cpu": got["cpu"], "mem": got["mem"]}


def drift(factory) -> list:
    with database.session_scope(factory) as db:
        return usage_ledger.drift(db)


NOTHING = {"keypair": {}, "domain": {}, "acme/ml": {}}


def test_a_build_holds_the_cpu_and_memory_it_takes_from_the_quota_while_it_runs(any_world):
    factory, who, _ = any_world
    keypair_quota(factory, cpu=1, mem="1g")
    env = create(factory, who["alice"], name="quota", files=RECIPE)
    order = start(factory, env["id"])
    assert (order.cpu_limit, order.mem_limit, order.refusal) == (1.0, GIB, None)  # the quota's
    held = {"cpu": 1, "mem": GIB}
    assert used(factory, "alice") == {"keypair": held, "domain": held, "acme/ml": {}}
    assert left(factory, "alice") == {"cpu": 0, "mem": 0}
    assert used(factory, "bob") == {**NOTHING, "domain": held} and drift(factory) == []  # alice's domain
    with database.session_scope(factory) as db:
        assert E.requeue_interrupted(db) == [env["id"]]  # a restart: it holds nothing while it waits
        assert db.get(Environment, env["id"]).build_charge is None
    assert used(factory, "alice") == NOTHING and drift(factory) == []

    keypair_quota(factory, cpu=8, mem="64g")
    order = start(factory, env["id"])
    assert (order.cpu_limit, order.mem_limit) == (2.0, 4 * GIB)  # the service's, under the quota's
    assert used(factory, "alice")["keypair"] == {"cpu": 2, "mem": 4 * GIB}
    assert left(factory, "alice") == {"cpu": 6, "mem": 60 * GIB} and drift(factory) == []
    with database.session_scope(factory) as db:
        assert E.finish_build(db, env["id"], Built(order.tag, "sha256:" + "a" * 64, 10, False)) == "READY"
    assert used(factory, "alice") == NOTHING and drift(factory) == []
    with database.session_scope(factory) as db:
        assert db.get(Environment, env["id"]).build_charge is None


def test_a_project_environment_holds_in_its_project_too_until_it_fails_or_is_deleted(world):
    factory, who, _ = world
    keypair_quota(factory, cpu=8, mem="64g")
    with database.session_scope(factory) as db:
        directory.update_project(db, CLI, "acme", "ml", {"total_resource_slots": {"cpu": 3, "mem": "5g"}})
    shared = create(factory, who["alice"], name="shared", project="acme/ml", files=RECIPE)
    order = start(factory, shared["id"])
    assert (order.cpu_limit, order.mem_limit) == (2.0, 4 * GIB)
    held = {"cpu": 2, "mem": 4 * GIB}
    assert used(factory, "alice") == {"keypair": held, "domain": held, "acme/ml": held}
    # Bob's sessions in the project see what alice's build holds there, not in his own keypair.
    assert left(factory, "bob", "acme/ml") == {"cpu": 1, "mem": GIB}
    assert used(factory, "bob")["keypair"] == {} and drift(factory) == []
    # Bob's own project build gets what is left of the project.
    mine = create(factory, who["bob"], name="bobs", project="acme/ml", files={"apt.txt": "git\n"})
    assert (start(factory, mine["id"]).cpu_limit, drift(factory)) == (1.0, [])
    with database.session_scope(factory) as db:
        assert E.fail_build(db, mine["id"], "pip failed")
        E.delete(db, who["alice"], shared["id"])
    assert used(factory, "alice") == NOTHING and used(factory, "bob") == NOTHING
    assert drift(factory) == []


def test_a_build_with_no_quota_left_fails_holding_nothing(world):
    factory, who, tmp = world
    keypair_quota(factory, cpu=0, mem="1g")
    env = create(factory, who["alice"], name="none", files=RECIPE)

    def no_engine_needed():
        raise AssertionError("a refused build asks no engine")

    builds = Builds(
        factory, logging.getLogger("t"), log_dir=tmp / "logs", node="n1", cpu_limit=2.0,
        mem_limit=4 * GIB, client_factory=no_engine_needed,
    )  # fmt: skip
    builds._build(env["id"])
    with database.session_scope(factory) as db:
        failed = db.get(Environment, env["id"])
        assert failed.status == "FAILED" and failed.build_charge is None
        assert failed.status_reason.startswith("your quota has 0 core(s) and 1 GiB left")
    assert "FAILED: your quota has 0 core(s)" in builds.log_path(env["id"]).read_text()
    assert used(factory, "alice") == NOTHING and drift(factory) == []


@pytest.mark.parametrize(
    "cpu, mem, left, want",
    [
        (2.0, 4 * GIB, {"cpu": 1.5, "mem": GIB}, (Decimal("1.5"), GIB)),  # the quota's
        (2.0, 4 * GIB, {"cpu": 8, "mem": None}, (Decimal(2), 4 * GIB)),  # the service's
        (1.2345, None, {"cpu": None, "mem": None}, (Decimal("1.234"), None)),  # whole milli-cores
        (None, None, {"cpu": 3, "mem": 2 * GIB}, (Decimal(3), 2 * GIB)),  # no service limit
    ],
)
def test_a_builds_limits_are_the_services_cut_to_what_the_quota_has_left(cpu, mem, left, want):
    assert buildcharge.limits_within(cpu, mem, left) == (*want, None)


def test_a_build_needs_some_cpu_and_its_least_memory_left():
    for left in ({"cpu": 0, "mem": GIB}, {"cpu": 4, "mem": 32 * 2**20}):
        cpu, mem, refusal = buildcharge.limits_within(2.0, 4 * GIB, left)
        assert (cpu, mem) == (None, None) and refusal.startswith(f"your quota has {left['cpu']} core(s)")


def test_the_queue_holds_a_build_while_it_runs_and_a_session_that_would_not_fit_is_refused(world):
    factory, who, tmp = world
    keypair_quota(factory, cpu=3, mem="8g")
    with database.session_scope(factory) as db:
        nodes.ensure_default_group(db)
        nodes.register_node(
            db, NodeInfo(name="n1", cpu=8, mem=32 * GIB, devices=[], plugin="mock", reason=None)
        )
    env = create(factory, who["alice"], name="held", files=RECIPE)
    during: list = []

    def admit(cpu):
        with database.session_scope(factory) as db:
            return sessions.admit(db, CLI, {"project": "acme/ml", "username": "alice", "slots": {"cpu": cpu}})

    def no_engine():
        during.append(used(factory, "alice")["keypair"])
        with pytest.raises(sessions.Refused, match="cpu"):
            admit(2)  # 2 of 3 cores fit, but the build holds 2 of them
        during.append(drift(factory))
        raise EngineUnavailable("no engine")

    builds = Builds(
        factory, logging.getLogger("t"), log_dir=tmp / "logs", node="n1", cpu_limit=2.0,
        mem_limit=4 * GIB, client_factory=no_engine,
    )  # fmt: skip
    builds._build(env["id"])
    assert during == [{"cpu": 2, "mem": 4 * GIB}, []]
    assert admit(2).status == "SCHEDULED"  # the build failed: its cores are back
    assert used(factory, "alice")["keypair"] == {"cpu": 2}
    assert drift(factory) == []


def test_deleting_a_builds_creator_releases_what_it_holds(any_world):
    factory, who, _ = any_world
    keypair_quota(factory, cpu=8, mem="64g")
    env = create(factory, who["bob"], name="bobs", project="acme/ml", files=RECIPE)
    start(factory, env["id"])
    assert used(factory, "alice")["acme/ml"] == {"cpu": 2, "mem": 4 * GIB}
    with database.session_scope(factory) as db:
        directory.delete_user(db, CLI, "bob")
    with database.session_scope(factory) as db:
        assert db.get(Environment, env["id"]).build_charge is None  # the project's, it stays
    assert used(factory, "alice") == NOTHING and drift(factory) == []
    with database.session_scope(factory) as db:
        assert E.fail_build(db, env["id"], "the creator is gone")
    assert drift(factory) == []


def test_a_superadmin_promotes_a_ready_environment_to_a_registered_image(world, tmp_path):
    factory, who, _ = world
    from labfleet.compute import images
    from labfleet.core.sessionlogs import read_from

    env = create(factory, who["alice"], name="torch", files=RECIPE)
    with database.session_scope(factory) as db, pytest.raises(Forbidden, match="only a superadmin"):
        E.promote(db, who["dan"], env["id"], {})  # a domain admin
    with database.session_scope(factory) as db, pytest.raises(Conflict, match="only a READY one"):
        E.promote(db, who["root"], env["id"], None)
    built(factory, env["id"], image=f"{E.IMAGE_REPOSITORY}:torch")
    with database.session_scope(factory) as db, pytest.raises(InvalidInput):
        E.promote(db, who["root"], env["id"], {"projects": ["acme/ml"]})
    with database.session_scope(factory) as db:
        image = images.image_view(E.promote(db, who["root"], env["id"], {"display_name": "Torch for all"}))
    assert (image["name"], image["display_name"], image["projects"]) == (
        f"{E.IMAGE_REPOSITORY}:torch",
        "Torch for all",
        [],
    )
    with database.session_scope(factory) as db:
        other = E.create(db, who["alice"], {"name": "other", "base": BASE})
        views = E.views(db, [db.get(Environment, env["id"]), other])
        assert [v["registered"] for v in views] == [True, False]  # the console offers no Promote again
        E.delete(db, who["alice"], env["id"])
        assert E.image_in_use(db, image["name"])  # registered: it stays on the engine
        assert [
            a.actor for a in db.scalars(select(AuditEntry).where(AuditEntry.action == "environment.promote"))
        ] == ["root"]
    # A follower of a build log reads on from where it was.
    log = tmp_path / "b.log"
    log.write_bytes(b"one\ntwo\n")
    assert read_from(log, 0, 100) == (b"one\ntwo\n", 8) and read_from(log, 4, 2) == (b"tw", 8)
    assert read_from(log, 99, 10) == (b"", 8) and read_from(tmp_path / "none.log", 0, 10) == (b"", 0)


def test_creates_at_once_on_postgresql_take_the_last_place_and_a_name_once(
    postgres_url, tmp_path, monkeypatch
):
    """The owner's row is locked while a create checks the count and the name: of two of one name
    at once, one is created; of three at once for the last two places, two."""
    from tests.postgres_server import fresh_database

    engine, factory = fresh_db(fresh_database(postgres_url, "envs_race"), tmp_path, monkeypatch)
    try:
        with database.session_scope(factory) as db:
            ensure_default_keypair_policy(db)
            directory.create_domain(db, CLI, {"name": "acme"})
            directory.create_project(db, CLI, {"domain": "acme", "name": "ml"})
            directory.create_user(db, CLI, {"username": "alice", "domain": "acme", "projects": ["ml"]})
            from labfleet.compute import images

            images.register(db, CLI, {"name": BASE})
            alice = directory.actor_for(directory.get_user(db, "alice"))

        def race(bodies):
            gate = threading.Barrier(len(bodies))
            results: list[object] = [None] * len(bodies)

            def one(i):
                gate.wait(10)
                try:
                    results[i] = create(factory, alice, **bodies[i])["name"]
                except Conflict as e:
                    results[i] = e

            threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            return results

        same = race([{"name": "twin", "files": {"apt.txt": f"curl{i}\n"}} for i in range(2)])
        assert sorted(type(r).__name__ for r in same) == ["Conflict", "str"], same
        # One held, three at once for the two places left (the default policy allows 3).
        more = race([{"name": f"n{i}", "files": {"apt.txt": f"git{i}\n"}} for i in range(3)])
        assert sorted(type(r).__name__ for r in more) == ["Conflict", "str", "str"], more
        with database.session_scope(factory) as db:
            assert db.scalar(select(func.count()).select_from(Environment)) == 3
    finally:
        engine.dispose()


def test_a_recipe_is_taken_from_a_folder_the_caller_may_download_from(world):
    """``folder`` (and ``path``): the recipe's files as they are in a virtual folder (where an Import &
    Run of a repository lands); someone else's folder is not found, and nothing is created."""
    factory, who, tmp = world
    from labfleet.storage import hosts, vfolders

    with database.session_scope(factory) as db:
        hosts.ensure_host(
            db, {"name": "local", "path": str(tmp / "vf"), "default_permissions": list(hosts.RIGHTS)}
        )
        v = vfolders.create(db, who["alice"], {"name": "course"}, default_host="local")
        folder, store = v.id, vfolders.store_of(v)
    store.create()
    store.mkdir("binder")
    for name, text in (("requirements.txt", "numpy==2.1.0\n"), ("postBuild", "#!/bin/sh\necho hi\n")):
        (store.data_dir / "binder" / name).write_text(text)
    (store.data_dir / "binder" / "README.md").write_text("not a recipe file\n")
    env = create(factory, who["alice"], name="course", folder=folder, path="binder")
    assert env["files"] == {"requirements.txt": "numpy==2.1.0\n", "postBuild": "#!/bin/sh\necho hi\n"}
    for actor, body, error, words in (
        ("bob", {"folder": folder, "path": "binder"}, NotFound, "no vfolder"),
        ("alice", {"folder": folder}, InvalidInput, "has none of the recipe's files"),
        ("alice", {"folder": folder, "path": "../x"}, InvalidInput, ""),
        ("alice", {"folder": folder, "files": {}}, InvalidInput, "files or a folder"),
        ("alice", {"path": "binder"}, InvalidInput, "give folder too"),
        ("alice", {"folder": 7}, InvalidInput, "folder is a vfolder's id"),
    ):
        with database.session_scope(factory) as db, pytest.raises(error, match=words):
            E.create(db, who[actor], {"name": "again", "base": BASE, **body})
    assert count(factory) == 1


def _id(factory, name: str) -> str:
    with database.session_scope(factory) as db:
        return db.scalar(select(Environment.id).where(Environment.name == name))


# ---------------------------------------------------------------- the queue, without an engine


async def test_the_queue_builds_one_per_user_at_most_max_and_says_when_docker_is_missing(world):
    factory, who, tmp = world
    gate = threading.Event()
    asked: list[str] = []

    def no_engine():
        asked.append(threading.current_thread().name)
        gate.wait(10)
        raise EngineUnavailable("the Docker engine is not reachable: connection refused")

    builds = Builds(
        factory, logging.getLogger("test-env"), log_dir=tmp / "logs", node="node1", max_running=2,
        client_factory=no_engine,
    )  # fmt: skip

    def make(actor, name):
        with database.session_scope(factory) as db:
            return builds.create(
                db, actor, {"name": name, "base": BASE, "files": {"postBuild": f"echo {name}\n"}}
            ).id

    a1, a2 = make(who["alice"], "a1"), make(who["alice"], "a2")
    b1, c1 = make(who["bob"], "b1"), make(who["carol"], "c1")
    assert builds.serve() == [a1, b1]  # one per user, two at most: a2 and c1 wait
    assert builds.serve() == []

    def statuses():
        with database.session_scope(factory) as db:
            return {e.name: e.status for e in db.scalars(select(Environment))}

    for _ in range(100):
        if len(asked) == 2:
            break
        await asyncio.sleep(0.05)
    assert statuses() == {"a1": "BUILDING", "a2": "QUEUED", "b1": "BUILDING", "c1": "QUEUED"}
    with database.session_scope(factory) as db:
        assert db.get(Environment, a1).node == "node1" and db.get(Environment, a1).started_at
    # Delete a waiting one: it never builds.
    with database.session_scope(factory) as db:
        gone = builds.delete(db, who["carol"], c1)
    await builds.forget(gone)
    gate.set()
    await builds.wait()
    assert statuses() == {"a1": "FAILED", "a2": "FAILED", "b1": "FAILED"}
    assert len(asked) == 3
    with database.session_scope(factory) as db:
        env = db.get(Environment, a2)
        assert env.status_reason == "the Docker engine is not reachable: connection refused"
        assert env.finished_at and env.image is None
        failed = db.scalars(select(AuditEntry).where(AuditEntry.action == "environment.build")).all()
        assert len(failed) == 3 and not any(f.success for f in failed)
    log = builds.log_path(a2).read_text()
    assert "building environment a2 on node node1" in log
    assert "FAILED: the Docker engine is not reachable" in log
    assert not builds.log_path(c1).exists()

    # Deleting a failed one removes its log.
    with database.session_scope(factory) as db:
        gone = builds.delete(db, who["alice"], a2)
    await builds.forget(gone)
    assert not builds.log_path(a2).exists()


async def test_builds_a_stopped_service_left_are_queued_again(world):
    factory, who, tmp = world
    env = create(factory, who["alice"], name="left")
    with database.session_scope(factory) as db:
        E.start_build(db, env["id"], "node1")
        assert E.start_build(db, env["id"], "node1") is None  # not waiting any more
    with database.session_scope(factory) as db:
        assert E.requeue_interrupted(db) == [env["id"]]
        assert db.get(Environment, env["id"]).status == "QUEUED"
    gate = threading.Event()

    def no_engine():
        gate.wait(10)
        raise EngineUnavailable("no engine")

    builds = Builds(factory, logging.getLogger("t"), log_dir=tmp, node="n", client_factory=no_engine)
    builds.resume()
    assert set(builds.running) == {env["id"]}
    builds.stop()
    assert builds.serve() == []
    gate.set()
    await builds.wait()


def test_a_build_of_a_deleted_environment_records_nothing(world):
    factory, who, _ = world
    env = create(factory, who["alice"], name="gone")
    with database.session_scope(factory) as db:
        E.start_build(db, env["id"], "node1")
        E.delete(db, who["alice"], env["id"])
    with database.session_scope(factory) as db:
        assert E.finish_build(db, env["id"], Built("labfleet/env:x", "sha256:1", 1, False)) is None
        assert E.fail_build(db, env["id"], "why") is False


# ---------------------------------------------------------------- the REST API (no Hub: signed requests)


async def test_the_rest_api(tmp_path, monkeypatch):
    """POST answers 202 with the environment and its Location; GET, the logs as text, DELETE; a bad
    recipe is a 400 that records nothing. The service's queue has no engine here: the build FAILS,
    saying why."""
    from tornado.httpclient import AsyncHTTPClient

    from labfleet.core import signing
    from labfleet.core.secretbox import ensure_key_file
    from labfleet.service.app import LabfleetService
    from labfleet.tenancy import keypairs
    from tests.hubfixture import free_port

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LABFLEET_SECRET_KEY_FILE", str(tmp_path / "key"))
    ensure_key_file(tmp_path / "key")
    for name in ("JUPYTERHUB_SERVICE_NAME", "JUPYTERHUB_API_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "svc-token-environments")
    monkeypatch.setenv("LABFLEET_DB_URL", f"sqlite:///{tmp_path / 'lf.sqlite'}")
    port = free_port()
    app = LabfleetService()
    app.initialize(
        [
            "--LabfleetService.register_local_node=False",
            f"--LabfleetService.session_log_dir={tmp_path / 'logs'}",
            f"--LabfleetService.service_url=http://127.0.0.1:{port}",
        ]
    )

    def no_engine():
        raise EngineUnavailable("the Docker engine is not reachable: no socket here")

    app.environment_builds.client_factory = no_engine
    with database.session_scope(app.session_factory) as db:
        directory.create_domain(db, CLI, {"name": "acme"})
        directory.create_project(db, CLI, {"domain": "acme", "name": "ml"})
        user = directory.create_user(db, CLI, {"username": "alice", "domain": "acme", "projects": ["ml"]})
        ak = user.main_keypair.access_key
        sk = keypairs.secret_of(user.main_keypair, app.secretbox)
        from labfleet.compute import images

        images.register(db, CLI, {"name": BASE})
    server = app.make_app().listen(port, address="127.0.0.1")
    http = AsyncHTTPClient()
    api = "/services/labfleet/api"

    async def call(method, path, body=None):
        data = b"" if body is None else json.dumps(body).encode()
        headers = signing.signed_headers(ak, sk, method, api + path, data)
        r = await http.fetch(
            f"http://127.0.0.1:{port}{api}{path}",
            method=method,
            headers=headers,
            body=data if method == "POST" else None,
            raise_error=False,
        )
        return r.code, r.headers, r.body

    try:
        code, headers, body = await call(
            "POST", "/environments", {"name": "np", "project": "ml", "base": BASE, "files": RECIPE}
        )
        env = json.loads(body)
        assert code == 202 and env["status"] == "QUEUED" and env["project"] == "acme/ml"
        assert headers["Location"] == f"{api}/environments/{env['id']}"
        await app.environment_builds.wait()
        code, _, body = await call("GET", f"/environments/{env['id']}")
        assert code == 200 and json.loads(body)["status"] == "FAILED"
        assert json.loads(body)["status_reason"] == "the Docker engine is not reachable: no socket here"
        code, headers, body = await call("GET", f"/environments/{env['id']}/logs")
        assert code == 200 and headers["Content-Type"].startswith("text/plain")
        assert b"FAILED: the Docker engine is not reachable" in body
        code, _, body = await call("GET", f"/environments/{env['id']}/logs?tail=9")
        assert body == b"no socket here\n"[-9:]
        code, _, body = await call(
            "POST", "/environments", {"name": "bad", "base": BASE, "files": {"apt.txt": "$(id)\n"}}
        )
        assert code == 400 and "apt.txt line 1" in json.loads(body)["message"]
        code, _, body = await call("GET", "/environments")
        assert code == 200 and [e["name"] for e in json.loads(body)["items"]] == ["np"]
        code, _, body = await call("DELETE", f"/environments/{env['id']}")
        assert code == 200 and json.loads(body) == {"deleted": env["id"], "name": "np"}
        code, _, body = await call("GET", f"/environments/{env['id']}")
        assert code == 404 and json.loads(body)["status"] == 404
    finally:
        server.stop()
        app.engine.dispose()
