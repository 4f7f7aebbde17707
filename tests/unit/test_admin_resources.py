"""The Resources and Scheduler pages' pure parts, without a kernel: the per-GPU occupancy map built
from ``/api/nodes`` and ``/api/sessions`` (shares per device, several sessions on one device, whole
devices, what other domains hold, the free part), its SVG, the nodes' and groups' tables, the
group editor's PATCH body and its GPU overuse policy, the sessions over their GPU share, and the
queue's rows with why each session waits."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone

import ipywidgets as W
import pytest

from labfleet.console import gpuoveruse as O
from labfleet.console import resources as R
from labfleet.console import scheduler as S
from labfleet.console.console import ServiceError
from labfleet.core import capacity as C

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=timezone.utc)
GIB = 2**30


def device(uuid, index, allocated=0.0, model="A100-80GB"):
    return {
        "uuid": uuid,
        "index": index,
        "model": model,
        "memory_bytes": 80 * GIB,
        "kind": "gpu",
        "capacity": 1,
        "allocated": allocated,
        "free": round(1 - allocated, 2),
    }


def node(name, devices, cpu=(1.0, 8.0), mem=(4 * GIB, 64 * GIB), group="default", status="ALIVE"):
    return {
        "name": name,
        "resource_group": group,
        "status": status,
        "plugin": "mock",
        "capacity": {"cpu": cpu[1], "mem": mem[1], "gpu": len(devices)},
        "allocated": {"cpu": cpu[0], "mem": mem[0], "gpu.shares": sum(d["allocated"] for d in devices)},
        "free": {"cpu": cpu[1] - cpu[0], "mem": mem[1] - mem[0]},
        "devices": devices,
        "last_seen": (NOW - timedelta(seconds=12)).isoformat(),
    }


def session(sid, user, devices, status="RUNNING", created="2026-11-24T10:00:00+00:00", node_name="hub"):
    return {
        "id": sid,
        "user": user,
        "project": f"acme/{user}-p",
        "domain": "acme",
        "status": status,
        "node": node_name,
        "created_at": created,
        "devices": [{"uuid": u, "index": 0, "model": "A100-80GB", "shares": s} for u, s in devices],
    }


# ---------------------------------------------------------------- the occupancy builder


def test_shares_per_device_and_several_sessions_on_one_device():
    nodes = [node("hub", [device("GPU-a", 0, 0.75), device("GPU-b", 1, 1.0)])]
    sessions = [
        session("s-late", "bob", [("GPU-a", 0.25)], created="2026-11-24T11:00:00+00:00"),
        session("s-early", "alice", [("GPU-a", 0.5)], created="2026-11-24T09:00:00+00:00"),
        session("s-whole", "carol", [("GPU-b", 1.0)]),
    ]
    a, b = R.occupancy(nodes, sessions)
    # GPU-a: two holders, oldest first, and a quarter free
    assert [(s.session, s.user, s.shares) for s in a.segments] == [
        ("s-early", "alice", 0.5),
        ("s-late", "bob", 0.25),
    ]
    assert (a.held, a.others, a.free) == (0.75, 0.0, 0.25)
    # GPU-b: one whole device, nothing free
    assert [(s.user, s.shares) for s in b.segments] == [("carol", 1.0)]
    assert (b.held, b.free) == (1.0, 0.0)
    assert a.title == "hub · GPU 0 · A100-80GB (80 GiB)"


def test_a_session_with_several_whole_devices_is_on_each():
    nodes = [node("hub", [device("GPU-b", 1, 1.0), device("GPU-a", 0, 1.0)])]
    bars = R.occupancy(nodes, [session("s2", "alice", [("GPU-a", 1.0), ("GPU-b", 1.0)])])
    assert [b.index for b in bars] == [0, 1]  # by index, whatever order the node lists them in
    assert all([(s.session, s.shares) for s in b.segments] == [("s2", 1.0)] for b in bars)


def test_pending_and_ended_sessions_hold_nothing_and_idle_devices_are_all_free():
    nodes = [node("hub", [device("GPU-a", 0, 0.0)]), node("n2", [device("GPU-c", 0, 0.0)])]
    sessions = [
        session("p", "alice", [], status="PENDING"),
        session("t", "alice", [("GPU-a", 0.5)], status="TERMINATED"),  # a stale view: not drawn
    ]
    bars = R.occupancy(nodes, sessions)
    assert [(b.node, b.segments, b.free) for b in bars] == [("hub", (), 1.0), ("n2", (), 1.0)]
    assert R.occupancy_summary(bars) == {"devices": 2, "held": 0.0, "others": 0.0, "free": 2.0, "idle": 2}


def test_what_other_domains_hold_is_counted_but_not_named():
    """A domain admin sees only their domain's sessions: the rest of the device's load is "others"."""
    nodes = [node("hub", [device("GPU-a", 0, 0.9)])]
    (bar,) = R.occupancy(nodes, [session("mine", "alice", [("GPU-a", 0.4)])])
    assert (bar.held, bar.others, bar.free) == (0.4, 0.5, 0.1)
    svg = R.occupancy_svg([bar])
    assert 'class="lf-others" data-shares="0.5"' in svg
    assert "bob" not in svg


def test_the_svg_names_each_holder_and_the_free_part():
    nodes = [node("hub", [device("GPU-a", 0, 0.75), device("GPU-b", 1, 0.0)])]
    sessions = [session("s1", "alice", [("GPU-a", 0.5)]), session("s2", "bob<x>", [("GPU-a", 0.25)])]
    bars = R.occupancy(nodes, sessions)
    svg = R.occupancy_svg(bars)
    root = ET.fromstring(svg)  # well-formed (escaped names included)
    ns = {"s": "http://www.w3.org/2000/svg"}
    rows = root.findall("s:g[@class='lf-device']", ns)
    assert [r.get("data-uuid") for r in rows] == ["GPU-a", "GPU-b"]
    segs = rows[0].findall("s:g[@class='lf-seg']", ns)
    assert [(g.get("data-user"), g.get("data-shares"), g.get("data-session")) for g in segs] == [
        ("alice", "0.5", "s1"),
        ("bob<x>", "0.25", "s2"),
    ]
    # Widths are proportional to the shares: half the bar, then a quarter
    widths = [float(g.find("s:rect", ns).get("width")) for g in segs]
    assert widths == [R.BAR_W * 0.5, R.BAR_W * 0.25]
    assert rows[0].find("s:g[@class='lf-free']", ns).get("data-shares") == "0.25"
    assert rows[1].find("s:g[@class='lf-free']", ns).get("data-shares") == "1"
    # Hover titles say which session holds what, and how much memory that is
    assert "alice holds 0.5 of this device: session s1" in svg and "about 40 GiB" in svg
    # A colour per holder, in order of appearance
    assert list(R.holder_colors(bars)) == ["alice", "bob<x>"]
    assert R.holder_rows(bars)[0] == ["hub", "0 (A100-80GB)", "alice", "acme/alice-p", "s1", "RUNNING", "0.5"]


def test_no_device_draws_a_note():
    svg = R.occupancy_svg([])
    ET.fromstring(svg)
    assert "No device in reach" in svg


def test_node_rows_count_what_each_node_holds():
    nodes = [node("hub", [device("GPU-a", 0, 0.5), device("GPU-b", 1, 0.0)], cpu=(1.5, 2.0))]
    rows = R.node_rows(nodes, [session("s1", "alice", [("GPU-a", 0.5)])], NOW)
    (row,) = rows
    assert row["cpu"] == (1.5, 2.0) and row["gpu"] == (0.5, 2.0) and row["sessions"] == 1
    assert row["models"] == "A100-80GB × 2" and row["last_seen"] == "12 s ago"
    table = R.nodes_html(rows)
    assert "1.5 of 2" in table and "4 GiB of 64 GiB" in table and "0.5 of 2" in table


def test_node_rows_show_the_mps_daemon_and_why():
    failed = {
        **node("gpu1", []),
        "mps": {"state": "failed", "reason": "x<y is not on PATH", "pipe_dir": None},
    }
    on = {**node("gpu2", []), "mps": {"state": "on", "reason": None, "pipe_dir": "/run/labfleet/mps"}}
    rows = R.node_rows([failed, on], [], NOW)
    assert [(r["mps"], r["mps_reason"]) for r in rows] == [("failed", "x<y is not on PATH"), ("on", "")]
    table = R.nodes_html(rows)
    assert "<th>MPS</th>" in table and "lf-badge-bad'>failed" in table and "x&lt;y is not on PATH" in table
    assert "lf-badge-ok'>on" in table


# ---------------------------------------------------------------- resource groups


GROUP = {
    "name": "a100",
    "description": "big GPUs",
    "is_public": False,
    "scheduler": "fifo",
    "placement": "pack",
    "allowed_session_types": ["batch", "interactive"],
    "pending_timeout": 0,
    "grants": [{"kind": "domain", "target": "acme"}],
    "nodes": ["hub"],
}


def test_grants_read_back_as_written():
    assert R.parse_grants(R.fmt_grants(GROUP["grants"])) == GROUP["grants"]
    assert R.parse_grants("domain:acme, project:acme/ml\nuser:bob user:bob") == [
        {"kind": "domain", "target": "acme"},
        {"kind": "project", "target": "acme/ml"},
        {"kind": "user", "target": "bob"},
    ]
    for bad in ("acme", "team:acme", "project:ml", "user:"):
        with pytest.raises(ValueError):
            R.parse_grants(bad)


def test_the_patch_holds_only_what_changes():
    same = {
        "description": "big GPUs",
        "is_public": False,
        "scheduler": "fifo",
        "placement": "pack",
        "allowed_session_types": ["interactive", "batch"],
        "pending_timeout": 0,
        "grants": "domain:acme",
    }
    assert R.group_patch(GROUP, same) == {}
    changed = dict(same, scheduler="drf", pending_timeout=600, grants="domain:acme project:beta/web")
    assert R.group_patch(GROUP, changed) == {
        "scheduler": "drf",
        "pending_timeout": 600,
        "grants": [{"kind": "domain", "target": "acme"}, {"kind": "project", "target": "beta/web"}],
    }
    with pytest.raises(ValueError, match="pending timeout"):
        R.group_patch(GROUP, dict(same, pending_timeout=-1))
    with pytest.raises(ValueError, match="at least one"):
        R.group_patch(GROUP, dict(same, allowed_session_types=[]))
    with pytest.raises(ValueError, match="scheduler"):
        R.group_patch(GROUP, dict(same, scheduler="random"))


def test_groups_table():
    table = R.groups_html([GROUP])
    assert "granted only" in table and "domain:acme" in table and "waits for ever" in table
    # The group's answer to a session over its GPU share, with what it means (auto when unsaid)
    assert "data-policy='auto'" in table and "kill when the device is shared, warn when alone" in table
    stop = R.groups_html([dict(GROUP, gpu_overuse="stop")])
    assert "over its GPU share" in stop and "data-policy='stop'" in stop and "stop the session" in stop


def test_the_patch_holds_the_gpu_overuse_policy_and_refuses_one_the_service_would():
    same = {"gpu_overuse": "auto", "scheduler": "fifo"}
    assert R.group_patch(GROUP, same) == {}  # a group from before the policy reads as auto
    assert R.group_patch(dict(GROUP, gpu_overuse="warn"), same) == {"gpu_overuse": "auto"}
    assert R.group_patch(GROUP, dict(same, gpu_overuse="kill")) == {"gpu_overuse": "kill"}
    # The service's own words (labfleet.core.validate.check_choice): 400 there, nothing sent here
    with pytest.raises(
        ValueError, match=r"^gpu_overuse must be one of auto, warn, kill, stop \(got 'nuke'\)$"
    ):
        R.group_patch(GROUP, dict(same, gpu_overuse="nuke"))


class FakeGroups:
    """The service's resource groups for the editor: PATCHes recorded, or refused with ``refuse``."""

    def __init__(self, role: str, refuse: str = "") -> None:
        self.role, self.refuse, self.sent = role, refuse, []

    def patch(self, path, body):
        if self.refuse:
            raise ServiceError(self.refuse, 400)
        self.sent.append((path, body))
        return body


