"""REST API handlers: parse, call the logic modules, render.  Routes are listed in
``routes()`` and described in ``openapi.yaml`` (a test checks both agree)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from pathlib import Path

from tornado import web

from hub_ext.compute import images, nodes, sessions
from hub_ext.compute.launchoptions import launch_options
from hub_ext.compute.quota import me_view
from hub_ext.core import audit, authz, hubmap
from hub_ext.core.authz import Actor
from hub_ext.core.errors import Forbidden, InvalidInput, LabfleetError, NotFound
from hub_ext.core.passwords import verify_password
from hub_ext.core.validate import check_bool, check_fields, check_int, check_name, check_text, check_username
from hub_ext.service.base import APIHandler, BaseHandler, needs_hub
from hub_ext.service.hubsync import SyncPlan
from hub_ext.service.vfhandlers import vfolder_routes
from hub_ext.tenancy import directory, keypairs, policies

SPEC_FILE = Path(__file__).with_name("openapi.yaml")


def _auth_model(user) -> dict:
    return hubmap.auth_model(user.username, user.role, user.domain.name, [p.full_name for p in user.projects])


# ---------------------------------------------------------------- me, audit, spec


class MeHandler(APIHandler):
    async def get(self):
        def op(db, actor):
            if actor.kind != "user":
                raise NotFound("/api/me answers for users; the Hub has no labfleet account")
            return me_view(db, directory.get_user(db, actor.name)), None

        await self.run(op)


class AuditHandler(APIHandler):
    async def get(self):
        limit_arg = self.get_query_argument("limit", "100")
        action = self.query_arg("action")

        def op(db, actor):
            if not limit_arg.isdigit():
                raise InvalidInput("limit must be a whole number")
            limit = check_int(int(limit_arg), "limit", minimum=1, maximum=1000)
            return [
                audit.entry_view(e) for e in audit.list_entries(db, actor, limit=limit, action=action)
            ], None

        await self.run(op)


class SpecHandler(web.RequestHandler):
    """The OpenAPI description of this API; public, like the docs it is."""

    def get(self):
        self.set_header("Content-Type", "application/yaml; charset=utf-8")
        self.finish(SPEC_FILE.read_text())


# ---------------------------------------------------------------- domains


class DomainListHandler(APIHandler):
    async def get(self):
        await self.run(
            lambda db, a: ([directory.domain_view(d) for d in directory.list_domains(db, a)], None)
        )

    async def post(self):
        body = self.body

        def op(db, actor):
            d = directory.create_domain(db, actor, body)
            return directory.domain_view(d, detail=True), None

        await self.run(op, status=201)


class DomainHandler(APIHandler):
    async def get(self, name):
        await self.run(
            lambda db, a: (directory.domain_view(directory.readable_domain(db, a, name), detail=True), None)
        )

    async def patch(self, name):
        body = self.body
        await self.run(
            lambda db, a: (
                directory.domain_view(directory.update_domain(db, a, name, body), detail=True),
                None,
            )
        )

    async def delete(self, name):
        def op(db, actor):
            projects = [p.name for p in directory.readable_domain(db, actor, name).projects]
            directory.delete_domain(db, actor, name)
            groups = [hubmap.domain_group(name)] + [hubmap.project_group(name, p) for p in projects]
            return {"deleted": name}, SyncPlan(deleted_groups=set(groups))

        await self.run(op)


# ---------------------------------------------------------------- projects


class ProjectListHandler(APIHandler):
    async def get(self):
        domain = self.query_arg("domain")
        await self.run(
            lambda db, a: ([directory.project_view(p) for p in directory.list_projects(db, a, domain)], None)
        )

    async def post(self):
        body = self.body

        def op(db, actor):
            p = directory.create_project(db, actor, body)
            return directory.project_view(p), None

        await self.run(op, status=201)


class ProjectHandler(APIHandler):
    async def get(self, domain, name):
        await self.run(
            lambda db, a: (directory.project_view(directory.readable_project(db, a, domain, name)), None)
        )

    async def patch(self, domain, name):
        body = self.body
        await self.run(
            lambda db, a: (directory.project_view(directory.update_project(db, a, domain, name, body)), None)
        )

    async def delete(self, domain, name):
        def op(db, actor):
            members = directory.delete_project(db, actor, domain, name)
            plan = SyncPlan(users=set(members), deleted_groups={hubmap.project_group(domain, name)})
            return {"deleted": f"{domain}/{name}"}, plan

        await self.run(op)


class MemberListHandler(APIHandler):
    async def get(self, domain, name):
        def op(db, actor):
            p = directory.readable_project(db, actor, domain, name)
            return [
                directory.user_view(u) for u in p.members if u in directory.list_users(db, actor, domain)
            ], None

        await self.run(op)

    async def post(self, domain, name):
        body = self.body

        def op(db, actor):
            u = directory.add_member(db, actor, domain, name, body)
            return directory.user_view(u), SyncPlan(users={u.username})

        await self.run(op, status=201)


class MemberHandler(APIHandler):
    async def delete(self, domain, name, username):
        def op(db, actor):
            u = directory.remove_member(db, actor, domain, name, username)
            return {"removed": username}, SyncPlan(users={u.username})

        await self.run(op)


# ---------------------------------------------------------------- users


class UserListHandler(APIHandler):
    async def get(self):
        domain = self.query_arg("domain")
        await self.run(
            lambda db, a: ([directory.user_view(u) for u in directory.list_users(db, a, domain)], None)
        )

    async def post(self):
        body = self.body

        def op(db, actor):
            u = directory.create_user(db, actor, body)
            return directory.user_view(u), SyncPlan(users={u.username})

        await self.run(op, status=201)


class UserHandler(APIHandler):
    async def get(self, username):
        await self.run(lambda db, a: (directory.user_view(directory.readable_user(db, a, username)), None))

    async def patch(self, username):
        body = self.body

        def op(db, actor):
            u = directory.update_user(db, actor, username, body)
            return directory.user_view(u), SyncPlan(users={u.username})

        await self.run(op)

    async def delete(self, username):
        def op(db, actor):
            directory.delete_user(db, actor, username)
            return {"deleted": username}, SyncPlan(deleted_users={username})

        await self.run(op)


# ---------------------------------------------------------------- policies


class PolicyListHandler(APIHandler):
    async def get(self, kind):
        await self.run(
            lambda db, a: ([policies.policy_view(kind, p) for p in policies.list_policies(db, a, kind)], None)
        )

    async def post(self, kind):
        body = self.body
        await self.run(
            lambda db, a: (policies.policy_view(kind, policies.create_policy(db, a, kind, body)), None),
            status=201,
        )


class PolicyHandler(APIHandler):
    async def get(self, kind, name):
        await self.run(
            lambda db, a: (policies.policy_view(kind, policies.get_policy(db, a, kind, name)), None)
        )

    async def patch(self, kind, name):
        body = self.body
        await self.run(
            lambda db, a: (policies.policy_view(kind, policies.update_policy(db, a, kind, name, body)), None)
        )

    async def delete(self, kind, name):
        def op(db, actor):
            policies.delete_policy(db, actor, kind, name)
            return {"deleted": name}, None

        await self.run(op)


# ---------------------------------------------------------------- keypairs


class KeypairListHandler(APIHandler):
    async def get(self):
        username = self.query_arg("username")
        await self.run(
            lambda db, a: ([keypairs.keypair_view(k) for k in keypairs.list_keypairs(db, a, username)], None)
        )

    async def post(self):
        body = self.body

        def op(db, actor):
            kp, secret = keypairs.issue(db, actor, body)
            return keypairs.keypair_view(kp, secret), None

        await self.run(op, status=201)


class KeypairHandler(APIHandler):
    async def get(self, access_key):
        await self.run(lambda db, a: (keypairs.keypair_view(keypairs.get(db, a, access_key)), None))

    async def patch(self, access_key):
        body = self.body
        await self.run(lambda db, a: (keypairs.keypair_view(keypairs.update(db, a, access_key, body)), None))

    async def delete(self, access_key):
        await self.run(lambda db, a: (keypairs.keypair_view(keypairs.revoke(db, a, access_key)), None))


# ---------------------------------------------------------------- resource groups, nodes, sessions


class ResourceGroupListHandler(APIHandler):
    async def get(self):
        await self.run(lambda db, a: ([nodes.group_view(g) for g in nodes.list_groups(db, a)], None))

    async def post(self):
        body = self.body
        await self.run(lambda db, a: (nodes.group_view(nodes.create_group(db, a, body)), None), status=201)


class ResourceGroupHandler(APIHandler):
    async def get(self, name):
        await self.run(lambda db, a: (nodes.group_view(nodes.get_group(db, a, name)), None))

    async def patch(self, name):
        body = self.body
        await self.run(lambda db, a: (nodes.group_view(nodes.update_group(db, a, name, body)), None))


class NodeListHandler(APIHandler):
    async def get(self):
        await self.run(lambda db, a: ([nodes.node_view(db, n) for n in nodes.list_nodes(db, a)], None))


class SessionListHandler(APIHandler):
    async def get(self):
        filters = {k: self.query_arg(k) for k in ("user", "project", "domain", "status")}
        await self.run(
            lambda db, a: ([sessions.session_view(s) for s in sessions.list_sessions(db, a, filters)], None)
        )

    async def post(self):
        body = self.body

        def op(db, actor):
            if actor.role == "monitor":
                raise Forbidden("a monitor changes nothing")
            return sessions.session_detail(db, sessions.admit(db, actor, body)), None

        await self.run(op, status=201)


class SessionHandler(APIHandler):
    async def get(self, session_id):
        await self.run(
            lambda db, a: (sessions.session_detail(db, sessions.readable(db, a, session_id)), None)
        )

    async def patch(self, session_id):
        body = self.body
        await self.run(
            lambda db, a: (sessions.session_detail(db, sessions.update_status(db, a, session_id, body)), None)
        )

    async def delete(self, session_id):
        await self.run(lambda db, a: (sessions.session_view(sessions.terminate(db, a, session_id)), None))

    def on_finish(self) -> None:
        # A session that ended may have written into its folders: count that now, not at the next scan.
        if self.request.method in ("PATCH", "DELETE") and self.get_status() == 200:
            asyncio.ensure_future(self.lf.rescan_session_mounts(self.path_args[0]))


MAX_LOG_TAIL = 8 << 20


class SessionLogsHandler(APIHandler):
    """The session's backend output (process output, container logs), for its owner and admins."""

    async def get(self, session_id):
        tail = self.query_arg("tail")
        try:
            limit = check_int(int(tail), "tail", minimum=1, maximum=MAX_LOG_TAIL) if tail else MAX_LOG_TAIL
        except (ValueError, LabfleetError):
            self.send_error_json(400, f"tail must be a number of bytes from 1 to {MAX_LOG_TAIL}")
            return

        def op(db, actor):
            s = sessions.readable(db, actor, session_id)
            if actor.role == "monitor" and actor.name != s.user.username:
                raise NotFound(f"no logs for session {session_id}")
            return s.id, None

        try:
            with self.db() as db:
                sid, _ = op(db, self.actor)
        except LabfleetError as e:
            self.send_error_json(e.status, e.message)
            return
        path = Path(self.lf.session_log_dir) / f"{sid}.log"
        data = b""
        if path.is_file():
            with path.open("rb") as f:
                size = f.seek(0, 2)
                f.seek(max(0, size - limit))
                data = f.read(limit)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(data)


