"""The admin service's server extension: the console's short paths (``/services/labfleet-admin/users``
and so on, each a redirect to its Voila page)."""

from __future__ import annotations

from typing import Any

from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import web

from labfleet.console.console import PAGES

PAGE_NAMES = tuple(key for key, _, _ in PAGES)


class PageHandler(JupyterHandler):
    """``<base>PAGE`` -> ``<base>voila/render/PAGE.ipynb``."""

    @web.authenticated
    def get(self, page: str = "index") -> None:
        self.redirect(url_path_join(self.base_url, "voila", "render", f"{page}.ipynb"))


def _load_jupyter_server_extension(serverapp: Any) -> None:
    base = serverapp.web_app.settings["base_url"]
    pages = "|".join(PAGE_NAMES)
    serverapp.web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "admin"), PageHandler),
            (url_path_join(base, rf"({pages})/?"), PageHandler),
        ],
    )
    serverapp.log.info("labfleet-admin: the console's pages at %s", url_path_join(base, "admin"))
