"""The Resources page: resource groups, their nodes, a per-GPU occupancy map, and the sessions
holding more GPU memory than their share.

What the page shows comes from lists of the labfleet service, read as the viewer
(``GET /api/resource-groups``, ``/api/nodes``, ``/api/sessions``, ``/api/usage/live`` and, for a
session over its share, ``/api/audit``): the service scopes them, so a domain admin's map shows
their own domain's sessions by name and the rest of a device's load as "other domains", without
saying whose, and lists only their own domain's sessions over their share. The top half of this module is pure (plain dicts in, plain
values or SVG/HTML text out) and unit-tested without a kernel; :func:`page` at the bottom builds
the widgets a notebook displays.

The occupancy map is an SVG drawing, not a bqplot figure: one horizontal bar per device, split
into a segment per session holding a fraction of it, what other domains hold, and what is free.
It is drawn by the browser at once (no widget model per mark), reads the same in a screenshot,
and its segments carry ``data-*`` attributes (device, session, user, shares) that tests and
people's own scripts can read back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

import ipywidgets as W

from labfleet.console.console import ServiceError, guarded, message, table
from labfleet.console.nodecontrol import node_switches
from labfleet.core.bootstrap import GPU_OVERUSE_POLICIES
from labfleet.core.display import esc, fmt_ago, fmt_bytes, fmt_timeout, number, trim
from labfleet.core.vocab import HOLDING_STATUSES, SESSION_TYPES

SCHEDULERS = ("fifo", "lifo", "drf")
PLACEMENTS = ("pack", "spread", "whole-gpu", "fgd")
GRANT_KINDS = ("domain", "project", "user")
MAX_PENDING_TIMEOUT = 30 * 24 * 3600  # the service's own bound (30 days)
# What each of a group's gpu_overuse policies does to a session over its share of a device's memory.
GPU_OVERUSE_NOTES = {
    "auto": "kill when the device is shared, warn when alone",
    "warn": "warn the session and audit it",
    "kill": "kill its newest GPU processes",
    "stop": "stop the session",
}

# One colour per holder (user), from JupyterLab's Material palette (its --md-* variables), with
# the same colours as fallbacks where the page has no JupyterLab theme.
PALETTE = (
    ("--md-blue-500", "#2196f3"),
    ("--md-orange-500", "#ff9800"),
    ("--md-green-500", "#4caf50"),
    ("--md-purple-400", "#ab47bc"),
    ("--md-red-400", "#ef5350"),
    ("--md-teal-500", "#009688"),
    ("--md-amber-700", "#ffa000"),
    ("--md-indigo-400", "#5c6bc0"),
    ("--md-pink-300", "#f06292"),
    ("--md-brown-400", "#8d6e63"),
)
OTHERS_COLOR = ("--md-grey-500", "#9e9e9e")
FREE_COLOR = ("--jp-layout-color2", "#eeeeee")

# ---------------------------------------------------------------- formatting (pure)


def css_color(pair: tuple[str, str]) -> str:
    """``var(--md-blue-500, #2196f3)``: the theme's colour where there is one, else the fallback."""
    return f"var({pair[0]}, {pair[1]})"


# ---------------------------------------------------------------- the occupancy map (pure)


@dataclass(frozen=True)
class Segment:
    """One session's hold on one device: ``shares`` of it (1.0 is the whole device)."""

    session: str
    user: str
    project: str
    domain: str
    status: str
    shares: float

    @property
    def label(self) -> str:
        return f"{self.user} {trim(self.shares)}"


@dataclass(frozen=True)
class DeviceBar:
    """A device's row on the map: who holds which fraction of it, and what is left.

    ``allocated`` is the service's own count for the device (every session on it, whether the
    viewer may read it or not); ``segments`` are the sessions the viewer can see. The difference
    is held by sessions out of the viewer's reach (another domain's, for a domain admin).
    """

    node: str
    group: str
    node_status: str
    uuid: str
    index: int
    model: str
    memory: int
    kind: str
    allocated: float
    segments: tuple[Segment, ...]

    @property
    def held(self) -> float:
        """What the sessions in view hold."""
        return round(sum(s.shares for s in self.segments), 2)

    @property
    def others(self) -> float:
        """What sessions out of the viewer's reach hold."""
        return round(max(self.allocated - self.held, 0.0), 2)

    @property
    def free(self) -> float:
        return round(max(1.0 - max(self.allocated, self.held), 0.0), 2)

    @property
    def title(self) -> str:
        """``hub · GPU 0 · A100-80GB (80 GiB)``."""
        mem = f" ({fmt_bytes(self.memory)})" if self.memory else ""
        kind = "MIG" if self.kind == "mig" else "GPU"
        return f"{self.node} · {kind} {self.index} · {self.model}{mem}"


def occupancy(nodes: Iterable[Mapping[str, Any]], sessions: Iterable[Mapping[str, Any]]) -> list[DeviceBar]:
    """Every device of ``nodes`` (``GET /api/nodes``) as a bar of the sessions holding it.

    ``sessions`` (``GET /api/sessions``) carry ``devices`` with each device's ``uuid`` and the
    ``shares`` they hold of it; those that hold nothing now (pending, ended) are left out. A device
    several sessions share gets a segment each, oldest first; a session with several whole devices
    appears on each. Devices come node by node (as ``nodes`` lists them), by index.
    """
    holders: dict[str, list[tuple[str, str, Segment]]] = {}
    for s in sessions:
        if s.get("status") not in HOLDING_STATUSES:
            continue
        for d in s.get("devices") or ():
            shares = round(number(d.get("shares")), 2)
            if not d.get("uuid") or shares <= 0:
                continue
            seg = Segment(
                session=str(s.get("id", "")),
                user=str(s.get("user", "")),
                project=str(s.get("project", "")),
                domain=str(s.get("domain", "")),
                status=str(s.get("status", "")),
                shares=shares,
            )
            holders.setdefault(str(d["uuid"]), []).append((str(s.get("created_at") or ""), seg.session, seg))
    bars = []
    for n in nodes:
        for d in sorted(
            n.get("devices") or (), key=lambda d: (int(number(d.get("index"))), str(d.get("uuid")))
        ):
            uuid = str(d.get("uuid", ""))
            segs = tuple(seg for _, _, seg in sorted(holders.get(uuid, []), key=lambda h: (h[0], h[1])))
            bars.append(
                DeviceBar(
                    node=str(n.get("name", "")),
                    group=str(n.get("resource_group", "")),
                    node_status=str(n.get("status", "")),
                    uuid=uuid,
                    index=int(number(d.get("index"))),
                    model=str(d.get("model", "")),
                    memory=int(number(d.get("memory_bytes"))),
                    kind=str(d.get("kind") or "gpu"),
                    allocated=round(number(d.get("allocated")), 2),
                    segments=segs,
                )
            )
    return bars


def holder_colors(bars: Iterable[DeviceBar]) -> dict[str, tuple[str, str]]:
    """A colour per user holding anything, in the order they first appear on the map."""
    colors: dict[str, tuple[str, str]] = {}
    for b in bars:
        for s in b.segments:
            if s.user not in colors:
                colors[s.user] = PALETTE[len(colors) % len(PALETTE)]
    return colors


def occupancy_summary(bars: Sequence[DeviceBar]) -> dict[str, float]:
    """Totals over the map: devices, shares held (in view and by others) and free, whole devices idle."""
    return {
        "devices": len(bars),
        "held": round(sum(b.held for b in bars), 2),
        "others": round(sum(b.others for b in bars), 2),
        "free": round(sum(b.free for b in bars), 2),
        "idle": sum(1 for b in bars if b.free >= 1.0),
    }


# Geometry of the drawing, in SVG user units (pixels at 100 %).
LABEL_W = 270
BAR_W = 520
ROW_H = 34
BAR_H = 22
TOP = 26
RIGHT_W = 90


def occupancy_svg(bars: Sequence[DeviceBar], colors: Mapping[str, tuple[str, str]] | None = None) -> str:
    """The map as one SVG element: a row per device, a segment per holder, hover titles.

    Each row is ``<g class="lf-device" data-uuid=...>``; each segment ``<g class="lf-seg"
    data-session=... data-user=... data-shares=...>`` (``lf-others`` and ``lf-free`` for the rest).
    A segment wide enough carries its holder's name and fraction; every one has a ``<title>``
    (the browser's tooltip) with the session, project and the device memory its fraction is.
    """
    colors = dict(colors or holder_colors(bars))
    width = LABEL_W + BAR_W + RIGHT_W
    height = TOP + ROW_H * max(len(bars), 1) + 8
    out = [
        f'<svg class="lf-occupancy" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="GPU occupancy" '
        'style="font-family: var(--jp-ui-font-family, sans-serif); font-size: 12px; max-width: 100%;">',
        '<defs><pattern id="lf-hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" style="fill: var(--md-grey-300, #e0e0e0)"/>'
        '<line x1="0" y1="0" x2="0" y2="6" style="stroke: var(--md-grey-500, #9e9e9e); stroke-width: 2"/>'
        "</pattern></defs>",
    ]
    # The scale: 0, 1/4, 1/2, 3/4, 1 of a device.
    for q in (0, 0.25, 0.5, 0.75, 1):
        x = LABEL_W + BAR_W * q
        out.append(
            f'<line x1="{x:.1f}" y1="{TOP - 6}" x2="{x:.1f}" y2="{height - 6}" '
            'style="stroke: var(--jp-border-color2, #e0e0e0); stroke-width: 1"/>'
            f'<text x="{x:.1f}" y="{TOP - 10}" text-anchor="middle" '
            f'style="fill: var(--jp-ui-font-color2, #757575)">{trim(q)}</text>'
        )
    if not bars:
        out.append(
            f'<text x="{LABEL_W}" y="{TOP + 18}" style="fill: var(--jp-ui-font-color2, #757575)">'
            "No device in reach.</text></svg>"
        )
        return "".join(out)
    for i, b in enumerate(bars):
        y = TOP + ROW_H * i
        by = y + (ROW_H - BAR_H) / 2
        mid = by + BAR_H / 2 + 4
        dead = b.node_status != "ALIVE"
        out.append(
            f'<g class="lf-device" data-uuid="{esc(b.uuid)}" data-node="{esc(b.node)}" '
            f'data-index="{b.index}" data-free="{trim(b.free)}">'
            f'<text x="{LABEL_W - 10}" y="{mid:.1f}" text-anchor="end" '
            f'style="fill: var(--jp-ui-font-color1, #212121)">{esc(b.title)}'
            f"<title>{esc(b.uuid)} on {esc(b.node)} (group {esc(b.group)}, node {esc(b.node_status)})</title>"
            "</text>"
        )
        x = float(LABEL_W)
        parts: list[tuple[str, float, str, str, str, str]] = []  # (kind, share, fill, label, attrs, tip)
        for s in b.segments:
            mem = f", about {fmt_bytes(b.memory * s.shares)} of its memory" if b.memory else ""
            parts.append(
                (
                    "seg",
                    s.shares,
                    css_color(colors.get(s.user, PALETTE[0])),
                    s.label,
                    f'class="lf-seg" data-session="{esc(s.session)}" data-user="{esc(s.user)}" '
                    f'data-project="{esc(s.project)}" data-shares="{trim(s.shares)}"',
                    f"{s.user} holds {trim(s.shares)} of this device: session {s.session} "
                    f"({s.project}, {s.status}){mem}",
                )
            )
        if b.others > 0:
            parts.append(
                (
                    "others",
                    b.others,
                    "url(#lf-hatch)",
                    f"others {trim(b.others)}",
                    f'class="lf-others" data-shares="{trim(b.others)}"',
                    f"{trim(b.others)} held by sessions outside your reach (other domains)",
                )
            )
        if b.free > 0:
            parts.append(
                (
                    "free",
                    b.free,
                    css_color(FREE_COLOR),
                    f"free {trim(b.free)}",
                    f'class="lf-free" data-shares="{trim(b.free)}"',
                    f"{trim(b.free)} of this device is free",
                )
            )
        for kind, share, fill, label, attrs, tip in parts:
            w = BAR_W * min(share, 1.0)
            # White on a holder's colour, the theme's text colour on grey.
            text_fill = "#ffffff" if kind == "seg" else "var(--jp-ui-font-color1, #212121)"
            edge = "stroke: var(--jp-layout-color0, #ffffff); stroke-width: 1"
            paint = (
                f'fill="{fill}" style="{edge}"'
                if fill.startswith("url(")
                else f'style="fill: {fill}; {edge}"'
            )
            out.append(
                f"<g {attrs}><title>{esc(tip)}</title>"
                f'<rect x="{x:.1f}" y="{by:.1f}" width="{w:.1f}" height="{BAR_H}" rx="2" {paint}/>'
            )
            if w >= 7.2 * len(label) + 8:  # room for the label (about 7 px a character)
                weight = 600 if kind == "seg" else 400
                out.append(
                    f'<text x="{x + w / 2:.1f}" y="{mid:.1f}" text-anchor="middle" '
                    f'style="fill: {text_fill}; font-weight: {weight}">{esc(label)}</text>'
                )
            out.append("</g>")
            x += w
        if dead:
            out.append(
                f'<rect x="{LABEL_W}" y="{by:.1f}" width="{BAR_W}" height="{BAR_H}" '
                'style="fill: none; stroke: var(--jp-error-color1, #d32f2f); stroke-dasharray: 4 3"/>'
            )
        used = "node " + b.node_status.lower() if dead else f"{trim(b.allocated)} held"
        out.append(
            f'<text x="{LABEL_W + BAR_W + 8}" y="{mid:.1f}" '
            f'style="fill: var(--jp-ui-font-color2, #757575)">{esc(used)}</text></g>'
        )
    out.append("</svg>")
    return "".join(out)


def legend_html(colors: Mapping[str, tuple[str, str]], others: bool) -> str:
    """Who is who on the map: a swatch per user, then "other domains" and "free"."""
    items = [
        f'<span class="lf-swatch" style="background: {css_color(c)}"></span>{esc(user)}'
        for user, c in colors.items()
    ]
    if others:
        items.append(
            '<span class="lf-swatch" style="background: repeating-linear-gradient(45deg, '
            'var(--md-grey-500, #9e9e9e) 0 2px, var(--md-grey-300, #e0e0e0) 2px 5px)"></span>other domains'
        )
    items.append(f'<span class="lf-swatch" style="background: {css_color(FREE_COLOR)}"></span>free')
    return '<div class="lf-legend">' + "".join(f"<span>{i}</span>" for i in items) + "</div>"


def holder_rows(bars: Iterable[DeviceBar]) -> list[list[str]]:
    """The map as a table, a row per (device, session): for reading exact numbers and copying ids."""
    rows = []
    for b in bars:
        for s in b.segments:
            rows.append(
                [
                    b.node,
                    f"{b.index} ({b.model})",
                    s.user,
                    s.project,
                    s.session,
                    s.status,
                    trim(s.shares),
                ]
            )
    return rows


# ---------------------------------------------------------------- nodes (pure)


def meter_html(used: float, total: float, text: str) -> str:
    """A small usage bar with its text: ``[####    ] 1.5 of 2``."""
    frac = 0.0 if total <= 0 else min(max(used / total, 0.0), 1.0)
    level = "lf-over" if total > 0 and frac >= 1.0 else "lf-warn" if frac >= 0.8 else ""
    return (
        f'<span class="lf-meter {level}" title="{esc(text)}"><span style="width: {frac * 100:.0f}%"></span></span>'
        f'<span class="lf-meter-text">{esc(text)}</span>'
    )


def node_rows(
    nodes: Iterable[Mapping[str, Any]], sessions: Iterable[Mapping[str, Any]], now: datetime
) -> list[dict[str, Any]]:
    """A row per node: what it has and holds (CPU, memory, GPU shares), its sessions, when last seen."""
    on_node: dict[str, int] = {}
    for s in sessions:
        if s.get("status") in HOLDING_STATUSES and s.get("node"):
            on_node[str(s["node"])] = on_node.get(str(s["node"]), 0) + 1
    rows = []
    for n in nodes:
        cap, alloc = n.get("capacity") or {}, n.get("allocated") or {}
        devices = n.get("devices") or []
        models: dict[str, int] = {}
        for d in devices:
            models[str(d.get("model"))] = models.get(str(d.get("model")), 0) + 1
        rows.append(
            {
                "name": str(n.get("name", "")),
                "group": str(n.get("resource_group", "")),
                "status": str(n.get("status", "")),
                "drained": n.get("schedulable", True) is False,
                "plugin": str(n.get("plugin") or ""),
                "cpu": (number(alloc.get("cpu")), number(cap.get("cpu"))),
                "mem": (number(alloc.get("mem")), number(cap.get("mem"))),
                "gpu": (number(alloc.get("gpu.shares")), float(len(devices))),
                "models": ", ".join(f"{k} × {v}" for k, v in sorted(models.items())) or "no GPU",
                "sessions": on_node.get(str(n.get("name")), 0),
                "mps": str((n.get("mps") or {}).get("state") or "off"),
                "mps_reason": str((n.get("mps") or {}).get("reason") or ""),
                "last_seen": fmt_ago(n.get("last_seen"), now),
            }
        )
    return rows


def nodes_html(rows: Sequence[Mapping[str, Any]]) -> str:
    """The nodes as an HTML table with a usage bar per resource."""
    if not rows:
        return '<div class="lf-admin lf-muted">No node in reach.</div>'
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "node",
            "group",
            "status",
            "CPU cores",
            "memory",
            "GPUs (shares held)",
            "devices",
            "sessions",
            "MPS",
            "last seen",
        )
    )
    body = []
    for r in rows:
        cu, ct = r["cpu"]
        mu, mt = r["mem"]
        gu, gt = r["gpu"]
        status = r["status"]
        badge = "lf-badge-ok" if status == "ALIVE" else "lf-badge-bad"
        body.append(
            "<tr>"
            f"<td><b>{esc(r['name'])}</b><div class='lf-muted'>{esc(r['plugin'])}</div></td>"
            f"<td>{esc(r['group'])}</td>"
            f"<td><span class='lf-badge {badge}'>{esc(status)}</span>"
            + (" <span class='lf-badge lf-badge-bad'>drained</span>" if r.get("drained") else "")
            + "</td>"
            f"<td>{meter_html(cu, ct, f'{trim(cu)} of {trim(ct)}')}</td>"
            f"<td>{meter_html(mu, mt, f'{fmt_bytes(mu)} of {fmt_bytes(mt)}')}</td>"
            f"<td>{meter_html(gu, gt, f'{trim(gu)} of {trim(gt, 0)}') if gt else 'none'}</td>"
            f"<td>{esc(r['models'])}</td>"
            f"<td>{r['sessions']}</td>"
            f"<td>{mps_html(r)}</td>"
            f"<td>{esc(r['last_seen'])}</td>"
            "</tr>"
        )
    return (
        f'<div class="lf-admin"><table class="lf-table lf-nodes"><tr>{head}</tr>{"".join(body)}</table></div>'
    )


