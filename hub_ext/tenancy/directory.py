"""Domains, projects, users and memberships: validation, authorization, changes, audit.

Every operation takes an untrusted body, checks all of it before it writes
anything, checks the actor's rights, changes the DB and records the change in the
audit log, all in the caller's transaction.  Used by the REST service and the CLI.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from labfleet.core import audit, authz, usage_ledger
from labfleet.core.authz import Actor
from labfleet.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from labfleet.core.models import (
    ComputeSession,
    Domain,
    KeypairResourcePolicy,
    Project,
    ProjectResourcePolicy,
    User,
    UserResourcePolicy,
)
from labfleet.core.passwords import check_password_strength, hash_password
from labfleet.core.rights import check_host_grants
from labfleet.core.validate import (
    check_bool,
    check_choice,
    check_fields,
    check_host_rules,
    check_name,
    check_slots,
    check_string_list,
    check_text,
    check_username,
    parse_project_ref,
)
from labfleet.core.vocab import LIVE_STATUSES
from labfleet.tenancy.keypairs import new_keypair, new_user_policy

# ---------------------------------------------------------------- lookups


def get_domain(db: Session, name: str) -> Domain | None:
    return db.scalar(select(Domain).where(Domain.name == name))


def get_project(db: Session, domain: str, name: str) -> Project | None:
    return db.scalar(select(Project).join(Domain).where(Domain.name == domain, Project.name == name))


def get_user(db: Session, username: str) -> User | None:
    return db.scalar(select(User).where(User.username == username))


def readable_domain(db: Session, actor: Actor, name: str) -> Domain:
    d = get_domain(db, name) if isinstance(name, str) else None
    if d is None or not authz.can_read_domain(actor, d.name):
        raise NotFound(f"no domain {name!r}")
    return d


def readable_project(db: Session, actor: Actor, domain: str, name: str) -> Project:
    p = get_project(db, domain, name)
    if p is None or not authz.can_read_project(actor, domain, {u.username for u in p.members}):
        raise NotFound(f"no project {domain}/{name}")
    return p


def readable_user(db: Session, actor: Actor, username: str) -> User:
    u = get_user(db, username)
    if u is None or not authz.can_read_user(actor, u.username, u.domain.name):
        raise NotFound(f"no user {username!r}")
    return u


def _policy_by_name(db: Session, model, name: Any, field: str):
    check_name(name, field)
    obj = db.scalar(select(model).where(model.name == name))
    if obj is None:
        raise InvalidInput(f"{field}: no policy named {name!r}")
    return obj


# ---------------------------------------------------------------- domains

DOMAIN_FIELDS = (
    "description",
    "is_active",
    "total_resource_slots",
    "allowed_vfolder_hosts",
    "allowed_keypair_policies",
    "import_hosts",
)


def _host_grants(value: Any) -> dict[str, list[str]]:
    if not isinstance(value, dict):
        raise InvalidInput("allowed_vfolder_hosts must be {storage host: [rights]}")
    return check_host_grants(value, "allowed_vfolder_hosts")  # type: ignore[return-value]


def _keypair_policy_names(db: Session, value: Any) -> list[str]:
    """The keypair policies a domain's admins may hand out: existing policy names, each once."""
    names = list(dict.fromkeys(check_string_list(value, "allowed_keypair_policies", check_name)))
    known = set(db.scalars(select(KeypairResourcePolicy.name).where(KeypairResourcePolicy.name.in_(names))))
    missing = [n for n in names if n not in known]
    if missing:
        raise Conflict(
            f"allowed_keypair_policies: no keypair policy named {', '.join(map(repr, missing))} "
            "(create it first)"
        )
    return names


def _apply_domain_fields(db: Session, d: Domain, body: dict[str, Any]) -> None:
    # Checked before anything is set (the one check that reads the DB).
    allowed = (
        _keypair_policy_names(db, body["allowed_keypair_policies"])
        if "allowed_keypair_policies" in body
        else None
    )
    if allowed is not None:
        d.allowed_keypair_policies = allowed
    if "description" in body:
        d.description = check_text(body["description"], "description")
    if "is_active" in body:
        d.is_active = check_bool(body["is_active"], "is_active")
    if "total_resource_slots" in body:
        d.total_resource_slots = check_slots(body["total_resource_slots"]).to_db()
    if "allowed_vfolder_hosts" in body:
        d.allowed_vfolder_hosts = _host_grants(body["allowed_vfolder_hosts"])
    if "import_hosts" in body:
        d.import_hosts = check_host_rules(body["import_hosts"])


