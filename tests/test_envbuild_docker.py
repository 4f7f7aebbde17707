"""labfleet.compute.envbuild on a real Docker engine ("My Environments"): a recipe's image built
from the test image (labfleet/singleuser:test, whose /opt/venv is root's) with a pip package from
a package index of the test's own (PEP 503 "simple" pages and a wheel made here, served on
127.0.0.1); the same recipe found and rebuilt from the cache; a change in postBuild or in
requirements.txt rebuilding from its layer on; a missing package failing at the pip step; a
build past its time stopped; and the service's build queue (labfleet.compute.envqueue) taking an
environment from QUEUED to READY, then a second one of the same recipe READY at once, nothing
built. Every image and layer the tests make is removed at the end.

The module starts Docker itself (scripts/docker.sh) and builds the test image if missing
(scripts/build-image.sh), through test_docker_backend's ``engine`` fixture.
"""

from __future__ import annotations

import asyncio
import http.server
import logging
import re
import secrets
import subprocess
import threading
import time
from functools import partial

import pytest

from labfleet.compute import envbuild
from labfleet.compute.envbuild import BuildFailed, BuildResult, BuildTimeout, build, find_built
from labfleet.compute.recipes import LABEL_RECIPE_HASH, parse_recipe, recipe_hash
from tests.pyindex import module_name, write_index
from tests.test_docker_backend import IMAGE, engine  # noqa: F401  (a fixture)

pytestmark = pytest.mark.docker

TOKEN = secrets.token_hex(4)
ALPHA, BETA, MISSING = f"lfalpha-{TOKEN}", f"lfbeta-{TOKEN}", f"lfmissing-{TOKEN}"
UPGRADED = "pandocfilters"  # in the test image (1.5.1), one module; the index has a 99.0 of the test's
REPO_NAME = f"labfleet-envbuild-test-{TOKEN}"
# The build's containers: the user's share of their quota, as the service would pass it.
CPU_LIMIT, MEM_LIMIT = 1.5, 1024**3
POSTBUILD = """#!/bin/sh
set -e
echo "limits: memory $(cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes)"
echo "limits: cpu $(cat /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us)"
python -c "import {module}; print('postBuild {version} sees', {module}.VALUE)"
"""
TIMINGS: dict[str, float] = {}


# --- a package index on 127.0.0.1 -----------------------------------------------------------------


_module = module_name


class _IndexHandler(http.server.SimpleHTTPRequestHandler):
    requested: list[str]

    def log_message(self, format, *args):  # noqa: A002  (the base class's name)
        self.requested.append(self.path)


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """A PEP 503 index at http://127.0.0.1:<port>/simple/ with ALPHA, BETA, UPGRADED (not MISSING)."""
    root = tmp_path_factory.mktemp("index")
    # A newer version of a package the test image has (root's files in /opt/venv): an upgrade.
    write_index(
        root,
        {
            ALPHA: ("1.0", f"alpha-{TOKEN}"),
            BETA: ("2.0", f"beta-{TOKEN}"),
            UPGRADED: ("99.0", f"upgraded-{TOKEN}"),
        },
    )
    requested: list[str] = []
    handler = type("Handler", (_IndexHandler,), {"requested": requested})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield {"url": f"http://127.0.0.1:{server.server_address[1]}/simple/", "requested": requested}
    server.shutdown()
    server.server_close()


# --- builds and their clean-up --------------------------------------------------------------------


def created_layers(log: list[str]) -> list[str]:
    """The image ids a build's output says it made (steps that were not "Using cache"; not FROM)."""
    out, built, skip = [], False, True
    for line in log:
        if line.startswith("Step "):
            built, skip = True, " : FROM " in line
        elif line.startswith(" ---> Using cache"):
            built = False
        elif (m := re.match(r"^ ---> ([0-9a-f]{12,64})$", line)) and built and not skip:
            out.append(m.group(1))
    return out