def mps_html(row: Mapping[str, Any]) -> str:
    """A node's MPS daemon: a badge (on, off, failed) with the reason under it."""
    state = row.get("mps", "off")
    badge = {"on": "lf-badge-ok", "failed": "lf-badge-bad"}.get(state, "")
    reason = f"<div class='lf-muted'>{esc(row['mps_reason'])}</div>" if row.get("mps_reason") else ""
    return f"<span class='lf-badge {badge}'>{esc(state)}</span>{reason}"


# ---------------------------------------------------------------- resource groups (pure)


def fmt_grants(grants: Iterable[Mapping[str, Any]]) -> str:
    """``domain:acme, project:acme/ml``: the form the editor reads back (:func:`parse_grants`)."""
    return ", ".join(f"{g.get('kind')}:{g.get('target')}" for g in grants)


def parse_grants(text: str) -> list[dict[str, str]]:
    """``domain:acme, project:acme/ml user:bob`` -> grants; ValueError saying which item is wrong.

    Items are separated by commas, spaces or new lines; each is ``KIND:TARGET`` with KIND one of
    domain, project, user. Repeats count once.
    """
    grants: list[dict[str, str]] = []
    for item in text.replace(",", " ").split():
        kind, sep, target = item.partition(":")
        if not sep or kind not in GRANT_KINDS or not target:
            raise ValueError(
                f"grant {item!r} is not KIND:TARGET with KIND one of {', '.join(GRANT_KINDS)} "
                "(e.g. domain:acme, project:acme/ml, user:bob)"
            )
        if kind == "project" and "/" not in target:
            raise ValueError(f"grant {item!r}: a project is DOMAIN/PROJECT")
        g = {"kind": kind, "target": target}
        if g not in grants:
            grants.append(g)
    return grants


