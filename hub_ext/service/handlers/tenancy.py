"""REST handlers for tenancy: domains, projects and their members, users, policies, keypairs."""

from __future__ import annotations

from labfleet.core import hubmap
from labfleet.service import hubsync
from labfleet.service.base import (
    APIHandler,
    forget_hub_user,
)
from labfleet.service.hubsync import SyncPlan
from labfleet.tenancy import directory, keypairs, policies, userlist

# ---------------------------------------------------------------- views (with what each holds now)


def _domain(db, d):
    return directory.domain_views(db, [d], detail=True)[0]


def _project(db, p):
    return directory.project_views(db, [p])[0]


# ---------------------------------------------------------------- domains


class DomainListHandler(APIHandler):
    async def get(self):
        self.write_json(
            await self.run(lambda db, a: directory.domain_views(db, directory.list_domains(db, a)))
        )

    async def post(self):
        body = self.get_json_body()

        def op(db, actor):
            d = directory.create_domain(db, actor, body)
            return _domain(db, d)

        self.write_json(await self.run(op), 201)


class DomainHandler(APIHandler):
    async def get(self, name):
        self.write_json(await self.run(lambda db, a: _domain(db, directory.readable_domain(db, a, name))))

    async def patch(self, name):
        self.write_json(
            await self.run(
                lambda db, a: _domain(
                    db, directory.update_domain(db, a, name, self.get_json_body(required=True))
                ),
                after_commit=self.reroute,
            )
        )

    async def delete(self, name):
        def op(db, actor):
            projects = [p.name for p in directory.readable_domain(db, actor, name).projects]
            directory.delete_domain(db, actor, name)
            groups = [hubmap.domain_group(name)] + [hubmap.project_group(name, p) for p in projects]
            hubsync.after_commit(db, SyncPlan(deleted_groups=set(groups)))
            return {"deleted": name}

        self.write_json(await self.run(op))


# ---------------------------------------------------------------- projects


class ProjectListHandler(APIHandler):
    async def get(self):
        self.write_json(
            await self.run(
                lambda db, a: directory.project_views(
                    db, directory.list_projects(db, a, self.query_arg("domain"))
                )
            )
        )

    async def post(self):
        body = self.get_json_body()

        def op(db, actor):
            p = directory.create_project(db, actor, body)
            return _project(db, p)

        self.write_json(await self.run(op), 201)


class ProjectHandler(APIHandler):
    async def get(self, domain, name):
        self.write_json(
            await self.run(lambda db, a: _project(db, directory.readable_project(db, a, domain, name)))
        )

    async def patch(self, domain, name):
        self.write_json(
            await self.run(
                lambda db, a: _project(
                    db, directory.update_project(db, a, domain, name, self.get_json_body(required=True))
                )
            )
        )

    async def delete(self, domain, name):
        def op(db, actor):
            members = directory.delete_project(db, actor, domain, name)
            plan = SyncPlan(users=set(members), deleted_groups={hubmap.project_group(domain, name)})
            hubsync.after_commit(db, plan)
            return {"deleted": f"{domain}/{name}"}

        self.write_json(await self.run(op))


class MemberListHandler(APIHandler):
    async def get(self, domain, name):
        def op(db, actor):
            p = directory.readable_project(db, actor, domain, name)
            readable = set(directory.list_users(db, actor, domain))
            return [directory.user_view(u) for u in p.members if u in readable]

        self.write_json(await self.run(op))

    async def post(self, domain, name):
        body = self.get_json_body()

        def op(db, actor):
            u = directory.add_member(db, actor, domain, name, body)
            hubsync.after_commit(db, SyncPlan(users={u.username}))
            return directory.user_view(u)

        self.write_json(await self.run(op), 201)


class MemberHandler(APIHandler):
    async def delete(self, domain, name, username):
        def op(db, actor):
            u = directory.remove_member(db, actor, domain, name, username)
            hubsync.after_commit(db, SyncPlan(users={u.username}))
            return {"removed": username}

        self.write_json(await self.run(op))


