"""schemathesis against the labfleet service behind a real Hub: every operation of openapi.yaml,
generated valid and invalid requests, all checks, as a plain user and as a superadmin.

It fails on any 5xx, any answer that does not match its schema (status, content type, body), and
any invalid request the service accepts.  Requests go only to the Hubs started here, on 127.0.0.1.
Each generated request is sent as both callers, side by side, each to a Hub of its own made alike
(see `worlds`): generated once (the two callers' runs generated the same requests anyway, from one
seed), and one caller's answer is awaited while the other's is checked.
Run it alone with ``pytest -p no:cacheprovider tests/test_fuzz_service.py -s`` to see the counts.
"""

from __future__ import annotations

import copy
import os
import random
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple
from urllib.parse import urlparse

import pytest
import requests
import schemathesis
import yaml
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig
from schemathesis.core.parameters import ParameterLocation

from labfleet.service.handlers import SPEC_FILE
from tests.hubfixture import start_hub

pytestmark = pytest.mark.hub

# Generated cases per operation in the fuzzing phase, each sent as every caller (the examples and
# coverage phases add their own, a number fixed by the schema).  About 4 minutes on 2 busy cores.
MAX_EXAMPLES = int(os.environ.get("LABFLEET_FUZZ_EXAMPLES", "40"))
SEED = 20261123
MAX_SERVERS = 2  # Hub servers per user that accepted POST /sessions may start (the Hub refuses more: 400)

# Operations not fuzzed, with why.
EXCLUDED = {
    # Streamed binary bodies whose Content-Length header is a parameter of the operation: a generated
    # Content-Length that disagrees with the body is a broken HTTP message (the connection is cut, or
    # waits for bytes that never come), not a request the API answers.  tests/test_vfolders_hub.py
    # covers both with real uploads.
    ("PUT", "/vfolders/{id}/files/{path}"),
    ("PATCH", "/vfolders/{id}/uploads/{upload}"),
    # A valid import fetches from the host its URL names: the network rule keeps tests to servers they
    # start.  tests/test_imports.py covers its refusals and its runs against such a server.
    ("POST", "/imports"),
    # A valid environment starts a build on the node's Docker engine (minutes, and the public package
    # index). tests/test_environments.py covers its refusals and the queue, test_envbuild_docker.py a build.
    ("POST", "/environments"),
}

# Operations whose schema-valid requests may still be refused with 400, with why: what the body names
# must exist, or the body's parts must fit together in ways a JSON Schema cannot say.  Everything
# else that is valid by the schema must be accepted (2xx) or refused for who asks or what exists
# (401, 403, 404, 409).
VALID_BUT_400 = {
    ("POST", "/keypairs"): "resource_policy names a keypair policy that must exist",
    ("PATCH", "/keypairs/{access_key}"): "resource_policy names a keypair policy that must exist",
    ("POST", "/projects"): "resource_policy names a project policy that must exist",
    ("PATCH", "/projects/{domain}/{project}"): "resource_policy names a project policy that must exist",
    ("POST", "/projects/{domain}/{project}/members"): "the user must exist, in the project's domain",
    (
        "POST",
        "/users",
    ): "projects and resource_policy name a project of the domain and a policy that must exist",
    ("PATCH", "/users/{username}"): "projects, domain and resource_policy name things that must exist",
    ("POST", "/policies/{kind}"): "max_endpoints and max_replicas_per_endpoint are for user policies only",
    (
        "PATCH",
        "/policies/{kind}/{name}",
    ): "max_endpoints and max_replicas_per_endpoint are for user policies only",
    ("POST", "/sessions"): "the shares of every gpu.shares slot together, at most one GPU model, the image's "
    "minimum resources; and the Hub's own refusals (here: its limit of MAX_SERVERS named servers)",
    ("POST", "/images"): "with inspect, the Docker engine must have the image",
    (
        "GET",
        "/usage",
    ): "start and end must be ISO 8601 times from the years 2000 to 9000, end after start, at "
    "most 400 days apart, and the range must make at most 3,000 buckets",
    ("POST", "/idle-checkers"): "which options a checker takes depends on its kind, and bindings must name a "
    "domain, project or resource group that exists",
    (
        "PATCH",
        "/idle-checkers/{name}",
    ): "options must suit the checker's kind; bindings must name what exists",
    ("POST", "/sessions/{id}/activity"): "last_activity must be an ISO 8601 time",
}
# What the world made by the `world` fixture holds, for generated names to hit.
KNOWN = {
    "domains": ["fz", "root"],
    "projects": ["lab"],
    "project_refs": ["lab", "fz/lab"],
    "users": ["fuzzer", "mate", "root"],
    "names": ["default", "local"],
}
PATH_KNOWN = {"domain": "domains", "project": "projects", "username": "users", "name": "names"}
BODY_KNOWN = {
    "domain": "domains",
    "project": "project_refs",
    "username": "users",
    "invitee": "users",
    "host": "names",
    "resource_policy": "names",
    "resource_group": "names",
}
POSITIVE_STATUSES = ["2xx", "3xx", "401", "403", "404", "409", "429"]

