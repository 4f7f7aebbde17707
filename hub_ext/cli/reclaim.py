"""``labfleet idle-checker``: the rules that reclaim idle sessions, and what they would reclaim now.

Every change goes through :mod:`labfleet.reclaim.rules`, like the REST API's (``/api/idle-checkers``).
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from typing import Any

from labfleet.cli.base import Command, Group, ListCommand, Option, UsageError


def _options(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise UsageError(f"--options: not JSON: {e}") from None
    if not isinstance(value, dict):
        raise UsageError("--options: a JSON object, e.g. '{\"timeout\": 1800}'")
    return value


def _binding(text: str) -> dict[str, str]:
    scope, sep, name = text.partition(":")
    if not sep or not name:
        raise UsageError(f"--bind {text!r}: SCOPE:NAME, e.g. resource_group:a100 or project:acme/ml")
    return {"scope": scope, "name": name}


BIND = Option(
    "--bind",
    "Bind it to a domain, project or resource group: domain:NAME, project:DOMAIN/PROJECT, "
    "resource_group:NAME (repeatable).",
    metavar="SCOPE:NAME",
    repeat=True,
)


class CheckerCreate(Command):
    name = "labfleet idle-checker create"
    description = """Make an idle checker: activity (no activity for "timeout" seconds) or utilization
    (the trusted samples over "window" seconds under "thresholds" in percent of what a session was
    given: cpu_util, mem, gpu_util, gpu_mem; "combine" and|or; "grace" seconds at the start). Both take
    "only_when_queue_waiting". It applies to the sessions of what it is bound to."""
    examples = (
        "labfleet idle-checker create gpu-idle --kind utilization "
        '--options \'{"window": 1200, "grace": 600, "thresholds": {"gpu_util": 5}}\' --bind resource_group:a100',
        "labfleet idle-checker create ml-30min --kind activity --options '{\"timeout\": 1800}' --bind project:acme/ml",
    )
    arguments = ("NAME",)
    options = (
        Option("--kind", "activity or utilization.", metavar="KIND"),
        Option("--options", "The checker's options, as a JSON object.", metavar="JSON"),
        Option("--description", "What it is for.", metavar="TEXT"),
        BIND,
    )

    def run(self) -> None:
        from labfleet.reclaim import rules

        if self.opts.kind is None or self.opts.options is None:
            raise UsageError(f"{self.name}: --kind and --options are required")
        body: dict[str, Any] = {
            "name": self.args[0],
            "kind": self.opts.kind,
            "options": _options(self.opts.options),
            "bindings": [_binding(b) for b in self.opts.bind or []],
        }
        if self.opts.description is not None:
            body["description"] = self.opts.description
        view = self.transaction(lambda db: rules.view(rules.create(db, self.actor, body)))
        self.out(f"Made idle checker {view['name']} ({view['kind']}, {len(view['bindings'])} binding(s)).")


def _row(v: dict[str, Any]) -> list[Any]:
    bound = ", ".join(f"{b['scope']}:{b['name']}" for b in v["bindings"]) or "nothing"
    return [v["name"], v["kind"], json.dumps(v["options"], sort_keys=True), bound]


class CheckerList(ListCommand):
    name = "labfleet idle-checker list"
    description = "List the idle checkers, their options and what they are bound to."

    def run(self) -> None:
        from labfleet.reclaim import rules

        views = self.transaction(lambda db: [rules.view(c) for c in rules.list_checkers(db, self.actor)])
        self.emit(views, ["checker", "kind", "options", "bound to"], _row)


class CheckerDelete(Command):
    name = "labfleet idle-checker delete"
    description = "Delete an idle checker; the sessions it applied to are judged without it from now on."
    arguments = ("NAME",)

    def run(self) -> None:
        from labfleet.reclaim import rules

        name = self.args[0]
        self.transaction(lambda db: rules.delete(db, self.actor, name))
        self.out(f"Deleted idle checker {name}.")


def _preview_row(v: dict[str, Any]) -> list[Any]:
    what = "reclaim" if v["would_reclaim"] else "keep (nobody waits)"
    return [
        v["session"][:8],
        f"{v['user']}/{v['server'] or '-'}",
        v["resource_group"],
        v["checker"],
        what,
        v["detail"],
    ]


class CheckerPreview(ListCommand):
    name = "labfleet idle-checker preview"
    description = """What the reclaimer would reclaim now, and why (a dry run: nothing changes). Rules
    that reclaim only when someone waits list the idle sessions they keep."""

    def run(self) -> None:
        from labfleet.reclaim import reclaimer

        now = datetime.now(timezone.utc)
        # The service's global default, as the service would read it here
        settings = reclaimer.Settings(
            default_idle_timeout=float(os.environ.get("LABFLEET_IDLE_TIMEOUT") or 0)
        )
        views = self.transaction(lambda db: reclaimer.preview(db, self.actor, now, settings)["sessions"])
        self.emit(views, ["session", "user/server", "group", "checker", "now", "why"], _preview_row)


IDLE_CHECKER = Group(
    "labfleet idle-checker",
    "Manage the rules that reclaim idle sessions.",
    {"create": CheckerCreate, "list": CheckerList, "delete": CheckerDelete, "preview": CheckerPreview},
)
