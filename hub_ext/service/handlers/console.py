"""REST handlers for the admin console's Maintenance, Information and Configurations pages:
the announcement (``/api/announcement``), versions and health (``/api/info``), and the settings
in force (``/api/configuration``). The logic is in ``labfleet.tenancy.announcements`` and
``labfleet.service.fleetinfo``; these parse, check who asks, and assemble."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from labfleet.service import fleetinfo
from labfleet.service.base import APIHandler
from labfleet.tenancy import announcements


class AnnouncementHandler(APIHandler):
    async def get(self):
        self.write_json(await self.run(lambda db, actor: announcements.current(db, actor)))

    async def put(self):
        def op(db, actor):
            return announcements.publish(db, actor, self.get_json_body(required=True))

        self.write_json(await self.run(op))

    async def delete(self):
        self.write_json(await self.run(lambda db, actor: announcements.clear(db, actor)))


class InfoHandler(APIHandler):
    async def get(self):
        fleetinfo.need_reader(self.actor, "information")
        lf = self.lf
        now = datetime.now(timezone.utc)
        # Outside the unit of work below: each takes a connection of its own.
        database = {**fleetinfo.db_health(lf.engine), **fleetinfo.db_server(lf.engine)}
        hub = await fleetinfo.hub_health(lf.hub_sync.api_url, lf.hub_sync.token)

        def op(db, actor) -> dict[str, Any]:
            return fleetinfo.info_answer(db, actor, lf, database=database, hub=hub, now=now)

        self.write_json(await self.run(op))


class ConfigurationHandler(APIHandler):
    async def get(self):
        fleetinfo.need_reader(self.actor, "configuration")
        lf = self.lf

        def op(db, actor) -> dict[str, Any]:
            return fleetinfo.configuration_answer(db, actor, lf)

        self.write_json(await self.run(op))


def routes(api: str) -> list[tuple]:
    """The console's routes under ``api``."""
    return [
        (api + r"/announcement", AnnouncementHandler),
        (api + r"/info", InfoHandler),
        (api + r"/configuration", ConfigurationHandler),
    ]