CONFIG = SchemathesisConfig.from_dict(
    {
        "seed": SEED,
        "request-timeout": 30,
        "generation": {
            "mode": "all",  # valid and invalid requests
            "max-examples": MAX_EXAMPLES,
            "no-shrink": True,  # report the failing case as found: shrinking re-runs it many times over HTTP
            "allow-x00": False,  # the service refuses NUL in every text; the spec does not repeat it each time
            "with-security-parameters": False,  # the test sends real credentials
            "database": "none",
        },
        # Half the generated names are ones the world below has, so requests get past "no such thing".
        "dictionaries": {name: {"values": values} for name, values in KNOWN.items()},
        "parameters": {
            **{f"path.{p}": {"dictionary": d, "probability": 0.5} for p, d in PATH_KNOWN.items()},
            **{f"body.{p}": {"dictionary": d, "probability": 0.3} for p, d in BODY_KNOWN.items()},
        },
        "phases": {
            "examples": {"enabled": True},
            "coverage": {"enabled": True},
            "fuzzing": {"enabled": True},
            "stateful": {"enabled": False},
        },
        "checks": {
            "enabled": True,
            # Without schemathesis's default "5xx" here: a 5xx is no acceptable answer to valid data either.
            "positive_data_acceptance": {"expected-statuses": POSITIVE_STATUSES},
        },
        "operations": [
            {
                # An upload's declared size beyond what the folder's quota leaves is refused as too large
                # (413), however valid the number is by the schema. ASCII paths, as below.
                "include-method": "POST",
                "include-path": "/vfolders/{id}/uploads",
                "generation": {"codec": "ascii"},
                "checks": {
                    "positive_data_acceptance": {"expected-statuses": [*POSITIVE_STATUSES, "400", "413"]}
                },
            },
            {
                # Paths inside a folder are limited in bytes of UTF-8 (4096 a path, 255 a name), which JSON
                # Schema cannot say (it counts characters): ASCII paths, where the two agree.  It also keeps
                # URLs under the Hub's proxy's 16 KiB request line (a non-ASCII character is 12 bytes there).
                "include-path-regex": "^/vfolders/\\{id\\}/(files|mkdir|move|trash|uploads)",
                "generation": {"codec": "ascii"},
            },
            *(
                {
                    "include-method": method,
                    "include-path": path,
                    "checks": {
                        "positive_data_acceptance": {"expected-statuses": [*POSITIVE_STATUSES, "400"]}
                    },
                }
                for method, path in VALID_BUT_400
            ),
        ],
    }
)
schema: schemathesis.BaseSchema = schemathesis.openapi.from_path(SPEC_FILE, config=CONFIG)
SPEC = yaml.safe_load(SPEC_FILE.read_text())
for _method, _path in EXCLUDED:
    schema = schema.exclude(method=_method, path=_path)

# 5xx answers found by this test whose fix lies outside the handlers and the spec, with where it lies.
# Their operation is still fuzzed and every other check still applies; a 5xx there is recorded, and
# test_known_defects (last) reports them as an expected failure.  Remove an entry once it is fixed.
KNOWN_DEFECTS: dict[tuple[str, str], str] = {}  # (method, path) -> why a 5xx there is known; none now
SEEN_DEFECTS: Counter = Counter()

CALLS: Counter = Counter()
STARTED = time.monotonic()

# Who sends every generated request, each to a Hub of its own (see `worlds`).
CALLERS = ("user", "superadmin")


class World:
    """One caller's Hub, the callers' tokens there and what the fuzzer may find there."""

    def __init__(self, hub):
        self.hub = hub
        self.tokens: dict[str, str] = {}
        self.sessions: dict[str, requests.Session] = {}
        self.keys: dict[str, set[str]] = {}
        self.hosts_root = hub.state / "fuzz-hosts"
        self.folder_ids: list[str] = []
        self.random = random.Random(SEED)


