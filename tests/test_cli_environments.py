"""``labfleet env``: the CLI calling a real labfleet service (``python -m labfleet.service``, as the Hub
starts it) with users' keypairs.

No Hub: the commands sign their requests with a keypair, which needs none, and a Hub costs ~9 s to
start and stop (tests/test_cli_imports.py covers a Hub token). No Docker engine either
(``DOCKER_HOST`` names no socket): a build FAILS at once, saying why, which is what ``--wait`` and
``--follow`` are tested with; a recipe built before (recorded in the DB before the service starts)
is READY at once, for the other outcome. A real build is tests/test_envbuild_docker.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from argparse import Namespace
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import requests

from labfleet.cli.environments import RECIPE_OPTIONS, EnvCommand
from labfleet.compute import environments as E
from labfleet.compute import images
from labfleet.compute.environments import Built
from labfleet.compute.recipes import RECIPE_FILES
from labfleet.core import database
from labfleet.core.authz import Actor
from labfleet.tenancy import directory, keypairs
from labfleet.tenancy.policies import ensure_default_keypair_policy
from tests.dbfixture import fresh_db
from tests.hubfixture import REPO, free_port
from tests.test_cli_imports import UserCli

BASE = "labfleet/singleuser:test"
BUILT_BEFORE = {"requirements.txt": "numpy==2.1.0\n"}  # bob's READY environment's recipe
NO_ENGINE = "unix:///nonexistent/docker.sock"


@dataclass
class Service:
    api_url: str
    keypairs: dict[str, tuple[str, str]]
    prebuilt_image: str


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """The service on a DB with alice (acme, project ml), bob (acme, project other), the image BASE,
    and bob's environment of BUILT_BEFORE, READY."""
    state = tmp_path_factory.mktemp("service")
    db_url = f"sqlite:///{state / 'lf.sqlite'}"
    cli = Actor.cli()
    with pytest.MonkeyPatch.context() as mp:
        engine, factory = fresh_db(db_url, state, mp)
        with database.session_scope(factory) as db:
            ensure_default_keypair_policy(db)
            directory.create_domain(db, cli, {"name": "acme"})
            for project in ("ml", "other"):
                directory.create_project(db, cli, {"domain": "acme", "name": project})
            images.register(db, cli, {"name": BASE})
            pairs = {}
            for name, project in (("alice", "ml"), ("bob", "other")):
                user = directory.create_user(
                    db, cli, {"username": name, "domain": "acme", "projects": [project]}
                )
                pairs[name] = (user.main_keypair.access_key, keypairs.secret_of(user.main_keypair))
            bob = directory.actor_for(directory.get_user(db, "bob"))
            prebuilt = E.create(db, bob, {"name": "prebuilt", "base": BASE, "files": BUILT_BEFORE})
            order = E.start_build(db, prebuilt.id, "node1")
            E.finish_build(db, prebuilt.id, Built(order.tag, "sha256:" + "a" * 64, 3 << 20, False))
        engine.dispose()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LABFLEET_", "JUPYTERHUB_"))}
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        LABFLEET_DB_URL=db_url,
        LABFLEET_SECRET_KEY_FILE=str(state / "key"),
        JUPYTERHUB_API_TOKEN=os.urandom(16).hex(),  # the service's own; no Hub answers it
        DOCKER_HOST=NO_ENGINE,
    )
    log = open(state / "service.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "labfleet.service",
            "--LabfleetService.register_local_node=False",
            f"--LabfleetService.session_log_dir={state / 'logs'}",
            f"--LabfleetService.service_url=http://127.0.0.1:{port}",
        ],
        cwd=state,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    api_url = f"http://127.0.0.1:{port}/services/labfleet/api"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, (state / "service.log").read_text()
            try:
                if requests.get(api_url + "/environments", timeout=2).status_code == 401:
                    break
            except requests.ConnectionError:
                time.sleep(0.05)
        yield Service(api_url, pairs, order.tag)
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


@pytest.fixture
def alice(service, tmp_path):
    return UserCli(service, service.keypairs["alice"], tmp_path)


@pytest.fixture
def bob(service, tmp_path):
    return UserCli(service, service.keypairs["bob"], tmp_path)


def names(cli: UserCli) -> list[str]:
    return [e["name"] for e in cli.api("/environments")["items"]]


def test_the_options_name_every_recipe_file():
    assert sorted(name for _, name in RECIPE_OPTIONS) == sorted(RECIPE_FILES)


def test_following_prints_each_whole_line_once(monkeypatch, capsys):
    """The log as the service answers it poll after poll: a half-written line waits for its end, a
    log that starts again (a build queued again after a restart) is printed from its start."""
    polls = [
        ("BUILDING", b""),
        ("BUILDING", b"one\ncaf\xc3"),  # half of a character, written in two
        ("BUILDING", b"one\ncaf\xc3\xa9\n"),
        ("BUILDING", b"again\n"),
        ("READY", b"again\nthree"),
    ]
    answers = iter(polls[1:])
    status, log = polls[0]

    class Polled(EnvCommand):
        def log_bytes(self, env_id):
            return log

    def call(method, path):
        nonlocal status, log
        status, log = next(answers)
        return SimpleNamespace(data={"id": "e1", "name": "np", "status": status})

    monkeypatch.setattr("labfleet.cli.environments.POLL_SECONDS", 0)
    command = Polled([], Namespace())
    command._client = SimpleNamespace(call=call)
    assert command.follow({"id": "e1", "name": "np", "status": status})["status"] == "READY"
    assert capsys.readouterr().out == "one\ncafé\nagain\nthree\n"


