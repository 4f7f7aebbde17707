"""A user's credentials for the hosts imports clone from: one token per host, stored encrypted.

A private repository is cloned with the user's token for its host, never with a token in the URL
(a URL shows in links, logs and pages).  The token is sealed with the service's key like a keypair
secret (:mod:`labfleet.core.secretbox`), shown to nobody once stored (views carry the host, the
user name and when), and handed only to the service's own ``git``, through ``GIT_ASKPASS``
(:mod:`labfleet.storage.gitops`): not to a session, a log or an audit entry.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from labfleet.core import audit
from labfleet.core.authz import Actor
from labfleet.core.errors import Forbidden, InvalidInput, NotFound
from labfleet.core.models import ImportCredential, User
from labfleet.core.secretbox import SecretBox
from labfleet.core.validate import check_fields

from .vfolders import actor_user

HOST_RE = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)
MAX_TOKEN = 4096
DEFAULT_USERNAME = "oauth2"  # what GitLab wants with a token; GitHub and Gitea take any name
USERNAME_RE = re.compile(r"^[A-Za-z0-9._@+-]{1,128}$")


def check_host(value: Any, field: str = "host") -> str:
    """A host name as in a URL (lower-case; an address literal is a host too)."""
    host = value.strip().lower() if isinstance(value, str) else value
    if not isinstance(host, str) or not (HOST_RE.match(host) or _is_address(host)):
        raise InvalidInput(f"{field} must be a host name such as github.com (got {str(value)[:80]!r})")
    return host


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _check_token(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInput("token: give the access token for the host")
    if len(value) > MAX_TOKEN:
        raise InvalidInput(f"token is longer than {MAX_TOKEN} characters")
    if any(not 33 <= ord(c) <= 126 for c in value):
        raise InvalidInput("token must be printable ASCII, without spaces")
    return value


def _owner(db: Session, actor: Actor) -> User:
    if actor.role == "monitor":
        raise Forbidden("monitors read; they store no credentials")
    user = actor_user(db, actor)
    if user is None:
        raise Forbidden("credentials belong to a user: sign in as one")
    return user


def view(c: ImportCredential) -> dict[str, Any]:
    """What anyone is ever shown of a credential: never the token."""
    return {"host": c.host, "username": c.username, "created_at": c.created_at.isoformat()}


def list_mine(db: Session, actor: Actor) -> list[dict[str, Any]]:
    user = actor_user(db, actor)
    if user is None:
        return []
    rows = db.scalars(
        select(ImportCredential).where(ImportCredential.user_id == user.id).order_by(ImportCredential.host)
    )
    return [view(c) for c in rows]


def put(db: Session, actor: Actor, host: Any, body: Any, box: SecretBox) -> ImportCredential:
    """Store (or replace) the actor's token for ``host``."""
    host = check_host(host)
    body = check_fields(body, required=["token"], optional=["username"])
    token = _check_token(body["token"])
    username = body.get("username", DEFAULT_USERNAME)
    if not isinstance(username, str) or not USERNAME_RE.match(username):
        raise InvalidInput("username must be 1-128 letters, digits or . _ @ + -")
    user = _owner(db, actor)
    c = db.scalar(
        select(ImportCredential).where(ImportCredential.user_id == user.id, ImportCredential.host == host)
    )
    if c is None:
        c = ImportCredential(user_id=user.id, host=host)
        db.add(c)
    c.username = username
    c.token_encrypted = box.seal(token)
    db.flush()
    audit.record(db, actor, "import.credential.set", host, target_domain=user.domain.name)
    return c


def delete(db: Session, actor: Actor, host: Any) -> None:
    host = check_host(host)
    user = _owner(db, actor)
    c = db.scalar(
        select(ImportCredential).where(ImportCredential.user_id == user.id, ImportCredential.host == host)
    )
    if c is None:
        raise NotFound(f"you have no credential for {host}")
    db.delete(c)
    audit.record(db, actor, "import.credential.delete", host, target_domain=user.domain.name)


def for_host(db: Session, user: User, host: str, box: SecretBox) -> tuple[str, str] | None:
    """(user name, token) the user stored for ``host``, for the service's git only."""
    c = db.scalar(
        select(ImportCredential).where(ImportCredential.user_id == user.id, ImportCredential.host == host)
    )
    return (c.username, box.open(c.token_encrypted)) if c is not None else None
