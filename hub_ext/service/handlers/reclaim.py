"""REST handlers for idle reclamation: checker definitions, the preview, a session's idle object,
its activity reports and "I'm still here"."""

from __future__ import annotations

from datetime import datetime, timezone

from labfleet.reclaim import reclaimer, rules
from labfleet.service.base import APIHandler


def _now() -> datetime:
    return datetime.now(timezone.utc)


class IdleCheckerListHandler(APIHandler):
    async def get(self):
        self.write_json(await self.run(lambda db, a: [rules.view(c) for c in rules.list_checkers(db, a)]))

    async def post(self):
        self.write_json(
            await self.run(lambda db, a: rules.view(rules.create(db, a, self.get_json_body(required=True)))),
            201,
        )


class IdleCheckerHandler(APIHandler):
    async def get(self, name):
        self.write_json(await self.run(lambda db, a: rules.view(rules.get_checker(db, a, name))))

    async def patch(self, name):
        self.write_json(
            await self.run(
                lambda db, a: rules.view(rules.update(db, a, name, self.get_json_body(required=True)))
            )
        )

    async def delete(self, name):
        def op(db, a):
            rules.delete(db, a, name)
            return {"deleted": name}

        self.write_json(await self.run(op))


class IdlePreviewHandler(APIHandler):
    async def get(self):
        self.write_json(await self.run(lambda db, a: reclaimer.preview(db, a, _now(), self.lf.idle_settings)))


class SessionIdleHandler(APIHandler):
    async def get(self, session_id):
        def op(db, a):
            s = reclaimer.sessions.readable(db, a, session_id)
            return reclaimer.idle_of(db, s.id, _now(), self.lf.idle_settings)

        self.write_json(await self.run(op))


class SessionActivityHandler(APIHandler):
    async def post(self, session_id):
        body = self.get_json_body()
        self.write_json(
            await self.run(lambda db, a: reclaimer.report_activity(db, a, session_id, body, _now()))
        )


class StillHereHandler(APIHandler):
    async def post(self, session_id):
        self.write_json(
            await self.run(
                lambda db, a: reclaimer.still_here(db, a, session_id, _now(), self.lf.idle_settings)
            )
        )


def routes(api: str) -> list[tuple]:
    """Idle reclamation under ``api``."""
    name = r"([^/]+)"
    return [
        (api + r"/idle-checkers", IdleCheckerListHandler),
        (api + r"/idle-checkers/preview", IdlePreviewHandler),
        (api + rf"/idle-checkers/{name}", IdleCheckerHandler),
        (api + rf"/sessions/{name}/idle", SessionIdleHandler),
        (api + rf"/sessions/{name}/activity", SessionActivityHandler),
        (api + rf"/sessions/{name}/still-here", StillHereHandler),
    ]
