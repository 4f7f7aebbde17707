"""Building a recipe's image on a Docker engine ("My Environments"): the edge of
:mod:`labfleet.compute.recipes`, which is pure.

Blocking functions for a caller to run in a thread (``asyncio.to_thread``). Nothing here decides
who may build what, with which limits, or under which tag: the caller does, and passes the result.

* :func:`find_built` finds an image already built from a recipe (by its ``ai.labfleet.recipe-hash``
  label, which the Dockerfile's last instruction sets), so that an identical recipe is never built
  twice.
* :func:`build` builds one: the context is a tar of :func:`recipes.context_files`, sent to the
  engine's ``/build`` (the classic builder, as docker-py's ``build`` sends it), with Docker's layer
  cache (never ``nocache``), intermediate containers always removed, no pull of newer bases. Every
  line of the build's output goes to ``log``; the steps it ran ("Step N/M : ...") and whether each
  came from the cache are in the result, and a failure names the step that failed.

The build's containers run with the limits given (the user's share of their quota): ``mem_limit``
(no swap beyond it) and ``cpu_limit`` in cores (a CFS quota, which docker-py's ``build`` cannot
send: hence the request is made here, with docker-py's own request helpers).
"""

from __future__ import annotations

import io
import queue
import re
import tarfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from labfleet.compute.recipes import (
    DEFAULT_USER,
    LABEL_BASE,
    LABEL_RECIPE_HASH,
    LAYERS,
    RECIPE_DIR,
    Recipe,
    check_base_image,
    context_files,
    recipe_hash,
)

# Lines of the build's output kept for a BuildFailed (the caller's ``log`` gets every one).
LOG_TAIL_LINES = 2000
CPU_PERIOD_US = 100_000
_HASH = re.compile(r"^[0-9a-f]{64}$")
_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_RUNNING_IN = re.compile(r"^ ---> Running in ([0-9a-f]{12,64})$")
_USING_CACHE = " ---> Using cache"
_SUCCESSFULLY_BUILT = re.compile(r"^Successfully built ([0-9a-f]{12,64})$")


@dataclass(frozen=True)
class ImageInfo:
    """An image on the engine built from a recipe."""

    id: str  # sha256:...
    tags: tuple[str, ...]  # repo:tag names, none for an image whose tag went to a newer one
    size: int  # bytes, with its base
    created: float  # seconds since the epoch
    recipe_hash: str
    base: str | None  # the recipe's base, from its label


@dataclass(frozen=True)
class BuildStep:
    """One instruction of the build, as the engine reported it."""

    number: int  # 1-based
    total: int
    instruction: str  # as the engine shows it: "RUN pip install --no-cache-dir -r ..."
    cached: bool  # "Using cache": the layer was reused, nothing ran

    @property
    def layer(self) -> str | None:
        """The recipe layer this step belongs to (apt, conda, pip, postBuild), or None."""
        return layer_of(self.instruction)

    def describe(self) -> str:
        layer = self.layer
        return f"step {self.number}/{self.total}" + (f" ({layer})" if layer else "") + f": {self.instruction}"


@dataclass(frozen=True)
class BuildResult:
    image_id: str  # sha256:...
    tag: str
    size: int  # bytes
    cached: bool  # every step came from the cache: nothing was built
    seconds: float
    steps: tuple[BuildStep, ...]
    recipe_hash: str


class BuildFailed(Exception):
    """The build failed: ``step`` is the step that failed (None before the first), ``error`` the
    engine's message, ``log`` the last lines of the output (at most LOG_TAIL_LINES)."""

    def __init__(self, message: str, step: BuildStep | None, log: Iterable[str] = (), error: str = ""):
        super().__init__(message)
        self.message = message
        self.step = step
        self.error = error or message
        self.log = list(log)


class BuildTimeout(BuildFailed):
    """The build did not finish in time: its running step was stopped and nothing was tagged."""


def layer_of(instruction: str) -> str | None:
    """The recipe layer a Dockerfile instruction of :func:`recipes.dockerfile` belongs to."""
    for layer, file in LAYERS:
        if f"{RECIPE_DIR}/{file}" in instruction:
            return layer
    if instruction.startswith("RUN ") and "apt-get" in instruction:
        return "apt"
    return None


# --- finding a built image ---------------------------------------------------------------------------


