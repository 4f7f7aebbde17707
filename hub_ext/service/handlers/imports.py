"""REST handlers for Import & Run: start an import, poll it, and the user's credentials per host.

``POST /api/imports`` plans the import in the request (a refusal is a 4xx and creates nothing) and
answers 202 with the job; ``GET /api/imports/{id}`` says where it is.  Credentials are written
once and never read back: their views carry the host and the user name only.
"""

from __future__ import annotations

from labfleet.service.base import APIHandler
from labfleet.storage import importcreds


class ImportListHandler(APIHandler):
    async def get(self):
        self.write_json({"items": [j.view() for j in self.lf.imports.mine(self.actor)]})

    async def post(self):
        body = self.get_json_body()
        job = await self.run(lambda db, actor: self.lf.imports.start(db, actor, body))
        self.set_header("Location", f"{self.lf.prefix.rstrip('/')}/api/imports/{job.id}")
        self.write_json(job.view(), 202)


class ImportHandler(APIHandler):
    async def get(self, job_id):
        self.write_json(self.lf.imports.get(self.actor, job_id).view())


class CredentialListHandler(APIHandler):
    async def get(self):
        self.write_json({"items": await self.run(importcreds.list_mine)})


class CredentialHandler(APIHandler):
    async def put(self, host):
        body = self.get_json_body(required=True)
        cred = await self.run(
            lambda db, actor: importcreds.view(importcreds.put(db, actor, host, body, self.lf.secretbox))
        )
        self.write_json(cred)

    async def delete(self, host):
        await self.run(lambda db, actor: importcreds.delete(db, actor, host))
        self.write_json({"deleted": host})


def routes(api: str) -> list[tuple]:
    return [
        (api + r"/imports", ImportListHandler),
        (api + r"/imports/([^/]+)", ImportHandler),
        (api + r"/import-credentials", CredentialListHandler),
        (api + r"/import-credentials/([^/]+)", CredentialHandler),
    ]
