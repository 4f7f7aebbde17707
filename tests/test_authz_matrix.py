"""Every service route x every kind of caller, against a real Hub: the status each gets,
and list answers that never leak another tenant's data."""

import uuid

import pytest

from tests.hubfixture import start_hub

pytestmark = pytest.mark.hub

ACTORS = ["anon", "alice", "bob", "carol", "dave", "mona", "root"]
# alice: user in acme, member of acme/ml; bob: user in acme, no project; carol: admin of acme;
# dave: admin of globex; mona: monitor; root: superadmin.


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    hub = start_hub(tmp_path_factory.mktemp("hub"))
    root = hub.wait_token("root")

    def ok(method, path, body=None):
        r = hub.api(method, path, root, json=body)
        assert r.status_code in (200, 201), (path, r.text)
        return r.json()

    ok("POST", "/domains", {"name": "acme"})
    ok("POST", "/domains", {"name": "globex"})
    ok("POST", "/projects", {"domain": "acme", "name": "ml"})
    ok("POST", "/projects", {"domain": "globex", "name": "x"})
    ok("POST", "/users", {"username": "alice", "domain": "acme", "projects": ["ml"]})
    ok("POST", "/users", {"username": "bob", "domain": "acme"})
    ok("POST", "/users", {"username": "erin", "domain": "acme"})
    ok("POST", "/users", {"username": "carol", "domain": "acme", "role": "admin"})
    ok("POST", "/users", {"username": "dave", "domain": "globex", "role": "admin"})
    ok("POST", "/users", {"username": "gina", "domain": "globex", "projects": ["x"]})
    ok("POST", "/users", {"username": "mona", "domain": "root", "role": "monitor"})
    # Per-actor victims, so each actor's delete has its own target.
    for a in ACTORS:
        ok("POST", "/users", {"username": f"victim-{a}", "domain": "acme"})
        ok("POST", "/users", {"username": f"role-{a}", "domain": "acme"})
        ok("POST", "/users", {"username": f"join-{a}", "domain": "acme"})
        ok("POST", "/users", {"username": f"leave-{a}", "domain": "acme", "projects": ["ml"]})
        ok("POST", "/projects", {"domain": "globex", "name": f"del-{a}"})
        ok("POST", "/images", {"name": f"del/{a}:1"})
    alice_keys = {a: ok("POST", "/keypairs", {"username": "alice"})["access_key"] for a in ACTORS}
    main_alice = next(k["access_key"] for k in ok("GET", "/keypairs?username=alice") if k["is_main"])
    tokens = {"anon": None, "root": root}
    for name in ACTORS[1:-1]:
        tokens[name] = hub.wait_token(name)
    # alice's sessions (0.01 cores each), one per actor to read and to stop: admitted as the Hub's
    # spawner asks (the service token for alice), with no Hub server behind them.
    alice_sessions = {}
    for a in ACTORS:
        r = hub.api(
            "POST",
            "/sessions",
            hub.service_token,
            json={"project": "acme/ml", "username": "alice", "name": f"s-{a}", "slots": {"cpu": 0.01}},
        )
        assert r.status_code == 201, r.text
        alice_sessions[a] = r.json()["id"]
    keys = {a: {"alice_key": alice_keys[a], "alice_session": alice_sessions[a]} for a in ACTORS}
    _vfolder_world(hub, ok, tokens, keys)
    yield hub, tokens, keys, main_alice
    hub.stop()


