"""Admission: may this session be created?  Pure decisions over a snapshot.

No I/O, no database.  The service loads an :class:`AdmissionContext` inside the transaction that
will record the outcome, calls :func:`check_admission`, and, when it returns ``None``, goes on to
placement (:func:`labfleet.compute.scheduler.placement.place`).  A session that is admitted but does not fit
on any node now waits in its resource group's queue (:mod:`labfleet.compute.scheduler.queueing`); every other
failure is a :class:`Refusal`.

Checks, in this order; the first failure wins:

1. resource group: the group is public, or grants the session's domain, project or user (the union
   of the grants); and it allows the session type;
2. keypair session counts: max concurrent sessions and max pending sessions;
3. total slots of the keypair (its policy's LIMITED / UNLIMITED rule for slots the policy does not
   name), then of the user, the project and the domain (slots their caps do not name are unlimited);
4. the image: the request asks at least the image's minimum of each slot, and the image is
   available to the session's project.

What "used" means (the caller computes it): the slots of every admitted session of the scope that
has not ended yet, **PENDING sessions included**.  A queued session is placed later without being
admitted again, so its slots (and its concurrency seat, see :func:`check_session_counts`) must be
held from admission on; otherwise two sessions admitted one after the other could both start and
together exceed a quota.  :func:`check_quotas` and :func:`check_session_counts` are public so that
a caller who chooses otherwise can re-check a queued session before placing it.

Slot names: ``gpu`` (whole devices) and ``gpu.shares`` (fractions) are separate quota slots, as in
the caps admins write (``gpu=1,gpu.shares=2.5``).  A per-model slot (``gpu:A100``) counts towards
its base slot (``gpu``) when a cap names the base, and towards its own cap when a cap names it;
see :func:`quota_view`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal

from labfleet.core.slots import ResourceSlots, base_slot, format_amount, over_limit
from labfleet.core.vocab import SESSION_TYPES

# Refusal codes (stable: API clients and tests match on them; messages may change).
RESOURCE_GROUP_DENIED = "resource-group-denied"
SESSION_TYPE_NOT_ALLOWED = "session-type-not-allowed"
TOO_MANY_SESSIONS = "too-many-sessions"
TOO_MANY_PENDING = "too-many-pending-sessions"
QUEUE_FULL = "queue-full"
KEYPAIR_QUOTA = "keypair-quota-exceeded"
USER_QUOTA = "user-quota-exceeded"
PROJECT_QUOTA = "project-quota-exceeded"
DOMAIN_QUOTA = "domain-quota-exceeded"
IMAGE_NOT_FOUND = "image-not-found"
IMAGE_MIN_RESOURCES = "image-min-resources"
IMAGE_NOT_ALLOWED = "image-not-allowed"

REFUSAL_CODES: tuple[str, ...] = (
    RESOURCE_GROUP_DENIED,
    SESSION_TYPE_NOT_ALLOWED,
    TOO_MANY_SESSIONS,
    TOO_MANY_PENDING,
    QUEUE_FULL,
    KEYPAIR_QUOTA,
    USER_QUOTA,
    PROJECT_QUOTA,
    DOMAIN_QUOTA,
    IMAGE_NOT_FOUND,
    IMAGE_MIN_RESOURCES,
    IMAGE_NOT_ALLOWED,
)

_QUOTA_CODES = frozenset({KEYPAIR_QUOTA, USER_QUOTA, PROJECT_QUOTA, DOMAIN_QUOTA})

_ZERO = Decimal(0)
_GPU_SLOTS = ("gpu", "gpu.shares")


# --------------------------------------------------------------------------------------------
# Snapshot data
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """Why a session is not admitted.

    ``code`` is one of :data:`REFUSAL_CODES`; ``message`` is for people.  ``retryable`` is True when
    the same request may be admitted later without any admin change (sessions of the same scope end
    and free what they hold); False when it can never succeed as it stands (no access, session type,
    image, or a request bigger than a limit even with nothing in use).  From
    :func:`check_admission` it speaks for the whole request; from a single ``check_*`` function,
    for that check only.  Both kinds are refusals: only a session that is admitted but does not
    fit on a node now waits in the queue.
    """

    code: str
    message: str
    retryable: bool = False


@dataclass(frozen=True)
class SessionRequest:
    """The session a user asks for.

    ``project`` is the full name ``DOMAIN/PROJECT``; ``keypair`` the access key that is charged
    (the user's main keypair for browser sessions).  ``gpu_models``: accepted GPU models, empty for any.
    """

    session_id: str
    user: str
    keypair: str
    project: str
    domain: str
    resource_group: str
    session_type: str
    image: str | None
    slots: ResourceSlots
    gpu_models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.session_type not in SESSION_TYPES:
            raise ValueError(f"session type {self.session_type!r} is not one of {', '.join(SESSION_TYPES)}")
        if not self.project.startswith(self.domain + "/") or self.project == self.domain + "/":
            raise ValueError(f"project {self.project!r} is not a project of domain {self.domain!r}")
        object.__setattr__(self, "slots", ResourceSlots.parse(self.slots))
        object.__setattr__(self, "gpu_models", tuple(self.gpu_models))


@dataclass(frozen=True)
class KeypairPolicySnapshot:
    """The keypair's resource policy.

    ``unlimited_unspecified``: True for UNLIMITED (slots ``total_slots`` does not name are
    unlimited), False for LIMITED (they are zero).  Counts: 0 means unlimited.  ``name`` is only
    used in messages.
    """

    total_slots: ResourceSlots
    unlimited_unspecified: bool
    max_concurrent_sessions: int = 0
    max_pending_sessions: int = 0
    name: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "total_slots", ResourceSlots.parse(self.total_slots))
        if self.max_concurrent_sessions < 0 or self.max_pending_sessions < 0:
            raise ValueError("session count limits are >= 0 (0 means unlimited)")


@dataclass(frozen=True)
class GroupSnapshot:
    """A resource group: who may use it, and which session types it runs.

    Access is the union of the grants: a public group is open to everyone; otherwise the session's
    domain, project (full name ``DOMAIN/PROJECT``) or user must be granted.  An empty
    ``allowed_session_types`` allows no session type at all.
    """

    name: str
    allowed_session_types: tuple[str, ...] = SESSION_TYPES
    domains: frozenset[str] = frozenset()
    projects: frozenset[str] = frozenset()
    users: frozenset[str] = frozenset()
    is_public: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_session_types", tuple(self.allowed_session_types))
        object.__setattr__(self, "domains", frozenset(self.domains))
        object.__setattr__(self, "projects", frozenset(self.projects))
        object.__setattr__(self, "users", frozenset(self.users))

    def grants(self, user: str, project: str, domain: str) -> bool:
        """True when the group is open to this user working in this project and domain."""
        return self.is_public or domain in self.domains or project in self.projects or user in self.users


@dataclass(frozen=True)
class ImageSnapshot:
    """A registered image: its minimum resources and the projects that may use it (None: all)."""

    name: str
    min_slots: ResourceSlots = field(default_factory=ResourceSlots)
    allowed_projects: frozenset[str] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "min_slots", ResourceSlots.parse(self.min_slots))
        if self.allowed_projects is not None:
            object.__setattr__(self, "allowed_projects", frozenset(self.allowed_projects))


@dataclass(frozen=True)
class AdmissionContext:
    """Everything admission looks at, loaded in one transaction.

    ``*_used``: slots held by the scope's admitted sessions that have not ended, PENDING included
    (see the module docstring).  ``keypair_active_sessions``: the keypair's sessions that hold
    resources (SCHEDULED, PREPARING, RUNNING, TERMINATING); ``keypair_pending_sessions``: its PENDING
    ones; neither counts the session being admitted.

    ``user_limit`` None: the user has no cap.  Project and domain caps (and a user cap) limit only
    the slots they name.  ``image`` None with ``request.image`` set means the image is not registered.

    ``keypair_usage_of_user``: the keypair's counts and ``keypair_used`` are those of all the
    user's keypairs together (so a second keypair under the same policy gives no more); messages
    then speak of the user.
    """

    request: SessionRequest
    keypair_policy: KeypairPolicySnapshot
    keypair_used: ResourceSlots
    keypair_active_sessions: int
    keypair_pending_sessions: int
    user_limit: ResourceSlots | None
    user_used: ResourceSlots
    project_limit: ResourceSlots
    project_used: ResourceSlots
    domain_limit: ResourceSlots
    domain_used: ResourceSlots
    group: GroupSnapshot
    image: ImageSnapshot | None = None
    keypair_usage_of_user: bool = False

    def __post_init__(self) -> None:
        for name in (
            "keypair_used",
            "user_used",
            "project_used",
            "domain_limit",
            "domain_used",
            "project_limit",
        ):
            object.__setattr__(self, name, ResourceSlots.parse(getattr(self, name)))
        if self.user_limit is not None:
            object.__setattr__(self, "user_limit", ResourceSlots.parse(self.user_limit))
        if self.keypair_active_sessions < 0 or self.keypair_pending_sessions < 0:
            raise ValueError("session counts are >= 0")
        if self.group.name != self.request.resource_group:
            raise ValueError(
                f"the snapshot is of resource group {self.group.name!r}, "
                f"the request is for {self.request.resource_group!r}"
            )


# --------------------------------------------------------------------------------------------
# Slot views
# --------------------------------------------------------------------------------------------


def quota_view(slots: Mapping[str, Decimal], limit: Iterable[str]) -> ResourceSlots:
    """Amounts as a cap (whose slot names are ``limit``) sees them.

    A bare slot (``gpu``) is checked against its own cap.  A per-model slot (``gpu:A100``) counts
    towards its base slot's cap when the cap names the base (a ``gpu`` cap covers every model),
    and is checked against its own cap when the cap names it.  When the cap names neither, the
    per-model slot stands alone and the policy's rule for unnamed slots applies to it (LIMITED:
    zero; so a LIMITED policy naming only ``gpu:A100`` grants A100s, no other model, and no bare
    ``gpu`` that could land on any model).  Apply it to raw amounts only, never twice.
    """
    named = set(limit)
    out: dict[str, Decimal] = {}
    for name, amount in ResourceSlots.parse(slots).items():
        base = base_slot(name)
        if name == base or base in named:
            out[base] = out.get(base, _ZERO) + amount
        if name != base and (name in named or base not in named):
            out[name] = out.get(name, _ZERO) + amount
    return ResourceSlots(out)


def _join(parts: list[str]) -> str:
    if len(parts) <= 1:
        return "".join(parts)
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _quota_refusal(
    code: str,
    scope: str,
    request: ResourceSlots,
    used: ResourceSlots,
    limit: ResourceSlots,
    *,
    unlimited_unspecified: bool,
) -> Refusal | None:
    """One scope's total-slots check; None when the request fits."""
    req = quota_view(request, limit)
    use = quota_view(used, limit)
    bad = over_limit(req, use, limit, unlimited_unspecified=unlimited_unspecified)
    if not bad:
        return None
    # Retryable only if the request would fit with nothing else in use.
    never = bool(over_limit(req, {}, limit, unlimited_unspecified=unlimited_unspecified))
    parts = []
    for name, total, cap in bad:
        text = f"{format_amount(name, total)} of its {format_amount(name, cap)} {name}"
        in_use = use.get_amount(name)
        if in_use:
            text += f" ({format_amount(name, in_use)} already in use)"
        elif name not in limit:
            text += f" (its policy does not name {name}, and slots it does not name are LIMITED)"
        parts.append(text)
    return Refusal(code, f"{scope} would use {_join(parts)}", retryable=not never)


