"""What fractional sessions get of a real GPU: compute rate and memory, with and without MPS.

Runs where an NVIDIA GPU is found (NVML), as root when MPS is measured (the node's daemon is
started the way a node does it: ``labfleet.compute.devices.mps``, a pipe and log directory of its
own, stopped at the end). Each "session" is a process given the environment labfleet gives a
session on that node (``labfleet.spawner.launch.gpu_env``: the framework caps, and the MPS limits where the
node runs MPS), running ``benchmarks/gpu_probe.py``:

- ``whole``: one process with the whole device, no cap: the card's rate.
- ``1 x 0.5``, ``2 x 0.5``, ``4 x 0.25``: that many sessions at once, each a bf16 matmul loop
  started at the same instant; the rate each got and their sum, as a share of ``whole``.
- the memory each share was allowed: the largest multiple of 1 % of the device one process of the
  session allocates, block after block, until refused.

::

    python benchmarks/gpu_sharing.py                  # MPS on and off, a table
    python benchmarks/gpu_sharing.py --mps off --seconds 5 --json

Needs PyTorch with CUDA and nvidia-ml-py; labfleet's own modules from the repository.
Results: ``benchmarks/RESULTS.md`` ("GPU sharing").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from labfleet.compute.devices.base import DeviceInfo  # noqa: E402
from labfleet.compute.devices.mps import MpsSupervisor, node_mps  # noqa: E402
from labfleet.compute.devices.nvidia import NvidiaPlugin  # noqa: E402
from labfleet.spawner.launch import GPUAssignment, gpu_env  # noqa: E402

PROBE = Path(__file__).resolve().parent / "gpu_probe.py"
SCENARIOS = (("1 x 0.5", 1, "0.5"), ("2 x 0.5", 2, "0.5"), ("4 x 0.25", 4, "0.25"))
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"


def first_gpu() -> DeviceInfo:
    """The node's first whole GPU (not a MIG instance); SystemExit when there is none."""
    plugin = NvidiaPlugin()
    gpus = [d for d in plugin.discover() if d.kind == "gpu" and d.parent_uuid is None]
    if not gpus:
        raise SystemExit(f"no NVIDIA GPU found: {getattr(plugin, 'reason', None) or 'NVML lists none'}")
    return gpus[0]


def session_env(gpu: DeviceInfo, share: str, pipe_dir: str | None) -> dict[str, str]:
    """The environment of a session that holds ``share`` of ``gpu`` on a node whose MPS daemon
    listens at ``pipe_dir`` (None: no MPS), as a local session gets it."""
    assignment = GPUAssignment(gpu.uuid, gpu.index, gpu.model, gpu.memory_bytes, Decimal(share))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_MPS_", "PYTORCH_CUDA_ALLOC"))}
    env.update(gpu_env((assignment,), mps=pipe_dir is not None, in_container=False))
    if pipe_dir is not None and Decimal(share) < 1:
        env[PIPE_ENV] = pipe_dir
    return env


def probe(env: Mapping[str, str], *args: object, timeout: float = 300) -> dict:
    """Run the probe in one process with ``env``; its JSON answer (RuntimeError when it fails)."""
    done = subprocess.run(
        [sys.executable, str(PROBE), *map(str, args)],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"probe {args} exited {done.returncode}: {done.stderr[-600:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rates_at_once(envs: list[dict[str, str]], seconds: float, lead: float = 20.0) -> list[float]:
    """Each process's bf16 matmul rate (TFLOP/s), all started at the same instant ``lead`` s from now
    (time for each to bring CUDA up)."""
    start = time.time() + lead
    procs = [
        subprocess.Popen(
            [sys.executable, str(PROBE), "matmul", str(seconds), str(start)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for env in envs
    ]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=lead + seconds + 300)
        if p.returncode != 0:
            raise RuntimeError(f"matmul probe exited {p.returncode}: {stderr[-600:]}")
        out.append(json.loads(stdout.strip().splitlines()[-1])["tflops"])
    return out


def start_mps(gpu: DeviceInfo, workdir: str) -> MpsSupervisor:
    status, sup = node_mps(
        "on", [gpu], pipe_dir=os.path.join(workdir, "pipe"), log_dir=os.path.join(workdir, "log")
    )
    if sup is None or status.state != "on":
        raise SystemExit(f"MPS did not start: {status.state}: {status.reason}")
    return sup


def measure(gpu: DeviceInfo, pipe_dir: str | None, seconds: float) -> dict:
    whole = rates_at_once([session_env(gpu, "1", None)], seconds)[0]
    rows = []
    for name, count, share in SCENARIOS:
        envs = [session_env(gpu, share, pipe_dir) for _ in range(count)]
        rates = rates_at_once(envs, seconds)
        allowed = probe(envs[0], "most", 0.01)["most"]
        rows.append(
            {
                "scenario": name,
                "rates": rates,
                "aggregate": round(sum(rates), 1),
                "of_whole": round(sum(rates) / whole, 3),
                "each_of_whole": [round(r / whole, 3) for r in rates],
                "memory_allowed": allowed,
            }
        )
    return {"whole": whole, "scenarios": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mps", choices=("on", "off", "both"), default="both")
    ap.add_argument("--seconds", type=float, default=8.0, help="seconds of matmul per run")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    gpu = first_gpu()
    results: dict = {"device": {"model": gpu.model, "memory_bytes": gpu.memory_bytes}}
    try:
        import torch

        results["torch"] = torch.__version__
    except ImportError:
        raise SystemExit("PyTorch is needed") from None
    modes = ["off", "on"] if args.mps == "both" else [args.mps]
    for mode in modes:
        if mode == "off":
            results["caps"] = measure(gpu, None, args.seconds)
            continue
        with tempfile.TemporaryDirectory(prefix="lf-mps-") as tmp:
            sup = start_mps(gpu, tmp)
            try:
                results["mps"] = measure(gpu, sup.pipe_dir, args.seconds)
            finally:
                sup.stop()
    if args.json:
        print(json.dumps(results))
        return 0
    print(f"{gpu.model}, {gpu.memory_bytes / 2**30:.0f} GiB, PyTorch {results['torch']}")
    for mode in ("caps", "mps"):
        if mode not in results:
            continue
        r = results[mode]
        print(f"\n{'framework caps only' if mode == 'caps' else 'MPS'}: whole card {r['whole']} TFLOP/s bf16")
        print(f"{'sessions':<10} {'each (TFLOP/s)':<28} {'sum':>7} {'of whole':>9} {'memory allowed':>15}")
        for row in r["scenarios"]:
            each = ", ".join(f"{x:g}" for x in row["rates"])
            print(
                f"{row['scenario']:<10} {each:<28} {row['aggregate']:>7} {row['of_whole']:>9.2f}"
                f" {row['memory_allowed']:>14.0%}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
