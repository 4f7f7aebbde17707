"""``labfleet keypair``: access key + secret key pairs for signed API requests.

Every change goes through :mod:`labfleet.tenancy.keypairs`, like the REST API's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from labfleet.cli.base import ACTIVE_OPTIONS, Command, Group, ListCommand, Option, flag, whole_number
from labfleet.cli.output import json_text

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

KEYPAIR_OPTIONS = (
    Option("--policy", "Name of a keypair resource policy (default: 'default').", metavar="POLICY"),
    Option("--rate-limit", "Requests allowed per 15-minute window.", metavar="N", convert=whole_number),
)


def _body(cmd: Command) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if cmd.opts.policy is not None:
        body["resource_policy"] = cmd.opts.policy
    if cmd.opts.rate_limit is not None:
        body["rate_limit"] = cmd.opts.rate_limit
    return body


class KeypairIssue(Command):
    name = "labfleet keypair issue"
    summary = "Issue a keypair for a user (the secret is shown once)."
    description = """Issue a keypair for a user and print its access key and secret key. The secret
    is shown this once and stored only encrypted: note it now."""
    examples = ("labfleet keypair issue alice --policy students --rate-limit 1000",)
    arguments = ("USER",)
    options = (*KEYPAIR_OPTIONS, flag("--json", "Print the keypair (with its secret) as JSON."))

    def run(self) -> None:
        from labfleet.tenancy import keypairs

        body = {"username": self.args[0], **_body(self)}

        def work(db: Session) -> dict[str, Any]:
            kp, secret = keypairs.issue(db, self.actor, body)
            return keypairs.keypair_view(kp, secret)

        view = self.transaction(work)  # committed before the secret is shown
        if self.opts.json:
            self.out(json_text(view))
            return
        self.out(
            f"Issued a keypair for {view['username']} "
            f"(policy {view['resource_policy']}, {view['rate_limit']} requests per 15 minutes)."
        )
        self.out(f"access key: {view['access_key']}")
        self.out(f"secret key: {view['secret_key']}")
        self.out("The secret key is shown only this once: store it now.")


class KeypairList(ListCommand):
    name = "labfleet keypair list"
    description = "List keypairs (never their secrets)."
    examples = ("labfleet keypair list --user alice",)
    options = (Option("--user", "Only this user's keypairs.", metavar="USER"),)

    def run(self) -> None:
        from labfleet.tenancy import directory, keypairs

        user = self.opts.user

        def work(db: Session) -> list[dict[str, Any]]:
            if user is not None:
                directory.readable_user(db, self.actor, user)
            return [keypairs.keypair_view(kp) for kp in keypairs.list_keypairs(db, self.actor, user)]

        self.emit(
            self.transaction(work),
            ["access-key", "user", "policy", "main", "active", "rate-limit", "created", "last-used"],
            lambda v: [
                v["access_key"],
                v["username"],
                v["resource_policy"],
                v["is_main"],
                v["is_active"],
                v["rate_limit"],
                v["created_at"],
                v["last_used"],
            ],
        )


class KeypairUpdate(Command):
    name = "labfleet keypair update"
    description = "Change a keypair's resource policy, rate limit or state."
    examples = ("labfleet keypair update AKXXXXXXXXXXXXXXXXXX --policy students",)
    arguments = ("ACCESS_KEY",)
    options = (*KEYPAIR_OPTIONS, *ACTIVE_OPTIONS)

    def run(self) -> None:
        from labfleet.tenancy import keypairs

        body = _body(self)
        if self.opts.active is not None:
            body["is_active"] = self.opts.active
        if not body:
            raise self.nothing_to_change("give --policy, --rate-limit, --active or --inactive")
        key = self.args[0]
        self.transaction(lambda db: keypairs.update(db, self.actor, key, body))
        self.out(f"Updated keypair {key}.")


class KeypairRevoke(Command):
    name = "labfleet keypair revoke"
    description = "Revoke a keypair: requests signed with it are refused from now on."
    arguments = ("ACCESS_KEY",)

    def run(self) -> None:
        from labfleet.tenancy import keypairs

        key = self.args[0]
        self.transaction(lambda db: keypairs.revoke(db, self.actor, key))
        self.out(f"Revoked keypair {key}.")


KEYPAIR = Group(
    "labfleet keypair",
    "Manage keypairs (access key + secret key for signed API requests).",
    {"issue": KeypairIssue, "list": KeypairList, "update": KeypairUpdate, "revoke": KeypairRevoke},
)