def group_patch(group: Mapping[str, Any], form: Mapping[str, Any]) -> dict[str, Any]:
    """The ``PATCH /api/resource-groups/{name}`` body that turns ``group`` into what ``form`` says:
    only the fields that change (empty: nothing to do). ValueError for a form that cannot be sent.

    ``form`` holds ``description`` (str), ``is_public`` (bool), ``scheduler``, ``placement``,
    ``gpu_overuse``, ``allowed_session_types`` (a sequence), ``pending_timeout`` (seconds) and
    ``grants`` (the text :func:`parse_grants` reads); a key left out is left as it is. A choice the
    service does not take is refused in the service's own words.
    """
    body: dict[str, Any] = {}
    if "description" in form and str(form["description"]) != str(group.get("description") or ""):
        body["description"] = str(form["description"])
    if "is_public" in form and bool(form["is_public"]) != bool(group.get("is_public")):
        body["is_public"] = bool(form["is_public"])
    for key, choices, default in (
        ("scheduler", SCHEDULERS, None),
        ("placement", PLACEMENTS, None),
        ("gpu_overuse", GPU_OVERUSE_POLICIES, "auto"),  # a group from before the policy: auto
    ):
        if key in form and form[key] != (group.get(key) or default):
            if form[key] not in choices:
                raise ValueError(f"{key} must be one of {', '.join(choices)} (got {form[key]!r:.40})")
            body[key] = form[key]
    if "allowed_session_types" in form:
        types = sorted(set(form["allowed_session_types"]))
        bad = [t for t in types if t not in SESSION_TYPES]
        if bad:
            raise ValueError(f"unknown session type {bad[0]!r}")
        if not types:
            raise ValueError("allow at least one session type")
        if types != sorted(set(group.get("allowed_session_types") or ())):
            body["allowed_session_types"] = types
    if "pending_timeout" in form:
        try:
            timeout = int(form["pending_timeout"])
        except (TypeError, ValueError):
            raise ValueError("pending timeout must be a whole number of seconds") from None
        if not 0 <= timeout <= MAX_PENDING_TIMEOUT:
            raise ValueError(
                f"pending timeout must be 0 (wait for ever) to {MAX_PENDING_TIMEOUT} s (30 days)"
            )
        if timeout != int(number(group.get("pending_timeout"))):
            body["pending_timeout"] = timeout
    if "grants" in form:
        grants = parse_grants(str(form["grants"]))
        before = [{"kind": g.get("kind"), "target": g.get("target")} for g in group.get("grants") or ()]
        if sorted((g["kind"], g["target"]) for g in grants) != sorted(
            (g["kind"], g["target"]) for g in before
        ):
            body["grants"] = grants
    return body


