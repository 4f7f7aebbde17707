"""The console's idle checkers section without a service: what a checker reads as, what the form
sends, what it refuses before sending, and the service's refusals in its own words."""

from __future__ import annotations

from typing import Any

import ipywidgets as W
import pytest

from labfleet.console import idlecheckers as I
from labfleet.console.console import ServiceError

GPU_IDLE = {
    "name": "gpu-idle",
    "kind": "utilization",
    "options": {
        "window": 1200,
        "grace": 600,
        "thresholds": {"gpu_util": 5, "cpu_util": 10},
        "combine": "and",
    },
    "bindings": [{"scope": "resource_group", "name": "a100"}],
    "owner_domain": None,
}
NIGHT = {
    "name": "night",
    "kind": "activity",
    "options": {"timeout": 5400, "only_when_queue_waiting": True},
    "bindings": [{"scope": "domain", "name": "acme"}, {"scope": "project", "name": "acme/ml"}],
    "owner_domain": "acme",
}


def test_what_a_checker_reads_as():
    assert I.checker_rows([GPU_IDLE, NIGHT]) == [
        [
            "gpu-idle",
            "utilization",
            "cpu_util under 10% and gpu_util under 5% over 20m, after a grace of 10m",
            "resource_group:a100",
            "the fleet",
        ],
        [
            "night",
            "activity",
            "no activity for 1h 30m (only while sessions wait in the queue)",
            "domain:acme, project:acme/ml",
            "acme",
        ],
    ]
    assert I.fmt_seconds(59) == "59s" and I.fmt_seconds(86400 + 61) == "1d 1m 1s"


def test_what_the_form_sends_and_what_it_refuses_itself():
    fields = {"timeout": " 60 ", "only_when_queue_waiting": False}
    body = I.create_body(" gpu ", "activity", fields, "domain:acme,\nresource_group: a100", "")
    assert body == {
        "name": "gpu",
        "kind": "activity",
        "options": {"timeout": 60, "only_when_queue_waiting": False},
        "bindings": [{"scope": "domain", "name": "acme"}, {"scope": "resource_group", "name": "a100"}],
    }
    # What the fields say goes as it is (the service judges it); a blank field is left out
    util = {
        "window": "20m",
        "grace": "",
        "thresholds.gpu_util": "2.5",
        "thresholds.mem": " ",
        "combine": "or",
    }
    assert I.options_body("utilization", util) == {
        "window": "20m",
        "thresholds": {"gpu_util": 2.5},
        "combine": "or",
        "only_when_queue_waiting": False,
    }
    with pytest.raises(I.FormError, match="'team:x' is not SCOPE:NAME"):
        I.parse_bindings("domain:acme, team:x")
    with pytest.raises(I.FormError, match="needs a name"):
        I.create_body("  ", "activity", {}, "", "")


def test_the_form_fields_are_the_options_the_service_reads():
    """OPTION_FIELDS against labfleet.reclaim.checkers: the same kinds, option names, thresholds and
    defaults, and the fields' start values are a checker the service accepts."""
    from labfleet.core.errors import InvalidInput
    from labfleet.core.models import IDLE_CHECKER_KINDS
    from labfleet.reclaim import checkers as K

    assert tuple(I.OPTION_FIELDS) == tuple(IDLE_CHECKER_KINDS) == I.KINDS
    for kind, fields in I.OPTION_FIELDS.items():
        names = {f.name.partition(".")[0] for f in fields}
        assert names == K._OPTIONS[kind], kind
        started = I.options_body(kind, {f.name: I.field_text(f, None) for f in fields})
        read = K.parse_options(kind, started)  # the service takes a new checker's fields as they are
        for f in fields:
            top, _, sub = f.name.partition(".")
            if f.default is not None:  # left out, the service's default is the field's
                left_out = {k: v for k, v in started.items() if k != top}
                assert K.parse_options(kind, left_out)[top] == f.default, f.name
            elif not sub:  # required: the service says so when the field is blank
                with pytest.raises(InvalidInput, match=f"needs a {top}"):
                    K.parse_options(kind, {k: v for k, v in started.items() if k != top})
        assert read
    thresholds = [f.name.partition(".")[2] for f in I.OPTION_FIELDS["utilization"] if f.type == "percent"]
    assert tuple(thresholds) == K.THRESHOLDS
    combine = next(f for f in I.OPTION_FIELDS["utilization"] if f.name == "combine")
    assert combine.choices == ("and", "or")
    # A checker read back into the fields says the same again
    values = I.option_values("utilization", GPU_IDLE["options"])
    assert (
        values["thresholds.gpu_util"] == "5" and values["thresholds.mem"] == "" and values["window"] == "1200"
    )
    assert I.options_body("utilization", values) == {**GPU_IDLE["options"], "only_when_queue_waiting": False}


