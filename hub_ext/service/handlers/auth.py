"""REST handlers the Hub's authenticator calls: password logins, identities from an OAuth
provider, a user's auth model."""

from __future__ import annotations

from datetime import datetime, timezone

from labfleet.core import audit, hubmap
from labfleet.core.authz import Actor
from labfleet.core.errors import Forbidden, InvalidInput, NotFound
from labfleet.core.passwords import verify_password
from labfleet.core.validate import check_bool, check_fields, check_name, check_text, check_username
from labfleet.service.base import APIHandler, needs_hub
from labfleet.tenancy import directory


def _auth_model(user) -> dict:
    return hubmap.auth_model(user.username, user.role, user.domain.name, [p.full_name for p in user.projects])


# ---------------------------------------------------------------- the Hub's own calls (authenticator)


class PasswordLoginHandler(APIHandler):
    """The Hub's authenticator checks a password here; logins and failures go to the audit log."""

    async def post(self):
        body = self.get_json_body()

        def op(db, actor):
            needs_hub(actor)
            data = check_fields(body, required=["username", "password"], optional=["remote_addr"])
            name = data["username"]
            remote = check_text(data.get("remote_addr", ""), "remote_addr", 64)
            who = Actor(name=name if isinstance(name, str) else "?", role="user", remote_addr=remote)
            user = directory.get_user(db, name) if isinstance(name, str) else None
            ok = user is not None and verify_password(data["password"], user.password_hash)
            refused = directory.why_inactive(user) if ok else None
            if not ok or refused:
                reason = "bad username or password" if not ok else refused
                domain = user.domain.name if user else None
                audit.record(
                    db,
                    who,
                    "user.login",
                    str(name)[:255],
                    target_domain=domain,
                    success=False,
                    details={"reason": reason},
                )
                return None
            user.last_login = datetime.now(timezone.utc)
            audit.record(
                db,
                directory.actor_for(user, remote),
                "user.login",
                user.username,
                target_domain=user.domain.name,
            )
            return {"auth_model": _auth_model(user)}

        await self._answer_or_refuse(op, "invalid username or password")

    async def _answer_or_refuse(self, op, message):
        # A failed login must still commit its audit entry, so it is not an exception.
        try:
            with self.db() as db:
                result = op(db, self.actor)
        except (InvalidInput, Forbidden, NotFound) as e:
            self.send_error_json(e.status, e.message)
            return
        if result is None:
            self.send_error_json(403, message)
            return
        self.write_json(result)


class IdentityHandler(PasswordLoginHandler):
    """Map an identity proven by another authenticator (OAuth, ...) to a labfleet user."""

    async def post(self):
        body = self.get_json_body()
        created: list[str] = []

        def op(db, actor):
            needs_hub(actor)
            data = check_fields(
                body,
                required=["username"],
                optional=["source", "remote_addr", "create", "sync", "domain", "projects", "role"],
            )
            name = check_username(data["username"])
            remote = check_text(data.get("remote_addr", ""), "remote_addr", 64)
            source = check_text(data.get("source", ""), "source", 128)
            create = check_bool(data.get("create", False), "create")
            sync = check_bool(data.get("sync", False), "sync")
            fields = {k: data[k] for k in ("domain", "projects", "role") if data.get(k) is not None}
            if "domain" in fields:
                check_name(fields["domain"], "domain")
            user = directory.get_user(db, name)
            if user is None:
                if not create or "domain" not in fields:
                    who = Actor(name=name, role="user", remote_addr=remote)
                    audit.record(
                        db,
                        who,
                        "user.login",
                        name,
                        success=False,
                        details={"reason": "unknown user", "source": source},
                    )
                    return None
                user = directory.create_user(db, actor, {"username": name, **fields})
                created.append(name)
            elif sync and fields:
                changes = {k: v for k, v in fields.items() if k != "domain" or v != user.domain.name}
                if changes:
                    directory.update_user(db, actor, name, changes)
            refused = directory.why_inactive(user)
            if refused:
                audit.record(
                    db,
                    directory.actor_for(user, remote),
                    "user.login",
                    name,
                    target_domain=user.domain.name,
                    success=False,
                    details={"reason": refused, "source": source},
                )
                return None
            user.last_login = datetime.now(timezone.utc)
            audit.record(
                db,
                directory.actor_for(user, remote),
                "user.login",
                name,
                target_domain=user.domain.name,
                details={"source": source},
            )
            return {"auth_model": _auth_model(user), "created": bool(created)}

        await self._answer_or_refuse(op, "this identity has no active labfleet account")


class AuthUserHandler(APIHandler):
    """The current auth model of a user, for the authenticator's refresh_user."""

    async def get(self, username):
        def op(db, actor):
            needs_hub(actor)
            user = directory.get_user(db, username)
            if user is None:
                raise NotFound(f"no user {username!r}")
            refused = directory.why_inactive(user)
            if refused:
                raise Forbidden(refused)
            return {"auth_model": _auth_model(user)}

        self.write_json(await self.run(op))


def routes(api: str) -> list[tuple]:
    """The authenticator's calls under ``api``."""
    name = r"([^/]+)"
    return [
        (api + r"/auth/password", PasswordLoginHandler),
        (api + r"/auth/identity", IdentityHandler),
        (api + rf"/auth/users/{name}", AuthUserHandler),
    ]
