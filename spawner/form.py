"""The spawn form: a pure HTML builder from what the labfleet service says a user may launch.

``render(choices)`` takes the service's ``GET /api/users/{name}/launch-options`` answer: the
user's projects with the quota left for each, the images and resource groups they may use, and
the virtual folders they may mount.  It offers only those, bounds the CPU / memory / GPU inputs
by the quota left, and shows that quota.  The Hub wraps this in its own spawn page (Bootstrap 5
classes, like the Hub's templates).  Everything the service sends is escaped: names come from
admins and users.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from labfleet.core.display import fmt_slot, mem_input, slot_name
from labfleet.core.vocab import DEFAULT_SESSION_SLOTS, FOLDER_RIGHTS, SESSION_TYPES, SLOT_NAMES

_PERMISSION_BADGES = {"ro": "text-bg-secondary", "rw": "text-bg-primary", "wd": "text-bg-warning"}


def _options(items: Sequence[tuple[str, str, Mapping[str, str]]], selected: str | None) -> str:
    out = []
    for value, label, attrs in items:
        extra = "".join(f' {k}="{escape(v)}"' for k, v in attrs.items())
        sel = " selected" if value == selected else ""
        out.append(f'<option value="{escape(value)}"{extra}{sel}>{escape(label)}</option>')
    return "\n".join(out)


# Free now, per slot, as the service's ``free_now`` names it: ``gpu`` whole free devices on one node,
# ``gpu.shares`` the largest free part of one device.
def _quota_table(project: Mapping[str, Any], group: Mapping[str, Any]) -> str:
    """What the quota leaves in ``project`` beside what ``group`` can give one session now."""
    left = project.get("left") or {}
    free = group.get("free_now") or {}
    rows = "".join(
        f"<tr><th scope='row'>{escape(slot_name(slot))}</th>"
        f"<td>{escape(fmt_slot(slot, left.get(slot)))}</td>"
        f"<td>{escape(fmt_slot(slot, free.get(slot)) if slot in free else '')}</td></tr>"
        for slot in SLOT_NAMES
    )
    nodes = ""
    if "alive_nodes" in free:
        nodes = f" ({free['alive_nodes']} of {free.get('nodes', 0)} nodes up)"
    return (
        f'<table class="table table-sm lf-quota" data-project="{escape(project["name"])}"'
        f' data-group="{escape(group["name"])}" hidden>'
        f"<caption>What the quota of {escape(project['name'])} leaves, and what resource group "
        f"{escape(group['name'])} can give one session now{escape(nodes)}: a session runs on one node, "
        "so it gets at most what one node has free.</caption>"
        "<thead><tr><th scope='col'></th><th scope='col'>Quota left</th><th scope='col'>Free now</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def _script_json(data: Any) -> str:
    """JSON safe inside <script>: no '</script>' or HTML from names can end the element."""
    return json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _owner(owner: str) -> str:
    """``user:alice`` / ``project:acme/ml`` as people read it."""
    kind, _, name = owner.partition(":")
    if kind == "user":
        return "yours" if not name else f"user {name}"
    if kind == "project":
        return f"project {name}"
    return owner


def _vfolders(folders: Sequence[Mapping[str, Any]], previous: Sequence[str]) -> str:
    """One checkbox per mountable folder (value: its id). Automatic (dot) folders are shown checked
    and disabled, with no name: the service mounts them, the form does not send them."""
    rows = []
    for i, f in enumerate(folders):
        if not f.get("mountable", True) or not f.get("id"):
            continue
        fid, name = str(f["id"]), str(f.get("name") or f["id"])
        owner = str(f.get("owner") or "")
        permission = str(f.get("permission") or "")
        auto = bool(f.get("auto"))
        attrs = f'class="form-check-input" type="checkbox" id="lf-vf-{i}"'
        if auto:
            attrs += " checked disabled"
        else:
            attrs += f' name="vfolders" value="{escape(fid)}"'
            if fid in previous or name in previous:
                attrs += " checked"
        badges = ""
        if permission in FOLDER_RIGHTS:
            label, colour = FOLDER_RIGHTS[permission], _PERMISSION_BADGES[permission]
            badges += f' <span class="badge {colour}">{label}</span>'
        mode = str(f.get("usage_mode") or "general")
        if mode != "general":
            badges += f' <span class="badge text-bg-light border">{escape(mode)}</span>'
        note = ' <span class="form-text">mounted automatically</span>' if auto else ""
        # A project's folder goes only into sessions of that project: the script hides the others.
        project = owner.partition(":")[2] if owner.startswith("project:") else ""
        data = f' data-project="{escape(project)}"' if project else ""
        rows.append(
            f'    <div class="form-check lf-vfolder"{data}>\n'
            f"      <input {attrs}>\n"
            f'      <label class="form-check-label" for="lf-vf-{i}">{escape(name)}'
            f' <span class="text-body-secondary small">{escape(_owner(owner))}</span>{badges}{note}</label>\n'
            "    </div>"
        )
    if not rows:
        return ""
    body = "\n".join(rows)
    return f"""
  <fieldset class="mb-3" id="lf-vfolders">
    <legend class="form-label fs-6">Virtual folders</legend>
    <div class="form-text mb-2">Checked folders appear in the session at ~/vfolders/&lt;name&gt;.</div>
{body}
  </fieldset>"""


# The Hub's spawn page has its own Start button under the form: with no form to send, it only
# earns a refusal, so it goes.
_NO_START = (
    "<script>(function () { function hide() { document.querySelectorAll('#spawn_form [type=submit]')"
    ".forEach(function (b) { b.disabled = true; b.hidden = true; }); }"
    # The button comes after the form in the page: once the page is read.
    " if (document.readyState === 'loading') { document.addEventListener('DOMContentLoaded', hide); }"
    " else { hide(); } })();</script>"
)


def unavailable(message: str) -> str:
    """Shown instead of the form when the service cannot say what the user may launch."""
    return (
        '<div class="alert alert-danger" role="alert">labfleet cannot offer sessions right now: '
        f"{escape(message)}</div>{_NO_START}"
    )


def no_project(choices: Mapping[str, Any]) -> str:
    """Shown instead of the form to someone in no project: who can add them, by name; an admin is
    sent to the console, where they manage projects, and a monitor is told they only read."""
    role = choices.get("role")
    admins = [str(a) for a in choices.get("project_admins") or [] if a != choices.get("user")]
    if role == "monitor":
        text = "You are a monitor: you read the fleet in the Fleet admin console and start no sessions."
    elif role in ("admin", "superadmin"):
        text = (
            "You are in no project, so you have no session to start here. As an admin, add yourself "
            "to a project on the Fleet admin console's Domains & Projects page."
        )
    elif admins:
        text = f"You are not in any project yet: ask {', '.join(admins)} to add you to one."
    else:
        text = "You are not in any project yet: ask an administrator to add you to one."
    return f'<div class="alert alert-info" role="status">{escape(text)}</div>{_NO_START}'


def render(
    choices: Mapping[str, Any], previous: Mapping[str, Any] | None = None, preview_url: str = ""
) -> str:
    """The form; ``preview_url``: the service's ``GET /api/sessions/preview``, which the form asks,
    as the user changes it, whether the request would start, wait or be refused (and says why)."""
    previous = previous or {}
    projects = list(choices.get("projects") or [])
    if not projects:
        return no_project(choices)
    images = list(choices.get("images") or [])
    groups = list(choices.get("resource_groups") or [])
    _Item = tuple[str, str, Mapping[str, str]]
    project_items: list[_Item] = [(p["name"], p["name"], {}) for p in projects]
    image_items = [
        (
            i["name"],
            i.get("display_name") or i["name"],
            {
                "data-projects": " ".join(i.get("projects") or []),
                "data-min": json.dumps(i.get("min_slots") or {}),
            },
        )
        for i in images
    ]
    group_items = [
        (g["name"], g["name"], {"data-types": " ".join(g.get("session_types") or SESSION_TYPES)})
        for g in groups
    ]
    type_items: list[_Item] = [(t, t, {}) for t in SESSION_TYPES]
    left = _script_json({p["name"]: p.get("left") or {} for p in projects})

    def prev(key: str, default: str = "") -> str:
        return escape(str(previous.get(key, default)))

    # The service's defaults (the same in every launcher); these constants only for an older service.
    defaults = {**DEFAULT_SESSION_SLOTS, **(choices.get("defaults") or {})}

    quotas = "\n".join(_quota_table(p, g) for p in projects for g in groups)
    chosen = previous.get("vfolders") or []
    folders = _vfolders(
        list(choices.get("vfolders") or []), [str(v) for v in chosen] if isinstance(chosen, list) else []
    )
    return f"""