class QueueHandler(APIHandler):
    async def get(self):
        group_name = self.query_arg("resource_group") or nodes.DEFAULT_GROUP

        def op(db, actor):
            group = nodes.get_group(db, actor, group_name)
            readable = {s.id for s in sessions.list_sessions(db, actor, {"status": "PENDING"})}
            # Positions count everyone's sessions; only the caller's own (or their domain's) are shown.
            return [row for row in sessions.queue_view(db, group) if row["id"] in readable], None

        await self.run(op)


# ---------------------------------------------------------------- images, launch options


class ImageListHandler(APIHandler):
    async def get(self):
        await self.run(lambda db, a: ([images.image_view(i) for i in images.list_images(db, a)], None))

    async def post(self):
        body = self.body
        labels = None
        if isinstance(body, dict) and body.get("inspect"):
            # Read the image's own labels from the Docker engine (off the event loop).
            try:
                name = images.check_image_name(body.get("name"))
                labels = await asyncio.to_thread(images.docker_labels, name)
            except LabfleetError as e:
                self.send_error_json(e.status, e.message)
                return
        await self.run(
            lambda db, a: (images.image_view(images.register(db, a, body, labels)), None), status=201
        )


class ImageHandler(APIHandler):
    async def get(self, name):
        await self.run(lambda db, a: (images.image_view(images.get_image(db, a, name)), None))

    async def patch(self, name):
        body = self.body
        await self.run(lambda db, a: (images.image_view(images.update(db, a, name, body)), None))

    async def delete(self, name):
        def op(db, actor):
            images.remove(db, actor, name)
            return {"removed": name}, None

        await self.run(op)