# --------------------------------------------------------------------------------------------
# The checks
# --------------------------------------------------------------------------------------------


def check_resource_group(ctx: AdmissionContext) -> Refusal | None:
    """Step 1: access to the resource group, then the session type."""
    req, group = ctx.request, ctx.group
    if not group.grants(req.user, req.project, req.domain):
        return Refusal(
            RESOURCE_GROUP_DENIED,
            f"resource group {group.name} is not open to user {req.user} in project {req.project}",
        )
    if req.session_type not in group.allowed_session_types:
        allowed = ", ".join(group.allowed_session_types) or "no session type"
        return Refusal(
            SESSION_TYPE_NOT_ALLOWED,
            f"resource group {group.name} does not run {req.session_type} sessions (it allows {allowed})",
        )
    return None


def _keypair_scope(ctx: AdmissionContext) -> str:
    name = ctx.keypair_policy.name
    if ctx.keypair_usage_of_user:
        policy = f"resource policy {name}" if name else "resource policy"
        return f"user {ctx.request.user}, under keypair {ctx.request.keypair}'s {policy},"
    return f"keypair {ctx.request.keypair}" + (f" (resource policy {name})" if name else "")


def check_session_counts(ctx: AdmissionContext) -> Refusal | None:
    """Step 2: the keypair's max concurrent and max pending sessions (0: unlimited).

    Concurrent: the new session needs a seat among the keypair's sessions that hold resources, and
    so does each of its PENDING sessions (they start later without a new admission), so it is
    refused when ``active + pending >= max_concurrent_sessions``.

    Pending: every new session may have to wait in the queue, so it is refused when the keypair
    already has ``max_pending_sessions`` PENDING sessions, even if it would fit on a node now.
    """
    pol = ctx.keypair_policy
    active, pending = ctx.keypair_active_sessions, ctx.keypair_pending_sessions
    if pol.max_concurrent_sessions and active + pending >= pol.max_concurrent_sessions:
        held = f"{active} session{'s' if active != 1 else ''}"
        waiting = f" and {pending} waiting" if pending else ""
        return Refusal(
            TOO_MANY_SESSIONS,
            f"{_keypair_scope(ctx)} already has {held}{waiting}, and may have at most "
            f"{pol.max_concurrent_sessions} at once; stop one first",
            retryable=True,
        )
    if pol.max_pending_sessions and pending >= pol.max_pending_sessions:
        return Refusal(
            TOO_MANY_PENDING,
            f"{_keypair_scope(ctx)} already has {pending} session{'s' if pending != 1 else ''} "
            f"waiting to start, and may have at most {pol.max_pending_sessions} waiting",
            retryable=True,
        )
    return None


