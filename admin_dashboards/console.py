"""What a dashboard's kernel uses: the labfleet service as the viewer, and the console's page parts.

:func:`connect` is called by the first cell Voila runs (:mod:`labfleet.console.viewer`) with the
viewer's name and token; :func:`client` then answers the service's REST API as that viewer
(``$LABFLEET_SERVICE_URL``, the service's address inside the Hub host). The page parts are plain
ipywidgets with JupyterLab's look (its CSS variables): :func:`header`, :func:`cards`, :func:`table`,
:func:`message`.
"""

from __future__ import annotations

import html
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ipywidgets as W
import requests

from labfleet.core.http import ServiceError

PAGINATION = "application/jupyterhub-pagination+json"
PAGES = (
    ("users", "Users", "users, roles, projects, keypairs"),
    ("projects", "Domains & Projects", "caps and what is held now, members"),
    ("sessions", "Sessions", "every session in reach: filter, logs, stop"),
    ("scheduler", "Scheduler", "queues and why sessions wait"),
    ("resources", "Resources", "nodes, resource groups, GPU occupancy"),
    ("serving", "Serving", "model endpoints, their replicas and requests"),
    ("policies", "Resource policies", "keypair, user and project policies"),
    ("environments", "Environments", "images, users' environments and their sizes"),
    ("storage", "Storage", "hosts, folders, quotas"),
    ("statistics", "Statistics", "GPU- and CPU-hours, allocated against used"),
    ("configurations", "Configurations", "the settings in force"),
    ("maintenance", "Maintenance", "recalculate usage, announcements"),
    ("information", "Information", "versions and health"),
)


class FormError(ValueError):
    """A form field that cannot be read; the message names the field and says what to write."""


@dataclass
class Console:
    """The labfleet service's REST API, as the viewer."""

    url: str
    token: str = field(repr=False)
    viewer: str
    timeout: float = 30.0
    _me: dict[str, Any] | None = field(default=None, repr=False)

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        pages: bool = False,
    ) -> Any:
        headers = {"Authorization": f"token {self.token}"}
        if pages:
            headers["Accept"] = PAGINATION
        try:
            r = requests.request(
                method,
                self.url.rstrip("/") + path,
                params=params,
                json=json,
                headers=headers,
                timeout=self.timeout,
            )
        except requests.RequestException as e:
            raise ServiceError(f"the labfleet service did not answer: {type(e).__name__}") from None
        if r.status_code >= 400:
            try:
                message = r.json().get("message") or r.reason
            except ValueError:
                message = r.reason or f"HTTP {r.status_code}"
            raise ServiceError(str(message), r.status_code)
        if not r.content:
            return None
        return (
            r.json()
            if r.headers.get("Content-Type", "").startswith(("application/json", PAGINATION))
            else r.text
        )

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, json=body if body is not None else {})

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, json=body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def total(self, path: str, **params: Any) -> int:
        """How many items a paginated list holds, in one small request."""
        answer = self.request("GET", path, params={**params, "limit": 1}, pages=True)
        return int(answer["_pagination"]["total"])

    def everything(self, path: str, limit: int = 1000, **params: Any) -> list[Any]:
        """Every item of a paginated list (pages of ``limit``), in order."""
        items: list[Any] = []
        offset = 0
        while True:
            answer = self.request(
                "GET", path, params={**params, "offset": offset, "limit": limit}, pages=True
            )
            items += answer["items"]
            nxt = answer["_pagination"].get("next")
            if not nxt:
                return items
            offset = int(nxt["offset"])

    def me(self) -> dict[str, Any]:
        if self._me is None:
            self._me = self.get("/me")
        return self._me

    @property
    def role(self) -> str:
        return str(self.me().get("role", "user"))

    @property
    def can_change(self) -> bool:
        """Monitors read everything and change nothing: their buttons are disabled."""
        return self.role in ("superadmin", "admin")


_current: Console | None = None


def connect(viewer: str, token: str, url: str | None = None) -> Console:
    """Set the kernel's client (the first cell of every page calls this)."""
    global _current
    base = url or os.environ.get("LABFLEET_SERVICE_URL") or "http://127.0.0.1:8090/services/labfleet/api"
    _current = Console(base, token, viewer)
    return _current


