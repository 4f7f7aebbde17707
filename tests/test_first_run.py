"""A new user's first run from a clone under /tmp: the session's extensions must load.

The local backend's sandbox mounts a private /tmp. A clone under /tmp has its venv there too, and an
editable install that points into the clone: the session's Python must still import ``labfleet.session``
from the clone and JupyterLab must find the linked labextension. This makes such a clone (the
repository cloned under /tmp, with this working tree's packages copied over it so the code under
test runs), a venv in it that reuses this venv's packages, starts a real Hub from the clone and
spawns a sandboxed session through it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest
import requests

from labfleet.spawner.local import _bwrap_works
from tests.hubfixture import Hub, start_hub

pytestmark = pytest.mark.hub

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("hub_ext", "spawner", "server_ext", "widgets", "admin_dashboards")
LABEXT_BUILD = REPO / "labextension" / "build"


def _bwrap() -> str | None:
    path = shutil.which("bwrap")
    return path if path and _bwrap_works(path) else None


def _clone(root: Path) -> Path:
    """The repository cloned into ``root``, with the working tree's packages and labextension build."""
    checkout = root / "labfleet"
    # --shared: the clone borrows this repository's objects (fast); this repository is only read.
    subprocess.run(
        ["git", "clone", "--quiet", "--shared", str(REPO), str(checkout)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in PACKAGES:
        shutil.copytree(REPO / name, checkout / name, dirs_exist_ok=True, ignore=ignore)
    shutil.copy2(REPO / "jupyterhub_config.py", checkout / "jupyterhub_config.py")
    shutil.copytree(LABEXT_BUILD, checkout / "labextension" / "build", symlinks=True)
    return checkout


def _venv(checkout: Path) -> Path:
    """``checkout/.venv``: what ``pip install -e .`` and scripts/setup.sh leave there, reusing this venv's
    packages (a path line: this venv's own .pth files, its editable install among them, are not read)."""
    venv = checkout / ".venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    python = venv / "bin" / "python"
    site_packages = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()
    )
    # hatchling's editable install: the checkout on sys.path (read first: "_" sorts before letters).
    (site_packages / "_editable_impl_labfleet.pth").write_text(f"{checkout}\n")
    (site_packages / "reuse-test-venv.pth").write_text(sysconfig.get_path("purelib") + "\n")
    # The session's command, as pip writes it for this venv.
    script = venv / "bin" / "jupyterhub-singleuser"
    script.write_text(
        f"#!{python}\nimport sys\nfrom jupyterhub.singleuser import main\n"
        "if __name__ == '__main__':\n    sys.exit(main())\n"
    )
    script.chmod(0o755)
    # Jupyter's data and config of this venv (JupyterLab's assets, the extensions' config), and the
    # labextension linked to the checkout's build as scripts/setup.sh links it.
    here = Path(sys.prefix)
    (venv / "etc").mkdir(exist_ok=True)
    (venv / "etc" / "jupyter").symlink_to(here / "etc" / "jupyter")
    data = venv / "share" / "jupyter"
    (data / "labextensions" / "@labfleet").mkdir(parents=True)
    for entry in (here / "share" / "jupyter").iterdir():
        if entry.name != "labextensions":
            (data / entry.name).symlink_to(entry)
    for entry in (here / "share" / "jupyter" / "labextensions").iterdir():
        if entry.name != "@labfleet":
            (data / "labextensions" / entry.name).symlink_to(entry)
    (data / "labextensions" / "@labfleet" / "labextension").symlink_to(checkout / "labextension" / "build")
    return venv


def _start_hub(checkout: Path, venv: Path) -> Hub:
    """The Hub of the clone, run by the clone's venv; no PYTHONPATH (a new user sets none)."""
    saved = os.environ.get("LABFLEET_SECRET_KEY_FILE")
    try:
        return start_hub(
            checkout / ".labfleet-state",
            checkout=checkout,
            venv=venv,
            extra_config="c.LabfleetLocalSpawner.sandbox = 'yes'\n",
        )
    finally:  # start_hub points this process at the clone's key: give the rest of the suite its own back
        if saved is None:
            os.environ.pop("LABFLEET_SECRET_KEY_FILE", None)
        else:
            os.environ["LABFLEET_SECRET_KEY_FILE"] = saved


def _wait_ready(hub: Hub, name: str, server: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    model = None
    while time.monotonic() < deadline:
        model = hub.hub_api("GET", f"/users/{name}").json()["servers"].get(server)
        if model and model.get("ready"):
            return
        if model is None:
            break  # the spawn failed
        time.sleep(0.3)
    raise AssertionError(f"{name}/{server} never became ready: {model}\n{hub.log_text()[-4000:]}")


def test_a_session_from_a_clone_under_tmp_loads_its_extensions():
    if _bwrap() is None:
        pytest.skip("bubblewrap is missing or cannot run here: sessions get no private /tmp")
    if not (LABEXT_BUILD / "package.json").is_file():
        pytest.skip("the JupyterLab extension is not built (bash scripts/setup.sh builds it)")
    root = Path(tempfile.mkdtemp(prefix="lf-first-run-", dir="/tmp"))
    hub = None
    try:
        checkout = _clone(root)
        venv = _venv(checkout)
        hub = _start_hub(checkout, venv)
        admin = hub.wait_token("root")
        for path, body in [
            ("/domains", {"name": "acme"}),
            ("/projects", {"domain": "acme", "name": "ml"}),
            ("/users", {"username": "alice", "domain": "acme", "projects": ["ml"]}),
        ]:
            r = hub.api("POST", path, admin, json=body)
            assert r.status_code == 201, (path, r.text)
        token = hub.wait_token("alice")
        r = hub.hub_api("POST", "/users/alice/servers/first", json={"project": "ml", "cpu": 1, "mem": "1g"})
        assert r.status_code in (201, 202), r.text
        _wait_ready(hub, "alice", "first")
        headers = {"Authorization": f"token {token}"}
        base = f"{hub.url}/user/alice/first"
        # The session's server extension answers (from the clone, through the sandbox).
        r = requests.get(f"{base}/labfleet/session", headers=headers, timeout=30)
        log = (hub.state / "session-logs").rglob("*")
        session_log = "\n".join(p.read_text(errors="replace") for p in log if p.is_file())
        assert r.status_code == 200, f"{r.status_code} {r.text[:300]}\n{session_log[-3000:]}"
        info = r.json()
        assert (info["name"], info["project"], info["service"]) == ("first", "acme/ml", "ok"), info
        assert "could not be found" not in session_log, session_log[-3000:]
        # JupyterLab finds the Fleet sidebar's extension, linked into the venv from the clone.
        lab = requests.get(f"{base}/lab", headers=headers, timeout=30)
        assert lab.status_code == 200 and "@labfleet/labextension" in lab.text, lab.text[-2000:]
        assert hub.hub_api("DELETE", "/users/alice/servers/first").status_code in (202, 204)
    finally:
        if hub is not None:
            hub.stop()
        shutil.rmtree(root, ignore_errors=True)
