"""labfleet inside every session: a jupyter-server extension (see ``labfleet.session.extension``).

It reads what the labfleet spawner put in the session's environment (``LABFLEET_SESSION_TYPE``,
``LABFLEET_COMMAND``, ...) and, for batch and inference sessions, runs the session's command
(``labfleet.session.runner``). Enabled for every Jupyter server of the environment by
``etc/jupyter/jupyter_server_config.d/labfleet.json``, which the wheel installs.
"""

from __future__ import annotations

from typing import Any


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    # Imported here, not at the top: a bare `import labfleet.session` stays cheap and needs no jupyter-server.
    from .extension import LabfleetExtension

    return [{"module": "labfleet.session", "app": LabfleetExtension}]


def _load_jupyter_server_extension(serverapp: Any) -> Any:
    """For a server that loads the module directly rather than through the extension point."""
    from .extension import LabfleetExtension

    return LabfleetExtension._load_jupyter_server_extension(serverapp)
