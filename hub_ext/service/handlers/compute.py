"""REST handlers for compute: resource groups, nodes, sessions and their logs, the queue, images,
launch options."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone

from labfleet.compute import images, nodes, sessionlist, sessions, waiting
from labfleet.compute.launchoptions import launch_options
from labfleet.core import authz
from labfleet.core.errors import Forbidden, InvalidInput, LabfleetError, NotFound
from labfleet.core.sessionlogs import log_file, read_tail
from labfleet.core.validate import check_bool, check_choice
from labfleet.core.vocab import HOLDING_STATUSES, SESSION_STATUSES
from labfleet.reclaim import reclaimer
from labfleet.service.base import MAX_JSON_DEPTH, APIHandler, json_too_deep
from labfleet.service.handlers import agents
from labfleet.serving import endpoints
from labfleet.tenancy import directory
from labfleet.usage.metrics import ASKED_AGAIN

# ---------------------------------------------------------------- resource groups, nodes, sessions


class ResourceGroupListHandler(APIHandler):
    async def get(self):
        self.write_json(await self.run(lambda db, a: [nodes.group_view(g) for g in nodes.list_groups(db, a)]))

    async def post(self):
        body = self.get_json_body()
        self.write_json(await self.run(lambda db, a: nodes.group_view(nodes.create_group(db, a, body))), 201)


class ResourceGroupHandler(APIHandler):
    async def get(self, name):
        self.write_json(await self.run(lambda db, a: nodes.group_view(nodes.get_group(db, a, name))))

    async def patch(self, name):
        self.write_json(
            await self.run(
                lambda db, a: nodes.group_view(
                    nodes.update_group(db, a, name, self.get_json_body(required=True))
                )
            )
        )


class NodeListHandler(APIHandler):
    async def get(self):
        def op(db, actor):
            offset, limit = self.get_api_pagination()
            return self.paginated_model(nodes.page_node_views(db, actor, offset=offset, limit=limit))

        self.write_json(await self.run(op))


class SessionListHandler(APIHandler):
    async def get(self):
        def op(db, actor):
            filters = {k: self.query_arg(k) for k in ("user", "project", "domain", "status")}
            if filters["status"] is not None:  # ?status= (empty) too: a filter that matches nothing is a typo
                check_choice(filters["status"], "status", SESSION_STATUSES)
            offset, limit = self.get_api_pagination()
            page = sessionlist.page_sessions(db, actor, filters, offset=offset, limit=limit)
            views = page.map(sessions.session_view)
            waiting.annotate(db, views.items)  # why each queued one waits
            endpoints.annotate_replicas(db, views.items)  # whose replica each one is
            return self.paginated_model(views)

        self.write_json(await self.run(op))

    async def post(self):
        body = self.get_json_body()
        if self.actor.kind != "hub":
            # A session asked through the API gets a Hub server, as one from the spawn form does:
            # the Hub starts it, and its spawner asks for the session below (202 once it has).
            if self.actor.role == "monitor":
                raise Forbidden("a monitor changes nothing")
            status, view = await self.lf.start_api_session(self.actor, body)
            self.write_json(view, status)
            return
        # The Hub's spawner asks for a session: admission. When it is the server of a session started
        # through the API, that request's launch (keypair, exact slots) applies and learns the outcome.
        launched = self.lf.launches.take(body)
        asked_again = False

        def op(db, actor):
            nonlocal asked_again
            earlier = sessions.admitted_before(db, actor, body)
            if earlier is not None:  # asked again (an answer was lost): the session it has
                asked_again = True
                return sessions.session_detail(db, earlier)
            launch = launched.launch if launched else None
            admitted = sessions.admit(db, actor, body, launch=launch, queue=self.lf.queue_limits)
            return waiting.annotate(db, [sessions.session_detail(db, admitted)])[0]

        try:
            with self.lf.metrics.timing_admission() as timed:  # refused unless admitted
                view = await self.run(op)
                if asked_again:
                    timed["outcome"] = ASKED_AGAIN  # not a second admission
                else:  # admitted and committed
                    timed["outcome"] = "queued" if view["status"] == "PENDING" else "scheduled"
        except LabfleetError as e:
            if isinstance(e, sessions.Refused):  # rolled back: its audit entry in a unit of its own
                with self.db() as db:
                    sessions.record_refusal(db, e)
            if launched is not None:
                launched.settle(None, e)
            raise
        if launched is not None:
            launched.settle(view)
        self.write_json(view, 200 if asked_again else 201)


class SessionPreviewHandler(APIHandler):
    """What ``POST /api/sessions`` would do with this body now: refused, waits or starts, and why.
    Nothing is held or written (the unit of work rolls back)."""

    async def post(self):
        await self._answer(self.get_json_body())

    async def get(self):
        # ?request=<the JSON body>: for pages that read with the browser's cookie alone (the Hub's spawn
        # form), which may send a GET without the service's XSRF token; a preview changes nothing.
        text = self.query_arg("request")
        if text is None:
            raise InvalidInput(
                "request: the session request to preview, as JSON (the body of POST /api/sessions)"
            )
        try:
            body = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise InvalidInput(f"request is not JSON of at most {MAX_JSON_DEPTH} levels: {e}") from None
        if json_too_deep(body):
            raise InvalidInput(f"request is nested too deeply: at most {MAX_JSON_DEPTH} levels")
        await self._answer(body)

    async def _answer(self, body) -> None:
        def op(db, actor):
            try:
                return waiting.preview(db, actor, body)
            finally:
                db.rollback()

        self.write_json(await self.run(op))


class SessionHandler(APIHandler):
    async def get(self, session_id):
        def op(db, a):
            s = sessions.readable(db, a, session_id)
            detail = sessions.session_detail(db, s)
            if s.status == "RUNNING":  # how long it has been idle, and when it would be reclaimed
                detail["idle"] = reclaimer.idle_of(
                    db, s.id, datetime.now(timezone.utc), self.lf.idle_settings
                )
            endpoints.annotate_replicas(db, [detail])
            return waiting.annotate(db, [detail])[0]

        self.write_json(await self.run(op))

    async def patch(self, session_id):
        body = self.get_json_body()
        self.write_json(
            await self.run(
                lambda db, a: sessions.session_detail(db, sessions.update_status(db, a, session_id, body))
            )
        )

    async def delete(self, session_id):
        def op(db, a):
            held = sessions.readable(db, a, session_id).status in HOLDING_STATUSES
            s = sessions.terminate(db, a, session_id)
            return sessions.session_view(s), held and s.status == "TERMINATED"

        view, ended_here = await self.run(op)
        hub = self.lf.hub_sync
        if ended_here and self.actor.kind != "hub" and hub.enabled:
            # Its Hub server goes too, now, not when reconcile finds it orphaned; the spawner's own
            # release then finds the session ended. (A queued one's spawn learns it is CANCELLED.)
            if not await hub.stop_server(view["user"], view["name"]):
                self.log.warning("the Hub did not stop server %r of session %s", view["name"], view["id"])
        self.write_json(view)

    def on_finish(self) -> None:
        # A session that ended may have written into its folders: count that now, not at the next scan.
        if self.request.method in ("PATCH", "DELETE") and self.get_status() == 200:
            asyncio.ensure_future(self.lf.folder_usage.rescan_session_mounts(self.path_args[0]))


MAX_LOG_TAIL = 8 << 20


class SessionLogsHandler(APIHandler):
    """The session's backend output (process output, container logs), for its owner and admins."""

    async def get(self, session_id):
        limit = self.whole_number_arg("tail", default=MAX_LOG_TAIL, minimum=1, maximum=MAX_LOG_TAIL)

        def op(db, actor):
            s = sessions.readable(db, actor, session_id)
            if actor.role == "monitor" and actor.name != s.user.username:
                raise NotFound(f"no logs for session {session_id}")
            return s.id

        with self.db() as db:
            sid = op(db, self.actor)
        data = read_tail(log_file(self.lf.session_log_dir, sid), limit)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(data)


