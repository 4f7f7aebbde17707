"""What the ``labfleet`` command prints, and how: tables, cells, JSON, slots and sizes, URLs, help text.

Plain values in, text out. Nothing here knows about commands, options or the database
(:mod:`labfleet.cli.base` is the command framework, built on this; never the other way round),
and nothing imports SQLAlchemy or the logic modules at import time.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from labfleet.core.slots import ResourceSlots, format_amount

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


def one_line(text: object) -> str:
    return " ".join(str(text).split())


# ---------------------------------------------------------------- help

WIDTH = 80


def help_paragraph(text: str, indent: str = "") -> str:
    return textwrap.fill(one_line(text), WIDTH, initial_indent=indent, subsequent_indent=indent)


def help_entries(title: str, entries: Iterable[tuple[str, str]]) -> list[str]:
    lines = [f"{title}:"]
    for name, text in entries:
        lines += [name, help_paragraph(text, "    ")]
    return lines


def help_examples(examples: Sequence[str]) -> list[str]:
    if not examples:
        return []
    return ["", "Examples:" if len(examples) > 1 else "Example:", *(f"    {e}" for e in examples)]


# ---------------------------------------------------------------- tables and values


def format_table(headers: list[str], rows: Iterable[Iterable[Any]]) -> str:
    """Plain aligned columns, two spaces apart, header in upper case."""
    cells = [[cell(c, 48) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in cells:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def cell(value: Any, width: int | None = None) -> str:
    if value is None or value == "" or value == []:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    text = one_line(value)
    if width and len(text) > width:
        text = text[: width - 3] + "..."
    return text


def json_text(value: Any) -> str:
    """What ``--json`` prints: indented, keys sorted."""
    return json.dumps(value, indent=2, sort_keys=True)


def slots_text(slots: Any) -> str:
    return ResourceSlots.parse(slots or {}).to_cli() or "-"


def unlimited(n: int | None, zero: str = "unlimited") -> str:
    return zero if not n else str(n)


def bytes_text(n: int | None) -> str:
    return "unlimited" if not n else format_amount("mem", Decimal(n))


def shown_url(engine: Engine) -> str:
    """The database's URL as printed: without its password."""
    return engine.url.render_as_string(hide_password=True)
