"""What one process of a session gets of its GPU, measured from inside it (PyTorch only).

Run as a child process, with the environment labfleet gives a session (``labfleet.spawner.launch.gpu_env``),
by ``benchmarks/gpu_sharing.py`` and the real-GPU tests (``tests/test_gpu_sharing.py``). Each mode
prints one JSON line on stdout:

- ``alloc F [F ...]``: for each F, allocate F of the device's whole memory at once and free it;
  ``{"total": bytes, "allowed": {F: true|false}, "errors": {F: "..."}}``.
- ``most STEP``: the largest multiple of STEP (a fraction of the device) it may allocate, one
  block after another until refused: ``{"total": bytes, "most": fraction}``.
- ``matmul SECONDS [START]``: bf16 matrix products (8192 x 8192) for SECONDS, from the epoch time
  START (so that several processes run at once): ``{"tflops": rate, "seconds": s}``.
- ``hold F SECONDS``: allocate F of the device's memory, print ``{"holding": bytes}``, and keep it
  for SECONDS (or until killed).
"""

from __future__ import annotations

import json
import sys
import time

import torch

N = 8192  # a product of two N x N matrices: 2 N^3 floating-point operations


def _total() -> int:
    return torch.cuda.get_device_properties(0).total_memory


def _try(nbytes: int) -> str | None:
    try:
        block = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    except (torch.cuda.OutOfMemoryError, RuntimeError) as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    del block
    torch.cuda.empty_cache()
    return None


def alloc(fractions: list[float]) -> dict:
    total = _total()
    allowed, errors = {}, {}
    for f in fractions:
        error = _try(int(f * total))
        allowed[str(f)] = error is None
        if error:
            errors[str(f)] = error
    return {"total": total, "allowed": allowed, "errors": errors}


def most(step: float) -> dict:
    total = _total()
    blocks = []
    try:
        while len(blocks) * step < 1:
            blocks.append(torch.empty(int(step * total), dtype=torch.uint8, device="cuda"))
    except (torch.cuda.OutOfMemoryError, RuntimeError):
        pass
    got = len(blocks) * step
    del blocks
    torch.cuda.empty_cache()
    return {"total": total, "most": round(got, 6)}


def matmul(seconds: float, start: float | None) -> dict:
    a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):  # warm up (kernels chosen, clocks up)
        a @ b
    torch.cuda.synchronize()
    if start is not None:
        time.sleep(max(0.0, start - time.time()))
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        done += 10
    elapsed = time.perf_counter() - t0
    return {"tflops": round(2 * N**3 * done / elapsed / 1e12, 1), "seconds": round(elapsed, 2)}


def hold(fraction: float, seconds: float) -> None:
    block = torch.empty(int(fraction * _total()), dtype=torch.uint8, device="cuda")
    block.fill_(1)
    print(json.dumps({"holding": block.numel()}), flush=True)
    time.sleep(seconds)


def main(argv: list[str]) -> int:
    mode, args = argv[0], argv[1:]
    if mode == "alloc":
        out = alloc([float(a) for a in args])
    elif mode == "most":
        out = most(float(args[0]))
    elif mode == "matmul":
        out = matmul(float(args[0]), float(args[1]) if len(args) > 1 else None)
    elif mode == "hold":
        hold(float(args[0]), float(args[1]))
        return 0
    else:
        print(f"unknown mode {mode!r}: alloc, most, matmul or hold", file=sys.stderr)
        return 2
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