def create_domain(db: Session, actor: Actor, body: Any) -> Domain:
    body = check_fields(body, required=["name"], optional=DOMAIN_FIELDS)
    name = check_name(body["name"], "domain name")
    if not authz.can_manage_domains(actor):
        raise Forbidden("only a superadmin can create domains")
    if get_domain(db, name):
        raise Conflict(f"domain {name!r} already exists")
    d = Domain(
        name=name,
        description="",
        is_active=True,
        total_resource_slots={},
        allowed_keypair_policies=[],
        import_hosts={},
    )
    _apply_domain_fields(db, d, body)
    db.add(d)
    db.flush()
    audit.record(db, actor, "domain.create", name, target_domain=name, details=body)
    return d


def update_domain(db: Session, actor: Actor, name: str, body: Any) -> Domain:
    d = readable_domain(db, actor, name)
    body = check_fields(body, optional=DOMAIN_FIELDS)
    if not authz.can_manage_domains(actor):
        raise Forbidden("only a superadmin can change domains")
    _apply_domain_fields(db, d, body)
    audit.record(db, actor, "domain.update", name, target_domain=name, details=body)
    return d


def delete_domain(db: Session, actor: Actor, name: str) -> None:
    d = readable_domain(db, actor, name)
    if not authz.can_manage_domains(actor):
        raise Forbidden("only a superadmin can delete domains")
    n_users = db.scalar(select(func.count()).select_from(User).where(User.domain_id == d.id))
    if n_users:
        raise Conflict(f"domain {name!r} still has {n_users} user(s): move or delete them first")
    db.delete(d)
    audit.record(db, actor, "domain.delete", name, target_domain=name)


def list_domains(db: Session, actor: Actor) -> list[Domain]:
    rows = db.scalars(select(Domain).order_by(Domain.name))
    return [d for d in rows if authz.can_read_domain(actor, d.name)]


# ---------------------------------------------------------------- projects

PROJECT_FIELDS = (
    "description",
    "is_active",
    "total_resource_slots",
    "resource_policy",
    "allowed_vfolder_hosts",
)


def _apply_project_fields(db: Session, p: Project, body: dict[str, Any]) -> None:
    if "description" in body:
        p.description = check_text(body["description"], "description")
    if "is_active" in body:
        p.is_active = check_bool(body["is_active"], "is_active")
    if "total_resource_slots" in body:
        p.total_resource_slots = check_slots(body["total_resource_slots"]).to_db()
    if "allowed_vfolder_hosts" in body:
        p.allowed_vfolder_hosts = _host_grants(body["allowed_vfolder_hosts"])
    if "resource_policy" in body:
        rp = body["resource_policy"]
        p.resource_policy = (
            None if rp is None else _policy_by_name(db, ProjectResourcePolicy, rp, "resource_policy")
        )


def create_project(db: Session, actor: Actor, body: Any) -> Project:
    body = check_fields(body, required=["domain", "name"], optional=PROJECT_FIELDS)
    dname = check_name(body["domain"], "domain")
    name = check_name(body["name"], "project name")
    d = readable_domain(db, actor, dname)
    if not authz.can_manage_in_domain(actor, dname):
        raise Forbidden(f"you cannot create projects in domain {dname!r}")
    if get_project(db, dname, name):
        raise Conflict(f"project {dname}/{name} already exists")
    p = Project(domain=d, name=name, description="", is_active=True, total_resource_slots={})
    _apply_project_fields(db, p, {k: v for k, v in body.items() if k not in ("domain", "name")})
    db.add(p)
    db.flush()
    audit.record(db, actor, "project.create", p.full_name, target_domain=dname, details=body)
    return p


def update_project(db: Session, actor: Actor, domain: str, name: str, body: Any) -> Project:
    p = readable_project(db, actor, domain, name)
    body = check_fields(body, optional=PROJECT_FIELDS)
    if not authz.can_manage_in_domain(actor, domain):
        raise Forbidden(f"you cannot change project {domain}/{name}")
    _apply_project_fields(db, p, body)
    audit.record(db, actor, "project.update", p.full_name, target_domain=domain, details=body)
    return p


def delete_project(db: Session, actor: Actor, domain: str, name: str) -> list[str]:
    """Delete a project; returns the user names that were its members (their Hub groups change)."""
    p = readable_project(db, actor, domain, name)
    if not authz.can_manage_in_domain(actor, domain):
        raise Forbidden(f"you cannot delete project {domain}/{name}")
    members = [u.username for u in p.members]
    db.delete(p)
    audit.record(db, actor, "project.delete", f"{domain}/{name}", target_domain=domain)
    return members


