"""Endpoints, their routes (replicas) and tokens in the DB: create, read, scale, destroy, tokens.

Who sees what, as everywhere: a user their own endpoints, a domain admin their domain's, a monitor
and a superadmin all; what an actor may not read is *not found*. Changing needs the owner, their
domain admin or a superadmin. The engine (:mod:`labfleet.serving.controller`) does what the rows ask.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from labfleet.compute import sessions
from labfleet.core import audit, passwords
from labfleet.core.authz import Actor
from labfleet.core.database import session_scope
from labfleet.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from labfleet.core.models import Domain, ServingEndpoint, ServingRoute, ServingToken, User, VFolder
from labfleet.core.validate import (
    check_bool,
    check_fields,
    check_int,
    check_name,
    check_text,
    parse_project_ref,
)
from labfleet.core.vocab import COMMAND_PORT_RANGE
from labfleet.serving import definition
from labfleet.storage import vfolders
from labfleet.tenancy.directory import get_project, get_user

LIVE = ("PENDING", "DEPLOYING", "READY", "DEGRADED", "DESTROYING")
ACTIVE_ROUTES = ("PROVISIONING", "RUNNING")
MAX_REPLICAS = 64
TOKEN_PREFIX = "lfsrv_"
MAX_TOKEN_LIFETIME = 10 * 365 * 86400
CREATE_FIELDS = (
    "name",
    "project",
    "model_folder",
    "replicas",
    "slots",
    "image",
    "resource_group",
    "open_to_public",
    "env",
)

# Reads a folder's model definition: (folder) -> the file's bytes; NotFound when it has none.
DefinitionReader = Callable[[VFolder], bytes]


def _now() -> datetime:
    return datetime.now(timezone.utc)


def read_definition(v: VFolder) -> bytes:
    """The folder's ``model-definition.yaml`` (or ``.yml``), at most 256 KiB."""
    store = vfolders.store_of(v)
    for name in definition.DEFINITION_FILES:
        try:
            f, st = store.open_read(name)
        except NotFound:
            continue
        with f:
            if st.st_size > definition.MAX_DEFINITION_BYTES:
                raise InvalidInput(
                    f"{name} in folder {v.name} is larger than {definition.MAX_DEFINITION_BYTES} bytes"
                )
            return f.read(definition.MAX_DEFINITION_BYTES + 1)
    raise InvalidInput(
        f"folder {v.name} has no model-definition.yaml: put one at its top (models[].service.start_command, port)"
    )


# ---------------------------------------------------------------- who may do what


def _visible(actor: Actor, e: ServingEndpoint) -> bool:
    return actor.reads_everything or actor.is_domain_admin_of(e.domain.name) or e.user_id == actor.user_id


def _may_manage(actor: Actor, e: ServingEndpoint) -> bool:
    if actor.role == "monitor":
        return False
    return actor.is_superadmin or actor.is_domain_admin_of(e.domain.name) or e.user_id == actor.user_id


def find(db: Session, name: str) -> ServingEndpoint | None:
    """The live endpoint named ``name``, else the newest destroyed one."""
    rows = db.scalars(
        select(ServingEndpoint)
        .where(ServingEndpoint.name == name)
        .order_by(ServingEndpoint.created_at.desc())
    ).all()
    live = [e for e in rows if e.status in LIVE]
    return live[0] if live else (rows[0] if rows else None)


def readable(db: Session, actor: Actor, name: str) -> ServingEndpoint:
    e = find(db, name) if isinstance(name, str) else None
    if e is None or not _visible(actor, e):
        raise NotFound(f"no endpoint {str(name)[:64]!r}")
    return e


def manageable(db: Session, actor: Actor, name: str) -> ServingEndpoint:
    e = readable(db, actor, name)
    if not _may_manage(actor, e):
        raise Forbidden(f"you may read endpoint {e.name} but not change it")
    return e


def list_endpoints(db: Session, actor: Actor, *, include_destroyed: bool = False) -> list[ServingEndpoint]:
    q = select(ServingEndpoint).order_by(ServingEndpoint.created_at, ServingEndpoint.id)
    if not include_destroyed:
        q = q.where(ServingEndpoint.status.in_(LIVE))
    if not actor.reads_everything:
        if actor.role == "admin" and actor.domain:
            q = q.join(Domain, ServingEndpoint.domain_id == Domain.id).where(Domain.name == actor.domain)
        else:
            q = q.where(ServingEndpoint.user_id == (actor.user_id if actor.user_id is not None else -1))
    return list(db.scalars(q))


