"""``labfleet policy``: resource policies of keypairs, users and projects.

Every change goes through :mod:`labfleet.tenancy.policies`, like the REST API's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from labfleet.cli.base import (
    Command,
    Group,
    ListCommand,
    Option,
    UsageError,
    byte_size,
    check_slots,
    seconds,
    split_list,
    whole_number,
)
from labfleet.cli.output import bytes_text, slots_text, unlimited

KEYPAIR_OPTIONS = (
    Option("--slots", "(keypair) Total slots of all the keypair's sessions.", metavar="SLOTS"),
    Option(
        "--default-for-unspecified",
        "(keypair) LIMITED: slots not named in --slots are zero; UNLIMITED: they have no limit.",
        metavar="LIMITED|UNLIMITED",
    ),
    Option(
        "--max-concurrent-sessions",
        "(keypair) Running sessions at once (0 = unlimited).",
        metavar="N",
        convert=whole_number,
    ),
    Option(
        "--max-pending-sessions",
        "(keypair) Queued sessions at once (0 = unlimited).",
        metavar="N",
        convert=whole_number,
    ),
    Option(
        "--max-session-lifetime",
        "(keypair) Seconds a session may live, e.g. 86400 or 1d (0 = no limit).",
        metavar="SECONDS",
        convert=seconds,
    ),
    Option(
        "--idle-timeout",
        """(keypair) Seconds of idleness before a session is reclaimed, e.g. 30m (0 = never,
        -1 = fleet default).""",
        metavar="SECONDS",
        convert=seconds,
    ),
    Option(
        "--allowed-storage-hosts",
        "(keypair) Storage hosts its user has every right on, comma-separated; '' for none.",
        metavar="HOSTS",
    ),
)
FOLDER_OPTIONS = (
    Option(
        "--max-vfolder-count",
        "(user, project) Virtual folders it may own (0 = unlimited).",
        metavar="N",
        convert=whole_number,
    ),
    Option(
        "--max-quota-scope-size",
        "(user, project) Storage quota in bytes, e.g. 10g (0 = unlimited).",
        metavar="BYTES",
        convert=byte_size,
    ),
    Option(
        "--max-vfolder-size",
        "(user, project) One folder's size limit, e.g. 2g (0 = only the quota).",
        metavar="BYTES",
        convert=byte_size,
    ),
    Option(
        "--max-environments",
        "(user, project) Own environment images it may have (0 = unlimited; default 3).",
        metavar="N",
        convert=whole_number,
    ),
    Option(
        "--max-environment-bytes",
        "(user, project) Bytes its environment images may take together, e.g. 20g (0 = unlimited).",
        metavar="BYTES",
        convert=byte_size,
    ),
)

USER_OPTIONS = (
    Option(
        "--max-keypairs",
        "(user) Active keypairs its user may hold, the main one included (0 = unlimited; default 10).",
        metavar="N",
        convert=whole_number,
    ),
    Option(
        "--max-endpoints",
        "(user) Model serving endpoints its user may have (0 = unlimited).",
        metavar="N",
        convert=whole_number,
    ),
    Option(
        "--max-replicas-per-endpoint",
        "(user) Replicas of one of its user's endpoints (0 = unlimited).",
        metavar="N",
        convert=whole_number,
    ),
)


def _kind(value: str) -> str:
    from labfleet.tenancy import policies

    return policies.parse_kind(value)


def _body(cmd: Command, kind: str) -> dict[str, Any]:
    for options, applies in (
        (KEYPAIR_OPTIONS, ("keypair",)),
        (FOLDER_OPTIONS, ("user", "project")),
        (USER_OPTIONS, ("user",)),
    ):
        given = [o.flag for o in options if getattr(cmd.opts, o.key) is not None]
        if given and kind not in applies:
            raise UsageError(
                f"{', '.join(given)}: only for {' and '.join(applies)} policies, not {kind} policies"
            )
    body: dict[str, Any] = {}
    for option in (*KEYPAIR_OPTIONS, *FOLDER_OPTIONS, *USER_OPTIONS):
        key, value = option.key, getattr(cmd.opts, option.key)
        if value is None:
            continue
        if key == "slots":
            body["total_resource_slots"] = check_slots(value)
        elif key == "allowed_storage_hosts":
            body[key] = split_list([value])
        elif key == "default_for_unspecified":
            body[key] = value.upper()
        else:
            body[key] = value
    return body


def _row(kind: str) -> Callable[[dict[str, Any]], list[Any]]:
    if kind == "keypair":

        def row(v: dict[str, Any]) -> list[Any]:
            idle = v["idle_timeout"]
            return [
                v["name"],
                slots_text(v["total_resource_slots"]),
                v["default_for_unspecified"],
                unlimited(v["max_concurrent_sessions"]),
                unlimited(v["max_pending_sessions"]),
                unlimited(v["max_session_lifetime"], "off"),
                "default" if idle < 0 else ("never" if idle == 0 else idle),
                v["allowed_storage_hosts"],
            ]

        return row
    return lambda v: [
        v["name"],
        unlimited(v["max_vfolder_count"]),
        bytes_text(v["max_quota_scope_size"]),
        bytes_text(v["max_vfolder_size"]),
    ]


def _headers(kind: str) -> list[str]:
    if kind == "keypair":
        return ["name", "slots", "unspecified", "sessions", "pending", "lifetime", "idle", "storage-hosts"]
    return ["name", "vfolders", "quota", "folder-size"]


class PolicyCreate(Command):
    name = "labfleet policy create"
    summary = "Create a keypair, user or project resource policy."
    description = """Create a resource policy: keypair (slots, sessions, lifetimes, storage hosts),
    user or project (folder count, storage quota, environments)."""
    examples = (
        "labfleet policy create keypair students --slots cpu=4,mem=16g,gpu.shares=0.5 "
        "--default-for-unspecified LIMITED --max-concurrent-sessions 2 --idle-timeout 30m",
        "labfleet policy create user standard --max-vfolder-count 10 --max-quota-scope-size 50g "
        "--max-keypairs 3",
    )
    arguments = ("KIND", "NAME")
    options = (*KEYPAIR_OPTIONS, *FOLDER_OPTIONS, *USER_OPTIONS)

    def run(self) -> None:
        from labfleet.tenancy import policies

        kind = _kind(self.args[0])
        body = {"name": self.args[1], **_body(self, kind)}
        view = self.transaction(
            lambda db: policies.policy_view(kind, policies.create_policy(db, self.actor, kind, body))
        )
        self.out(f"Created {kind} resource policy {view['name']}.")


class PolicyList(ListCommand):
    name = "labfleet policy list"
    description = "List the resource policies of one kind: keypair, user or project."
    examples = ("labfleet policy list keypair",)
    arguments = ("KIND",)

    def run(self) -> None:
        from labfleet.tenancy import policies

        kind = _kind(self.args[0])
        views = self.transaction(
            lambda db: [policies.policy_view(kind, p) for p in policies.list_policies(db, self.actor, kind)]
        )
        self.emit(views, _headers(kind), _row(kind))


class PolicyUpdate(Command):
    name = "labfleet policy update"
    description = "Change a resource policy."
    examples = ("labfleet policy update keypair students --max-concurrent-sessions 3",)
    arguments = ("KIND", "NAME")
    options = (*KEYPAIR_OPTIONS, *FOLDER_OPTIONS, *USER_OPTIONS)

    def run(self) -> None:
        from labfleet.tenancy import policies

        kind, name = _kind(self.args[0]), self.args[1]
        body = _body(self, kind)
        if not body:
            raise self.nothing_to_change("see labfleet policy update --help")
        self.transaction(lambda db: policies.update_policy(db, self.actor, kind, name, body))
        self.out(f"Updated {kind} resource policy {name}.")


class PolicyDelete(Command):
    name = "labfleet policy delete"
    description = "Delete a resource policy that nothing uses."
    arguments = ("KIND", "NAME")

    def run(self) -> None:
        from labfleet.tenancy import policies

        kind, name = _kind(self.args[0]), self.args[1]
        self.transaction(lambda db: policies.delete_policy(db, self.actor, kind, name))
        self.out(f"Deleted {kind} resource policy {name}.")


POLICY = Group(
    "labfleet policy",
    "Manage resource policies (kinds: keypair, user, project).",
    {"create": PolicyCreate, "list": PolicyList, "update": PolicyUpdate, "delete": PolicyDelete},
)
