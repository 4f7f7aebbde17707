"""REST handlers for model serving: endpoints and their tokens (labfleet.serving), the Model Store,
a replica's credential, and the router's route."""

from __future__ import annotations

import asyncio
from typing import Any

from labfleet.core.errors import InvalidInput, NotFound
from labfleet.service.base import APIHandler
from labfleet.serving import credentials, endpoints, store
from labfleet.serving.router import ServeHandler


class _ServingHandler(APIHandler):
    def view(self, e: Any) -> dict[str, Any]:
        return endpoints.view(e, prefix=self.lf.prefix)

    async def changed(self) -> None:
        """After a committed change: the engine acts at once, and the router sees it."""
        engine = getattr(self.lf, "serving", None)
        if engine is not None:
            engine.poke()
            engine.rebuild()


class EndpointListHandler(_ServingHandler):
    async def get(self):
        raw = self.query_arg("destroyed")
        if raw not in (None, "true", "false"):
            raise InvalidInput("destroyed must be true or false")
        self.write_json(
            await self.run(
                lambda db, a: [
                    self.view(e) for e in endpoints.list_endpoints(db, a, include_destroyed=raw == "true")
                ]
            )
        )

    async def post(self):
        body = self.get_json_body()
        view = endpoints.create(self.lf.session_factory, self.actor, body)
        view["url"] = f"{self.lf.prefix}serve/{view['name']}/"
        await self.changed()
        self.write_json(view, 201)


class EndpointHandler(_ServingHandler):
    async def get(self, name):
        self.write_json(await self.run(lambda db, a: self.view(endpoints.readable(db, a, name))))

    async def patch(self, name):
        self.write_json(
            await self.run(
                lambda db, a: self.view(endpoints.update(db, a, name, self.get_json_body(required=True))),
                after_commit=self.changed,
            )
        )

    async def delete(self, name):
        self.write_json(
            await self.run(lambda db, a: self.view(endpoints.destroy(db, a, name)), after_commit=self.changed)
        )


class TokenListHandler(_ServingHandler):
    async def get(self, name):
        self.write_json(
            await self.run(
                lambda db, a: [endpoints.token_view(t) for t in endpoints.list_tokens(db, a, name)]
            )
        )

    async def post(self, name):
        def op(db, a):
            token, plain = endpoints.create_token(db, a, name, self.get_json_body())
            return {**endpoints.token_view(token), "token": plain}

        self.write_json(await self.run(op, after_commit=self.changed), 201)


class TokenHandler(_ServingHandler):
    async def delete(self, name, token_id):
        self.write_json(
            await self.run(
                lambda db, a: endpoints.token_view(endpoints.revoke_token(db, a, name, token_id)),
                after_commit=self.changed,
            )
        )


class ModelStoreHandler(APIHandler):
    """The team's model folders as cards (labfleet.serving.store); files are read off the event loop."""

    async def get(self):
        search, project = self.query_arg("search"), self.query_arg("project")
        with self.db() as db:
            found = store.candidates(db, self.actor, project=project)
        self.write_json(await asyncio.to_thread(store.cards, found, search=search))


class ReplicaCredentialHandler(APIHandler):
    """``GET /api/sessions/<id>/replica-credential``: what the router sends to this replica, for the
    replica's own session (its owner's Hub token) and the Hub; 404 for anyone else. A session that is
    no replica hears ``"replica": false`` (it runs its command without a front). Never cached."""

    async def get(self, session_id):
        engine = getattr(self.lf, "serving", None)
        if engine is None:
            raise NotFound("model serving does not run in this service")

        def op(db, a):
            r = endpoints.replica_route(db, a, session_id)
            return {
                "session": session_id,
                "replica": r is not None,
                "endpoint": r.endpoint.name if r is not None else None,
                "route": r.id if r is not None else None,
                "header": credentials.HEADER,
                "credential": engine.credential(r.endpoint_id, r.id) if r is not None else None,
            }

        self.set_header("Cache-Control", "no-store")
        self.write_json(await self.run(op))


def routes(prefix: str) -> list[tuple]:
    """The endpoints' API under ``prefix + "api"``, and their one URL each under ``prefix + "serve"``."""
    api = prefix + "api"
    name = r"([^/]+)"
    return [
        (api + r"/endpoints", EndpointListHandler),
        (api + rf"/endpoints/{name}", EndpointHandler),
        (api + rf"/endpoints/{name}/tokens", TokenListHandler),
        (api + rf"/endpoints/{name}/tokens/{name}", TokenHandler),
        (api + r"/model-store", ModelStoreHandler),
        (api + rf"/sessions/{name}/replica-credential", ReplicaCredentialHandler),
        (prefix + rf"serve/{name}/(.*)", ServeHandler),
    ]