def _vfolder_world(hub, ok, tokens, keys):
    """alice's folder `shared` (shared rw with `sharee`), acme/ml's project folder, and per actor:
    folders to delete / restore / purge, invitations, files, trash entries, uploads."""
    alice = tokens["alice"]

    def as_alice(method, path, body=None, code=(200, 201), **kw):
        r = hub.api(method, path, alice, json=body, **kw)
        assert r.status_code in code, (path, r.text)
        return r.json()

    ok("POST", "/users", {"username": "sharee", "domain": "acme"})
    sharee = hub.wait_token("sharee")
    shared = as_alice("POST", "/vfolders", {"name": "shared"})["id"]
    inv = as_alice("POST", f"/vfolders/{shared}/invitations", {"invitee": "sharee", "permission": "rw"})
    assert hub.api("POST", f"/vfolder-invitations/{inv['id']}/accept", sharee).status_code == 200
    project = ok("POST", "/vfolders", {"name": "team", "project": "acme/ml", "permission": "ro"})["id"]
    for a in ACTORS:
        ok("POST", "/storage-hosts", {"name": f"del-{a}", "path": str(hub.state / f"hosts/del-{a}")})
        ok("POST", "/users", {"username": f"inv-{a}", "domain": "acme"})
        ok("POST", "/users", {"username": f"leaver-{a}", "domain": "acme"})
        leaver = hub.wait_token(f"leaver-{a}")
        i = as_alice(
            "POST", f"/vfolders/{shared}/invitations", {"invitee": f"leaver-{a}", "permission": "ro"}
        )
        assert hub.api("POST", f"/vfolder-invitations/{i['id']}/accept", leaver).status_code == 200
        k = keys[a]
        k["shared"], k["project_folder"], k["hosts"] = shared, project, str(hub.state / "hosts")
        k["del_folder"] = as_alice("POST", "/vfolders", {"name": f"del-{a}"})["id"]
        for name in ("restore", "purge"):
            fid = as_alice("POST", "/vfolders", {"name": f"{name}-{a}"})["id"]
            as_alice("DELETE", f"/vfolders/{fid}")
            k[f"{name}_folder"] = fid
        # Three invitations to bob per actor: to accept, to decline, to cancel.
        for what in ("accept", "decline", "cancel"):
            fid = as_alice("POST", "/vfolders", {"name": f"inv-{what}-{a}"})["id"]
            k[f"inv_{what}"] = as_alice("POST", f"/vfolders/{fid}/invitations", {"invitee": "bob"})["id"]
        for name in ("del", "mv", "trash1", "trash2"):
            as_alice("PUT", f"/vfolders/{shared}/files/{name}-{a}.txt", data=b"x")
        k["trash_restore"] = as_alice("DELETE", f"/vfolders/{shared}/files/trash1-{a}.txt")["id"]
        k["trash_purge"] = as_alice("DELETE", f"/vfolders/{shared}/files/trash2-{a}.txt")["id"]
        k["upload"] = as_alice("POST", f"/vfolders/{shared}/uploads", {"path": f"up-{a}.bin", "size": 4})[
            "id"
        ]
        k["upload_del"] = as_alice("POST", f"/vfolders/{shared}/uploads", {"path": f"ud-{a}.bin", "size": 4})[
            "id"
        ]


def _row(*codes):
    return dict(zip(ACTORS, codes, strict=True))