class FakeClient:
    def __init__(self, can_change: bool = True, refuse: str = "") -> None:
        self.can_change, self.refuse = can_change, refuse
        self.checkers: list[dict[str, Any]] = [dict(GPU_IDLE)]
        self.sent: list[tuple[str, str, Any]] = []

    def get(self, path: str, **params: Any) -> Any:
        if path == "/idle-checkers/preview":
            return {"sessions": [{"session": "abcdef012345", "user": "alice", "checker": "gpu-idle",
                                  "reason": "utilization", "detail": "gpu_util 1% < 5%",
                                  "idle_for": 1300, "would_reclaim": True}]}  # fmt: skip
        return self.checkers

    def post(self, path: str, body: Any = None) -> Any:
        if self.refuse:
            raise ServiceError(self.refuse, 400)
        self.sent.append(("POST", path, body))
        self.checkers.append({**body, "owner_domain": None})
        return body

    def patch(self, path: str, body: Any) -> Any:
        self.sent.append(("PATCH", path, body))
        return body

    def delete(self, path: str) -> Any:
        self.sent.append(("DELETE", path, None))
        self.checkers = [c for c in self.checkers if not path.endswith("/" + c["name"])]
        return {}


def _all(box: W.Widget) -> list[W.Widget]:
    found = [box]
    for child in getattr(box, "children", ()):
        found += _all(child)
    return found


def _button(box: W.Widget, cls: str) -> W.Button:
    (b,) = [w for w in _all(box) if isinstance(w, W.Button) and cls in w._dom_classes]
    return b


def _text(box: W.Widget) -> str:
    return " ".join(str(getattr(w, "value", "")) for w in _all(box) if isinstance(w, W.HTML))


def _heading(title: str, note: str) -> W.HTML:
    return W.HTML(f"<h2>{title}</h2>")


def test_create_delete_and_preview_through_the_section():
    client = FakeClient()
    box = I.section(client, _heading)
    assert "gpu-idle" in _text(box)
    form = [w for w in _all(box) if isinstance(w, W.VBox) and "lf-idle-form" in w._dom_classes][0]
    fields = {w.description: w for w in _all(form) if hasattr(w, "description") and hasattr(w, "value")}
    fields["Name"].value = "night"
    fields["Kind"].value = "activity"  # the kind's own fields, with its example
    fields = {w.description: w for w in _all(form) if hasattr(w, "description") and hasattr(w, "value")}
    assert fields["Timeout (s)"].value == "3600" and "Window (s)" not in fields
    fields["Applies to"].value = "domain:acme"
    _button(box, "lf-idle-create").click()
    assert client.sent[-1] == (
        "POST",
        "/idle-checkers",
        {"name": "night", "kind": "activity", "options": {"timeout": 3600, "only_when_queue_waiting": False},
         "bindings": [{"scope": "domain", "name": "acme"}]},
    )  # fmt: skip
    assert "Created idle checker night." in _text(box) and "no activity for 1h" in _text(box)
    # Load puts a checker in the form; Save changes sends what the fields say
    _button(box, "lf-idle-load").click()  # the first in the list: gpu-idle
    form = [w for w in _all(box) if isinstance(w, W.VBox) and "lf-idle-form" in w._dom_classes][0]
    fields = {w.description: w for w in _all(form) if hasattr(w, "description") and hasattr(w, "value")}
    assert fields["Name"].value == "gpu-idle" and fields["GPU use under (%)"].value == "5"
    fields["GPU use under (%)"].value = "7"
    _button(box, "lf-idle-save").click()
    assert client.sent[-1] == (
        "PATCH",
        "/idle-checkers/gpu-idle",
        {"options": {**GPU_IDLE["options"], "thresholds": {"gpu_util": 7, "cpu_util": 10},
                     "only_when_queue_waiting": False},
         "bindings": [{"scope": "resource_group", "name": "a100"}], "description": ""},
    )  # fmt: skip
    assert "Saved idle checker gpu-idle." in _text(box)
    _button(box, "lf-idle-delete").click()  # asks first
    assert client.sent[-1][0] == "PATCH" and "Delete idle checker gpu-idle?" in _text(box)
    _button(box, "lf-idle-delete").click()
    assert client.sent[-1] == ("DELETE", "/idle-checkers/gpu-idle", None)
    assert "Deleted idle checker gpu-idle." in _text(box)
    _button(box, "lf-idle-preview").click()
    assert "gpu_util 1% &lt; 5%" in _text(box) or "gpu_util 1% < 5%" in _text(box)
    assert "reclaimed now" in _text(box) and "21m 40s" in _text(box)


def test_bad_input_shows_a_message_and_sends_nothing():
    client = FakeClient()
    box = I.section(client, _heading)
    form = [w for w in _all(box) if isinstance(w, W.VBox) and "lf-idle-form" in w._dom_classes][0]
    fields = {w.description: w for w in _all(form) if hasattr(w, "description") and hasattr(w, "value")}
    fields["Name"].value = "x"
    fields["Applies to"].value = "team:x"
    _button(box, "lf-idle-create").click()
    assert client.sent == [] and "is not SCOPE:NAME" in _text(box)
    refusing = FakeClient(refuse="an activity checker needs a timeout (seconds)")
    box = I.section(refusing, _heading)
    form = [w for w in _all(box) if isinstance(w, W.VBox) and "lf-idle-form" in w._dom_classes][0]
    fields = {w.description: w for w in _all(form) if hasattr(w, "description") and hasattr(w, "value")}
    fields["Name"].value = "x"
    _button(box, "lf-idle-create").click()
    assert "The labfleet service said: an activity checker needs a timeout (seconds)" in _text(box)


def test_a_monitor_reads_and_changes_nothing():
    box = I.section(FakeClient(can_change=False), _heading)
    assert _button(box, "lf-idle-create").disabled and _button(box, "lf-idle-delete").disabled
    assert "Read only" in _text(box)
