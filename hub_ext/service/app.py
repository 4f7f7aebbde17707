"""The labfleet service: a Hub-managed tornado application at ``/services/labfleet/``.

It is the single writer of labfleet state.  The Hub starts it from
``jupyterhub_config.py`` (see ``labfleet.hub.configure``) with the usual service
environment (``JUPYTERHUB_API_TOKEN``, ``JUPYTERHUB_SERVICE_URL``, ...).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import re
import secrets
import signal
import socket
import sys
from copy import deepcopy
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler
from sqlalchemy import select
from tornado import web
from traitlets import Bool, Dict, Float, Integer, List, TraitError, Unicode, default, validate
from traitlets.config import Application, catch_config_error

from labfleet.compute import agents, images, nodes, recipes, reconcile, sessions
from labfleet.compute.buildcharge import MIN_BUILD_MEM
from labfleet.compute.devices import DevicePlugin, describe_node, get_plugin
from labfleet.compute.devices.mps import (
    CONTROL_BINARY,
    DEFAULT_LOG_DIR,
    DEFAULT_PIPE_DIR,
    MPS_MODES,
    MpsStatus,
    MpsSupervisor,
    check_mode,
    node_mps,
    nvidia_devices,
)
from labfleet.compute.envqueue import Builds
from labfleet.compute.scheduler.admission import QueueLimits
from labfleet.core import bootstrap, database, hubmap
from labfleet.core.authz import Actor
from labfleet.core.dburl import default_db_url
from labfleet.core.display import fmt_bytes
from labfleet.core.envtraits import EnvError, document_env, load_env_fallbacks
from labfleet.core.errors import LabfleetError
from labfleet.core.models import Node, User
from labfleet.core.secretbox import SecretBox
from labfleet.core.sessionlogs import SessionLogs
from labfleet.core.signing import NonceCache, RateLimiter
from labfleet.reclaim import reclaimer
from labfleet.service import hubsync, jobs
from labfleet.service.base import NotFoundHandler, PathOnlyLogs, ServiceHubAuth
from labfleet.service.handlers import routes
from labfleet.service.hubsync import HubSync
from labfleet.service.launches import Launches
from labfleet.serving.controller import ServingController
from labfleet.storage import hosts
from labfleet.storage.hosts import RIGHTS
from labfleet.storage.imports import Imports
from labfleet.storage.importsafety import ALLOWED_HOSTS_ENV, parse_allowed
from labfleet.storage.rescans import FolderUsage
from labfleet.usage import enforce, overuse, records
from labfleet.usage.metrics import Metrics
from labfleet.usage.sampler import Reading, Sampler, sample_interval


class OAuthCallbackHandler(PathOnlyLogs, ServiceHubAuth, HubOAuthCallbackHandler):
    """The Hub's OAuth callback; its query string (code, state) never reaches the log."""


class JSONDict(Dict):
    """A dict option that takes JSON on the command line (``--LabfleetService.storage_hosts={...}``,
    once per item of a list)."""

    def from_string(self, s: str):
        try:
            value = json.loads(s)
        except ValueError as e:
            raise TraitError(f"{self.name}: not JSON: {e}") from None
        if not isinstance(value, dict):
            raise TraitError(f"{self.name}: expected a JSON object, not {s[:40]!r}")
        return value


def _checked_option(check, value):
    """``value`` once ``check`` (a labfleet input check) passed it; its refusal as a TraitError."""
    try:
        check(value)
    except LabfleetError as e:
        raise TraitError(e.message) from None
    return value


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def exit_with_parent_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent dies (prctl PR_SET_PDEATHSIG).

    True if set; False elsewhere or if the call failed (the parent watch job still notices)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


