"""Keypair policies nobody walks around, against a real Hub and the service's REST API: a user's
own keypair starts nothing their main keypair may not (its policy is inherited, and a policy's
sessions and slots count all the user's keypairs together), a looser policy is refused, a user
holds a bounded number of keypairs, and a domain admin hands out only the policies a superadmin
allowed for the domain.  No notebook server is started: sessions are admitted as the Hub's
spawner asks for them (the service token), and what a keypair's signature may start is refused
before the Hub is asked."""

import json

import pytest
import requests

from labfleet.core import signing
from tests.hubfixture import start_hub

pytestmark = pytest.mark.hub

API = "/services/labfleet/api"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    hub = start_hub(tmp_path_factory.mktemp("hub"))
    root = hub.wait_token("root")

    def ok(method, path, body=None, token=root):
        r = hub.api(method, path, token, json=body)
        assert r.status_code in (200, 201), (path, r.status_code, r.text)
        return r.json()

    ok("POST", "/domains", {"name": "acme"})
    ok("POST", "/projects", {"domain": "acme", "name": "ml"})
    ok("POST", "/policies/user", {"name": "three", "max_keypairs": 3})
    for name in ("bob", "dan", "erin", "fay"):
        policy = "three" if name == "fay" else None
        ok(
            "POST",
            "/users",
            {"username": name, "domain": "acme", "projects": ["ml"], "resource_policy": policy},
        )
    ok("POST", "/users", {"username": "carol", "domain": "acme", "role": "admin"})
    # bob: one session at a time, one core in all (the "0.25 GPU and one session", in CPU).
    ok(
        "POST",
        "/policies/keypair",
        {"name": "small", "total_resource_slots": {"cpu": 1}, "max_concurrent_sessions": 1},
    )
    ok(
        "POST",
        "/policies/keypair",
        {"name": "tiny", "total_resource_slots": {"cpu": 0.5}, "max_concurrent_sessions": 1},
    )
    ok(
        "POST",
        "/policies/keypair",
        {"name": "big", "total_resource_slots": {"cpu": 8}, "max_concurrent_sessions": 4},
    )
    ok(
        "POST",
        "/policies/keypair",
        {"name": "pair", "total_resource_slots": {"cpu": 1}, "max_concurrent_sessions": 4},
    )
    ok("POST", "/policies/keypair", {"name": "spare"})
    main = {}
    for name, pol in (("bob", "small"), ("dan", "pair")):
        main[name] = next(k["access_key"] for k in ok("GET", f"/keypairs?username={name}") if k["is_main"])
        ok("PATCH", f"/keypairs/{main[name]}", {"resource_policy": pol})
    tokens = {"root": root, **{n: hub.wait_token(n) for n in ("bob", "carol", "dan", "erin", "fay")}}
    yield hub, ok, tokens, main
    hub.stop()


