"""Save as environment handed to a node's agent (labfleet.compute.envremote), on SQLite: what a
heartbeat's commit reports may say (untrusted: checked whole), which reports count (only for a
commit handed to that node), the image's name the service gives (never the agent's), the recorded
recipe checked again, a LOST node failing its commits, and the build log the reports append to.
The real commit on Swarm node 2 by its agent is in tests/test_swarm.py."""

from __future__ import annotations

import logging
import uuid

import pytest

from labfleet.compute import environments as E
from labfleet.compute import envremote
from labfleet.compute.envqueue import BuildLog, Builds
from labfleet.core import database
from labfleet.core.display import fmt_bytes
from labfleet.core.envmodels import Environment
from labfleet.core.errors import InvalidInput
from labfleet.tenancy import directory
from tests.test_environments import BASE, world  # noqa: F401 (the fixture)

REGISTRY = "10.0.0.1:5000"
IMAGE_ID = "sha256:" + "b" * 64


def handed(factory, node="n2") -> str:
    """alice's Save as environment, BUILDING and handed to ``node``'s agent."""
    with database.session_scope(factory) as db:
        alice = directory.get_user(db, "alice")
        name = f"saved-{node}"
        env = E._new(alice, None, name, BASE, {}, "commit-" + uuid.uuid4().hex, str(uuid.uuid4()))
        env.status, env.node = E.BUILDING, node
        db.add(env)
        db.flush()
        return env.id


def report(env_id, **fields):
    return {"environment": env_id, "done": True, "log": ["a line"], **fields}


@pytest.mark.parametrize(
    "raw, words",
    [
        ({"done": True}, "missing field(s) in commit_reports[0]: environment"),
        (report("../etc"), "commit_reports[0].environment"),
        (report(str(uuid.uuid4()), done="yes"), "commit_reports[0].done"),
        (report(str(uuid.uuid4()), log="x"), "commit_reports[0].log"),
        (report(str(uuid.uuid4()), log=[1]), "commit_reports[0].log[]"),
        (report(str(uuid.uuid4()), image_id="sha256:xyz"), "commit_reports[0].image_id"),
        (report(str(uuid.uuid4()), image_id=IMAGE_ID, size=-1), "commit_reports[0].size"),
        (report(str(uuid.uuid4())), "names its image_id"),
        (report(str(uuid.uuid4()), image=IMAGE_ID), "image"),
    ],
)
def test_bad_commit_reports_are_refused_whole(raw, words):
    with pytest.raises(InvalidInput) as e:
        envremote.parse_commit_reports([raw])
    assert words in e.value.message
    with pytest.raises(InvalidInput, match="at most 4"):
        envremote.parse_commit_reports([raw] * 5)


def test_only_reports_of_commits_handed_to_the_node_count_and_the_service_names_the_image(world):  # noqa: F811
    factory, _, _ = world
    env_id = handed(factory)
    running = envremote.parse_commit_reports(
        [{"environment": env_id, "done": False, "log": ["one", "two\nx"]}]
    )
    done = envremote.parse_commit_reports(
        [
            report(
                env_id,
                image_id=IMAGE_ID,
                size=1234,
                # The session's words: an editable install and a path are dropped, a bad apt line too.
                requirements="tinypkg==2.0\n-e git+https://example.org/x.git#egg=x\n./local\n",
                apt="curl\nrm -rf /\n",
            )
        ]
    )
    with database.session_scope(factory) as db:
        assert envremote.orders_for(db, "n2", REGISTRY) == [
            {
                "environment": env_id,
                "session": db.get(Environment, env_id).source_session,
                "base": BASE,
                "tag": E.image_tag(db.get(Environment, env_id).recipe_hash),
                "push": f"{REGISTRY}/{E.image_tag(db.get(Environment, env_id).recipe_hash)}",
            }
        ]
        assert envremote.orders_for(db, "n3", REGISTRY) == []
        assert envremote.take_reports(db, "n3", done, REGISTRY) == []  # not handed to n3: ignored
        assert db.get(Environment, env_id).status == "BUILDING"
        assert envremote.take_reports(db, "n2", running, REGISTRY) == [
            envremote.Taken(env_id, ("one", "two x"))
        ]
        assert db.get(Environment, env_id).status == "BUILDING"
        (taken,) = envremote.take_reports(db, "n2", done, REGISTRY)
        env = db.get(Environment, env_id)
        assert env.status == "READY" and env.image_id == IMAGE_ID and env.size_bytes == 1234
        assert env.image == f"{REGISTRY}/{E.image_tag(env.recipe_hash)}"
        assert env.recipe == {"apt.txt": "curl\n", "requirements.txt": "tinypkg==2.0\n"}
        assert taken.last == f"labfleet: READY: image {env.image} ({fmt_bytes(1234)})"
        assert envremote.orders_for(db, "n2", REGISTRY) == []  # taken: no longer handed over
        assert envremote.take_reports(db, "n2", done, REGISTRY) == []  # and not taken twice


