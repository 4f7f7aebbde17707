"""My Environments: how long from a recipe to a usable image, first build and again, and what the
push to the fleet's registry sends.

On this machine's Docker engine (scripts/docker.sh) from the test image (scripts/build-image.sh),
with a package index of three packages of its own on 127.0.0.1 (tests/pyindex.py: the public index
is never used) and a registry of its own (scripts/registry.sh, on 127.0.0.1 and a free port). It
calls what the service's build queue calls (labfleet.compute.envbuild): the timings are the
queue's minus its bookkeeping (a few ms).

* first: a recipe of 3 packages (requirements.txt) and a postBuild, built from scratch;
* same recipe: what the queue does for a recipe built before (find_built: the image by its label),
  and a full build of the same recipe that takes every step from the cache;
* one package changed: requirements.txt differs (the pip layer and the postBuild after it run again);
* push: the first image (its base's layers too, which every later push shares) and the second
  (only its own layers), measured as the growth of the registry's folder.

    .venv/bin/python benchmarks/environment_builds.py          # a table
    .venv/bin/python benchmarks/environment_builds.py --json

Bounded: 4 builds and 2 pushes, each at most 600 s. Everything it makes is removed at the end.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from labfleet.compute import envbuild  # noqa: E402
from labfleet.compute.recipes import parse_recipe  # noqa: E402
from labfleet.core.display import fmt_bytes  # noqa: E402
from tests.pyindex import write_index  # noqa: E402

IMAGE = "labfleet/singleuser:test"
TIMEOUT = 600


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002  (the base class's name)
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _script(name: str, *args: str) -> str:
    r = subprocess.run(
        ["bash", str(REPO / "scripts" / name), *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    if r.returncode != 0:
        sys.exit(f"scripts/{name} failed: {r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    args = parser.parse_args()
    _script("docker.sh")
    _script("build-image.sh")
    import docker

    client = docker.from_env(version="auto", timeout=TIMEOUT)
    token = secrets.token_hex(3)
    names = [f"lfbench-{token}-{i}" for i in range(4)]
    work = Path(tempfile.mkdtemp(prefix="lfbench-env-"))
    write_index(work / "index", {n: ("1.0", f"v-{n}") for n in names})
    handler = functools.partial(_QuietHandler, directory=str(work / "index"))
    index = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=index.serve_forever, daemon=True).start()
    index_url = f"http://127.0.0.1:{index.server_address[1]}/simple/"
    registry_state = work / "registry"
    registry_args = ["--addr", "127.0.0.1", "--port", str(_free_port()), "--state", str(registry_state)]
    registry = _script("registry.sh", *registry_args).strip().rpartition("=")[2]
    post_build = "#!/bin/sh\nset -e\npython -c 'print(\"postBuild ran\")'\n"
    first = parse_recipe(IMAGE, {"requirements.txt": "\n".join(names[:3]) + "\n", "postBuild": post_build})
    changed = parse_recipe(
        IMAGE, {"requirements.txt": "\n".join([*names[:2], names[3]]) + "\n", "postBuild": post_build}
    )
    tags = [f"lfbench/env:{token}-first", f"lfbench/env:{token}-again", f"lfbench/env:{token}-changed"]
    results: dict[str, float] = {}
    pushed: list[str] = []
    try:

        def build(recipe, tag):
            t0 = time.monotonic()
            result = envbuild.build(
                client,
                recipe,
                tag=tag,
                index_url=index_url,
                network_mode="host",
                log=lambda _l: None,
                timeout=TIMEOUT,
            )
            return time.monotonic() - t0, result

        results["first build, 3 packages (s)"], one = build(first, tags[0])
        t0 = time.monotonic()
        found = envbuild.find_built(client, one.recipe_hash)
        results["same recipe: found by its label (s)"] = time.monotonic() - t0
        assert found is not None and found.id == one.image_id
        results["same recipe: full build from the cache (s)"], again = build(first, tags[1])
        assert again.cached and again.image_id == one.image_id
        results["one package changed (s)"], two = build(changed, tags[2])
        sizes: dict[str, int] = {}
        for label, result in (("first", one), ("changed", two)):
            ref = f"{registry}/{result.tag}"
            envbuild.tag_image(client, result.image_id, ref)
            before = _folder_bytes(registry_state / "data")
            t0 = time.monotonic()
            envbuild.push_image(client, ref, log=lambda _l: None)
            results[f"push of the {label} image (s)"] = time.monotonic() - t0
            sizes[f"pushed bytes, {label} image"] = _folder_bytes(registry_state / "data") - before
            pushed.append(ref)
        sizes["image size, first (with its base)"] = one.size
        base_size = client.images.get(IMAGE).attrs["Size"]
        sizes["image size, first, its own layers"] = one.size - base_size
    finally:
        for tag in [*pushed, *reversed(tags)]:
            try:
                client.api.remove_image(tag)
            except Exception:  # noqa: BLE001 (not made: a build failed)
                pass
        _script("registry.sh", *registry_args, "--stop")
        index.shutdown()
        subprocess.run(["rm", "-rf", str(work)], check=False)
    if args.json:
        print(json.dumps({**{k: round(v, 2) for k, v in results.items()}, **sizes}))
        return
    for k, v in results.items():
        print(f"{k:45s} {v:10.2f}")
    for k, n in sizes.items():
        print(f"{k:45s} {fmt_bytes(n):>10s}")


if __name__ == "__main__":
    main()