@dataclass(frozen=True)
class QueueLimits:
    """How many sessions may wait (PENDING) at once: in the whole fleet, and of one user (0: no
    limit), whatever their policies say. A queued session is a spawn the Hub has pending, and the
    Hub refuses every spawn once too many are pending: a full queue must not lock out the sessions
    that would start at once (labfleet.core.hubmap)."""

    fleet: int = 0
    per_user: int = 0


def check_queue_room(
    limits: QueueLimits, fleet_pending: int, user_pending: int, username: str
) -> Refusal | None:
    """A session that would wait: refused when its user, or the fleet, has as many waiting as allowed.
    (One that starts at once is never asked.)"""
    if limits.per_user and user_pending >= limits.per_user:
        return Refusal(
            QUEUE_FULL,
            f"{username} already has {user_pending} session{'s' if user_pending != 1 else ''} waiting "
            f"for capacity, the most one user may have waiting ({limits.per_user}); stop one or wait",
            retryable=True,
        )
    if limits.fleet and fleet_pending >= limits.fleet:
        return Refusal(
            QUEUE_FULL,
            f"{fleet_pending} sessions are waiting for capacity already, the most the fleet queues "
            f"({limits.fleet}); try again later",
            retryable=True,
        )
    return None


def check_quotas(ctx: AdmissionContext) -> Refusal | None:
    """Step 3: total slots of the keypair, the user, the project and the domain, in that order."""
    req = ctx.request
    pol = ctx.keypair_policy
    refusal = _quota_refusal(
        KEYPAIR_QUOTA,
        _keypair_scope(ctx),
        req.slots,
        ctx.keypair_used,
        pol.total_slots,
        unlimited_unspecified=pol.unlimited_unspecified,
    )
    if refusal is None and ctx.user_limit is not None:
        refusal = _quota_refusal(
            USER_QUOTA,
            f"user {req.user}",
            req.slots,
            ctx.user_used,
            ctx.user_limit,
            unlimited_unspecified=True,
        )
    if refusal is None:
        refusal = _quota_refusal(
            PROJECT_QUOTA,
            f"project {req.project}",
            req.slots,
            ctx.project_used,
            ctx.project_limit,
            unlimited_unspecified=True,
        )
    if refusal is None:
        refusal = _quota_refusal(
            DOMAIN_QUOTA,
            f"domain {req.domain}",
            req.slots,
            ctx.domain_used,
            ctx.domain_limit,
            unlimited_unspecified=True,
        )
    return refusal