def _build_world(hub) -> World:
    """Wait for ``hub``, then make the small world the fuzzer finds there."""
    hub.wait_ready()
    w = World(hub)
    root = hub.wait_token("root")

    def ok(method, path, body=None, token=root):
        r = hub.api(method, path, token, json=body)
        assert r.status_code in (200, 201), (method, path, r.text)
        return r.json()

    # A small world for the fuzzer to find: a domain, a project, a plain user in it with a folder.
    ok("POST", "/domains", {"name": "fz"})
    ok("POST", "/projects", {"domain": "fz", "name": "lab"})
    ok("POST", "/users", {"username": "fuzzer", "domain": "fz", "projects": ["lab"]})
    ok("POST", "/users", {"username": "mate", "domain": "fz", "projects": ["lab"]})
    user = hub.wait_token("fuzzer")
    w.tokens = {"user": user, "superadmin": root}
    # Many requests in a few minutes: lift both callers' rate limits.
    for name in ("root", "fuzzer"):
        keys = {kp["access_key"] for kp in ok("GET", f"/keypairs?username={name}")}
        w.keys[name] = keys
        for key in keys:
            ok("PATCH", f"/keypairs/{key}", {"rate_limit": 10_000_000})
    # Folders to find: the user's own (with a file and a directory), a project folder.
    mine = ok("POST", "/vfolders", {"name": "data"}, token=user)["id"]
    r = hub.api("PUT", f"/vfolders/{mine}/files/a.txt", user, data=b"hello")
    assert r.status_code == 201, r.text
    ok("POST", f"/vfolders/{mine}/mkdir", {"path": "dir"}, token=user)
    team = ok("POST", "/vfolders", {"name": "team", "project": "fz/lab"})["id"]
    w.folder_ids = [mine, team]
    for role in w.tokens:
        s = requests.Session()  # keep-alive: one connection per caller for the whole run
        s.trust_env = False  # no proxy from the environment: straight to 127.0.0.1
        w.sessions[role] = s
    return w


class Worlds(NamedTuple):
    by_caller: dict[str, World]
    pool: ThreadPoolExecutor  # where the callers after the first send theirs


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    """A Hub for each caller, both made alike and run side by side: every generated request goes to
    both, as the plain user to the user's Hub and as the superadmin to the superadmin's.  Neither
    caller changes what the other finds (the superadmin may deactivate, demote or delete the plain
    user, its domain or project), as when the user's run came first and the superadmin's after."""
    hubs = {}
    pool = ThreadPoolExecutor(max_workers=len(CALLERS), thread_name_prefix="fuzz")
    try:
        # One after the other: each start sets this process's secret key file; they boot side by side.
        for role in CALLERS:
            hubs[role] = start_hub(
                tmp_path_factory.mktemp(f"fuzz-{role}"),
                # A valid POST /sessions starts a real Hub server (a JupyterLab process): a few at most.
                extra_config=f"c.JupyterHub.named_server_limit_per_user = {MAX_SERVERS}\n",
                wait=False,
            )
        built = {role: pool.submit(_build_world, hubs[role]) for role in CALLERS}
        yield Worlds({role: f.result() for role, f in built.items()}, pool)
    finally:
        pool.shutdown(wait=True)
        for hub in hubs.values():
            if hub.proc.poll() is None:
                hub.proc.terminate()  # all at once; stop() then waits for each
        for hub in hubs.values():
            hub.stop()
        operations = sum(1 for _ in schema.get_all_operations())
        print(
            f"\nschemathesis: {operations} operations, {sum(CALLS.values())} requests in "
            f"{time.monotonic() - STARTED:.0f} s: {dict(sorted(CALLS.items()))}"
        )


def _twin(case):
    """A copy of the generated ``case`` that one caller may adjust and send: its own containers and
    metadata (sending a case marks it sent, and the adjustments below edit it in place)."""
    twin = case.derive(keep_auth=True)
    object.__setattr__(twin, "id", case.id)
    object.__setattr__(twin, "body", copy.deepcopy(case.body))
    object.__setattr__(twin, "query", copy.deepcopy(case.query))
    object.__setattr__(twin, "_meta", copy.deepcopy(case._meta))
    return twin


def _use_real_folder(w: World, case) -> None:
    """Generated folder ids are random UUIDs, which the service never has: in half the valid cases,
    ask about a folder that exists."""
    params = case.path_parameters or {}
    if not case.path.startswith("/vfolders/{id}") or "id" not in params:
        return
    if case.meta is not None and case.meta.is_negative_at(ParameterLocation.PATH):
        return
    if w.random.random() < 0.5:
        params["id"] = w.random.choice(w.folder_ids)


def _confine_host_paths(w: World, case) -> None:
    """Storage hosts are directories the service makes (as root, here): keep every absolute path a
    generated body names under the test's state directory.  Relative, non-normalised or over-long
    paths stay as bad as they were, so the service must still refuse them."""
    if case.path.startswith("/storage-hosts") and isinstance(case.body, dict):
        path = case.body.get("path")
        if isinstance(path, str) and path.startswith("/"):
            confined = str(w.hosts_root) + path
            case.body["path"] = confined if len(path) <= 4096 - len(str(w.hosts_root)) else path


