"""REST handlers for usage statistics: ``GET /api/usage`` (JSON or CSV) and ``GET /api/usage/me``,
each with model serving's requests, errors and latency (JSON only); ``GET /api/usage/live``, the
trusted sampler's last reading of each live session (what the console's Resources page compares
with each session's share of its GPU)."""

from __future__ import annotations

from datetime import datetime, timezone

from labfleet.core.errors import LabfleetError
from labfleet.core.pages import page_of
from labfleet.service.base import APIHandler
from labfleet.usage import serving_usage, stats


class UsageHandler(APIHandler):
    async def get(self):
        try:
            args = {name: self.query_arg(name) for name in self.request.query_arguments}
            query = stats.parse_query(args, datetime.now(timezone.utc))
            with self.db() as db:
                answer = stats.report(db, self.actor, query)
                if query.format == "json":
                    answer["serving"] = serving_usage.report(db, self.actor, query)
        except LabfleetError as e:
            self.send_error_json(e.status, e.message)
            return
        if query.format == "csv":
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            self.set_header(
                "Content-Disposition", f'attachment; filename="labfleet-usage-{query.group_by}.csv"'
            )
            self.finish(stats.as_csv(answer))
            return
        self.write_json(answer)


class MyUsageHandler(APIHandler):
    async def get(self):
        self.write_json(
            await self.run(lambda db, actor: serving_usage.add_to_me(db, actor, stats.me(db, actor)))
        )


class LiveUsageHandler(APIHandler):
    async def get(self):
        def op(db, actor):
            offset, limit = self.get_api_pagination()
            return self.paginated_model(
                page_of(db, stats.live_query(actor), offset, limit).map(stats.live_view)
            )

        self.write_json(await self.run(op))


def routes(api: str) -> list[tuple]:
    """Usage statistics under ``api``."""
    return [
        (api + r"/usage", UsageHandler),
        (api + r"/usage/me", MyUsageHandler),
        (api + r"/usage/live", LiveUsageHandler),
    ]
