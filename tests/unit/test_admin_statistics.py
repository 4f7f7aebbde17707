"""The Statistics page's units: the top table's times carry their own unit (fmt_hours) under
headings that name no unit, and the usage plots' y axis says its unit and reads in one that suits
the tallest bar (no axis of ticks that all read 0)."""

from __future__ import annotations

from labfleet.console import statistics as T
from labfleet.widgets.usage import UsageChart, axis_unit


def test_the_statistics_top_table_writes_times_with_their_units():
    report = {"rows": [
        {"user": "erin", "allocated": {"gpu.shares": 19.0, "cpu": 7200.0}, "used": {"gpu.shares": 0.0, "cpu": 900.0},
         "efficiency": {"gpu.shares": 0.0}, "sessions": 1},
        {"user": "alice", "allocated": {"gpu.shares": 12600.0}, "used": {"gpu.shares": 6300.0},
         "efficiency": {"gpu.shares": 0.5}, "sessions": 2},
    ]}  # fmt: skip
    assert T.TOP_COLUMNS[0] == "GPU time held"  # no unit in a heading over cells that carry theirs
    assert T.top_rows(report, "user") == [
        ["alice", "3.5 h", "1.75 h", "50 %", "0 h", "0 h", 2],
        ["erin", "19 s", "0 h", "0 %", "2 h", "0.25 h", 1],
    ]


def test_the_axis_reads_in_a_unit_that_suits_the_tallest_bar():
    assert axis_unit(0.0) == ("hours", 1.0)
    assert axis_unit(3 / 3600) == ("seconds", 3600.0)
    assert axis_unit(0.05) == ("minutes", 60.0)
    assert axis_unit(0.1) == ("hours", 1.0)


class Source:
    def __init__(self, cpu_seconds: float) -> None:
        self.cpu_seconds = cpu_seconds

    async def usage_report(self, **_: object) -> dict:
        return {"group_by": "project", "bucket": "none", "start": None, "end": None, "rows": [
            {"project": "acme/ml", "allocated": {"cpu": self.cpu_seconds}, "used": {"cpu": 1.0}},
        ]}  # fmt: skip


def test_a_plot_of_seconds_reads_in_seconds_and_says_so():
    chart = UsageChart(Source(3.0), 0, group_by="project", bucket="none", metric="cpu")
    chart.render({"group_by": "project", "bucket": "none", "rows": [
        {"project": "acme/ml", "allocated": {"cpu": 3.0}, "used": {"cpu": 1.0}}]})  # fmt: skip
    fig = chart.figures["report"]
    assert fig.axes[1].label == "seconds" and list(chart.bars["report"]["allocated"].y) == [3.0]
    assert chart.bars["report"]["used"].tooltip.labels == ["", "used (seconds)"]
    assert list(fig.axes[1].tick_values) == [0, 1, 2, 3, 4] and fig.axes[1].scale.max == 4
    assert chart.series["report"]["allocated"] == [round(3 / 3600, 4)]  # the series stay in hours
    assert "CPU time per project" in chart.summary.value and "3 s allocated" in chart.summary.value
    chart.render({"group_by": "project", "bucket": "none", "rows": [
        {"project": "acme/ml", "allocated": {"cpu": 7200.0}, "used": {"cpu": 0.0}}]})  # fmt: skip
    assert fig.axes[1].label == "hours" and list(chart.bars["report"]["allocated"].y) == [2.0]


def test_the_axis_ticks_are_round_and_its_top_is_the_scale():
    from labfleet.widgets.usage import nice_ticks

    assert nice_ticks(1.0) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert nice_ticks(3.0) == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert nice_ticks(11.25) == [0.0, 5.0, 10.0, 15.0, 20.0]
    assert nice_ticks(0.0008) == [0.0, 0.0002, 0.0004, 0.0006, 0.0008]
    assert nice_ticks(0.0) == [0.0, 1.0]