# ---------------------------------------------------------------- create


def _owner(db: Session, actor: Actor) -> User:
    if actor.kind != "user" or actor.role == "monitor":
        raise Forbidden("an endpoint belongs to a user: create it as that user (monitors change nothing)")
    user = get_user(db, actor.name)
    if user is None:
        raise Forbidden(f"{actor.name} is not a labfleet user")
    return user


def _check_replicas(value: Any, user: User, *, minimum: int) -> int:
    n = check_int(value, "replicas", minimum=minimum, maximum=MAX_REPLICAS)
    policy = user.resource_policy
    cap = int(getattr(policy, "max_replicas_per_endpoint", 0) or 0) if policy is not None else 0
    if cap and n > cap:
        raise Conflict(f"your user policy allows at most {cap} replicas per endpoint (asked {n})")
    return n


def _folder(db: Session, user: User, ref: Any) -> VFolder:
    if not isinstance(ref, str) or not ref:
        raise InvalidInput("model_folder must be the name or id of a model folder")
    hits = [v for v, _ in vfolders.resolve_mounts(db, user, [ref]) if ref in (v.id, v.name)]
    if not hits:
        raise NotFound(f"no vfolder {ref!r} that you can mount")
    v = hits[0]
    if v.usage_mode != "model":
        raise InvalidInput(
            f"folder {v.name} is a {v.usage_mode} folder: an endpoint serves a model folder (usage_mode model)"
        )
    return v


def launch_body(e: ServingEndpoint, owner: str, server: str, command: str, port: int) -> dict[str, Any]:
    """The session request of one replica (what POST /api/sessions takes); ``port``: where its command
    listens, so the session's own inference page and the router look at the same port."""
    body: dict[str, Any] = {
        "project": e.project.full_name,
        "type": "inference",
        "command": command,
        "port": port,
        "slots": dict(e.slots or {}),
        "vfolders": [e.vfolder_id] if e.vfolder_id else [],
        "name": server,
        "username": owner,
    }
    if e.image:
        body["image"] = e.image
    if e.resource_group:
        body["resource_group"] = e.resource_group
    return body


def _dry_run(session_factory: sessionmaker[Session], body: dict[str, Any]) -> None:
    """Check one replica's session as admission would (quotas, access, image, group), holding nothing."""
    db = session_factory()
    try:
        sessions.prepare_launch(db, Actor.hub(), body)
    finally:
        db.rollback()
        db.close()