def test_a_failed_commit_and_a_lost_node_fail_the_environment(world):  # noqa: F811
    factory, _, _ = world
    failed, lost = handed(factory), handed(factory, "n9")
    with database.session_scope(factory) as db:
        reports = envremote.parse_commit_reports([report(failed, error="no such container")])
        (taken,) = envremote.take_reports(db, "n2", reports, None)
        assert taken.last == "labfleet: FAILED: the commit on node n2 failed: no such container"
        assert envremote.fail_handed(db, "n9", "node lost: node n9 missed 3 heartbeats") == [lost]
    with database.session_scope(factory) as db:
        assert db.get(Environment, failed).status == "FAILED"
        env = db.get(Environment, lost)
        assert (env.status, env.status_reason) == (
            "FAILED",
            "node lost: node n9 missed 3 heartbeats: the commit handed to its agent is lost",
        )


def test_the_agents_lines_are_appended_once_after_the_hand_over(world):  # noqa: F811
    factory, _, tmp = world
    builds = Builds(factory, logging.getLogger("t"), log_dir=tmp / "logs", node="n1")
    env_id = handed(factory)
    with BuildLog(builds.log_path(env_id)) as out:
        out.write("labfleet: building environment saved on node n1")
        out.write(f"{envremote.HANDED_OVER} n2, where session s runs:")
    builds.write_agent_logs([envremote.Taken(env_id, ("one",))])
    builds.write_agent_logs([envremote.Taken(env_id, ("one", "two"))])
    builds.write_agent_logs([envremote.Taken(env_id, ("one", "two", "three"), "labfleet: READY: image x")])
    lines = builds.log_path(env_id).read_text().splitlines()
    assert lines[2:] == ["one", "two", "three", "labfleet: READY: image x"]
    builds.write_agent_logs([envremote.Taken(str(uuid.uuid4()), ("gone",))])  # no log: nothing written


def test_the_agent_commits_each_order_once_and_reports_until_the_service_takes_it():
    """labfleet.agent.commits with an engine that cannot be reached: the order runs once (handed over
    again, it is not started again), its report says why it failed, without a NUL or a line break
    of the engine's words; an order no longer handed over is forgotten; malformed orders are ignored."""
    import threading

    from labfleet.agent.commits import Commits, order_of

    started = []
    gate = threading.Event()

    def no_engine():
        started.append(1)
        gate.wait(10)
        raise ConnectionError("refused\x00 by\nthe engine")

    order = {
        "environment": str(uuid.uuid4()),
        "session": str(uuid.uuid4()),
        "base": BASE,
        "tag": "labfleet/env:commit-1",
        "push": None,
    }
    bad = [None, "x", {**order, "session": "../x"}, {**order, "push": 3}, {**order, "environment": 1}]
    assert [order_of(b) for b in bad] == [None] * len(bad)
    commits = Commits(no_engine, logging.getLogger("t"))
    commits.apply([order, *bad])
    commits.apply([order])
    assert commits.reports() == [{"environment": order["environment"], "log": [], "done": False}]
    gate.set()
    for _ in range(100):
        (r,) = commits.reports()
        if r["done"]:
            break
        threading.Event().wait(0.05)
    assert r == {
        "environment": order["environment"],
        "log": [],
        "done": True,
        "error": "ConnectionError: refused by the engine",
    }
    assert len(started) == 1
    assert envremote.parse_commit_reports([r])[0].error == "ConnectionError: refused by the engine"
    commits.apply([])
    assert commits.reports() == []
