"""The Serving page without a service: what an endpoint reads as, its routes, what a click sends,
who may click, and that a refusal shows in the service's words."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import ipywidgets as W
import pytest

from labfleet.console import serving as S
from labfleet.console.console import ServiceError

NOW = datetime(2026, 11, 24, 5, 0, tzinfo=timezone.utc)


def endpoint(name: str = "echo", **kw: Any) -> dict[str, Any]:
    e = {
        "id": "e1",
        "name": name,
        "owner": "alice",
        "project": "acme/ml",
        "domain": "acme",
        "model_folder": {"id": "f1", "name": "echo-model"},
        "image": None,
        "resource_group": None,
        "slots": {"cpu": 0.5, "gpu.shares": 0.25},
        "replicas": 2,
        "active_replicas": 2,
        "healthy_replicas": 1,
        "status": "DEGRADED",
        "status_reason": "1 of 2 replicas healthy",
        "open_to_public": False,
        "url": f"/services/labfleet/serve/{name}/",
        "requests": 12,
        "errors": 1,
        "latency_ms_avg": 3.456,
        "last_error": "",
        "routes": [
            {
                "id": 1,
                "server": f"{name}-r0",
                "address": "127.0.0.1:4000",
                "status": "RUNNING",
                "health": "HEALTHY",
                "traffic": "ACTIVE",
                "failures": 0,
                "last_error": "",
                "created_at": "2026-11-24T04:58:00+00:00",
                "ready_at": "2026-11-24T04:59:00+00:00",
                "ended_at": None,
            },
            {
                "id": 2,
                "server": f"{name}-r1",
                "address": "127.0.0.1:4001",
                "status": "PROVISIONING",
                "health": "UNHEALTHY",
                "traffic": "INACTIVE",
                "failures": 3,
                "last_error": "health check: <connection refused>",
                "created_at": "2026-11-24T04:59:30+00:00",
                "ready_at": None,
                "ended_at": None,
            },
        ],
    }
    e.update(kw)
    return e


def test_how_an_endpoint_reads():
    e = endpoint()
    assert S.healthy_text(e) == "1 of 2 healthy"
    assert S.requests_text(e) == "12 requests, 1 error, 3.5 ms on average"
    assert S.requests_text({"requests": 1, "errors": 0, "latency_ms_avg": None}) == "1 request, 0 errors"
    html = S.summary_html(e)
    assert 'data-status="DEGRADED"' in html and "1 of 2 healthy" in html
    # The reason shows when it says more than the count
    assert "replicas healthy" not in html
    assert "r1 failed its health check" in S.summary_html(
        endpoint(status_reason="r1 failed its health check")
    )
    assert "/services/labfleet/serve/echo/" in html and "needs a token" in html
    assert "cpu 0.5, gpu.shares 0.25" in html
    assert S.slots_text({"cpu": 1, "mem": "512m", "gpu.shares": "0.25"}) == "cpu 1, gpu.shares 0.25, mem 512m"
    assert (
        S.slots_text({"mem": "2g"}) == "mem 2g"
        and S.slots_text({"mem": 2**30}) == "mem 1 GiB"
        and "echo-model" in html
        and "alice" in html
    )
    # What the service says is escaped
    assert "&lt;b&gt;" in S.summary_html(endpoint(status_reason="<b>x</b>"))


def test_routes_show_status_health_traffic_and_last_error():
    rows = S.route_rows(endpoint(), NOW)
    assert rows[0][:6] == ["echo-r0", "RUNNING", "HEALTHY", "ACTIVE", "0", "127.0.0.1:4000"]
    assert rows[0][6] == "1 min ago" and rows[1][6] == "30 s ago"
    assert rows[1][7] == "health check: <connection refused>"
    html = S.routes_html(endpoint(), NOW)
    assert html.count('class="lf-route"') == 2 and "&lt;connection refused&gt;" in html
    assert "No replica yet" in S.routes_html(endpoint(routes=[]), NOW)


def test_overview_and_order():
    eps = [endpoint("b", status="READY", healthy_replicas=2), endpoint("a"), endpoint("c", status="PENDING")]
    assert S.overview(eps) == "3 endpoints in reach: 1 DEGRADED, 1 PENDING, 1 READY; 4 of 6 replicas healthy."
    assert S.overview([]) == "No endpoint in reach."
    assert [e["name"] for e in S.sort_endpoints(eps)] == ["a", "c", "b"]


def test_scale_body_checks_the_number():
    assert S.scale_body(3) == {"replicas": 3} and S.scale_body(" 0 ") == {"replicas": 0}
    for bad in (-1, 65, "two", True, None):
        with pytest.raises(ValueError):
            S.scale_body(bad)


class FakeClient:
    def __init__(self, role: str, endpoints: list[dict[str, Any]], refuse: str = "") -> None:
        self.role, self.endpoints, self.refuse, self.sent = role, endpoints, refuse, []

    @property
    def can_change(self) -> bool:
        return self.role in ("superadmin", "admin")

    def get(self, path: str, **params: Any) -> Any:
        assert path == "/endpoints"
        return self.endpoints

    def patch(self, path: str, body: Any) -> Any:
        if self.refuse:
            raise ServiceError(self.refuse, 409)
        self.sent.append(("PATCH", path, body))
        return {**self.endpoints[0], **body}

    def delete(self, path: str) -> Any:
        if self.refuse:
            raise ServiceError(self.refuse, 403)
        self.sent.append(("DELETE", path, None))
        return {**self.endpoints[0], "status": "DESTROYING"}


def _find(box: W.Widget, kind: type) -> list[Any]:
    found = []
    for child in getattr(box, "children", ()):
        found += [child] if isinstance(child, kind) else _find(child, kind)
    return found


def _button(box: W.Widget, text: str) -> W.Button:
    (b,) = [b for b in _find(box, W.Button) if b.description == text]
    return b


def _flash(box: W.VBox) -> str:
    return box.children[1].value


def test_a_superadmin_scales_and_deletes_through_the_page():
    client = FakeClient("superadmin", [endpoint("my ep")])
    box = S.page(client)
    (replicas,) = _find(box, W.BoundedIntText)
    assert replicas.value == 2 and not replicas.disabled
    replicas.value = 3
    _button(box, "Scale").click()
    assert client.sent == [("PATCH", "/endpoints/my%20ep", {"replicas": 3})]
    assert "Endpoint my ep scaled to 3 replicas." in _flash(box)
    # Delete asks for a second click
    _button(box, "Delete").click()
    assert len(client.sent) == 1 and "Click again" in _flash(box)
    _button(box, "Really delete?").click()
    assert client.sent[-1] == ("DELETE", "/endpoints/my%20ep", None)
    assert "is DESTROYING" in _flash(box)


def test_a_monitor_reads_only_and_a_refusal_shows_in_the_services_words():
    box = S.page(FakeClient("monitor", [endpoint()]))
    assert all(b.disabled for b in _find(box, W.Button) if b.description != "Refresh")
    assert "Read only" in str([w.value for w in _find(box, W.HTML)])
    client = FakeClient(
        "admin", [endpoint()], refuse="your user policy allows at most 2 replicas per endpoint"
    )
    box = S.page(client)
    (replicas,) = _find(box, W.BoundedIntText)
    replicas.value = 5
    _button(box, "Scale").click()
    assert client.sent == []
    assert "The labfleet service said: your user policy allows at most 2 replicas per endpoint" in _flash(box)
    # An endpoint going away takes no change
    box = S.page(FakeClient("superadmin", [endpoint(status="DESTROYING")]))
    assert _button(box, "Scale").disabled and _button(box, "Delete").disabled