def client() -> Console:
    if _current is None:
        raise ServiceError("this dashboard is opened through /services/labfleet-admin/, as a Hub user")
    return _current


# ---------------------------------------------------------------- page parts

STYLE = """<style>
.lf-admin { font-family: var(--jp-ui-font-family, sans-serif); color: var(--jp-ui-font-color1, #222); }
.lf-admin h1 { font-size: 1.5em; margin: 0.2em 0; }
.lf-admin .lf-sub { color: var(--jp-ui-font-color2, #555); margin-bottom: 0.8em; }
.lf-admin .lf-nav a, .lf-admin .lf-top a { margin-right: 0.9em; color: var(--jp-brand-color1, #1976d2);
  text-decoration: none; }
.lf-admin .lf-top { display: flex; align-items: baseline; font-size: 0.92em; padding-bottom: 4px;
  margin-bottom: 6px; border-bottom: 1px solid var(--jp-border-color2, #ddd); }
.lf-admin .lf-top .lf-me { margin-left: auto; white-space: nowrap; }
.lf-admin .lf-top .lf-viewer { margin-right: 0.9em; font-weight: 600; }
.lf-admin .lf-top a.lf-logout { margin-right: 0; }
.lf-cards { display: flex; flex-wrap: wrap; gap: 12px; }
.lf-card { border: 1px solid var(--jp-border-color2, #ddd); border-radius: 4px; padding: 10px 14px;
  min-width: 190px; background: var(--jp-layout-color1, #fff); text-decoration: none; color: inherit; }
.lf-card .lf-count { font-size: 1.8em; font-weight: 600; }
.lf-card .lf-label { font-weight: 600; }
.lf-card .lf-hint { color: var(--jp-ui-font-color2, #666); font-size: 0.9em; }
table.lf-table { border-collapse: collapse; font-size: 0.92em; }
table.lf-table th, table.lf-table td { border-bottom: 1px solid var(--jp-border-color2, #ddd);
  padding: 4px 10px; text-align: left; }
.lf-error { color: var(--jp-error-color1, #d32f2f); }
.lf-ok { color: var(--jp-success-color1, #388e3c); }
</style>"""


def header(title: str, subtitle: str = "") -> W.HTML:
    """The page's title, who is looking, and the console's navigation."""
    viewer = ""
    try:
        c = client()
        viewer = c.viewer
        who = f"{html.escape(c.viewer)} ({html.escape(c.role)})"
    except ServiceError as e:
        who = f'<span class="lf-error">{html.escape(e.message)}</span>'
    base = base_url()
    # The Hub's own prefix: the console is served at <prefix>services/labfleet-admin/
    root = base.rstrip("/").rsplit("/", 2)[0] + "/"
    nav = " ".join(f'<a href="{base}{key}">{html.escape(label)}</a>' for key, label, _ in PAGES)
    # Back to the Hub and the Fleet home, who is looking, and Logout; then the console's own pages.
    top = (
        f'<div class="lf-top"><a href="{root}hub/home">&larr; Hub</a>'
        f'<a href="{root}services/labfleet/">Fleet home</a><span class="lf-me">'
        f'<span class="lf-viewer">{html.escape(viewer)}</span>'
        f'<a class="lf-logout" href="{root}hub/logout">Logout</a></span></div>'
    )
    return W.HTML(
        f'{STYLE}<div class="lf-admin">{top}<div class="lf-nav"><a href="{base}admin">Fleet admin</a> {nav}</div>'
        f'<h1>{html.escape(title)}</h1><div class="lf-sub">{html.escape(subtitle)} Viewing as {who}.</div></div>'
    )


def base_url() -> str:
    """The console's own prefix (``/services/labfleet-admin/``), as Voila tells the kernel."""
    return os.environ.get("VOILA_BASE_URL") or "/services/labfleet-admin/"


