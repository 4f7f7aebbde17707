"""The Serving page: every model serving endpoint in the viewer's reach, its replicas (routes) and use.

The endpoints come from ``GET /api/endpoints`` as the viewer (the service scopes the list: a
superadmin and a monitor see every endpoint, a domain admin their domain's). Each shows its status
and why (``status_reason``), how many replicas are healthy of how many asked for, its URL, what it
was asked and answered (requests, errors, mean latency), and its routes: status, health, traffic
and the last error of each. Actions run as the viewer: scale (``PATCH /api/endpoints/{name}``
with ``{"replicas": n}``) and delete (``DELETE``, after a second click), disabled for monitors;
what the service refuses is shown in its own words.

Pure helpers first (plain dicts in, plain values and HTML out, unit-tested without a kernel);
:func:`page` at the bottom builds the widgets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

import ipywidgets as W

from labfleet.console.console import Say, ServiceError, confirm_first, refreshable_page
from labfleet.console.resources import muted, section
from labfleet.core.display import esc, fmt_ago, fmt_slots, number, trim

MAX_REPLICAS = 64  # the service's own bound

# Status -> (CSS variable, fallback colour) of its badge.
STATUS_COLORS = {
    "READY": ("--jp-success-color1", "#388e3c"),
    "DEGRADED": ("--jp-warn-color1", "#f57c00"),
    "PENDING": ("--jp-brand-color1", "#1976d2"),
    "DEPLOYING": ("--jp-brand-color1", "#1976d2"),
    "DESTROYING": ("--jp-ui-font-color2", "#757575"),
    "DESTROYED": ("--jp-ui-font-color2", "#757575"),
}
ROUTE_COLUMNS = ("replica", "status", "health", "traffic", "failures", "address", "since", "last error")


# ---------------------------------------------------------------- reading an endpoint (pure)


def healthy_text(e: Mapping[str, Any]) -> str:
    """``1 of 2 healthy``: replicas that carry traffic of those asked for."""
    return f"{int(number(e.get('healthy_replicas')))} of {int(number(e.get('replicas')))} healthy"


def latency_text(ms: Any) -> str:
    return "—" if ms is None else f"{trim(number(ms), 1)} ms"


def requests_text(e: Mapping[str, Any]) -> str:
    """``12 requests, 1 error, 3.4 ms on average``."""
    n, errors = int(number(e.get("requests"))), int(number(e.get("errors")))
    text = f"{n} request{'' if n == 1 else 's'}, {errors} error{'' if errors == 1 else 's'}"
    if e.get("latency_ms_avg") is not None:
        text += f", {latency_text(e.get('latency_ms_avg'))} on average"
    return text


def slots_text(slots: Mapping[str, Any]) -> str:
    """A replica's slots: as :func:`fmt_slots`, but an amount the service kept as typed (``"512m"``)
    is shown as typed rather than as 0."""
    typed = {k: v for k, v in slots.items() if isinstance(v, str) and not _numeric(v)}
    text = fmt_slots({k: v for k, v in slots.items() if k not in typed})
    extra = ", ".join(f"{k} {v}" for k, v in typed.items())
    if not typed:
        return text
    return extra if text == "nothing" else f"{text}, {extra}"


def _numeric(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def reason_text(e: Mapping[str, Any]) -> str:
    """The service's ``status_reason``, unless it only repeats the healthy count shown beside it."""
    reason = str(e.get("status_reason") or "")
    same = f"{int(number(e.get('healthy_replicas')))} of {int(number(e.get('replicas')))} replicas healthy"
    return "" if reason == same else reason


def status_badge(status: Any) -> str:
    color = STATUS_COLORS.get(str(status), ("--jp-ui-font-color1", "#212121"))
    return (
        f'<span class="lf-status" data-status="{esc(status)}" style="color: var({color[0]}, {color[1]}); '
        f'font-weight: 600">{esc(status)}</span>'
    )