<div class="labfleet-spawn-form">
  <div class="mb-3">
    <label for="lf-project" class="form-label">Project</label>
    <select id="lf-project" name="project" class="form-select" required>
{_options(project_items, previous.get("project"))}
    </select>
  </div>
  <div class="mb-3">
    <label for="lf-image" class="form-label">Environment (image)</label>
    <select id="lf-image" name="image" class="form-select" required>
{_options(image_items, previous.get("image"))}
    </select>
  </div>
  <div class="mb-3">
    <label for="lf-group" class="form-label">Resource group</label>
    <select id="lf-group" name="resource_group" class="form-select">
{_options(group_items, previous.get("resource_group"))}
    </select>
  </div>
  <div class="row g-3 mb-3">
    <div class="col-sm-4">
      <label for="lf-cpu" class="form-label">CPU cores</label>
      <input id="lf-cpu" name="cpu" type="number" class="form-control" min="0.1" step="0.1"
             value="{prev("cpu", str(defaults["cpu"]))}">
    </div>
    <div class="col-sm-4">
      <label for="lf-mem" class="form-label">Memory</label>
      <input id="lf-mem" name="mem" type="text" class="form-control" pattern="[0-9.]+ *[kKmMgGtT]?i?[bB]?"
             value="{prev("mem", mem_input(defaults["mem"]))}" aria-describedby="lf-mem-help">
      <div id="lf-mem-help" class="form-text">e.g. 512m, 4g</div>
    </div>
    <div class="col-sm-4">
      <label for="lf-gpu" class="form-label">GPU</label>
      <input id="lf-gpu" name="gpu" type="number" class="form-control" min="0" step="0.01" list="lf-gpu-steps"
             value="{prev("gpu", str(defaults["gpu"]))}" aria-describedby="lf-gpu-help">
      <datalist id="lf-gpu-steps"><option value="0.25"><option value="0.5"><option value="1"><option value="2"></datalist>
      <div id="lf-gpu-help" class="form-text">Whole devices (1, 2) or a fraction of one (0.25, 0.5)</div>
    </div>
  </div>
  <div class="mb-3">
    <label for="lf-type" class="form-label">Session type</label>
    <select id="lf-type" name="type" class="form-select">
{_options(type_items, previous.get("type", "interactive"))}
    </select>
  </div>
  <div class="mb-3" id="lf-command-row">
    <label for="lf-command" class="form-label">Command (batch and inference)</label>
    <textarea id="lf-command" name="command" class="form-control" rows="2"
              placeholder="python train.py --epochs 3">{prev("command")}</textarea>
  </div>{folders}
  <div class="lf-quotas">
{quotas}
  </div>
  <div id="lf-preview" class="alert" role="status" hidden></div>
