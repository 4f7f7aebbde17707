"""The pure judgments behind keypair policies nobody walks around: one policy against another
(labfleet.tenancy.policies.looser_limits), who may hand out which (keypairs.assign_refusal), which
keypairs follow their main keypair to a new policy (keypairs.inheritors), a new user's main keypair's
policy (keypairs.new_user_policy), and admission's words when a keypair policy counts all of a
user's keypairs."""

import pytest

from labfleet.compute.scheduler import admission
from labfleet.core.errors import Forbidden
from labfleet.tenancy.keypairs import (
    DEFAULT_MAX_KEYPAIRS,
    assign_refusal,
    inheritors,
    keypair_limit,
    new_user_policy,
)
from labfleet.tenancy.policies import looser_limits, policy_no_looser


def policy(**kw):
    view = {
        "name": "p",
        "total_resource_slots": {},
        "default_for_unspecified": "UNLIMITED",
        "max_concurrent_sessions": 0,
        "max_pending_sessions": 0,
        "max_session_lifetime": 0,
        "idle_timeout": -1,
        "allowed_storage_hosts": [],
    }
    view.update(kw)
    return view


UNLIMITED = policy()
BOB = policy(
    total_resource_slots={"cpu": 2, "gpu.shares": 0.25},
    max_concurrent_sessions=1,
    max_pending_sessions=1,
    max_session_lifetime=3600,
    idle_timeout=600,
    allowed_storage_hosts={"local": ["mount-in-session"]},
)


def test_a_policy_is_no_looser_than_itself_and_any_limit_is_no_looser_than_none():
    assert policy_no_looser(BOB, BOB)
    assert policy_no_looser({**BOB, "allowed_storage_hosts": [], "idle_timeout": -1}, UNLIMITED)
    # The fleet's default idle timeout (-1) is not known here: only -1 is sure to be no looser.
    assert looser_limits({**BOB, "allowed_storage_hosts": []}, UNLIMITED) == [
        "idle_timeout: 600 s (at most the fleet's default)"
    ]
    # Storage hosts are grants, not limits: granting one the other does not is looser.
    assert looser_limits({**BOB, "idle_timeout": -1}, UNLIMITED) == [
        "allowed_storage_hosts: mount-in-session on local"
    ]
    assert looser_limits(UNLIMITED, UNLIMITED) == []


def test_the_unlimited_default_is_looser_than_a_restricted_policy_in_every_limit_it_lifts():
    got = looser_limits(UNLIMITED, BOB)
    assert not policy_no_looser(UNLIMITED, BOB)
    text = "\n".join(got)
    for limit in ("cpu: no limit (at most 2)", "gpu.shares: no limit (at most 0.25)"):
        assert limit in text
    for field in ("max_concurrent_sessions", "max_pending_sessions", "max_session_lifetime"):
        assert f"{field}: no limit (at most" in text
    assert "idle_timeout: the fleet's default (at most 600 s)" in text


@pytest.mark.parametrize(
    "change, word",
    [
        ({"total_resource_slots": {"cpu": 2, "gpu.shares": 0.5}}, "gpu.shares: 0.5 (at most 0.25)"),
        ({"max_concurrent_sessions": 2}, "max_concurrent_sessions: 2 (at most 1)"),
        ({"max_concurrent_sessions": 0}, "max_concurrent_sessions: no limit (at most 1)"),
        ({"max_session_lifetime": 7200}, "max_session_lifetime: 7200"),
        ({"idle_timeout": 0}, "idle_timeout: never (at most 600 s)"),
        ({"idle_timeout": 1200}, "idle_timeout: 1200 s (at most 600 s)"),
        ({"allowed_storage_hosts": ["local"]}, "on local"),
        ({"allowed_storage_hosts": {"other": ["mount-in-session"]}}, "mount-in-session on other"),
    ],
)
def test_one_limit_looser_is_looser(change, word):
    got = looser_limits({**BOB, **change}, BOB)
    assert len(got) == 1 and word in got[0], got


@pytest.mark.parametrize(
    "change",
    [
        {"total_resource_slots": {"cpu": 1, "gpu.shares": 0.25}},
        {"max_concurrent_sessions": 1, "max_pending_sessions": 1},
        {"max_session_lifetime": 60, "idle_timeout": 60},
        {"allowed_storage_hosts": []},
    ],
)
def test_tighter_limits_are_no_looser(change):
    assert policy_no_looser({**BOB, **change}, BOB)


def test_slots_follow_admissions_rules_for_unnamed_and_per_model_slots():
    limited = policy(total_resource_slots={"cpu": 4, "gpu": 1}, default_for_unspecified="LIMITED")
    # UNLIMITED for unnamed slots is looser than LIMITED, whatever it names.
    unlimited = policy(total_resource_slots={"cpu": 4, "gpu": 1}, default_for_unspecified="UNLIMITED")
    assert "UNLIMITED" in looser_limits(unlimited, limited)[0]
    # A per-model cap within the base slot's cap is no looser; a cap on a slot the base does not
    # name (LIMITED: zero) is.
    a100 = policy(total_resource_slots={"cpu": 4, "gpu:A100": 1}, default_for_unspecified="LIMITED")
    assert policy_no_looser(a100, limited)
    mem = policy(total_resource_slots={"cpu": 4, "gpu": 1, "mem": "1g"}, default_for_unspecified="LIMITED")
    assert looser_limits(mem, limited) == ["mem: 1g (at most 0)"]
    # Under an UNLIMITED base, naming a slot it does not name only tightens.
    assert policy_no_looser(policy(total_resource_slots={"mem": "1g"}), UNLIMITED)


