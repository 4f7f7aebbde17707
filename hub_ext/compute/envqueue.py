"""The service's environment builds ("My Environments"): a queue that builds each QUEUED
environment (:mod:`labfleet.compute.environments`) on this node's Docker engine
(:mod:`labfleet.compute.envbuild`), in a thread.

* The queue is the DB: QUEUED environments, oldest first. It is served after each creation, after
  each build and at the service's start (when builds a stopped service left BUILDING wait again).
* At most ``max_running`` builds at once, and one per user (an environment's creator): the others
  wait, QUEUED.
* A build goes QUEUED -> BUILDING -> READY or FAILED, each committed as it happens. Every line of
  its output is appended to the environment's log file as it comes (``GET /api/environments/{id}/logs``
  reads it while the build runs); a failed build says which step failed, and keeps its log.
* An image of the same recipe on the engine (by its label) is reused: READY, nothing built.
  (An environment of the same recipe already READY in the DB makes a new one READY in the request.)
* The build's containers get ``cpu_limit`` cores and ``mem_limit`` bytes (the service's settings),
  or less: what the creator's quota has left when the build starts; those are held in that quota
  (the usage ledger) while it runs, so the creator's sessions cannot take them meanwhile
  (:mod:`labfleet.compute.buildcharge`); too little left: the build fails, saying so;
  packages come from ``index_url`` (None: the public index). They join the Docker network
  ``network`` (the service's: the sessions' guarded one), never the host's: a recipe's postBuild is
  the user's code, and reaches only what the user's sessions reach.
* An environment's size is that of its own layers (its image's less its base's): what it adds to
  the engines and the registry, and what ``max_environment_bytes`` counts.
* With a fleet registry (``registry``, ``host:port``), a READY image is pushed there and its name
  there is the environment's image: every node pulls it (Swarm node 2 runs what node 1 built).
* No engine (no docker package, the daemon down): the build fails, saying so.
* Deleting an environment stops its build at its next line of output, and takes its image's name
  off the engine, and out of the fleet's registry (:mod:`labfleet.compute.registry`), when no other
  environment has that image and it is not registered.
* Save as environment for a session whose container is on another node's engine is handed to that
  node's agent (:mod:`labfleet.compute.envremote`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO

from sqlalchemy.orm import Session, sessionmaker

from labfleet.compute import buildcharge, envbuild, envcommit, environments, envremote, registry
from labfleet.compute.environments import READY, BuildOrder, Built, Deleted
from labfleet.core import database
from labfleet.core.authz import Actor
from labfleet.core.display import fmt_bytes
from labfleet.core.envmodels import Environment

# A build log is cut at this size (a line says so); the build goes on.
MAX_LOG_BYTES = 16 << 20
# Docker's own network modes of a build's containers (any other name is a network that must exist).
STANDARD_NETWORKS = ("none", "bridge", "default")


class EngineUnavailable(Exception):
    """No Docker engine to build on."""


class Elsewhere(Exception):
    """The session to commit has no container on this engine: its node's agent commits it."""


class Cancelled(Exception):
    """The environment was deleted while it was built."""


def docker_client() -> Any:
    """This node's Docker engine (the Docker backend's: ``docker.from_env()``), answering."""
    try:
        import docker
    except ImportError:
        raise EngineUnavailable("the docker package is not installed on the service") from None
    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except Exception as e:  # DockerException, connection refused, a socket without permission
        raise EngineUnavailable(f"the Docker engine is not reachable: {e}") from None
    return client


