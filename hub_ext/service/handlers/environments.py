"""REST handlers for My Environments: a user's or a project's own images, built from a recipe.

``POST /api/environments`` checks the request (a refusal is a 4xx and records nothing) and answers
202 with the environment, QUEUED for the service's build queue (READY at once when an environment of
the same recipe was built before); ``GET /api/environments/{id}`` says where its build stands, and
``GET /api/environments/{id}/logs`` reads the build's log as far as it got (poll it while it builds).
"""

from __future__ import annotations

from labfleet.compute import environments, images
from labfleet.core.sessionlogs import read_from, read_tail
from labfleet.service.base import APIHandler

MAX_LOG_TAIL = 8 << 20


class EnvironmentListHandler(APIHandler):
    async def get(self):
        self.write_json(
            {
                "items": await self.run(
                    lambda db, a: environments.views(db, environments.list_environments(db, a))
                )
            }
        )

    async def post(self):
        body = self.get_json_body(required=True)
        builds = self.lf.environment_builds
        view = await self.run(
            lambda db, actor: environments.view(builds.create(db, actor, body)), after_commit=builds.poke
        )
        self.set_header("Location", f"{self.lf.prefix.rstrip('/')}/api/environments/{view['id']}")
        self.write_json(view, 202)


class EnvironmentHandler(APIHandler):
    async def get(self, env_id):
        self.write_json(
            await self.run(lambda db, a: environments.views(db, [environments.readable(db, a, env_id)])[0])
        )

    async def delete(self, env_id):
        builds = self.lf.environment_builds
        gone = await self.run(lambda db, a: builds.delete(db, a, env_id))
        await builds.forget(gone)
        self.write_json({"deleted": gone.id, "name": gone.name})


class EnvironmentLogsHandler(APIHandler):
    """The build's log as text, as far as it got (empty before the build starts): its last ``tail``
    bytes, or with ``offset`` what follows that byte (a follower's next ``offset`` is this one plus
    the bytes it got; ``X-Log-Size`` says the log's size now)."""

    async def get(self, env_id):
        limit = self.whole_number_arg("tail", default=MAX_LOG_TAIL, minimum=1, maximum=MAX_LOG_TAIL)
        offset = self.query_arg("offset")
        start = (
            None if offset is None else self.whole_number_arg("offset", default=0, minimum=0, maximum=2**62)
        )
        env_id = await self.run(lambda db, a: environments.readable(db, a, env_id).id)
        path = self.lf.environment_builds.log_path(env_id)
        if start is None:
            data = read_tail(path, limit)
        else:
            data, size = read_from(path, start, limit)
            self.set_header("X-Log-Size", str(size))
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(data)


class EnvironmentImageHandler(APIHandler):
    """A superadmin promotes an environment to a registered image."""

    async def post(self, env_id):
        body = self.get_json_body(required=False)
        view = await self.run(lambda db, a: images.image_view(environments.promote(db, a, env_id, body)))
        self.write_json(view, 201)


def routes(api: str) -> list[tuple]:
    return [
        (api + r"/environments", EnvironmentListHandler),
        (api + r"/environments/([^/]+)", EnvironmentHandler),
        (api + r"/environments/([^/]+)/logs", EnvironmentLogsHandler),
        (api + r"/environments/([^/]+)/image", EnvironmentImageHandler),
    ]