def _widgets(box, kind):
    found = []
    for child in getattr(box, "children", ()):
        found += [child] if isinstance(child, kind) else _widgets(child, kind)
    return found


def _overuse_of(box) -> W.Dropdown:
    (found,) = [d for d in _widgets(box, W.Dropdown) if d.description == "Over GPU share"]
    return found


def test_the_editor_shows_and_saves_the_gpu_overuse_policy():
    client, saved = FakeGroups("superadmin"), []
    box = R.group_editor([dict(GROUP, gpu_overuse="warn")], client, lambda text, g: saved.append(text))
    overuse = _overuse_of(box)
    assert overuse.value == "warn" and not overuse.disabled
    assert [v for _, v in overuse.options] == ["auto", "warn", "kill", "stop"]
    assert overuse.label == "warn: warn the session and audit it"
    overuse.value = "stop"
    (save,) = [b for b in _widgets(box, W.Button) if b.description == "Save changes"]
    save.click()
    assert client.sent == [("/resource-groups/a100", {"gpu_overuse": "stop"})]
    assert saved == ["Saved resource group a100: gpu_overuse."]


def test_the_services_refusal_of_a_policy_shows_in_its_words_and_readers_cannot_change_it():
    refusal = "gpu_overuse must be one of auto, warn, kill, stop (got 'nuke')"
    client, saved = FakeGroups("superadmin", refuse=refusal), []
    box = R.group_editor([GROUP], client, lambda text, g: saved.append(text))
    assert _overuse_of(box).value == "auto"
    _overuse_of(box).value = "kill"
    (save,) = [b for b in _widgets(box, W.Button) if b.description == "Save changes"]
    save.click()
    assert saved == [] and client.sent == []
    notes = " ".join(h.value for h in _widgets(box, W.HTML))
    assert (
        "The labfleet service said: gpu_overuse must be one of auto, warn, kill, stop (got &#x27;nuke&#x27;)"
        in notes
    )
    for role in ("monitor", "admin"):
        assert _overuse_of(R.group_editor([GROUP], FakeGroups(role), print)).disabled, role