def list_projects(db: Session, actor: Actor, domain: str | None = None) -> list[Project]:
    q = select(Project).join(Domain).order_by(Domain.name, Project.name)
    if domain is not None:
        readable_domain(db, actor, domain)  # an unknown (or hidden) domain is 404, not an empty list
        q = q.where(Domain.name == domain)
    out = []
    for p in db.scalars(q):
        if authz.can_read_project(actor, p.domain.name, {u.username for u in p.members}):
            out.append(p)
    return out


def add_member(db: Session, actor: Actor, domain: str, project: str, body: Any) -> User:
    body = check_fields(body, required=["username"])
    p = readable_project(db, actor, domain, project)
    if not authz.can_manage_in_domain(actor, domain):
        raise Forbidden(f"you cannot change the members of {domain}/{project}")
    username = check_username(body["username"])
    u = get_user(db, username)
    if u is None or not authz.can_read_user(actor, u.username, u.domain.name):
        raise InvalidInput(f"no user {username!r}")
    if u.domain_id != p.domain_id:
        raise InvalidInput(f"user {username!r} is in domain {u.domain.name!r}, not {domain!r}")
    if u in p.members:
        raise Conflict(f"{username!r} is already a member of {domain}/{project}")
    p.members.append(u)
    audit.record(db, actor, "project.member.add", f"{domain}/{project}", target_domain=domain, details=body)
    return u


def remove_member(db: Session, actor: Actor, domain: str, project: str, username: str) -> User:
    p = readable_project(db, actor, domain, project)
    if not authz.can_manage_in_domain(actor, domain):
        raise Forbidden(f"you cannot change the members of {domain}/{project}")
    u = get_user(db, username)
    if u is None or u not in p.members:
        raise NotFound(f"{username!r} is not a member of {domain}/{project}")
    p.members.remove(u)
    audit.record(
        db,
        actor,
        "project.member.remove",
        f"{domain}/{project}",
        target_domain=domain,
        details={"username": username},
    )
    return u


# ---------------------------------------------------------------- users

USER_CREATE_FIELDS = (
    "role",
    "email",
    "full_name",
    "password",
    "projects",
    "status",
    "resource_policy",
    "keypair_policy",
)
USER_SELF_FIELDS = ("email", "full_name", "password")
USER_ADMIN_FIELDS = ("role", "status", "projects", "resource_policy", "domain")


def _check_role_change(
    db: Session, actor: Actor, u: User | None, role: str | None, status: str | None
) -> None:
    if role is not None and not authz.can_grant_role(actor, role):
        raise Forbidden(f"you cannot give the role {role!r}")
    if u is not None and u.role == "superadmin":
        if not actor.is_superadmin:
            raise Forbidden("only a superadmin can change a superadmin")
        demoted = (role is not None and role != "superadmin") or status == "inactive"
        if demoted and u.is_active:
            others = db.scalar(
                select(func.count())
                .select_from(User)
                .where(User.role == "superadmin", User.status == "active", User.id != u.id)
            )
            if not others:
                raise Conflict("this is the last active superadmin: make another one first")


def _resolve_projects(db: Session, domain: Domain, refs: Any) -> list[Project]:
    refs = check_string_list(refs, "projects")
    projects = []
    for ref in refs:
        dname, pname = parse_project_ref(ref, domain.name)
        if dname != domain.name:
            raise InvalidInput(f"project {dname}/{pname} is not in the user's domain {domain.name!r}")
        p = get_project(db, dname, pname)
        if p is None:
            raise InvalidInput(f"no project {dname}/{pname}")
        if p not in projects:
            projects.append(p)
    return projects


