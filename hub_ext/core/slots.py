"""Resource slots: exact arithmetic over named resource amounts.

A slot mapping such as ``{"cpu": 8, "mem": "32g", "gpu": 1, "gpu.shares": 2.5}`` is
parsed into :class:`ResourceSlots`, an immutable mapping of slot name to
:class:`~decimal.Decimal`.  Decimals, not floats, so that ``0.1 + 0.2`` shares
compare equal to ``0.3`` and a quota is never exceeded by rounding drift.

Pure module: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

# Slot names: "cpu", "mem", "gpu", "gpu.shares", per-model slots like "gpu:A100".
SLOT_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)?(:[A-Za-z0-9_.\-]{1,64})?$")

# The smallest step of each known slot; amounts must be whole multiples of it.
QUANTUM: dict[str, Decimal] = {
    "cpu": Decimal("0.001"),
    "mem": Decimal(1),
    "gpu": Decimal(1),
    "gpu.shares": Decimal("0.01"),
}
DEFAULT_QUANTUM = Decimal("0.01")

# No real cluster holds more than this of anything; bigger numbers are typos or attacks.
MAX_AMOUNT = Decimal(2) ** 62

_MEM_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
    "p": 2**50,
}
_MEM_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgtp]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_bytes(value: Any) -> int | None:
    """A size as people write it, in bytes: ``32g``, ``512 MiB``, ``1.5t``, ``1024`` (or an int); None
    when it is not one, or not a whole number of bytes.  labfleet's one size grammar: slots, the
    spawn form, the console's forms and the CLI read sizes with it; :func:`format_amount` writes it."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    m = _MEM_RE.match(str(value))
    if not m:
        return None
    amount = Decimal(m.group(1)) * _MEM_UNITS[m.group(2).lower()]
    return int(amount) if amount == amount.to_integral_value() else None


class SlotError(ValueError):
    """A slot mapping or amount that cannot be accepted; the message is for people."""


def base_slot(name: str) -> str:
    """The slot kind a name belongs to: ``gpu.shares:A100`` -> ``gpu.shares``."""
    return name.split(":", 1)[0]


def quantum_of(name: str) -> Decimal:
    return QUANTUM.get(base_slot(name), DEFAULT_QUANTUM)


def parse_amount(name: str, value: Any) -> Decimal:
    """Parse one slot amount; raise SlotError with a clear message when it is wrong."""
    if isinstance(value, bool) or value is None:
        raise SlotError(f"slot {name!r}: expected a number, got {value!r}")
    if base_slot(name) == "mem" and isinstance(value, str):
        m = _MEM_RE.match(value)
        if m:
            amount = Decimal(m.group(1)) * _MEM_UNITS[m.group(2).lower()]
        else:
            try:  # plain bytes in exponent form, as older rows stored them (2.147483648E+10)
                amount = Decimal(value.strip()) if "e" in value.lower() else Decimal("NaN")
            except InvalidOperation:
                amount = Decimal("NaN")
            if amount.is_nan():
                raise SlotError(f"slot 'mem': cannot read {value!r} (write e.g. 512m, 32g, 1.5t)")
    elif isinstance(value, (int, Decimal)):
        amount = Decimal(value)
    elif isinstance(value, float):
        # repr() gives the shortest decimal that round-trips: 0.1 -> "0.1", not 0.1000000000000000055...
        amount = Decimal(repr(value))
    elif isinstance(value, str):
        try:
            amount = Decimal(value.strip())
        except InvalidOperation:
            raise SlotError(f"slot {name!r}: {value!r} is not a number") from None
    else:
        raise SlotError(f"slot {name!r}: expected a number, got {type(value).__name__}")
    if not amount.is_finite():
        raise SlotError(f"slot {name!r}: {value!r} is not a finite number")
    if amount < 0:
        raise SlotError(f"slot {name!r}: {value!r} is negative")
    if amount > MAX_AMOUNT:
        raise SlotError(f"slot {name!r}: {value!r} is too large")
    q = quantum_of(name)
    if amount % q != 0:
        raise SlotError(f"slot {name!r}: {value!r} is not a multiple of {q}")
    return amount.normalize() if amount != 0 else Decimal(0)


def _to_json_number(name: str, amount: Decimal) -> int | float:
    if amount == amount.to_integral_value():
        return int(amount)
    return float(amount)