def low_level_api(client: Any) -> Any:
    """The low-level APIClient of a ``docker.DockerClient`` (or the APIClient itself)."""
    return getattr(client, "api", client)


def find_built(client: Any, recipe_hash: str) -> ImageInfo | None:
    """The image built from the recipe whose :func:`recipes.recipe_hash` this is, or None.

    A tagged image before an untagged one, then the newest. ``client``: a ``docker.DockerClient``
    or ``docker.APIClient``.
    """
    if not isinstance(recipe_hash, str) or not _HASH.match(recipe_hash):
        raise ValueError(f"not a recipe hash: {str(recipe_hash)[:80]!r}")
    rows = low_level_api(client).images(filters={"label": f"{LABEL_RECIPE_HASH}={recipe_hash}"})
    found = []
    for row in rows or []:
        labels = row.get("Labels") or {}
        if labels.get(LABEL_RECIPE_HASH) != recipe_hash:
            continue
        tags = tuple(t for t in (row.get("RepoTags") or []) if t and t != "<none>:<none>")
        found.append(
            ImageInfo(
                id=row["Id"],
                tags=tags,
                size=int(row.get("Size") or 0),
                created=float(row.get("Created") or 0),
                recipe_hash=recipe_hash,
                base=labels.get(LABEL_BASE),
            )
        )
    if not found:
        return None
    return max(found, key=lambda info: (bool(info.tags), info.created))


def tag_image(client: Any, image_id: str, tag: str) -> None:
    """Give the image ``image_id`` the name ``tag`` (``repository:tag``) too."""
    check_base_image(tag)
    repository, _, name = tag.rpartition(":")
    if not repository or "/" in name or "@" in tag:
        raise ValueError(f"tag {tag!r} is not repository:tag")
    low_level_api(client).tag(image_id, repository, name)


def image_size(client: Any, name: str) -> int:
    """The bytes of image ``name`` with all its layers; 0 when the engine does not have it."""
    import docker.errors

    try:
        return int(low_level_api(client).inspect_image(name).get("Size") or 0)
    except docker.errors.ImageNotFound:
        return 0


def network_exists(client: Any, name: str) -> bool:
    return any(n.get("Name") == name for n in low_level_api(client).networks(names=[name]))


def push_image(client: Any, ref: str, *, log: Callable[[str], None]) -> None:
    """Push ``ref`` (``registry/repository:tag``) to its registry; each layer's outcome to ``log``
    (not the progress lines). :class:`BuildFailed` with the registry's words when it refuses."""
    repository, _, tag = ref.rpartition(":")
    log(f"labfleet: pushing {ref}")
    for item in low_level_api(client).push(repository, tag=tag, stream=True, decode=True):
        if item.get("error"):
            message = str(item.get("errorDetail", {}).get("message") or item["error"])
            raise BuildFailed(
                f"the push to the fleet's registry failed: {message[:500]}", None, error=message
            )
        status = str(item.get("status") or "")
        if status and not item.get("progressDetail") and item.get("id") and status != "Preparing":
            log(f"  {item['id']}: {status}")
    log(f"labfleet: pushed {ref}")