# ---------------------------------------------------------------- sessions over their GPU share


def held(sid, user, shares, gpu_mem, status="RUNNING", reason=None, whole=False):
    """(a session of ``shares`` of an 80 GiB device, its live reading of ``gpu_mem`` bytes)."""
    s = session(sid, user, [("GPU-0", shares)], status=status)
    s["devices"][0]["memory"] = 80 * GIB
    s.update(name=f"{user}-nb", resource_group="default", status_reason=reason)
    if whole:
        s["devices"].append(dict(s["devices"][0], uuid="GPU-1", index=1))
    reading = {"session": sid, "user": user, "sampled_at": (NOW - timedelta(seconds=5)).isoformat()}
    return s, dict(reading, gpu_mem=gpu_mem)


def test_only_fractional_sessions_measured_above_their_share_are_listed_most_over_first():
    cases = [
        held("s1", "alice", 0.25, 30 * GIB),  # 20 GiB share, 10 GiB over
        held("s2", "bob", 0.5, 40 * GIB),  # exactly its share: not over
        held("s3", "carol", 0.25, 21 * GIB),  # 1 GiB over (within the service's tolerance: still over)
        held("s4", "dave", 1.0, 79 * GIB),  # a whole device is never judged
        held("s5", "erin", 0.25, None),  # not measured
        held("s6", "fay", 0.25, 70 * GIB, status="PENDING"),  # holds nothing now
        held("s7", "gus", 1.0, 150 * GIB, whole=True),  # two whole devices
    ]
    sessions, live = [c[0] for c in cases], [c[1] for c in cases]
    sessions.append(session("s8", "hal", [("GPU-0", 0.25)]))  # never sampled: no reading at all
    rows = O.overuse_rows(sessions, live, [], NOW)
    assert [(r["session"], r["share_bytes"], r["held_bytes"]) for r in rows] == [
        ("s1", 20 * GIB, 30 * GIB),
        ("s3", 20 * GIB, 21 * GIB),
    ]
    r = rows[0]
    assert (r["user"], r["node"], r["device"], r["uuid"], r["measured"], r["action"]) == (
        "alice",
        "hub",
        "GPU 0 (A100-80GB)",
        "GPU-0",
        "5 s ago",
        "none yet",
    )
    table = O.overuse_html(rows)
    assert "data-session='s1'" in table and f"data-share-bytes='{20 * GIB}'" in table
    assert "20 GiB" in table and "30 GiB" in table and "10 GiB" in table and "0.25 of the device" in table
    assert O.overuse_html([]).startswith('<div class="lf-admin lf-overuse-none">none')