class LaunchOptionsHandler(APIHandler):
    """What a user may launch (spawn form, sidebar, launcher widget)."""

    async def get(self, username):
        def op(db, actor):
            user = directory.get_user(db, username)
            if user is None or not (
                actor.kind in ("hub", "cli") or authz.can_read_user(actor, user.username, user.domain.name)
            ):
                raise NotFound(f"no user {username!r}")
            return launch_options(db, user), None

        await self.run(op)


# ---------------------------------------------------------------- the Hub's own calls (authenticator)


class PasswordLoginHandler(APIHandler):
    """The Hub's authenticator checks a password here; logins and failures go to the audit log."""

    async def post(self):
        body = self.body

        def op(db, actor):
            needs_hub(actor)
            data = check_fields(body, required=["username", "password"], optional=["remote_addr"])
            name = data["username"]
            remote = check_text(data.get("remote_addr", ""), "remote_addr", 64)
            who = Actor(name=name if isinstance(name, str) else "?", role="user", remote_addr=remote)
            user = directory.get_user(db, name) if isinstance(name, str) else None
            ok = user is not None and verify_password(data["password"], user.password_hash)
            if not ok or not user.is_active:
                reason = "bad username or password" if not ok else "inactive user"
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
                return None, None
            user.last_login = datetime.now(timezone.utc)
            audit.record(
                db,
                directory.actor_for(user, remote),
                "user.login",
                user.username,
                target_domain=user.domain.name,
            )
            return {"auth_model": _auth_model(user)}, None

        await self._answer_or_refuse(op, "invalid username or password")

    async def _answer_or_refuse(self, op, message):
        # A failed login must still commit its audit entry, so it is not an exception.
        try:
            with self.db() as db:
                result, _ = op(db, self.actor)
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
        body = self.body
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
                    return None, None
                user = directory.create_user(db, actor, {"username": name, **fields})
                created.append(name)
            elif sync and fields:
                changes = {k: v for k, v in fields.items() if k != "domain" or v != user.domain.name}
                if changes:
                    directory.update_user(db, actor, name, changes)
            if not user.is_active:
                audit.record(
                    db,
                    directory.actor_for(user, remote),
                    "user.login",
                    name,
                    target_domain=user.domain.name,
                    success=False,
                    details={"reason": "inactive user", "source": source},
                )
                return None, None
            user.last_login = datetime.now(timezone.utc)
            audit.record(
                db,
                directory.actor_for(user, remote),
                "user.login",
                name,
                target_domain=user.domain.name,
                details={"source": source},
            )
            return {"auth_model": _auth_model(user), "created": bool(created)}, None

        await self._answer_or_refuse(op, "this identity has no active labfleet account")