def create_user(db: Session, actor: Actor, body: Any, *, password_hash: str | None = None) -> User:
    """Create a user with their main keypair.  ``keypair_policy`` names the main keypair's policy:
    a superadmin may name any (``default`` unnamed); a domain admin one of the domain's
    ``allowed_keypair_policies`` (its first unnamed; a domain with no list is bounded by its caps
    only, and its admins' new users get ``default``): see
    :func:`labfleet.tenancy.keypairs.new_user_policy`."""
    body = check_fields(body, required=["username", "domain"], optional=USER_CREATE_FIELDS)
    username = check_username(body["username"])
    dname = check_name(body["domain"], "domain")
    d = readable_domain(db, actor, dname)
    if not authz.can_manage_in_domain(actor, dname):
        raise Forbidden(f"you cannot create users in domain {dname!r}")
    role = check_choice(body.get("role", "user"), "role", authz.ROLES)
    status = check_choice(body.get("status", "active"), "status", ("active", "inactive"))
    _check_role_change(db, actor, None, role, status)
    email = check_text(body.get("email", ""), "email", 255)
    full_name = check_text(body.get("full_name", ""), "full_name", 255)
    projects = _resolve_projects(db, d, body.get("projects", []))
    policy = None
    if body.get("resource_policy") is not None:
        policy = _policy_by_name(db, UserResourcePolicy, body["resource_policy"], "resource_policy")
    if "password" in body:
        problem = check_password_strength(body["password"])
        if problem:
            raise InvalidInput(problem)
    named = body.get("keypair_policy")
    kp_name = new_user_policy(
        None if named is None else check_name(named, "keypair_policy"),
        superadmin=actor.is_superadmin,
        domain=dname,
        allowed=list(d.allowed_keypair_policies or ()),
    )
    if get_user(db, username):
        raise Conflict(f"user {username!r} already exists")
    kp_policy = db.scalar(select(KeypairResourcePolicy).where(KeypairResourcePolicy.name == kp_name))
    if kp_policy is None and named is not None:
        raise InvalidInput(f"keypair_policy: no keypair policy named {kp_name!r}")
    if kp_policy is None:
        raise Conflict(f"the {kp_name!r} keypair resource policy is missing: run `labfleet init`")
    u = User(
        username=username,
        domain=d,
        role=role,
        status=status,
        email=email,
        full_name=full_name,
        resource_policy=policy,
        password_hash=hash_password(body["password"]) if "password" in body else password_hash,
    )
    u.projects = projects
    db.add(u)
    db.flush()
    # Every user gets a main keypair, used for browser and notebook sessions.
    new_keypair(db, u, kp_policy, is_main=True)
    audit.record(db, actor, "user.create", username, target_domain=dname, details=body)
    return u


def update_user(db: Session, actor: Actor, username: str, body: Any) -> User:
    u = readable_user(db, actor, username)
    domain = u.domain.name
    body = check_fields(body, optional=USER_SELF_FIELDS + USER_ADMIN_FIELDS)
    is_self = actor.name == u.username and actor.kind == "user"
    manager = authz.can_manage_in_domain(actor, domain)
    if not manager:
        if not is_self or actor.role == "monitor":
            raise Forbidden(f"you cannot change user {username!r}")
        forbidden = sorted(set(body) - set(USER_SELF_FIELDS))
        if forbidden:
            raise Forbidden(f"you cannot change your own {', '.join(forbidden)}")
    role = check_choice(body["role"], "role", authz.ROLES) if "role" in body else None
    status = check_choice(body["status"], "status", ("active", "inactive")) if "status" in body else None
    _check_role_change(db, actor, u, role, status)
    new_domain = u.domain
    if "domain" in body:
        if not actor.is_superadmin:
            raise Forbidden("only a superadmin can move a user to another domain")
        new_domain = get_domain(db, check_name(body["domain"], "domain")) or None
        if new_domain is None:
            raise InvalidInput(f"no domain {body['domain']!r}")
    if "projects" in body:
        projects = _resolve_projects(db, new_domain, body["projects"])
    elif new_domain is not u.domain:
        projects = []  # projects belong to the old domain
    else:
        projects = None
    email = check_text(body["email"], "email", 255) if "email" in body else None
    full_name = check_text(body["full_name"], "full_name", 255) if "full_name" in body else None
    if "password" in body:
        problem = check_password_strength(body["password"])
        if problem:
            raise InvalidInput(problem)
    policy_given = "resource_policy" in body
    policy = None
    if policy_given and body["resource_policy"] is not None:
        policy = _policy_by_name(db, UserResourcePolicy, body["resource_policy"], "resource_policy")
    # Everything checked: now write.
    if role is not None:
        u.role = role
    if status is not None:
        u.status = status
    u.domain = new_domain
    if projects is not None:
        u.projects = projects
    if email is not None:
        u.email = email
    if full_name is not None:
        u.full_name = full_name
    if "password" in body:
        u.password_hash = hash_password(body["password"])
    if policy_given:
        u.resource_policy = policy
    audit.record(db, actor, "user.update", username, target_domain=domain, details=body)
    return u