def create(
    session_factory: sessionmaker[Session],
    actor: Actor,
    body: Any,
    *,
    reader: DefinitionReader = read_definition,
) -> dict[str, Any]:
    """Check everything (the folder's model definition included, and one replica's session as
    admission would), then record the endpoint PENDING; the engine starts its replicas."""
    body = check_fields(body, required=["name", "project", "model_folder"], optional=CREATE_FIELDS)
    name = check_name(body["name"], "name")
    if len(name) > 40:
        raise InvalidInput("name must be at most 40 characters (replica server names add to it)")
    env = definition.check_env(body.get("env"))
    open_to_public = check_bool(body.get("open_to_public", False), "open_to_public")
    image = body.get("image")
    image = None if image is None else check_text(image, "image", 255)
    group = body.get("resource_group")
    group = None if group is None else check_name(group, "resource_group")
    slots = body.get("slots", {})
    if not isinstance(slots, dict):
        raise InvalidInput('slots must be an object like {"cpu": 1, "mem": "2g", "gpu.shares": 0.25}')
    db = session_factory()
    try:
        user = _owner(db, actor)
        replicas = _check_replicas(body.get("replicas", 1), user, minimum=1)
        domain, pname = parse_project_ref(body["project"], user.domain.name)
        project = get_project(db, domain, pname)
        if project is None or project.domain.name != user.domain.name:
            raise NotFound(f"no project {domain}/{pname} in your domain")
        folder = _folder(db, user, body["model_folder"])
        service = definition.parse_definition(reader(folder))
        probe = ServingEndpoint(
            name=name, project=project, vfolder_id=folder.id, slots=slots, image=image, resource_group=group
        )
        command = definition.replica_command(service, folder=folder.name, env=env)
        # Any valid port: the dry run checks the request and places nothing (each replica gets its own).
        check = launch_body(probe, user.username, f"{name}-r0", command, COMMAND_PORT_RANGE[0])
        project_ref = project.full_name
        folder_id, folder_name, project_id, user_id, domain_id = (
            folder.id,
            folder.name,
            project.id,
            user.id,
            user.domain_id,
        )
    finally:
        db.rollback()
        db.close()
    _dry_run(session_factory, check)
    with session_scope(session_factory) as db:
        owner = db.get(User, user_id)
        if owner is None:
            raise NotFound("the endpoint's owner is gone")
        if db.scalar(
            select(ServingEndpoint.id).where(ServingEndpoint.name == name, ServingEndpoint.status.in_(LIVE))
        ):
            raise Conflict(f"endpoint {name} exists: choose another name, or delete it first")
        policy = owner.resource_policy
        cap = int(getattr(policy, "max_endpoints", 0) or 0) if policy is not None else 0
        if cap:
            have = db.scalar(
                select(func.count())
                .select_from(ServingEndpoint)
                .where(ServingEndpoint.user_id == owner.id, ServingEndpoint.status.in_(LIVE))
            )
            if (have or 0) >= cap:
                raise Conflict(f"your user policy allows at most {cap} endpoints; delete one first")
        e = ServingEndpoint(
            id=str(uuid.uuid4()),
            name=name,
            user_id=user_id,
            project_id=project_id,
            domain_id=domain_id,
            vfolder_id=folder_id,
            folder_name=folder_name,
            image=image,
            resource_group=group,
            slots=slots,
            env=env,
            definition=service.to_json(),
            replicas=replicas,
            open_to_public=open_to_public,
            status="PENDING",
            status_reason=f"starting {replicas} replica(s)",
            failure_streak=0,
            requests=0,
            errors=0,
            latency_ms_total=0.0,
        )
        db.add(e)
        db.flush()
        audit.record(
            db,
            actor,
            "endpoint.create",
            e.name,
            target_domain=owner.domain.name,
            details={"project": project_ref, "replicas": replicas, "folder": folder_name},
        )
        return view(e, prefix="")


# ---------------------------------------------------------------- change


def update(db: Session, actor: Actor, name: str, body: Any) -> ServingEndpoint:
    body = check_fields(body, optional=["replicas", "open_to_public"])
    if not body:
        raise InvalidInput("nothing to change: give replicas or open_to_public")
    e = manageable(db, actor, name)
    if e.status not in LIVE or e.status == "DESTROYING":
        raise Conflict(f"endpoint {e.name} is {e.status}")
    changes: dict[str, Any] = {}
    if "replicas" in body:
        e.replicas = changes["replicas"] = _check_replicas(body["replicas"], e.user, minimum=0)
    if "open_to_public" in body:
        e.open_to_public = changes["open_to_public"] = check_bool(body["open_to_public"], "open_to_public")
    e.modified_at = _now()
    audit.record(db, actor, "endpoint.update", e.name, target_domain=e.domain.name, details=changes)
    return e


def destroy(db: Session, actor: Actor, name: str) -> ServingEndpoint:
    """Drain and remove: DESTROYING now; the engine stops the replicas, then DESTROYED."""
    e = manageable(db, actor, name)
    if e.status not in LIVE:
        raise NotFound(f"no endpoint {name!r}")
    if e.status != "DESTROYING":
        e.status, e.status_reason = "DESTROYING", "stopping its replicas"
        audit.record(db, actor, "endpoint.delete", e.name, target_domain=e.domain.name)
    return e


# ---------------------------------------------------------------- tokens