# (method, path, body, expected status per actor); "{a}" is replaced by the actor's name.
MATRIX = [
    ("GET", "/me", None, _row(401, 200, 200, 200, 200, 200, 200)),
    ("GET", "/domains", None, _row(401, 200, 200, 200, 200, 200, 200)),
    ("POST", "/domains", {"name": "d-{a}"}, _row(401, 403, 403, 403, 403, 403, 201)),
    ("GET", "/domains/acme", None, _row(401, 200, 200, 200, 404, 200, 200)),
    ("PATCH", "/domains/acme", {"description": "x"}, _row(401, 403, 403, 403, 404, 403, 200)),
    ("DELETE", "/domains/globex", None, _row(401, 404, 404, 404, 403, 403, 409)),
    ("GET", "/projects", None, _row(401, 200, 200, 200, 200, 200, 200)),
    ("POST", "/projects", {"domain": "acme", "name": "p-{a}"}, _row(401, 403, 403, 201, 404, 403, 201)),
    ("GET", "/projects/acme/ml", None, _row(401, 200, 404, 200, 404, 200, 200)),
    ("PATCH", "/projects/acme/ml", {"description": "y"}, _row(401, 403, 404, 200, 404, 403, 200)),
    ("DELETE", "/projects/globex/del-{a}", None, _row(401, 404, 404, 404, 200, 403, 200)),
    ("GET", "/projects/acme/ml/members", None, _row(401, 200, 404, 200, 404, 200, 200)),
    ("POST", "/projects/acme/ml/members", {"username": "join-{a}"}, _row(401, 403, 404, 201, 404, 403, 201)),
    ("DELETE", "/projects/acme/ml/members/leave-{a}", None, _row(401, 403, 404, 200, 404, 403, 200)),
    ("GET", "/users", None, _row(401, 200, 200, 200, 200, 200, 200)),
    ("POST", "/users", {"username": "u-{a}", "domain": "acme"}, _row(401, 403, 403, 201, 404, 403, 201)),
    (
        "POST",
        "/users",
        {"username": "s-{a}", "domain": "acme", "role": "superadmin"},
        _row(401, 403, 403, 403, 404, 403, 201),
    ),
    ("GET", "/users/alice", None, _row(401, 200, 404, 200, 404, 200, 200)),
    ("PATCH", "/users/alice", {"full_name": "A"}, _row(401, 200, 404, 200, 404, 403, 200)),
    ("PATCH", "/users/role-{a}", {"role": "admin"}, _row(401, 404, 404, 200, 404, 403, 200)),
    ("PATCH", "/users/role-{a}", {"role": "monitor"}, _row(401, 404, 404, 403, 404, 403, 200)),
    ("DELETE", "/users/victim-{a}", None, _row(401, 404, 404, 200, 404, 403, 200)),
    ("GET", "/policies/keypair", None, _row(401, 403, 403, 200, 200, 200, 200)),
    ("POST", "/policies/keypair", {"name": "pol-{a}"}, _row(401, 403, 403, 403, 403, 403, 201)),
    ("GET", "/policies/keypair/default", None, _row(401, 403, 403, 200, 200, 200, 200)),
    ("PATCH", "/policies/user/nope", {"max_vfolder_count": 1}, _row(401, 403, 403, 404, 404, 404, 404)),
    ("DELETE", "/policies/keypair/default", None, _row(401, 403, 403, 403, 403, 403, 409)),
    ("GET", "/keypairs", None, _row(401, 200, 200, 200, 200, 200, 200)),
    ("POST", "/keypairs", {}, _row(401, 201, 201, 201, 201, 403, 201)),
    ("POST", "/keypairs", {"username": "alice"}, _row(401, 201, 404, 201, 404, 403, 201)),
    ("GET", "/keypairs/{main_alice}", None, _row(401, 200, 404, 200, 404, 200, 200)),
    ("PATCH", "/keypairs/{main_alice}", {"rate_limit": 500}, _row(401, 403, 404, 200, 404, 403, 200)),
    ("DELETE", "/keypairs/{alice_key}", None, _row(401, 200, 404, 200, 404, 403, 200)),
    ("DELETE", "/keypairs/{main_alice}", None, _row(401, 409, 404, 409, 404, 403, 409)),
    ("GET", "/audit", None, _row(401, 200, 200, 200, 200, 200, 200)),
    ("GET", "/resource-groups", None, _row(401, 200, 200, 200, 200, 200, 200)),
    ("POST", "/resource-groups", {"name": "rg-{a}"}, _row(401, 403, 403, 403, 403, 403, 201)),
    ("GET", "/resource-groups/default", None, _row(401, 200, 200, 200, 200, 200, 200)),
    ("PATCH", "/resource-groups/default", {"description": "d"}, _row(401, 403, 403, 403, 403, 403, 200)),
    ("GET", "/nodes", None, _row(401, 200, 200, 200, 200, 200, 200)),
    ("GET", "/sessions", None, _row(401, 200, 200, 200, 200, 200, 200)),
    (
        "POST",
        "/sessions",
        {"project": "acme/ml", "slots": {"cpu": 0.01}},
        _row(401, 202, 403, 403, 403, 403, 403),  # alice's starts a Hub server for it
    ),
    ("GET", "/sessions/{alice_session}", None, _row(401, 200, 404, 200, 404, 200, 200)),
    # A replica's credential: its own session (the owner) and the Hub only; this one is no replica.
    ("GET", "/sessions/{alice_session}/replica-credential", None, _row(401, 200, 404, 404, 404, 404, 404)),
    ("PATCH", "/sessions/{alice_session}", {"status": "RUNNING"}, _row(401, 403, 404, 403, 404, 403, 403)),
    ("DELETE", "/sessions/{alice_session}", None, _row(401, 200, 404, 200, 404, 403, 200)),
    ("GET", "/scheduler/queue", None, _row(401, 200, 200, 200, 200, 200, 200)),
    ("GET", "/images", None, _row(401, 200, 200, 200, 200, 200, 200)),
    ("POST", "/images", {"name": "img/{a}:1"}, _row(401, 403, 403, 403, 403, 403, 201)),
    # bob is in no project, so no image is his to see; everyone else may use local/host.
    ("GET", "/images/local/host", None, _row(401, 200, 404, 200, 200, 200, 200)),
    ("PATCH", "/images/local/host", {"display_name": "x"}, _row(401, 403, 404, 403, 403, 403, 200)),
    ("DELETE", "/images/del/{a}:1", None, _row(401, 403, 404, 403, 403, 403, 200)),
    ("GET", "/users/alice/launch-options", None, _row(401, 200, 404, 200, 404, 200, 200)),
    (
        "POST",
        "/auth/password",
        {"username": "root", "password": "x"},
        _row(401, 403, 403, 403, 403, 403, 403),
    ),
    ("POST", "/auth/identity", {"username": "alice"}, _row(401, 403, 403, 403, 403, 403, 403)),
    ("GET", "/auth/users/alice", None, _row(401, 403, 403, 403, 403, 403, 403)),
    # ---- storage hosts and virtual folders
    ("GET", "/storage-hosts", None, _row(401, 200, 200, 200, 200, 200, 200)),
    (
        "POST",
        "/storage-hosts",
        {"name": "sh-{a}", "path": "{hosts}/sh-{a}"},
        _row(401, 403, 403, 403, 403, 403, 201),
    ),
    ("GET", "/storage-hosts/local", None, _row(401, 200, 200, 200, 200, 200, 200)),
    ("PATCH", "/storage-hosts/local", {"description": "d"}, _row(401, 403, 403, 403, 403, 403, 200)),
    ("DELETE", "/storage-hosts/del-{a}", None, _row(401, 403, 403, 403, 403, 403, 200)),
    ("GET", "/vfolders", None, _row(401, 200, 200, 200, 200, 200, 200)),
    ("POST", "/vfolders", {"name": "new-{a}"}, _row(401, 201, 201, 201, 201, 403, 201)),
    ("GET", "/vfolders/usage", None, _row(401, 200, 200, 200, 200, 200, 200)),
    # Usage statistics: everyone reads their own scope (rows scoped in tests/test_usage_hub.py)
    ("GET", "/usage", None, _row(401, 200, 200, 200, 200, 200, 200)),
    ("GET", "/usage?group_by=nobody", None, _row(401, 400, 400, 400, 400, 400, 400)),
    ("GET", "/usage/me", None, _row(401, 200, 200, 200, 200, 200, 200)),
    ("GET", "/vfolders/usage?user=alice", None, _row(401, 200, 404, 200, 404, 200, 200)),
    ("GET", "/vfolders/{shared}", None, _row(401, 200, 404, 200, 404, 200, 200)),
    ("GET", "/vfolders/{project_folder}", None, _row(401, 200, 404, 200, 404, 200, 200)),
    ("PATCH", "/vfolders/{shared}", {"usage_mode": "data"}, _row(401, 200, 404, 200, 404, 403, 200)),
    ("DELETE", "/vfolders/{del_folder}", None, _row(401, 200, 404, 200, 404, 403, 200)),
    ("POST", "/vfolders/{restore_folder}/restore", None, _row(401, 200, 404, 200, 404, 403, 200)),
    ("POST", "/vfolders/{purge_folder}/purge", None, _row(401, 200, 404, 200, 404, 403, 200)),
    (
        "POST",
        "/vfolders/{shared}/invitations",
        {"invitee": "inv-{a}"},
        _row(401, 201, 404, 403, 404, 403, 403),
    ),
    ("GET", "/vfolder-invitations", None, _row(401, 200, 200, 200, 200, 200, 200)),
    ("POST", "/vfolder-invitations/{inv_accept}/accept", None, _row(401, 403, 200, 404, 404, 404, 404)),
    ("POST", "/vfolder-invitations/{inv_decline}/decline", None, _row(401, 403, 200, 404, 404, 404, 404)),
    ("DELETE", "/vfolder-invitations/{inv_cancel}", None, _row(401, 200, 403, 404, 404, 404, 404)),
    ("GET", "/vfolders/{shared}/permissions", None, _row(401, 200, 404, 200, 404, 403, 200)),
    (
        "PUT",
        "/vfolders/{shared}/permissions/sharee",
        {"permission": "rw"},
        _row(401, 200, 404, 200, 404, 403, 200),
    ),
    ("DELETE", "/vfolders/{shared}/permissions/leaver-{a}", None, _row(401, 200, 404, 200, 404, 403, 200)),
    # Admins manage a user's folder but read its files only when it is shared with them.
    ("GET", "/vfolders/{shared}/files", None, _row(401, 200, 404, 403, 404, 403, 403)),
    ("GET", "/vfolders/{project_folder}/files", None, _row(401, 200, 404, 200, 404, 403, 200)),
    ("PUT", "/vfolders/{shared}/files/new-{a}.txt", {"x": 1}, _row(401, 201, 404, 403, 404, 403, 403)),
    (
        "PUT",
        "/vfolders/{project_folder}/files/new-{a}.txt",
        {"x": 1},
        _row(401, 403, 404, 201, 404, 403, 201),
    ),
    ("DELETE", "/vfolders/{shared}/files/del-{a}.txt", None, _row(401, 200, 404, 403, 404, 403, 403)),
    ("POST", "/vfolders/{shared}/mkdir", {"path": "dir-{a}"}, _row(401, 201, 404, 403, 404, 403, 403)),
    (
        "POST",
        "/vfolders/{shared}/move",
        {"from": "mv-{a}.txt", "to": "moved-{a}.txt"},
        _row(401, 200, 404, 403, 404, 403, 403),
    ),
    ("GET", "/vfolders/{shared}/trash", None, _row(401, 200, 404, 403, 404, 403, 403)),
    (
        "POST",
        "/vfolders/{shared}/trash/{trash_restore}/restore",
        None,
        _row(401, 200, 404, 403, 404, 403, 403),
    ),
    ("DELETE", "/vfolders/{shared}/trash/{trash_purge}", None, _row(401, 200, 404, 200, 404, 403, 200)),
    (
        "POST",
        "/vfolders/{shared}/uploads",
        {"path": "u-{a}.bin", "size": 1},
        _row(401, 201, 404, 403, 404, 403, 403),
    ),
    ("GET", "/vfolders/{shared}/uploads/{upload}", None, _row(401, 200, 404, 403, 404, 403, 403)),
    # No Upload-Offset header: the owner hears what is missing, everyone else no more than before.
    ("PATCH", "/vfolders/{shared}/uploads/{upload}", {"x": 1}, _row(401, 400, 404, 403, 404, 403, 403)),
    ("DELETE", "/vfolders/{shared}/uploads/{upload_del}", None, _row(401, 200, 404, 403, 404, 403, 403)),
    # ---- the admin console: the announcement (everyone reads it), information and configuration
    ("GET", "/announcement", None, _row(401, 200, 200, 200, 200, 200, 200)),
    ("PUT", "/announcement", {"text": "from {a}"}, _row(401, 403, 403, 403, 403, 403, 200)),
    ("PUT", "/announcement", {"text": "x", "level": "loud"}, _row(401, 403, 403, 403, 403, 403, 400)),
    ("DELETE", "/announcement", None, _row(401, 403, 403, 403, 403, 403, 200)),
    ("GET", "/info", None, _row(401, 403, 403, 200, 200, 200, 200)),
    ("GET", "/configuration", None, _row(401, 403, 403, 200, 200, 200, 200)),
]


