"""``labfleet maintenance``: repairs of the fleet's bookkeeping.

Every command goes through :mod:`labfleet.compute.maintenance`, like the REST API's.
"""

from __future__ import annotations

import sys
from decimal import Decimal
from typing import Any

from labfleet.cli.base import Command, Group, flag
from labfleet.cli.output import format_table, json_text
from labfleet.core.slots import format_amount


def amount_text(slot: str, amount: Decimal) -> str:
    """An amount in its slot's unit as people read it (``2.5`` cores, ``8g`` of memory, ``3`` sessions)."""
    if slot.startswith("@"):
        return str(int(amount))
    sign = "-" if amount < 0 else ""
    return sign + format_amount(slot, abs(amount))


def _row(d: dict[str, Any]) -> list[str]:
    from labfleet.compute.maintenance import amount_of

    kind = d["scope_kind"].replace("_", " ")
    return [
        f"{kind} {d['scope']}",
        d["slot"],
        amount_text(d["slot"], amount_of(d["slot"], d["stored"])),
        amount_text(d["slot"], amount_of(d["slot"], d["true"])),
    ]


HUB_NOT_CHECKED = (
    "note: the Hub's servers were not checked (this command reads the database only, and cannot reach "
    "the Hub): POST /services/labfleet/api/maintenance/recalculate-usage, as a superadmin, also lists "
    "the servers the Hub runs with no live session, and a real run stops them"
)


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


class RecalcUsage(Command):
    name = "labfleet maintenance recalc-usage"
    summary = "Rebuild the usage ledger from the live sessions and report what differed."
    description = """Rebuild the usage ledger (what each domain, project, user, keypair and resource group
    holds, which admission checks quotas against) from the live sessions, and print every row where
    it differed: the scope, the slot, what the ledger said and what the sessions hold. With --dry-run,
    report only. Recorded in the audit log. The Hub's servers are not checked here (the command reads
    the database only): the service's POST /api/maintenance/recalculate-usage also lists the servers
    the Hub runs with no live session, and stops them on a real run."""
    options = (
        flag("--dry-run", "Report the differences without repairing them."),
        flag("--json", "Print the differences as JSON (a list of objects) instead of a table."),
    )
    examples = (
        "labfleet maintenance recalc-usage --dry-run",
        "labfleet maintenance recalc-usage",
    )

    def run(self) -> None:
        from labfleet.compute import maintenance

        dry_run = bool(self.opts.dry_run)
        result = self.transaction(lambda db: maintenance.recalculate_usage(db, self.actor, dry_run=dry_run))
        self.report(result, dry_run)
        if result["unaccounted_servers"] is None:  # on stderr: stdout stays the report (or its JSON)
            print(HUB_NOT_CHECKED, file=sys.stderr)

    def report(self, result: dict[str, Any], dry_run: bool) -> None:
        drift = result["drift"]
        if self.opts.json:
            self.out(json_text(drift))
            return
        if drift:
            self.out(format_table(["scope", "slot", "stored", "true"], (_row(d) for d in drift)))
        if not drift:
            self.out("The ledger matched the sessions: nothing to repair.")
        elif dry_run:
            self.out(f"Found {_rows(len(drift))} that differed; dry run: nothing repaired.")
        else:
            self.out(f"Repaired {_rows(result['repaired'])}.")


MAINTENANCE = Group(
    "labfleet maintenance",
    "Repair the fleet's bookkeeping.",
    {"recalc-usage": RecalcUsage},
)