def _min_view(slots: ResourceSlots) -> dict[str, Decimal]:
    """Amounts compared with an image's minimum: models folded, and GPU as device equivalents.

    A whole device is at least any fraction of one, so for ``gpu`` and ``gpu.shares`` minimums the
    request's ``gpu + gpu.shares`` counts (``gpu=1`` meets ``gpu.shares=0.5``; ``gpu.shares=0.5`` does
    not meet ``gpu=1``).
    """
    out: dict[str, Decimal] = {}
    for name, amount in slots.items():
        base = base_slot(name)
        out[base] = out.get(base, _ZERO) + amount
    gpu_total = out.get("gpu", _ZERO) + out.get("gpu.shares", _ZERO)
    for name in _GPU_SLOTS:
        out[name] = gpu_total
    return out


def check_image(ctx: AdmissionContext) -> Refusal | None:
    """Step 4: the image's minimum resources, then whether the project may use the image.

    A request with no image skips this step (the backend's default image applies).
    """
    req = ctx.request
    if req.image is None:
        return None
    img = ctx.image
    if img is None:
        return Refusal(IMAGE_NOT_FOUND, f"image {req.image} is not registered")
    have = _min_view(req.slots)
    short = []
    for name in sorted(img.min_slots):
        need = img.min_slots.get_amount(name)
        # A per-model minimum is met only by that model's slot; a base minimum by any model.
        got = req.slots.get_amount(name) if name != base_slot(name) else have.get(name, _ZERO)
        if got < need:
            short.append(f"{format_amount(name, need)} {name} (asked {format_amount(name, got)})")
    if short:
        return Refusal(IMAGE_MIN_RESOURCES, f"image {img.name} needs at least {_join(short)}")
    if img.allowed_projects is not None and req.project not in img.allowed_projects:
        return Refusal(IMAGE_NOT_ALLOWED, f"image {img.name} is not available to project {req.project}")
    return None