@pytest.fixture(scope="module")
def builder(engine, index):  # noqa: F811  (engine: the imported fixture)
    """``run(recipe, name, **kw)``: build with the test's index, limits and a tag of this run; the
    tags and the layers of failed builds are removed at the end (nothing of anyone else's)."""
    tags: list[str] = []
    failed_layers: list[str] = []

    def run(recipe, name: str, **kw) -> tuple[BuildResult, list[str]]:
        tag = f"{REPO_NAME}:{name}"
        lines: list[str] = []
        kw.setdefault("timeout", 300)
        kw.setdefault("cpu_limit", CPU_LIMIT)
        kw.setdefault("mem_limit", MEM_LIMIT)
        tags.append(tag)
        try:
            result = build(engine, recipe, tag=tag, index_url=index["url"], log=lines.append, **kw)
        except BuildFailed as e:
            assert e.log == lines[-len(e.log) :]
            failed_layers.extend(created_layers(lines))
            raise
        return result, lines

    yield run
    for tag in reversed(tags):
        try:
            engine.api.remove_image(tag)  # and its untagged parents that nothing else uses
        except Exception:
            pass
    for layer in reversed(failed_layers):
        try:
            engine.api.remove_image(layer)  # refused (and kept) if anything else builds on it
        except Exception:
            pass
    print("envbuild timings:", ", ".join(f"{k} {v:.1f}s" for k, v in TIMINGS.items()))


def docker_run(tag: str, code: str) -> str:
    r = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", tag, "python", "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def step(result: BuildResult, layer: str) -> envbuild.BuildStep:
    matching = [s for s in result.steps if s.layer == layer and s.instruction.startswith("RUN ")]
    assert len(matching) == 1, envbuild.describe_steps(result.steps)
    return matching[0]


def recipe(requirements: str, postbuild_version: str = "v1"):
    module = _module(ALPHA)
    files = {
        "requirements.txt": requirements,
        "postBuild": POSTBUILD.format(module=module, version=postbuild_version),
    }
    return parse_recipe(IMAGE, files)


@pytest.fixture(scope="module")
def first(builder):
    """The recipe (ALPHA from the index, a postBuild) built once."""
    r = recipe(f"{ALPHA}\n")
    result, lines = builder(r, "first")
    TIMINGS["first build"] = result.seconds
    return r, result, lines


# --- the tests ------------------------------------------------------------------------------------


def test_a_recipe_builds_from_the_local_index_with_the_users_limits(first, engine, index):  # noqa: F811
    r, result, lines = first
    text = "\n".join(lines)
    assert not result.cached, envbuild.describe_steps(result.steps)
    # The pip step ran, as the unprivileged user, with the package from the test's index.
    pip = step(result, "pip")
    assert not pip.cached and pip.instruction.startswith("RUN pip install")
    assert f"Successfully installed {ALPHA}-1.0" in text
    assert f"/simple/{ALPHA}/" in index["requested"]
    assert f"postBuild v1 sees alpha-{TOKEN}" in text
    # The build's containers had the limits given.
    assert f"limits: memory {MEM_LIMIT}" in text
    assert re.search(r"limits: cpu 150000\b", text), text
    # The image: tagged, labelled with the recipe's hash, the module importable with no network.
    image = engine.api.inspect_image(result.tag)
    assert image["Id"] == result.image_id and result.size == image["Size"] > 0
    assert image["Config"]["Labels"][LABEL_RECIPE_HASH] == recipe_hash(r) == result.recipe_hash
    assert image["Config"]["User"] == "1000:1000"
    out = docker_run(result.tag, f"import os, {_module(ALPHA)} as m; print(m.VALUE, os.getuid())")
    assert out == f"alpha-{TOKEN} 1000"


def test_the_same_recipe_is_found_and_rebuilds_from_the_cache(first, builder, engine):  # noqa: F811
    r, result, _ = first
    found = find_built(engine, recipe_hash(r))
    assert found is not None and found.id == result.image_id and result.tag in found.tags
    assert found.base == IMAGE and found.size == result.size
    assert find_built(engine, "0" * 64) is None
    again, lines = builder(r, "first")
    TIMINGS["cached rebuild"] = again.seconds
    assert again.cached, envbuild.describe_steps(again.steps)
    assert all(s.cached for s in again.steps[1:]) and again.image_id == result.image_id
    assert not any("Running in" in line for line in lines)


