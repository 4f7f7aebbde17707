"""The Resources page's node switches, without a service: what a node's state reads as, what a
click sends, who may click, and that a refusal shows in the service's words."""

from __future__ import annotations

from typing import Any

import ipywidgets as W

from labfleet.console import nodecontrol as N
from labfleet.console.console import ServiceError


def test_what_each_state_reads_as_and_what_a_click_sends():
    alive = {"name": "n1", "status": "ALIVE", "schedulable": True}
    drained = {"name": "n2", "status": "ALIVE", "schedulable": False}
    lost = {"name": "n3", "status": "LOST", "schedulable": True}
    assert [N.placement_state(n) for n in (alive, drained, lost)] == [
        "takes sessions",
        "drained",
        "takes nothing (LOST)",
    ]
    assert N.switch_body(alive) == {"schedulable": False} and N.switch_text(alive) == "Drain"
    assert N.switch_body(drained) == {"schedulable": True} and N.switch_text(drained) == "Undrain"
    # A node view from before the switch existed counts as schedulable
    assert N.switch_body({"name": "old", "status": "ALIVE"}) == {"schedulable": False}


class FakeClient:
    def __init__(self, role: str, refuse: str = "") -> None:
        self.role, self.refuse, self.sent = role, refuse, []

    def patch(self, path: str, body: Any) -> Any:
        if self.refuse:
            raise ServiceError(self.refuse, 403)
        self.sent.append((path, body))
        return body


def _buttons(box: W.Widget) -> list[W.Button]:
    found = []
    for child in getattr(box, "children", ()):
        found += [child] if isinstance(child, W.Button) else _buttons(child)
    return found


def test_a_superadmins_click_patches_the_node_and_says_so():
    client, said = FakeClient("superadmin"), []
    nodes = [{"name": "gpu/1", "status": "ALIVE", "schedulable": True}]
    (button,) = _buttons(N.node_switches(client, nodes, said.append))
    assert not button.disabled and button.description == "Drain"
    button.click()
    assert client.sent == [("/nodes/gpu%2F1", {"schedulable": False})]
    assert said == ["Node gpu/1 is drained: no new session lands there; running ones stay until they end."]


def test_others_see_the_switch_disabled_and_a_refusal_in_the_services_words():
    for role in ("monitor", "admin", "user"):
        (button,) = _buttons(N.node_switches(FakeClient(role), [{"name": "n1", "status": "ALIVE"}], print))
        assert button.disabled, role
    client, said = FakeClient("superadmin", refuse="only a superadmin drains nodes"), []
    box = N.node_switches(client, [{"name": "n1", "status": "ALIVE"}], said.append)
    (button,) = _buttons(box)
    button.click()
    assert said == [] and client.sent == []
    assert "The labfleet service said: only a superadmin drains nodes" in box.children[-1].children[0].value