@pytest.mark.parametrize("method,path,body,expected", MATRIX, ids=[f"{m} {p}" for m, p, _, _ in MATRIX])
def test_route_statuses(world, method, path, body, expected):
    hub, tokens, keys, main_alice = world
    got = {}
    for actor in ACTORS:
        p = path.format(a=actor, main_alice=main_alice, **keys[actor])
        b = (
            None
            if body is None
            else {k: (v.format(a=actor, **keys[actor]) if isinstance(v, str) else v) for k, v in body.items()}
        )
        r = hub.api(method, p, tokens[actor], json=b)
        got[actor] = r.status_code
        assert r.headers["Content-Type"].startswith("application/json")
        if r.status_code >= 400:
            assert r.json()["message"]
    assert got == expected


def test_session_logs_for_owner_and_admins_only(world):
    hub, tokens, keys, _ = world
    expected = _row(401, 200, 404, 200, 404, 404, 200)
    got = {}
    for actor in ACTORS:
        r = hub.api("GET", f"/sessions/{keys['alice']['alice_session']}/logs", tokens[actor])
        got[actor] = r.status_code
        if r.status_code == 200:
            assert r.headers["Content-Type"].startswith("text/plain")
    assert got == expected
    assert hub.api("GET", "/sessions/nope/logs", tokens["root"]).status_code == 404
    r = hub.api("GET", f"/sessions/{keys['alice']['alice_session']}/logs?tail=-1", tokens["alice"])
    assert r.status_code == 400


