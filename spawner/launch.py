"""What to launch for an admitted session: a pure builder from the service's placement.

:func:`build_launch` turns the session as the labfleet service answers it (``GET
/api/sessions/{id}``: placement, slots, type) and the validated spawn options into a
:class:`LaunchSpec`: limits, devices, mounts and the environment the session sees.  Backends
(:mod:`labfleet.spawner.local`, :mod:`labfleet.spawner.docker`) translate a LaunchSpec into their own terms; no
backend decides anything the placement already decided (Docker does not choose devices, the
placement does).  :func:`vfolder_mounts` turns the virtual folders the service mounts for the
session into Mounts under the session's home.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from labfleet.core.vocab import FOLDER_PERMISSIONS

from .options import SessionOptions, is_vfolder_name

# A fraction of one device: how the session is told to limit itself.
MPS_THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MPS_MEMORY_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
DEFAULT_PIDS_LIMIT = 4096
VFOLDERS_DIR = "vfolders"  # virtual folders appear at <session home>/vfolders/<name>
SERVICE_PORTS_ENV = "LABFLEET_SERVICE_PORTS"  # read by labfleet.session.apps
# A fraction of one device: its bytes, and how the share is held (read by labfleet.session.fleet).
GPU_MEMORY_LIMIT_ENV = "LABFLEET_GPU_MEMORY_LIMIT"
GPU_ENFORCEMENT_ENV = "LABFLEET_GPU_ENFORCEMENT"
ENFORCED_BY_MPS = "mps"  # the node's MPS daemon limits the session's memory and SMs
ENFORCED_BY_CAPS = "caps"  # only the frameworks' own caps (advisory: the session may change its env)
# Why a fraction holds by the caps alone where its node runs MPS: the backend withheld MPS from it
# (:func:`mps_withheld_for`); read by labfleet.session.fleet, shown in the session's sidebar.
GPU_MPS_WITHHELD_ENV = "LABFLEET_GPU_MPS_WITHHELD"
# PyTorch's caching allocator settings: comma-separated ``option:value`` items.  PyTorch 2.9 and later
# read PYTORCH_ALLOC_CONF first and the older name only when that is unset.
TORCH_ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"
TORCH_ALLOC_CONF_NEW_ENV = "PYTORCH_ALLOC_CONF"
TORCH_FRACTION_OPTION = "per_process_memory_fraction"
# One part of Docker's ``--user uid[:gid]``: a number or a user / group name.
_USER_PART = re.compile(r"[0-9]{1,10}|[a-z_][a-z0-9_.-]{0,31}")


@dataclass(frozen=True)
class GPUAssignment:
    uuid: str
    index: int  # the device's index on its node (NVML's), for people and for MPS limits
    model: str
    memory: int  # bytes of device memory, 0 when unknown
    shares: Decimal  # 1 for a whole device


@dataclass(frozen=True)
class Mount:
    """A host directory in the session: ``target`` is absolute inside the session."""

    source: str
    target: str
    mode: str = "rw"  # ro | rw | wd (wd writes and deletes; both are writable mounts)

    def __post_init__(self) -> None:
        if self.mode not in FOLDER_PERMISSIONS:
            raise ValueError(f"mount mode must be one of {', '.join(FOLDER_PERMISSIONS)}, not {self.mode!r}")
        if not self.source.startswith("/") or not self.target.startswith("/"):
            raise ValueError("mount source and target must be absolute paths")

    @property
    def read_only(self) -> bool:
        return self.mode == "ro"


@dataclass(frozen=True)
class LaunchSpec:
    session_id: str
    user: str
    server_name: str
    session_type: str  # interactive | batch | inference
    command: str  # the batch / inference command, "" for interactive
    image: str | None
    project: str  # DOMAIN/PROJECT
    node: str | None
    cpu: Decimal | None  # cores; None means no limit
    mem: int | None  # bytes; None means no limit
    gpus: tuple[GPUAssignment, ...] = ()
    mounts: tuple[Mount, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    pids_limit: int = DEFAULT_PIDS_LIMIT
    mps: bool = False
    # Why the backend withheld its node's MPS from this fraction (None: it did not, or no fraction).
    mps_withheld: str | None = None

    @property
    def gpu_uuids(self) -> list[str]:
        return [g.uuid for g in self.gpus]

    @property
    def gpu_shares(self) -> Decimal:
        return sum((g.shares for g in self.gpus), Decimal(0))

    @property
    def fractional(self) -> bool:
        """One device, not all of it: the session must limit itself (MPS or framework caps)."""
        return len(self.gpus) == 1 and self.gpus[0].shares < 1


def _amount(value: Any) -> Decimal | None:
    if value is None:
        return None
    return Decimal(str(value))


def _gpus(devices: list[Mapping[str, Any]]) -> tuple[GPUAssignment, ...]:
    out = []
    for d in devices:
        out.append(
            GPUAssignment(
                uuid=str(d["uuid"]),
                index=int(d.get("index", 0)),
                model=str(d.get("model", "")),
                memory=int(d.get("memory", 0) or 0),
                shares=Decimal(str(d["shares"])),
            )
        )
    return tuple(out)


def _fmt(amount: Decimal) -> str:
    return format(amount.normalize(), "f")


def framework_caps(fraction: Decimal) -> dict[str, str]:
    """The frameworks' memory caps for a session that holds ``fraction`` (0 < fraction < 1) of a device.

    Measured on an H200 without MPS: PyTorch ignores the XLA and TensorFlow variables (a 0.25 session
    took 50 % of the card) but keeps to its allocator's ``per_process_memory_fraction`` (0.25: 40 %
    refused, 20 % allowed).  Every cap is the framework's own and applies per process.
    """
    share = _fmt(fraction)
    return {
        # PyTorch: the caching allocator refuses allocations past the fraction of the device.
        TORCH_ALLOC_CONF_ENV: f"{TORCH_FRACTION_OPTION}:{share}",
        # JAX / XLA: a cap on its allocator, grown on demand rather than taken whole at start.
        "XLA_PYTHON_CLIENT_MEM_FRACTION": share,
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        # TensorFlow has no memory cap it reads from the environment (only tf.config's
        # memory_limit, set in code): growing on demand keeps it from taking the whole device at
        # start, and nothing more.
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        # CuPy: its memory pool's limit, as a percentage of the device.
        "CUPY_GPU_MEMORY_LIMIT": f"{_fmt(fraction * 100)}%",
    }


def mps_withheld_for(user: str | None) -> str | None:
    """Why a session that runs as ``user`` (Docker's ``uid[:gid]``; None or empty: the image's own
    USER) may not be a client of its node's MPS daemon, or None when it may.

    The daemon serves one uid at a time (another uid's clients wait until the first uid's are gone),
    and root may change its settings, the limits of other sessions among them (measured on an H200).
    So every session that reaches the pipe runs as one numeric uid that is not 0: the image's own
    USER may be root, or another uid in each image; a name (``jovyan``) is looked up in each image's
    own ``/etc/passwd``, so its uid is unknown here and may be 0.  The group does not matter to MPS.
    """
    if not user:
        return "the session runs as its image's own user, which may be root or differ between images"
    uid, sep, gid = user.partition(":")
    if not _USER_PART.fullmatch(uid) or (sep and not _USER_PART.fullmatch(gid)):
        return f"the session's user {user[:40]!r} is not uid[:gid]"
    if uid == "root" or (uid.isdigit() and int(uid) == 0):
        return f"the session runs as root ({user!r}), who could change the node's MPS limits"
    if not uid.isdigit():
        return f"the session's user {uid!r} is a name each image maps to a uid of its own, possibly root"
    return None


def gpu_env(
    gpus: tuple[GPUAssignment, ...], *, mps: bool, in_container: bool, mps_withheld: str | None = None
) -> dict[str, str]:
    """The environment that pins and limits the session's GPUs.

    Local processes see the node's devices, so CUDA_VISIBLE_DEVICES names them by UUID (CUDA
    accepts UUIDs there).  A container sees only what Docker gave it, renumbered from 0.
    ``LABFLEET_GPU_SHARES`` is always set, so code in the session (and the server extension)
    knows its share even where nothing enforces it.  A fraction of a device gets the frameworks'
    caps (:func:`framework_caps`) with or without MPS, and ``LABFLEET_GPU_ENFORCEMENT`` says which
    holds the share: ``mps`` or ``caps``.  Whole devices get no cap.  ``mps_withheld``: why the
    backend gives this session no MPS (``mps`` is then ignored); a fraction's environment says why in
    ``LABFLEET_GPU_MPS_WITHHELD``.
    """
    if mps_withheld:
        mps = False
    env: dict[str, str] = {}
    total = sum((g.shares for g in gpus), Decimal(0))
    env["LABFLEET_GPU_SHARES"] = _fmt(total)
    if not gpus:
        # No device for this session: hide the node's devices from CUDA.
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["NVIDIA_VISIBLE_DEVICES"] = "void"
        return env
    uuids = ",".join(g.uuid for g in gpus)
    env["LABFLEET_GPU_UUIDS"] = uuids
    env["NVIDIA_VISIBLE_DEVICES"] = uuids
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(gpus))) if in_container else uuids
    if len(gpus) == 1 and gpus[0].shares < 1:
        g = gpus[0]
        fraction = g.shares
        env["LABFLEET_GPU_FRACTION"] = _fmt(fraction)
        if g.memory:
            env[GPU_MEMORY_LIMIT_ENV] = str(int(g.memory * fraction))
        env.update(framework_caps(fraction))
        if mps:
            # MPS enforces both: a share of the SMs and a cap on pinned device memory.
            env[GPU_ENFORCEMENT_ENV] = ENFORCED_BY_MPS
            env[MPS_THREADS_ENV] = str(max(1, int(fraction * 100)))
            if g.memory:
                env[MPS_MEMORY_ENV] = f"0={int(g.memory * fraction) // 2**20}M"
        else:
            # No MPS daemon: the frameworks' caps alone (advisory: the session can change its env).
            env[GPU_ENFORCEMENT_ENV] = ENFORCED_BY_CAPS
            if mps_withheld:
                env[GPU_MPS_WITHHELD_ENV] = mps_withheld
    return env


def _alloc_items(conf: str | None) -> list[str]:
    """A PyTorch allocator setting's items: split on the commas outside ``[...]`` lists, blanks dropped."""
    items: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in conf or "":
        if ch == "," and depth == 0:
            items.append("".join(current))
            current = []
            continue
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        current.append(ch)
    items.append("".join(current))
    return [item.strip() for item in items if item.strip()]


