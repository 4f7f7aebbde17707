"""The Configurations page: the labfleet service's settings in force, where each came from, and
what changes while the fleet runs.

One request, ``GET /api/configuration`` (admins and monitors). Each setting comes with its value
(secrets only as "set" or "not set"), its source (the command line, which is where the Hub's
``configure()`` puts its settings; the config file ``labfleet_service_config.py``; a ``LABFLEET_*``
variable of the service's environment; or the default) and a line of its help. No setting changes
while the service runs, and the page says so; what does change at run time is state in the DB,
changed through the API, listed under the settings with the storage hosts the DB holds now.

Pure helpers first (the answer in, HTML text out, unit-tested without a kernel); :func:`page`
builds the widgets, with a search box over names, values, sources and help.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import ipywidgets as W

from labfleet.console.console import guarded
from labfleet.console.resources import muted, section
from labfleet.core.display import esc, fmt_bytes

MAX_VALUE = 160  # characters of a value shown in the table (the cell's title has it all)
SOURCE_TONE = {"command line": "cli", "config file": "file", "environment": "env", "default": "default"}

STYLE = """<style>
table.lf-settings { table-layout: fixed; width: 100%; max-width: 1340px; }
table.lf-settings td, table.lf-settings th { vertical-align: top; line-height: 1.4; }
table.lf-settings tr.lf-section-row th { padding-top: 16px; font-size: 1.08em; border-bottom: 2px solid
  var(--jp-border-color1, #bdbdbd); }
table.lf-runtime, table.lf-hosts { table-layout: auto; width: auto; }
table.lf-settings td.lf-value { font-family: var(--jp-code-font-family, monospace); font-size: 0.9em;
  max-width: 420px; overflow-wrap: anywhere; }
table.lf-settings td.lf-help { color: var(--jp-ui-font-color2, #616161); max-width: 460px; font-size: 0.9em; }
.lf-src { padding: 1px 7px; border-radius: 9px; font-size: 0.85em; font-weight: 600; white-space: nowrap; }
.lf-src-cli { background: var(--md-blue-100, #bbdefb); color: var(--md-blue-900, #0d47a1); }
.lf-src-file { background: var(--md-purple-100, #e1bee7); color: var(--md-purple-900, #4a148c); }
.lf-src-env { background: var(--md-teal-100, #b2dfdb); color: var(--md-teal-900, #004d40); }
.lf-src-default { background: var(--md-grey-200, #eeeeee); color: var(--md-grey-800, #424242); }
.lf-admin .lf-muted { color: var(--jp-ui-font-color2, #757575); font-size: 0.9em; line-height: 1.45; }
.lf-admin .lf-src-from { color: var(--jp-ui-font-color2, #757575); font-size: 0.85em; }
</style>"""


# ---------------------------------------------------------------- pure


def fmt_value(value: Any, limit: int = MAX_VALUE) -> str:
    """A setting's value as one line: strings as they are (empty shown as ""), the rest as JSON,
    cut at ``limit`` characters."""
    if isinstance(value, str):
        text = value if value else '""'
    elif isinstance(value, float) and value.is_integer():
        text = str(int(value))
    else:
        text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def matches(setting: Mapping[str, Any], query: str) -> bool:
    """Whether a setting matches the search: every word of ``query`` in its name, value, source,
    section, environment variables or help (case-insensitive)."""
    words = query.lower().split()
    if not words:
        return True
    hay = " ".join(
        [
            str(setting.get("name", "")),
            fmt_value(setting.get("value"), 10_000),
            str(setting.get("source", "")),
            str(setting.get("source_detail") or ""),
            str(setting.get("section", "")),
            " ".join(setting.get("environment") or ()),
            str(setting.get("help", "")),
        ]
    ).lower()
    return all(w in hay for w in words)


def by_section(
    settings: Iterable[Mapping[str, Any]], sections: Sequence[str], query: str = ""
) -> list[tuple[str, list[Mapping[str, Any]]]]:
    """(section, its settings that match ``query``) in the service's order of sections; empty ones left out."""
    found: dict[str, list[Mapping[str, Any]]] = {}
    for s in settings:
        if matches(s, query):
            found.setdefault(str(s.get("section", "other")), []).append(s)
    order = list(sections) + sorted(k for k in found if k not in sections)
    return [(name, found[name]) for name in order if name in found]


def source_html(setting: Mapping[str, Any]) -> str:
    src = str(setting.get("source", ""))
    badge = f'<span class="lf-src lf-src-{SOURCE_TONE.get(src, "default")}">{esc(src)}</span>'
    detail = setting.get("source_detail")
    if detail:
        badge += f'<div class="lf-src-from">{esc(detail)}</div>'
    return badge


def help_line(setting: Mapping[str, Any]) -> str:
    """A setting's help, and the variables its default reads when the help does not name them."""
    text = str(setting.get("help", ""))
    unnamed = [v for v in setting.get("environment") or () if v not in text]
    if unnamed and setting.get("source") != "environment":
        text += " Default read from " + ", ".join(f"${v}" for v in unnamed) + "."
    return text


def settings_html(groups: Sequence[tuple[str, Sequence[Mapping[str, Any]]]]) -> str:
    """Every setting in one table (so the columns line up), a heading row per section: name, value,
    where it came from (with the file or variable), what it does."""
    rows = []
    for name, items in groups:
        rows.append(
            f'<tr class="lf-section-row"><th colspan="4">{esc(name[:1].upper() + name[1:])}</th></tr>'
        )
        for s in items:
            full = fmt_value(s.get("value"), 100_000)
            rows.append(
                f'<tr data-setting="{esc(s.get("name"))}" data-source="{esc(s.get("source"))}">'
                f"<td><b>{esc(s.get('name'))}</b></td>"
                f'<td class="lf-value" title="{esc(full)}">{esc(fmt_value(s.get("value")))}</td>'
                f"<td>{source_html(s)}</td>"
                f'<td class="lf-help">{esc(help_line(s))}</td></tr>'
            )
    head = "".join(f"<th>{h}</th>" for h in ("setting", "value", "from", "what it does"))
    cols = '<colgroup><col style="width: 210px"><col style="width: 380px"><col style="width: 170px"><col></colgroup>'
    return (
        f'{STYLE}<div class="lf-admin"><table class="lf-table lf-settings">{cols}<tr>{head}</tr>'
        f"{''.join(rows)}</table></div>"
    )


def source_counts(settings: Iterable[Mapping[str, Any]]) -> str:
    """``3 from the command line, 1 from the config file, 2 from the environment, 30 defaults``."""
    counts: dict[str, int] = {}
    for s in settings:
        counts[str(s.get("source"))] = counts.get(str(s.get("source")), 0) + 1
    words = {
        "command line": "from the command line",
        "config file": "from the config file",
        "environment": "from the environment",
        "default": "defaults",
    }
    return ", ".join(f"{counts[k]} {w}" for k, w in words.items() if counts.get(k))


def run_time_html(items: Iterable[Mapping[str, Any]]) -> str:
    rows = "".join(
        f"<tr><td>{esc(i.get('what'))}</td><td><code>{esc(i.get('where'))}</code></td>"
        f'<td class="lf-help">{esc(i.get("note") or "")}</td></tr>'
        for i in items
    )
    head = "<tr><th>what</th><th>changed through</th><th>note</th></tr>"
    return f'{STYLE}<div class="lf-admin"><table class="lf-table lf-settings lf-runtime">{head}{rows}</table></div>'


def hosts_html(hosts: Iterable[Mapping[str, Any]]) -> str:
    rows = []
    for h in hosts:
        disk = h.get("disk") or {}
        cap = h.get("capacity") or 0
        rows.append(
            f"<tr><td><b>{esc(h.get('name'))}</b></td><td>{esc(h.get('path', '—'))}</td>"
            f"<td>{'active' if h.get('is_active') else 'inactive'}</td>"
            f"<td>{esc(fmt_bytes(cap)) if cap else 'the disk'}</td>"
            f"<td>{esc(fmt_bytes(h.get('used', 0)))}</td>"
            f"<td>{esc(fmt_bytes(disk.get('free'))) if disk else '—'}</td>"
            f"<td>{esc(', '.join(h.get('default_permissions') or ()) or '—')}</td></tr>"
        )
    head = "".join(
        f"<th>{c}</th>" for c in ("host", "path", "state", "capacity", "used", "disk free", "everyone may")
    )
    return f'{STYLE}<div class="lf-admin"><table class="lf-table lf-hosts"><tr>{head}</tr>{"".join(rows)}</table></div>'


# ---------------------------------------------------------------- the page (widgets)


def page(client: Any) -> W.VBox:
    """The whole Configurations page below its header: a search box, the settings by section, what
    changes at run time, and the storage hosts in the DB."""
    conf: dict[str, Any] = {}
    search = W.Text(
        placeholder="search settings: a name, a value, a source, a variable...",
        description="Search",
        continuous_update=True,
        layout=W.Layout(width="480px"),
    )
    search.add_class("lf-settings-search")
    settings_box = W.VBox()
    rest = W.VBox()
    refresh_button = W.Button(description="Refresh", icon="refresh", layout=W.Layout(width="110px"))

    def show_settings(*_: Any) -> None:
        groups = by_section(conf.get("settings") or (), conf.get("sections") or (), search.value)
        if not groups:
            settings_box.children = [muted(f"No setting matches “{search.value}”.")]
            return
        settings_box.children = [W.HTML(settings_html(groups))]

    def build() -> W.VBox:
        conf.clear()
        conf.update(client.get("/configuration"))
        settings = conf.get("settings") or []
        cfg = conf.get("config_file") or {}
        loaded = cfg.get("loaded") or []
        show_settings()
        return W.VBox(
            [
                muted(
                    f"{len(settings)} settings: {source_counts(settings)}. Config file: "
                    + (", ".join(loaded) if loaded else f"{cfg.get('name')} (not found; none loaded)")
                    + "."
                ),
                muted(
                    "None of these changes while the service runs. "
                    + str(conf.get("restart") or "")
                    + " The command line wins over the config file, which wins over the environment."
                ),
                search,
                settings_box,
                section(
                    "What changes at run time", "State in the DB, changed through the API (and this console)."
                ),
                W.HTML(run_time_html(conf.get("run_time") or ())),
                section(
                    "Storage hosts in force",
                    "What the DB holds now: the setting only adds missing hosts at start.",
                ),
                W.HTML(hosts_html(conf.get("storage_hosts") or ())),
            ]
        )

    def refresh(*_: Any) -> None:
        rest.children = [guarded(build)]

    search.observe(show_settings, "value")
    refresh_button.on_click(refresh)
    refresh()
    return W.VBox([refresh_button, rest])
