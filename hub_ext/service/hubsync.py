"""Keep Hub users and groups in step with labfleet tenancy, through the Hub's REST API.

The authenticator sets groups and roles at every login and refresh; this module
makes group changes show at once (the Hub admin page, group-filtered scopes) and
creates the Hub user when an admin creates a labfleet user.  Failures are logged,
never raised: the next login or refresh corrects the Hub anyway.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from labfleet.compute.reconcile import HubServer
from labfleet.core import http, hubmap
from labfleet.core.database import session_scope
from labfleet.tenancy.directory import get_user


def _when(value: Any) -> str | None:
    """A time as the Hub's server model writes it (ISO 8601 text); None for anything else."""
    return value if isinstance(value, str) and 0 < len(value) <= 64 else None


@dataclass
class SyncPlan:
    users: set[str] = field(default_factory=set)
    deleted_users: set[str] = field(default_factory=set)
    deleted_groups: set[str] = field(default_factory=set)


PLAN = "labfleet.hub_sync"  # Session.info key: the unit of work's SyncPlan


def after_commit(db: Any, plan: SyncPlan) -> None:
    """Record on the unit of work ``db`` what the Hub must learn once it commits (merged with what
    is recorded already); the service applies it after the commit (:func:`take_plan`)."""
    recorded = db.info.setdefault(PLAN, SyncPlan())
    recorded.users |= plan.users
    recorded.deleted_users |= plan.deleted_users
    recorded.deleted_groups |= plan.deleted_groups


def take_plan(db: Any) -> SyncPlan | None:
    """What the committed unit of work ``db`` recorded for the Hub (once: it is taken out)."""
    plan: SyncPlan | None = db.info.pop(PLAN, None)
    return plan