def _alloc_fraction(value: str) -> Decimal | None:
    """A ``per_process_memory_fraction`` value PyTorch would take (0 < value <= 1), else None."""
    try:
        number = Decimal(value.strip())
    except InvalidOperation:
        return None
    return number if number.is_finite() and 0 < number <= 1 else None


def merge_alloc_conf(theirs: str | None, ours: str) -> str:
    """PyTorch's allocator setting with ours over theirs (what the image, the deployment or the user set).

    Their items stay, in their order, unless ours names the same option (ours wins in place).  The
    memory fraction is the smaller of theirs and ours, kept as last item; a fraction PyTorch would
    refuse (not a number, 0, over 1) is dropped.  Items that are not ``option:value`` stay as they
    are: PyTorch judges them as it did before.  Merging again with ours changes nothing.
    """
    items: dict[str, str] = {}
    fractions: list[tuple[Decimal, str]] = []
    for conf in (theirs, ours):
        for item in _alloc_items(conf):
            option, _, value = item.partition(":")
            if option.strip() == TORCH_FRACTION_OPTION:
                number = _alloc_fraction(value)
                if number is not None:
                    fractions.append((number, value.strip()))
                continue
            items[option.strip()] = item
    out = list(items.values())
    if fractions:
        smallest = min(fractions, key=lambda f: f[0])
        out.append(f"{TORCH_FRACTION_OPTION}:{smallest[1]}")
    return ",".join(out)