def test_a_new_postbuild_keeps_the_pip_layer_and_new_requirements_rebuild_it(first, builder):
    _, before, _ = first
    changed, _ = builder(recipe(f"{ALPHA}\n", "v2"), "postbuild-v2")
    TIMINGS["postBuild changed"] = changed.seconds
    assert step(changed, "pip").cached and not step(changed, "postBuild").cached
    assert not changed.cached and changed.image_id != before.image_id
    # requirements.txt changed: the pip layer and postBuild are rebuilt; what comes before is kept.
    # The upgrade replaces root's files of the base's package (the user owns the env's folders).
    more, lines = builder(recipe(f"{ALPHA}\n{BETA}==2.0\n{UPGRADED}==99.0\n"), "requirements-v2")
    TIMINGS["requirements changed"] = more.seconds
    assert not step(more, "pip").cached and not step(more, "postBuild").cached
    before_pip = more.steps[: more.steps.index(step(more, "pip")) - 1]  # up to the COPY of requirements.txt
    assert all(s.cached for s in before_pip[1:]), envbuild.describe_steps(more.steps)
    installed = [line.split()[2:] for line in lines if line.startswith("Successfully installed ")]
    assert installed == [sorted([f"{ALPHA}-1.0", f"{BETA}-2.0", f"{UPGRADED}-99.0"])], lines
    assert any(f"Successfully uninstalled {UPGRADED}-1.5.1" in line for line in lines)
    code = f"import {_module(BETA)} as b, {UPGRADED} as u; print(b.VALUE, u.VALUE)"
    assert docker_run(more.tag, code) == f"beta-{TOKEN} upgraded-{TOKEN}"


def test_a_package_missing_from_the_index_fails_at_the_pip_step(builder, engine):  # noqa: F811
    with pytest.raises(BuildFailed) as failed:
        builder(recipe(f"{ALPHA}\n{MISSING}\n"), "missing")
    e = failed.value
    assert not isinstance(e, BuildTimeout)
    assert e.step is not None and e.step.layer == "pip" and e.step.instruction.startswith("RUN pip install")
    assert "returned a non-zero code" in e.error and "(pip)" in str(e)
    assert any(f"No matching distribution found for {MISSING}" in line for line in e.log)
    assert not engine.api.images(name=f"{REPO_NAME}:missing")


def test_without_own_env_pip_cannot_write_the_root_owned_venv(builder, engine):  # noqa: F811
    """Why envbuild gives the user the base's env: the test image's /opt/venv is root's."""
    with pytest.raises(BuildFailed) as failed:
        builder(recipe(f"{ALPHA}\n"), "not-own-env", own_env=False)
    assert failed.value.step is not None and failed.value.step.layer == "pip"
    assert any("Permission denied" in line for line in failed.value.log)
    assert not engine.api.images(name=f"{REPO_NAME}:not-own-env")


def test_a_build_past_its_time_is_stopped(builder, engine):  # noqa: F811
    slow = parse_recipe(IMAGE, {"requirements.txt": f"{ALPHA}\n", "postBuild": "#!/bin/sh\nsleep 300\n"})
    t0 = time.monotonic()
    with pytest.raises(BuildTimeout) as failed:
        builder(slow, "slow", timeout=10)
    assert time.monotonic() - t0 < 25
    e = failed.value
    assert e.step is not None and e.step.layer == "postBuild"
    running = [m.group(1) for line in e.log if (m := re.match(r"^ ---> Running in ([0-9a-f]+)$", line))]
    assert running
    deadline = time.monotonic() + 30  # the killed step's container is removed (forcerm)
    while engine.api.containers(all=True, filters={"id": running[-1]}) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not engine.api.containers(all=True, filters={"id": running[-1]})
    assert not engine.api.images(name=f"{REPO_NAME}:slow")


# --- through the service's build queue ----------------------------------------------------------------


