"""Loading labfleet into a Jupyter server: the ExtensionApp, its handlers, and the end of batch sessions.

The session type comes from the environment the spawner set (``labfleet.session.runner.SessionEnv``):

- ``interactive`` (or none): only the ``labfleet/runner`` endpoint;
- ``batch``: run ``LABFLEET_COMMAND`` once the server is up, then stop the server so that the process exits
  with the command's exit code (the spawner's ``poll()`` reads it and records it on the session);
- ``inference``: the same, with the command serving HTTP on a local port, reached through
  ``<base_url>labfleet/inference/`` with the server's own authentication.

An interactive session also reports its activity to the labfleet service (``labfleet.session.activity``), for
the service's idle checkers.

When it loads, the extension links ``~/vfolders`` to the session's folder root where the spawner says so
(Docker, Swarm: ``labfleet.session.homelink``).
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from jupyter_server.utils import url_path_join
from jupyter_server_proxy.handlers import AddSlashHandler
from traitlets import Bool, Float

from labfleet.core.vocab import SESSION_TYPES

from .activity import ActivityReporter, activity_interval
from .calls import SessionCalls
from .handlers.apps import AppsHandler, link_apps
from .handlers.fleet import FleetContext, fleet_handlers
from .handlers.runner import InferenceProxyHandler, RunnerStateHandler
from .homelink import link_home_folders
from .runner import Runner, SessionEnv


class LabfleetExtension(ExtensionApp):
    """labfleet inside every session (configurable as ``c.LabfleetExtension.<trait>``)."""

    name = "labfleet"

    exit_with_command = Bool(
        True,
        config=True,
        help="""When a batch or inference command ends, stop the server and exit the process with the
        command's exit code. Off only for running the extension inside another process (tests).""",
    )
    hub_wait_timeout = Float(
        60.0,
        config=True,
        help="""Under a Hub, seconds a finished batch or inference session waits for the Hub's first request
        (the Hub seeing the server up) before it exits: a command that ends before the spawn completes must
        not turn into a failed start.""",
    )
    stop_timeout = Float(
        30.0,
        config=True,
        help="""Seconds the server's own cleanup (kernels, terminals, extensions) may take when a batch
        session ends, before the process exits anyway: a hung kernel must not keep a finished batch
        session (and its GPU share) alive.""",
    )

    service_timeout = Float(
        20.0,
        config=True,
        help="""Seconds a call from this session to the labfleet service or the Hub may take before its
        endpoint answers 504.""",
    )

    apps: list = []  # the session's app services (labfleet.session.apps), found when the server links us

    def _link_jupyter_server_extension(self, serverapp: Any) -> None:
        super()._link_jupyter_server_extension(serverapp)
        # Before any extension loads: jupyter-server-proxy reads the image's service ports at its load.
        self.apps = link_apps(serverapp, self.log)

    def initialize_settings(self) -> None:
        try:
            # Before the file browser can ask: ~/vfolders -> the session's folder root (Docker, Swarm).
            link_home_folders()
        except Exception:  # the home's state never keeps the server from starting
            self.log.exception("labfleet: ~/vfolders could not be linked")
        self.session = SessionEnv.from_environ()
        self.calls = SessionCalls.from_environ(timeout=self.service_timeout)
        self.runner: Runner | None = None
        self.activity: ActivityReporter | None = None
        if self.session.type not in SESSION_TYPES:
            self.log.warning(
                "labfleet: unknown LABFLEET_SESSION_TYPE %r: treated as interactive", self.session.type
            )
        elif self.session.type != "interactive":
            assert self.serverapp is not None  # set when the server links the extension
            self.runner = Runner(
                self.session,
                self.serverapp.root_dir,
                url_path=url_path_join(self.serverapp.base_url, "labfleet/inference/"),
                on_exit=self._command_ended,
                log=self.log,
            )
        self.settings["labfleet_runner"] = self.runner
        self.log.info("labfleet: %s session %s", self.session.type, self.session.session_id or "(no id)")

    def initialize_handlers(self) -> None:
        # Patterns are relative: ExtensionApp prefixes the server's base_url.
        self.handlers.append((r"/labfleet/runner", RunnerStateHandler, {"runner": self.runner}))
        self.handlers.append((r"/labfleet/apps", AppsHandler, {"apps": self.apps}))
        context = FleetContext(
            self.session,
            self.calls,
            self.runner,
            mount_dir=self._mount_dir(),
        )
        self.handlers.extend(fleet_handlers(context))
        if self.runner is not None and self.runner.type == "inference":
            self.handlers.extend(
                [
                    # The bare prefix: relative links of the served app only work below a slash.
                    (r"/labfleet/inference", AddSlashHandler),
                    (r"/labfleet/inference(/.*)", InferenceProxyHandler, {"runner": self.runner}),
                ]
            )

    def _mount_dir(self) -> str:
        """Where the session's virtual folders are, relative to the Lab's root (what the file browser
        opens): the spawner mounts them under ``$LABFLEET_VFOLDER_DIR`` (default ``~/vfolders``)."""
        where = os.environ.get("LABFLEET_VFOLDER_DIR") or os.path.join(os.path.expanduser("~"), "vfolders")
        root = os.path.abspath(self.serverapp.root_dir) if self.serverapp is not None else os.getcwd()
        rel = os.path.relpath(os.path.abspath(where), root)
        return "vfolders" if rel.startswith("..") else rel.replace(os.sep, "/")

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        """Called by the server once its event loop runs and it listens: the Lab is reachable before the
        command starts, so a user can watch the log of a batch job from its first line."""
        self._watch_requests(serverapp)
        self._start_activity_reports(serverapp)
        if self.runner is not None and self.runner.state["state"] == "pending":
            await self.runner.start()

    def _start_activity_reports(self, serverapp: Any) -> None:
        """Report this session's activity to the labfleet service, for its idle checkers: interactive
        sessions only (batch and inference sessions end with their command, they are not reclaimed for
        idleness), and only under a labfleet spawner (a session id and the service's URL)."""
        if self.runner is not None:
            return
        for value, name in (
            (self.session.session_id, "LABFLEET_SESSION_ID"),
            (self.calls.service_url, "LABFLEET_SERVICE_URL"),
        ):
            if not value:
                self.log.info("labfleet: no activity reports to the labfleet service (no %s)", name)
                return
        self.activity = ActivityReporter(
            self.calls,
            self.session.session_id,
            last_activity=serverapp.web_app.last_activity,
            kernel_manager=serverapp.kernel_manager,
            interval=activity_interval(log=self.log),
            log=self.log,
        )
        self.activity.start()
        self.log.info(
            "labfleet: reporting activity to the labfleet service every %gs", self.activity.interval
        )

    def _watch_requests(self, serverapp: Any) -> None:
        """Note the first HTTP request answered: under a Hub, that is the Hub seeing the server up."""
        self._served = asyncio.Event()
        settings = serverapp.web_app.settings
        previous = settings.get("log_function")

        def log_function(handler: Any) -> None:
            self._served.set()
            if previous is not None:
                previous(handler)

        settings["log_function"] = log_function

    async def stop_extension(self) -> None:
        """The server is stopping (the Hub stopped the session, or the command ended): the command and
        everything it started must not outlive the session and hold its GPU share."""
        # The command ends below because of this stop: that end must not start a second stop.
        self._server_stopping = True
        if self.activity is not None:
            await self.activity.stop()
        if self.runner is not None:
            await self.runner.stop()

    # -- the end of a batch or inference session ------------------------------------------------------

    _server_stopping = False
    _exit_task: asyncio.Future[None] | None = None

    def _command_ended(self, exit_code: int) -> None:
        if self._server_stopping:
            # Stopped from outside (the Hub, SIGTERM): the server exits as Jupyter does, with status 0.
            return
        if not self.exit_with_command:
            self.log.info("labfleet: command ended with code %s; server keeps running", exit_code)
            return
        # A task of its own: on_exit is called from the runner's watcher, which the cleanup waits for.
        self._exit_task = asyncio.ensure_future(self._stop_server(exit_code))

    async def _stop_server(self, exit_code: int) -> None:
        # A short linger, so a Lab that is open shows the end of the log and the final state.
        await asyncio.sleep(self.session.linger)
        served = getattr(self, "_served", None)
        if served is not None and os.environ.get("JUPYTERHUB_API_URL"):
            # A command quicker than the spawn: exiting before the Hub has seen the server answer once
            # would make the Hub count a finished batch as a failed start.
            try:
                await asyncio.wait_for(served.wait(), self.hub_wait_timeout)
            except asyncio.TimeoutError:
                pass
        self.log.info(
            "labfleet: %s command ended with code %s: stopping the server", self.session.type, exit_code
        )
        await stop_server_and_exit(self.serverapp, exit_code, self.stop_timeout)