def with_caps(theirs: Mapping[str, str], ours: Mapping[str, str]) -> dict[str, str]:
    """``ours`` (the session's environment from labfleet) to put over ``theirs`` (what the session
    would have without it: the image's, the deployment's, the user's), with PyTorch's allocator
    setting merged with theirs (:func:`merge_alloc_conf`) rather than replacing it.  Where theirs
    uses PyTorch's newer variable, which PyTorch reads first, the cap goes there too.  Without a cap
    of ours (a whole device, no device) theirs stays as it is.
    """
    out = dict(ours)
    conf = ours.get(TORCH_ALLOC_CONF_ENV)
    if conf is None:
        return out
    for name in (TORCH_ALLOC_CONF_ENV, TORCH_ALLOC_CONF_NEW_ENV):
        if name == TORCH_ALLOC_CONF_ENV or name in theirs:
            out[name] = merge_alloc_conf(theirs.get(name), ours.get(name, conf))
    return out


def vfolder_mounts(
    session: Mapping[str, Any], folders_dir: str, *, taken: Iterable[str] = ()
) -> tuple[Mount, ...]:
    """The session's virtual folders (the service's ``mounts``) as Mounts at ``folders_dir``/<name>:
    the backend's ``<home>/vfolders``, or the sandbox's own folder root that ``~/vfolders`` links
    to (:mod:`labfleet.spawner.homefolders`).

    The service is trusted to choose the folders and their sources, but a reply must never put a
    mount outside ``folders_dir``: a name that is not one plain path component, a relative source or
    a second folder of the same name raises ValueError.  ``taken``: targets the backend mounts
    already (its own extra mounts), which a folder may not cover.
    """
    raw = session.get("mounts")
    if raw is None:
        return ()  # a service from before virtual folders
    if not isinstance(raw, list):
        raise ValueError(f"mounts must be a list, not {type(raw).__name__}")
    if not raw:
        return ()
    if not folders_dir.startswith("/"):
        raise ValueError(f"the session's folders directory must be an absolute path, not {folders_dir!r}")
    base = folders_dir.rstrip("/")
    used = set(taken)
    out: list[Mount] = []
    names: set[str] = set()
    for item in raw:
        if not isinstance(item, Mapping):
            raise ValueError(f"a mount must be an object, not {type(item).__name__}")
        name, source, permission = item.get("name"), item.get("source"), item.get("permission")
        if not is_vfolder_name(name):
            raise ValueError(f"folder name {str(name)[:70]!r} is not a valid folder name")
        if not isinstance(source, str) or not source.startswith("/") or "\x00" in source:
            raise ValueError(f"folder {name}: source {str(source)[:200]!r} is not an absolute path")
        if ".." in source.split("/"):
            raise ValueError(f"folder {name}: source {source[:200]!r} has a '..' component")
        if permission not in FOLDER_PERMISSIONS:
            raise ValueError(
                f"folder {name}: permission must be one of {', '.join(FOLDER_PERMISSIONS)}, not {str(permission)[:20]!r}"
            )
        if name in names:
            raise ValueError(f"two folders are named {name!r}: one session mounts one folder per name")
        names.add(name)
        target = f"{base}/{name}"
        if target in used:
            raise ValueError(f"folder {name}: {target} is already a mount of this hub")
        used.add(target)
        out.append(Mount(source=source, target=target, mode=permission))
    return tuple(out)