def test_the_last_action_comes_from_the_audit_else_the_status_reason():
    s, reading = held("s1", "alice", 0.25, 30 * GIB, reason="gpu-overuse warning: its processes held 30 GiB")
    other, other_reading = held("s2", "bob", 0.25, 30 * GIB)
    # Newest first, as GET /api/audit answers; another action on the same target is not the backstop's
    audit = [
        {"action": "session.stop", "target": "s1", "timestamp": NOW.isoformat(), "details": {}},
        {
            "action": "session.gpu-overuse",
            "target": "s1",
            "timestamp": (NOW - timedelta(seconds=120)).isoformat(),
            "details": {
                "action": "kill",
                "killed": [{"pid": 4242, "cmdline": "python train.py", "mem_bytes": 10 * GIB}],
                "not_killed": [{"pid": 4243, "cmdline": "", "error": "it had already exited"}],
            },
        },
        {
            "action": "session.gpu-overuse",
            "target": "s1",
            "timestamp": (NOW - timedelta(seconds=600)).isoformat(),
            "details": {"action": "warn"},
        },
        {
            "action": "session.gpu-overuse",
            "target": "s2",
            "timestamp": (NOW - timedelta(seconds=30)).isoformat(),
            "details": {"action": "warn", "wanted": "kill", "why_not": "the node is run by an agent"},
        },
    ]
    rows = O.overuse_rows([s, other], [reading, other_reading], audit, NOW)
    assert {r["session"]: r["action"] for r in rows} == {
        "s1": "kill, 2 min ago: killed 4242 (python train.py, 10 GiB); not killed 4243 (it had already exited)",
        "s2": "warn, 30 s ago (wanted kill: the node is run by an agent)",
    }
    # Without an audit entry the viewer may read: the backstop's status reason, else none yet
    assert (
        O.last_overuse_action([], s["status_reason"], NOW) == "gpu-overuse warning: its processes held 30 GiB"
    )
    assert O.last_overuse_action([], "the Hub started it", NOW) == "none yet"


