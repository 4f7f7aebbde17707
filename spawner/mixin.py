"""The labfleet spawner logic, shared by every backend.

``LabfleetSpawnerMixin`` goes before a JupyterHub spawner class (``class X(LabfleetSpawnerMixin,
LocalProcessSpawner)``).  It

1. offers the spawn form (the user's projects, images, resource groups and quota, from the service);
2. checks ``user_options`` (untrusted: the REST API can send anything) in ``apply_user_options``,
   which JupyterHub turns into a 400 with our message;
3. asks the labfleet service to admit and place the session before anything starts, waits in the
   queue while it is PENDING (``progress()`` tells the position), and fails with the service's
   reason when it is refused or cancelled;
4. hands the backend a :class:`~labfleet.spawner.launch.LaunchSpec` (``lf_prepare``), starts it, reports
   RUNNING, and gives the allocation back on stop, on a failed start and when ``poll()`` finds the
   server gone (with the exit code of a batch command);
5. keeps the session id in the Hub's state (``get_state`` / ``load_state``) so a Hub restart finds
   its allocation again.

Backends implement ``lf_prepare`` (apply the LaunchSpec to themselves) and
``lf_session_home`` (the session's home, where ``~/vfolders`` shows its virtual folders), and may
override ``lf_mounts`` (their own mounts), ``lf_exit_code``, ``lf_in_container``,
``lf_mps_withheld`` (why their sessions may not reach the node's MPS daemon: they do not run as one
non-root uid) and ``lf_folders_dir`` (where the folders are mounted).  A backend that sets
``lf_session_links_folders`` (Docker, Swarm) mounts the folders at ``/vfolders/<name>``, never
inside the home, and the session links ``~/vfolders`` there itself when it starts
(:mod:`labfleet.spawner.homefolders`): a home the user's sessions share (a volume per user) then
never holds another session's mount points.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

from jupyterhub.spawner import SpawnException
from traitlets import Float, Integer, List, Unicode, default

from labfleet.core.http import HTTPReply
from labfleet.core.hubmap import SERVICE_NAME
from labfleet.core.sessionlogs import SessionLogs, log_file
from labfleet.core.vocab import FINAL_STATUSES, PENDING
from labfleet.hub.client import LabfleetServiceClient

from . import form
from .homefolders import FOLDERS_ROOT, FOLDERS_ROOT_ENV, FOLDERS_TIDY_ENV
from .launch import VFOLDERS_DIR, LaunchSpec, Mount, build_launch, vfolder_mounts, with_caps
from .options import OptionsError, SessionOptions, options_from_form, parse_options
from .sessionnet import DEFAULT_DENY

ACTIVITY_INTERVAL_ENV = "LABFLEET_ACTIVITY_INTERVAL"
_EXIT = re.compile(r"ExitCode=(-?\d+)")
MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"


def session_mps(mode: str, session: dict[str, Any]) -> tuple[bool, str | None]:
    """Whether a placed session's fraction is limited with MPS under the spawner's ``mps`` setting
    (``yes`` | ``no`` | ``auto``), and its node's daemon's pipe directory (None when the node reports
    no running daemon). ``auto`` follows the node's report (``session["node_mps"]``) alone."""
    node = session.get("node_mps")
    on = isinstance(node, dict) and node.get("state") == "on"
    pipe = node.get("pipe_dir") if on and isinstance(node.get("pipe_dir"), str) else None
    if mode == "yes":
        return True, pipe
    if mode == "no":
        return False, None
    return on, pipe


_RELEASES: set[asyncio.Future] = set()  # releases under way after a cancelled spawn (kept from the GC)


def _refusal(reply: HTTPReply, what: str) -> SpawnException:
    """A service answer that stops the spawn, as the Hub shows it (form message, API status)."""
    if reply.code == 0:
        return SpawnException(
            f"{what}: the labfleet service is unreachable, try again shortly",
            reason="labfleet-unreachable",
            status_code=503,
        )
    status = reply.code if 400 <= reply.code < 500 else 502
    return SpawnException(
        f"{what}: {reply.message or f'the labfleet service answered {reply.code}'}",
        reason="labfleet-refused" if status < 500 else "labfleet-error",
        status_code=status,
    )


