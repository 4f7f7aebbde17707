"""Virtual-folder file transfer through the Hub's proxy: whole-file PUT, resumable upload in
chunks, streamed download and a directory as tar, against a real Hub and service.

    .venv/bin/python benchmarks/vfolder_transfer.py              # 200 MB, 3 rounds, a table
    .venv/bin/python benchmarks/vfolder_transfer.py --mb 500 --rounds 5 --json

Bounded: at most 2,000 MB a file and 10 rounds; the data lives in a temporary directory.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.hubfixture import start_hub  # noqa: E402  (the tests' real-Hub launcher)

CHUNK = 8 << 20


def _source(path: Path, mb: int) -> str:
    digest = hashlib.sha256()
    with path.open("wb") as f:
        for _ in range(mb):
            block = os.urandom(1 << 20)
            digest.update(block)
            f.write(block)
    return digest.hexdigest()


def _round(hub, token: str, fid: str, src: Path, want: str, i: int) -> dict[str, float]:
    auth = {"Authorization": f"token {token}"}
    base = f"{hub.api_url}/vfolders/{fid}"
    size = src.stat().st_size
    out = {}
    t0 = time.perf_counter()
    with src.open("rb") as f:
        r = requests.put(f"{base}/files/put-{i}.bin", data=f, headers=auth, timeout=600)
    assert r.status_code == 201, r.text
    out["put"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    r = requests.post(
        f"{base}/uploads", json={"path": f"chunked-{i}.bin", "size": size}, headers=auth, timeout=60
    )
    assert r.status_code == 201, r.text
    upload = r.json()["id"]
    with src.open("rb") as f:
        offset = 0
        while offset < size:
            chunk = f.read(CHUNK)
            r = requests.patch(
                f"{base}/uploads/{upload}",
                data=chunk,
                headers={**auth, "Upload-Offset": str(offset)},
                timeout=600,
            )
            assert r.status_code == 200, r.text
            offset += len(chunk)
    assert r.json()["complete"]
    out["chunked"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    digest = hashlib.sha256()
    with requests.get(f"{base}/files/put-{i}.bin", headers=auth, stream=True, timeout=600) as r:
        assert r.status_code == 200, r.text
        for block in r.iter_content(1 << 20):
            digest.update(block)
    out["get"] = time.perf_counter() - t0
    assert digest.hexdigest() == want, "the download differs from the upload"

    t0 = time.perf_counter()
    n = 0
    with requests.get(f"{base}/files?archive=tar", headers=auth, stream=True, timeout=600) as r:
        assert r.status_code == 200, r.text
        for block in r.iter_content(1 << 20):
            n += len(block)
    out["tar"] = time.perf_counter() - t0
    out["tar_bytes"] = n
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=200, help="file size in MB (<= 2000)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (<= 10)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    mb, rounds = min(max(args.mb, 1), 2000), min(max(args.rounds, 1), 10)
    with tempfile.TemporaryDirectory(prefix="lf-bench-vf-") as tmp:
        src = Path(tmp) / "source.bin"
        want = _source(src, mb)
        hub = start_hub(Path(tmp) / "hub")
        try:
            root = hub.wait_token("root")
            for method, path, body in [
                ("POST", "/domains", {"name": "bench"}),
                ("POST", "/users", {"username": "ann", "domain": "bench"}),
            ]:
                assert hub.api(method, path, root, json=body).status_code == 201
            token = hub.wait_token("ann")
            r = hub.api("POST", "/vfolders", token, json={"name": "bench"})
            assert r.status_code == 201, r.text
            fid = r.json()["id"]
            results = [_round(hub, token, fid, src, want, i) for i in range(rounds)]
        finally:
            hub.stop()
    summary = {}
    for key in ("put", "chunked", "get", "tar"):
        seconds = statistics.median(r[key] for r in results)
        moved = statistics.median(r["tar_bytes"] for r in results) if key == "tar" else mb * 2**20
        summary[key] = {"median_s": round(seconds, 3), "MB_per_s": round(moved / 2**20 / seconds, 1)}
    if args.json:
        print(json.dumps({"mb": mb, "rounds": rounds, "results": summary}))
        return
    print(f"{mb} MB file, {rounds} rounds, through the Hub's proxy (median)")
    labels = {
        "put": "PUT whole file",
        "chunked": f"resumable, {CHUNK >> 20} MB chunks",
        "get": "GET streamed",
        "tar": "folder as tar (all files)",
    }
    for key, v in summary.items():
        print(f"  {labels[key]:<28} {v['median_s']:>8.2f} s  {v['MB_per_s']:>8.1f} MB/s")


if __name__ == "__main__":
    main()