class FakeLive:
    """The service's lists the section reads, with the calls made."""

    def __init__(self, live, audit=(), refuse_audit=False):
        self.live, self.audit, self.refuse_audit, self.calls = live, list(audit), refuse_audit, []

    def everything(self, path, **params):
        self.calls.append(("everything", path, params))
        return self.live

    def get(self, path, **params):
        self.calls.append(("get", path, params))
        if self.refuse_audit:
            raise ServiceError("you may not read the audit log", 403)
        return self.audit


def test_the_section_reads_the_audit_only_when_a_session_is_over():
    s, reading = held("s1", "alice", 0.25, 10 * GIB)
    client = FakeLive([reading])
    heading, body = O.overuse_section(client, [s], NOW)
    assert "Sessions over their GPU share" in heading.value and "lf-overuse-none" in body.value
    assert client.calls == [("everything", "/usage/live", {})]
    over, over_reading = held("s1", "alice", 0.25, 30 * GIB, reason="gpu-overuse kill: killed 4242")
    client = FakeLive([over_reading], refuse_audit=True)
    _, body = O.overuse_section(client, [over], NOW)
    assert client.calls[-1] == ("get", "/audit", {"action": "session.gpu-overuse", "limit": 1000})
    assert "data-session='s1'" in body.value and "gpu-overuse kill: killed 4242" in body.value


# ---------------------------------------------------------------- the queue


def test_need_reads_slots_as_the_scheduler_does():
    assert C.need_of({"cpu": 0.5, "gpu.shares": 2}) == C.Need(cpu=0.5, gpu=2)
    assert C.need_of({"gpu.shares": 0.25, "mem": GIB}) == C.Need(mem=GIB, shares=0.25)
    assert C.need_of({"gpu:H100": 1}) == C.Need(gpu=1, model="H100")


def test_capacity_note_names_what_is_short():
    nodes = [
        node("hub", [device("GPU-a", 0, 1.0), device("GPU-b", 1, 0.5)], cpu=(1.0, 2.0), mem=(0, 8 * GIB))
    ]
    assert S.capacity_note({"gpu": 2}, nodes) == (
        "short of GPUs: asks 2 whole GPUs; none is free on any node"
    )
    assert S.capacity_note({"gpu.shares": 0.75}, nodes) == (
        "short of GPU share: asks 0.75 of one device; the largest free part is 0.5 (hub GPU 1)"
    )
    assert S.capacity_note({"gpu.shares": 0.5}, nodes).startswith("fits on hub now")
    # whole-gpu placement rounds a fraction up to a device
    assert "whole-gpu rounds up" in S.capacity_note({"gpu.shares": 0.5}, nodes, "whole-gpu")
    assert S.capacity_note({"cpu": 4, "mem": 16 * GIB}, nodes) == (
        "short of CPU: asks 4 cores; at most 1 free on one node; memory: asks 16 GiB; at most 8 GiB free on one node"
    )
    assert "nothing can start" in S.capacity_note({"cpu": 1}, [])
    down = [dict(nodes[0], status="LOST")]
    assert S.capacity_note({"cpu": 1}, down).startswith(
        "no node of the group is alive and schedulable (1 in all)"
    )


