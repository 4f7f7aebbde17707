"""``labfleet storage-host``: the directories where virtual folders live.

Every change goes through :mod:`labfleet.storage.hosts`, like the REST API's.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from labfleet.cli.base import Command, Group, ListCommand, Option, UsageError, byte_size, split_list
from labfleet.cli.output import bytes_text
from labfleet.core.slots import format_amount


class StorageHostAdd(Command):
    name = "labfleet storage-host add"
    description = """Add a storage host: a directory where virtual folders live (local, or a file
    system mounted at the same path on every node)."""
    examples = (
        "labfleet storage-host add nfs --path /mnt/nfs/vfolders --capacity 10t",
        "labfleet storage-host add scratch --path /srv/scratch "
        "--rights create-vfolder,mount-in-session,upload-file,download-file",
    )
    arguments = ("NAME",)
    options = (
        Option("--path", "The host's root directory (absolute; required).", metavar="DIR"),
        Option(
            "--capacity",
            "What it may hold, e.g. 10t (0 = what the disk has).",
            metavar="BYTES",
            convert=byte_size,
        ),
        Option(
            "--rights",
            """Rights everyone has on it, comma-separated (default none: grant them to domains,
            projects or keypair policies).""",
            metavar="RIGHTS",
        ),
        Option(
            "--owner",
            "UID:GID that owns what the API writes (the sessions' user, e.g. 1000:1000).",
            metavar="UID[:GID]",
        ),
    )

    def run(self) -> None:
        from labfleet.storage import hosts

        opts = self.opts
        if opts.path is None:
            raise UsageError("--path is required")
        body: dict[str, Any] = {"name": self.args[0], "path": opts.path}
        if opts.capacity is not None:
            body["capacity"] = opts.capacity
        if opts.rights is not None:
            body["default_permissions"] = split_list([opts.rights])
        if opts.owner is not None:
            uid, _, gid = opts.owner.partition(":")
            if not uid.isdigit() or (gid and not gid.isdigit()):
                raise UsageError("--owner takes UID or UID:GID, in numbers")
            body["owner_uid"], body["owner_gid"] = int(uid), int(gid or uid)
        view = self.transaction(
            lambda db: hosts.host_view(db, hosts.create_host(db, self.actor, body), admin=True)
        )
        self.out(f"Added storage host {view['name']} at {view['path']}.")


def _host_row(v: dict[str, Any]) -> list[Any]:
    return [
        v["name"],
        v["path"],
        bytes_text(v["capacity"]),
        format_amount("mem", Decimal(v["used"])),
        ",".join(v["default_permissions"]) or "-",
        "yes" if v["is_active"] else "no",
    ]


class StorageHostList(ListCommand):
    name = "labfleet storage-host list"
    description = "List the storage hosts, their capacity, use and default rights."

    def run(self) -> None:
        from labfleet.storage import hosts

        views = self.transaction(
            lambda db: [hosts.host_view(db, h, admin=True) for h in hosts.list_hosts(db)]
        )
        self.emit(views, ["name", "path", "capacity", "used", "everyone may", "active"], _host_row)


class StorageHostRemove(Command):
    name = "labfleet storage-host remove"
    description = "Remove a storage host that holds no folder (its directory is left on disk)."
    arguments = ("NAME",)

    def run(self) -> None:
        from labfleet.storage import hosts

        name = self.args[0]
        self.transaction(lambda db: hosts.delete_host(db, self.actor, name))
        self.out(f"Removed storage host {name}.")


STORAGE_HOST = Group(
    "labfleet storage-host",
    "Manage storage hosts (where virtual folders live).",
    {"add": StorageHostAdd, "list": StorageHostList, "remove": StorageHostRemove},
)
