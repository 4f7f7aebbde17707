"""An in-memory labfleet for the widgets: the same coroutine methods as :class:`labfleet.widgets.client.FleetClient`,
answering in the same shapes (server_ext/ENDPOINTS.md and the service's REST API), for tests and for demos
without a Hub.

It behaves like the real fleet in the ways the widgets show: starting a session takes its slots from the
keypair, project and domain quotas (and is refused past them, with the service's wording), a session that
fits the quota but not the free GPUs waits in the queue, stopping gives the slots back and starts what
waits, uploads grow a folder's usage and are refused past its limit, and a read-only folder refuses them.
Usage statistics (``my_usage``, ``usage_report``) add up the sessions' allocations over the time they ran,
a month of finished sessions included, and what they used of them (the running ones use what the fake's
readings say). ``fail`` makes every call raise, to show how a widget handles an unreachable service.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Callable, Iterable
from copy import deepcopy
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from labfleet.core.vocab import CHARGED_SLOTS, SESSION_TYPES, SLOT_NAMES

from .client import FleetError

GiB = 2**30
_CENT = Decimal("0.01")
_SERVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_FOLDER_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_LIVE = ("PENDING", "RUNNING")
USAGE_GROUPS = ("user", "project", "domain", "resource_group", "session")
USAGE_BUCKETS = {"15m": 900, "hour": 3600, "day": 86400, "none": None}
DEVICE_MEMORY = 80 * GiB


def _d(value: Any) -> Decimal:
    return Decimal(str(value))


def _json(amount: Decimal) -> int | float:
    return int(amount) if amount == amount.to_integral_value() else float(amount)


def _slots_json(slots: dict[str, Decimal]) -> dict[str, int | float]:
    return {k: _json(v) for k, v in sorted(slots.items())}


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _now() -> str:
    return _utcnow().isoformat()


def _parse_time(name: str, value: Any) -> datetime:
    """``start``/``end`` of a usage report: ISO 8601 (a naive time is UTC), or a FleetError 400."""
    if isinstance(value, datetime):
        t = value
    else:
        try:
            t = datetime.fromisoformat(str(value))
        except ValueError:
            raise FleetError(
                f"{name} must be an ISO 8601 time such as 2026-11-01T00:00:00Z, not {str(value)[:40]!r}", 400
            ) from None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _quota_slots(slots: dict[str, Decimal]) -> dict[str, Decimal]:
    """Slots as quotas count them: a whole device also counts as one gpu.shares."""
    out = dict(slots)
    if slots.get("gpu"):
        out["gpu.shares"] = out.get("gpu.shares", Decimal(0)) + slots["gpu"]
    return out


@dataclass
class Scope:
    """A keypair, project or domain: its limits (slots it does not name are unlimited)."""

    kind: str
    name: str
    limit: dict[str, Decimal] = field(default_factory=dict)


@dataclass
class FakeSession:
    id: str
    name: str
    project: str
    type: str
    image: str
    slots: dict[str, Decimal]
    status: str = "PENDING"
    devices: list[dict[str, Any]] = field(default_factory=list)
    created_at: str = field(default_factory=_now)
    command: str = ""
    user: str = ""  # "": the fake's own user
    started: datetime | None = None  # when it began to hold its slots (RUNNING)
    ended: datetime | None = None
    # The share of each held slot it used (cpu, mem, gpu.shares); None: the fleet's current readings.
    use: dict[str, float] | None = None


@dataclass
class FakeFolder:
    id: str
    name: str
    owner: str  # user:alice | project:acme/ml
    permission: str  # ro | rw | wd for the fake's user
    is_owner: bool
    max_size: int  # 0: unlimited
    usage_bytes: int = 0
    files: dict[str, int] = field(default_factory=dict)
    usage_mode: str = "general"
    host: str = "local"


class FakeFleet:
    """A small fleet: user ``alice`` of domain ``acme`` in projects ``acme/ml`` and ``acme/web``, two mock
    A100 GPUs, and a running session ``work`` (the one a notebook would run in) with half a GPU, started an
    hour and a half ago; five sessions of hers and three of colleagues (bob, carol) ended over the last month.

    Every method is a coroutine, like the real client's; ``delay`` seconds of ``asyncio.sleep`` make it
    answer as slowly as a network would.
    """

    def __init__(
        self,
        *,
        user: str = "alice",
        domain: str = "acme",
        delay: float = 0.0,
        admin: bool = False,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.username = user
        self.domain_name = domain
        self.delay = delay
        # A domain admin's usage report covers every user of the domain; a user's only their own rows.
        self.admin = admin
        # The time the statistics count up to (tests pass a stopped one; the month of history is laid
        # out before it at creation).
        self.clock: Callable[[], datetime] = clock or _utcnow
        self.fail: str | None = None  # set: every call raises FleetError(fail)
        self.calls: list[str] = []
        self.keypair = Scope("keypair", "AKFAKEFAKEFAKEFAKE01", {"cpu": _d(16), "mem": _d(64 * GiB)})
        self.domain = Scope("domain", domain, {"gpu.shares": _d(4)})
        self.projects = {
            f"{domain}/ml": Scope("project", f"{domain}/ml", {"gpu.shares": _d(2), "cpu": _d(8)}),
            f"{domain}/web": Scope("project", f"{domain}/web"),
        }
        self.devices = [
            {"uuid": f"GPU-fake-{i}", "index": i, "model": "A100-80GB", "memory": 80 * GiB} for i in range(2)
        ]
        self.images = [
            {"name": "local/host", "display_name": "Host Python", "min_slots": {}, "accelerators": []},
            {
                "name": "pytorch:2.3",
                "display_name": "PyTorch 2.3 (CUDA)",
                "min_slots": {"cpu": 1, "mem": GiB},
                "accelerators": ["cuda"],
            },
        ]
        self.resource_groups = [{"name": "default", "description": "", "session_types": list(SESSION_TYPES)}]
        self.all_sessions: list[FakeSession] = []
        self.folders: list[FakeFolder] = [
            FakeFolder(str(uuid.uuid4()), "data", f"user:{user}", "wd", True, GiB, 0),
            FakeFolder(str(uuid.uuid4()), "shared-ml", f"project:{domain}/ml", "rw", False, 10 * GiB, 0),
            FakeFolder(str(uuid.uuid4()), "results-of-bob", "user:bob", "ro", False, 0, 0),
        ]
        self.folder_count_limit = 5
        self.user_storage_limit = 4 * GiB
        # What the session's processes use now: tests and demos move these.
        self.cpu_percent = 12.5
        self.memory_used = 300 * 2**20
        self.gpu_utilization: int | None = 37
        self.gpu_memory_used = 2 * GiB
        self.current = self.add_session("work", {"project": f"{domain}/ml", "cpu": 1, "mem": GiB, "gpu": 0.5})
        # The notebook's session has run for a while; earlier sessions of this month have ended.
        self.current.started = self.clock() - timedelta(hours=1, minutes=30)
        self.current.created_at = self.current.started.isoformat()
        self._add_history()
        self.folders[0].files["readme.txt"] = 40 * 2**20
        self.folders[0].usage_bytes = 40 * 2**20

    def _add_history(self) -> None:
        """Finished sessions of the last month: the user's own, and two colleagues' in the domain."""
        now, dom = self.clock(), self.domain_name
        day = now.replace(hour=9, minute=0, second=0, microsecond=0)
        if day > now:
            day -= timedelta(days=1)
        past = [
            # user, name, project, days ago, hours, slots, share used of each
            ("", "prep", "web", 26, 3, {"cpu": 2, "mem": 4 * GiB}, {"cpu": 0.35, "mem": 0.5}),
            (
                "",
                "train-1",
                "ml",
                19,
                6,
                {"cpu": 4, "mem": 16 * GiB, "gpu": 1},
                {"cpu": 0.6, "mem": 0.7, "gpu.shares": 0.8},
            ),
            (
                "",
                "sweep",
                "ml",
                12,
                5,
                {"cpu": 2, "mem": 8 * GiB, "gpu.shares": 0.5},
                {"cpu": 0.4, "mem": 0.45, "gpu.shares": 0.55},
            ),
            (
                "",
                "finetune",
                "ml",
                4,
                4,
                {"cpu": 4, "mem": 16 * GiB, "gpu.shares": 0.5},
                {"cpu": 0.5, "mem": 0.6, "gpu.shares": 0.7},
            ),
            ("", "eda", "web", 2, 2, {"cpu": 1, "mem": 2 * GiB}, {"cpu": 0.25, "mem": 0.3}),
            (
                "bob",
                "bench",
                "ml",
                15,
                8,
                {"cpu": 8, "mem": 32 * GiB, "gpu": 1},
                {"cpu": 0.7, "mem": 0.5, "gpu.shares": 0.9},
            ),
            ("bob", "notebook", "web", 6, 3, {"cpu": 2, "mem": 4 * GiB}, {"cpu": 0.15, "mem": 0.4}),
            (
                "carol",
                "label",
                "ml",
                9,
                5,
                {"cpu": 2, "mem": 8 * GiB, "gpu.shares": 0.25},
                {"cpu": 0.3, "mem": 0.35, "gpu.shares": 0.2},
            ),
        ]
        for user, name, project, days_ago, hours, slots, use in past:
            started = day - timedelta(days=days_ago)
            s = FakeSession(
                str(uuid.uuid4()),
                name,
                f"{dom}/{project}",
                "interactive",
                "local/host",
                {k: _d(v) for k, v in slots.items()},
                status="TERMINATED",
                created_at=started.isoformat(),
                user=user,
                started=started,
                ended=started + timedelta(hours=hours),
                use=use,
            )
            self.all_sessions.append(s)

    @classmethod
    def demo(cls) -> FakeFleet:
        """The fleet the demo notebook shows, answering with a little latency."""
        return cls(delay=0.05)

    def __repr__(self) -> str:
        return f"FakeFleet(user={self.username!r})"

    async def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail:
            raise FleetError(self.fail, 502)

    # -- quotas -----------------------------------------------------------------------------------------

    def _live(self) -> list[FakeSession]:
        return [s for s in self.all_sessions if s.status in _LIVE and not s.user]

    def _used(self, scope: Scope) -> dict[str, Decimal]:
        out = dict.fromkeys(SLOT_NAMES, Decimal(0))
        for s in self._live():
            if scope.kind == "project" and s.project != scope.name:
                continue
            for k, v in _quota_slots(s.slots).items():
                out[k] = out.get(k, Decimal(0)) + v
        return out

    def _left(self, scope: Scope) -> dict[str, Decimal | None]:
        used = self._used(scope)
        return {
            k: (max(scope.limit[k] - used.get(k, Decimal(0)), Decimal(0)) if k in scope.limit else None)
            for k in SLOT_NAMES
        }

    def _quota_view(self, scope: Scope) -> dict[str, Any]:
        """As the service's ``/api/me`` reports a scope: ``left`` for the slots limited or in use."""
        left = self._left(scope)
        used = {k: v for k, v in self._used(scope).items() if v}
        return {
            "limit": _slots_json(scope.limit),
            "used": _slots_json(used),
            "left": {
                k: (None if left[k] is None else _json(left[k])) for k in sorted(set(scope.limit) | set(used))
            },
            "unspecified": "UNLIMITED",
        }

    def _refusal(self, scope: Scope, request: dict[str, Decimal]) -> str | None:
        label = {"keypair": "keypair", "project": "project", "domain": "domain"}[scope.kind]
        used = self._used(scope)
        parts = []
        for k, amount in _quota_slots(request).items():
            if k in scope.limit and used.get(k, 0) + amount > scope.limit[k]:
                text = f"{_json(used.get(k, 0) + amount)} of its {_json(scope.limit[k])} {k}"
                if used.get(k):
                    text += f" ({_json(used[k])} already in use)"
                parts.append(text)
        return f"{label} {scope.name} would use {' and '.join(parts)}" if parts else None

    def _project(self, ref: Any) -> Scope:
        if not isinstance(ref, str) or not ref:
            raise FleetError("choose a project", 400)
        full = ref if "/" in ref else f"{self.domain_name}/{ref}"
        if full not in self.projects:
            raise FleetError(f"you are not a member of project {full}", 403)
        return self.projects[full]

    # -- placement --------------------------------------------------------------------------------------

    def _free(self) -> dict[str, Decimal]:
        free = {d["uuid"]: Decimal(1) for d in self.devices}
        for s in self.all_sessions:
            if s.status == "RUNNING":
                for dev in s.devices:
                    free[dev["uuid"]] -= _d(dev["shares"])
        return free

    def _place(self, s: FakeSession) -> bool:
        free = self._free()
        by_uuid = {d["uuid"]: d for d in self.devices}
        if s.slots.get("gpu"):
            whole = [u for u, f in free.items() if f == 1][: int(s.slots["gpu"])]
            if len(whole) < s.slots["gpu"]:
                return False
            s.devices = [dict(by_uuid[u], shares=1.0) for u in whole]
        elif s.slots.get("gpu.shares"):
            fits = [u for u, f in free.items() if f >= s.slots["gpu.shares"]]
            if not fits:
                return False
            s.devices = [dict(by_uuid[fits[0]], shares=float(s.slots["gpu.shares"]))]
        s.status = "RUNNING"
        s.started = self.clock()
        return True

    def _serve_queue(self) -> None:
        for s in [s for s in self.all_sessions if s.status == "PENDING"]:
            self._place(s)

    def add_session(self, name: str, options: dict[str, Any]) -> FakeSession:
        """Admit a session as the service would (refusals raise FleetError); for tests and demos, e.g. a
        session started elsewhere."""
        if not isinstance(options, dict):
            raise FleetError("spawn options must be a JSON object", 400)
        project = self._project(options.get("project"))
        if name and not _SERVER_NAME.match(name):
            raise FleetError(f"invalid server name {name!r}", 400)
        if any(s.name == name for s in self._live()):
            raise FleetError(f"{self.username} already has a server named {name or '(default)'}", 400)
        stype = options.get("type") or "interactive"
        command = str(options.get("command") or "").strip()
        if stype not in SESSION_TYPES:
            raise FleetError(f"type must be one of {', '.join(SESSION_TYPES)}, not {stype!r}", 400)
        if stype != "interactive" and not command:
            raise FleetError(f"a {stype} session needs a command", 400)
        if stype == "interactive" and command:
            raise FleetError("an interactive session takes no command (choose type batch or inference)", 400)
        slots: dict[str, Decimal] = {}
        for key in ("cpu", "mem"):
            if options.get(key) not in (None, ""):
                slots[key] = _d(options[key])
        gpu = _d(options.get("gpu") or 0)
        if gpu < 0 or gpu != gpu.quantize(_CENT):
            raise FleetError(f"gpu takes steps of 0.01, not {options.get('gpu')}", 400)
        if gpu > 1 and gpu != gpu.to_integral_value():
            raise FleetError("more than one GPU comes in whole devices (1, 2, ...), not fractions", 400)
        if gpu:
            slots["gpu" if gpu == gpu.to_integral_value() else "gpu.shares"] = gpu.normalize()
        images = [i["name"] for i in self.images]
        image = options.get("image") or "local/host"
        if image not in images:
            raise FleetError(f"image {image} is not registered", 403)
        for scope in (self.keypair, project, self.domain):
            why = self._refusal(scope, slots)
            if why:
                raise FleetError(why, 409)
        s = FakeSession(str(uuid.uuid4()), name, project.name, stype, image, slots, command=command)
        self.all_sessions.append(s)
        self._place(s)
        return s

    def _session_view(self, s: FakeSession) -> dict[str, Any]:
        pending = [x for x in self.all_sessions if x.status == "PENDING"]
        base = f"/user/{self.username}/{s.name}/" if s.name else f"/user/{self.username}/"
        return {
            "id": s.id,
            "name": s.name,
            "user": self.username,
            "project": s.project,
            "type": s.type,
            "image": s.image,
            "status": s.status,
            "status_reason": "waiting for a free GPU" if s.status == "PENDING" else None,
            "queue_position": pending.index(s) + 1 if s in pending else None,
            "slots": _slots_json(s.slots),
            "devices": deepcopy(s.devices),
            "created_at": s.created_at,
            "url": base + "lab" if s.status == "RUNNING" else None,
            "current": s is self.current,
        }

    # -- the client's methods ---------------------------------------------------------------------------

    async def user(self) -> str:
        await self._call("user")
        return self.username

    async def session(self) -> dict[str, Any]:
        await self._call("session")
        view = self._session_view(self.current)
        view.update(domain=self.domain_name, resource_group="default", node="node-1")
        return view

    async def usage(self) -> dict[str, Any]:
        await self._call("usage")
        s = self.current
        gpus = []
        for dev in s.devices:
            share = _d(dev["shares"])
            gpus.append(
                {
                    "uuid": dev["uuid"],
                    "index": dev["index"],
                    "model": dev["model"],
                    "shares": float(share),
                    "utilization": self.gpu_utilization,
                    "memory_used": self.gpu_memory_used,
                    "memory_total": dev["memory"],
                    "memory_limit": int(dev["memory"] * share),
                    "source": "mock",
                }
            )
        return {
            "at": _now(),
            "cpu": {"percent": self.cpu_percent, "limit": _json(s.slots.get("cpu", Decimal(1)))},
            "memory": {"used": self.memory_used, "limit": _json(s.slots.get("mem", Decimal(0))) or None},
            "gpus": gpus,
        }

    async def quota(self) -> dict[str, Any]:
        await self._call("quota")
        project = self.projects[self.current.project]
        return {
            "keypair": self._quota_view(self.keypair),
            "project": self._quota_view(project),
            "project_name": project.name,
            "domain": self._quota_view(self.domain),
            "domain_name": self.domain_name,
            "projects": {name: self._quota_view(p) for name, p in sorted(self.projects.items())},
        }

    async def sessions(self) -> list[dict[str, Any]]:
        await self._call("sessions")
        return [self._session_view(s) for s in self._live()]

    async def start_session(self, name: str, options: dict[str, Any]) -> dict[str, Any]:
        """Answers as the session's endpoint does: the Hub's status, 201 (running) or 202 (starting)."""
        await self._call("start_session")
        s = self.add_session(name, options)
        return {"name": name, "status": 201 if s.status == "RUNNING" else 202}

    async def stop_session(self, name: str) -> dict[str, Any]:
        await self._call("stop_session")
        for s in self._live():
            if s.name == name:
                if s.status == "RUNNING":
                    s.use = self._use(s)  # what it used until now stays in the statistics
                s.status = "TERMINATED"
                s.ended = self.clock()
                s.devices = []
                self._serve_queue()
                return {"name": name, "status": 204}
        raise FleetError(f"you have no session named {name or '(default)'}", 404)

    async def launch_options(self) -> dict[str, Any]:
        await self._call("launch_options")
        kp, dom = self._left(self.keypair), self._left(self.domain)
        projects = []
        for name, scope in sorted(self.projects.items()):
            pl = self._left(scope)
            left: dict[str, Any] = {}
            for k in SLOT_NAMES:
                amounts = [a for a in (kp[k], dom[k], pl[k]) if a is not None]
                left[k] = _json(min(amounts)) if amounts else None
            projects.append({"name": name, "left": left})
        names = [p["name"] for p in projects]
        return {
            "user": self.username,
            "projects": projects,
            "images": [dict(i, projects=names) for i in self.images],
            "resource_groups": deepcopy(self.resource_groups),
            "vfolders": [
                {
                    "id": f.id,
                    "name": f.name,
                    "owner": f.owner,
                    "permission": f.permission,
                    "usage_mode": f.usage_mode,
                    "host": f.host,
                    "auto": f.name.startswith("."),
                    "mountable": True,
                }
                for f in self.folders
            ],
        }

    # -- folders ----------------------------------------------------------------------------------------

    def _folder_view(self, f: FakeFolder) -> dict[str, Any]:
        kind, _, owner_name = f.owner.partition(":")
        mine = [x for x in self.folders if x.owner == f.owner]
        return {
            "id": f.id,
            "name": f.name,
            "host": f.host,
            "owner": f.owner,
            "owner_kind": kind,
            "domain": self.domain_name,
            "usage_mode": f.usage_mode,
            "permission": f.permission,
            "is_owner": f.is_owner,
            "can_manage": f.is_owner,
            "status": "READY",
            "usage": {"bytes": f.usage_bytes, "files": len(f.files), "trash_bytes": 0, "scanned_at": None},
            "limits": {
                "max_size": f.max_size,
                "scope": {
                    "kind": kind,
                    "name": owner_name,
                    "used": sum(x.usage_bytes for x in mine),
                    "limit": self.user_storage_limit if kind == "user" else 0,
                    "folders": len(mine),
                    "max_folders": self.folder_count_limit if kind == "user" else 0,
                },
            },
        }

    async def vfolders(self) -> list[dict[str, Any]]:
        await self._call("vfolders")
        return [self._folder_view(f) for f in sorted(self.folders, key=lambda f: f.name)]

    async def create_vfolder(self, name: str, **fields: Any) -> dict[str, Any]:
        await self._call("create_vfolder")
        if not isinstance(name, str) or not _FOLDER_NAME.match(name) or name in (".", ".."):
            raise FleetError(
                f"{str(name)[:70]!r} is not a folder name (up to 64 letters, digits, '.', '_' or '-')", 400
            )
        owner = f"user:{self.username}"
        mine = [f for f in self.folders if f.owner == owner]
        if any(f.name == name for f in mine):
            raise FleetError(f"you already have a folder named {name} (perhaps in the trash)", 409)
        if len(mine) >= self.folder_count_limit:
            raise FleetError(
                f"you already have {len(mine)} folder(s), the most policy default allows "
                "(folders in the trash count until purged)",
                409,
            )
        f = FakeFolder(str(uuid.uuid4()), name, owner, "wd", True, int(fields.get("max_size") or 0))
        self.folders.append(f)
        return self._folder_view(f)

    async def upload(self, folder_id: str, path: str, data: bytes) -> dict[str, Any]:
        await self._call("upload")
        f = next((x for x in self.folders if x.id == folder_id), None)
        if f is None:
            raise FleetError(f"no vfolder {folder_id!r}", 404)
        if f.permission not in ("rw", "wd"):
            raise FleetError(f"vfolder {f.name} is shared with you {f.permission}; this needs rw", 403)
        path = path.lstrip("/")
        if not path or any(part in ("", ".", "..") for part in path.split("/")):
            raise FleetError(f"{path!r} is not a path inside the folder", 400)
        size = len(data)
        grows = size - f.files.get(path, 0)
        scope_used = sum(x.usage_bytes for x in self.folders if x.owner == f.owner)
        rooms = [(f"vfolder {f.name}", f.usage_bytes, f.max_size)]
        if f.owner.startswith("user:"):
            rooms.append((f"the quota of user {f.owner[5:]}", scope_used, self.user_storage_limit))
        for what, used, limit in rooms:
            if limit and used + grows > limit:
                raise FleetError(
                    f"{size} bytes do not fit in {what}: {used} used, 0 reserved by uploads in progress, "
                    f"limit {limit} ({max(0, limit - used)} free)",
                    413,
                )
        f.files[path] = size
        f.usage_bytes += grows
        return {"name": path.rsplit("/", 1)[-1], "path": path, "type": "file", "size": size, "mtime": 0}

    # -- usage statistics -------------------------------------------------------------------------------

    def _held(self, s: FakeSession) -> dict[str, float]:
        """What a session holds per second, as the statistics count it (one core when it named none)."""
        q = _quota_slots(s.slots)
        return {
            "cpu": float(q.get("cpu", Decimal(1))),
            "mem": float(q.get("mem", Decimal(0))),
            "gpu.shares": float(q.get("gpu.shares", Decimal(0))),
        }

    def _use(self, s: FakeSession) -> dict[str, float]:
        """The share of each held slot a session uses: a finished one's record, else the fleet's readings."""
        if s.use is not None:
            return s.use
        held = self._held(s)
        return {
            "cpu": min(self.cpu_percent / 100.0 / held["cpu"], 1.0) if held["cpu"] else 0.0,
            "mem": min(self.memory_used / held["mem"], 1.0) if held["mem"] else 0.0,
            "gpu.shares": (self.gpu_utilization or 0) / 100.0 if held["gpu.shares"] else 0.0,
        }

    def _seconds(self, s: FakeSession, start: datetime, end: datetime) -> float:
        """How long within [start, end) the session held its slots."""
        if s.started is None:
            return 0.0
        lo = max(s.started, start)
        hi = min(s.ended or self.clock(), end, self.clock())
        return max((hi - lo).total_seconds(), 0.0)

    def _figures(self, sessions: Iterable[FakeSession], start: datetime, end: datetime) -> dict[str, Any]:
        """sessions, allocated, used (with the peaks) and efficiency over [start, end), as the API has them."""
        allocated = dict.fromkeys(CHARGED_SLOTS, 0.0)
        used: dict[str, float] = dict.fromkeys(CHARGED_SLOTS, 0.0)
        mem_peak = gpu_mem_peak = 0
        count = 0
        for s in sessions:
            secs = self._seconds(s, start, end)
            if secs <= 0:
                continue
            count += 1
            held, use = self._held(s), self._use(s)
            for k in CHARGED_SLOTS:
                allocated[k] += held[k] * secs
                used[k] += held[k] * secs * use.get(k, 0.0)
            mem_peak = max(mem_peak, int(held["mem"] * use.get("mem", 0.0)))
            if held["gpu.shares"]:
                live = s.use is None
                gpu_mem = (
                    self.gpu_memory_used
                    if live
                    else int(DEVICE_MEMORY * held["gpu.shares"] * use["gpu.shares"])
                )
                gpu_mem_peak = max(gpu_mem_peak, gpu_mem)
        return {
            "sessions": count,
            "allocated": {k: round(v, 3) for k, v in allocated.items()},
            "used": {
                **{k: round(v, 3) for k, v in used.items()},
                "mem_peak": mem_peak,
                "gpu_mem_peak": gpu_mem_peak,
            },
            "efficiency": {
                k: round(used[k] / allocated[k], 4) if allocated[k] else None for k in CHARGED_SLOTS
            },
        }

    def _visible(self) -> list[FakeSession]:
        """The sessions whose usage the fake's user may see: their own, everyone's in the domain for an admin."""
        return [s for s in self.all_sessions if self.admin or not s.user]

    async def my_usage(self) -> dict[str, Any]:
        """``GET /api/usage/me``: my last 7 and 30 days and this month, and the last 30 days one by one."""
        await self._call("my_usage")
        now = self.clock()
        mine = [s for s in self.all_sessions if not s.user]
        month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        periods = []
        for key, label, start in (
            ("7d", "last 7 days", now - timedelta(days=7)),
            ("30d", "last 30 days", now - timedelta(days=30)),
            ("month", f"{now:%B %Y}", month),
        ):
            periods.append(
                {"key": key, "label": label, "start": start.isoformat(), "end": now.isoformat()}
                | self._figures(mine, start, now)
            )
        today = now.replace(hour=0, minute=0, second=0, microsecond=0)
        daily = []
        for i in range(29, -1, -1):
            day = today - timedelta(days=i)
            daily.append({"bucket": day.isoformat()} | self._figures(mine, day, day + timedelta(days=1)))
        return {"user": self.username, "now": now.isoformat(), "periods": periods, "daily": daily}

    def _group_key(self, s: FakeSession, group_by: str) -> str:
        return {
            "user": s.user or self.username,
            "project": s.project,
            "domain": self.domain_name,
            "resource_group": "default",
            "session": s.id,
        }[group_by]

    async def usage_report(
        self,
        group_by: str = "user",
        start: datetime | str | None = None,
        end: datetime | str | None = None,
        bucket: str = "none",
    ) -> dict[str, Any]:
        """``GET /api/usage``: one row per group (and per bucket), of the sessions this user may see; by
        default over the last 30 days."""
        await self._call("usage_report")
        if group_by not in USAGE_GROUPS:
            raise FleetError(f"group_by must be one of {', '.join(USAGE_GROUPS)}, not {group_by!r}", 400)
        if bucket not in USAGE_BUCKETS:
            raise FleetError(f"bucket must be one of {', '.join(USAGE_BUCKETS)}, not {bucket!r}", 400)
        t1 = self.clock() if end is None else _parse_time("end", end)
        t0 = t1 - timedelta(days=30) if start is None else _parse_time("start", start)
        if t0 >= t1:
            raise FleetError("end must be after start", 400)
        step = USAGE_BUCKETS[bucket]
        if step is None:
            windows: list[tuple[datetime | None, datetime, datetime]] = [(None, t0, t1)]
        else:
            epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
            first = epoch + timedelta(seconds=(t0 - epoch).total_seconds() // step * step)
            windows = []
            b = first
            while b < t1:
                windows.append((b, max(b, t0), min(b + timedelta(seconds=step), t1)))
                b += timedelta(seconds=step)
        groups: dict[str, list[FakeSession]] = {}
        for s in self._visible():
            groups.setdefault(self._group_key(s, group_by), []).append(s)
        rows = []
        for key in sorted(groups):
            for b, lo, hi in windows:
                fig = self._figures(groups[key], lo, hi)
                if fig["sessions"]:
                    rows.append({group_by: key, "bucket": None if b is None else b.isoformat()} | fig)
        return {
            "group_by": group_by,
            "start": t0.isoformat(),
            "end": t1.isoformat(),
            "bucket": bucket,
            "rows": rows,
        }