def test_capacity_split_over_two_nodes_is_no_fit():
    nodes = [
        node("n1", [device("GPU-a", 0, 0.0)], cpu=(2.0, 2.0)),
        node("n2", [device("GPU-b", 0, 1.0)], cpu=(0.0, 8.0)),
    ]
    assert S.capacity_note({"gpu": 1, "cpu": 4}, nodes) == (
        "short of each resource is free somewhere, but no single node has all of it free at once"
    )


def test_queue_rows_by_position_with_waits_and_reasons():
    group = dict(GROUP, name="default", pending_timeout=600)
    nodes = [node("hub", [device("GPU-a", 0, 1.0), device("GPU-b", 1, 0.0)]), node("x", [], group="other")]
    entries = [
        {
            "id": "s-b",
            "user": "erin",
            "project": "beta/web",
            "domain": "beta",
            "type": "batch",
            "slots": {"gpu": 2},
            "status_reason": "waiting for free capacity in resource group default",
            "created_at": (NOW - timedelta(seconds=30)).isoformat(),
            "position": 2,
        },
        {
            "id": "s-a",
            "user": "alice",
            "project": "acme/ml",
            "domain": "acme",
            "type": "interactive",
            "slots": {"cpu": 1, "gpu": 2},
            "status_reason": "waiting for free capacity in resource group default",
            "created_at": (NOW - timedelta(seconds=590)).isoformat(),
            "position": 1,
        },
    ]
    q = S.group_queue(group, entries, nodes, NOW)
    first, second = q.rows
    assert (first.position, first.id, first.user) == (1, "s-a", "alice")
    assert first.asks == "cpu 1, gpu 2" and first.waited == 590 and first.cancel_in == 10
    assert first.capacity == "short of GPUs: asks 2 whole GPUs; at most 1 free on one node (hub)"
    assert second.reason.startswith("waiting for free capacity")
    assert q.oldest == 590
    # The waiting bar turns orange near the timeout and marks it
    late = S.waiting_html(first, q.oldest, q.pending_timeout)
    assert "--jp-warn-color1" in late and "cancelled in 10 s" in late
    early = S.waiting_html(second, q.oldest, q.pending_timeout)
    assert "--jp-warn-color1" not in early and "30 s" in early
    assert "now: short of GPUs" in S.why_html(first)
    chart = S.queues_chart_svg([q, S.group_queue(dict(GROUP, name="idle"), [], nodes, NOW)])
    ET.fromstring(chart)
    assert 'data-group="default" data-waiting="2"' in chart and "oldest 9 min 50 s" in chart
    assert 'data-group="idle" data-waiting="0"' in chart


def test_no_timeout_means_never_cancelled():
    (row,) = S.queue_rows(
        [{"id": "s", "position": 1, "slots": {}, "created_at": "2026-11-24T11:59:00"}],
        dict(GROUP, pending_timeout=0),
        [],
        NOW,
    )
    assert row.cancel_in is None and row.waited == 60  # a naive time is UTC


def test_queued_sessions_are_named_user_server_and_cancel_asks_first():
    (row,) = S.queue_rows(
        [{"id": "0123456789ab", "user": "alice", "name": "train", "position": 3, "slots": {}}],
        GROUP,
        [],
        NOW,
    )
    grid = S.queue_grid(S.GroupQueue("default", "fifo", "pack", 0, (row,)), True, lambda r: None)
    cells = [w.value for w in grid.children if isinstance(w, W.HTML)]
    assert any("alice/train" in c and 'title="0123456789ab"' in c and ">01234567<" in c for c in cells)
    said: list[tuple[str, bool]] = []
    ran: list[object] = []
    b = S.cancel_button(row, True, ran.append, lambda text, error: said.append((text, error)))
    assert b.tooltip == "Cancel session 0123456789ab"
    b.click()
    assert ran == [] and b.description == "Really cancel?" and b.button_style == "danger"
    assert said == [
        (
            "Cancel alice/train (queued at position 3)? It leaves the queue for good. Click again to go on.",
            False,
        )
    ]
    b.click()
    assert ran == [None]
