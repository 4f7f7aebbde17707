"""The local backend: one ``jupyterhub-singleuser`` process per session on the Hub host.

The embedded default.  A session is a tenant (DESIGN.md): when the Hub runs as root, each session

- runs as the unprivileged session account (``session_user``) with no capability and
  ``no_new_privs``, in a bubblewrap sandbox that shows the system and the runtime read-only, its
  home and its folders, and nothing else of the host (:mod:`labfleet.spawner.sandbox`);
- has a network namespace of its own behind a bridge (:mod:`labfleet.spawner.sessionnet`): it reaches the
  Hub and the labfleet service only through the Hub's public proxy, never the host's loopback, and
  the internet through the host;
- is held to its memory, CPU and process count by a control group (:mod:`labfleet.spawner.cgroups`), and to
  ``session_tmp_size`` of ``/tmp``.

A Hub that is not root cannot switch users or make namespaces for others: its sessions run in a
bubblewrap user namespace with every capability dropped, on the host's network (the README says
what that leaves open).  Devices and shares reach the session through the environment
(CUDA_VISIBLE_DEVICES by UUID, LABFLEET_GPU_SHARES, MPS limits) and its GPUs' device nodes.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from jupyterhub.spawner import SimpleLocalProcessSpawner, SpawnException
from jupyterhub.traitlets import ByteSpecification
from traitlets import Bool, Float, Integer, List, Unicode

from . import sessionnet
from .cgroups import SessionGroup, cgroup_version, startup_cpu
from .homefolders import FOLDERS_ROOT, Tidied, link_folders, unlink_folders
from .launch import LaunchSpec, Mount, mps_withheld_for
from .mixin import LabfleetSpawnerMixin
from .sandbox import (
    DEFAULT_TMP_SIZE,
    SandboxSpec,
    environment_sources,
    gpu_device_nodes,
    sandbox_command,
    system_layout,
)

SHARED_PATH_ROOTS = ("/root", "/home")  # PATH entries there are someone's own, not the runtime


class LabfleetLocalSpawner(LabfleetSpawnerMixin, SimpleLocalProcessSpawner):
    """labfleet sessions as local processes: unprivileged, sandboxed, in a network of their own."""

    sandbox = Unicode(
        "auto",
        help="""Run sessions inside bubblewrap: `auto` or `yes` (as root, a spawn fails without it and
        its tools: a session never runs as root; as another user, `auto` runs without a sandbox when
        bubblewrap cannot run), or `no` (no sandbox: the session still runs as `session_user` when
        the Hub is root, but sees the host's files as that account may; a warning at each spawn).""",
    ).tag(config=True)

    bwrap_path = Unicode("bwrap", help="The bubblewrap program (a name on PATH or a full path).").tag(
        config=True
    )

    session_user = Unicode(
        "labfleet-session",
        help="""The unprivileged account every local session runs as when the Hub is root (one account
        for all: sessions are kept apart by their sandboxes, namespaces and mounts, and share virtual
        folders as Docker sessions do). `scripts/setup.sh` creates it; it needs no home and no shell.""",
    ).tag(config=True)

    session_network = Unicode(
        "isolated",
        help="""`isolated` (as root): a network namespace per session behind `session_bridge`; the
        session reaches the Hub and the labfleet service only through the Hub's public proxy, and
        the internet through the host. `host`: the host's network, loopback included, as the Hub
        itself (the control plane is then reachable from sessions: a warning at each spawn).""",
    ).tag(config=True)

    session_bridge = Unicode(
        "labfleet0",
        help="""The bridge of the sessions' networks (1 to 9 lowercase letters and digits). Hubs on
        one machine may share it; each keeps its own nftables table. Env: LABFLEET_SESSION_BRIDGE.""",
    ).tag(config=True)

    session_subnet = Unicode(
        "10.213.0.0/16",
        help="""The sessions' addresses (IPv4); the first is the bridge's (the gateway), one per running
        session after it. Pick one your network does not route. Env: LABFLEET_SESSION_SUBNET.""",
    ).tag(config=True)

    session_port = Integer(
        8888, help="The port each session's server listens on in its own network namespace."
    ).tag(config=True)

    session_tmp_size = ByteSpecification(
        DEFAULT_TMP_SIZE,
        help="""Size of each session's private /tmp and /var/tmp (tmpfs; their pages also count against
        the session's memory limit). Suffixes K, M, G, T.""",
    ).tag(config=True)

    cgroup_parent = Unicode(
        "labfleet",
        help="""The control group under which each session gets its own (memory, CPU, process limits),
        below the root of each v1 controller or of the v2 hierarchy. Empty: no control groups.""",
    ).tag(config=True)

    startup_cpu_boost = Float(
        1.0,
        help="""Cores a session may use while its server starts, when it asks for fewer: until its
        server accepts connections, or `startup_cpu_boost_timeout` seconds at most; then its own
        CPU. JupyterLab held to a tenth of a core takes minutes to start (Kubernetes' startup CPU
        boost does the same for pods). 0: no boost.""",
    ).tag(config=True)

    startup_cpu_boost_timeout = Float(
        60.0,
        help="""Seconds at most a session keeps its startup CPU boost (`startup_cpu_boost`).""",
    ).tag(config=True)

    sandbox_runtime = List(
        Unicode(),
        help="""More host folders every session sees read-only at the same place (e.g. a conda
        installation, shared datasets). The Hub's Python environment and what its installs point to
        are found without it.""",
    ).tag(config=True)

    sandbox_writable = List(
        Unicode(),
        help="""Extra host directories the sandboxed session may write (besides its home and its
        mounts), e.g. a shared scratch space.""",
    ).tag(config=True)

    extra_mounts: List[dict] = List(
        help="""Host folders to mount in every session, as {"source": "/abs/host/dir", "target":
        "name or /abs/path", "mode": "ro"|"rw"|"wd"}; a relative target is under the session's home.""",
    ).tag(config=True)

    sandbox_hidden = List(
        Unicode(),
        help="""Host paths inside what the sandbox shows (the runtime's folders) that sessions must
        not see: a directory is covered by an empty tmpfs, a file reads as empty. E.g. a state
        directory inside the checkout (the session's own home and folders are still mounted from
        there).""",
    ).tag(config=True)

    session_user_namespaces = Bool(
        False,
        help="""Let sessions make user namespaces of their own (rootless containers, nested sandboxes).
        Off: a session holds no capability anywhere, as Docker's default seccomp profile would have it.
        On: what it inherits stays locked (read-only stays read-only, hidden stays hidden), but a
        larger part of the kernel is in reach.""",
    ).tag(config=True)

    allow_privileged_sessions = Bool(
        False,
        help="""Let a Hub running as root start sessions as root when `sandbox = "no"` and no session
        account exists. Never in production: the session is then root on the host.""",
    ).tag(config=True)

    _log_file = None
    lf_net_index: int | None = None  # the session's network namespace (sessionnet index)
    lf_cgroup: str | None = None  # the session's control group name
    _lf_final_cpu: Decimal | None = None  # the session's own CPU while its startup boost lasts
    _lf_boost_task: asyncio.Task | None = None

    # ------------------------------------------------------------------ state

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        if self.lf_net_index is not None:
            state["labfleet_net"] = self.lf_net_index
        if self.lf_cgroup:
            state["labfleet_cgroup"] = self.lf_cgroup
        if self._lf_final_cpu is not None:
            state["labfleet_cpu"] = str(self._lf_final_cpu)  # a Hub restarted mid-boost ends it
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        index = state.get("labfleet_net")
        self.lf_net_index = index if isinstance(index, int) else None
        self.lf_cgroup = state.get("labfleet_cgroup") or None
        try:
            self._lf_final_cpu = Decimal(str(state["labfleet_cpu"])) if state.get("labfleet_cpu") else None
        except ArithmeticError:
            self._lf_final_cpu = None

    # ------------------------------------------------------------------ what the session runs as

    @property
    def lf_root(self) -> bool:
        return os.geteuid() == 0

    def _bwrap(self) -> str | None:
        if self.sandbox == "no":
            return None
        path = shutil.which(self.bwrap_path)
        if path and _bwrap_works(path):
            return path
        if self.sandbox == "yes" or self.lf_root:
            raise SpawnException(
                f"labfleet: bubblewrap ({self.bwrap_path!r}) is missing or cannot run here, and sessions "
                "never run unsandboxed as root: install it (scripts/setup.sh), or set "
                "LabfleetLocalSpawner.sandbox = 'no' to run them unsandboxed as the session account",
                status_code=503,
                reason="labfleet-sandbox",
            )
        return None

    def _account(self) -> tuple[int, int] | None:
        """(uid, gid) of the session account; None when the Hub is not root (sessions run as the Hub's user)."""
        if not self.lf_root:
            return None
        try:
            entry = pwd.getpwnam(self.session_user)
        except KeyError:
            if self.allow_privileged_sessions and self.sandbox == "no":
                return None
            raise SpawnException(
                f"labfleet: the session account {self.session_user!r} does not exist, and sessions never run "
                f"as root: run scripts/setup.sh, or `useradd --system --user-group --no-create-home "
                f"--shell /usr/sbin/nologin {self.session_user}`",
                status_code=503,
                reason="labfleet-sandbox",
            ) from None
        if entry.pw_uid == 0:
            raise SpawnException(
                f"labfleet: session_user {self.session_user!r} is root",
                status_code=503,
                reason="labfleet-sandbox",
            )
        return entry.pw_uid, entry.pw_gid

    def lf_mps_withheld(self) -> str | None:
        """Sessions run as the session account (a Hub that is root) or as the Hub's own user: one
        non-root uid, unless a root Hub runs them as root (`allow_privileged_sessions`)."""
        if not self.lf_root:
            return mps_withheld_for(str(os.geteuid()))
        try:
            account = self._account()
        except SpawnException:
            return None  # the spawn fails in lf_prepare, with its reason
        return mps_withheld_for(f"{account[0]}:{account[1]}" if account else "0")

    def _network(self) -> sessionnet.SessionNetwork | None:
        """The sessions' network, when they get one of their own (root, `isolated`)."""
        if not self.lf_root or self.session_network == "host":
            return None
        if self.session_network != "isolated":
            raise SpawnException(
                f"labfleet: session_network must be isolated or host, not {self.session_network!r}",
                status_code=500,
                reason="labfleet-config",
            )
        proxy_host, proxy_port = self.lf_proxy_endpoint()
        try:
            return sessionnet.SessionNetwork.parse(
                os.environ.get("LABFLEET_SESSION_BRIDGE") or self.session_bridge,
                os.environ.get("LABFLEET_SESSION_SUBNET") or self.session_subnet,
                proxy_host,
                proxy_port,
                self.session_egress_deny,
            )
        except ValueError as e:
            raise SpawnException(
                f"labfleet: the sessions' network: {e}", status_code=500, reason="labfleet-config"
            ) from None

    def lf_own_pid_namespace(self) -> bool:
        return self.sandbox != "no"  # bwrap --unshare-pid

    def lf_session_home(self) -> str:
        # The sandbox binds the host home at the same path: the session sees it there too.
        return str(self.home_dir)

    def lf_folders_dir(self) -> str:
        # The user's sessions share the home on the host: a sandboxed one mounts its folders in a
        # root of its own, which ~/vfolders links to (labfleet.spawner.homefolders).
        return FOLDERS_ROOT if self._bwrap() else super().lf_folders_dir()

    def _lf_link_folders(self, home: Path) -> None:
        """``~/vfolders`` as the link to the sandbox's folder root; an old one cleared, what was in
        it moved aside and said in the Hub's log and the session's."""
        try:
            tidied = link_folders(str(home), FOLDERS_ROOT, tidy=not self._lf_other_servers_running())
        except OSError as e:
            tidied = Tidied(left=f"~/vfolders could not be linked: {e.strerror}")
        notes = [f"moved aside in the home: {line}" for line in tidied.moved]
        if tidied.left:
            notes.append(f"{tidied.left}; the session's folders are at {FOLDERS_ROOT}/<name>")
        for note in notes:
            self.log.warning("labfleet: %s: %s", self._log_name, note)
            if self._log_file is not None:
                self._log_file.write(f"labfleet: {note}\n".encode())

    def _lf_unlink_folders(self) -> None:
        """The last server of the user is gone: its ``~/vfolders`` link goes too."""
        if self.sandbox != "no" and not self._lf_other_servers_running():
            try:
                unlink_folders(str(self.home_dir))
            except OSError as e:
                self.log.warning("labfleet: %s: ~/vfolders stays: %s", self._log_name, e.strerror)

    def lf_mounts(self, options) -> tuple[Mount, ...]:
        out = []
        for m in self.extra_mounts:
            target = str(m["target"])
            if not target.startswith("/"):
                target = f"{self.lf_session_home().rstrip('/')}/{target}"
            out.append(Mount(source=str(m["source"]), target=target, mode=m.get("mode", "rw")))
        return tuple(out)

    # ------------------------------------------------------------------ start

    async def lf_prepare(self, launch: LaunchSpec) -> None:
        bwrap = self._bwrap()
        account = self._account()
        net = self._network() if bwrap else None
        self._prepare_host(launch, account)
        if net is not None:
            # At every spawn (a few ms): a firewall reload on the host may have dropped the table.
            await sessionnet.ensure(net)
            self.lf_net_index = await sessionnet.attach(net)
            self.ip = str(net.address(self.lf_net_index))
            self.port = self.session_port
        elif self.lf_root and self.session_network == "host":
            self.log.warning(
                "labfleet: %s runs on the host's network: it can reach the Hub's API, the service and "
                "every port on the host's loopback (session_network = 'host')",
                self._log_name,
            )
        # A few mkdirs, chowns and stats: quick enough to run on the loop.
        self._prepare_command(launch, bwrap, account, net)

    def _prepare_host(self, launch: LaunchSpec, account: tuple[int, int] | None) -> None:
        """The home (the session account's), the log file, the control group."""
        home = Path(self.home_dir)
        home.mkdir(parents=True, exist_ok=True)
        if account is not None:
            _own(home, *account)
        log_path = self.session_log_path
        if log_path is not None:
            # The process writes its output straight into the session's log file.
            self._log_file = open(log_path, "ab", buffering=0)  # closed after Popen
            self.popen_kwargs = {"stdout": self._log_file, "stderr": subprocess.STDOUT}
        if self.lf_root and self.cgroup_parent:
            self._lf_cgroup_create(launch)

    def _prepare_command(
        self,
        launch: LaunchSpec,
        bwrap: str | None,
        account: tuple[int, int] | None,
        net: sessionnet.SessionNetwork | None,
    ) -> None:
        home = Path(self.home_dir)
        if not bwrap:
            self.shell_cmd = ["setpriv", *_drop_args(*account), "--", "/bin/sh", "-c"] if account else []
            if launch.mounts:
                unlink_folders(str(home))  # a sandboxed session's link: its folders are links here
                # Without a sandbox a mount is a symlink, and ro cannot be enforced: say so.
                for m in launch.mounts:
                    _link(Path(m.target), m.source, self.log)
            self.log.warning("labfleet: no sandbox for %s (sandbox = 'no'): it sees the host", self._log_name)
            return
        for m in launch.mounts:
            # An extra mount inside the home (the deployment's): its mount point exists on the host.
            if m.target.startswith(str(home) + "/"):
                target = Path(m.target)
                if target.is_symlink():
                    target.unlink()  # left by a session without the sandbox: bind a real directory
                target.mkdir(parents=True, exist_ok=True)
                if account is not None:
                    os.chown(target.parent, *account, follow_symlinks=False)
        self._lf_link_folders(home)
        env = self.get_env()
        netns = net.netns_path(self.lf_net_index) if net and self.lf_net_index is not None else None
        self.shell_cmd = sandbox_command(
            bwrap,
            SandboxSpec(
                home=str(home),
                system=system_layout(),
                runtime=tuple(self._runtime(env)),
                hidden=tuple(h for h in self.sandbox_hidden if os.path.isdir(h)),
                hidden_files=tuple(h for h in self.sandbox_hidden if os.path.isfile(h)),
                mounts=launch.mounts,
                folders_root=FOLDERS_ROOT,
                writable=tuple(self.sandbox_writable) + _mps_dirs(launch, env),
                devices=gpu_device_nodes(launch.gpus),
                tmp_size=int(self.session_tmp_size or DEFAULT_TMP_SIZE),
                hostname=_hostname(self.user.name, self.name),  # type: ignore[attr-defined]
                uid=account[0] if account else None,
                gid=account[1] if account else None,
                netns=netns,
                user_namespaces=self.session_user_namespaces,
            ),
        )

    def _lf_cgroup_create(self, launch: LaunchSpec) -> None:
        version = cgroup_version()
        if version is None:
            self.log.warning(
                "labfleet: no control groups on this host: %s has no memory or CPU limit", self._log_name
            )
            return
        group = SessionGroup(self.cgroup_parent, launch.session_id, version)
        mem = launch.mem or self.mem_limit or None
        given = launch.cpu if launch.cpu is not None else (self.cpu_limit or None)
        cpu = Decimal(str(given)) if given is not None else None
        first = startup_cpu(cpu, Decimal(str(self.startup_cpu_boost)))
        group.create(cpu=first, mem=int(mem) if mem else None, pids=launch.pids_limit)
        self._lf_final_cpu = cpu if first != cpu else None
        self.lf_cgroup = launch.session_id

    def _group(self) -> SessionGroup | None:
        version = cgroup_version()
        if not self.lf_cgroup or version is None:
            return None
        return SessionGroup(self.cgroup_parent, self.lf_cgroup, version)

    def _runtime(self, env: dict[str, str]) -> list[str]:
        """What the session needs of the host read-only: its Python environments, what their installs
        point to (an editable checkout, linked JupyterLab extensions), its PATH and PYTHONPATH (not
        someone's home) and ``sandbox_runtime``."""
        wanted = [sys.prefix, sys.base_prefix, *self.sandbox_runtime]
        prefixes = [sys.prefix]
        hidden = [h.rstrip("/") for h in self.sandbox_hidden]
        for var in ("PATH", "PYTHONPATH"):
            for entry in env.get(var, "").split(os.pathsep):
                if not entry.startswith("/") or not os.path.isdir(entry):
                    continue
                if any(entry == r or entry.startswith(r + "/") for r in (*SHARED_PATH_ROOTS, *hidden)):
                    continue
                wanted.append(entry)
                parent = os.path.dirname(entry.rstrip("/"))
                if os.path.isfile(os.path.join(parent, "pyvenv.cfg")) and parent not in prefixes:
                    prefixes.append(parent)
        for prefix in prefixes:
            wanted += environment_sources(prefix)
        return [os.path.realpath(p) for p in wanted if p and os.path.exists(p)]

    def make_preexec_fn(self, name):
        home = self.home_dir
        group = self._group()

        def preexec():
            # In the child, before it runs anything: every process of the session is in its group.
            if group is not None:
                group.join()
            os.chdir(home)

        return preexec

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        net = self._network() if self.lf_net_index is not None else None
        if net is not None:
            # The session's network has no route to the host's loopback: the Hub's API and the
            # labfleet service are called through the Hub's public proxy.
            api = net.hub_url + urlparse(self.hub.api_url).path  # type: ignore[attr-defined]
            env["JUPYTERHUB_API_URL"] = api
            env["JUPYTERHUB_ACTIVITY_URL"] = env.get("JUPYTERHUB_ACTIVITY_URL", "").replace(
                self.hub.api_url.rstrip("/"),  # type: ignore[attr-defined]
                api.rstrip("/"),
                1,
            )
            if not self.session_service_url:
                env["LABFLEET_SERVICE_URL"] = net.hub_url + urlparse(self.service_url).path
        else:
            # On the host's network a replica's front listens on the loopback only, as replicas did.
            env.setdefault("LABFLEET_INFERENCE_HOST", "127.0.0.1")
        return env

    def lf_runtime(self) -> dict[str, Any] | None:
        """The server's root process (nsenter's, then bwrap's) and its address: the sampler walks its
        tree; the serving router calls a replica there."""
        if not self.pid:
            return None
        out: dict[str, Any] = {"pid": self.pid}
        if self.lf_net_index is not None and self.ip:
            out["address"] = self.ip
        return out

    async def start(self):
        try:
            url = await super().start()
        except BaseException:
            await self._lf_teardown(self.lf_net_index, self.lf_cgroup)
            raise
        else:
            if self._lf_final_cpu is not None:
                self._lf_boost_task = asyncio.ensure_future(self._lf_end_boost(self._lf_final_cpu))
            return url
        finally:
            if self._log_file is not None:
                self._log_file.close()  # the child has its own copy
                self._log_file = None

    # ------------------------------------------------------------------ stop, poll

    async def _lf_end_boost(self, cpu: Decimal, wait: bool = True) -> None:
        """The session's own CPU limit once its server accepts connections (or the boost's time is up)."""
        deadline = asyncio.get_running_loop().time() + (self.startup_cpu_boost_timeout if wait else 0)
        while asyncio.get_running_loop().time() < deadline:
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.ip or "127.0.0.1", self.port), 2
                )
            except (OSError, asyncio.TimeoutError):
                await asyncio.sleep(0.25)
                continue
            writer.close()
            break
        group = self._group()
        if group is not None:
            try:
                await asyncio.to_thread(group.set_cpu, cpu)
            except OSError as e:  # the session ended meanwhile
                self.log.debug("labfleet: %s: no startup boost to end: %s", self._log_name, e)
            else:
                self.log.debug("labfleet: %s: held to %s CPU from now on", self._log_name, cpu)
        self._lf_final_cpu = None

    async def _lf_teardown(self, net_index: int | None, cgroup: str | None) -> None:
        """What the session held on the host: what still runs in its group, the group, its namespace."""
        if self._lf_boost_task is not None:
            self._lf_boost_task.cancel()
            self._lf_boost_task = None
        self._lf_final_cpu = None
        if cgroup:
            version = cgroup_version()
            if version is not None:
                # Kills what escaped the process group, then waits for it: off the Hub's loop.
                await asyncio.to_thread(SessionGroup(self.cgroup_parent, cgroup, version).remove)
        if net_index is not None:
            net = self._network()
            if net is not None:
                await sessionnet.detach(net, net_index)
        if self.lf_net_index == net_index:
            self.lf_net_index = None
        if self.lf_cgroup == cgroup:
            self.lf_cgroup = None
        self._lf_unlink_folders()

    async def poll(self):
        held = (self.lf_net_index, self.lf_cgroup)
        status = await super().poll()
        if status is not None and held != (None, None):
            await self._lf_teardown(*held)
        elif status is None and self._lf_final_cpu is not None and self._lf_boost_task is None:
            await self._lf_end_boost(self._lf_final_cpu, wait=False)  # a Hub restarted mid-boost
        return status

    async def stop(self, now: bool = False):
        held = (self.lf_net_index, self.lf_cgroup)
        try:
            await super().stop(now=now)
        finally:
            await self._lf_teardown(*held)

    async def _signal(self, sig):
        """Signal the whole sandbox: bwrap, and the server in its own PID namespace.

        bwrap does not pass signals on, so a signal to its pid alone would leave the server
        running; they share a process group (JupyterHub starts a new session for each server, so
        the group is the server's alone, also after a Hub restart).
        """
        try:
            leader = os.getpgid(self.pid) == self.pid
        except ProcessLookupError:
            return False
        if not leader:
            return await super()._signal(sig)
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return False
        except PermissionError:
            return await super()._signal(sig)
        return True