def test_who_may_hand_out_which_policy():
    kw = {"domain": "acme", "allowed": ["batch"], "base": "students"}
    # Anyone may give a policy no looser than the main keypair's; a superadmin anything.
    assert assign_refusal("small", [], superadmin=False, domain_admin=False, **kw) is None
    assert assign_refusal("default", ["cpu"], superadmin=True, domain_admin=False, **kw) is None
    # A domain admin: also the domain's allowed ones, nothing else.
    assert assign_refusal("batch", ["cpu"], superadmin=False, domain_admin=True, **kw) is None
    refusal = assign_refusal(
        "default", ["cpu: no limit (at most 2)"], superadmin=False, domain_admin=True, **kw
    )
    assert "not one that domain acme's admins may hand out" in refusal
    assert "allowed_keypair_policies: batch" in refusal and "cpu: no limit (at most 2)" in refusal
    # A user: the allowed list is not theirs to use.
    refusal = assign_refusal("batch", ["cpu: 8 (at most 2)"], superadmin=False, domain_admin=False, **kw)
    assert "looser than 'students'" in refusal and "name one no looser, or none to inherit it" in refusal
    # No main keypair to compare with: only the allowed list (admins) or a superadmin.
    refusal = assign_refusal("small", None, superadmin=False, domain_admin=False, **kw)
    assert "no active main keypair" in refusal


def test_how_many_keypairs_a_user_may_hold():
    assert DEFAULT_MAX_KEYPAIRS == 10
    assert keypair_limit(None, 9) is None  # no user policy: ten, the main keypair included
    assert keypair_limit(None, 10) == (
        "already has 10 active keypairs, the most allowed "
        "(the limit for users with no user policy: 10): revoke one first"
    )
    assert keypair_limit(3, 2) is None
    assert "(the user policy's max_keypairs: 3)" in keypair_limit(3, 3)
    assert keypair_limit(0, 10_000) is None  # 0: no limit


def test_the_keypairs_that_inherited_the_main_keypairs_policy_follow_it():
    def kp(key, policy, *, main=False, active=True):
        return {"access_key": key, "resource_policy": policy, "is_main": main, "is_active": active}

    keypairs = [
        kp("MAIN", "small", main=True),
        kp("OWN", "small"),  # issued without a policy: inherited the main keypair's
        kp("GIVEN", "batch"),  # given another on purpose: keeps it
        kp("OLD", "small", active=False),  # revoked: stays as it is
        kp("TWO", "small"),
    ]
    assert inheritors("small", keypairs) == ["OWN", "TWO"]
    assert inheritors("batch", keypairs) == ["GIVEN"]
    assert inheritors("default", keypairs) == []


def test_a_new_users_main_keypair_policy():
    # A superadmin: any they name, `default` otherwise, whatever the domain's list.
    assert new_user_policy(None, superadmin=True, domain="acme", allowed=["batch"]) == "default"
    assert new_user_policy("gold", superadmin=True, domain="acme", allowed=["batch"]) == "gold"
    # A domain admin: the first of the domain's list when they name none, else one of the list.
    assert new_user_policy(None, superadmin=False, domain="acme", allowed=["batch", "tiny"]) == "batch"
    assert new_user_policy("tiny", superadmin=False, domain="acme", allowed=["batch", "tiny"]) == "tiny"
    with pytest.raises(Forbidden) as refused:
        new_user_policy("default", superadmin=False, domain="acme", allowed=["batch", "tiny"])
    assert str(refused.value) == (
        "keypair_policy: 'default' is not one that domain acme's admins may give "
        "(a superadmin allows those in the domain's allowed_keypair_policies: batch, tiny)"
    )
    # A domain with no list is bounded by its caps only: `default`, the one a domain admin may name.
    assert new_user_policy(None, superadmin=False, domain="acme", allowed=[]) == "default"
    assert new_user_policy("default", superadmin=False, domain="acme", allowed=[]) == "default"
    with pytest.raises(Forbidden, match="allowed_keypair_policies: none, so its new users get 'default'"):
        new_user_policy("gold", superadmin=False, domain="acme", allowed=[])


def _ctx(**kw):
    req = admission.SessionRequest(
        session_id="s",
        user="bob",
        keypair="AKOWN",
        project="acme/ml",
        domain="acme",
        resource_group="default",
        session_type="interactive",
        image=None,
        slots={"cpu": 1},
    )
    values = {"keypair_used": {}, "keypair_active_sessions": 0, "keypair_pending_sessions": 0, **kw}
    return admission.AdmissionContext(
        request=req,
        keypair_policy=admission.KeypairPolicySnapshot(
            total_slots={"cpu": 2}, unlimited_unspecified=True, max_concurrent_sessions=1, name="small"
        ),
        user_limit=None,
        user_used={},
        project_limit={},
        project_used={},
        domain_limit={},
        domain_used={},
        group=admission.GroupSnapshot(name="default", is_public=True),
        **values,
    )


def test_admission_speaks_of_the_user_when_a_policy_counts_all_their_keypairs():
    r = admission.check_admission(_ctx(keypair_usage_of_user=True, keypair_active_sessions=1))
    assert r.code == admission.TOO_MANY_SESSIONS
    assert r.message.startswith(
        "user bob, under keypair AKOWN's resource policy small, already has 1 session"
    )
    r = admission.check_admission(_ctx(keypair_usage_of_user=True, keypair_used={"cpu": "1.5"}))
    assert r.code == admission.KEYPAIR_QUOTA and r.message.startswith("user bob, under keypair AKOWN's")
    # Without the flag (a caller counting one keypair), the words are the keypair's, as before.
    r = admission.check_admission(_ctx(keypair_active_sessions=1))
    assert r.message.startswith("keypair AKOWN (resource policy small) already has 1 session")