def groups_html(groups: Sequence[Mapping[str, Any]]) -> str:
    """The resource groups as an HTML table (the editor below it changes them)."""
    if not groups:
        return '<div class="lf-admin lf-muted">No resource group in reach.</div>'
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "group",
            "access",
            "scheduler",
            "placement",
            "session types",
            "pending timeout",
            "over its GPU share",
            "grants",
            "nodes",
        )
    )
    body = []
    for g in groups:
        policy = str(g.get("gpu_overuse") or "auto")
        grants = fmt_grants(g.get("grants") or ()) or ("—" if g.get("is_public") else "nobody yet")
        body.append(
            "<tr>"
            f"<td><b>{esc(g.get('name'))}</b><div class='lf-muted'>{esc(g.get('description') or '')}</div></td>"
            f"<td>{'public' if g.get('is_public') else 'granted only'}</td>"
            f"<td>{esc(g.get('scheduler'))}</td>"
            f"<td>{esc(g.get('placement'))}</td>"
            f"<td>{esc(', '.join(g.get('allowed_session_types') or ()))}</td>"
            f"<td>{esc(fmt_timeout(g.get('pending_timeout')))}</td>"
            f"<td class='lf-gpu-overuse' data-policy='{esc(policy)}'>{esc(policy)}"
            f"<div class='lf-muted'>{esc(GPU_OVERUSE_NOTES.get(policy, ''))}</div></td>"
            f"<td>{esc(grants)}</td>"
            f"<td>{esc(', '.join(g.get('nodes') or ()) or 'none')}</td>"
            "</tr>"
        )
    return f'<div class="lf-admin"><table class="lf-table lf-groups"><tr>{head}</tr>{"".join(body)}</table></div>'