def _drop_args(uid: int, gid: int) -> list[str]:
    return [
        f"--reuid={uid}",
        f"--regid={gid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
    ]


def _own(home: Path, uid: int, gid: int) -> None:
    """The home belongs to the session account (all of it, when it did not yet: an older home)."""
    st = home.stat()
    if (st.st_uid, st.st_gid) == (uid, gid):
        return
    for root, dirs, files in os.walk(home):
        for name in (*dirs, *files):
            os.lchown(os.path.join(root, name), uid, gid)
    os.chown(home, uid, gid)


def _hostname(user: str, server: str) -> str:
    """The session's host name: the user's and the server's name, as DNS labels allow."""
    raw = f"{user}-{server}" if server else user
    label = "".join(c if c.isalnum() else "-" for c in raw.lower()).strip("-")[:63]
    return label or "session"


def _mps_dirs(launch: LaunchSpec, env: dict[str, str]) -> tuple[str, ...]:
    """The MPS daemon's pipe folder, which a client of a fractional session must write to."""
    pipe = env.get("CUDA_MPS_PIPE_DIRECTORY")  # the node's daemon's (the spawner's get_env)
    if launch.mps and launch.gpus and pipe and os.path.isdir(pipe):
        return (pipe,)
    return ()


def _link(target: Path, source: str, log) -> None:
    """``target`` as a symlink to ``source``: a stale link (another folder of that name before, or
    an empty mount point of a sandboxed session) is replaced; the user's own files never are."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink():
        if os.readlink(target) == source:
            return
        target.unlink()
    elif target.is_dir():
        try:
            target.rmdir()  # only when empty
        except OSError:
            log.warning("labfleet: %s is a folder of its own, not mounting %s there", target, source)
            return
    elif target.exists():
        log.warning("labfleet: %s is a file, not mounting %s there", target, source)
        return
    target.symlink_to(source)


def _bwrap_works(path: str) -> bool:
    """bwrap can be installed yet refused by the kernel (no user namespaces): try it once."""
    cached = _BWRAP_OK.get(path)
    if cached is None:
        unprivileged = [] if os.geteuid() == 0 else ["--unshare-user"]
        try:
            r = subprocess.run(
                [path, "--ro-bind", "/", "/", "--dev", "/dev", *unprivileged, "--", "/bin/true"],
                capture_output=True,
                timeout=10,
            )
            cached = r.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            cached = False
        _BWRAP_OK[path] = cached
    return cached


_BWRAP_OK: dict[str, bool] = {}
