"""The wheel installs one import package, ``labfleet``, and nothing else of the project's at the top of
site-packages: the old top-level names (``spawner``, ``widgets``, ...) do not import where it is installed."""

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OLD = ("hub_ext", "spawner", "server_ext", "widgets", "admin_dashboards")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    env = dict(os.environ)
    if (REPO / "labextension" / "build" / "package.json").exists():
        env["SKIP_JUPYTER_BUILDER"] = "1"  # built by scripts/setup.sh: the wheel ships that build
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(REPO)],
        check=True,
        env=env,
        capture_output=True,
        timeout=600,
    )
    (built,) = out.glob("labfleet-*.whl")
    return built


def test_the_wheel_holds_one_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].startswith("labfleet-0")}
    assert top == {"labfleet"}
    subpackages = {n.split("/")[1] for n in names if n.startswith("labfleet/") and n.count("/") >= 2}
    assert {"core", "service", "cli", "hub", "spawner", "session", "widgets", "console"} <= subpackages
    assert "labfleet/service/openapi.yaml" in names
    assert {"labfleet/service/static/fleethome.js", "labfleet/service/static/fleethome.css"} <= set(names)


def test_the_old_names_do_not_import_where_labfleet_is_installed(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def imports(name: str) -> bool:
        run = subprocess.run(
            [str(python), "-c", f"import {name}"], cwd=tmp_path, env=env, capture_output=True
        )
        return run.returncode == 0

    assert imports("labfleet")
    assert [name for name in OLD if imports(name)] == []
