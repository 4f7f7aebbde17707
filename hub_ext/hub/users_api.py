"""The Hub's own user API, kept consistent with labfleet.

labfleet decides who exists and what role each user has; the Hub follows (the service creates and
deletes Hub users, the authenticator sets groups and roles at every login). So a rename, a
deletion, a user made, or an admin flag set through the Hub's REST API or its ``/hub/admin`` page
would leave the two apart: a renamed ``alice2`` labfleet does not know, a second Hub ``alice`` at
her next login, a deleted Hub user whose labfleet user lives on. Those requests are refused with
a message that says where to make the change, unless the labfleet service itself asks. Everything
else (reading users, starting and stopping servers, tokens) is the Hub's as before.

The authenticator registers these handlers (:meth:`Authenticator.get_handlers` come before the
Hub's own, so they answer these routes).
"""

from __future__ import annotations

from typing import Any

from jupyterhub.apihandlers.users import UserAPIHandler, UserListAPIHandler
from tornado import web

from labfleet.core.hubmap import SERVICE_NAME

WHERE = (
    "labfleet manages users: {what} in the Fleet admin console (Users), with `labfleet user ...`, or "
    "through the labfleet API (/services/labfleet/api/users); the Hub follows"
)


def _from_labfleet(handler: Any) -> bool:
    """Is the caller the labfleet service (which keeps the Hub in step)?"""
    who = handler.current_user
    return getattr(who, "kind", None) == "service" and getattr(who, "name", None) == SERVICE_NAME


def refusal(what: str) -> web.HTTPError:
    return web.HTTPError(403, WHERE.format(what=what))


class LabfleetUserListAPIHandler(UserListAPIHandler):
    async def post(self) -> None:
        if not _from_labfleet(self):
            raise refusal("create users")
        await super().post()


class LabfleetUserAPIHandler(UserAPIHandler):
    async def post(self, user_name: str) -> None:
        if not _from_labfleet(self):
            raise refusal("create users")
        await super().post(user_name)

    async def delete(self, user_name: str) -> None:
        if not _from_labfleet(self):
            raise refusal("delete users")
        await super().delete(user_name)

    async def patch(self, user_name: str) -> None:
        if not _from_labfleet(self):
            data = self.get_json_body() or {}
            if isinstance(data, dict) and "name" in data and data["name"] != user_name:
                raise refusal("rename users (a labfleet username does not change: make a new user)")
            if isinstance(data, dict) and "admin" in data:
                raise refusal("give or take admin rights by changing the user's role (superadmin)")
        await super().patch(user_name)


def handlers() -> list[tuple[str, type]]:
    """Routes that answer before the Hub's own (relative to the Hub's prefix)."""
    return [(r"/api/users", LabfleetUserListAPIHandler), (r"/api/users/([^/]+)", LabfleetUserAPIHandler)]
