"""REST handlers for maintenance: rebuilding the usage ledger, and what runs unaccounted (superadmin only)."""

from __future__ import annotations

from typing import Any

from labfleet.compute import maintenance
from labfleet.core.validate import check_bool, check_fields
from labfleet.service import jobs
from labfleet.service.base import APIHandler


class RecalculateUsageHandler(APIHandler):
    async def post(self):
        body = check_fields(self.get_json_body(), optional=["dry_run"])
        dry_run = check_bool(body.get("dry_run", False), "dry_run")
        maintenance.check_may_recalculate(self.actor)  # refused before the Hub is asked anything
        hub = self.lf.hub_sync
        # The Hub first: a session admitted after this read is live in the DB read that follows.
        servers = await hub.server_list() if hub.enabled else None
        if servers is None:
            self.log.warning("Recalculate usage: the Hub's servers could not be read, so not checked")
        answer: dict[str, Any] = {}

        def op(db, actor):
            answer.update(maintenance.recalculate_usage(db, actor, dry_run=dry_run, hub_servers=servers))
            return answer

        async def stop_unaccounted() -> None:
            found = answer.get("unaccounted_servers") or []
            stopped = await jobs.stop_orphan_servers(
                self.lf.session_factory,
                [(s["user"], s["server"]) for s in found],
                hub.stop_server,
                self.log,
                self.actor,
                via=maintenance.ACTION,
            )
            for s in found:
                s["stopped"] = stopped[(s["user"], s["server"])]

        self.write_json(await self.run(op, after_commit=None if dry_run else stop_unaccounted))


def routes(api: str) -> list[tuple]:
    """Maintenance operations under ``api``."""
    return [(api + r"/maintenance/recalculate-usage", RecalculateUsageHandler)]
