"""The API-launch rendezvous: a session started through the API (POST /api/sessions from anyone but
the Hub) gets a Hub server, as from the spawn form; that server's spawner then asks for the
session (POST /api/sessions from the Hub), and its admission settles the first request's wait.

:class:`Launches` keeps the launches waiting for their spawner, by (user, server name), in the
service's memory: a restart forgets them, and their API requests have answered 202 by then.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from labfleet.compute import sessions
from labfleet.core import audit, database
from labfleet.core.authz import Actor
from labfleet.core.errors import LabfleetError
from labfleet.service.hubsync import HubSync

LAUNCH_TTL = 300.0  # seconds a launch waits for its spawner's admission before it is forgotten


@dataclass
class Waiting:
    """A session started through the API whose Hub server is starting: the spawner's admission
    settles it with the session's view (or the refusal), which the API request answers."""

    launch: sessions.Launch
    expires: float
    admitted: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def settle(self, view: dict[str, Any] | None, error: LabfleetError | None = None) -> None:
        if not self.admitted.done():
            self.admitted.set_result((view, error))


class Launches:
    """The launches waiting for their spawner, by (user, server name)."""

    def __init__(self) -> None:
        self._waiting: dict[tuple[str, str], Waiting] = {}
        self._background: set[asyncio.Future] = set()  # Hub calls that may outlive their request

    def add(self, launch: sessions.Launch, ttl: float = LAUNCH_TTL) -> Waiting:
        self._purge()
        waiting = Waiting(launch, time.monotonic() + ttl)
        self._waiting[(launch.username, launch.server)] = waiting
        return waiting

    def take(self, body: Any) -> Waiting | None:
        """The launch that the spawner's admission request ``body`` admits, if any (only once)."""
        self._purge()
        if not isinstance(body, dict):
            return None
        key = (body.get("username"), body.get("name"))
        waiting = self._waiting.get(key)  # type: ignore[arg-type]
        if waiting is None or not waiting.launch.matches(body):
            return None
        del self._waiting[key]  # type: ignore[arg-type]
        return waiting

    def discard(self, waiting: Waiting) -> None:
        key = (waiting.launch.username, waiting.launch.server)
        if self._waiting.get(key) is waiting:
            del self._waiting[key]

    def _purge(self) -> None:
        now = time.monotonic()
        for key, w in list(self._waiting.items()):
            if w.expires <= now:
                del self._waiting[key]

    async def start(
        self,
        actor: Actor,
        body: Any,
        session_factory: sessionmaker[Session],
        hub_sync: HubSync,
        wait: float,
    ) -> tuple[int, dict[str, Any]]:
        """POST /api/sessions from anyone but the Hub: start the session's Hub server, as the spawn form does.

        The request is checked as admission would check it, holding nothing; then the Hub is asked to
        start a named server for the user with the request as its spawn options, and its spawner asks
        for the session (charged to the keypair that signed the request). Answers 202 with the session
        as admitted and its server's name once the spawner has asked, or after ``wait``
        seconds without the session (``wait``); the Hub's refusal (bad options, a quota) is the answer otherwise.
        """
        if not hub_sync.enabled:
            raise LabfleetError("this service does not know the Hub: sessions start through the Hub", 503)
        db = session_factory()
        try:
            launch = sessions.prepare_launch(db, actor, body)
        finally:
            db.rollback()  # nothing is held until the spawner asks
            db.close()
        waiting = self.add(launch)
        hub_call = asyncio.ensure_future(
            hub_sync.start_server(launch.username, launch.server, launch.user_options)
        )
        self._background.add(hub_call)  # it may outlive this request: keep a reference
        hub_call.add_done_callback(self._background.discard)
        view: dict[str, Any] | None = None
        error: LabfleetError | None = None
        pending: set[asyncio.Future] = {waiting.admitted, hub_call}
        deadline = time.monotonic() + wait
        while pending and not waiting.admitted.done():
            done, pending = await asyncio.wait(
                pending, timeout=max(0.0, deadline - time.monotonic()), return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                break  # the wait's bound
            if hub_call in done and not waiting.admitted.done():
                reply = hub_call.result()
                if not reply.ok:
                    self.discard(waiting)
                    error = hub_refusal(reply)
                    break
        if waiting.admitted.done():
            view, error = waiting.admitted.result()
        with database.session_scope(session_factory) as audit_db:
            audit.record(
                audit_db,
                actor,
                "session.start",
                view["id"] if view else f"{launch.username}/{launch.server}",
                target_domain=view["domain"] if view else None,
                details={
                    "server": launch.server,
                    "project": launch.project,
                    **({"status": view["status"]} if view else {}),
                    **({"reason": error.message} if error else {}),
                },
                success=error is None,
            )
        if error is not None:
            raise error
        if view is None:
            return 202, {
                "id": None,
                "name": launch.server,
                "server": launch.server,
                "user": launch.username,
                "status": "STARTING",
                "status_reason": f"the Hub is starting server {launch.server}; its session shows in "
                "GET /api/sessions once the spawner asks for it",
            }
        return 202, {**view, "server": launch.server}


def hub_refusal(reply) -> LabfleetError:
    """The Hub's answer to a server start that did not start it, as this API's error."""
    if reply.status == 0:
        return LabfleetError(f"the Hub did not start the session: {reply.message}", 503)
    if 400 <= reply.status < 500:
        return LabfleetError(reply.message or f"the Hub answered {reply.status}", reply.status)
    return LabfleetError(f"the Hub did not start the session: {reply.message}", 502)