def build_launch(
    session: Mapping[str, Any],
    options: SessionOptions,
    *,
    mounts: tuple[Mount, ...] = (),
    mps: bool = False,
    mps_withheld: str | None = None,
    in_container: bool = False,
    pids_limit: int = DEFAULT_PIDS_LIMIT,
) -> LaunchSpec:
    """From the service's session view (placement included) and the options to a LaunchSpec.

    ``mps``: a fraction is limited by its node's MPS daemon; ``mps_withheld``: why the backend may
    not let this session reach that daemon (:func:`mps_withheld_for`): the fraction then holds by the
    framework caps alone, and its environment and ``LaunchSpec.mps_withheld`` say why."""
    slots = session.get("slots") or {}
    gpus = _gpus(session.get("devices") or [])
    cpu = _amount(slots.get("cpu"))
    mem_value = slots.get("mem")
    mem = int(Decimal(str(mem_value))) if mem_value is not None else None
    env = {
        "LABFLEET_SESSION_ID": str(session["id"]),
        "LABFLEET_SESSION_TYPE": options.type,
        "LABFLEET_PROJECT": str(session.get("project", "")),
        "LABFLEET_IMAGE": options.image or "",
        "LABFLEET_RESOURCE_GROUP": str(session.get("resource_group", "")),
        "LABFLEET_NODE": str(session.get("node") or ""),
    }
    if options.command:
        env["LABFLEET_COMMAND"] = options.command
    if options.port is not None:
        env["LABFLEET_INFERENCE_PORT"] = str(options.port)  # labfleet.session's runner: $PORT of the command
    ports = session.get("service_ports")
    if isinstance(ports, list) and ports:
        # The image's service ports (apps): labfleet.session proxies each at <base_url><name>/.
        env[SERVICE_PORTS_ENV] = json.dumps(ports, separators=(",", ":"))
    if cpu is not None:
        env["LABFLEET_CPU_LIMIT"] = _fmt(cpu)
        # Thread pools (OpenMP, MKL, BLAS) follow the CPU share instead of the node's core count.
        env["OMP_NUM_THREADS"] = str(max(1, int(cpu)))
    if mem is not None:
        env["LABFLEET_MEM_LIMIT"] = str(mem)
    if mps_withheld:
        mps = False
    env.update(gpu_env(gpus, mps=mps, in_container=in_container, mps_withheld=mps_withheld))
    return LaunchSpec(
        session_id=str(session["id"]),
        user=str(session.get("user", "")),
        server_name=str(session.get("name", "")),
        session_type=options.type,
        command=options.command,
        image=options.image,
        project=str(session.get("project", "")),
        node=session.get("node"),
        cpu=cpu,
        mem=mem,
        gpus=gpus,
        mounts=mounts,
        env=env,
        pids_limit=pids_limit,
        mps=mps,
        mps_withheld=mps_withheld if env.get(GPU_MPS_WITHHELD_ENV) else None,
    )
