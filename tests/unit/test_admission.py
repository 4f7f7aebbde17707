"""Admission checks and queue ordering: pure functions, known answers, and properties."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labfleet.compute.scheduler.admission import (
    DOMAIN_QUOTA,
    IMAGE_MIN_RESOURCES,
    IMAGE_NOT_ALLOWED,
    IMAGE_NOT_FOUND,
    KEYPAIR_QUOTA,
    PROJECT_QUOTA,
    QUEUE_FULL,
    RESOURCE_GROUP_DENIED,
    SESSION_TYPE_NOT_ALLOWED,
    TOO_MANY_PENDING,
    TOO_MANY_SESSIONS,
    USER_QUOTA,
    AdmissionContext,
    GroupSnapshot,
    ImageSnapshot,
    KeypairPolicySnapshot,
    QueueLimits,
    Refusal,
    SessionRequest,
    check_admission,
    check_queue_room,
    quota_view,
)
from labfleet.compute.scheduler.queueing import (
    PendingItem,
    dominant_share,
    order_queue,
    queue_positions,
    schedule_pass,
)
from labfleet.core.slots import ResourceSlots

S = ResourceSlots
KEY = "AKTESTKEY00000000001"


def request(slots: Any = None, **kw: Any) -> SessionRequest:
    base: dict[str, Any] = {
        "session_id": "s1",
        "user": "alice",
        "keypair": KEY,
        "project": "acme/ml",
        "domain": "acme",
        "resource_group": "a100",
        "session_type": "interactive",
        "image": None,
        "slots": S(slots or {"cpu": 2, "mem": "8g", "gpu.shares": "0.5"}),
    }
    base.update(kw)
    return SessionRequest(**base)


def ctx(req: SessionRequest | None = None, **kw: Any) -> AdmissionContext:
    base: dict[str, Any] = {
        "request": req or request(),
        "keypair_policy": KeypairPolicySnapshot(S(), unlimited_unspecified=True),
        "keypair_used": S(),
        "keypair_active_sessions": 0,
        "keypair_pending_sessions": 0,
        "user_limit": None,
        "user_used": S(),
        "project_limit": S(),
        "project_used": S(),
        "domain_limit": S(),
        "domain_used": S(),
        "group": GroupSnapshot("a100", is_public=True),
        "image": None,
    }
    base.update(kw)
    return AdmissionContext(**base)


# --------------------------------------------------------------------------------------------
# Step 1: resource group access and session type
# --------------------------------------------------------------------------------------------


def test_everything_open_admits() -> None:
    assert check_admission(ctx()) is None


@pytest.mark.parametrize(
    "grant",
    [
        {"domains": frozenset({"acme"})},
        {"projects": frozenset({"acme/ml"})},
        {"users": frozenset({"alice"})},
        {"is_public": True},
    ],
)
def test_group_access_is_the_union_of_grants(grant: dict[str, Any]) -> None:
    group = GroupSnapshot("a100", **grant)
    assert check_admission(ctx(group=group)) is None


def test_group_access_denied() -> None:
    group = GroupSnapshot(
        "a100", domains=frozenset({"other"}), projects=frozenset({"acme/cv"}), users=frozenset({"bob"})
    )
    r = check_admission(ctx(group=group))
    assert r == Refusal(
        RESOURCE_GROUP_DENIED, "resource group a100 is not open to user alice in project acme/ml", False
    )


def test_session_type_not_allowed() -> None:
    group = GroupSnapshot("a100", allowed_session_types=("batch",), is_public=True)
    r = check_admission(ctx(group=group))
    assert r is not None and r.code == SESSION_TYPE_NOT_ALLOWED and not r.retryable
    assert r.message == "resource group a100 does not run interactive sessions (it allows batch)"
    assert check_admission(ctx(request(session_type="batch"), group=group)) is None


def test_empty_allowed_types_allow_nothing() -> None:
    group = GroupSnapshot("a100", allowed_session_types=(), is_public=True)
    r = check_admission(ctx(group=group))
    assert r is not None and r.message.endswith("(it allows no session type)")


def test_snapshot_must_match() -> None:
    with pytest.raises(ValueError, match="session type"):
        request(session_type="notebook")
    with pytest.raises(ValueError, match="not a project of domain"):
        request(project="other/ml")
    with pytest.raises(ValueError, match="resource group"):
        ctx(group=GroupSnapshot("cpu-only", is_public=True))


# --------------------------------------------------------------------------------------------
# Step 2: session counts
# --------------------------------------------------------------------------------------------


def test_max_concurrent_sessions() -> None:
    pol = KeypairPolicySnapshot(S(), True, max_concurrent_sessions=2)
    assert check_admission(ctx(keypair_policy=pol, keypair_active_sessions=1)) is None
    r = check_admission(ctx(keypair_policy=pol, keypair_active_sessions=2))
    assert r == Refusal(
        TOO_MANY_SESSIONS,
        f"keypair {KEY} already has 2 sessions, and may have at most 2 at once; stop one first",
        True,
    )
    # A PENDING session will take a seat when it starts: it counts.
    r = check_admission(ctx(keypair_policy=pol, keypair_active_sessions=1, keypair_pending_sessions=1))
    assert r is not None and r.code == TOO_MANY_SESSIONS
    assert r.message.startswith(f"keypair {KEY} already has 1 session and 1 waiting,")


def test_max_pending_sessions() -> None:
    pol = KeypairPolicySnapshot(S(), True, max_pending_sessions=1, name="students")
    assert check_admission(ctx(keypair_policy=pol, keypair_active_sessions=50)) is None
    r = check_admission(ctx(keypair_policy=pol, keypair_pending_sessions=1))
    assert r == Refusal(
        TOO_MANY_PENDING,
        f"keypair {KEY} (resource policy students) already has 1 session waiting to start, "
        "and may have at most 1 waiting",
        True,
    )


def test_zero_means_unlimited_counts() -> None:
    pol = KeypairPolicySnapshot(S(), True, 0, 0)
    assert (
        check_admission(
            ctx(keypair_policy=pol, keypair_active_sessions=10**6, keypair_pending_sessions=10**6)
        )
        is None
    )


# --------------------------------------------------------------------------------------------
# Step 3: quotas
# --------------------------------------------------------------------------------------------


def test_keypair_limited_vs_unlimited() -> None:
    req = request({"cpu": 2, "gpu": 1})
    limited = KeypairPolicySnapshot(S(cpu=4), unlimited_unspecified=False)
    unlimited = KeypairPolicySnapshot(S(cpu=4), unlimited_unspecified=True)
    assert check_admission(ctx(req, keypair_policy=unlimited)) is None
    r = check_admission(ctx(req, keypair_policy=limited))
    assert r == Refusal(
        KEYPAIR_QUOTA,
        f"keypair {KEY} would use 1 of its 0 gpu "
        "(its policy does not name gpu, and slots it does not name are LIMITED)",
        False,
    )


def test_keypair_quota_used_is_retryable_with_memory_formatting() -> None:
    pol = KeypairPolicySnapshot(S(cpu=8, mem="32g"), unlimited_unspecified=False)
    req = request({"cpu": 2, "mem": "16g"})
    r = check_admission(ctx(req, keypair_policy=pol, keypair_used=S(cpu=4, mem="24g")))
    assert r == Refusal(
        KEYPAIR_QUOTA,
        f"keypair {KEY} would use 40g of its 32g mem (24g already in use); "
        "wait for sessions to end, or ask for less",
        True,
    )
    # Several slots over: all named, in slot order.
    r = check_admission(
        ctx(request({"cpu": 6, "mem": "16g"}), keypair_policy=pol, keypair_used=S(cpu=4, mem="24g"))
    )
    assert r is not None
    assert r.message.startswith(
        f"keypair {KEY} would use 10 of its 8 cpu (4 already in use) and 40g of its 32g mem (24g already in use)"
    )


def test_user_quota() -> None:
    req = request({"gpu.shares": "1"})
    assert check_admission(ctx(req, user_limit=S({"gpu.shares": 2}), user_used=S({"gpu.shares": 1}))) is None
    r = check_admission(ctx(req, user_limit=S({"gpu.shares": "1.5"}), user_used=S({"gpu.shares": 1})))
    assert r is not None and r.code == USER_QUOTA and r.retryable
    assert r.message.startswith("user alice would use 2 of its 1.5 gpu.shares (1 already in use)")
    # None: no cap at all.
    assert check_admission(ctx(req, user_limit=None, user_used=S({"gpu.shares": 100}))) is None


def test_project_quota_message_and_unnamed_slots_unlimited() -> None:
    req = request({"cpu": 64, "gpu.shares": "2.5"})
    r = check_admission(ctx(req, project_limit=S({"gpu.shares": 2})))
    assert r == Refusal(PROJECT_QUOTA, "project acme/ml would use 2.5 of its 2 gpu.shares", False)
    # cpu is not named by the project cap: unlimited.
    assert (
        check_admission(ctx(request({"cpu": 64, "gpu.shares": 2}), project_limit=S({"gpu.shares": 2})))
        is None
    )


def test_domain_quota() -> None:
    req = request({"gpu": 2})
    r = check_admission(ctx(req, domain_limit=S(gpu=4), domain_used=S(gpu=3)))
    assert r is not None and r.code == DOMAIN_QUOTA and r.retryable
    assert r.message.startswith("domain acme would use 5 of its 4 gpu (3 already in use)")


def test_quota_scope_order() -> None:
    """Keypair, then user, then project, then domain."""
    req = request({"gpu": 2})
    tight = S(gpu=1)
    full = {
        "keypair_policy": KeypairPolicySnapshot(tight, True),
        "user_limit": tight,
        "project_limit": tight,
        "domain_limit": tight,
    }
    codes = []
    for drop in ("keypair_policy", "user_limit", "project_limit", "domain_limit"):
        r = check_admission(ctx(req, **full))
        assert r is not None
        codes.append(r.code)
        full[drop] = KeypairPolicySnapshot(S(), True) if drop == "keypair_policy" else S()
    assert codes == [KEYPAIR_QUOTA, USER_QUOTA, PROJECT_QUOTA, DOMAIN_QUOTA]
    assert check_admission(ctx(req, **full)) is None


def test_exact_decimals() -> None:
    """0.1 + 0.2 shares fits a 0.3 cap exactly, and 0.01 more does not."""
    lim = S({"gpu.shares": "0.3"})
    assert (
        check_admission(
            ctx(request({"gpu.shares": 0.2}), project_limit=lim, project_used=S({"gpu.shares": 0.1}))
        )
        is None
    )
    r = check_admission(
        ctx(request({"gpu.shares": 0.21}), project_limit=lim, project_used=S({"gpu.shares": 0.1}))
    )
    assert r is not None and r.message.startswith("project acme/ml would use 0.31 of its 0.3 gpu.shares")


def test_per_model_slots_count_towards_their_base() -> None:
    req = request({"gpu:A100": 2})
    # A cap on gpu covers every model.
    r = check_admission(ctx(req, project_limit=S(gpu=1)))
    assert r is not None and r.message == "project acme/ml would use 2 of its 1 gpu"
    # A per-model cap binds that model only.
    r = check_admission(ctx(req, project_limit=S({"gpu:A100": 1, "gpu": 8})))
    assert r is not None and r.message == "project acme/ml would use 2 of its 1 gpu:A100"
    assert check_admission(ctx(request({"gpu:V100": 2}), project_limit=S({"gpu:A100": 1}))) is None
    # LIMITED: naming a model grants that model (and the base up to the model caps).
    pol = KeypairPolicySnapshot(S({"cpu": 8, "mem": "64g", "gpu:A100": 2}), unlimited_unspecified=False)
    assert check_admission(ctx(request({"cpu": 1, "gpu:A100": 2}), keypair_policy=pol)) is None
    r = check_admission(ctx(request({"cpu": 1, "gpu:V100": 1}), keypair_policy=pol))
    assert r is not None and r.code == KEYPAIR_QUOTA
    assert r.message.startswith(
        f"keypair {KEY} would use 1 of its 0 gpu:V100 (its policy does not name gpu:V100"
    )
    # ... and no bare gpu, which could land on any model.
    r = check_admission(ctx(request({"cpu": 1, "gpu": 1}), keypair_policy=pol))
    assert r is not None and r.code == KEYPAIR_QUOTA
    assert quota_view(S({"gpu:A100": 1, "gpu": 1}), ["gpu", "gpu:A100"]) == S({"gpu": 2, "gpu:A100": 1})
    assert quota_view(S({"gpu:A100": 1, "gpu": 1}), ["gpu"]) == S({"gpu": 2})
    assert quota_view(S({"gpu:A100": 1, "gpu": 1}), []) == S({"gpu": 1, "gpu:A100": 1})


# --------------------------------------------------------------------------------------------
# Step 4: image
# --------------------------------------------------------------------------------------------


def test_image_minimum_resources() -> None:
    img = ImageSnapshot("cuda:12", min_slots=S({"mem": "16g", "gpu.shares": "0.5"}))
    r = check_admission(
        ctx(request({"cpu": 1, "mem": "8g", "gpu.shares": "0.25"}, image="cuda:12"), image=img)
    )
    assert r == Refusal(
        IMAGE_MIN_RESOURCES, "image cuda:12 needs at least 0.5 gpu.shares (asked 0.25) and 16g mem (asked 8g)"
    )
    # A whole device meets a fractional minimum.
    assert check_admission(ctx(request({"mem": "16g", "gpu": 1}, image="cuda:12"), image=img)) is None
    # A fraction does not meet a whole-device minimum.
    whole = ImageSnapshot("cuda:12", min_slots=S(gpu=1))
    r = check_admission(ctx(request({"gpu.shares": "0.5"}, image="cuda:12"), image=whole))
    assert r is not None and r.message == "image cuda:12 needs at least 1 gpu (asked 0.5)"


def test_image_allowed_projects() -> None:
    img = ImageSnapshot("cuda:12", allowed_projects=frozenset({"acme/cv"}))
    r = check_admission(ctx(request(image="cuda:12"), image=img))
    assert r == Refusal(IMAGE_NOT_ALLOWED, "image cuda:12 is not available to project acme/ml")
    assert (
        check_admission(ctx(request(image="cuda:12"), image=dataclasses.replace(img, allowed_projects=None)))
        is None
    )


def test_unregistered_image() -> None:
    r = check_admission(ctx(request(image="ghost:1"), image=None))
    assert r == Refusal(IMAGE_NOT_FOUND, "image ghost:1 is not registered")


# --------------------------------------------------------------------------------------------
# Order of the checks
# --------------------------------------------------------------------------------------------


def test_first_failure_wins() -> None:
    closed = GroupSnapshot("a100")
    wrong_type = GroupSnapshot("a100", allowed_session_types=("batch",), is_public=True)
    counts = {"keypair_policy": KeypairPolicySnapshot(S(gpu=0), False, 1), "keypair_active_sessions": 1}
    quota = {"project_limit": S(gpu=0)}
    img = {"image": ImageSnapshot("x", min_slots=S(gpu=8), allowed_projects=frozenset())}
    req = request({"gpu": 1}, image="x")

    def code(**kw: Any) -> str | None:
        r = check_admission(ctx(req, **kw))
        return r.code if r else None

    assert code(group=closed, **counts, **quota, **img) == RESOURCE_GROUP_DENIED
    assert code(group=wrong_type, **counts, **quota, **img) == SESSION_TYPE_NOT_ALLOWED
    assert code(**counts, **quota, **img) == TOO_MANY_SESSIONS
    assert code(keypair_policy=KeypairPolicySnapshot(S(gpu=0), False), **quota, **img) == KEYPAIR_QUOTA
    assert code(**quota, **img) == PROJECT_QUOTA
    assert code(**img) == IMAGE_MIN_RESOURCES
    assert code(image=ImageSnapshot("x", allowed_projects=frozenset())) == IMAGE_NOT_ALLOWED


def test_access_beats_quota() -> None:
    r = check_admission(ctx(request({"gpu": 100}), group=GroupSnapshot("a100"), project_limit=S(gpu=1)))
    assert r is not None and r.code == RESOURCE_GROUP_DENIED


# --------------------------------------------------------------------------------------------
# Queue ordering
# --------------------------------------------------------------------------------------------


def item(sid: str, user: str, t: float, slots: Any = None) -> PendingItem:
    return PendingItem(sid, user, t, S(slots or {"gpu": 1}))


QUEUE = [item("c", "u1", 3.0), item("a", "u2", 1.0), item("b", "u1", 2.0), item("d", "u3", 2.0)]


def ids(items: list[PendingItem]) -> list[str]:
    return [i.session_id for i in items]


def test_fifo_and_lifo() -> None:
    assert ids(order_queue(QUEUE, "fifo")) == ["a", "b", "d", "c"]
    # Equal times: session_id order, in both directions.
    assert ids(order_queue(QUEUE, "lifo")) == ["c", "b", "d", "a"]
    with pytest.raises(ValueError, match="unknown scheduler"):
        order_queue(QUEUE, "random")


def test_fifo_with_datetimes() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    q = [PendingItem(str(n), "u", t0 + timedelta(seconds=-n), S(cpu=1)) for n in range(3)]
    assert ids(order_queue(q, "fifo")) == ["2", "1", "0"]
    assert ids(order_queue(q, "lifo")) == ["0", "1", "2"]


def test_drf_smallest_dominant_share_first() -> None:
    """A uses 2 of 4 GPUs, B uses nothing: B goes first, though A asked earlier."""
    cap = S(cpu=64, mem="256g", gpu=4)
    q = [item("a1", "A", 1.0), item("b1", "B", 2.0)]
    usage = {"A": S(gpu=2)}
    assert ids(order_queue(q, "drf", usage, cap)) == ["b1", "a1"]
    assert ids(order_queue(q, "drf", {}, cap)) == ["a1", "b1"]  # tie: older first


def test_drf_takes_turns_and_uses_the_dominant_slot() -> None:
    cap = S(cpu=10, gpu=4)
    # A's dominant slot is cpu (5/10 = 0.5), B's is gpu (1/4 = 0.25): B first.
    usage = {"A": S(cpu=5), "B": S(gpu=1, cpu=0)}
    q = [
        item("a1", "A", 1.0),
        item("a2", "A", 2.0),
        item("a3", "A", 3.0),
        item("b1", "B", 4.0),
        item("b2", "B", 5.0),
    ]
    # b1 brings B to 2/4 = 0.5 = A's 0.5; tie -> A's older item; a1 brings A to max(0.5, 1/4)... stays 0.5
    # on cpu, but its gpu share is 1/4 so still 0.5; next tie between A(0.5, a2 at 2.0) and
    # B(0.5, b2 at 5.0) -> a2; A now 0.5 cpu vs 2/4 gpu = 0.5 ... -> a3 older than b2.
    assert ids(order_queue(q, "drf", usage, cap)) == ["b1", "a1", "a2", "a3", "b2"]
    # Two users with nothing running and many items alternate.
    q2 = [item(f"x{i}", "X", float(i)) for i in range(3)] + [item(f"y{i}", "Y", 10.0 + i) for i in range(3)]
    assert ids(order_queue(q2, "drf", {}, S(gpu=8))) == ["x0", "y0", "x1", "y1", "x2", "y2"]


def test_dominant_share() -> None:
    cap = S({"cpu": 8, "gpu": 4, "mem": 0})
    assert dominant_share(S(cpu=2, gpu=2, mem=100), cap) == Fraction(1, 2)  # mem: capacity 0, ignored
    assert dominant_share(S({"gpu.shares": "0.5", "gpu:A100": 1}), cap) == Fraction(3, 8)
    assert dominant_share(S(), cap) == 0
    # gpu and gpu.shares name the same devices: not added up.
    assert dominant_share(S(gpu=2), S({"gpu": 4, "gpu.shares": 4})) == Fraction(1, 2)


def test_queue_positions() -> None:
    assert queue_positions(order_queue(QUEUE, "fifo")) == {"a": 1, "b": 2, "d": 3, "c": 4}


def test_schedule_pass_backfills_or_blocks() -> None:
    ordered = order_queue(
        [
            item("big", "u", 1.0, {"gpu": 4}),
            item("s1", "u", 2.0, {"gpu": 1}),
            item("s2", "u", 3.0, {"gpu": 1}),
        ],
        "fifo",
    )
    free = {"gpu": 2}

    def try_place(it: PendingItem) -> bool:
        need = it.slots.get_amount("gpu")
        if need > free["gpu"]:
            return False
        free["gpu"] -= int(need)
        return True

    assert schedule_pass(ordered, try_place) == ["s1", "s2"]
    free["gpu"] = 2
    assert schedule_pass(ordered, try_place, strict_head=True) == []


# --------------------------------------------------------------------------------------------
# Property: admitted sessions never exceed any quota; release gives back exactly what admit took
# --------------------------------------------------------------------------------------------

SLOT_NAMES = ("cpu", "mem", "gpu", "gpu.shares", "gpu:A100")
USERS = (("alice", "acme", "acme/ml"), ("bob", "acme", "acme/cv"), ("carol", "beta", "beta/x"))

amounts = {
    "cpu": st.integers(0, 8).map(lambda n: Decimal(n) / 2),
    "mem": st.integers(0, 4).map(lambda n: Decimal(n * 2**30)),
    "gpu": st.integers(0, 2).map(Decimal),
    "gpu.shares": st.integers(0, 100).map(lambda n: Decimal(n) / 100),
    "gpu:A100": st.integers(0, 1).map(Decimal),
}


@st.composite
def slot_maps(draw: st.DrawFn, max_size: int = 3) -> ResourceSlots:
    names = draw(st.lists(st.sampled_from(SLOT_NAMES), unique=True, max_size=max_size))
    return S({n: draw(amounts[n]) for n in names})


cap_amounts = {
    "cpu": st.integers(2, 16).map(Decimal),
    "mem": st.integers(2, 16).map(lambda n: Decimal(n * 2**30)),
    "gpu": st.integers(1, 4).map(Decimal),
    "gpu.shares": st.integers(50, 300).map(lambda n: Decimal(n) / 100),
    "gpu:A100": st.integers(1, 2).map(Decimal),
}


@st.composite
def caps(draw: st.DrawFn, min_size: int = 2) -> ResourceSlots:
    """Caps with room for a few requests (rarely none), so that quotas fill up and empty again."""
    names = draw(
        st.lists(st.sampled_from(SLOT_NAMES), unique=True, min_size=min_size, max_size=len(SLOT_NAMES))
    )
    return S({n: draw(cap_amounts[n]) if draw(st.integers(0, 9)) else Decimal(0) for n in names})


def fits(used: ResourceSlots, limit: ResourceSlots, unlimited_unspecified: bool) -> bool:
    """The rule stated slot by slot: each bare slot, each model, and each named base within its cap."""

    def cap(name: str) -> Decimal | None:
        if name in limit:
            return limit[name]
        return None if unlimited_unspecified else Decimal(0)

    for name, v in used.items():
        base = name.split(":")[0]
        if name == base or name in limit or base not in limit:
            c = cap(name)
            if name == base and name in limit:
                # the base cap covers every model of it
                v = sum((a for n, a in used.items() if n.split(":")[0] == base), Decimal(0))
            if c is not None and v > c:
                return False
        if name != base and base in limit:
            total = sum((a for n, a in used.items() if n.split(":")[0] == base), Decimal(0))
            if total > limit[base]:
                return False
    return True


@settings(max_examples=150, deadline=None)
@given(
    kp_limits=st.lists(st.tuples(caps(min_size=4), st.booleans(), st.integers(0, 4)), min_size=3, max_size=3),
    user_limits=st.lists(st.one_of(st.none(), caps()), min_size=3, max_size=3),
    project_limits=st.dictionaries(st.sampled_from(["acme/ml", "acme/cv", "beta/x"]), caps()),
    domain_limits=st.dictionaries(st.sampled_from(["acme", "beta"]), caps()),
    ops=st.lists(
        st.one_of(
            # admits twice as often as releases, so quotas fill up
            st.tuples(st.just("admit"), st.integers(0, 2), slot_maps()),
            st.tuples(st.just("admit"), st.integers(0, 2), slot_maps()),
            st.tuples(st.just("release"), st.integers(0, 1000), st.none()),
        ),
        max_size=40,
    ),
)
def test_admit_release_never_exceeds_quotas(
    kp_limits: list[tuple[ResourceSlots, bool, int]],
    user_limits: list[ResourceSlots | None],
    project_limits: dict[str, ResourceSlots],
    domain_limits: dict[str, ResourceSlots],
    ops: list[tuple[str, int, ResourceSlots | None]],
) -> None:
    used: dict[tuple[str, str], ResourceSlots] = {}
    active: dict[str, int] = {u: 0 for u, _, _ in USERS}
    live: list[tuple[int, ResourceSlots]] = []
    group = GroupSnapshot("g", is_public=True)

    def get(scope: str, name: str) -> ResourceSlots:
        return used.get((scope, name), S())

    for n, (op, who, slots) in enumerate(ops):
        if op == "admit":
            assert slots is not None
            user, domain, project = USERS[who]
            kp_slots, unl, max_conc = kp_limits[who]
            policy = KeypairPolicySnapshot(kp_slots, unl, max_concurrent_sessions=max_conc)
            req = SessionRequest(f"s{n}", user, f"kp-{user}", project, domain, "g", "batch", None, slots)
            c = AdmissionContext(
                request=req,
                keypair_policy=policy,
                keypair_used=get("kp", user),
                keypair_active_sessions=active[user],
                keypair_pending_sessions=0,
                user_limit=user_limits[who],
                user_used=get("user", user),
                project_limit=project_limits.get(project, S()),
                project_used=get("project", project),
                domain_limit=domain_limits.get(domain, S()),
                domain_used=get("domain", domain),
                group=group,
            )
            refusal = check_admission(c)
            if refusal is None:
                for key in (("kp", user), ("user", user), ("project", project), ("domain", domain)):
                    used[key] = get(*key) + slots
                active[user] += 1
                live.append((who, slots))
            else:
                # A refusal that can never succeed must fail even with nothing in use.
                empty = dataclasses.replace(
                    c,
                    keypair_used=S(),
                    user_used=S(),
                    project_used=S(),
                    domain_used=S(),
                    keypair_active_sessions=0,
                )
                assert (check_admission(empty) is None) == refusal.retryable
        elif live:
            who, slots = live.pop(who % len(live))
            user, domain, project = USERS[who]
            for key in (("kp", user), ("user", user), ("project", project), ("domain", domain)):
                used[key] = get(*key) - slots
            active[user] -= 1
        # Invariant: every scope within its caps, and the session counts within theirs.
        for i, (user, _, _) in enumerate(USERS):
            kp_slots, unl, max_conc = kp_limits[i]
            assert fits(get("kp", user), kp_slots, unl)
            ul = user_limits[i]
            assert ul is None or fits(get("user", user), ul, True)
            assert not max_conc or active[user] <= max_conc
        for project, lim in project_limits.items():
            assert fits(get("project", project), lim, True)
        for domain, lim in domain_limits.items():
            assert fits(get("domain", domain), lim, True)

    # Release everything: each counter is back to exactly zero.
    for who, slots in live:
        user, domain, project = USERS[who]
        for key in (("kp", user), ("user", user), ("project", project), ("domain", domain)):
            used[key] = get(*key) - slots
    assert all(v.is_zero() for v in used.values())


def test_admission_is_fast() -> None:
    import time

    pol = KeypairPolicySnapshot(S({"cpu": 64, "mem": "512g", "gpu": 8, "gpu.shares": 8}), False, 10, 10)
    c = ctx(
        keypair_policy=pol,
        keypair_used=S(cpu=10),
        user_limit=S(gpu=4),
        project_limit=S({"gpu.shares": 4}),
        domain_limit=S(cpu=256),
        group=GroupSnapshot("a100", domains=frozenset({"acme"})),
    )
    start = time.perf_counter()
    for _ in range(1000):
        assert check_admission(c) is None
    assert time.perf_counter() - start < 2.0  # well under 2 ms a decision


def test_drf_order_is_fast() -> None:
    import time

    q = [item(f"s{i:05d}", f"u{i % 50}", float(i), {"gpu.shares": "0.5", "cpu": 2}) for i in range(5000)]
    usage = {f"u{i}": S(gpu=i % 4) for i in range(50)}
    start = time.perf_counter()
    out = order_queue(q, "drf", usage, S(cpu=512, gpu=64))
    assert time.perf_counter() - start < 2.0
    assert sorted(ids(out)) == sorted(ids(q))


# ---------------------------------------------------------------- the queue's room


@pytest.mark.parametrize(
    ("limits", "fleet", "mine", "says"),
    [
        (QueueLimits(), 10_000, 10_000, None),  # no limits
        (QueueLimits(fleet=4, per_user=2), 3, 1, None),
        (QueueLimits(fleet=4, per_user=2), 3, 2, "ann already has 2 sessions waiting for capacity"),
        (QueueLimits(fleet=4, per_user=2), 4, 0, "4 sessions are waiting for capacity already"),
        (QueueLimits(fleet=4, per_user=2), 4, 2, "ann already has 2"),  # the user's own limit first
        (QueueLimits(fleet=0, per_user=1), 500, 0, None),
        (QueueLimits(fleet=1, per_user=0), 0, 0, None),
    ],
)
def test_a_session_that_would_wait_needs_room_in_the_queue(limits, fleet, mine, says) -> None:
    refusal = check_queue_room(limits, fleet, mine, "ann")
    if says is None:
        assert refusal is None
    else:
        assert refusal is not None and refusal.code == QUEUE_FULL and refusal.retryable
        assert refusal.message.startswith(says), refusal.message