def test_nobody_promotes_themselves(world):
    hub, tokens, *_ = world
    for who, role in [
        ("alice", "admin"),
        ("bob", "superadmin"),
        ("carol", "superadmin"),
        ("mona", "superadmin"),
    ]:
        r = hub.api("PATCH", f"/users/{who}", tokens[who], json={"role": role})
        assert r.status_code == 403, (who, r.text)
    assert hub.api("GET", "/users/alice", tokens["root"]).json()["role"] == "user"
    # A domain admin cannot move a user into another domain, even their own user.
    r = hub.api("PATCH", "/users/alice", tokens["carol"], json={"domain": "globex"})
    assert r.status_code == 403


def _names(hub, token, path, key):
    return {item[key] for item in hub.api("GET", path, token).json()}


def test_lists_do_not_leak(world):
    hub, tokens, *_ = world
    assert _names(hub, tokens["alice"], "/users", "username") == {"alice"}
    acme_users = _names(hub, tokens["carol"], "/users", "username")
    assert "alice" in acme_users and not acme_users & {"dave", "gina", "mona", "root"}
    assert _names(hub, tokens["dave"], "/users", "username") >= {"dave", "gina"}
    assert not _names(hub, tokens["dave"], "/users", "username") & {"alice", "bob", "carol"}
    assert {"alice", "dave", "gina", "root"} <= _names(hub, tokens["mona"], "/users", "username")
    assert _names(hub, tokens["alice"], "/domains", "name") == {"acme"}
    assert _names(hub, tokens["dave"], "/domains", "name") == {"globex"}
    assert _names(hub, tokens["alice"], "/projects", "full_name") == {"acme/ml"}
    assert _names(hub, tokens["bob"], "/projects", "full_name") == set()
    assert "globex/x" not in _names(hub, tokens["carol"], "/projects", "full_name")
    # Filtering by a domain one may not read is "not found", like the domain itself.
    assert hub.api("GET", "/users?domain=globex", tokens["alice"]).status_code == 404
    assert hub.api("GET", "/projects?domain=acme", tokens["dave"]).status_code == 404
    assert _names(hub, tokens["bob"], "/keypairs", "username") == {"bob"}
    assert "alice" not in _names(hub, tokens["dave"], "/keypairs", "username")
    assert _names(hub, tokens["bob"], "/keypairs?username=alice", "username") == set()
    # The audit log: a domain admin reads their own domain's entries, not the other's.
    dave_log = hub.api("GET", "/audit?limit=1000", tokens["dave"]).json()
    assert dave_log and all("acme" not in (e["target_domain"] or "") for e in dave_log)
    alice_log = hub.api("GET", "/audit?limit=1000", tokens["alice"]).json()
    assert all(e["actor"] == "alice" for e in alice_log)
    # Sessions: a user lists their own; another domain's admin sees none of acme's.
    assert _names(hub, tokens["bob"], "/sessions", "user") <= {"bob"}
    assert "alice" not in _names(hub, tokens["dave"], "/sessions", "user")
    assert "alice" in _names(hub, tokens["carol"], "/sessions", "user")


