"""On a real GPU (``pytest -m gpu``, as root): a local session's sandbox holds its GPU and no other.

Standard library and PyTorch only (it runs where labfleet is not installed):
``python3 -m pytest -m gpu --noconftest -o addopts= tests/test_gpu_sandbox.py``.

The sandbox is the one the local backend builds (``labfleet.spawner.sandbox.sandbox_command`` with the
device nodes ``labfleet.spawner.local`` binds for a placement): the session account, no capability, its own
/dev with the GPU's nodes only. PyTorch inside it computes on the GPU it was given; with no device
given, CUDA finds none; nothing outside its /dev (other GPUs' nodes) shows.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from decimal import Decimal

import pytest

from labfleet.spawner.launch import GPUAssignment
from labfleet.spawner.sandbox import (
    SandboxSpec,
    environment_sources,
    gpu_device_nodes,
    sandbox_command,
    system_layout,
)

pytestmark = pytest.mark.gpu

PROBE = """
import json, os
out = {"uid": os.getuid(), "CapEff": [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0],
       "dev": sorted(d for d in os.listdir("/dev") if d.startswith("nvidia"))}
try:
    import torch
    out["available"] = torch.cuda.is_available()
    out["count"] = torch.cuda.device_count() if out["available"] else 0
    if out["available"]:
        x = torch.ones(1 << 20, device="cuda")
        out["sum"] = float(x.sum().item())
        out["name"] = torch.cuda.get_device_name(0)
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"[:300]
print("GPU-PROBE " + json.dumps(out))
"""


def _account() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam("labfleet-session")
    except KeyError:
        if shutil.which("useradd"):
            subprocess.run(
                [
                    "useradd",
                    "--system",
                    "--user-group",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    "labfleet-session",
                ],
                check=True,
            )
            entry = pwd.getpwnam("labfleet-session")
        else:
            entry = pwd.getpwnam("nobody")
    return entry.pw_uid, entry.pw_gid


@pytest.mark.parametrize("user_namespaces", [False, True])
def test_the_sandbox_holds_its_gpu_and_no_other(tmp_path, user_namespaces):
    if os.geteuid() != 0:
        pytest.fail("run as root: the sandbox switches to the session account")
    bwrap = os.environ.get("LABFLEET_TEST_BWRAP") or shutil.which("bwrap")
    assert bwrap, "bubblewrap is needed (LABFLEET_TEST_BWRAP names a carried one)"
    uid, gid = _account()
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, uid, gid)
    runtime = (sys.prefix, sys.base_prefix, *environment_sources(sys.prefix), os.path.dirname(bwrap))
    results = {}
    gpu = GPUAssignment(uuid="GPU-test", index=0, model="real", memory=0, shares=Decimal(1))
    for name, gpus in (("given", (gpu,)), ("none", ())):
        spec = SandboxSpec(
            home=str(home),
            system=system_layout(),
            runtime=tuple(p for p in runtime if p and os.path.exists(p)),
            devices=gpu_device_nodes(gpus),
            uid=uid,
            gid=gid,
            user_namespaces=user_namespaces,
        )
        cmd = [*sandbox_command(bwrap, spec), f"{sys.executable} -c '{PROBE}'"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        lines = [x for x in r.stdout.splitlines() if x.startswith("GPU-PROBE ")]
        assert lines, (name, r.returncode, r.stdout[-2000:], r.stderr[-2000:])
        results[name] = json.loads(lines[-1][len("GPU-PROBE ") :])
    print("GPU sandbox", json.dumps(results))
    given, none = results["given"], results["none"]
    for out in (given, none):
        assert out["uid"] == uid != 0 and int(out["CapEff"], 16) == 0, out
    assert given.get("available") and given.get("count") == 1 and given.get("sum") == float(1 << 20), given
    assert "nvidia0" in given["dev"] and not [d for d in given["dev"] if d[6:].isdigit() and d != "nvidia0"]
    assert none["dev"] == [] and not none.get("available"), none