class LabfleetSpawnerMixin(SessionLogs, LabfleetServiceClient):
    """Admission, queueing, launch spec and release around a JupyterHub spawner (see module doc).

    A Configurable, so ``c.LabfleetSpawnerMixin.<option>`` configures every labfleet backend
    (``c.LabfleetServiceClient`` the service URL and token, shared with the authenticator).
    """

    # Set by backends that run the server in a container (device numbering restarts at 0 there).
    lf_in_container = False
    # Set by backends whose sessions mount their folders at FOLDERS_ROOT and link ~/vfolders there
    # themselves when their server starts (labfleet.session.homelink): Docker and Swarm.
    lf_session_links_folders = False

    service_timeout = Float(
        10.0, help="Seconds to wait for one answer of the labfleet service before the spawn fails."
    ).tag(config=True)

    service_restart_wait = Float(
        90.0,
        help="""Seconds a spawn keeps asking a labfleet service that does not answer for its session before
        it fails. The Hub starts a managed service that exited again once its poll notices (within 30
        s by default). The spawn asks again with the same session id, so a session the service
        admitted before it could answer is not admitted twice.""",
    ).tag(config=True)

    queue_poll_interval = Float(
        1.0,
        help="""Seconds between two looks at a queued (PENDING) session. The queue wait itself is bounded
        by the resource group's pending timeout, after which the service cancels the session.""",
    ).tag(config=True)

    backend_start_timeout = Integer(
        120,
        help="""Seconds the backend may take to start the server once the session is placed.

        `start_timeout` covers the whole start, queue wait included, so labfleet raises it; this
        bounds the backend's part alone.""",
    ).tag(config=True)

    batch_poll_interval = Integer(
        2,
        help="""Poll interval (seconds) for batch and inference sessions, so that the end of their command
        frees the allocation quickly. Interactive sessions keep `poll_interval`.""",
    ).tag(config=True)

    default_image = Unicode(
        "",
        help="""Image used when the options name none. Empty: the first image the session's project may
        use, as the labfleet service lists them.""",
    ).tag(config=True)

    session_service_url = Unicode(
        help="""The labfleet service's REST API as sessions reach it, given to each session as
        $LABFLEET_SERVICE_URL (its server extension calls it with the session's own Hub token).
        Empty: the URL the Hub itself uses (`LabfleetServiceClient.service_url`), right where sessions
        share the Hub's network (local sessions, Docker with host networking); set it for sessions
        on other networks.""",
    ).tag(config=True)

    session_egress_deny = List(
        Unicode(),
        list(DEFAULT_DENY),
        help="""Networks sessions on a network of their own (local sessions as root, Docker's session
        network) may not reach through the host, besides the host itself and other sessions, which
        they never reach: the cloud's metadata service (169.254.0.0/16) by default; add your
        internal ones.""",
    ).tag(config=True)

    mps = Unicode(
        "auto",
        help="""Whether a session with a fraction of a device is limited through its node's NVIDIA MPS
        daemon (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) or with
        framework memory caps: `yes` (always MPS), `no` (always caps), or `auto` (MPS where the node
        the session was placed on reports its MPS daemon on; the node reports its pipe directory too).
        Nodes run their daemon themselves: `labfleet agent --mps`, the service's `mps` for its own node.
        Only sessions that run as a numeric uid other than root get MPS (the daemon serves one uid at a
        time; root could change its limits): the Docker and Swarm backends' `container_user`, the local
        backend's session account. Others are held by the caps alone, and the Hub's log, the session's
        status reason, its environment (LABFLEET_GPU_MPS_WITHHELD) and its sidebar say why.""",
    ).tag(config=True)

    @default("start_timeout")
    def _start_timeout_default(self) -> int:
        # The queue wait is part of start(); the group's pending timeout bounds it, not this.
        return 24 * 3600

    @default("options_form")
    def _options_form_default(self):
        return self._lf_options_form

    @default("apply_user_options")
    def _apply_user_options_default(self):
        return LabfleetSpawnerMixin._lf_apply_user_options

    # ------------------------------------------------------------------ state

    lf_session_id: str | None = None
    lf_session: dict[str, Any] | None = None
    lf_options: SessionOptions | None = None
    lf_launch: LaunchSpec | None = None
    lf_exit: int | None = None
    lf_overhead_ms: float | None = None
    lf_mps_pipe_dir: str | None = None  # the session's node's MPS pipe directory (lf_mps)
    _lf_queue_message = ""

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()  # type: ignore[misc]
        if self.lf_session_id:
            state["labfleet_session_id"] = self.lf_session_id
        if self.lf_options is not None:
            state["labfleet_options"] = self.lf_options.to_json()
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)  # type: ignore[misc]
        self.lf_session_id = state.get("labfleet_session_id") or None
        raw = state.get("labfleet_options")
        if raw:
            try:
                self.lf_options = parse_options(raw)
            except OptionsError:
                self.lf_options = None

    def clear_state(self) -> None:
        # The backend clears its state when its server is gone (LocalProcessSpawner does it inside
        # poll()); the session id stays until the allocation is given back (_lf_release).
        super().clear_state()  # type: ignore[misc]
        self.lf_session = None
        self.lf_launch = None

    # ------------------------------------------------------------------ the service

    async def lf_call(self, method: str, path: str, body: Any = None) -> HTTPReply:
        return await self.service_request(method, path, body, timeout=self.service_timeout)

    def lf_proxy_endpoint(self, url: str = "") -> tuple[str, int]:
        """Host and port of ``url``, by default the Hub's public proxy (its public URL): where
        sessions on a guarded network have their gateway forward the Hub's API and the service."""
        if not url:
            proxy = getattr(self.user, "settings", {}).get("proxy")  # type: ignore[attr-defined]
            url = getattr(proxy, "public_url", "") or ""
        parsed = urlparse(url)
        return parsed.hostname or "", parsed.port or (443 if parsed.scheme == "https" else 80)

    @property
    def lf_username(self) -> str:
        return self.user.name  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ options

    async def _lf_options_form(self, spawner: Any = None) -> str:
        reply = await self._lf_launch_options()
        if not reply.ok or not isinstance(reply.data, dict):
            return form.unavailable(reply.message or "the labfleet service did not answer")
        return form.render(  # type: ignore[attr-defined]
            reply.data, previous=self.user_options or {}, preview_url=self._lf_preview_url()
        )

    def _lf_preview_url(self) -> str:
        """The service's ``GET /api/sessions/preview`` as the browser reaches it, through the proxy."""
        hub_prefix = self.hub.base_url  # type: ignore[attr-defined]  # {base_url}hub/
        base = hub_prefix[: -len("hub/")] if hub_prefix.endswith("hub/") else "/"
        return f"{base}services/{SERVICE_NAME}/api/sessions/preview"

    async def _lf_launch_options(self) -> HTTPReply:
        """What the user may launch (projects with quota left, images, groups), from the service."""
        return await self.lf_call("GET", f"/users/{quote(self.lf_username, safe='')}/launch-options")

    async def _lf_only_project(self) -> str | None:
        reply = await self._lf_launch_options()
        projects = reply.data.get("projects") if reply.ok and isinstance(reply.data, dict) else None
        return projects[0]["name"] if projects and len(projects) == 1 else None

    def options_from_form(self, formdata: dict[str, list[str]]) -> dict[str, Any]:
        return options_from_form(formdata)

    @staticmethod
    async def _lf_apply_user_options(spawner: LabfleetSpawnerMixin, user_options: Any) -> None:
        user_options = user_options or {}
        if isinstance(user_options, dict) and not user_options.get("project"):
            # "Start my server" with no options: a user in exactly one project means that one.
            only = await spawner._lf_only_project()
            if only:
                user_options = {**user_options, "project": only}
        try:
            spawner.lf_options = parse_options(user_options)
        except OptionsError as e:
            raise SpawnException(f"Invalid options: {e}", reason="invalid-options", status_code=400) from None

    # ------------------------------------------------------------------ start

    def lf_mps(self, session: dict[str, Any]) -> bool:
        """Whether this placed session's fraction is limited with MPS (its node's, never the Hub host's);
        sets ``lf_mps_pipe_dir`` to the node's daemon's pipe directory (None when it reports none)."""
        use, self.lf_mps_pipe_dir = session_mps(self.mps, session)
        return use

    def lf_mps_withheld(self) -> str | None:
        """Why this backend's sessions may not reach their node's MPS daemon, None when they may.

        A client of the daemon must run as the one non-root uid the node's sessions share: the daemon
        serves one uid at a time, and root could change its limits (:func:`labfleet.spawner.launch.mps_withheld_for`).
        A backend that cannot promise that for a session withholds MPS from it: its fraction holds by
        the framework caps alone, and the session says why."""
        return None

    def lf_build_launch(
        self, session: dict[str, Any], options: SessionOptions, mounts: tuple[Mount, ...]
    ) -> LaunchSpec:
        """The placed session's LaunchSpec, with MPS where its node runs it and the backend may give it."""
        mps = self.lf_mps(session)
        withheld = self.lf_mps_withheld() if mps else None
        launch = build_launch(
            session,
            options,
            mounts=mounts,
            mps=mps,
            mps_withheld=withheld,
            in_container=self.lf_in_container,
        )
        if launch.mps_withheld:
            self.lf_mps_pipe_dir = None
            self.log.warning(  # type: ignore[attr-defined]
                "labfleet: %s gets no MPS on node %s, only the framework caps: %s",
                self._log_name,  # type: ignore[attr-defined]
                launch.node,
                launch.mps_withheld,
            )
        return launch

    @property
    def session_log_path(self) -> Path | None:
        """This session's log file (backends write their output there)."""
        if not self.lf_session_id:
            return None
        return log_file(self.session_log_dir, self.lf_session_id)

    def lf_mounts(self, options: SessionOptions) -> tuple[Mount, ...]:
        """The backend's own mounts for every session (its ``extra_mounts``). The session's virtual
        folders are not among them: the service names those when it places the session."""
        return ()

    def lf_session_home(self) -> str:
        """The session user's home as the session sees it (an absolute path inside the session):
        virtual folders are mounted at ``<home>/vfolders/<name>``."""
        raise NotImplementedError(f"{type(self).__name__} does not say where the session's home is")

    def lf_folders_dir(self) -> str:
        """Where the session's virtual folders are mounted, inside the session: ``<home>/vfolders``,
        or :data:`~labfleet.spawner.homefolders.FOLDERS_ROOT` for a backend whose sessions link
        ``~/vfolders`` there (``lf_session_links_folders``; a sandboxed local session too): a home
        that the user's sessions share then never holds a mount point."""
        if self.lf_session_links_folders:
            return FOLDERS_ROOT
        return f"{self.lf_session_home().rstrip('/')}/{VFOLDERS_DIR}"

    def _lf_other_servers_running(self) -> bool:
        """Whether another server of the user runs (or starts): it may use what is in the home."""
        spawners = getattr(getattr(self, "user", None), "spawners", None)
        if not isinstance(spawners, dict):  # JupyterHub's is a dict of the user's servers by name
            return False
        return any(
            s is not self and s.active and not getattr(s, "_stop_pending", False) for s in spawners.values()
        )

    def lf_session_mounts(self, session: dict[str, Any], options: SessionOptions) -> tuple[Mount, ...]:
        """The backend's mounts, then the virtual folders the service mounts for the placed session."""
        own = self.lf_mounts(options)
        if not session.get("mounts"):
            return own
        try:
            folders = vfolder_mounts(session, self.lf_folders_dir(), taken=[m.target for m in own])
        except ValueError as e:
            # A reply that would mount outside the folders' directory: the service's fault, not the user's.
            raise SpawnException(
                f"labfleet cannot mount the session's virtual folders: {e}",
                reason="labfleet-error",
                status_code=502,
            ) from None
        return own + folders

    def _lf_admission_body(self, options: SessionOptions) -> dict[str, Any]:
        body: dict[str, Any] = {
            "project": options.project,
            "username": self.lf_username,
            "name": self.name,  # type: ignore[attr-defined]
            "type": options.type,
            "slots": options.slots(),
        }
        image = options.image or self.default_image
        if image:
            body["image"] = image
        if options.resource_group:
            body["resource_group"] = options.resource_group
        if options.vfolders:
            # Names or ids; the service checks access and adds the user's automatic (dot) folders.
            body["vfolders"] = list(options.vfolders)
        return body

    async def start(self):
        options = self.lf_options
        if options is None:
            # apply_user_options was replaced by config: check the options here instead.
            await self._lf_apply_user_options(self, self.user_options or {})  # type: ignore[attr-defined]
            options = self.lf_options
        assert options is not None
        self.lf_exit = None
        t0 = time.perf_counter()
        session = await self._lf_admit(options)
        self.lf_session_id = session["id"]
        self.lf_session = session
        try:
            t_admitted = time.perf_counter()
            session = await self._lf_wait_for_placement(session)
            t_placed = time.perf_counter()
            # What admission settled on runs: the default image, or an environment's built image
            # for ``env:<id>``.
            if session.get("image") and session["image"] != options.image:
                options = SessionOptions(**{**options.__dict__, "image": session["image"]})
                self.lf_options = options
            mounts = self.lf_session_mounts(session, options)
            await self._lf_report("PREPARING", "starting the server")
            self.lf_launch = self.lf_build_launch(session, options, mounts)
            if options.type != "interactive":
                self.poll_interval = self.batch_poll_interval  # type: ignore[attr-defined]
            if self.session_log_path is not None:
                self.session_log_path.parent.mkdir(parents=True, exist_ok=True)
            await self.lf_prepare(self.lf_launch)
            t_prepared = time.perf_counter()
            url = await asyncio.wait_for(super().start(), timeout=self.backend_start_timeout)  # type: ignore[misc]
        except asyncio.CancelledError:
            # The Hub interrupts a pending spawn (its server stopped) and gives the cancel one second
            # to resolve before it stops the server; past that, the stop fails and the server stays a
            # "ready" ghost nobody can stop or remove.  So the cancel resolves now, and the release
            # follows on its own.
            self._lf_release_soon("ERROR", "the server did not start: its spawn was stopped")
            raise
        except BaseException as e:  # failed: the allocation goes back at once
            await self._lf_release("ERROR", f"the server did not start: {e}"[:900])
            raise
        t_started = time.perf_counter()
        started = "server started"
        if self.lf_launch is not None and self.lf_launch.mps_withheld:
            started += f"; MPS withheld, framework caps only: {self.lf_launch.mps_withheld}"
        await self._lf_report("RUNNING", started, runtime=self.lf_runtime())
        # What labfleet adds to a spawn (queue wait and the backend's own start excluded);
        # benchmarks/spawn_overhead.py reads this line.
        self.lf_overhead_ms = 1000 * (
            (t_admitted - t0) + (t_prepared - t_placed) + (time.perf_counter() - t_started)
        )
        self.log.info(  # type: ignore[attr-defined]
            "labfleet: %s admitted in %.1f ms, queued %.1f ms; labfleet overhead %.1f ms",
            self._log_name,  # type: ignore[attr-defined]
            1000 * (t_admitted - t0),
            1000 * (t_placed - t_admitted),
            self.lf_overhead_ms,
        )
        return url

    async def _lf_admit(self, options: SessionOptions) -> dict[str, Any]:
        """Ask the service for the session, with an id of the spawner's choosing; ask again with the
        same id while the service does not answer.  The service may have admitted it and died before
        it answered: asked again, it answers with that session instead of admitting a second one."""
        body = {**self._lf_admission_body(options), "id": str(uuid.uuid4())}
        # Until the service says otherwise the session may exist: a stop or a cancel gives it back.
        self.lf_session_id = body["id"]
        deadline = time.monotonic() + self.service_restart_wait
        try:
            while True:
                reply = await self.lf_call("POST", "/sessions", body)
                if reply.code != 0 or time.monotonic() >= deadline:
                    break
                self.log.warning(  # type: ignore[attr-defined]
                    "labfleet: no answer to the admission of %s; asking again with session id %s",
                    self._log_name,  # type: ignore[attr-defined]
                    body["id"],
                )
                await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        except asyncio.CancelledError:
            self._lf_release_soon("ERROR", "the server did not start: its spawn was stopped")
            raise
        if not reply.ok:
            if reply.code != 0:
                self.lf_session_id = None  # refused: nothing is held
            raise _refusal(reply, "labfleet refused the session")
        return reply.data

    async def _lf_wait_for_placement(self, session: dict[str, Any]) -> dict[str, Any]:
        """Wait while the session is queued; the service schedules it (or cancels it)."""
        sid = session["id"]
        while session["status"] == PENDING:
            position = session.get("queue_position")
            self._lf_queue_message = (
                f"Queued in resource group {session.get('resource_group')}"
                + (f" at position {position}" if position else "")
                # Why it waits now (the service reads the nodes), else what admission said.
                + f": {session.get('waiting_for') or session.get('status_reason') or 'waiting for free capacity'}"
            )
            await asyncio.sleep(self.queue_poll_interval)
            reply = await self.lf_call("GET", f"/sessions/{quote(sid, safe='')}")
            if reply.code == 0:
                continue  # the service restarts: keep the place in the queue
            if not reply.ok:
                raise _refusal(reply, "labfleet lost the queued session")
            session = reply.data
        self.lf_session = session
        if session["status"] in FINAL_STATUSES:
            raise SpawnException(
                f"labfleet did not start the session: {session.get('status_reason') or session['status']}",
                reason="labfleet-cancelled",
                status_code=409,
            )
        return session

    async def progress(self):
        """The Hub's progress stream: queue position while PENDING, then the backend's events."""
        last = None
        while self.lf_session is None or self.lf_session.get("status") == PENDING:
            message = self._lf_queue_message or "Asking labfleet for resources"
            if message != last:
                yield {"progress": 10, "message": message}
                last = message
            await asyncio.sleep(0.5)
            if not getattr(self, "_spawn_pending", True):
                return
        session = self.lf_session
        if session.get("status") in FINAL_STATUSES:  # cancelled while queued (pending timeout, stopped)
            yield {
                "progress": 100,
                "failed": True,
                "message": f"labfleet did not start the session: {session.get('status_reason') or session['status']}",
            }
            return
        where = ", ".join(
            f"{d['shares']} of {d['model']} #{d['index']}" for d in (session.get("devices") or [])
        )
        yield {
            "progress": 40,
            "message": f"Placed on {session.get('node')}" + (f": {where}" if where else ""),
        }
        parent = super().progress()  # type: ignore[misc]
        async for event in parent:
            yield event

    # ------------------------------------------------------------------ backends

    async def lf_prepare(self, launch: LaunchSpec) -> None:
        """Apply the launch spec to the backend (limits, devices, mounts) before it starts."""

    def lf_exit_code(self, status: Any) -> int | None:
        """The server's exit code from a poll() status: an int (processes) or "ExitCode=N" (Docker)."""
        if isinstance(status, bool) or status is None:
            return None
        if isinstance(status, int):
            return status
        m = _EXIT.search(str(status))
        return int(m.group(1)) if m else None

    def lf_own_pid_namespace(self) -> bool:
        """Whether the backend runs the session in a PID namespace of its own: the server extension then
        cannot match the GPU driver's pids to the session's processes (see labfleet.session.fleet.gpu_rows)."""
        return self.lf_in_container

    def get_env(self) -> dict[str, str]:
        env = super().get_env()  # type: ignore[misc]
        # What the session's server extension needs to act for its owner (server_ext/ENDPOINTS.md).
        env["LABFLEET_SERVICE_URL"] = self.session_service_url or self.service_url
        try:
            env["LABFLEET_VFOLDER_DIR"] = f"{self.lf_session_home().rstrip('/')}/{VFOLDERS_DIR}"
        except NotImplementedError:
            pass
        if self.lf_session_links_folders:
            # The session links ~/vfolders to its folders' root; an old ~/vfolders is cleared only
            # when no other server of the user runs (it may still use what is there).
            env[FOLDERS_ROOT_ENV] = FOLDERS_ROOT
            env[FOLDERS_TIDY_ENV] = "0" if self._lf_other_servers_running() else "1"
        if self.lf_own_pid_namespace():
            env["LABFLEET_PID_NAMESPACE"] = "own"
        # How often the session reports its activity to the service (which reads the same variable).
        if os.environ.get(ACTIVITY_INTERVAL_ENV):
            env[ACTIVITY_INTERVAL_ENV] = os.environ[ACTIVITY_INTERVAL_ENV]
        if self.lf_launch is not None:
            # PyTorch's allocator setting of the deployment (or the user's) keeps its options under our cap.
            env.update(with_caps(env, self.lf_launch.env))
            if self.lf_launch.mps and self.lf_launch.fractional and self.lf_mps_pipe_dir:
                env[MPS_PIPE_ENV] = self.lf_mps_pipe_dir  # where the node's daemon listens
        return env

    # ------------------------------------------------------------------ stop, poll, release

    def lf_runtime(self) -> dict[str, Any] | None:
        """Where the started server runs on its node, for the service's usage sampler: ``{"pid": N}``
        or ``{"container": ID}``; None when the backend cannot tell (nothing is sampled then)."""
        return None

    async def _lf_report(
        self, status: str, reason: str, exit_code: int | None = None, runtime: dict[str, Any] | None = None
    ) -> HTTPReply | None:
        if not self.lf_session_id:
            return None
        body: dict[str, Any] = {"status": status, "reason": reason}
        if exit_code is not None:
            body["exit_code"] = max(-255, min(255, exit_code))
        if runtime is not None:
            body["runtime"] = runtime
        reply = await self.lf_call("PATCH", f"/sessions/{quote(self.lf_session_id, safe='')}", body)
        if reply.code not in (200, 409):
            self.log.warning(  # type: ignore[attr-defined]
                "labfleet: reporting %s for session %s failed: %s %s",
                status,
                self.lf_session_id,
                reply.code,
                reply.message,
            )
        return reply

    def _lf_release_soon(self, status: str, reason: str) -> None:
        """:meth:`_lf_release` in a task of its own, held until it is done."""
        task = asyncio.ensure_future(self._lf_release(status, reason))
        _RELEASES.add(task)
        task.add_done_callback(_RELEASES.discard)

    async def _lf_release(self, status: str, reason: str) -> None:
        """Give the allocation back (queued sessions are cancelled); safe to call twice."""
        sid = self.lf_session_id
        if not sid:
            return
        reply = await self._lf_report(status, reason, self.lf_exit)
        if reply is not None and reply.code == 409:
            # Not a transition the spawner may make (e.g. still PENDING): ask for a plain stop.
            await self.lf_call("DELETE", f"/sessions/{quote(sid, safe='')}")
        self.lf_session_id = None

    async def poll(self):
        status = await super().poll()  # type: ignore[misc]
        if status is not None and self.lf_session_id:
            code = self.lf_exit_code(status)
            if code is not None:
                self.lf_exit = code
            await self._lf_release(
                "TERMINATED", "the server exited" + (f" with code {code}" if code is not None else "")
            )
        return status

    async def stop(self, now: bool = False):
        if self.lf_session_id and self.lf_exit is None:
            try:
                code = self.lf_exit_code(await super().poll())  # type: ignore[misc]
            except Exception:
                code = None
            self.lf_exit = code
        try:
            await super().stop(now=now)  # type: ignore[misc]
        finally:
            await self._lf_release("TERMINATED", "stopped")
