"""The JupyterLab extension (labextension/) as installed in this environment: listed and enabled by
JupyterLab, its static files and settings schema in place, and served by a real ``jupyter lab``.

scripts/setup.sh builds it and links it into the venv (an installed wheel copies the same files there).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from jupyter_core.paths import jupyter_path

from tests.hubfixture import free_port

REPO = Path(__file__).resolve().parents[1]
NAME = "@labfleet/labextension"
PLUGIN = f"{NAME}:plugin"
BIN = Path(sys.executable).parent
WAIT = 60.0  # seconds: the most the Lab may take to answer
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _installed_dir() -> Path:
    """The first labextensions directory of this environment that holds the extension."""
    for base in jupyter_path("labextensions"):
        candidate = Path(base) / NAME
        if (candidate / "package.json").is_file():
            return candidate
    pytest.fail(f"{NAME} is not installed in any of {jupyter_path('labextensions')}: run scripts/setup.sh")


def test_labextension_list_shows_it_enabled():
    out = subprocess.run(
        [str(BIN / "jupyter"), "labextension", "list"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    text = ANSI.sub("", out.stdout + out.stderr)
    version = json.loads((REPO / "labextension" / "package.json").read_text())["version"]
    line = next((ln for ln in text.splitlines() if NAME in ln), None)
    assert line is not None, text
    assert f"{NAME} v{version} enabled OK (python, labfleet)" in line, line


def test_installed_dir_has_the_bundle_and_the_schema():
    ext = _installed_dir()
    pkg = json.loads((ext / "package.json").read_text())
    assert pkg["name"] == NAME
    load = pkg["jupyterlab"]["_build"]["load"]
    assert re.fullmatch(r"static/remoteEntry\.[0-9a-f]+\.js", load), load
    assert (ext / load).is_file()
    assert (ext / "static" / "style.js").is_file()
    schema = json.loads((ext / "schemas" / NAME / "plugin.json").read_text())
    assert schema["properties"]["refreshInterval"]["default"] == 5
    install = json.loads((ext / "install.json").read_text())
    assert install["packageName"] == "labfleet"
    # JupyterLab's shared packages come from the Lab, not from the bundle: one React, one Lumino.
    shared = pkg["jupyterlab"].get("sharedPackages") or {}
    entry = (ext / load).read_text()
    for dep in ("@jupyterlab/application", "@jupyterlab/ui-components", "react"):
        assert dep not in shared or shared[dep].get("bundled") is False
        assert f'"{dep}"' in entry, f"{dep} is not a shared module of the bundle"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A real `jupyter lab` on 127.0.0.1 with its own config and runtime dirs; yields (url, token)."""
    root = tmp_path_factory.mktemp("lab")
    port = free_port()
    token = "labext-test-token"
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(root / "config"),
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(root / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(root / "workspaces"),
    }
    (root / "work").mkdir()
    log = open(root / "lab.log", "wb")  # closed after the server stops
    proc = subprocess.Popen(
        [
            str(BIN / "jupyter"),
            "lab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            "--port-retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root / 'work'}",
            "--allow-root",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WAIT
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited {proc.returncode}: {(root / 'lab.log').read_text()[-3000:]}")
            try:
                if requests.get(f"{url}/api/status", params={"token": token}, timeout=5).ok:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"jupyter lab did not answer in {WAIT}s: {(root / 'lab.log').read_text()[-3000:]}"
                )
            time.sleep(0.2)
        yield url, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def _page_config(html: str) -> dict:
    m = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>', html, re.S)
    assert m, "no page config in the Lab's page"
    return json.loads(m.group(1))


def test_lab_loads_and_serves_the_extension(lab):
    url, token = lab
    auth = {"Authorization": f"token {token}"}
    page = requests.get(f"{url}/lab", headers=auth, timeout=30)
    assert page.status_code == 200
    federated = {e["name"]: e for e in _page_config(page.text)["federated_extensions"]}
    assert NAME in federated, sorted(federated)
    entry = federated[NAME]
    js = requests.get(f"{url}/lab/extensions/{NAME}/{entry['load']}", headers=auth, timeout=30)
    assert js.status_code == 200
    assert "@labfleet/labextension" in js.text

    settings = requests.get(f"{url}/lab/api/settings/{PLUGIN}", headers=auth, timeout=30)
    assert settings.status_code == 200, settings.text
    body = settings.json()
    assert body["id"] == PLUGIN
    props = body["schema"]["properties"]
    assert props["refreshInterval"]["default"] == 5
    assert set(props) == {"refreshInterval", "quotaWarnRatio", "showStatusBar"}


def test_lab_validates_the_settings_schema(lab):
    """The schema is real: the Lab refuses a refresh interval below its minimum."""
    url, token = lab
    headers = {"Authorization": f"token {token}", "Content-Type": "application/json"}
    bad = requests.put(
        f"{url}/lab/api/settings/{PLUGIN}",
        headers=headers,
        data=json.dumps({"raw": json.dumps({"refreshInterval": 0})}),
        timeout=30,
    )
    assert bad.status_code == 400, bad.text
    good = requests.put(
        f"{url}/lab/api/settings/{PLUGIN}",
        headers=headers,
        data=json.dumps({"raw": json.dumps({"refreshInterval": 10})}),
        timeout=30,
    )
    assert good.status_code == 204, good.text
    after = requests.get(f"{url}/lab/api/settings/{PLUGIN}", headers=headers, timeout=30).json()
    assert after["settings"]["refreshInterval"] == 10
