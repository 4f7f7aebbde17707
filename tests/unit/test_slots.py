from decimal import Decimal

import pytest

from labfleet.core.slots import ResourceSlots, SlotError, over_limit, parse_slot_string


def test_exact_share_arithmetic():
    a = ResourceSlots({"gpu.shares": 0.1}) + ResourceSlots({"gpu.shares": 0.2})
    assert a == ResourceSlots({"gpu.shares": 0.3})
    assert a["gpu.shares"] == Decimal("0.3")


def test_memory_units_and_cli_string():
    s = ResourceSlots.parse("cpu=8,mem=32g,gpu=1,gpu.shares=2.5")
    assert s["mem"] == 32 * 2**30
    assert s["cpu"] == 8 and s["gpu"] == 1 and s["gpu.shares"] == Decimal("2.5")
    assert ResourceSlots.parse(s.to_cli()) == s
    assert s.to_json() == {"cpu": 8, "gpu": 1, "gpu.shares": 2.5, "mem": 32 * 2**30}
    assert ResourceSlots.parse(s.to_db()) == s


@pytest.mark.parametrize(
    "bad",
    [
        "mem=12zz",
        "cpu=-1",
        "gpu.shares=0.001",
        "cpu",
        "cpu=1,cpu=2",
        "Bad Name=1",
        "gpu=1.5",
        "cpu=nan",
        "cpu=1e400",
    ],
)
def test_bad_slot_strings(bad):
    with pytest.raises(SlotError):
        ResourceSlots.parse(bad)


@pytest.mark.parametrize(
    "bad", [{"cpu": True}, {"cpu": None}, {"cpu": [1]}, {"cpu": 10**30}, {"cpu": float("inf")}, [1, 2]]
)
def test_bad_slot_json(bad):
    with pytest.raises(SlotError):
        ResourceSlots.parse(bad)


def test_subtraction_never_negative():
    with pytest.raises(SlotError):
        ResourceSlots({"cpu": 1}) - ResourceSlots({"cpu": 2})
    assert ResourceSlots({"cpu": 2}) - ResourceSlots({"cpu": 2}) == ResourceSlots()


def test_over_limit_limited_and_unlimited():
    req = {"gpu.shares": "0.5", "cpu": 1}
    assert over_limit(req, {"gpu.shares": 2}, {"gpu.shares": "2.5"}, unlimited_unspecified=True) == []
    bad = over_limit(req, {"gpu.shares": "2.1"}, {"gpu.shares": "2.5"}, unlimited_unspecified=True)
    assert bad == [("gpu.shares", Decimal("2.6"), Decimal("2.5"))]
    # LIMITED: a slot the limit does not name is zero.
    assert over_limit(req, {}, {"gpu.shares": 1}, unlimited_unspecified=False) == [
        ("cpu", Decimal(1), Decimal(0))
    ]


def test_parse_slot_string_empty():
    assert parse_slot_string("") == {}


def test_cli_format_of_round_numbers():
    s = ResourceSlots({"cpu": 100, "gpu.shares": "1.50", "mem": 3 * 2**30})
    assert s.to_cli() == "cpu=100,gpu.shares=1.5,mem=3g"


def test_memory_round_trips_through_storage():
    for text in ("20g", "10g", "1000", "1.5t"):
        slots = ResourceSlots.parse({"mem": text, "cpu": "1E+1"})
        stored = slots.to_db()
        assert "E" not in stored["mem"] and "E" not in stored["cpu"]
        assert ResourceSlots.parse(stored) == slots
    # Rows written before the fix still read.
    assert ResourceSlots.parse({"mem": "2.147483648E+10"}).get_amount("mem") == 20 * 2**30