def admit_as_hub(hub, username, name, cpu):
    """A session admitted as the Hub's spawner asks for one (charged to the main keypair)."""
    body = {"project": "acme/ml", "username": username, "name": name, "slots": {"cpu": cpu}}
    r = hub.api("POST", "/sessions", hub.service_token, json=body)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def signed(hub, keypair, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else b""
    headers = signing.signed_headers(keypair["access_key"], keypair["secret_key"], method, API + path, data)
    headers["Content-Type"] = "application/json"
    return requests.request(method, hub.url + API + path, headers=headers, data=data, timeout=60)


def keypairs_of(hub, token, username):
    r = hub.api("GET", f"/keypairs?username={username}", token)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_users_own_keypair_takes_their_main_keypairs_policy_and_starts_nothing_more(world):
    hub, ok, tokens, main = world
    own = ok("POST", "/keypairs", {}, token=tokens["bob"])
    assert own["resource_policy"] == "small"  # not the UNLIMITED `default`
    admit_as_hub(hub, "bob", "held", 0.1)  # bob's one session, on his main keypair
    r = signed(hub, own, "POST", "/sessions", {"project": "acme/ml", "slots": {"cpu": 0.1}})
    assert r.status_code == 409, r.text
    message = r.json()["message"]
    assert "user bob" in message and "small" in message and "at most 1 at once" in message, message
    assert [s["name"] for s in ok("GET", "/sessions?user=bob")] == ["held"]


def test_two_keypairs_under_one_policy_share_its_slots(world):
    hub, ok, tokens, main = world
    # An admin gives dan a second keypair under the same policy as his main one (1 core in all).
    second = ok("POST", "/keypairs", {"username": "dan", "resource_policy": "pair"})
    admit_as_hub(hub, "dan", "big-one", 0.8)
    r = signed(hub, second, "POST", "/sessions", {"project": "acme/ml", "slots": {"cpu": 0.5}})
    assert r.status_code == 409, r.text
    message = r.json()["message"]
    assert "user dan" in message and "would use 1.3 of its 1 cpu (0.8 already in use)" in message, message
    # /me says the same: what the keypair policy has left counts all of dan's keypairs.
    me = ok("GET", "/me", token=tokens["dan"])
    assert me["quota"]["keypair"]["used"]["cpu"] == 0.8


def test_a_user_may_name_a_policy_no_looser_and_is_refused_a_looser_one(world):
    hub, ok, tokens, main = world
    before = keypairs_of(hub, tokens["root"], "bob")
    r = hub.api("POST", "/keypairs", tokens["bob"], json={"resource_policy": "big"})
    assert r.status_code == 403, r.text
    message = r.json()["message"]
    assert "looser than 'small'" in message and "max_concurrent_sessions: 4 (at most 1)" in message, message
    assert "cpu: 8 (at most 1)" in message
    r = hub.api("POST", "/keypairs", tokens["bob"], json={"resource_policy": "default"})
    assert r.status_code == 403 and "max_concurrent_sessions: no limit (at most 1)" in r.json()["message"]
    assert keypairs_of(hub, tokens["root"], "bob") == before  # nothing issued
    tighter = ok("POST", "/keypairs", {"resource_policy": "tiny"}, token=tokens["bob"])
    assert tighter["resource_policy"] == "tiny" and tighter["username"] == "bob"


def test_a_domain_admin_hands_out_only_what_a_superadmin_allowed_for_the_domain(world):
    hub, ok, tokens, main = world
    carol = tokens["carol"]
    assert ok("GET", "/domains/acme")["allowed_keypair_policies"] == []
    before = keypairs_of(hub, tokens["root"], "bob")
    r = hub.api("POST", "/keypairs", carol, json={"username": "bob", "resource_policy": "default"})
    assert r.status_code == 403, r.text
    assert "not one that domain acme's admins may hand out" in r.json()["message"]
    r = hub.api("PATCH", f"/keypairs/{main['bob']}", carol, json={"resource_policy": "default"})
    assert r.status_code == 403, r.text
    assert keypairs_of(hub, tokens["root"], "bob") == before
    # Only a superadmin sets the domain's list; unknown names are refused and change nothing.
    r = hub.api("PATCH", "/domains/acme", carol, json={"allowed_keypair_policies": ["default"]})
    assert r.status_code == 403, r.text
    r = hub.api("PATCH", "/domains/acme", tokens["root"], json={"allowed_keypair_policies": ["big", "nope"]})
    assert r.status_code == 409 and "no keypair policy named 'nope'" in r.json()["message"], r.text
    assert ok("GET", "/domains/acme")["allowed_keypair_policies"] == []
    allowed = {"allowed_keypair_policies": ["big", "spare"]}
    assert ok("PATCH", "/domains/acme", allowed)["allowed_keypair_policies"] == ["big", "spare"]
    # Now carol may give bob `big` (looser than his main keypair's), still not `default`.
    assert (
        ok("POST", "/keypairs", {"username": "bob", "resource_policy": "big"}, token=carol)["resource_policy"]
        == "big"
    )
    r = hub.api("POST", "/keypairs", carol, json={"username": "bob", "resource_policy": "default"})
    assert r.status_code == 403, r.text
    # A policy a domain allows cannot be deleted from under it (`spare` holds no keypair).
    r = hub.api("DELETE", "/policies/keypair/spare", tokens["root"])
    assert r.status_code == 409 and "allowed_keypair_policies" in r.json()["message"], r.text
    # A superadmin is unrestricted.
    assert (
        ok("POST", "/keypairs", {"username": "erin", "resource_policy": "default"})["resource_policy"]
        == "default"
    )


def test_a_user_holds_at_most_max_keypairs(world):
    hub, ok, tokens, main = world
    erin = tokens["erin"]
    held = len([k for k in keypairs_of(hub, erin, "erin") if k["is_active"]])
    assert ok("GET", "/users/erin")["resource_policy"] is None  # held to the default: 10
    assert ok("GET", "/policies/user/three")["max_keypairs"] == 3
    for _ in range(10 - held):
        ok("POST", "/keypairs", {}, token=erin)
    r = hub.api("POST", "/keypairs", erin, json={})
    assert r.status_code == 409, r.text
    assert r.json()["message"] == (
        "erin already has 10 active keypairs, the most allowed "
        "(the limit for users with no user policy: 10): revoke one first"
    )
    assert len(keypairs_of(hub, erin, "erin")) == 10  # nothing issued
    # Revoking one makes room.
    last = keypairs_of(hub, erin, "erin")[-1]["access_key"]
    ok("DELETE", f"/keypairs/{last}", token=erin)
    ok("POST", "/keypairs", {}, token=erin)
    assert hub.api("POST", "/keypairs", erin, json={}).status_code == 409
    # An admin of erin's domain may issue past it, on purpose.
    assert ok("POST", "/keypairs", {"username": "erin"}, token=tokens["carol"])["username"] == "erin"
    # A user policy says its users' limit: fay's says 3.
    fay = tokens["fay"]
    ok("POST", "/keypairs", {}, token=fay)
    ok("POST", "/keypairs", {}, token=fay)
    r = hub.api("POST", "/keypairs", fay, json={})
    assert r.status_code == 409 and "(the user policy's max_keypairs: 3)" in r.json()["message"], r.text


def main_policy(ok, username):
    return next(k["resource_policy"] for k in ok("GET", f"/keypairs?username={username}") if k["is_main"])


def test_tightening_a_main_keypair_takes_the_keypairs_that_inherited_its_policy_along(world):
    hub, ok, tokens, main = world
    ok("POST", "/users", {"username": "gus", "domain": "acme", "projects": ["ml"]})
    gus_main = next(k["access_key"] for k in ok("GET", "/keypairs?username=gus") if k["is_main"])
    own = ok("POST", "/keypairs", {"username": "gus"})  # inherits `default`, the main keypair's
    given = ok("POST", "/keypairs", {"username": "gus", "resource_policy": "big"})  # on purpose
    # carol, gus's domain admin, tightens his main keypair: his own keypair follows, `big` stays.
    ok("PATCH", f"/keypairs/{gus_main}", {"resource_policy": "tiny"}, token=tokens["carol"])
    assert ok("GET", f"/keypairs/{own['access_key']}")["resource_policy"] == "tiny"
    assert ok("GET", f"/keypairs/{given['access_key']}")["resource_policy"] == "big"
    r = signed(hub, own, "POST", "/sessions", {"project": "acme/ml", "slots": {"cpu": 1}})
    assert r.status_code == 409, r.text
    assert "user gus" in r.json()["message"] and "tiny" in r.json()["message"], r.text
    assert ok("GET", "/sessions?user=gus") == []
    (entry,) = [a for a in ok("GET", "/audit?action=keypair.update&limit=1000") if a["target"] == gus_main]
    assert entry["actor"] == "carol"
    assert entry["details"] == {"resource_policy": "tiny", "followed_by": [own["access_key"]]}


def test_a_domain_admins_new_users_get_a_keypair_policy_the_domain_allows(world):
    hub, ok, tokens, main = world
    carol = tokens["carol"]
    before = ok("GET", "/domains/acme")["allowed_keypair_policies"]
    ok("PATCH", "/domains/acme", {"allowed_keypair_policies": []})
    try:
        # A domain with no list is bounded by its caps only: new users get `default`, nothing else.
        ok("POST", "/users", {"username": "hal", "domain": "acme"}, token=carol)
        assert main_policy(ok, "hal") == "default"
        r = hub.api(
            "POST", "/users", carol, json={"username": "ivy", "domain": "acme", "keypair_policy": "big"}
        )
        assert r.status_code == 403, r.text
        assert r.json()["message"] == (
            "keypair_policy: 'big' is not one that domain acme's admins may give (a superadmin allows "
            "those in the domain's allowed_keypair_policies: none, so its new users get 'default')"
        )
        assert hub.api("GET", "/users/ivy", tokens["root"]).status_code == 404  # nothing created
        # With a list: its first unless one of it is named; anything else is refused.
        ok("PATCH", "/domains/acme", {"allowed_keypair_policies": ["tiny", "big"]})
        ok("POST", "/users", {"username": "ivy", "domain": "acme"}, token=carol)
        ok("POST", "/users", {"username": "jo", "domain": "acme", "keypair_policy": "big"}, token=carol)
        assert (main_policy(ok, "ivy"), main_policy(ok, "jo")) == ("tiny", "big")
        r = hub.api(
            "POST", "/users", carol, json={"username": "kim", "domain": "acme", "keypair_policy": "default"}
        )
        assert r.status_code == 403 and "allowed_keypair_policies: tiny, big" in r.json()["message"], r.text
        assert hub.api("GET", "/users/kim", tokens["root"]).status_code == 404
        # A superadmin names any (400 for none of that name); unnamed, `default` as before.
        ok("POST", "/users", {"username": "kim", "domain": "acme", "keypair_policy": "spare"})
        ok("POST", "/users", {"username": "lee", "domain": "acme"})
        assert (main_policy(ok, "kim"), main_policy(ok, "lee")) == ("spare", "default")
        r = hub.api(
            "POST",
            "/users",
            tokens["root"],
            json={"username": "max", "domain": "acme", "keypair_policy": "nope"},
        )
        assert r.status_code == 400 and "no keypair policy named 'nope'" in r.json()["message"], r.text
    finally:
        ok("PATCH", "/domains/acme", {"allowed_keypair_policies": before})