def cards(items: Iterable[tuple[str, str, Any, str]]) -> W.HTML:
    """Cards of (page, label, count, hint), each a link to its page."""
    base = base_url()
    body = "".join(
        f'<a class="lf-card" href="{base}{html.escape(link)}"><div class="lf-label">{html.escape(label)}</div>'
        f'<div class="lf-count">{html.escape(str(count))}</div><div class="lf-hint">{html.escape(hint)}</div></a>'
        for link, label, count, hint in items
    )
    return W.HTML(f'{STYLE}<div class="lf-admin lf-cards">{body}</div>')


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> W.HTML:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    return W.HTML(f'{STYLE}<div class="lf-admin"><table class="lf-table"><tr>{head}</tr>{body}</table></div>')


def grid(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> W.GridBox:
    """A table whose cells may be widgets (buttons in a row): text cells are escaped."""
    cells: list[W.Widget] = [W.HTML(f"<b>{html.escape(c)}</b>") for c in columns]
    n = 0
    for row in rows:
        n += 1
        cells += [v if isinstance(v, W.Widget) else W.HTML(html.escape(str(v))) for v in row]
    return W.GridBox(
        cells,
        layout=W.Layout(grid_template_columns=f"repeat({len(columns)}, max-content)", grid_gap="2px 16px"),
    )


def message(text: str, *, error: bool = False) -> W.HTML:
    cls = "lf-error" if error else "lf-ok"
    return W.HTML(f'{STYLE}<div class="lf-admin {cls}">{html.escape(text)}</div>')


# What a page's ``build(say, refresh)`` gets: ``say(text, error)`` sets the page's message line,
# ``refresh()`` builds the page again (after an action).
Say = Callable[[str, bool], None]


def refreshable_page(build: Callable[[Say, Callable[[], None]], Any]) -> W.VBox:
    """A Refresh button and a message line above what ``build(say, refresh)`` makes (a service refusal
    shows as the message instead, see :func:`guarded`); Refresh clears the message and builds again."""
    out = W.VBox()
    flash = W.HTML()
    refresh_button = W.Button(description="Refresh", icon="refresh", layout=W.Layout(width="110px"))

    def say(text: str, error: bool) -> None:
        flash.value = message(text, error=error).value

    def refresh(*_: Any) -> None:
        out.children = [guarded(lambda: build(say, refresh))]

    def clicked(_: Any) -> None:
        flash.value = ""
        refresh()

    refresh_button.on_click(clicked)
    refresh()
    return W.VBox([refresh_button, flash, out])


def confirm_label(description: str, target: str = "") -> str:
    """What a button that destroys or stops says once clicked, asking for the second click:
    ``Really stop?``, ``Really delete gold?``."""
    verb = description.strip()
    verb = verb[:1].lower() + verb[1:]
    return f"Really {verb}{' ' + target if target else ''}?"


def confirm_first(
    button: W.Button,
    act: Callable[[], Any],
    warning: str | Callable[[], str],
    say: Callable[[str, bool], None],
    confirm: str = "",
) -> W.Button:
    """The console's one way to ask before something is destroyed or stopped: the first click of
    ``button`` turns it into ``confirm`` (default :func:`confirm_label` of its description) in the
    danger style and says ``warning`` (what will happen; a callable: asked at the click); the second
    click runs ``act()``. ``act`` returning ``False`` (it failed and said why) puts the button back as
    it was, to be asked again. Returns ``button``."""
    plain = (button.description, button.button_style)
    label = confirm or confirm_label(button.description)
    armed = {"on": False}

    def clicked(_: Any) -> None:
        if not armed["on"]:
            armed["on"] = True
            button.description, button.button_style = label, "danger"
            button.add_class("lf-confirming")
            text = warning() if callable(warning) else warning
            say(f"{text} Click again to go on.", False)
            return
        armed["on"] = False
        button.remove_class("lf-confirming")
        if act() is False:
            button.description, button.button_style = plain

    button.on_click(clicked)
    return button


def guarded(fn: Callable[[], Any]) -> Any:
    """``fn()``; a service refusal becomes the page's message instead of a traceback."""
    try:
        return fn()
    except ServiceError as e:
        return message(f"The labfleet service said: {e.message}", error=True)
