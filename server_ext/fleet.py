"""What the session's ``labfleet/...`` endpoints answer, composed from the service's views and this
session's environment. Pure: no I/O, the handlers fetch and these shape.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

from labfleet.core.vocab import ACTIVE_STATUSES

from .runner import SessionEnv

# Sessions that still hold (or wait for) resources: what "my sessions" lists.


def _instant(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def server_url(hub_prefix: str, user: str, name: str) -> str:
    """The path of a user's server behind the Hub's proxy (``/user/alice/work/``)."""
    base = hub_prefix.rstrip("/") + f"/user/{user}/"
    return base + (f"{name}/" if name else "")


def gpu_share(env: SessionEnv) -> dict[str, Any] | None:
    """The session's share of one device as its spawner set it: ``shares``, ``memory`` (bytes; None when
    the device's size is unknown) and ``enforcement`` (``mps``: the node's MPS daemon holds it; ``caps``:
    only the frameworks' own memory caps, which code in the session can change), and ``mps_withheld``
    where the backend withheld its node's MPS from the session: why.  None for whole devices or none
    (and for a spawner from before enforcement was told)."""
    if not env.gpu_enforcement:
        return None
    try:
        shares: float | None = float(env.gpu_shares)
    except ValueError:
        shares = None
    out: dict[str, Any] = {
        "shares": shares,
        "memory": env.gpu_memory_limit,
        "enforcement": env.gpu_enforcement,
    }
    if env.gpu_mps_withheld:
        out["mps_withheld"] = env.gpu_mps_withheld
    return out


def session_summary(
    env: SessionEnv,
    view: Mapping[str, Any] | None,
    *,
    now: datetime,
    user: str,
    server_name: str,
    base_url: str,
    runner: Mapping[str, Any] | None = None,
    inference_ready: bool | None = None,
    service: str = "ok",
) -> dict[str, Any]:
    """``GET labfleet/session``: the service's view of this session (``view``; ``None`` when it could not
    be asked, then what the environment says), with times, URLs and the runner's state.

    ``idle`` is the service's idle object as it gave it (``idle_for``, ``timeout``, ``reclaim_at``,
    ``checker``, ``reason``, ``only_when_queue_waiting``; only while the session runs), so the sidebar can
    count down to the reclamation; ``None`` when the service gave none."""
    v = dict(view or {})
    idle = v.get("idle")
    started = _instant(v.get("started_at"))
    lifetime = v.get("max_lifetime")
    expires = _instant(v.get("expires_at"))
    out: dict[str, Any] = {
        "id": v.get("id") or env.session_id or None,
        "name": server_name,
        "user": v.get("user") or user,
        "type": v.get("type") or env.type,
        "project": v.get("project") or env.project or None,
        "domain": v.get("domain"),
        "image": v.get("image") or env.image or None,
        "resource_group": v.get("resource_group"),
        "node": v.get("node"),
        "status": v.get("status"),
        "slots": v.get("slots") or {},
        "devices": list(v.get("devices") or []),
        "mounts": [
            {k: m[k] for k in ("vfolder", "name", "permission") if k in m} for m in v.get("mounts") or []
        ],
        "created_at": v.get("created_at"),
        "started_at": v.get("started_at"),
        "uptime": max(0, int((now - started).total_seconds())) if started else None,
        "max_lifetime": lifetime,
        "expires_at": v.get("expires_at"),
        "time_left": max(0, int((expires - now).total_seconds())) if expires else None,
        "idle": dict(idle) if isinstance(idle, Mapping) else None,
        "urls": {"base": base_url, "lab": base_url + "lab"},
        "runner": dict(runner) if runner else None,
        "inference": None,
        "service": service,
        "gpu_share": gpu_share(env),
    }
    if out["type"] == "inference":
        url = base_url + "labfleet/inference/"
        out["inference"] = {
            "url": url,
            "ready": inference_ready,
            "example": (
                f"curl -H 'Authorization: token <a Hub token with access to this server>' "
                f"<hub address>{url}<path of your model's route>"
            ),
        }
    return out


def mounted_folders(
    mounts: Iterable[Mapping[str, Any]], folders: Mapping[str, Mapping[str, Any] | None], mount_dir: str
) -> list[dict[str, Any]]:
    """``GET labfleet/vfolders``: each mount with its folder's usage (``folders`` by id; ``None`` where the
    service did not answer for it). ``mount_dir`` is where the spawner mounts them, relative to the Lab's
    root (``vfolders``)."""
    out = []
    for m in mounts:
        fid = str(m.get("vfolder") or m.get("id") or "")
        folder = folders.get(fid) or {}
        usage = folder.get("usage") or {}
        limits = folder.get("limits") or {}
        name = str(m.get("name") or folder.get("name") or "")
        out.append(
            {
                "id": fid,
                "name": name,
                "permission": m.get("permission") or folder.get("permission"),
                "path": f"{mount_dir}/{name}" if mount_dir else name,
                "owner": folder.get("owner"),
                "usage_mode": folder.get("usage_mode"),
                "host": folder.get("host"),
                "status": folder.get("status"),
                "usage_bytes": usage.get("bytes"),
                "usage_files": usage.get("files"),
                "max_size": limits.get("max_size"),
                "scope": limits.get("scope"),
            }
        )
    return out


def quota_summary(me: Mapping[str, Any], project: str | None) -> dict[str, Any]:
    """``GET labfleet/quota`` from the service's ``/api/me``: me (my main keypair's policy), the session's
    project (else my first) and my domain."""
    quota = me.get("quota") or {}
    projects = quota.get("projects") or {}
    name = project if project in projects else next(iter(sorted(projects)), None)
    return {
        "keypair": quota.get("keypair"),
        "project": projects.get(name) if name else None,
        "project_name": name,
        "domain": quota.get("domain"),
        "domain_name": (me.get("domain") or {}).get("name"),
        "projects": projects,
    }


def my_sessions(
    views: Iterable[Mapping[str, Any]], *, user: str, current_id: str | None, hub_prefix: str
) -> list[dict[str, Any]]:
    """``GET labfleet/sessions``: my sessions queued, starting or running, this one marked."""
    out = []
    for v in views:
        if v.get("user") != user or v.get("status") not in ACTIVE_STATUSES:
            continue
        name = str(v.get("name") or "")
        out.append(
            {
                "id": v.get("id"),
                "name": name,
                "project": v.get("project"),
                "type": v.get("type"),
                "image": v.get("image"),
                "resource_group": v.get("resource_group"),
                "status": v.get("status"),
                "status_reason": v.get("status_reason"),
                "queue_position": v.get("queue_position"),
                "waiting_for": v.get("waiting_for"),
                "endpoint": v.get("endpoint"),
                "slots": v.get("slots") or {},
                "devices": list(v.get("devices") or []),
                "created_at": v.get("created_at"),
                "url": server_url(hub_prefix, user, name) + "lab" if v.get("status") == "RUNNING" else None,
                "current": bool(current_id) and v.get("id") == current_id,
            }
        )
    return out


def gpu_rows(
    devices: Iterable[Mapping[str, Any]],
    readings: Mapping[str, tuple[str, Mapping[str, Any] | None, list[Mapping[str, Any]] | None]],
    own_pids: set[int],
    *,
    pids_comparable: bool = True,
) -> list[dict[str, Any]]:
    """One row per device of the session for ``GET labfleet/usage``.

    ``readings[uuid]`` is (source, the device's utilization reading, its processes). On a device the
    session holds whole, the device's numbers are the session's. On a shared one (a fraction) only the
    session's own processes count: their memory, and their utilization where the driver samples it.
    ``pids_comparable`` is false when the session runs in a PID namespace of its own (a container, the
    sandbox): the driver's pids are the node's and cannot be matched to the session's, so a shared device
    shows the whole device's numbers with ``scope: "device"``.
    """
    rows = []
    for d in devices:
        uuid = str(d.get("uuid"))
        shares = float(d.get("shares") or 0)
        memory = d.get("memory")
        source, reading, procs = readings.get(uuid, ("none", None, None))
        row: dict[str, Any] = {
            "uuid": uuid,
            "index": d.get("index"),
            "model": d.get("model"),
            "shares": shares,
            "memory_total": (reading or {}).get("mem_total") or memory,
            "memory_limit": int(Decimal(str(memory)) * Decimal(str(shares)))
            if memory and shares < 1
            else memory,
            "utilization": None,
            "memory_used": None,
            "scope": "session",
            "source": source,
        }
        if reading is None:
            row["scope"] = "unknown"
        elif shares >= 1 or procs is None or not pids_comparable:
            row["scope"] = "session" if shares >= 1 else "device"
            row["utilization"] = reading.get("gpu_util")
            row["memory_used"] = reading.get("mem_used")
        else:
            mine = [p for p in procs if p.get("pid") in own_pids]
            row["memory_used"] = sum(int(p.get("mem_used") or 0) for p in mine)
            utils = [p.get("gpu_util") for p in mine]
            row["utilization"] = None if None in utils else sum(int(u) for u in utils if u is not None)
        rows.append(row)
    return rows