# ---------------------------------------------------------------- the page (widgets)

STYLE = """<style>
.lf-admin .lf-muted, .lf-muted { color: var(--jp-ui-font-color2, #757575); font-size: 0.9em; }
.lf-admin h2, h2.lf-h2 { font-size: 1.15em; margin: 1.1em 0 0.4em 0; font-weight: 600;
  color: var(--jp-ui-font-color1, #212121); font-family: var(--jp-ui-font-family, sans-serif); }
.lf-meter { display: inline-block; width: 80px; height: 8px; border-radius: 4px; vertical-align: middle;
  background: var(--jp-layout-color3, #e0e0e0); overflow: hidden; margin-right: 6px; }
.lf-meter > span { display: block; height: 100%; background: var(--jp-brand-color1, #1976d2); }
.lf-meter.lf-warn > span { background: var(--jp-warn-color1, #f57c00); }
.lf-meter.lf-over > span { background: var(--jp-error-color1, #d32f2f); }
.lf-meter-text { font-variant-numeric: tabular-nums; }
.lf-badge { padding: 1px 7px; border-radius: 9px; font-size: 0.85em; font-weight: 600; }
.lf-badge-ok { background: var(--md-green-100, #c8e6c9); color: var(--md-green-900, #1b5e20); }
.lf-badge-bad { background: var(--md-red-100, #ffcdd2); color: var(--md-red-900, #b71c1c); }
.lf-legend { font-family: var(--jp-ui-font-family, sans-serif); font-size: 12px; margin: 2px 0 6px 0;
  color: var(--jp-ui-font-color1, #212121); }
.lf-legend > span { margin-right: 14px; white-space: nowrap; }
.lf-swatch { display: inline-block; width: 11px; height: 11px; border-radius: 2px; margin-right: 5px;
  vertical-align: -1px; }
.lf-placeholder { border: 1px dashed var(--jp-border-color1, #bdbdbd); border-radius: 4px;
  padding: 4px 10px; display: inline-block; color: var(--jp-ui-font-color2, #757575); font-size: 0.9em; }
.lf-form .widget-label { min-width: 130px; }
</style>"""


