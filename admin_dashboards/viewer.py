"""Who looks at a dashboard: Voila's prelaunch hook hands the viewer's own token to the kernel.

The admin service logs people in through the Hub's OAuth; the token the Hub issued to this service
for the viewer (scoped by the service's ``oauth_client_allowed_scopes`` to the labfleet service) is
what the dashboard's kernel calls the labfleet service with, so every page acts with the viewer's
rights and no more. The hook puts it into a first cell that Voila runs before the page's own and
never shows (Voila strips sources): the token reaches the viewer's own kernel, nothing else.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import nbformat

log = logging.getLogger(__name__)

TAG = "labfleet-viewer"


def viewer_of(handler: Any) -> tuple[str, str] | None:
    """(name, token) of the person ``handler`` serves; None when there is none (not a Hub login)."""
    provider = getattr(handler, "identity_provider", None)
    hub_auth = getattr(provider, "hub_auth", None)
    user = getattr(handler, "current_user", None)
    if hub_auth is None or user is None:
        return None
    token = hub_auth.get_token(handler)
    name = getattr(user, "username", None)
    return (name, token) if token and name else None


def connect_cell(name: str, token: str) -> Any:
    """The first cell of every page: the kernel's labfleet client, for this viewer."""
    source = (
        "import labfleet.console.console as _lf_console\n"
        f"_lf_console.connect(viewer={json.dumps(name)}, token={json.dumps(token)})\n"
        "del _lf_console"
    )
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["tags"] = [TAG]
    cell.metadata["jupyter"] = {"source_hidden": True, "outputs_hidden": True}
    return cell


def inject_viewer(req: Any, notebook: Any, cwd: str) -> Any:
    """``VoilaConfiguration.prelaunch_hook``: put the viewer's client first in the notebook."""
    found = viewer_of(req)
    if found is None:
        log.warning(
            "labfleet-admin: no Hub login on %s; the page runs without a labfleet client", req.request.path
        )
        return notebook
    notebook.cells = [c for c in notebook.cells if TAG not in c.get("metadata", {}).get("tags", [])]
    notebook.cells.insert(0, connect_cell(*found))
    return notebook