def _sabotage(w: World, role: str, case) -> bool:
    """Requests that would take the superadmin's own power away (deactivate, demote or delete root,
    throttle or revoke its keypairs) once the fuzzer has made another superadmin: valid, tested in
    test_authz_matrix.py, and here they would end the run.  (The plain user cannot hurt itself.)"""
    if role != "superadmin" or case.method not in ("PATCH", "DELETE"):
        return False
    params = case.path_parameters or {}
    if case.path == "/users/{username}":
        return params.get("username") == "root"
    if case.path == "/keypairs/{access_key}":
        return params.get("access_key") in w.keys["root"]
    return False


def _base_url(w: World, path: str) -> str:
    """Where the operation at ``path`` lives: under the API (the spec's servers), or where its own
    ``servers`` say (/metrics: beside the API)."""
    servers = SPEC["paths"][path].get("servers") or SPEC["servers"]
    return w.hub.url + servers[0]["url"]


def _call(w: World, role: str, case) -> None:
    """Send ``case`` as ``role`` to its Hub and check the answer (every check, as configured)."""
    base_url = _base_url(w, case.path)
    assert urlparse(base_url).hostname == "127.0.0.1", base_url  # never spray the world
    _confine_host_paths(w, case)
    _use_real_folder(w, case)
    if _sabotage(w, role, case):
        return
    CALLS[role] += 1
    transport = {
        "base_url": base_url,
        "session": w.sessions[role],
        "headers": {"Authorization": f"token {w.tokens[role]}"},
    }
    try:
        response = case.call(**transport)
        if response.status_code >= 500 and (case.method, case.path) in KNOWN_DEFECTS:
            SEEN_DEFECTS[(case.method, case.path)] += 1
            return
        case.validate_response(response, headers=transport["headers"], transport_kwargs=transport)
    except BaseException as e:  # schemathesis's FailureGroup is no Exception
        e.add_note(f"(sent as the {role}, to its Hub at {w.hub.url})")
        raise


def _call_as_every_caller(worlds: Worlds, case) -> None:
    """Send ``case`` as each caller, side by side (each to its own Hub); every failure is reported."""
    first, *others = CALLERS
    twins = {first: case, **{role: _twin(case) for role in others}}  # copied before any is sent
    pending = {role: worlds.pool.submit(_call, worlds.by_caller[role], role, twins[role]) for role in others}
    errors: list[BaseException] = []  # schemathesis's FailureGroup is no Exception
    try:
        _call(worlds.by_caller[first], first, twins[first])
    except BaseException as e:
        errors.append(e)
    for role in others:  # always awaited: a caller's requests go one after the other
        try:
            pending[role].result()
        except BaseException as e:
            errors.append(e)
    if errors:
        for other in errors[1:]:
            errors[0].add_note(f"\nAnd as the other caller: {type(other).__name__}: {other}")
            errors[0].add_note("".join(getattr(other, "__notes__", [])))
        raise errors[0]


@pytest.fixture(scope="module", autouse=True)
def _configuration_resolved_once():
    """schemathesis works out an operation's configuration (its checks, its generation settings:
    the run's, merged with every `operations` entry that matches it) anew for each generated case
    and each answer it checks: over a tenth of this process's time.  CONFIG does not change during
    the run, so each (operation, phase) is worked out once, by schemathesis, and kept."""
    config = schema.config
    cls = type(config)
    patch = pytest.MonkeyPatch()
    for name in ("checks_config_for", "generation_for", "phases_for"):
        original = getattr(cls, name)
        kept: dict = {}

        def resolved(self, *, operation=None, _original=original, _kept=kept, **phase):
            if self is not config:
                return _original(self, operation=operation, **phase)
            key = (id(operation), tuple(phase.items()))
            hit = _kept.get(key)
            if hit is None or hit[0] is not operation:  # the operation itself is kept: ids stay unique
                hit = _kept[key] = (operation, _original(self, operation=operation, **phase))
            return hit[1]

        patch.setattr(cls, name, resolved)
    yield
    patch.undo()


# ASCII paths under a folder (see CONFIG) leave hypothesis filtering many generated paths: that is
# slow generation, not a finding, so its health check does not fail the operation.
FUZZ_SETTINGS = settings(suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])


@schema.parametrize()
@FUZZ_SETTINGS
def test_fuzz(case, worlds):
    """Every generated request of every operation, as the plain user and as the superadmin."""
    _call_as_every_caller(worlds, case)


def test_known_defects(worlds):
    """Last: the known 5xx the fuzzing met (see KNOWN_DEFECTS), as an expected failure while they last."""
    if SEEN_DEFECTS:
        pytest.xfail(
            "; ".join(
                f"{m} {p} ({n}x): {KNOWN_DEFECTS[(m, p)]}" for (m, p), n in sorted(SEEN_DEFECTS.items())
            )
        )