</div>
<script>
(function () {{
  var left = {left};
  var previewUrl = {_script_json(preview_url)};
  var group = document.getElementById("lf-group");
  var project = document.getElementById("lf-project");
  var image = document.getElementById("lf-image");
  var type = document.getElementById("lf-type");
  var command = document.getElementById("lf-command-row");
  function bound(id, value) {{
    var input = document.getElementById(id);
    if (value === null || value === undefined) {{ input.removeAttribute("max"); }}
    else {{ input.setAttribute("max", value); }}
  }}
  function update() {{
    var p = project.value, q = left[p] || {{}};
    document.querySelectorAll(".lf-quota").forEach(function (t) {{
      t.hidden = t.dataset.project !== p || t.dataset.group !== group.value;
    }});
    Array.prototype.forEach.call(image.options, function (o) {{
      o.hidden = o.dataset.projects.split(" ").indexOf(p) < 0;
    }});
    if (image.selectedOptions.length && image.selectedOptions[0].hidden) {{
      var first = Array.prototype.find.call(image.options, function (o) {{ return !o.hidden; }});
      if (first) {{ image.value = first.value; }}
    }}
    document.querySelectorAll(".lf-vfolder[data-project]").forEach(function (row) {{
      // Another project's folder: hidden, and disabled so that it is not sent.
      row.hidden = row.dataset.project !== p;
      var box = row.querySelector("input[name=vfolders]");
      if (box) {{ box.disabled = row.hidden; }}
    }});
    bound("lf-cpu", q.cpu);
    var g = q["gpu.shares"];
    bound("lf-gpu", g === undefined ? q.gpu : g);
    // A disabled field is not sent: an interactive session takes no command.
    command.hidden = type.value === "interactive";
    document.getElementById("lf-command").disabled = command.hidden;
  }}
  // Whether the request would start now, wait (and why) or be refused: the service judges, as
  // admission would, and changes nothing. A page that cannot ask it shows nothing.
  var note = document.getElementById("lf-preview"), asked = 0, timer = null;
  function request() {{
    var form = document.getElementById("lf-project").form;
    var slots = {{cpu: parseFloat(document.getElementById("lf-cpu").value || "0"),
                 mem: document.getElementById("lf-mem").value}};
    // As the spawner reads the field: whole devices when integral, else a fraction of one.
    var gpu = parseFloat(document.getElementById("lf-gpu").value || "0");
    if (gpu > 0) {{ slots[Number.isInteger(gpu) ? "gpu" : "gpu.shares"] = gpu; }}
    var body = {{project: project.value, resource_group: group.value, type: type.value, slots: slots}};
    if (image.value) {{ body.image = image.value; }}
    if (type.value !== "interactive") {{ body.command = document.getElementById("lf-command").value || "true"; }}
    var folders = form ? Array.prototype.map.call(
      form.querySelectorAll("input[name=vfolders]:checked:not(:disabled)"), function (b) {{ return b.value; }}) : [];
    if (folders.length) {{ body.vfolders = folders; }}
    return body;
  }}
  function show(answer) {{
    if (!answer || !answer.outcome) {{ note.hidden = true; return; }}
    note.className = "alert " + ({{starts: "alert-success", waits: "alert-warning", refused: "alert-danger"}}[answer.outcome] || "alert-info");
    note.dataset.outcome = answer.outcome;
    note.textContent = answer.message;
    note.hidden = false;
  }}
  function preview() {{
    if (!previewUrl || !window.fetch) {{ return; }}
    var mine = ++asked;
    var url = previewUrl + "?request=" + encodeURIComponent(JSON.stringify(request()));
    // "no-cors" on this same origin: the answer is readable, and the Hub's cookie rules ask no XSRF
    // token of such a GET (as the announcement in templates/page.html reads it).
    var opts = {{mode: "no-cors", credentials: "same-origin", cache: "no-store"}};
    fetch(url, opts)
      .then(function (r) {{
        // Not logged in to the service yet: its page logs in through the Hub, then ask again.
        if (r.status !== 401) {{ return r; }}
        var home = previewUrl.replace(/api\\/sessions\\/preview$/, "");
        return fetch(home, opts).then(function () {{ return fetch(url, opts); }});
      }})
      .then(function (r) {{ return r.ok ? r.json() : r.json().then(function (e) {{
        return {{outcome: "refused", message: e.message || ("HTTP " + r.status)}};
      }}); }})
      .then(function (a) {{ if (mine === asked) {{ show(a); }} }})
      .catch(function () {{ if (mine === asked) {{ note.hidden = true; }} }});
  }}
  function changed() {{
    update();
    clearTimeout(timer);
    timer = setTimeout(preview, 250);
  }}
  [project, group, type, image].forEach(function (el) {{ el.addEventListener("change", changed); }});
  ["lf-cpu", "lf-mem", "lf-gpu", "lf-command"].forEach(function (id) {{
    document.getElementById(id).addEventListener("input", changed);
  }});
  document.querySelectorAll("input[name=vfolders]").forEach(function (b) {{ b.addEventListener("change", changed); }});
  changed();
}})();
</script>
"""