def create_token(db: Session, actor: Actor, name: str, body: Any) -> tuple[ServingToken, str]:
    body = check_fields(body if body is not None else {}, optional=["expires_in", "note", "rate_limit"])
    e = manageable(db, actor, name)
    if e.status not in LIVE or e.status == "DESTROYING":
        raise Conflict(f"endpoint {e.name} is {e.status}")
    expires_in = body.get("expires_in")
    expires = None
    if expires_in is not None:
        expires = _now() + timedelta(
            seconds=check_int(expires_in, "expires_in", minimum=1, maximum=MAX_TOKEN_LIFETIME)
        )
    t = ServingToken(
        endpoint_id=e.id,
        token_hash="",
        note=check_text(body.get("note", ""), "note", 255),
        rate_limit=check_int(body.get("rate_limit", 600), "rate_limit", minimum=0, maximum=1_000_000),
        created_by=actor.name,
        created_at=_now(),
        expires_at=expires,
        requests=0,
        latency_ms_total=0.0,
    )
    db.add(t)
    db.flush()
    secret = secrets.token_urlsafe(32)
    t.token_hash = passwords.hash_password(secret)
    audit.record(db, actor, "endpoint.token.create", f"{e.name}#{t.id}", target_domain=e.domain.name)
    return t, f"{TOKEN_PREFIX}{t.id}_{secret}"


def list_tokens(db: Session, actor: Actor, name: str) -> list[ServingToken]:
    e = manageable(db, actor, name) if actor.role != "monitor" else readable(db, actor, name)
    return list(e.tokens)


def revoke_token(db: Session, actor: Actor, name: str, token_id: Any) -> ServingToken:
    e = manageable(db, actor, name)
    if isinstance(token_id, str) and token_id.isdigit() and len(token_id) <= 10:
        token_id = int(token_id)
    if isinstance(token_id, str):
        raise InvalidInput("token id must be a whole number")
    token_id = check_int(token_id, "token id", minimum=1)
    t = db.get(ServingToken, token_id)
    if t is None or t.endpoint_id != e.id:
        raise NotFound(f"endpoint {e.name} has no token {token_id}")
    if t.revoked_at is None:
        t.revoked_at = _now()
        audit.record(db, actor, "endpoint.token.revoke", f"{e.name}#{t.id}", target_domain=e.domain.name)
    return t


def parse_token(plain: str) -> tuple[int, str] | None:
    """(token id, secret) of ``lfsrv_<id>_<secret>``; None for anything else."""
    if not plain.startswith(TOKEN_PREFIX) or len(plain) > 200:
        return None
    tid, sep, secret = plain[len(TOKEN_PREFIX) :].partition("_")
    if not sep or not tid.isdigit() or len(tid) > 10 or not secret:
        return None
    return int(tid), secret


def verify_token(db: Session, endpoint_id: str, plain: str) -> ServingToken | None:
    """The token ``plain`` names if it is valid for the endpoint now (slow: a password hash)."""
    parsed = parse_token(plain)
    if parsed is None:
        return None
    t = db.get(ServingToken, parsed[0])
    if t is None or t.endpoint_id != endpoint_id or t.revoked_at is not None:
        return None
    if t.expires_at is not None and t.expires_at <= _now():
        return None
    return t if passwords.verify_password(parsed[1], t.token_hash) else None


def replica_route(db: Session, actor: Actor, session_id: str) -> ServingRoute | None:
    """The replica (route) that session ``session_id`` is, for its owner and the Hub (None: the session
    is no endpoint's replica); NotFound for anyone else (who learns nothing, not even that the session
    exists).

    A replica is the inference session of the endpoint's owner with the route's server name, started
    after the route was made (a later route of that name is another replica)."""
    s = sessions.readable(db, actor, session_id) if isinstance(session_id, str) else None
    if s is None:
        raise NotFound(f"no session {session_id!r:.70}")
    if not (actor.kind == "hub" or (actor.kind == "user" and actor.name == s.user.username)):
        raise NotFound(f"no session {session_id!r:.70}")  # not even the owner's admin: it is the key
    if s.type != "inference" or not s.name:
        return None
    r = db.scalars(
        select(ServingRoute)
        .join(ServingEndpoint)
        .where(
            ServingEndpoint.user_id == s.user_id,
            ServingRoute.server == s.name,
            ServingRoute.created_at <= s.created_at,
        )
        .order_by(ServingRoute.id.desc())
        .limit(1)
    ).first()
    if r is None or (r.session_id is not None and r.session_id != s.id):
        return None
    return r


