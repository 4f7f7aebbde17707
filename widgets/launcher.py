"""SessionLauncher: start a new session in one of my projects, with the quota left shown.

The choices come from the service's ``launch-options`` (the same answer the spawn form uses): my projects
with what is left for each, the images and resource groups I may use, the folders I may mount. The inputs
are bounded by what is left; the service still decides (quotas move meanwhile) and its refusal is shown.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import ipywidgets as W
from traitlets import Float

from labfleet.core.display import esc, fmt_slot, number, slot_name
from labfleet.core.vocab import DEFAULT_SESSION_SLOTS, SESSION_TYPES, SLOT_NAMES

from .base import FleetWidget, error_message

GiB = 2**30
# Input bounds where the quota names none: more than a node has is a typo (spawner/options.py agrees).
MAX_CPU = 1024.0
MAX_MEM_GIB = 64 * 1024.0
_STYLE = {"description_width": "120px"}
_SERVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _wide() -> dict[str, Any]:
    """One form row's look (a Layout each: a shared one would be one model for every control)."""
    return {"style": _STYLE, "layout": W.Layout(width="420px")}


def project_left(choices: dict[str, Any], project: str | None) -> dict[str, Any]:
    """What is left for ``project`` (slot -> amount, None: unlimited)."""
    for p in choices.get("projects") or []:
        if p.get("name") == project:
            return dict(p.get("left") or {})
    return {}


def build_request(
    *,
    project: str,
    type: str,
    image: str = "",
    resource_group: str = "",
    cpu: float = 0,
    mem_gib: float = 0,
    gpu: float = 0,
    vfolders: tuple[str, ...] | list[str] = (),
    command: str = "",
) -> dict[str, Any]:
    """The spawn options for the form's values (pure); zero or blank means "the default"."""
    out: dict[str, Any] = {"project": project, "type": type}
    if image:
        out["image"] = image
    if resource_group:
        out["resource_group"] = resource_group
    if cpu > 0:
        out["cpu"] = round(cpu, 3)
    if mem_gib > 0:
        out["mem"] = int(round(mem_gib * GiB))
    if gpu > 0:
        g = round(gpu, 2)
        out["gpu"] = int(g) if g == int(g) else g
    if vfolders:
        out["vfolders"] = list(vfolders)
    if type != "interactive":
        out["command"] = command.strip()
    return out


def request_slots(options: dict[str, Any]) -> dict[str, float]:
    """The request as quotas count it: a whole GPU also counts as one GPU share."""
    out: dict[str, float] = {}
    if options.get("cpu"):
        out["cpu"] = number(options["cpu"])
    if options.get("mem"):
        out["mem"] = number(options["mem"])
    gpu = number(options.get("gpu"))
    if gpu:
        out["gpu.shares"] = gpu
        if gpu == int(gpu):
            out["gpu"] = gpu
    return out


def problems(name: str, options: dict[str, Any]) -> list[str]:
    """What is wrong with the request before anyone is asked (pure): a person's words, or []."""
    out = []
    if name and not _SERVER_NAME.match(name):
        out.append(
            f"name {name!r}: use letters, digits, '.', '_' or '-' (up to 64), starting with a letter or digit"
        )
    if not options.get("project"):
        out.append("choose a project")
    gpu = number(options.get("gpu"))
    if gpu > 1 and gpu != int(gpu):
        out.append(f"more than one GPU comes in whole devices (1, 2, ...), not {gpu:g}")
    if options.get("type", "interactive") != "interactive" and not options.get("command"):
        article = "an" if options["type"][0] in "aeiou" else "a"
        out.append(f"{article} {options['type']} session needs a command")
    return out


def summary_rows(options: dict[str, Any], left: dict[str, Any]) -> list[dict[str, Any]]:
    """Per slot: what the request would use, what is left for the project, and whether it fits (pure)."""
    req = request_slots(options)
    rows = []
    for slot in SLOT_NAMES:
        if slot == "gpu" and "gpu" not in req:
            continue
        amount, room = req.get(slot, 0.0), left.get(slot)
        rows.append(
            {
                "slot": slot,
                "request": amount,
                "left": room,
                "fits": room is None or amount <= number(room) + 1e-9,
            }
        )
    return rows