def section(title: str, note: str = "") -> W.HTML:
    """A section heading of a page, with an optional line under it."""
    sub = f'<div class="lf-muted">{esc(note)}</div>' if note else ""
    return W.HTML(f'{STYLE}<div class="lf-admin"><h2 class="lf-h2">{esc(title)}</h2>{sub}</div>')


def muted(text: str) -> W.HTML:
    """A quiet line (a summary, a caption, why something is read only)."""
    return W.HTML(f'{STYLE}<div class="lf-admin"><div class="lf-muted">{esc(text)}</div></div>')


def holding_sessions(client: Any) -> list[dict[str, Any]]:
    """Every session in the viewer's reach that holds devices or slots now (one list per status)."""
    found: list[dict[str, Any]] = []
    for status in HOLDING_STATUSES:
        found += client.everything("/sessions", status=status)
    return found


def occupancy_view(nodes: Sequence[Mapping[str, Any]], sessions: Sequence[Mapping[str, Any]]) -> W.VBox:
    """The map with its legend, a summary line and the exact holders' table."""
    bars = occupancy(nodes, sessions)
    colors = holder_colors(bars)
    total = occupancy_summary(bars)
    line = (
        f"{total['devices']:.0f} devices: {trim(total['held'])} held by sessions you can see"
        + (f", {trim(total['others'])} by other domains" if total["others"] else "")
        + f", {trim(total['free'])} free ({total['idle']:.0f} whole devices idle)."
    )
    parts: list[W.Widget] = [
        muted(line),
        W.HTML(legend_html(colors, others=total["others"] > 0)),
        W.HTML(f'<div class="lf-occupancy-wrap">{occupancy_svg(bars, colors)}</div>'),
    ]
    rows = holder_rows(bars)
    if rows:
        parts.append(muted("Who holds what, exactly:"))
        parts.append(table(["node", "device", "user", "project", "session", "status", "shares"], rows))
    return W.VBox(parts)