def route_rows(e: Mapping[str, Any], now: datetime) -> list[list[str]]:
    """The endpoint's routes as table rows (see :data:`ROUTE_COLUMNS`)."""
    rows = []
    for r in e.get("routes") or ():
        since = r.get("ended_at") or r.get("ready_at") or r.get("created_at")
        rows.append(
            [
                str(r.get("server") or r.get("id") or ""),
                str(r.get("status") or ""),
                str(r.get("health") or ""),
                str(r.get("traffic") or ""),
                str(int(number(r.get("failures")))),
                str(r.get("address") or ""),
                fmt_ago(since, now),
                str(r.get("last_error") or ""),
            ]
        )
    return rows


def routes_html(e: Mapping[str, Any], now: datetime) -> str:
    rows = route_rows(e, now)
    if not rows:
        return '<div class="lf-admin lf-muted">No replica yet.</div>'
    head = "".join(f"<th>{esc(c)}</th>" for c in ROUTE_COLUMNS)
    body = "".join(
        f'<tr class="lf-route" data-server="{esc(r[0])}" data-status="{esc(r[1])}" data-health="{esc(r[2])}">'
        + "".join(
            f'<td class="lf-error">{esc(v)}</td>' if i == 7 and v else f"<td>{esc(v)}</td>"
            for i, v in enumerate(r)
        )
        + "</tr>"
        for r in rows
    )
    return f'<div class="lf-admin"><table class="lf-table lf-routes"><tr>{head}</tr>{body}</table></div>'


def summary_html(e: Mapping[str, Any]) -> str:
    """What the endpoint is, where it answers and how it is doing, above its routes."""
    folder = (e.get("model_folder") or {}).get("name") or ""
    public = "open to the public" if e.get("open_to_public") else "needs a token"
    reason = f" — {esc(reason_text(e))}" if reason_text(e) else ""
    last = (
        f'<div class="lf-error">last replica error: {esc(e.get("last_error"))}</div>'
        if e.get("last_error")
        else ""
    )
    return (
        f'<div class="lf-admin lf-endpoint" data-name="{esc(e.get("name"))}">'
        f"<div>{status_badge(e.get('status'))} · <b class='lf-healthy'>{esc(healthy_text(e))}</b>{reason}</div>"
        f"<div>owner <b>{esc(e.get('owner'))}</b> · project {esc(e.get('project'))} · domain "
        f"{esc(e.get('domain'))} · model folder {esc(folder)}</div>"
        f"<div>each replica: {esc(slots_text(e.get('slots') or {}))}"
        f"{' · image ' + esc(e.get('image')) if e.get('image') else ''}"
        f"{' · group ' + esc(e.get('resource_group')) if e.get('resource_group') else ''}</div>"
        f"<div>URL <code>{esc(e.get('url'))}</code> ({public})</div>"
        f'<div class="lf-muted lf-requests">{esc(requests_text(e))}</div>{last}</div>'
    )


def overview(endpoints: Sequence[Mapping[str, Any]]) -> str:
    """``3 endpoints in reach: 2 READY, 1 DEGRADED; 3 of 4 replicas healthy``."""
    if not endpoints:
        return "No endpoint in reach."
    counts: dict[str, int] = {}
    for e in endpoints:
        counts[str(e.get("status"))] = counts.get(str(e.get("status")), 0) + 1
    healthy = sum(int(number(e.get("healthy_replicas"))) for e in endpoints)
    asked = sum(int(number(e.get("replicas"))) for e in endpoints)
    n = len(endpoints)
    states = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    return f"{n} endpoint{'' if n == 1 else 's'} in reach: {states}; {healthy} of {asked} replicas healthy."


def scale_body(value: Any) -> dict[str, int]:
    """The PATCH body for a new replica count; ValueError with a sentence for anything else."""
    if isinstance(value, bool):
        raise ValueError("replicas must be a whole number")
    try:
        n = int(str(value).strip())
    except ValueError:
        raise ValueError("replicas must be a whole number") from None
    if not 0 <= n <= MAX_REPLICAS:
        raise ValueError(f"replicas must be between 0 and {MAX_REPLICAS}")
    return {"replicas": n}