def remove_image(client: Any, tag: str) -> bool:
    """Take the name ``tag`` off its image (which the engine deletes with the parents nothing else
    uses, once it has no other name): True; False when no image has that name."""
    import docker.errors

    try:
        low_level_api(client).remove_image(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


# --- building ----------------------------------------------------------------------------------------


def context_tar(files: Mapping[str, bytes]) -> bytes:
    """The build context as an uncompressed tar: the files, 0644, owned by 0:0, mtime 0 (the same
    files always give the same archive, and the same cache keys)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in sorted(files):
            data = files[name]
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _memory_bytes(value: int | str) -> int:
    if isinstance(value, bool):
        raise ValueError("mem_limit is a number of bytes or a size like 2G")
    if isinstance(value, int):
        out = value
    else:
        from docker.utils import parse_bytes

        out = int(parse_bytes(value))
    if out < 6 * 2**20:
        raise ValueError(f"mem_limit {value!r} is under Docker's minimum of 6 MiB")
    return out


def build_limits(cpu_limit: float | None, mem_limit: int | str | None) -> dict[str, int]:
    """The /build query parameters that limit the build's containers."""
    out: dict[str, int] = {}
    if mem_limit is not None:
        memory = _memory_bytes(mem_limit)
        out.update(memory=memory, memswap=memory)  # no swap beyond the limit
    if cpu_limit is not None:
        if isinstance(cpu_limit, bool) or not cpu_limit > 0:
            raise ValueError(f"cpu_limit {cpu_limit!r} is not a positive number of cores")
        out.update(cpuperiod=CPU_PERIOD_US, cpuquota=max(1000, int(cpu_limit * CPU_PERIOD_US)))
    return out


@dataclass
class _Progress:
    """What the build's output said so far."""

    log: Callable[[str], None]
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_TAIL_LINES))
    steps: list[BuildStep] = field(default_factory=list)
    container: str | None = None  # the intermediate container of the running step
    image_id: str | None = None
    error: str | None = None
    _partial: str = ""

    @property
    def step(self) -> BuildStep | None:
        return self.steps[-1] if self.steps else None

    def _line(self, line: str) -> None:
        line = line.rstrip()
        if not line.strip():
            return
        self.tail.append(line)
        m = _STEP.match(line)
        if m:
            self.steps.append(BuildStep(int(m.group(1)), int(m.group(2)), m.group(3), cached=False))
            self.container = None
        elif line.startswith(_USING_CACHE) and self.steps:
            last = self.steps[-1]
            self.steps[-1] = BuildStep(last.number, last.total, last.instruction, cached=True)
        elif (m := _RUNNING_IN.match(line)) is not None:
            self.container = m.group(1)
        elif (m := _SUCCESSFULLY_BUILT.match(line)) is not None and self.image_id is None:
            self.image_id = m.group(1)
        self.log(line)

    def feed(self, chunk: Any) -> None:
        if not isinstance(chunk, dict):
            return
        if "stream" in chunk:
            text = self._partial + str(chunk["stream"])
            *lines, self._partial = text.split("\n")
            for line in lines:
                self._line(line)
        if "error" in chunk or "errorDetail" in chunk:
            self.flush()
            detail = chunk.get("errorDetail") or {}
            self.error = str(chunk.get("error") or detail.get("message") or "the build failed").strip()
            self._line(f"ERROR: {self.error}")
        aux = chunk.get("aux")
        if isinstance(aux, dict) and aux.get("ID"):
            self.image_id = str(aux["ID"])
        if "status" in chunk:  # pulling a missing base: one line per status, no progress bars
            status = str(chunk["status"])
            self._line(f"{chunk['id']}: {status}" if chunk.get("id") else status)

    def flush(self) -> None:
        if self._partial:
            line, self._partial = self._partial, ""
            self._line(line)


def _open_build(api: Any, context: bytes, params: Mapping[str, Any]) -> Any:
    """POST /build (as docker-py's ``APIClient.build`` does, with the CPU quota it cannot send):
    the streamed response."""
    headers = {"Content-Type": "application/tar"}
    api._set_auth_headers(headers)  # a base missing here is pulled with the client's credentials
    response = api._post(
        api._url("/build"), data=context, params=dict(params), headers=headers, stream=True, timeout=None
    )
    api._raise_for_status(response)
    return response