def describe_answer(name: str, answer: Any) -> str:
    """The answer to a start, in words (pure). The session's endpoint passes on the Hub's status: 201 when
    the server is up, 202 while it starts (or waits in the queue; Sessions shows its position)."""
    label = name or "(default)"
    status = answer.get("status") if isinstance(answer, dict) else None
    if status == 201:
        return f"Session {label} has started."
    if status == 202:
        return f"Session {label} is starting (a queued one waits for a free GPU): see it in your sessions."
    return f"Session {label} was asked to start."


class SessionLauncher(FleetWidget):
    """Start a session: project, image, resource group, CPU, memory, GPU, folders, type and name."""

    title = "Start a session"
    refresh_interval = Float(
        30.0, help="Seconds between refreshes of the choices and the quota left (0: once)."
    )
    max_gpu = Float(8.0, help="The GPU input's upper end where no quota bounds it (whole devices).")

    def __init__(self, client: Any = None, refresh_interval: float | None = None, **kwargs: Any) -> None:
        self.choices: dict[str, Any] = {}
        self.left: dict[str, Any] = {}
        self.summary: list[dict[str, Any]] = []
        self.started: list[dict[str, Any]] = []  # the service's answers to this widget's starts
        self._on_started: list[Callable[[Any], Any]] = []
        self.project = W.Dropdown(description="Project", **_wide())
        self.session_type = W.ToggleButtons(options=list(SESSION_TYPES), description="Type", style=_STYLE)
        self.command = W.Text(description="Command", placeholder="python train.py", disabled=True, **_wide())
        self.image = W.Dropdown(description="Image", **_wide())
        self.resource_group = W.Dropdown(description="Resource group", **_wide())
        self.cpu = W.BoundedFloatText(
            value=DEFAULT_SESSION_SLOTS["cpu"],
            min=0.0,
            max=MAX_CPU,
            step=0.5,
            description="CPU cores",
            **_wide(),
        )
        self.mem = W.BoundedFloatText(
            value=DEFAULT_SESSION_SLOTS["mem"] / GiB,
            min=0.0,
            max=MAX_MEM_GIB,
            step=0.5,
            description="Memory (GiB)",
            **_wide(),
        )
        self.gpu = W.FloatSlider(
            value=0.0, min=0.0, max=1.0, step=0.01, readout_format=".2f", description="GPU", **_wide()
        )
        self.vfolders = W.SelectMultiple(description="Folders", rows=3, **_wide())
        self.name = W.Text(description="Name", placeholder="a server name, e.g. train", **_wide())
        self.start_button = W.Button(description="Start", button_style="primary", icon="play")
        self.quota_box = W.HTML()
        super().__init__(client, refresh_interval, **kwargs)
        self.start_button.on_click(lambda b: self.busy(b, self.start))
        self.project.observe(self._project_changed, "value")
        self.session_type.observe(self._type_changed, "value")
        for control in (self.cpu, self.mem, self.gpu, self.command, self.name, self.image):
            control.observe(self._update_summary, "value")
        self.children = [
            self.header,
            self.project,
            self.session_type,
            self.command,
            self.image,
            self.resource_group,
            self.cpu,
            self.mem,
            self.gpu,
            self.vfolders,
            self.name,
            self.quota_box,
            self.start_button,
            self.message_box,
            self.error_box,
        ]

    async def fetch(self) -> dict[str, Any]:
        return await self.client.launch_options()

    def render(self, choices: dict[str, Any]) -> None:
        first = not self.choices
        self.choices = choices
        defaults = choices.get("defaults") or {}
        if first and defaults:  # the service's defaults, as the spawn form and the sidebar offer them
            self.cpu.value = number(defaults.get("cpu", self.cpu.value))
            self.mem.value = number(defaults.get("mem", self.mem.value * GiB)) / GiB
            self.gpu.value = number(defaults.get("gpu", self.gpu.value))
        names = [str(p["name"]) for p in choices.get("projects") or []]
        keep = self.project.value if self.project.value in names else (names[0] if names else None)
        self.project.options = names
        self.project.value = keep
        self.start_button.disabled = not names or self.start_button in self.busy_buttons
        if not names:
            self.show_message("You are in no project: ask your domain admin to add you to one.", error=True)
        self._project_changed()

    def _project_changed(self, change: Any = None) -> None:
        project = self.project.value
        self.left = project_left(self.choices, project)
        images = [i for i in self.choices.get("images") or [] if project in (i.get("projects") or [project])]
        image_options = [("(default)", "")] + [
            (str(i.get("display_name") or i["name"]), str(i["name"])) for i in images
        ]
        self._set_options(self.image, image_options)
        folders = [
            f
            for f in self.choices.get("vfolders") or []
            if f.get("mountable", True)
            and not f.get("auto")
            and (not str(f.get("owner", "")).startswith("project:") or f["owner"] == f"project:{project}")
        ]
        keep = set(self.vfolders.value)
        self.vfolders.options = [
            (f"{f['name']} ({f.get('permission') or '?'})", str(f["id"])) for f in folders
        ]
        self.vfolders.value = tuple(v for _, v in self.vfolders.options if v in keep)
        self._bound(self.cpu, self.left.get("cpu"), MAX_CPU)
        mem_left = self.left.get("mem")
        self._bound(self.mem, None if mem_left is None else number(mem_left) / GiB, MAX_MEM_GIB)
        shares, whole = self.left.get("gpu.shares"), self.left.get("gpu")
        gpu_max = (
            number(shares) if shares is not None else number(whole) if whole is not None else self.max_gpu
        )
        self.gpu.max = max(gpu_max, 0.0)
        self._type_changed()

    def _type_changed(self, change: Any = None) -> None:
        stype = self.session_type.value
        self.command.disabled = stype == "interactive"
        groups = [
            g
            for g in self.choices.get("resource_groups") or []
            if stype in (g.get("session_types") or SESSION_TYPES)
        ]
        self._set_options(
            self.resource_group, [(str(g["name"]), str(g["name"])) for g in groups] or [("(default)", "")]
        )
        self._update_summary()

    @staticmethod
    def _set_options(dropdown: W.Dropdown, options: list[tuple[str, str]]) -> None:
        keep = dropdown.value
        dropdown.options = options
        values = [v for _, v in options]
        dropdown.value = keep if keep in values else (values[0] if values else None)

    @staticmethod
    def _bound(control: W.BoundedFloatText, left: Any, default_max: float) -> None:
        control.max = default_max if left is None else max(number(left), 0.0)

    def request(self) -> tuple[str, dict[str, Any]]:
        """The server name and spawn options the form holds now."""
        options = build_request(
            project=self.project.value or "",
            type=self.session_type.value,
            image=self.image.value or "",
            resource_group=self.resource_group.value or "",
            cpu=self.cpu.value,
            mem_gib=self.mem.value,
            gpu=self.gpu.value,
            vfolders=self.vfolders.value,
            command=self.command.value,
        )
        return self.name.value.strip(), options

    def _update_summary(self, change: Any = None) -> None:
        _, options = self.request()
        self.summary = summary_rows(options, self.left)
        cells = []
        for row in self.summary:
            slot = row["slot"]
            style = "" if row["fits"] else ' style="color: #b00020; font-weight: bold"'
            cells.append(
                f"<tr{style}><td>{esc(slot_name(slot))}</td><td>{esc(fmt_slot(slot, row['request']))}</td>"
                f"<td>{esc(fmt_slot(slot, row['left']))}</td></tr>"
            )
        project = esc(self.project.value or "-")
        over = [r for r in self.summary if not r["fits"]]
        note = (
            f"<div style='color: #b00020'>More than {project} has left: the service will refuse it.</div>"
            if over
            else ""
        )
        self.quota_box.value = (
            f"<table class='lf-launch-quota'><tr><th></th><th>this session</th><th>left in {project}</th></tr>"
            + "".join(cells)
            + f"</table>{note}"
        )

    def on_started(self, callback: Callable[[Any], Any]) -> None:
        """Call ``callback(answer)`` after each session this widget starts (e.g. to refresh a Sessions)."""
        self._on_started.append(callback)

    async def start(self) -> dict[str, Any] | None:
        """Start the session the form describes; the outcome (or the refusal) shows in the widget."""
        name, options = self.request()
        wrong = problems(name, options)
        if wrong:
            self.show_message("; ".join(wrong), error=True)
            return None
        label = name or "(default)"
        try:
            answer = await self.client.start_session(name, options)
        except Exception as e:
            self.show_message(f"could not start {label}: {error_message(e)}", error=True)
            await self.refresh()
            return None
        self.show_message(describe_answer(name, answer))
        self.started.append(answer)
        for callback in self._on_started:
            callback(answer)
        await self.refresh()
        return answer
