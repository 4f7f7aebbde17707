"""REST handlers for node agents and node administration: node tokens (superadmins), draining a node,
and the agent API (``/api/agent/...``, authenticated with a node token only).

A heartbeat's answer also carries the GPU share backstop's kills for the node (``kill``; see
:mod:`labfleet.usage.enforce`), and its body the agent's reports of the kills it was handed
(``kill_reports``), taken only for kills queued for that node. Save as environment for a session
on the agent's node is handed over the same way: ``commits`` in the answer, ``commit_reports`` in
the body (:mod:`labfleet.compute.envremote`)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict
from typing import Any

from labfleet.compute import agents, envremote, nodes
from labfleet.core.authz import Actor
from labfleet.core.errors import Forbidden, LabfleetError, Unauthorized
from labfleet.core.models import NodeToken
from labfleet.service.base import APIHandler
from labfleet.usage import enforce, overuse, records
from labfleet.usage.sampler import Target

# ---------------------------------------------------------------- node tokens, drain


class NodeTokenListHandler(APIHandler):
    async def get(self):
        self.write_json(
            await self.run(lambda db, a: [agents.token_view(db, t) for t in agents.list_tokens(db, a)])
        )

    async def post(self):
        body = self.get_json_body()

        def op(db, actor):
            token, plain = agents.create_token(db, actor, body)
            return {**agents.token_view(db, token), "token": plain}

        self.write_json(await self.run(op), 201)


class NodeTokenHandler(APIHandler):
    async def delete(self, token_id):
        self.write_json(
            await self.run(lambda db, a: agents.token_view(db, agents.revoke_token(db, a, token_id)))
        )


class NodeHandler(APIHandler):
    async def patch(self, name):
        def op(db, actor):
            node = agents.set_schedulable(db, actor, name, self.get_json_body(required=True))
            return nodes.node_view(db, node)

        self.write_json(await self.run(op))


# ---------------------------------------------------------------- the agent API


def target_json(t: Target) -> dict[str, Any]:
    return {**asdict(t), "devices": list(t.devices)}


class AgentHandler(APIHandler):
    """A request of a node agent: ``Authorization: token lfnode_...``; anyone else is refused."""

    token_id: int

    async def authenticate(self) -> Actor:
        header = self.request.headers.get("Authorization", "")
        presented = header[len("token ") :].strip() if header.lower().startswith("token ") else ""
        if not agents.looks_like_token(presented):
            await super().authenticate()  # 401 for no credentials at all
            raise Forbidden("only node agents (with a node token) call /api/agent")
        # A first check of a token costs a PBKDF2 hash: off the event loop.
        self.token_id = await asyncio.to_thread(self._check_token, presented)
        return Actor(
            name=f"agent#{self.token_id}",
            role="agent",
            kind="agent",
            remote_addr=self.request.remote_ip or "",
        )

    def _check_token(self, presented: str) -> int:
        with self.db() as db:
            return agents.authenticate(db, presented).id

    def token(self, db) -> NodeToken:
        token = db.get(NodeToken, self.token_id)
        if token is None or token.revoked_at is not None:
            raise Unauthorized("unknown or revoked node token")
        return token

    async def answer(self, work, *, poke: bool) -> None:
        """Run ``work(db)`` in one transaction and answer its result; serve the queues if ``poke``
        (an agent's heartbeat changes nothing most of the time: it does not poke the clock)."""
        try:
            with self.db() as db:
                result, changed = work(db)
        except LabfleetError as e:
            self.send_error_json(e.status, e.message)
            return
        await self.lf.after_commit(db, write=poke or changed)
        self.write_json(result)


class AgentRegisterHandler(AgentHandler):
    async def post(self):
        body = self.get_json_body()
        remote = self.request.remote_ip or ""

        def work(db):
            node = agents.register(db, self.token(db), body, remote)
            targets = records.targets_on(db, node.name)
            return {
                "node": node.name,
                "resource_group": node.resource_group.name,
                "heartbeat": self.lf.agent_heartbeat,
                "sessions": [target_json(t) for t in targets],
                "stop": [],
            }, True

        await self.answer(work, poke=True)


class AgentHeartbeatHandler(AgentHandler):
    async def post(self):
        beat, raw = agents.parse_heartbeat(self.get_json_body())
        readings = records.parse_agent_readings(raw, time.time())
        reports = overuse.parse_kill_reports(list(beat.kill_reports))
        commit_reports = envremote.parse_commit_reports(list(beat.commit_reports))
        builds = self.lf.environment_builds
        remote = self.request.remote_ip or ""
        accepted: list = []
        kills_done: list = []
        commits_taken: list = []

        def work(db):
            result = agents.heartbeat(db, self.token(db), beat, remote)  # the token's node, or 4xx
            targets = records.targets_on(db, beat.node)
            accepted.extend(records.accept_agent_readings(readings, targets))
            kill, done = enforce.agent_heartbeat(
                self.lf.agent_kills, beat.node, reports, (t.session_id for t in targets), log=self.log
            )
            kills_done.extend(done)
            commits_taken.extend(builds.take_agent_reports(db, beat.node, commit_reports))
            return {
                "node": beat.node,
                "heartbeat": self.lf.agent_heartbeat,
                "sessions": [target_json(t) for t in targets],
                "stop": result.stop,
                "released": result.released,
                "kill": kill,
                "commits": builds.agent_orders(db, beat.node),
            }, bool(result.released or result.came_back or any(t.last for t in commits_taken))

        await self.answer(work, poke=False)
        if self.get_status() == 200:
            self.lf.agent_readings_in(accepted)
            if commits_taken:
                await asyncio.to_thread(builds.write_agent_logs, commits_taken)
        # Taken from the queue: written up whatever the answer (a report is not taken twice).
        enforce.finish_agent_kills(
            self.lf.session_factory, kills_done, log=self.log, observe=self.lf.metrics.observe_gpu_overuse
        )


def routes(api: str) -> list[tuple]:
    """Node tokens, a node's drain flag, the agent API under ``api``."""
    name = r"([^/]+)"
    return [
        (api + r"/node-tokens", NodeTokenListHandler),
        (api + rf"/node-tokens/{name}", NodeTokenHandler),
        (api + rf"/nodes/{name}", NodeHandler),
        (api + r"/agent/register", AgentRegisterHandler),
        (api + r"/agent/heartbeat", AgentHeartbeatHandler),
    ]