def build(
    client: Any,
    recipe: Recipe,
    *,
    tag: str,
    index_url: str | None,
    log: Callable[[str], None],
    timeout: float,
    user: str = DEFAULT_USER,
    network_mode: str = "host",
    cpu_limit: float | None = None,
    mem_limit: int | str | None = None,
    apt_proxy: str | None = None,
    own_env: bool = True,
) -> BuildResult:
    """Build ``recipe``'s image and tag it ``tag``; blocking (run it in a thread).

    ``client``: a ``docker.DockerClient`` or ``docker.APIClient``. ``index_url``, ``user``,
    ``apt_proxy``, ``own_env``: as :func:`recipes.dockerfile` takes them (``own_env``, on by
    default here: a base whose venv or conda env is root's is given to the user, once per base).
    ``log``: called with every line of the build's output, in order, from this thread; an error it
    raises stops the build. ``timeout``: seconds; past it the running step's container is killed,
    the request dropped and :class:`BuildTimeout` raised. ``network_mode``: of the build's
    containers (``host`` here; ``default``, a network name, ``none``). ``cpu_limit`` (cores),
    ``mem_limit`` (bytes or ``"2G"``): limits of the build's containers.

    Docker's layer cache is used: an unchanged recipe rebuilds from the cache (``cached`` True:
    nothing ran), and a change rebuilds from its layer on (see :mod:`labfleet.compute.recipes`).
    :class:`BuildFailed` when a step fails (``step`` names it; nothing is tagged);
    ``docker.errors.APIError`` when the engine refuses the request.
    """
    check_base_image(tag)
    if "@" in tag:
        raise ValueError(f"tag {tag!r} has a digest: give repository:tag")
    if not timeout > 0:
        raise ValueError("timeout must be positive")
    files = context_files(recipe, user=user, index_url=index_url, apt_proxy=apt_proxy, own_env=own_env)
    want = recipe_hash(recipe)
    params: dict[str, Any] = {
        "t": tag,
        "dockerfile": "Dockerfile",
        "q": False,
        "nocache": False,
        "rm": True,
        "forcerm": True,
        "pull": False,
        "networkmode": network_mode,
        **build_limits(cpu_limit, mem_limit),
    }
    api = low_level_api(client)
    progress = _Progress(log=log)
    started = time.monotonic()
    deadline = started + timeout
    response = _open_build(api, context_tar(files), params)
    chunks: queue.Queue[tuple[str, Any]] = queue.Queue()

    def read() -> None:
        try:
            for chunk in api._stream_helper(response, decode=True):
                chunks.put(("chunk", chunk))
        except BaseException as e:  # handed to the caller's thread
            chunks.put(("failed", e))
        else:
            chunks.put(("end", None))

    reader = threading.Thread(target=read, name=f"envbuild {tag}", daemon=True)
    reader.start()
    finished = False
    try:
        while True:
            try:
                kind, value = chunks.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                progress.flush()
                where = f" (at {progress.step.describe()})" if progress.step else ""
                message = f"the build did not finish in {timeout:g} s{where}"
                progress.tail.append(f"ERROR: {message}")
                log(f"ERROR: {message}")
                raise BuildTimeout(message, progress.step, progress.tail) from None
            if kind == "chunk":
                progress.feed(value)
                continue
            progress.flush()
            if kind == "failed":
                message = f"the build's output broke off: {value}"
                raise BuildFailed(message, progress.step, progress.tail) from value
            break
        finished = True
    finally:
        if not finished:
            _stop(api, progress.container, response)
    if progress.error is not None:
        step = progress.step
        where = f"{step.describe()} failed: " if step else ""
        raise BuildFailed(where + progress.error, step, progress.tail, error=progress.error)
    if progress.image_id is None:
        raise BuildFailed("the engine ended the build without an image", progress.step, progress.tail)
    image = api.inspect_image(progress.image_id)
    labels = (image.get("Config") or {}).get("Labels") or {}
    if labels.get(LABEL_RECIPE_HASH) != want:
        raise BuildFailed(
            f"the built image {image['Id']} has no label {LABEL_RECIPE_HASH}={want}",
            progress.step,
            progress.tail,
        )
    steps = tuple(progress.steps)
    return BuildResult(
        image_id=str(image["Id"]),
        tag=tag,
        size=int(image.get("Size") or 0),
        cached=all(s.cached for s in steps if not s.instruction.upper().startswith("FROM ")),
        seconds=time.monotonic() - started,
        steps=steps,
        recipe_hash=want,
    )


def _stop(api: Any, container: str | None, response: Any) -> None:
    """Stop a build that is given up: kill its running step's container (the step fails, the
    engine ends the build and removes the container) and drop the request (the engine cancels a
    build whose client is gone)."""
    if container:
        try:
            api.kill(container)
        except Exception:  # gone already, or never started
            pass
    try:
        response.close()
    except Exception:
        pass


def describe_steps(steps: Iterable[BuildStep]) -> str:
    """One line per step: ``cached`` or ``built``, and the step (for logs and test messages)."""
    return "\n".join(f"{'cached' if s.cached else 'built '} {s.describe()}" for s in steps)


__all__ = [
    "BuildFailed",
    "BuildResult",
    "BuildStep",
    "BuildTimeout",
    "ImageInfo",
    "build",
    "build_limits",
    "context_tar",
    "describe_steps",
    "find_built",
    "layer_of",
    "remove_image",
    "tag_image",
]