class BuildLog:
    """An environment's build log: lines appended and flushed as they come, at most MAX_LOG_BYTES."""

    def __init__(self, path: Path, *, fresh: bool = True) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path = path
        self._file: BinaryIO = open(path, "wb" if fresh else "ab")
        self.size = self._file.tell()
        self.cut = False

    def write(self, line: str) -> None:
        data = (line.rstrip("\n") + "\n").encode("utf-8", "replace")
        if self.cut:
            return
        if self.size + len(data) > MAX_LOG_BYTES:
            self.cut = True
            data = (
                f"labfleet: the log is cut here, at {fmt_bytes(MAX_LOG_BYTES)}; the build goes on\n".encode()
            )
        self._file.write(data)
        self._file.flush()
        self.size += len(data)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> BuildLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Builds:
    """The build queue of one service (see the module's notes)."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        log: Any,
        *,
        log_dir: str | Path,
        node: str,
        index_url: str | None = None,
        network: str = "none",
        registry: str | None = None,
        timeout: float = 1800,
        max_running: int = 2,
        cpu_limit: float | None = None,
        mem_limit: int | None = None,
        client_factory: Callable[[], Any] = docker_client,
    ) -> None:
        self.session_factory = session_factory
        self.log = log
        self.log_dir = log_dir
        self.node = node
        self.index_url = index_url or None
        self.network = network
        self.registry = registry or None
        self.timeout = timeout
        self.max_running = max(1, max_running)
        self.cpu_limit = cpu_limit
        self.mem_limit = mem_limit
        self.client_factory = client_factory
        self.running: dict[str, str] = {}  # environment id -> its creator, while its build runs
        self.cancelled: set[str] = set()
        self._tasks: set[asyncio.Future] = set()
        self.stopping = False

    def log_path(self, env_id: str) -> Path:
        return environments.build_log_file(self.log_dir, env_id)

    # ------------------------------------------------------------ in the request

    def create(self, db: Session, actor: Actor, body: Any) -> Environment:
        """:func:`environments.create`; the queue is served once the request's unit commits
        (:meth:`serve`). An environment READY at once gets its log here."""
        env = environments.create(db, actor, body)
        if env.status == READY:
            with BuildLog(self.log_path(env.id)) as out:
                out.write(
                    f"labfleet: environment {env.name}: base {env.base}, files {', '.join(env.recipe) or 'none'}"
                )
                out.write(f"labfleet: {env.status_reason}; nothing built")
        return env

    def delete(self, db: Session, actor: Actor, env_id: str) -> Deleted:
        """:func:`environments.delete`; its build (if one runs) stops at its next line of output.
        Once the unit commits, :meth:`forget` takes care of its log and image."""
        gone = environments.delete(db, actor, env_id)
        if gone.id in self.running:
            self.cancelled.add(gone.id)
        return gone

    async def forget(self, gone: Deleted) -> None:
        """After a deletion: its log goes; its image's name goes when no environment has that image
        (a build that still runs takes care of its own)."""
        try:
            self.log_path(gone.id).unlink(missing_ok=True)
        except OSError as e:
            self.log.warning("Could not remove the build log of environment %s: %s", gone.id, e)
        if gone.image and gone.id not in self.running:
            await asyncio.to_thread(self._remove_unused_image, gone.image)

    # ------------------------------------------------------------ the queue

    def resume(self) -> None:
        """At the service's start: builds left BUILDING by a stopped service wait again; serve."""
        with database.session_scope(self.session_factory) as db:
            again = environments.requeue_interrupted(db)
        if again:
            self.log.info("Environment builds interrupted by a restart queued again: %s", ", ".join(again))
        self.serve()

    async def poke(self) -> None:
        """:meth:`serve`, as an after-commit hook."""
        self.serve()

    def serve(self) -> list[str]:
        """Start the builds that may run now (oldest first, one per user, at most ``max_running``):
        their ids. Call it in the event loop."""
        if self.stopping or len(self.running) >= self.max_running:
            return []
        with database.session_scope(self.session_factory) as db:
            waiting = environments.queued(db)
        started = []
        loop = asyncio.get_running_loop()
        for env_id, creator in waiting:
            if len(self.running) >= self.max_running:
                break
            if env_id in self.running or creator in self.running.values():
                continue
            self.running[env_id] = creator
            task = loop.create_task(self._run(env_id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            started.append(env_id)
        return started

    async def wait(self) -> None:
        """Until no build runs (tests; the service's stop)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def stop(self) -> None:
        """The service stops: every running build stops at its next line of output (they stay
        BUILDING, and :meth:`resume` queues them again at the next start)."""
        self.stopping = True
        self.cancelled.update(self.running)

    async def _run(self, env_id: str) -> None:
        """The build in a thread of its own: a daemon, so that a build is never what keeps a
        stopping service (its request dropped, the engine ends the build)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def settle(error: BaseException | None) -> None:
            if done.done():
                return
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(None)

        def target() -> None:
            error: BaseException | None = None
            try:
                self._build(env_id)
            except BaseException as e:  # handed to the event loop
                error = e
            try:
                loop.call_soon_threadsafe(settle, error)
            except RuntimeError:  # the loop is closed: the service stopped
                pass

        threading.Thread(target=target, name=f"envbuild {env_id}", daemon=True).start()
        try:
            await done
        except Exception:  # noqa: BLE001 (the queue goes on, whatever broke)
            self.log.exception("The build of environment %s failed", env_id)
        finally:
            self.running.pop(env_id, None)
            self.cancelled.discard(env_id)
            if not self.stopping:
                self.serve()

    # ------------------------------------------------------------ one build (in a thread)

    def _build(self, env_id: str) -> None:
        with database.session_scope(self.session_factory) as db:
            order = environments.start_build(db, env_id, self.node)
            if order is not None:
                order = buildcharge.hold(db, order, self.cpu_limit, self.mem_limit)
        if order is None:
            return
        with BuildLog(self.log_path(env_id)) as out:
            files = ", ".join(order.recipe.files) or "none"
            out.write(
                f"labfleet: building environment {order.name} on node {self.node}: base {order.recipe.base}, files {files}"
            )
            try:
                if order.refusal is not None:
                    raise envbuild.BuildFailed(order.refusal, None)
                built = self._image(order, out)
            except Cancelled:
                out.write("labfleet: stopped (the environment was deleted, or the service stops)")
                self._remove_unused_image(order.tag)
                return
            except Elsewhere as e:
                with database.session_scope(self.session_factory) as db:
                    node = envremote.hand_over(db, env_id, self.node)
                if node is not None:
                    out.write(f"{envremote.HANDED_OVER} {node}, where session {e} runs:")
                    return
                reason = (
                    f"session {e} has no running container on this node's Docker engine, and no node "
                    "agent runs where it does (Save as environment takes a running Docker or Swarm session)"
                )
            except envbuild.BuildFailed as e:
                reason = e.message
            except EngineUnavailable as e:
                reason = str(e)
            except Exception as e:  # noqa: BLE001 (the engine refused the request, or broke off)
                self.log.warning("The build of environment %s failed: %s", env_id, e, exc_info=True)
                reason = f"the build stopped: {type(e).__name__}: {str(e)[:500]}"
            else:
                with database.session_scope(self.session_factory) as db:
                    status = environments.finish_build(db, env_id, built)
                    env = db.get(Environment, env_id)
                    reason = env.status_reason if env is not None else ""
                if status == READY:
                    out.write(f"labfleet: READY: image {built.image} ({fmt_bytes(built.size)})")
                    return
                if status is not None:
                    out.write(f"labfleet: FAILED: {reason}")
                self._remove_unused_image(built.image)
                return
            out.write(f"labfleet: FAILED: {reason}")
            with database.session_scope(self.session_factory) as db:
                environments.fail_build(db, env_id, reason)

    def _image(self, order: BuildOrder, out: BuildLog) -> Built:
        """:meth:`_local_image`, sized by its own layers, and pushed to the fleet's registry when there
        is one (then its name there is the environment's image, which every node pulls)."""

        def line(text: str) -> None:
            if order.id in self.cancelled:
                raise Cancelled(order.id)
            out.write(text)

        client = self.client_factory()
        try:
            if order.source_session and envcommit.session_container(client, order.source_session) is None:
                raise Elsewhere(order.source_session)
            built = self._local_image(client, order, out, line)
            # What the environment takes is its own layers: its base's are every session's anyway.
            built = replace(built, size=max(0, built.size - envbuild.image_size(client, order.recipe.base)))
            if not self.registry:
                return built
            ref = f"{self.registry}/{order.tag}"
            envbuild.tag_image(client, built.image_id, ref)
            envbuild.push_image(client, ref, log=line)
            return replace(built, image=ref)
        finally:
            client.close()

    def _local_image(
        self, client: Any, order: BuildOrder, out: BuildLog, line: Callable[[str], None]
    ) -> Built:
        """The image of ``order``: its session's container committed, one of the same recipe on the
        engine, named, or a build."""
        if order.source_session is not None:
            done = envcommit.commit_session(
                client, order.source_session, tag=order.tag, base=order.recipe.base, log=line
            )
            return Built(order.tag, done.image_id, done.size, reused=False, recorded=done.recorded)
        found = envbuild.find_built(client, order.recipe_hash)
        if found is not None:
            if order.tag not in found.tags:
                envbuild.tag_image(client, found.id, order.tag)
            out.write(f"labfleet: an image of the same recipe is on the engine ({found.id[:19]}): reused")
            return Built(order.tag, found.id, found.size, reused=True)
        if self.network not in STANDARD_NETWORKS and not envbuild.network_exists(client, self.network):
            raise envbuild.BuildFailed(
                f"the Docker network {self.network}, which builds join, does not exist yet: the Docker "
                "spawner makes the sessions' network at their first session (or set the service's "
                "environment_build_network)",
                None,
            )
        cpu_limit, mem_limit = order.cpu_limit, order.mem_limit
        out.write(
            f"labfleet: the build may use {cpu_limit or 'any number of'} core(s) and "
            f"{fmt_bytes(mem_limit) if mem_limit else 'any memory'} (held in your quota while it runs)"
        )
        result = envbuild.build(
            client,
            order.recipe,
            tag=order.tag,
            index_url=self.index_url,
            network_mode=self.network,
            log=line,
            timeout=self.timeout,
            cpu_limit=cpu_limit,
            mem_limit=mem_limit,
        )
        return Built(order.tag, result.image_id, result.size, reused=False)

    # ------------------------------------------------------------ commits handed to node agents

    def agent_orders(self, db: Session, node: str) -> list[dict[str, Any]]:
        """The commits handed to ``node``'s agent, for its heartbeat's answer."""
        return envremote.orders_for(db, node, self.registry)

    def take_agent_reports(
        self, db: Session, node: str, reports: list[envremote.CommitReport]
    ) -> list[envremote.Taken]:
        """A heartbeat's commit reports taken in its unit; write their logs with
        :meth:`write_agent_logs` once it commits."""
        return envremote.take_reports(db, node, reports, self.registry)

    def write_agent_logs(self, taken: list[envremote.Taken]) -> None:
        """Each report's lines not yet in its build log appended (after the hand-over's line), and
        its last line once the commit is done."""
        for t in taken:
            path = self.log_path(t.environment)
            try:
                lines = path.read_text(errors="replace").splitlines()
            except OSError:
                continue  # deleted meanwhile
            marks = [i for i, line in enumerate(lines) if line.startswith(envremote.HANDED_OVER)]
            written = len(lines) - marks[-1] - 1 if marks else 0
            with BuildLog(path, fresh=False) as out:
                for line in t.log[written:]:
                    out.write(line)
                if t.last:
                    out.write(t.last)

    def _remove_unused_image(self, tag: str) -> None:
        """Take ``tag`` off the engine unless an environment has (or builds) that image; best effort.
        An image of the registry goes by both its names here, and out of the registry too."""
        local = tag.removeprefix(f"{self.registry}/") if self.registry else tag
        with database.session_scope(self.session_factory) as db:
            if any(environments.image_in_use(db, t) for t in {tag, local}):
                return
        for name in dict.fromkeys((tag, local)):
            self._remove_image_name(name)
        if tag != local:
            try:
                if registry.delete_image(tag):
                    self.log.info("Deleted image %s from the fleet's registry", tag)
            except (OSError, ValueError) as e:
                self.log.warning("Could not delete image %s from the fleet's registry: %s", tag, e)

    def _remove_image_name(self, tag: str) -> None:
        try:
            client = self.client_factory()
        except EngineUnavailable:
            return
        try:
            if envbuild.remove_image(client, tag):
                self.log.info("Removed image %s: no environment has it any more", tag)
        except Exception as e:  # noqa: BLE001 (a container still uses it, the engine went away)
            self.log.warning("Could not remove image %s: %s", tag, e)
        finally:
            client.close()