@document_env
class LabfleetService(SessionLogs, Application):
    name = "labfleet-service"
    description = "The labfleet service: tenancy, policies, keypairs and audit behind a REST API."

    db_url = Unicode(help="SQLAlchemy URL of labfleet's DB (default: labfleet.sqlite here).").tag(
        config=True, env="LABFLEET_DB_URL"
    )

    @default("db_url")
    def _db_url(self):
        return default_db_url()

    prefix = Unicode("/services/labfleet/", help="URL prefix the Hub's proxy routes to this service.").tag(
        config=True, env="JUPYTERHUB_SERVICE_PREFIX"
    )

    service_url = Unicode(
        "http://127.0.0.1:10101", help="Where this service listens (the Hub's service 'url')."
    ).tag(config=True, env="JUPYTERHUB_SERVICE_URL")

    hub_api_url = Unicode("", help="The Hub's REST API, for group sync.").tag(
        config=True, env="JUPYTERHUB_API_URL"
    )

    service_token = Unicode(
        "", help="This service's own Hub API token; the Hub's authenticator uses it to call the service."
    ).tag(config=True, env="JUPYTERHUB_API_TOKEN")

    node_name = Unicode(help="This node's name in the fleet (default: the host name).").tag(
        config=True, env="LABFLEET_NODE_NAME"
    )

    @default("node_name")
    def _node_name(self):
        return socket.gethostname()

    device_plugins = List(
        Unicode(),
        ["nvidia"],
        help="Device plugins that describe this node's accelerators (comma-separated in the environment); "
        "'mock' declares fake devices for machines without a GPU.",
    ).tag(config=True, env="LABFLEET_DEVICE_PLUGINS")

    mock_devices = List(
        JSONDict(),
        help='Devices of the mock plugin, e.g. [{"model": "A100-80GB", "memory": "80g", "count": 2}] '
        "(JSON in the environment).",
    ).tag(config=True, env="LABFLEET_MOCK_DEVICES")

    mps = Unicode(
        "auto",
        help=f"""Whether this node runs its own NVIDIA MPS daemon, which limits the sessions that hold a
        fraction of a GPU: {" | ".join(MPS_MODES)}. auto: where the nvidia plugin finds GPUs MPS can
        share (not MIG instances) and nvidia-cuda-mps-control is on PATH; on: required (the node shows
        failed, with the reason, when it cannot run); off: never.""",
    ).tag(config=True, env="LABFLEET_MPS")

    @validate("mps")
    def _check_mps(self, proposal):
        try:
            return check_mode(proposal["value"])
        except ValueError as e:
            raise TraitError(str(e)) from None

    mps_binary = Unicode(
        CONTROL_BINARY, help="The MPS control binary: a name looked up on PATH, or a path."
    ).tag(config=True)

    mps_pipe_dir = Unicode(
        DEFAULT_PIPE_DIR,
        help="""This node's MPS daemon's own pipe directory (its $CUDA_MPS_PIPE_DIRECTORY, given to the
        sessions placed here).""",
    ).tag(config=True, env="LABFLEET_MPS_PIPE_DIR")

    mps_log_dir = Unicode(
        DEFAULT_LOG_DIR,
        help="""This node's MPS daemon's own log directory (its $CUDA_MPS_LOG_DIRECTORY).""",
    ).tag(config=True, env="LABFLEET_MPS_LOG_DIR")

    mps_check_interval = Float(
        10.0, help="Seconds between checks of this node's MPS daemon (a dead one restarts with backoff)."
    ).tag(config=True)

    default_images = List(
        JSONDict(),
        help="""Images registered at start when missing, as POST /api/images bodies (with "inspect": true
        their labels are read from Docker); JSON in the environment.""",
    ).tag(config=True, env="LABFLEET_DEFAULT_IMAGES")

    storage_hosts = List(
        JSONDict(),
        help="""Storage hosts added at start when missing, as POST /api/storage-hosts bodies ({"name",
        "path", "default_permissions", "owner_uid", ...}; JSON in the environment). Default: one host
        "local" at ./vfolders whose rights everyone has. Change existing ones through
        /api/storage-hosts.""",
    ).tag(config=True, env="LABFLEET_STORAGE_HOSTS")

    @default("storage_hosts")
    def _storage_hosts(self):
        return [{"name": "local", "path": str(Path.cwd() / "vfolders"), "default_permissions": list(RIGHTS)}]

    vfolder_default_host = Unicode(
        help="The storage host of a folder created without one (default: the first of storage_hosts).",
    ).tag(config=True)

    @default("vfolder_default_host")
    def _vfolder_default_host(self):
        return self.storage_hosts[0]["name"] if self.storage_hosts else ""

    import_allowed_hosts = Unicode(
        "",
        help="""Hosts an import (Import & Run) may fetch from although they are not on the public
        internet: host names, addresses or networks (CIDR), comma-separated. Everything that resolves
        to loopback, link-local or a private network is refused otherwise.""",
    ).tag(config=True, env=ALLOWED_HOSTS_ENV)

    @validate("import_allowed_hosts")
    def _check_import_allowed_hosts(self, proposal):
        return _checked_option(parse_allowed, proposal["value"])

    import_timeout = Integer(
        600,
        help="Seconds an import's fetch (a clone, a download) may take before it is stopped.",
    ).tag(config=True, env="LABFLEET_IMPORT_TIMEOUT")

    environment_index_url = Unicode(
        "",
        help="""The package index that environment builds ("My Environments") install requirements.txt
        from, as pip's --index-url (a site's mirror, e.g. http://pypi.example.org/simple/). Empty: pip's
        default, the public index. It shows in the images' history: give one without credentials.""",
    ).tag(config=True, env="LABFLEET_ENVIRONMENT_INDEX_URL")

    @validate("environment_index_url")
    def _check_environment_index_url(self, proposal):
        return _checked_option(recipes.check_index_url, proposal["value"]) if proposal["value"] else ""

    environment_build_network = Unicode(
        hubmap.DEFAULT_DOCKER_NETWORK,
        help="""The Docker network that environment builds' containers join (a recipe's postBuild is
        the user's code). Default: the Docker sessions' network (`labfleet-sessions`, or
        $LABFLEET_DOCKER_NETWORK, the spawner's), guarded by the spawner so that a build reaches what
        a session reaches: the package index and the internet, not the host's ports. It must exist: a
        build into a network that does not fails, saying so (the Docker spawner makes it at its first
        session). `none`: no network (recipes that fetch nothing). `host` is refused: the host's
        loopback would be open to every recipe.""",
    ).tag(config=True, env=("LABFLEET_ENVIRONMENT_BUILD_NETWORK", hubmap.DOCKER_NETWORK_ENV))

    @validate("environment_build_network")
    def _check_environment_build_network(self, proposal):
        if proposal["value"] == "host" or not proposal["value"]:
            raise TraitError(
                "environment_build_network must name a Docker network other than host (the host's "
                "network would open its loopback to every recipe's postBuild)"
            )
        return proposal["value"]

    environment_registry = Unicode(
        "",
        help="""The fleet's image registry (`host:port`, e.g. `10.0.0.1:5000`): each environment's image
        is pushed there once built, and sessions run it by that name, so that every node pulls it
        (a Swarm node runs what another built). Every node's Docker engine must trust it (HTTPS with a
        CA in /etc/docker/certs.d/HOST:PORT/, as scripts/registry.sh sets up). Empty: images stay on
        the engine that built them (one node).""",
    ).tag(config=True, env="LABFLEET_ENVIRONMENT_REGISTRY")

    @validate("environment_registry")
    def _check_environment_registry(self, proposal):
        value = proposal["value"].strip().rstrip("/")
        if value and not re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?|\[[0-9A-Fa-f:]+\](:[0-9]{1,5})?", value):
            raise TraitError(f"environment_registry must be host or host:port, not {proposal['value']!r}")
        return value

    environment_build_timeout = Integer(
        1800,
        help="Seconds an environment's build may take before it is stopped (the environment FAILED).",
    ).tag(config=True, env="LABFLEET_ENVIRONMENT_BUILD_TIMEOUT")

    environment_builds_max = Integer(
        2,
        help="""Environment builds this service runs at once on its node's Docker engine; each user has
        one at a time. The others wait, QUEUED, oldest first.""",
    ).tag(config=True, env="LABFLEET_ENVIRONMENT_BUILDS_MAX")

    environment_build_cpu = Float(
        2.0, help="Cores the containers of one environment build may use (a CPU quota)."
    ).tag(config=True)

    environment_build_mem = Integer(
        4 * 2**30, help="Bytes of memory the containers of one environment build may use (no swap beyond)."
    ).tag(config=True)

    @validate("environment_build_timeout", "environment_builds_max", "environment_build_cpu")
    def _check_positive(self, proposal):
        if not proposal["value"] > 0:
            raise TraitError(f"{proposal['trait'].name} must be more than 0, not {proposal['value']}")
        return proposal["value"]

    @validate("environment_build_mem")
    def _check_build_mem(self, proposal):
        if proposal["value"] < MIN_BUILD_MEM:
            raise TraitError(
                f"environment_build_mem must be {fmt_bytes(MIN_BUILD_MEM)} ({MIN_BUILD_MEM}) or more, "
                f"not {proposal['value']}"
            )
        return proposal["value"]

    vfolder_scan_interval = Integer(
        300,
        help="""Seconds between scans of every folder's size (what sessions write is counted then;
        changes through the API are counted at once). 0 turns the periodic scan off.""",
    ).tag(config=True, env="LABFLEET_VFOLDER_SCAN_INTERVAL")

    max_queued_sessions = Integer(
        hubmap.DEFAULT_MAX_QUEUED_SESSIONS,
        help="""The most sessions the whole fleet keeps waiting for capacity (PENDING) at once; past it a
        session that does not fit now is refused (409, "queue-full"), one that fits still starts. Each
        queued session is a spawn the Hub has pending: labfleet.hub.configure raises the Hub's
        concurrent_spawn_limit by this (set in the service_config you give it), so a full queue never
        locks out sessions that start at once. 0: no limit (and the Hub's own limit decides).""",
    ).tag(config=True)

    max_pending_per_user = Integer(
        hubmap.DEFAULT_MAX_PENDING_PER_USER,
        help="""The most sessions one user keeps waiting for capacity (PENDING), whatever their keypair
        policies allow: one user alone cannot fill the fleet's queue. 0: no limit but their policies'.""",
    ).tag(config=True)

    schedule_interval = Float(
        5.0,
        help="""Seconds between two services of every resource group's queue: a pending timeout fires within
        this, and a session queued for capacity that came from outside a request (a node registered, a
        limit raised with the CLI) starts within this. Every committed write of the API serves the queues
        at once too.""",
    ).tag(config=True, env="LABFLEET_SCHEDULE_INTERVAL")

    idle_check_interval = Float(
        30.0,
        help="""Seconds between two runs of the idle reclamation engine, which also stops sessions past
        their keypair policy's max_session_lifetime (the Hub is asked to stop them). 0 turns it off.
        ($LABFLEET_LIFETIME_CHECK_INTERVAL is the former name of its variable.)""",
    ).tag(config=True, env=("LABFLEET_IDLE_CHECK_INTERVAL", "LABFLEET_LIFETIME_CHECK_INTERVAL"))

    idle_timeout = Float(
        0.0,
        help="""Seconds without activity after which a session is reclaimed, for keypair policies whose
        idle_timeout is negative (the global default). 0: never.""",
    ).tag(config=True, env="LABFLEET_IDLE_TIMEOUT")

    activity_interval = Float(
        60.0,
        help="""Seconds between two activity reports of a session's server extension (it reads
        $LABFLEET_ACTIVITY_INTERVAL too); a report three intervals old no longer keeps a busy kernel's
        session alive.""",
    ).tag(config=True, env="LABFLEET_ACTIVITY_INTERVAL")

    reconcile_interval = Float(
        30.0,
        help="""Seconds between two reconciliations of the sessions with the Hub's servers (also done at
        start): statuses follow what the Hub reports (a ready server's session is RUNNING even if the
        spawner's report was lost), and slots held with no Hub server go back after
        `reconcile_grace`. 0: only at start.""",
    ).tag(config=True, env="LABFLEET_RECONCILE_INTERVAL")

    reconcile_grace = Float(
        reconcile.RECONCILE_GRACE,
        help="""Seconds since a session's last status change before reconciling gives back the slots
        of a session whose Hub server does not exist (its spawner may be about to start or stop it).""",
    ).tag(config=True, env="LABFLEET_RECONCILE_GRACE")

    exit_with_parent = Bool(
        help="""Stop when the process that started this service (the Hub) is gone: a parent-death signal
        (SIGTERM, on Linux) and a check of the parent every `parent_check_interval` seconds. A
        killed Hub's service then frees its port for the next Hub's. Default: on when the Hub
        started it ($JUPYTERHUB_SERVICE_NAME is set).""",
    ).tag(config=True)

    @default("exit_with_parent")
    def _exit_with_parent(self):
        return bool(os.environ.get("JUPYTERHUB_SERVICE_NAME"))

    parent_check_interval = Float(1.0, help="Seconds between two checks that the parent is alive.").tag(
        config=True
    )

    api_session_wait = Float(
        10.0,
        help="""Seconds POST /api/sessions (from anyone but the Hub) waits for the Hub's spawner to admit the
        session whose server it asked the Hub to start; after that it answers 202 without the session.""",
    ).tag(config=True)

    vfolder_trash_retention = Integer(
        30 * 24 * 3600,
        help="Seconds a file stays in a folder's trash before the periodic scan purges it; 0 keeps it.",
    ).tag(config=True)
    vfolder_upload_expiry = Integer(
        24 * 3600,
        help="Seconds an unfinished resumable upload may stay idle before it is cancelled and its room freed.",
    ).tag(config=True)

    metrics_token = Unicode(
        "",
        help="""A token a Prometheus server presents as `Authorization: Bearer <token>` to read
        /services/labfleet/metrics (monitors and superadmins read it with their Hub token or login too).
        Empty: no such token. Keep it secret: it is compared in constant time and never logged.""",
    ).tag(config=True, env="LABFLEET_METRICS_TOKEN")

    sample_interval = Float(
        help="""Seconds between two usage samples of the sessions on this node (CPU, memory, GPU, read
        from outside the sessions) and two accruals of the usage records; 0 turns both off.""",
    ).tag(config=True, env="LABFLEET_SAMPLE_INTERVAL")

    @default("sample_interval")
    def _sample_interval(self):
        return sample_interval()

    usage_retention_days = Integer(
        records.DEFAULT_RETENTION_DAYS,
        help="""Days the usage records (15-minute buckets) are kept.""",
    ).tag(config=True, env="LABFLEET_USAGE_RETENTION_DAYS")

    @validate("usage_retention_days")
    def _check_retention(self, proposal):
        if proposal["value"] < 1:
            raise TraitError(f"usage_retention_days must be 1 or more, not {proposal['value']}")
        return proposal["value"]

    agent_heartbeat = Float(
        agents.DEFAULT_HEARTBEAT,
        help="""Seconds between two heartbeats of a node agent (`labfleet agent`: it takes this from the
        service's answers).""",
    ).tag(config=True, env="LABFLEET_AGENT_HEARTBEAT")

    node_lost_after = Integer(
        agents.DEFAULT_LOST_AFTER,
        help="""Missed heartbeats after which an agent's node is LOST: its sessions end in ERROR ("node
        lost"), their slots go back and the Hub stops their servers. The node the service registers
        itself has no agent and is never LOST.""",
    ).tag(config=True, env="LABFLEET_NODE_LOST_AFTER")

    @validate("agent_heartbeat", "node_lost_after")
    def _check_heartbeat(self, proposal):
        if not proposal["value"] > 0:
            raise TraitError(f"{proposal['trait'].name} must be more than 0, not {proposal['value']}")
        return proposal["value"]

    register_local_node = Bool(
        True, help="Register this machine as a node of the 'default' resource group."
    ).tag(config=True)
    upgrade_db = Bool(True, help="Create or upgrade the DB schema at start.").tag(config=True)
    sync_groups_on_start = Bool(True, help="Push every user's labfleet groups to the Hub at start.").tag(
        config=True
    )
    token_cache_age = Integer(
        5,
        help="""Seconds the service keeps what the Hub said of a token (whose it is, its scopes) before it
        asks again. A token revoked at the Hub, or one whose user was deleted, is refused at most this
        long after; each token costs the Hub one lookup per this many seconds while it is used.""",
    ).tag(config=True)

    @default("log_level")
    def _log_level(self):
        return logging.INFO

    config_file = Unicode(
        "labfleet_service_config.py",
        help="""The config file to load: Python, with ``c.LabfleetService.<option> = value`` lines, like
        jupyterhub_config.py. A relative path is looked up in the working directory (the Hub starts
        the service in its own). A missing file is fine; options on the command line win over it.""",
    ).tag(config=True)

    aliases = {
        "db-url": "LabfleetService.db_url",
        "log-level": "Application.log_level",
        "config": "LabfleetService.config_file",
    }

    @catch_config_error
    def initialize(self, argv=None) -> None:
        self.parent_pid = os.getppid()  # first: the parent may die while this starts
        self.plugins: list[DevicePlugin] = []  # this node's device plugins (register_node)
        self.mps_status = MpsStatus("off", "this node is not registered")  # its MPS daemon (register_node)
        self.mps_supervisor: MpsSupervisor | None = None
        self.sampler: Sampler | None = None  # made on the first usage tick
        self.gpu_watch = overuse.Watch()  # sessions over their GPU share, between usage ticks
        # Kills on agents' nodes until their agents report them; in memory only: lost on a restart,
        # which is acceptable (the next ticks judge those sessions again).
        self.agent_kills = overuse.AgentKills()
        self.started_at = datetime.now(timezone.utc)  # heartbeats missed before it do not count
        self.agent_readings: dict[str, Reading] = {}  # node agents' latest, until the next usage tick
        self.parse_command_line(argv)  # --help-all and the like print and exit here
        cli_config = deepcopy(self.config)
        path = Path(self.config_file)
        self.load_config_file(path.name, path=str(path.parent.absolute()))
        self.update_config(cli_config)  # the command line wins over the file
        try:  # then the environment, for what neither set
            load_env_fallbacks(self, self.config.get(type(self).__name__, {}))
        except EnvError as e:
            self.log.critical("%s", e)
            self.exit(2)
        if self.exit_with_parent:
            if not exit_with_parent_signal():
                self.log.info("No parent-death signal here: the parent is checked on a clock only")
            if jobs.parent_changed(self.parent_pid):
                self.log.warning("The process that started this service is gone: not starting")
                self.exit(1)
        opened = bootstrap.open_database(self.db_url, upgrade=self.upgrade_db)
        self.engine, self.session_factory = opened.engine, opened.session_factory
        self.log.info("Database %s", opened.state)
        if self.register_local_node:
            self.register_node()
        self.ensure_images()
        with database.session_scope(self.session_factory) as db:
            for h in self.storage_hosts:
                hosts.ensure_host(db, h)
        self.secretbox = SecretBox()
        self.limiter = RateLimiter()
        self.nonces = NonceCache()  # signed requests' nonces, for the signature window
        self.hub_sync = HubSync(self.hub_api_url, self.service_token, self.session_factory, self.log)
        self.hub_auth = HubOAuth(api_token=self.service_token, cache_max_age=self.token_cache_age)
        self.orphan_servers = reconcile.OrphanWatch()  # Hub servers running no live session
        self.queue_limits = QueueLimits(fleet=self.max_queued_sessions, per_user=self.max_pending_per_user)
        self.jobs = jobs.JobLoop(self.log)
        self.launches = Launches()
        self.metrics = Metrics(self.session_factory)
        self._background: set[asyncio.Future] = set()
        self.folder_usage = FolderUsage(
            self.session_factory,
            self.log,
            trash_retention=self.vfolder_trash_retention,
            upload_expiry=self.vfolder_upload_expiry,
        )
        self.imports = Imports(
            self.session_factory,
            self.log,
            box=self.secretbox,
            allowed=lambda: parse_allowed(self.import_allowed_hosts),
            default_host=lambda: self.vfolder_default_host or None,
            rescan=self.folder_usage.rescan,
            timeout=self.import_timeout,
        )
        self.environment_builds = Builds(
            self.session_factory,
            self.log,
            log_dir=self.session_log_dir,
            node=self.node_name,
            index_url=self.environment_index_url or None,
            network=self.environment_build_network,
            registry=self.environment_registry or None,
            timeout=self.environment_build_timeout,
            max_running=self.environment_builds_max,
            cpu_limit=self.environment_build_cpu,
            mem_limit=self.environment_build_mem,
        )

    def register_node(self) -> None:
        self.plugins = plugins = [
            get_plugin(name, devices=self.mock_devices, node=self.node_name)
            if name == "mock"
            else get_plugin(name)
            for name in self.device_plugins
        ]
        info = describe_node(self.node_name, plugins)
        if self.mps_supervisor is None:
            self.mps_status, self.mps_supervisor = node_mps(
                self.mps,
                nvidia_devices(info),
                binary=self.mps_binary,
                pipe_dir=self.mps_pipe_dir,
                log_dir=self.mps_log_dir,
            )
        with database.session_scope(self.session_factory) as db:
            nodes.set_mps(db, nodes.register_node(db, info), self.mps_status)
        self.log.info(
            "Node %s: MPS %s%s",
            info.name,
            self.mps_status.state,
            f" ({self.mps_status.reason})" if self.mps_status.reason else "",
        )
        self.log.info(
            "Node %s: %s cores, %s bytes of memory, %d device(s)%s",
            info.name,
            info.cpu,
            info.mem,
            len(info.devices),
            f" ({info.reason})" if info.reason else "",
        )

    async def check_mps(self) -> str:
        """Restart this node's MPS daemon if it died (with backoff) and store its state."""
        assert self.mps_supervisor is not None
        status = await asyncio.to_thread(self.mps_supervisor.check)
        if status != self.mps_status:
            self.mps_status = status
            with database.session_scope(self.session_factory) as db:
                node = db.scalar(select(Node).where(Node.name == self.node_name))
                if node is not None:
                    nodes.set_mps(db, node, status)
        return status.state

    def ensure_images(self) -> None:
        for body in self.default_images:
            with database.session_scope(self.session_factory) as db:
                if images.find(db, body.get("name")) is not None:
                    continue
            labels = None
            try:
                if body.get("inspect"):
                    labels = images.docker_labels(body["name"])
                with database.session_scope(self.session_factory) as db:
                    images.register(db, Actor.cli(), body, labels)
                self.log.info("Registered image %s", body["name"])
            except LabfleetError as e:
                self.log.warning("Could not register image %s: %s", body.get("name"), e.message)

    async def reconcile_with_hub(self) -> list[reconcile.Fix] | None:
        """Make sessions agree with the Hub's servers (see ``jobs.reconcile_sessions``)."""
        return await jobs.reconcile_sessions(
            self.session_factory,
            self.hub_sync,
            self.log,
            self.reconcile_grace,
            observe_waits=self.metrics.observe_queue_waits,
            stop_orphans=(self.hub_sync.stop_server, self.orphan_servers),
        )

    async def watch_parent(self) -> None:
        if jobs.parent_changed(self.parent_pid):
            self.log.warning("The Hub (pid %d) that started this service is gone: stopping", self.parent_pid)
            self.stopping.set()

    async def after_commit(self, db: Any, *, write: bool) -> None:
        """The service's hooks after each committed unit of work of its API, in this order: the
        queue waits the unit recorded go to the metrics; a write serves the queues (it may have made
        room: a limit raised, a node, a release); the Hub learns what the unit recorded for it
        (groups follow tenancy: :func:`labfleet.service.hubsync.after_commit`), which never fails
        the request."""
        self.metrics.observe_queue_waits(sessions.take_queue_waits(db))
        if write:
            self.jobs.poke("schedule")
        plan = hubsync.take_plan(db)
        if plan is not None:
            await self.hub_sync.apply(plan)

    async def start_api_session(self, actor: Actor, body: Any) -> tuple[int, dict[str, Any]]:
        """POST /api/sessions from anyone but the Hub (see :meth:`Launches.start`)."""
        return await self.launches.start(
            actor, body, self.session_factory, self.hub_sync, self.api_session_wait
        )

    async def account_usage(self) -> records.Accrued:
        """Sample this node's sessions (in a worker thread) and accrue every session's usage, with
        what the node agents measured on theirs."""
        if self.sampler is None:
            self.sampler = Sampler(self.plugins)
        taken, self.agent_readings = list(self.agent_readings.values()), {}
        return await jobs.account_usage(
            self.session_factory,
            self.sampler,
            self.node_name,
            self.log,
            max_gap=2 * self.sample_interval,
            retention_days=self.usage_retention_days,
            agent_readings=taken,
            enforce=self.enforce_gpu_shares,
        )

    async def enforce_gpu_shares(self, readings: list[Reading]) -> list[tuple[str, str]]:
        """Act on the sessions over their share of a device's memory (labfleet.usage.enforce)."""
        return await enforce.enforce(
            self.session_factory,
            readings,
            self.gpu_watch,
            node_name=self.node_name,
            stop_server=self.hub_sync.stop_server if self.hub_sync.enabled else None,
            log=self.log,
            observe=self.metrics.observe_gpu_overuse,
            agent_kills=self.agent_kills,
        )

    def agent_readings_in(self, readings: list[Reading]) -> None:
        """Keep a node agent's readings (checked, of its own node's sessions) for the next usage tick."""
        if self.sample_interval > 0:
            for r in readings:
                self.agent_readings[r.session_id] = r

    async def watch_nodes(self) -> dict[str, list]:
        """This node's own heartbeat (when the service registered it), then mark LOST the agent
        nodes that stopped heartbeating (see ``jobs.watch_nodes``)."""
        if self.register_local_node:
            with database.session_scope(self.session_factory) as db:
                nodes.mark_seen(db, self.node_name)
        return await jobs.watch_nodes(
            self.session_factory,
            self.hub_sync.stop_server if self.hub_sync.enabled else None,
            self.log,
            heartbeat=self.agent_heartbeat,
            lost_after=self.node_lost_after,
            since=self.started_at,
            observe_waits=self.metrics.observe_queue_waits,
        )

    async def serve_queues(self) -> list[str]:
        return jobs.serve_queues(self.session_factory, self.log, self.metrics.observe_queue_waits)

    @property
    def idle_settings(self) -> reclaimer.Settings:
        return reclaimer.Settings(
            default_idle_timeout=self.idle_timeout,
            interval=self.idle_check_interval or 30.0,
            report_interval=self.activity_interval,
        )

    async def reclaim_idle(self) -> list[reclaimer.Decision]:
        """Reclaim idle sessions and those past their max lifetime (see ``labfleet.reclaim.reclaimer``)."""
        return await reclaimer.reclaim(
            self.session_factory,
            self.hub_sync.stop_server,
            self.idle_settings,
            self.log,
            self.metrics.observe_reclaimed,
            server_state=self.hub_sync.server_state,
        )

    def make_app(self) -> web.Application:
        prefix = self.prefix if self.prefix.endswith("/") else self.prefix + "/"
        self.prefix = prefix
        handlers = routes(prefix) + [(prefix + "oauth_callback", OAuthCallbackHandler)]
        return web.Application(
            handlers,
            labfleet=self,
            hub_auth=self.hub_auth,
            cookie_secret=secrets.token_bytes(32),
            login_url=self.hub_auth.login_url,
            template_path=str(Path(__file__).with_name("templates")),
            default_handler_class=NotFoundHandler,
            log_function=self._log_request,
        )

    def _log_request(self, handler) -> None:
        # Never log query strings or headers: they may carry tokens.
        status = handler.get_status()
        log = self.log.info if status < 400 else self.log.warning
        log(
            "%s %s %s %.1fms",
            status,
            handler.request.method,
            handler.request.path,
            1000 * handler.request.request_time(),
        )

    async def start_async(self) -> None:
        url = urlparse(self.service_url)
        app = self.make_app()
        server = app.listen(url.port or 80, address=url.hostname or "127.0.0.1", xheaders=True)
        self.log.info("labfleet service listening on %s%s", self.service_url, self.prefix)
        if self.sync_groups_on_start and self.hub_sync.enabled:
            with database.session_scope(self.session_factory) as db:
                names = list(db.scalars(select(User.username)))
            sync = asyncio.ensure_future(self.hub_sync.sync_all(names))
            self._background.add(sync)
            sync.add_done_callback(self._background.discard)
        self.stopping = asyncio.Event()
        if self.exit_with_parent:
            self.jobs.add("parent", self.parent_check_interval, self.watch_parent, first_in=0)
        if self.hub_sync.enabled:
            # At start (after a restart of the Hub or of this service), then on a clock.
            self.jobs.add("reconcile", max(self.reconcile_interval, 0), self.reconcile_with_hub, first_in=0)
        self.jobs.add("schedule", self.schedule_interval, self.serve_queues)
        self.serving = ServingController.attach(self)  # model serving: replicas, health, the router's table
        self.environment_builds.resume()  # builds a stopped service left, and those waiting
        self.jobs.add("nodes", self.agent_heartbeat, self.watch_nodes)
        if self.idle_check_interval > 0 and self.hub_sync.enabled:
            self.jobs.add("idle", self.idle_check_interval, self.reclaim_idle)
        if self.vfolder_scan_interval > 0:
            self.jobs.add("housekeeping", self.vfolder_scan_interval, self.folder_usage.housekeeping)
        if self.sample_interval > 0:
            self.jobs.add("usage", self.sample_interval, self.account_usage, first_in=0)
        if self.mps_supervisor is not None and self.mps_check_interval > 0:
            self.jobs.add("mps", self.mps_check_interval, self.check_mps)
        loop_task = asyncio.ensure_future(self.jobs.run_forever())
        # The Hub stops its managed services with SIGTERM (and a dead Hub's parent-death signal is
        # SIGTERM too): finish cleanly, no traceback.
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        await self.stopping.wait()
        self.log.info("labfleet service stopping")
        loop_task.cancel()
        self.environment_builds.stop()
        await self.jobs.stop()
        if self.mps_supervisor is not None:
            await asyncio.to_thread(self.mps_supervisor.stop)
        server.stop()
        self.engine.dispose()

    def start(self) -> None:
        asyncio.run(self.start_async())


def main(argv=None) -> None:
    app = LabfleetService.instance()
    app.initialize(argv)
    app.start()


if __name__ == "__main__":
    main()
