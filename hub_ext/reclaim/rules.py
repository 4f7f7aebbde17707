"""Idle checker definitions and their bindings: ``/api/idle-checkers``.

A checker (``activity`` or ``utilization``, options checked by
:func:`labfleet.reclaim.checkers.parse_options`) applies to the sessions of the domains, projects
and resource groups it is bound to; with the keypair policy's ``idle_timeout`` they make a
session's rules, and every rule that applies is judged (the strictest wins).

Who may: superadmins everything; a domain admin checkers bound only to their domain and its
projects (they own them: ``owner_domain``), not resource groups, which the whole fleet shares;
monitors and domain admins read every definition; users none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from labfleet.core import audit
from labfleet.core.authz import Actor
from labfleet.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from labfleet.core.models import (
    IDLE_BINDING_SCOPES,
    Domain,
    IdleChecker,
    IdleCheckerBinding,
    Project,
    ResourceGroup,
)
from labfleet.core.validate import check_fields, check_name, check_text, parse_project_ref
from labfleet.reclaim.checkers import parse_options

MAX_BINDINGS = 100


@dataclass(frozen=True)
class Rule:
    """A checker as the engine uses it."""

    name: str
    kind: str
    options: Mapping[str, Any]
    scopes: frozenset[tuple[str, str]]  # (scope kind, name)

    def applies(self, domain: str, project: str, group: str) -> bool:
        return bool(self.scopes & {("domain", domain), ("project", project), ("resource_group", group)})


def can_read(actor: Actor) -> bool:
    return actor.reads_everything or actor.role == "admin" or actor.kind in ("hub", "cli")


def _can_manage(actor: Actor, checker: IdleChecker | None) -> bool:
    if actor.is_superadmin or actor.kind == "cli":
        return True
    if actor.role != "admin" or actor.domain is None:
        return False
    return checker is None or checker.owner_domain == actor.domain


def _bindings(db: Session, actor: Actor, value: Any) -> list[tuple[str, str]]:
    if not isinstance(value, list):
        raise InvalidInput('bindings must be a list like [{"scope": "resource_group", "name": "a100"}]')
    if len(value) > MAX_BINDINGS:
        raise InvalidInput(f"at most {MAX_BINDINGS} bindings")
    out: list[tuple[str, str]] = []
    for i, item in enumerate(value):
        domain: str | None
        b = check_fields(item, required=["scope", "name"])
        scope = b["scope"]
        if scope not in IDLE_BINDING_SCOPES:
            raise InvalidInput(f"bindings[{i}].scope must be one of {', '.join(IDLE_BINDING_SCOPES)}")
        if scope == "project":
            dom, proj = parse_project_ref(b["name"])
            found = db.scalar(
                select(Project.id)
                .join(Domain, Domain.id == Project.domain_id)
                .where(Domain.name == dom, Project.name == proj)
            )
            name, domain = f"{dom}/{proj}", dom
        else:
            name = check_name(b["name"], f"bindings[{i}].name")
            model: Any = Domain if scope == "domain" else ResourceGroup
            found = db.scalar(select(model.id).where(model.name == name))
            domain = name if scope == "domain" else None
        if found is None:
            raise InvalidInput(f"bindings[{i}]: no {scope.replace('_', ' ')} {name!r}")
        if not (actor.is_superadmin or actor.kind == "cli") and domain != actor.domain:
            raise Forbidden(
                f"bindings[{i}]: a domain admin binds checkers to their domain and its projects only"
            )
        if (scope, name) not in out:
            out.append((scope, name))
    return out


def _get(db: Session, name: Any) -> IdleChecker:
    checker = (
        db.scalar(
            select(IdleChecker).where(IdleChecker.name == name).options(selectinload(IdleChecker.bindings))
        )
        if isinstance(name, str) and len(name) <= 64
        else None
    )
    if checker is None:
        raise NotFound(f"no idle checker {name!r:.70}")
    return checker


def view(c: IdleChecker) -> dict[str, Any]:
    return {
        "name": c.name,
        "kind": c.kind,
        "options": dict(c.options or {}),
        "description": c.description,
        "owner_domain": c.owner_domain,
        "bindings": [{"scope": b.scope_kind, "name": b.scope_name} for b in c.bindings],
        "created_at": c.created_at.isoformat() if c.created_at else None,
    }


def list_checkers(db: Session, actor: Actor) -> list[IdleChecker]:
    if not can_read(actor):
        raise Forbidden("only admins and monitors read the idle checkers")
    return list(
        db.scalars(select(IdleChecker).options(selectinload(IdleChecker.bindings)).order_by(IdleChecker.name))
    )


def get_checker(db: Session, actor: Actor, name: str) -> IdleChecker:
    if not can_read(actor):
        raise Forbidden("only admins and monitors read the idle checkers")
    return _get(db, name)


def create(db: Session, actor: Actor, body: Any) -> IdleChecker:
    if not _can_manage(actor, None):
        raise Forbidden("only superadmins and domain admins make idle checkers")
    b = check_fields(body, required=["name", "kind", "options"], optional=["description", "bindings"])
    name = check_name(b["name"])
    options = parse_options(b["kind"], b["options"])
    bindings = _bindings(db, actor, b.get("bindings", []))
    if db.scalar(select(IdleChecker.id).where(IdleChecker.name == name)) is not None:
        raise Conflict(f"an idle checker {name!r} exists")
    checker = IdleChecker(
        name=name,
        kind=b["kind"],
        options=options,
        description=check_text(b.get("description", ""), "description", 1000),
        owner_domain=None if actor.is_superadmin or actor.kind == "cli" else actor.domain,
        bindings=[IdleCheckerBinding(scope_kind=s, scope_name=n) for s, n in bindings],
    )
    db.add(checker)
    db.flush()
    audit.record(
        db, actor, "idle-checker.create", name, target_domain=checker.owner_domain, details=view(checker)
    )
    return checker


def update(db: Session, actor: Actor, name: str, body: Any) -> IdleChecker:
    checker = _get(db, name)
    if actor.role == "monitor" or not _can_manage(actor, checker):
        raise Forbidden(f"you cannot change the idle checker {checker.name!r}")
    b = check_fields(body, optional=["options", "description", "bindings"])
    if "options" in b:
        checker.options = parse_options(checker.kind, b["options"])
    if "description" in b:
        checker.description = check_text(b["description"], "description", 1000)
    if "bindings" in b:
        wanted = _bindings(db, actor, b["bindings"])
        checker.bindings = [IdleCheckerBinding(scope_kind=s, scope_name=n) for s, n in wanted]
    db.flush()
    audit.record(
        db, actor, "idle-checker.update", checker.name, target_domain=checker.owner_domain, details=b
    )
    return checker


def delete(db: Session, actor: Actor, name: str) -> None:
    checker = _get(db, name)
    if actor.role == "monitor" or not _can_manage(actor, checker):
        raise Forbidden(f"you cannot delete the idle checker {checker.name!r}")
    db.delete(checker)
    audit.record(db, actor, "idle-checker.delete", checker.name, target_domain=checker.owner_domain)


def all_rules(db: Session) -> list[Rule]:
    """Every checker with its bindings, in two statements (for one engine tick)."""
    checkers = list(db.scalars(select(IdleChecker).options(selectinload(IdleChecker.bindings))))
    return [
        Rule(
            c.name, c.kind, dict(c.options or {}), frozenset((b.scope_kind, b.scope_name) for b in c.bindings)
        )
        for c in checkers
    ]


def applicable(rules: Iterable[Rule], domain: str, project: str, group: str) -> list[Rule]:
    return [r for r in rules if r.applies(domain, project, group)]