def test_bad_input_says_why_and_creates_nothing(alice, tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("numpy\n")
    build = ("env", "build", "bad", "--requirements", str(req))
    line = alice.fails(*build, "--base", BASE, "--apt", str(tmp_path / "missing.txt"), code=2)
    assert "--apt" in line and "missing.txt" in line and "No such file" in line, line
    assert "not a folder" in alice.fails(*build, "--base", BASE, "--from-dir", str(tmp_path / "nope"), code=2)
    assert "none of requirements.txt" in alice.fails(
        "env", "build", "bad", "--base", BASE, "--from-dir", "/", code=2
    )
    assert "--base IMAGE is required" in alice.fails(*build, code=2)
    (tmp_path / "bin").write_bytes(b"\xff\xfe")
    assert "not UTF-8" in alice.fails(*build, "--base", BASE, "--postbuild", str(tmp_path / "bin"), code=2)
    # The service's refusals, in its words (400: exit 2; 404: exit 1).
    line = alice.fails(*build, "--base", "registry.example.org/nope:1", code=2)
    assert "base registry.example.org/nope:1 is not a registered image you may use" in line, line
    (tmp_path / "apt.txt").write_text("$(id)\n")
    assert "apt.txt line 1" in alice.fails(*build, "--base", BASE, "--apt", str(tmp_path / "apt.txt"), code=2)
    assert "no project acme/nope of yours" in alice.fails(*build, "--base", BASE, "--project", "nope", code=1)
    assert "bad" not in names(alice)
    # A recipe from a folder: no recipe file beside it; a folder the caller does not see is not found.
    line = alice.fails(*build, "--base", BASE, "--folder", "x", code=2)
    assert "--folder takes the recipe from the folder" in line, line
    line = alice.fails(
        "env", "build", "bad", "--base", BASE, "--folder", "00000000-0000-4000-8000-000000000000", code=1
    )
    assert "no vfolder" in line, line
    # Save as environment: a session, and one of the caller's.
    assert "--session ID is required" in alice.fails("env", "save", "bad", code=2)
    line = alice.fails("env", "save", "bad", "--session", "00000000-0000-4000-8000-000000000000", code=1)
    assert "no session '00000000-0000-4000-8000-000000000000' of yours" in line, line
    # Unknown names and ids.
    assert "no environment 'bad'" in alice.fails("env", "delete", "bad", code=1)
    line = alice.fails("env", "logs", "00000000-0000-4000-8000-000000000000", code=1)
    assert "no environment '00000000-0000-4000-8000-000000000000'" in line, line


def test_build_list_logs_and_delete(service, alice, bob, tmp_path, monkeypatch):
    monkeypatch.setattr("labfleet.cli.environments.POLL_SECONDS", 0.05)  # the commands run in this process
    recipe = tmp_path / "binder"
    recipe.mkdir()
    (recipe / "requirements.txt").write_text("pandas==2.2.3\n")
    (recipe / "apt.txt").write_text("curl\n")
    (recipe / "README.md").write_text("not a recipe file\n")

    out = alice("env", "build", "np", "--base", BASE, "--from-dir", str(recipe))
    assert out.startswith("Environment np (id ") and ": QUEUED." in out and "env logs" in out, out
    env_id = out.split("(id ", 1)[1].split(")", 1)[0]
    # No engine: --follow prints the log as far as the build got, then exits 1 with the reason.
    p = alice.run("env", "logs", "np", "--follow")
    assert p.returncode == 1 and "labfleet: building environment np" in p.stdout, p
    assert "labfleet: FAILED: " in p.stdout and "the build of environment np failed: " in p.stderr, p
    [listed] = json.loads(alice("env", "list", "--json"))
    assert listed["id"] == env_id and listed["status"] == "FAILED" and listed["owner"] == "user:alice"
    assert listed["files"] == {"requirements.txt": "pandas==2.2.3\n", "apt.txt": "curl\n"}, listed
    assert listed["status_reason"] in p.stderr
    table = alice("env", "list").splitlines()
    assert table[0].split() == ["NAME", "OWNER", "STATUS", "SIZE", "IMAGE"]
    assert table[1].split() == ["np", "user:alice", "FAILED", "-", "-"], table
    assert "labfleet: FAILED: " in alice("env", "logs", env_id)

    # Bob sees his own, not alice's; and cannot touch hers.
    assert "prebuilt  user:bob  READY   3 MiB" in bob("env", "list")
    assert names(bob) == ["prebuilt"]
    assert "no environment 'np'" in bob.fails("env", "delete", "np", code=1)
    assert f"no environment '{env_id}'" in bob.fails("env", "logs", env_id, code=1)

    # A recipe built before is READY at once: --wait exits 0 at once, the log says nothing was built.
    (tmp_path / "req.txt").write_text(BUILT_BEFORE["requirements.txt"])
    twin = ("--project", "ml", "--requirements", str(tmp_path / "req.txt"))
    out = alice("env", "build", "np", "--base", BASE, *twin, "--wait")
    assert ": READY." in out and "nothing built" in out, out
    assert f"READY: environment np is image {service.prebuilt_image} (3 MiB)." in out, out

    # Only a superadmin promotes one to a registered image.
    line = alice.fails("env", "promote", "np", "--project", "ml", code=1)
    assert "only a superadmin promotes" in line, line
    # Two named np: a name alone is ambiguous; --project or the id tells them apart.
    line = alice.fails("env", "delete", "np", code=1)
    assert "2 environments are named 'np'" in line and env_id in line and "project:acme/ml" in line, line
    assert alice("env", "delete", "np", "--project", "ml").startswith("Deleted environment np")
    assert alice("env", "delete", "np").strip() == f"Deleted environment np (id {env_id})."
    assert names(alice) == []
    assert "no environment 'np'" in alice.fails("env", "delete", "np", code=1)
    assert f"no environment '{env_id}'" in alice.fails("env", "delete", env_id, code=1)