async def stop_server_and_exit(serverapp: Any, exit_code: int, timeout: float = 30.0) -> None:
    """Stop the Jupyter server the way ``ServerApp.stop()`` does (SIGTERM's path), then end the process with
    ``exit_code``.

    ``ServerApp.stop()`` ends by stopping the event loop, after which ``launch_instance()`` returns and the
    process exits 0: no hook in between could pass a code on. So this runs the same cleanup itself and then
    raises ``SystemExit(exit_code)`` inside the loop. asyncio re-raises SystemExit out of ``run_forever()``;
    it passes through ``ServerApp.start()`` and ``launch_instance()`` (``jupyter server`` and
    ``jupyterhub-singleuser`` alike) and the interpreter exits with that status after its normal shutdown
    (atexit handlers, flushed output).
    """
    # What ServerApp.stop() does before scheduling its cleanup: refuse new connections, say we are stopping.
    serverapp._stopping = True
    http_server = getattr(serverapp, "http_server", None)
    if http_server is not None:
        http_server.stop()
    cleanup = getattr(serverapp, "_cleanup", None)
    try:
        if cleanup is not None:
            # The exact cleanup ServerApp._stop() runs: server info file, extensions, kernels, websockets.
            await asyncio.wait_for(cleanup(), timeout)
        else:  # a future ServerApp without it: the public pieces
            await asyncio.wait_for(serverapp.cleanup_extensions(), timeout)
            await asyncio.wait_for(serverapp.cleanup_kernels(), timeout)
    except asyncio.TimeoutError:
        serverapp.log.warning("labfleet: server cleanup took more than %ss; exiting anyway", timeout)
    except Exception:
        serverapp.log.exception("labfleet: server cleanup failed; exiting anyway")
    serverapp.log.info("labfleet: exiting with code %s", exit_code)
    sys.exit(exit_code)