# ---------------------------------------------------------------- users


class UserListHandler(APIHandler):
    async def get(self):
        def op(db, actor):
            domain = self.query_arg("domain")
            wanted = userlist.UserFilter.parse(
                self.query_arg("search"), self.query_arg("role"), self.query_arg("status")
            )
            offset, limit = self.get_api_pagination()
            page = userlist.page_users(db, actor, domain, offset=offset, limit=limit, wanted=wanted)
            return self.paginated_model(page.map(directory.user_view))

        self.write_json(await self.run(op))

    async def post(self):
        body = self.get_json_body()

        def op(db, actor):
            u = directory.create_user(db, actor, body)
            hubsync.after_commit(db, SyncPlan(users={u.username}))
            return directory.user_view(u)

        self.write_json(await self.run(op), 201)


class UserHandler(APIHandler):
    async def get(self, username):
        self.write_json(
            await self.run(lambda db, a: directory.user_view(directory.readable_user(db, a, username)))
        )

    async def patch(self, username):
        def op(db, actor):
            u = directory.update_user(db, actor, username, self.get_json_body(required=True))
            hubsync.after_commit(db, SyncPlan(users={u.username}))
            return directory.user_view(u)

        self.write_json(await self.run(op, after_commit=self.reroute))

    async def delete(self, username):
        def op(db, actor):
            directory.delete_user(db, actor, username)
            hubsync.after_commit(db, SyncPlan(deleted_users={username}))
            return {"deleted": username}

        async def forget() -> None:
            forget_hub_user(self.lf.hub_auth, username)

        self.write_json(await self.run(op, after_commit=forget))


# ---------------------------------------------------------------- policies


class PolicyListHandler(APIHandler):
    async def get(self, kind):
        self.write_json(
            await self.run(
                lambda db, a: [policies.policy_view(kind, p) for p in policies.list_policies(db, a, kind)]
            )
        )

    async def post(self, kind):
        body = self.get_json_body()
        self.write_json(
            await self.run(
                lambda db, a: policies.policy_view(kind, policies.create_policy(db, a, kind, body))
            ),
            201,
        )


class PolicyHandler(APIHandler):
    async def get(self, kind, name):
        self.write_json(
            await self.run(lambda db, a: policies.policy_view(kind, policies.get_policy(db, a, kind, name)))
        )

    async def patch(self, kind, name):
        self.write_json(
            await self.run(
                lambda db, a: policies.policy_view(
                    kind, policies.update_policy(db, a, kind, name, self.get_json_body(required=True))
                )
            )
        )

    async def delete(self, kind, name):
        def op(db, actor):
            policies.delete_policy(db, actor, kind, name)
            return {"deleted": name}

        self.write_json(await self.run(op))


# ---------------------------------------------------------------- keypairs


class KeypairListHandler(APIHandler):
    async def get(self):
        self.write_json(
            await self.run(
                lambda db, a: [
                    keypairs.keypair_view(k)
                    for k in keypairs.list_keypairs(db, a, self.query_arg("username"))
                ]
            )
        )

    async def post(self):
        def op(db, actor):
            kp, secret = keypairs.issue(db, actor, self.get_json_body(required=True))
            return keypairs.keypair_view(kp, secret)

        self.write_json(await self.run(op), 201)


class KeypairHandler(APIHandler):
    async def get(self, access_key):
        self.write_json(await self.run(lambda db, a: keypairs.keypair_view(keypairs.get(db, a, access_key))))

    async def patch(self, access_key):
        self.write_json(
            await self.run(
                lambda db, a: keypairs.keypair_view(
                    keypairs.update(db, a, access_key, self.get_json_body(required=True))
                )
            )
        )

    async def delete(self, access_key):
        self.write_json(
            await self.run(lambda db, a: keypairs.keypair_view(keypairs.revoke(db, a, access_key)))
        )


def routes(api: str) -> list[tuple]:
    """Domains, projects, members, users, policies, keypairs under ``api``."""
    name = r"([^/]+)"
    return [
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
    ]