async def test_the_service_queue_builds_an_environment_then_reuses_its_image(
    engine,  # noqa: F811  (the imported fixture)
    index,
    tmp_path,
    monkeypatch,
):
    """labfleet.compute.envqueue: QUEUED -> BUILDING -> READY, the build's lines in the log file as it
    goes; a second environment of the same recipe READY at once from the same image, nothing built;
    the image leaves the engine with the last environment that has it."""
    from labfleet.compute import environments, images
    from labfleet.compute.envqueue import Builds
    from labfleet.core import database
    from labfleet.core.authz import Actor
    from labfleet.core.envmodels import Environment
    from labfleet.tenancy import directory
    from labfleet.tenancy.policies import ensure_default_keypair_policy
    from tests.dbfixture import fresh_db

    db_engine, factory = fresh_db(f"sqlite:///{tmp_path / 'lf.sqlite'}", tmp_path, monkeypatch)
    cli = Actor.cli()
    with database.session_scope(factory) as db:
        ensure_default_keypair_policy(db)
        directory.create_domain(db, cli, {"name": "acme"})
        directory.create_project(db, cli, {"domain": "acme", "name": "ml"})
        directory.create_user(db, cli, {"username": "ann", "domain": "acme", "projects": ["ml"]})
        images.register(db, cli, {"name": IMAGE})
        ann = directory.actor_for(directory.get_user(db, "ann"))
    builds = Builds(
        factory,
        logging.getLogger("test-envqueue"),
        log_dir=tmp_path / "logs",
        node="this-node",
        index_url=index["url"],
        network="host",  # the test's index is on the host's loopback (the service refuses host)
        timeout=300,
        cpu_limit=CPU_LIMIT,
        mem_limit=MEM_LIMIT,
    )
    body = {"base": IMAGE, "files": {"requirements.txt": f"{BETA}\n"}}

    def status_of(env_id):
        with database.session_scope(factory) as db:
            return environments.view(db.get(Environment, env_id))

    with database.session_scope(factory) as db:
        first = environments.view(builds.create(db, ann, {"name": "beta", **body}))
    tag = environments.image_tag(first["recipe_hash"])
    try:
        assert first["status"] == "QUEUED"
        assert builds.serve() == [first["id"]]
        seen, t0 = [], time.monotonic()
        while builds.running and time.monotonic() - t0 < 300:
            status = status_of(first["id"])["status"]
            if not seen or seen[-1] != status:
                seen.append(status)
            await asyncio.sleep(0.2)
        await builds.wait()
        TIMINGS["queued build"] = time.monotonic() - t0
        done = status_of(first["id"])
        assert done["status"] == "READY", done["status_reason"]
        assert "BUILDING" in seen and done["image"] == tag and done["node"] == "this-node"
        log = builds.log_path(first["id"]).read_text()
        assert "RUN pip install --no-cache-dir -r" in log and f"Successfully installed {BETA}-2.0" in log
        assert f"READY: image {tag}" in log
        image = engine.api.inspect_image(tag)
        # Its size is its own layers': the image's less its base's.
        own = image["Size"] - engine.api.inspect_image(IMAGE)["Size"]
        assert image["Id"] == done["image_id"] and done["size_bytes"] == own > 0
        assert docker_run(tag, f"import {_module(BETA)} as b; print(b.VALUE)") == f"beta-{TOKEN}"

        # The same recipe again: READY at once, the same image, nothing built.
        with database.session_scope(factory) as db:
            again = environments.view(builds.create(db, ann, {"name": "beta-again", **body}))
        assert again["status"] == "READY" and (again["image"], again["image_id"]) == (tag, done["image_id"])
        assert builds.serve() == []
        reused = builds.log_path(again["id"]).read_text()
        assert "nothing built" in reused and "Step " not in reused

        # The image stays while an environment has it.
        for env_id, left in ((first["id"], True), (again["id"], False)):
            with database.session_scope(factory) as db:
                gone = builds.delete(db, ann, env_id)
            await builds.forget(gone)
            assert bool(engine.api.images(name=tag)) is left
    finally:
        try:
            engine.api.remove_image(tag)
        except Exception:
            pass
        db_engine.dispose()