def test_hub_token_reaches_hub_endpoints(world):
    hub, *_ = world
    r = hub.api("GET", "/auth/users/alice", hub.service_token)
    assert r.status_code == 200
    assert "domain:acme" in r.json()["auth_model"]["groups"]
    r = hub.api(
        "POST", "/auth/password", hub.service_token, json={"username": "root", "password": "nope-nope"}
    )
    assert r.status_code == 403


def test_the_hubs_spawner_asking_again_with_its_id_gets_the_session_admitted_before(world):
    """The spawner names its session's id and asks again with it when no answer came (the service
    restarting, or dead right after its commit): the answer is that session, not a second one."""
    hub, tokens, *_ = world
    sid = str(uuid.uuid4())
    body = {
        "project": "acme/ml",
        "username": "alice",
        "name": "asked-again",
        "slots": {"cpu": 0.01},
        "id": sid,
    }
    first = hub.api("POST", "/sessions", hub.service_token, json=body)
    assert first.status_code == 201, first.text
    assert first.json()["id"] == sid
    again = hub.api("POST", "/sessions", hub.service_token, json=body)
    assert again.status_code == 200, again.text
    assert again.json()["id"] == sid and again.json()["status"] == first.json()["status"]
    named = [
        s
        for s in hub.api("GET", "/sessions?user=alice&limit=500", hub.service_token).json()
        if s["name"] == "asked-again"
    ]
    assert [s["id"] for s in named] == [sid]
    # The id is another server's: a conflict, and nothing admitted.
    other = hub.api("POST", "/sessions", hub.service_token, json={**body, "name": "another"})
    assert other.status_code == 409 and "taken" in other.json()["message"]
    for bad in ("../x", sid.upper(), 7, ""):
        r = hub.api("POST", "/sessions", hub.service_token, json={**body, "name": "bad-id", "id": bad})
        assert r.status_code == 400 and "UUID" in r.json()["message"], (bad, r.text)
    # A user does not name a session's id; only the Hub's spawner does.
    mine = hub.api(
        "POST",
        "/sessions",
        tokens["alice"],
        json={"project": "acme/ml", "name": "mine", "slots": {"cpu": 0.01}, "id": str(uuid.uuid4())},
    )
    assert mine.status_code == 400 and "only the Hub" in mine.json()["message"], mine.text
    listed = {s["name"] for s in hub.api("GET", "/sessions?user=alice&limit=500", hub.service_token).json()}
    assert not {"another", "bad-id", "mine"} & listed