def form_label(text: str) -> W.HTML:
    """A label in the column of the form's descriptions (130 px, right-aligned, as ipywidgets draws them)."""
    return W.HTML(
        f'<div style="text-align: right; padding-right: 8px">{esc(text)}</div>',
        layout=W.Layout(width="138px", min_width="138px"),
    )


def read_only_reason(role: str) -> str:
    """Why the viewer may not change resource groups ("" for a superadmin, who may)."""
    if role == "superadmin":
        return ""
    if role == "monitor":
        return "Read only: a monitor changes nothing."
    return "Read only: only a superadmin changes resource groups."


def group_editor(
    groups: Sequence[Mapping[str, Any]],
    client: Any,
    on_saved: Callable[[str, str], None],
    selected: str | None = None,
    said: str = "",
) -> W.VBox:
    """A form that edits one resource group (superadmins) or shows why it is read only (others).

    Save sends only the fields that changed (:func:`group_patch`); a form that cannot be sent, or
    the service's refusal, shows its message under the button and changes nothing.
    ``on_saved(text, group)`` runs after a change is saved (the page rebuilds itself, then shows
    this editor again on ``selected`` with ``said`` under its button).
    """
    why = read_only_reason(client.role)
    editable = not why
    names = [str(g.get("name")) for g in groups]
    by_name = {str(g.get("name")): g for g in groups}
    style = {"description_width": "130px"}
    narrow = W.Layout(width="330px")
    pick = W.Dropdown(
        options=names,
        value=selected if selected in by_name else (names[0] if names else None),
        description="Group",
        style=style,
        layout=narrow,
    )
    description = W.Text(description="Description", style=style, layout=W.Layout(width="560px"))
    public = W.Checkbox(
        description="public: every user may use it", indent=False, layout=W.Layout(width="auto")
    )
    public_row = W.HBox([form_label("Access"), public], layout=W.Layout(align_items="center"))
    scheduler = W.Dropdown(options=SCHEDULERS, description="Scheduler", style=style, layout=narrow)
    placement = W.Dropdown(options=PLACEMENTS, description="Placement", style=style, layout=narrow)
    overuse = W.Dropdown(
        options=[(f"{p}: {GPU_OVERUSE_NOTES[p]}", p) for p in GPU_OVERUSE_POLICIES],
        description="Over GPU share",
        tooltip="what the service does to a session whose processes hold more of a device's "
        "memory than its fraction (plus a tolerance) for 2 samples in a row; whole devices are never judged",
        style=style,
        layout=W.Layout(width="560px"),
    )
    types = {
        t: W.Checkbox(description=t, indent=False, layout=W.Layout(width="110px")) for t in SESSION_TYPES
    }
    types_row = W.HBox([form_label("Session types"), *types.values()], layout=W.Layout(align_items="center"))
    types_row.add_class("lf-types")
    timeout = W.BoundedIntText(
        min=0,
        max=MAX_PENDING_TIMEOUT,
        description="Pending timeout (s)",
        description_tooltip="seconds a session may wait in the queue before it is cancelled; 0 waits for ever",
        style=style,
        layout=narrow,
    )
    grants = W.Textarea(
        description="Grants",
        placeholder="domain:acme, project:acme/ml, user:bob",
        style=style,
        layout=W.Layout(width="560px", height="56px"),
    )
    save = W.Button(description="Save changes", button_style="primary", icon="check", disabled=not editable)
    note = W.HTML(message(said).value if said else "")
    fields: list[W.Widget] = [description, public, scheduler, placement, overuse, *types.values()]
    fields += [timeout, grants]
    for f in fields:
        f.disabled = not editable

    def load(*_: Any) -> None:
        g = by_name.get(pick.value)
        if g is None:
            return
        description.value = str(g.get("description") or "")
        public.value = bool(g.get("is_public"))
        scheduler.value = g.get("scheduler") if g.get("scheduler") in SCHEDULERS else SCHEDULERS[0]
        placement.value = g.get("placement") if g.get("placement") in PLACEMENTS else PLACEMENTS[0]
        overuse.value = g.get("gpu_overuse") if g.get("gpu_overuse") in GPU_OVERUSE_POLICIES else "auto"
        allowed = set(g.get("allowed_session_types") or ())
        for t, box in types.items():
            box.value = t in allowed
        timeout.value = int(number(g.get("pending_timeout")))
        grants.value = fmt_grants(g.get("grants") or ())

    def do_save(_: Any) -> None:
        g = by_name.get(pick.value)
        if g is None:
            return
        form = {
            "description": description.value,
            "is_public": public.value,
            "scheduler": scheduler.value,
            "placement": placement.value,
            "gpu_overuse": overuse.value,
            "allowed_session_types": [t for t, box in types.items() if box.value],
            "pending_timeout": timeout.value,
            "grants": grants.value,
        }
        try:
            body = group_patch(g, form)
        except ValueError as e:
            note.value = message(str(e), error=True).value
            return
        if not body:
            note.value = muted("Nothing to save: the form says what the group already has.").value
            return
        try:
            client.patch(f"/resource-groups/{quote(str(pick.value), safe='')}", body)
        except ServiceError as e:
            note.value = message(f"The labfleet service said: {e.message}", error=True).value
            return
        on_saved(f"Saved resource group {pick.value}: {', '.join(sorted(body))}.", str(pick.value))

    def picked(*_: Any) -> None:
        note.value = ""
        load()

    pick.observe(picked, "value")
    save.on_click(do_save)
    load()
    parts: list[W.Widget] = [pick, description, public_row, scheduler, placement, overuse, types_row]
    parts += [timeout, grants]
    parts += [W.HBox([form_label(""), save]), W.HBox([form_label(""), note])]
    if why:
        parts.insert(0, muted(why))
    box = W.VBox(parts)
    box.add_class("lf-form")
    return box