class QueueHandler(APIHandler):
    async def get(self):
        def op(db, actor):
            group = nodes.get_group(db, actor, self.query_arg("resource_group") or nodes.DEFAULT_GROUP)
            readable = sessionlist.readable_ids(db, actor, {"status": "PENDING"})
            # Positions count everyone's sessions; only the caller's own (or their domain's) are shown.
            return [row for row in sessions.queue_view(db, group) if row["id"] in readable]

        self.write_json(await self.run(op))


# ---------------------------------------------------------------- images, launch options


class ImageListHandler(APIHandler):
    async def get(self):
        self.write_json(
            await self.run(lambda db, a: [images.image_view(i) for i in images.list_images(db, a)])
        )

    async def post(self):
        body = self.get_json_body()
        labels = None
        if isinstance(body, dict) and "inspect" in body:
            # Read the image's own labels from the Docker engine (off the event loop), for those who
            # may register images: anyone else is refused before Docker is asked anything.
            if not self.actor.is_superadmin:
                raise Forbidden("only a superadmin registers images")
            if check_bool(body["inspect"], "inspect"):
                name = images.check_image_name(body.get("name"))
                labels = await asyncio.to_thread(images.docker_labels, name)
        self.write_json(
            await self.run(lambda db, a: images.image_view(images.register(db, a, body, labels))), 201
        )


class ImageHandler(APIHandler):
    async def get(self, name):
        self.write_json(await self.run(lambda db, a: images.image_view(images.get_image(db, a, name))))

    async def patch(self, name):
        self.write_json(
            await self.run(
                lambda db, a: images.image_view(images.update(db, a, name, self.get_json_body(required=True)))
            )
        )

    async def delete(self, name):
        def op(db, actor):
            images.remove(db, actor, name)
            return {"removed": name}

        self.write_json(await self.run(op))


class LaunchOptionsHandler(APIHandler):
    """What a user may launch (spawn form, sidebar, launcher widget)."""

    async def get(self, username):
        def op(db, actor):
            user = directory.get_user(db, username)
            if user is None or not (
                actor.kind in ("hub", "cli") or authz.can_read_user(actor, user.username, user.domain.name)
            ):
                raise NotFound(f"no user {username!r}")
            return launch_options(db, user)

        self.write_json(await self.run(op))


def routes(api: str) -> list[tuple]:
    """Resource groups, nodes, sessions, the queue, images, launch options under ``api``."""
    name = r"([^/]+)"
    return [
        (api + r"/resource-groups", ResourceGroupListHandler),
        (api + rf"/resource-groups/{name}", ResourceGroupHandler),
        (api + r"/nodes", NodeListHandler),
        (api + r"/sessions", SessionListHandler),
        (api + r"/sessions/preview", SessionPreviewHandler),
        (api + rf"/sessions/{name}", SessionHandler),
        (api + rf"/sessions/{name}/logs", SessionLogsHandler),
        (api + r"/scheduler/queue", QueueHandler),
        (api + r"/images", ImageListHandler),
        (api + r"/images/(.+)", ImageHandler),
        (api + rf"/users/{name}/launch-options", LaunchOptionsHandler),
        *agents.routes(api),  # node tokens, drain, the agent API
    ]
