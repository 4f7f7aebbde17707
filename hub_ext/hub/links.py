"""Links into labfleet that live under the Hub's own URL: ``/hub/labfleet/import?url=...``.

A link someone shares (a course page, a README badge) names the Hub, not the labfleet service, so
it stays the same wherever the service runs.  The Hub only sends it on to the service's Import & Run
page with its whole query string; that page logs the browser in through the Hub's OAuth (a login
form when logged out) and comes back to the same URL, query and all, so the link works after
logging in without a second click (unlike a query lost on the way, jupyterhub#3014).
"""

from __future__ import annotations

from jupyterhub.handlers.base import BaseHandler

from labfleet.core.hubmap import SERVICE_NAME


class ImportLinkHandler(BaseHandler):
    """``/hub/labfleet/import``: on to ``/services/labfleet/import`` with the same query."""

    def get(self) -> None:
        query = self.request.query
        self.redirect(f"{self.base_url}services/{SERVICE_NAME}/import" + (f"?{query}" if query else ""))


def handlers() -> list[tuple[str, type]]:
    """Routes that answer before the Hub's own (relative to the Hub's prefix)."""
    return [(r"/labfleet/import", ImportLinkHandler)]