class ResourceSlots(Mapping[str, Decimal]):
    """An immutable mapping of slot name to exact amount.

    Missing slots read as zero in arithmetic; ``+``, ``-`` and comparisons work
    slot by slot.  ``a <= b`` means every slot of ``a`` fits into ``b``.
    """

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
        raw: dict[str, Any] = dict(data or {})
        raw.update(kwargs)
        parsed: dict[str, Decimal] = {}
        for name, value in raw.items():
            if not isinstance(name, str) or not SLOT_NAME_RE.match(name):
                raise SlotError(f"{name!r} is not a valid slot name")
            parsed[name] = value if isinstance(value, Decimal) and value >= 0 else parse_amount(name, value)
        self._data = parsed

    @classmethod
    def parse(cls, value: Any) -> ResourceSlots:
        """From a JSON object or a CLI string ``cpu=8,mem=32g,gpu.shares=2.5``."""
        if isinstance(value, ResourceSlots):
            return value
        if value is None:
            return cls()
        if isinstance(value, str):
            return cls(parse_slot_string(value))
        if isinstance(value, Mapping):
            return cls(value)
        raise SlotError(f"resource slots must be an object like {{'cpu': 2}}, not {type(value).__name__}")

    # Mapping protocol
    def __getitem__(self, name: str) -> Decimal:
        return self._data[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def get_amount(self, name: str) -> Decimal:
        return self._data.get(name, Decimal(0))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in sorted(self._data.items()))
        return f"ResourceSlots({inner})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        other_slots = ResourceSlots.parse(other)
        names = set(self._data) | set(other_slots)
        return all(self.get_amount(n) == other_slots.get_amount(n) for n in names)

    def __hash__(self) -> int:
        return hash(frozenset((k, v) for k, v in self._data.items() if v != 0))

    def __add__(self, other: Mapping[str, Any]) -> ResourceSlots:
        o = ResourceSlots.parse(other)
        return ResourceSlots({n: self.get_amount(n) + o.get_amount(n) for n in set(self) | set(o)})

    def __sub__(self, other: Mapping[str, Any]) -> ResourceSlots:
        """Slot-wise difference; raises SlotError if any slot would go negative."""
        o = ResourceSlots.parse(other)
        out = {}
        for n in set(self) | set(o):
            diff = self.get_amount(n) - o.get_amount(n)
            if diff < 0:
                raise SlotError(f"slot {n!r}: cannot take {o.get_amount(n)} from {self.get_amount(n)}")
            out[n] = diff
        return ResourceSlots(out)

    def __le__(self, other: Mapping[str, Any]) -> bool:
        o = ResourceSlots.parse(other)
        return all(v <= o.get_amount(n) for n, v in self._data.items())

    def __ge__(self, other: Mapping[str, Any]) -> bool:
        return ResourceSlots.parse(other) <= self

    def is_zero(self) -> bool:
        return all(v == 0 for v in self._data.values())

    def to_json(self) -> dict[str, int | float]:
        """For API responses: plain JSON numbers (integers where exact)."""
        return {n: _to_json_number(n, v) for n, v in sorted(self._data.items())}

    def to_db(self) -> dict[str, str]:
        """For storage: strings, so that no float ever touches a stored amount."""
        # format "f": normalize() turns 20g into 2.147483648E+10, which reads badly and
        # did not parse back as a memory size.
        return {n: format(v, "f") for n, v in sorted(self._data.items())}

    def to_cli(self) -> str:
        return ",".join(f"{n}={format_amount(n, v)}" for n, v in sorted(self._data.items()))


def format_amount(name: str, amount: Decimal) -> str:
    """Human form: memory in the largest exact binary unit, others as plain numbers."""
    if base_slot(name) == "mem" and amount:
        for unit in ("p", "t", "g", "m", "k"):
            size = _MEM_UNITS[unit]
            if amount >= size and amount % size == 0:
                return f"{int(amount // size)}{unit}"
        return str(int(amount))
    # format "f": never scientific notation (Decimal("1E+2") must print as 100).
    return format(amount.normalize(), "f") if amount else "0"


def parse_slot_string(text: str) -> dict[str, str]:
    """``cpu=8,mem=32g`` -> ``{"cpu": "8", "mem": "32g"}``; empty string -> {}."""
    out: dict[str, str] = {}
    text = text.strip()
    if not text:
        return out
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not name or not value.strip():
            raise SlotError(f"cannot read slot {part.strip()!r}: write NAME=AMOUNT, e.g. cpu=8,mem=32g")
        if name in out:
            raise SlotError(f"slot {name!r} is given twice")
        out[name] = value.strip()
    return out


def charged(slots: ResourceSlots) -> ResourceSlots:
    """What a request is charged against quotas: whole devices count as shares too.

    A ``gpu.shares`` cap then limits all GPU use (a device is one share), so it cannot be
    sidestepped by asking whole devices; a ``gpu`` cap still counts whole devices only.
    """
    gpu = slots.get_amount("gpu")
    return slots + ResourceSlots({"gpu.shares": gpu}) if gpu else slots


def over_limit(
    request: Mapping[str, Any],
    used: Mapping[str, Any],
    limit: Mapping[str, Any],
    *,
    unlimited_unspecified: bool,
) -> list[tuple[str, Decimal, Decimal]]:
    """Slots where ``used + request`` would exceed ``limit``.

    A slot the limit does not name is unlimited when ``unlimited_unspecified``
    (policy UNLIMITED), else zero (policy LIMITED).  Returns (slot, would_use, limit)
    for each offending slot, sorted by name; empty when the request fits.
    """
    req = ResourceSlots.parse(request)
    use = ResourceSlots.parse(used)
    lim = ResourceSlots.parse(limit)
    bad = []
    for name in sorted(req):
        want = req.get_amount(name)
        if want == 0:
            continue
        if name not in lim:
            if unlimited_unspecified:
                continue
            cap = Decimal(0)
        else:
            cap = lim.get_amount(name)
        total = use.get_amount(name) + want
        if total > cap:
            bad.append((name, total, cap))
    return bad