def delete_user(db: Session, actor: Actor, username: str) -> None:
    u = readable_user(db, actor, username)
    if not authz.can_manage_in_domain(actor, u.domain.name) or actor.name == username:
        raise Forbidden(f"you cannot delete user {username!r}")
    _check_role_change(db, actor, u, "user", "inactive")
    # Deleting the user would drop their sessions' rows and give their slots back while the servers
    # run on: stop them first (the Hub stops what it runs; labfleet's rows follow).
    live = db.execute(
        select(ComputeSession.name, ComputeSession.status)
        .where(ComputeSession.user_id == u.id, ComputeSession.status.in_(LIVE_STATUSES))
        .order_by(ComputeSession.created_at)
    ).all()
    if live:
        listed = ", ".join(f"{name or '(default)'} ({status})" for name, status in live[:10])
        more = f" and {len(live) - 10} more" if len(live) > 10 else ""
        raise Conflict(
            f"user {username!r} has {len(live)} session(s) that are not over: {listed}{more}; "
            "stop them first, then delete the user"
        )
    domain = u.domain.name
    db.delete(u)
    audit.record(db, actor, "user.delete", username, target_domain=domain)


def list_users(db: Session, actor: Actor, domain: str | None = None) -> list[User]:
    """Every user ``actor`` may read (of ``domain``), by name; the REST API answers pages of the
    same query (labfleet.tenancy.userlist.page_users)."""
    from labfleet.tenancy.userlist import all_users  # authz in SQL

    return all_users(db, actor, domain)


def why_inactive(user: User) -> str | None:
    """Why ``user`` may not log in or call the API now (authz.inactive_reason), None when they may."""
    return authz.inactive_reason(
        user.username, user.role, user.is_active, user.domain.name, user.domain.is_active
    )


def actor_for(user: User, remote_addr: str = "") -> Actor:
    return Actor(
        name=user.username, role=user.role, domain=user.domain.name, user_id=user.id, remote_addr=remote_addr
    )


# ---------------------------------------------------------------- views


def held_now(db: Session, kind: str, ids: Iterable[int]) -> dict[int, dict[str, Any]]:
    """What the live sessions of each domain or project (``kind``) hold now, by id: the usage
    ledger's rows, which are what admission counts against the caps, read in one statement."""
    wanted = list(dict.fromkeys(ids))
    rows = usage_ledger.read(db, [(kind, i) for i in wanted])
    return {i: usage_ledger.used(rows[(kind, i)]).to_json() for i in wanted}


def domain_views(db: Session, domains: Iterable[Domain], *, detail: bool = False) -> list[dict[str, Any]]:
    """:func:`domain_view` of each, with ``in_use`` beside its cap (the REST service's answers)."""
    domains = list(domains)
    used = held_now(db, "domain", (d.id for d in domains))
    return [domain_view(d, detail=detail, in_use=used[d.id]) for d in domains]


def project_views(db: Session, projects: Iterable[Project]) -> list[dict[str, Any]]:
    """:func:`project_view` of each, with ``in_use`` beside its cap (the REST service's answers)."""
    projects = list(projects)
    used = held_now(db, "project", (p.id for p in projects))
    return [project_view(p, in_use=used[p.id]) for p in projects]


def domain_view(
    d: Domain, *, detail: bool = False, in_use: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": d.name,
        "description": d.description,
        "is_active": d.is_active,
        "total_resource_slots": d.slots.to_json(),
        "allowed_vfolder_hosts": d.allowed_vfolder_hosts or {},
        "allowed_keypair_policies": list(d.allowed_keypair_policies or ()),
        "import_hosts": dict(d.import_hosts or {}),
        "created_at": d.created_at.isoformat() if d.created_at else None,
    }
    if in_use is not None:
        out["in_use"] = dict(in_use)
    if detail:
        out["projects"] = sorted(p.name for p in d.projects)
    return out


def project_view(p: Project, *, in_use: Mapping[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "domain": p.domain.name,
        "name": p.name,
        "full_name": p.full_name,
        "description": p.description,
        "is_active": p.is_active,
        "total_resource_slots": p.slots.to_json(),
        "resource_policy": p.resource_policy.name if p.resource_policy else None,
        "allowed_vfolder_hosts": p.allowed_vfolder_hosts or {},
        "members": [u.username for u in p.members],
        "created_at": p.created_at.isoformat() if p.created_at else None,
    }
    if in_use is not None:
        out["in_use"] = dict(in_use)
    return out


def user_view(u: User) -> dict[str, Any]:
    return {
        "username": u.username,
        "email": u.email,
        "full_name": u.full_name,
        "domain": u.domain.name,
        "role": u.role,
        "status": u.status,
        "projects": [p.full_name for p in u.projects],
        "resource_policy": u.resource_policy.name if u.resource_policy else None,
        "has_password": u.password_hash is not None,
        "created_at": u.created_at.isoformat() if u.created_at else None,
        "last_login": u.last_login.isoformat() if u.last_login else None,
    }
