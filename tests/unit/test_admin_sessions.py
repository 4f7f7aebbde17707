"""The Sessions page without a service: sessions named user/server, replicas of a serving endpoint
told and left to the Serving page, and the console's one way to ask before stopping or deleting
(:func:`labfleet.console.console.confirm_first`)."""

from __future__ import annotations

from typing import Any

import ipywidgets as W

from labfleet.console import sessions as P
from labfleet.console.console import ServiceError, confirm_first, confirm_label

ALICE = {"id": "aaaaaaaa-1111", "name": "", "user": "alice", "project": "acme/ml", "resource_group": "default",
         "type": "interactive", "status": "RUNNING", "slots": {"cpu": 1}}  # fmt: skip
# The service marks a replica with its endpoint (labfleet.serving.endpoints.annotate_replicas).
REPLICA = dict(ALICE, id="bbbbbbbb-2222", name="chat-r7", type="inference", endpoint="chat")
LOOKALIKE = dict(REPLICA, id="cccccccc-3333", name="chat-r9", endpoint=None)  # no route of that name
ENDED = dict(ALICE, id="dddddddd-4444", status="TERMINATED")


def test_a_session_is_named_user_server_with_its_id_muted():
    assert P.session_label("alice", "") == "alice/(default)"
    assert P.session_label("alice", "train") == "alice/train"
    html = P.session_html("0123456789ab", "al<i>ce", None)
    assert "al&lt;i&gt;ce/(default)" in html and 'title="0123456789ab"' in html and ">01234567<" in html
    assert "replica of" not in html
    assert "replica of endpoint <b>chat</b>" in P.session_html("x", "alice", "chat-r7", "chat")


def test_ended_sessions_are_not_live_and_cannot_be_stopped():
    assert P.live_only([ALICE, ENDED]) == [ALICE] and not P.stoppable(ENDED)


def test_confirm_first_asks_then_acts_and_a_failure_puts_the_button_back():
    assert confirm_label("Stop") == "Really stop?"
    assert confirm_label("Delete", "gold") == "Really delete gold?"
    said: list[tuple[str, bool]] = []
    outcome: list[Any] = [False]
    b = W.Button(description="Delete", button_style="")
    confirm_first(b, lambda: outcome[0], lambda: "Delete gold?", lambda t, e: said.append((t, e)))
    b.click()
    assert b.description == "Really delete?" and b.button_style == "danger"
    assert said == [("Delete gold? Click again to go on.", False)]
    b.click()  # it failed (and said why): asked again next time
    assert (b.description, b.button_style) == ("Delete", "")
    b.click()
    assert b.description == "Really delete?" and len(said) == 2


class FakeClient:
    def __init__(self, role: str = "superadmin", refuse: str = "") -> None:
        self.can_change = role in ("superadmin", "admin")
        self.refuse = refuse
        self.sessions = [ALICE, REPLICA, LOOKALIKE]
        self.sent: list[tuple[str, str]] = []

    def everything(self, path: str, **params: Any) -> list[Any]:
        return list(self.sessions)

    def delete(self, path: str) -> Any:
        if self.refuse:
            raise ServiceError(self.refuse, 403)
        self.sent.append(("DELETE", path))
        self.sessions = [s for s in self.sessions if not path.endswith(s["id"])]
        return {}


def _all(box: W.Widget) -> list[W.Widget]:
    found = [box]
    for child in getattr(box, "children", ()):
        found += _all(child)
    return found


def _html(box: W.Widget) -> str:
    return " ".join(str(w.value) for w in _all(box) if isinstance(w, W.HTML))


def test_the_page_stops_after_a_second_click_and_leaves_replicas_to_the_serving_page():
    client = FakeClient()
    box = P.page(client)
    stops = [w for w in _all(box) if isinstance(w, W.Button)]
    assert [b.tooltip for b in stops] == ["Stop session aaaaaaaa-1111", "Stop session cccccccc-3333"]
    text = _html(box)
    assert "alice/(default)" in text and "alice/chat-r7" in text and "replica of endpoint <b>chat</b>" in text
    assert 'serving"' in text and "scale endpoint <b>chat</b>" in text
    stops[0].click()
    assert client.sent == [] and "Stop alice/(default)?" in _html(box)
    stops[0].click()
    assert client.sent == [("DELETE", "/sessions/aaaaaaaa-1111")]
    assert "Stopped session alice/(default) (aaaaaaaa-1111)." in _html(box)
    assert "aaaaaaaa" not in " ".join(b.tooltip for b in _all(box) if isinstance(b, W.Button))


def test_a_monitors_stops_are_disabled_and_a_refusal_shows_in_the_services_words():
    box = P.page(FakeClient("monitor"))
    assert all(b.disabled for b in _all(box) if isinstance(b, W.Button))
    client = FakeClient(refuse="not in your domain")
    box = P.page(client)
    stop = next(w for w in _all(box) if isinstance(w, W.Button))
    stop.click()
    stop.click()
    assert "The labfleet service said: not in your domain" in _html(box)