class AuthUserHandler(APIHandler):
    """The current auth model of a user, for the authenticator's refresh_user."""

    async def get(self, username):
        def op(db, actor):
            needs_hub(actor)
            user = directory.get_user(db, username)
            if user is None:
                raise NotFound(f"no user {username!r}")
            if not user.is_active:
                raise Forbidden(f"user {username} is inactive")
            return {"auth_model": _auth_model(user)}, None

        await self.run(op)


# ---------------------------------------------------------------- pages


class HomeHandler(BaseHandler):
    """``/services/labfleet/``: a small page that logs the browser in (OAuth) and links the API."""

    @web.authenticated
    def get(self):
        user = self.get_current_user()
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(
            self.render_string("home.html", user=user, prefix=self.lf.prefix, xsrf=self.xsrf_token.decode())
        )


def routes(prefix: str) -> list[tuple]:
    """URL patterns under the service prefix (``/services/labfleet/``)."""
    name = r"([^/]+)"
    api = prefix + "api"
    return [
        (prefix + r"?", HomeHandler),
        (api + r"/openapi\.yaml", SpecHandler),
        (api + r"/me", MeHandler),
        (api + r"/audit", AuditHandler),
        (api + r"/domains", DomainListHandler),
        (api + rf"/domains/{name}", DomainHandler),
        (api + r"/projects", ProjectListHandler),
        (api + rf"/projects/{name}/{name}", ProjectHandler),
        (api + rf"/projects/{name}/{name}/members", MemberListHandler),
        (api + rf"/projects/{name}/{name}/members/{name}", MemberHandler),
        (api + r"/users", UserListHandler),
        (api + rf"/users/{name}", UserHandler),
        (api + r"/policies/(keypair|user|project)", PolicyListHandler),
        (api + rf"/policies/(keypair|user|project)/{name}", PolicyHandler),
        (api + r"/keypairs", KeypairListHandler),
        (api + rf"/keypairs/{name}", KeypairHandler),
        (api + r"/resource-groups", ResourceGroupListHandler),
        (api + rf"/resource-groups/{name}", ResourceGroupHandler),
        (api + r"/nodes", NodeListHandler),
        (api + r"/sessions", SessionListHandler),
        (api + rf"/sessions/{name}", SessionHandler),
        (api + rf"/sessions/{name}/logs", SessionLogsHandler),
        (api + r"/scheduler/queue", QueueHandler),
        (api + r"/images", ImageListHandler),
        (api + r"/images/(.+)", ImageHandler),
        (api + rf"/users/{name}/launch-options", LaunchOptionsHandler),
        *vfolder_routes(api),
        (api + r"/auth/password", PasswordLoginHandler),
        (api + r"/auth/identity", IdentityHandler),
        (api + rf"/auth/users/{name}", AuthUserHandler),
    ]
