"""The embedded labfleet Hub: SQLite, the labfleet service and authenticator, local sessions.

    jupyterhub -f jupyterhub_config.py --ip 127.0.0.1 --port 8000

State (DBs, secrets, users' homes) lives in the working directory, or $LABFLEET_STATE_DIR.
labfleet's DB: $LABFLEET_DB_URL (default: labfleet.sqlite in the state directory).
"""

import json
import os
import sys
from pathlib import Path

# Run from a checkout without installing: make labfleet importable.
sys.path.insert(0, str(Path(__file__).parent))

from labfleet.hub.configure import configure  # noqa: E402

c = get_config()  # noqa: F821
state_dir = Path(os.environ.get("LABFLEET_STATE_DIR", os.getcwd())).absolute()
state_dir.mkdir(parents=True, exist_ok=True)
# The service, the authenticator and the spawner. No GPU needed: the Hub host is a node with two mock
# 80 GB GPUs unless $LABFLEET_DEVICE_PLUGINS / $LABFLEET_MOCK_DEVICES say otherwise. Any other option of
# the labfleet service goes in service_config={...} or in labfleet_service_config.py in the state dir.
configure(
    c,
    state_dir,
    device_plugins=os.environ.get("LABFLEET_DEVICE_PLUGINS", "mock").split(","),
    mock_devices=json.loads(
        os.environ.get("LABFLEET_MOCK_DEVICES") or '[{"model": "A100-80GB", "memory": "80g", "count": 2}]'
    ),
)

c.JupyterHub.db_url = f"sqlite:///{state_dir / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state_dir / "jupyterhub_cookie_secret")

# Sessions: the labfleet spawner's local backend (homes under the state directory, sandboxed with
# bubblewrap when it is installed); LABFLEET_BACKEND=docker runs them in Docker containers.