def annotate_replicas(db: Session, views: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add ``endpoint`` to each session view: the endpoint whose replica it is, by
    :func:`replica_route`'s rule (None: no replica), for a page of views in one statement. Every page
    that lists sessions shows a replica as its endpoint's, and offers no Stop for it (the controller
    would only start it again; the endpoint is scaled instead)."""
    for v in views:
        v["endpoint"] = None
    wanted = [v for v in views if v.get("type") == "inference" and v.get("name")]
    if not wanted:
        return views
    rows = db.execute(
        select(
            ServingRoute.server,
            ServingRoute.session_id,
            ServingRoute.created_at,
            ServingEndpoint.name,
            User.username,
        )
        .join(ServingEndpoint, ServingRoute.endpoint_id == ServingEndpoint.id)
        .join(User, ServingEndpoint.user_id == User.id)
        .where(ServingRoute.server.in_({str(v["name"]) for v in wanted}))
        .order_by(ServingRoute.id.desc())
    ).all()
    for v in wanted:
        created = datetime.fromisoformat(v["created_at"]) if v.get("created_at") else None
        for server, session_id, made, endpoint, owner in rows:
            if owner == v.get("user") and server == v["name"] and (created is None or made <= created):
                v["endpoint"] = endpoint if session_id in (None, v["id"]) else None
                break  # the latest route of that name made before the session decides
    return views


# ---------------------------------------------------------------- views


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


def route_view(r: ServingRoute) -> dict[str, Any]:
    return {
        "id": r.id,
        "server": r.server,
        "session_id": r.session_id,
        "address": f"{r.host}:{r.port}",
        "status": r.status,
        "health": r.health,
        "traffic": r.traffic,
        "failures": r.failures,
        "last_error": r.last_error,
        "created_at": _iso(r.created_at),
        "ready_at": _iso(r.ready_at),
        "checked_at": _iso(r.checked_at),
        "ended_at": _iso(r.ended_at),
    }


def token_view(t: ServingToken) -> dict[str, Any]:
    now = _now()
    return {
        "id": t.id,
        "note": t.note,
        "rate_limit": t.rate_limit,
        "created_by": t.created_by,
        "created_at": _iso(t.created_at),
        "expires_at": _iso(t.expires_at),
        "last_used": _iso(t.last_used),
        "revoked_at": _iso(t.revoked_at),
        "valid": t.revoked_at is None and (t.expires_at is None or t.expires_at > now),
        "requests": t.requests,
        "latency_ms_avg": round(t.latency_ms_total / t.requests, 3) if t.requests else None,
    }


def view(e: ServingEndpoint, *, prefix: str = "/services/labfleet/", routes: bool = True) -> dict[str, Any]:
    active = [r for r in e.routes if r.status in ACTIVE_ROUTES]
    healthy = [r for r in active if r.traffic == "ACTIVE"]
    failed = [r for r in e.routes if r.status == "FAILED"]
    out: dict[str, Any] = {
        "id": e.id,
        "name": e.name,
        "owner": e.user.username,
        "project": e.project.full_name,
        "domain": e.domain.name,
        "model_folder": {"id": e.vfolder_id, "name": e.folder_name},
        "image": e.image,
        "resource_group": e.resource_group,
        "slots": e.slots,
        "env": e.env,
        "replicas": e.replicas,
        "active_replicas": len(active),
        "healthy_replicas": len(healthy),
        "status": e.status,
        "status_reason": e.status_reason,
        "open_to_public": e.open_to_public,
        "url": f"{prefix}serve/{e.name}/" if prefix else f"/services/labfleet/serve/{e.name}/",
        "definition": e.definition,
        "requests": e.requests,
        "errors": e.errors,
        "latency_ms_avg": round(e.latency_ms_total / e.requests, 3) if e.requests else None,
        "last_error": failed[-1].last_error if failed else "",
        "created_at": _iso(e.created_at),
        "destroyed_at": _iso(e.destroyed_at),
    }
    if routes:
        # The routes that are (or are becoming) replicas, and the last few that ended, with their errors.
        ended = [r for r in e.routes if r.status not in ACTIVE_ROUTES][-5:]
        out["routes"] = [route_view(r) for r in active + ended]
    return out