def changeable(e: Mapping[str, Any]) -> bool:
    """Whether the service takes a change of this endpoint at all (not while it is going away)."""
    return str(e.get("status")) not in ("DESTROYING", "DESTROYED")


def sort_endpoints(endpoints: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Those in trouble first (DEGRADED, then the ones coming up), then by domain and name."""
    rank = {"DEGRADED": 0, "PENDING": 1, "DEPLOYING": 1, "READY": 2, "DESTROYING": 3, "DESTROYED": 4}
    return sorted(
        endpoints, key=lambda e: (rank.get(str(e.get("status")), 1), str(e.get("domain")), str(e.get("name")))
    )


# ---------------------------------------------------------------- the page (widgets)


def endpoint_actions(
    client: Any, e: Mapping[str, Any], say: Callable[[str, bool], None], done: Callable[[], None]
) -> W.HBox:
    """Scale (replicas) and delete buttons for one endpoint, acting as the viewer."""
    name = str(e.get("name"))
    path = f"/endpoints/{quote(name, safe='')}"
    enabled = bool(client.can_change) and changeable(e)
    replicas = W.BoundedIntText(
        value=int(number(e.get("replicas"))),
        min=0,
        max=MAX_REPLICAS,
        description="replicas",
        disabled=not enabled,
        layout=W.Layout(width="170px"),
    )
    replicas.add_class("lf-replicas")
    scale = W.Button(
        description="Scale",
        icon="arrows-v",
        tooltip=f"Scale endpoint {name}",
        disabled=not enabled,
        layout=W.Layout(width="90px"),
    )
    scale.add_class("lf-scale")
    delete = W.Button(
        description="Delete",
        button_style="danger",
        icon="trash",
        tooltip=f"Delete endpoint {name}",
        disabled=not enabled,
        layout=W.Layout(width="150px"),
    )
    delete.add_class("lf-delete")

    def on_scale(_: Any) -> None:
        try:
            body = scale_body(replicas.value)
            answer = client.patch(path, body)
        except ValueError as err:
            say(str(err), True)
            return
        except ServiceError as err:
            say(f"The labfleet service said: {err.message}", True)
            return
        n = (answer or {}).get("replicas", body["replicas"])
        done()  # built anew first: the message shows once the new page is there
        say(f"Endpoint {name} scaled to {n} replica{'' if n == 1 else 's'}.", False)

    def on_delete() -> bool:
        try:
            answer = client.delete(path)
        except ServiceError as err:
            say(f"The labfleet service said: {err.message}", True)
            return False
        status = (answer or {}).get("status", "DESTROYING")
        done()  # built anew first: the message shows once the new page is there
        say(f"Endpoint {name} is {status}: its replicas are being stopped.", False)
        return True

    scale.on_click(on_scale)
    confirm_first(
        delete, on_delete, f"Delete endpoint {name}? Its replicas stop and its URL answers nothing.", say
    )
    return W.HBox([replicas, scale, delete], layout=W.Layout(margin="4px 0 12px 0"))


def endpoint_view(
    client: Any,
    e: Mapping[str, Any],
    now: datetime,
    say: Callable[[str, bool], None],
    done: Callable[[], None],
) -> W.VBox:
    return W.VBox(
        [
            section(f"Endpoint {e.get('name')}"),
            W.HTML(summary_html(e)),
            W.HTML(routes_html(e, now)),
            endpoint_actions(client, e, say, done),
        ]
    )


def page(client: Any) -> W.VBox:
    """The whole Serving page below its header, refreshed after each action."""
    can_change = client.can_change

    def build(say: Say, refresh: Callable[[], None]) -> W.VBox:
        now = datetime.now(timezone.utc)
        endpoints = sort_endpoints(client.get("/endpoints"))
        parts: list[W.Widget] = [muted(overview(endpoints))]
        if not can_change:
            parts.append(muted("Read only: a monitor changes nothing (scale and delete are disabled)."))
        parts += [endpoint_view(client, e, now, say, refresh) for e in endpoints]
        return W.VBox(parts)

    return refreshable_page(build)