class HubSync:
    def __init__(self, api_url: str, token: str, session_factory, log: logging.Logger) -> None:
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.session_factory = session_factory
        self.log = log

    @property
    def enabled(self) -> bool:
        return bool(self.api_url and self.token)

    async def _call(self, method: str, path: str, body: Any = None, ok=(200, 201, 204)) -> http.HTTPReply:
        if body is None and method not in ("GET", "DELETE"):
            body = {}
        reply = await http.request(
            method, self.api_url + path, token=self.token, json_body=body, timeout=20, upstream="the Hub"
        )
        if reply.status == 0:
            self.log.warning("Hub API %s %s failed: %s", method, http.loggable(path), reply.error)
        elif reply.status not in ok:
            self.log.debug("Hub API %s %s: %s", method, http.loggable(path), reply.message)
        return reply

    async def apply(self, plan: SyncPlan) -> None:
        if not self.enabled:
            return
        for name in sorted(plan.deleted_users):
            await self._call("DELETE", f"/users/{quote(name, safe='')}")
        for group in sorted(plan.deleted_groups):
            await self._call("DELETE", f"/groups/{quote(group, safe='')}")
        for name in sorted(plan.users):
            await self.sync_user(name)

    def _desired_groups(self, name: str) -> set[str] | None:
        with session_scope(self.session_factory) as db:
            user = get_user(db, name)
            if user is None:
                return None
            return set(hubmap.hub_groups(user.domain.name, [p.full_name for p in user.projects]))

    async def sync_user(self, name: str) -> None:
        desired = self._desired_groups(name)
        if desired is None:
            return
        qname = quote(name, safe="")
        got = await self._call("GET", f"/users/{qname}", ok=(200, 404))
        if got.status == 404:
            got = await self._call("POST", f"/users/{qname}")
        model = got.data
        if got.status not in (200, 201) or not isinstance(model, dict):
            return
        current = {g for g in model.get("groups", []) if hubmap.is_labfleet_group(g)}
        for group in sorted(desired - current):
            g = quote(group, safe="")
            added = await self._call("POST", f"/groups/{g}/users", {"users": [name]}, ok=(200, 404))
            if added.status == 404:
                await self._call("POST", f"/groups/{g}", {"users": [name]})
        for group in sorted(current - desired):
            await self._call("DELETE", f"/groups/{quote(group, safe='')}/users", {"users": [name]})
        self.log.info("Hub groups of %s: %s", name, sorted(desired))

    @staticmethod
    def _server_models(user: dict[str, Any]) -> dict[str, HubServer]:
        """A Hub user model's servers: name -> what it is ("ready" or what it is pending: "spawn",
        "stop"), with when it started and was last active where the Hub says."""
        out = {}
        for name, model in (user.get("servers") or {}).items():
            model = model if isinstance(model, dict) else {}
            if model.get("ready"):
                state = "ready"
            elif model.get("pending"):
                state = str(model["pending"])
            else:
                continue
            out[name] = HubServer(state, _when(model.get("started")), _when(model.get("last_activity")))
        return out

    @classmethod
    def _server_states(cls, user: dict[str, Any]) -> dict[str, str]:
        """A Hub user model's servers: name -> "ready" or what it is pending ("spawn", "stop")."""
        return {name: server.state for name, server in cls._server_models(user).items()}

    async def server_list(self, page: int = 200) -> dict[tuple[str, str], HubServer] | None:
        """(user, server name) -> :class:`HubServer`, for every server the Hub runs or is starting or
        stopping; None if the Hub could not be read (then nothing can be concluded).

        Read page by page: the Hub caps a page (200 by default), whatever ``limit`` asks."""
        out: dict[tuple[str, str], HubServer] = {}
        offset = 0
        while True:
            got = await self._call("GET", f"/users?state=active&offset={offset}&limit={page}")
            users = got.data
            if got.status != 200 or not isinstance(users, list):
                return None
            for u in users:
                if isinstance(u, dict) and isinstance(u.get("name"), str):
                    out.update({(u["name"], name): s for name, s in self._server_models(u).items()})
            if not users:
                return out
            offset += len(users)

    async def servers(self, page: int = 200) -> dict[tuple[str, str], str] | None:
        """(user, server name) -> "ready" or what it is pending (:meth:`server_list`'s states); None
        if the Hub could not be read."""
        found = await self.server_list(page)
        return None if found is None else {key: server.state for key, server in found.items()}

    async def user_servers(self, user: str) -> dict[str, str] | None:
        """One user's servers as :meth:`servers` tells them ({} for a user the Hub does not have);
        None if the Hub could not be read."""
        got = await self._call("GET", f"/users/{quote(user, safe='')}", ok=(200, 404))
        if got.status == 404:
            return {}
        if got.status != 200 or not isinstance(got.data, dict):
            return None
        return self._server_states(got.data)

    async def server_state(self, user: str, server: str) -> str | None:
        """What the Hub says of one server: "ready", what it is pending ("spawn", "stop"), "" when it
        does not run it; None if the Hub could not be read."""
        servers = await self.user_servers(user)
        return None if servers is None else servers.get(server, "")

    async def start_server(self, user: str, server: str, user_options: dict[str, Any]) -> http.HTTPReply:
        """Ask the Hub to start a named server with ``user_options``; its spawner then asks this
        service to admit the session.  The Hub answers 201 (started) or 202 (starting), or the
        spawn's error (bad options 400, a refusal 403/409).  A user the Hub does not have yet (the
        group sync creates Hub users in the background) is created first."""
        path = f"/users/{quote(user, safe='')}/servers/{quote(server, safe='')}"
        got = await self._call("POST", path, user_options, ok=(201, 202))
        if got.status == 404:
            await self.sync_user(user)
            got = await self._call("POST", path, user_options, ok=(201, 202))
        return got

    async def stop_server(self, user: str, server: str) -> bool:
        """Ask the Hub to stop one server (its spawner then gives the allocation back)."""
        path = f"/users/{quote(user, safe='')}/" + (
            f"servers/{quote(server, safe='')}" if server else "server"
        )
        got = await self._call("DELETE", path, ok=(202, 204))
        return got.status in (202, 204)

    async def sync_all(self, names: list[str]) -> None:
        for name in names:
            await self.sync_user(name)