def _with_nothing_in_use(ctx: AdmissionContext) -> AdmissionContext:
    return replace(
        ctx,
        keypair_used=ResourceSlots(),
        keypair_active_sessions=0,
        keypair_pending_sessions=0,
        user_used=ResourceSlots(),
        project_used=ResourceSlots(),
        domain_used=ResourceSlots(),
    )


def _first_refusal(ctx: AdmissionContext) -> Refusal | None:
    for check in (check_resource_group, check_session_counts, check_quotas, check_image):
        refusal = check(ctx)
        if refusal is not None:
            return refusal
    return None


def check_admission(ctx: AdmissionContext) -> Refusal | None:
    """All checks in order (group, session counts, quotas, image); the first refusal, or None.

    None means admitted: the caller then places the session (placement failure: it waits in the
    queue) and records its slots in every scope's ``used``.

    A refusal is ``retryable`` only if the whole request would be admitted were nothing else in
    use, so a request that some later check refuses for good is not sent off to wait in vain.
    """
    refusal = _first_refusal(ctx)
    if refusal is None or not refusal.retryable:
        return refusal
    if _first_refusal(_with_nothing_in_use(ctx)) is not None:
        return replace(refusal, retryable=False)
    if refusal.code in _QUOTA_CODES:
        return replace(refusal, message=refusal.message + "; wait for sessions to end, or ask for less")
    return refusal