def group_creator(client: Any, on_saved: Callable[[str, str], None]) -> W.HBox:
    """A new resource group by name, not public and granted to nobody yet (superadmins; the editor
    above then sets the rest)."""
    editable = not read_only_reason(client.role)
    name = W.Text(
        description="New group",
        placeholder="name, e.g. a100",
        style={"description_width": "130px"},
        layout=W.Layout(width="330px"),
        disabled=not editable,
    )
    create = W.Button(description="Create group", icon="plus", disabled=not editable)
    note = W.HTML()

    def do_create(_: Any) -> None:
        wanted = name.value.strip()
        if not wanted:
            note.value = message("Give the new group a name.", error=True).value
            return
        try:
            client.post("/resource-groups", {"name": wanted, "is_public": False})
        except ServiceError as e:
            note.value = message(f"The labfleet service said: {e.message}", error=True).value
            return
        on_saved(f"Created resource group {wanted}: not public, no grants and no node yet.", wanted)

    create.on_click(do_create)
    return W.HBox([name, create, note], layout=W.Layout(align_items="center"))


def page(client: Any) -> W.VBox:
    """The whole Resources page below its header: it rebuilds itself in place after a change."""
    # Here, not at the top: that module builds on this one's formatting helpers.
    from labfleet.console.gpuoveruse import overuse_section

    out = W.VBox()
    refresh_button = W.Button(description="Refresh", icon="refresh", layout=W.Layout(width="110px"))
    state: dict[str, Any] = {"group": None, "said": ""}  # the editor's group and its last word

    def build() -> W.VBox:
        now = datetime.now(timezone.utc)
        groups = client.get("/resource-groups")
        nodes = client.everything("/nodes")
        sessions = holding_sessions(client)
        said, state["said"] = state["said"], ""
        node_said, state["node_said"] = state.get("node_said", ""), ""
        return W.VBox(
            [
                section(
                    "GPU occupancy",
                    "One bar per device; a segment per session holding a fraction of it (hover for the "
                    "session), what other domains hold hatched, the free part grey.",
                ),
                occupancy_view(nodes, sessions),
                *overuse_section(client, sessions, now),
                section("Nodes", "What each node has and what its sessions hold now."),
                W.HTML(STYLE + nodes_html(node_rows(nodes, sessions, now))),
                section(
                    "Drain a node",
                    "A drained node takes no new session; running ones stay until they end.",
                ),
                *([message(node_said)] if node_said else []),
                node_switches(client, nodes, drained),
                section(
                    "Resource groups",
                    "Scheduler, placement, allowed session types, pending timeout and who may use each group.",
                ),
                W.HTML(STYLE + groups_html(groups)),
                section("Edit a resource group"),
                group_editor(groups, client, saved, state["group"], said),
                group_creator(client, saved),
            ]
        )

    def refresh(*_: Any) -> None:
        out.children = [guarded(build)]

    def saved(text: str, group: str) -> None:
        state["group"], state["said"] = group, text
        refresh()

    def drained(text: str) -> None:
        state["node_said"] = text
        refresh()

    refresh_button.on_click(refresh)
    refresh()
    return W.VBox([refresh_button, out])
