"""REST handlers for maintenance: rebuilding the usage ledger (superadmin only)."""

from __future__ import annotations

from hub_ext.compute import maintenance
from hub_ext.core.validate import check_bool, check_fields
from hub_ext.service.base import APIHandler, request_json


class RecalculateUsageHandler(APIHandler):
    async def post(self):
        def op(db, actor):
            body = check_fields(request_json(self), optional=["dry_run"])
            dry_run = check_bool(body.get("dry_run", False), "dry_run")
            return maintenance.recalculate_usage(db, actor, dry_run=dry_run), None

        await self.run(op)


def routes(api: str) -> list[tuple]:
    """Maintenance operations under ``api``."""
    return [(api + r"/maintenance/recalculate-usage", RecalculateUsageHandler)]
