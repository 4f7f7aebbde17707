"""Import & Run: a notebook, a git repository or an archive by URL, into a virtual folder.

An import is planned in the request (every refusal there: the URL, the host, the project, the
folder, the quota left; nothing is created), then runs in the background, as a job the user polls:

1. **fetch** into a staging directory on the folder's storage host, outside every folder: a
   repository is cloned with its history (:mod:`labfleet.storage.gitops`), a file downloaded with
   the host pinned to the checked addresses; both bounded in time and in bytes (the room left);
2. **write**: the folder is made when it is new (the user's, named after what was imported), the
   staged files handed to its owner and moved in; nothing of the user's is replaced (a file in the
   way is kept and reported);
3. **re-sync**: a repository already there (the same link followed again) is updated with
   nbgitpuller's rules, in a sandbox as the folder's owner: the user's edits win, an untracked file
   in the way of a new upstream file is renamed, a file the user deleted comes back; the report
   says what was updated, kept and renamed.

The job says where it is (``status``), the folder and the path to open, and why it failed; the
Hub's import page then starts or picks a session (an ordinary spawn: quotas, queue and all).
Audited as ``import.run``, without credentials.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import os
import posixpath
import secrets
import shutil
import socket
import ssl
import stat
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import select
from sqlalchemy.orm import Session

from labfleet.core import audit, database
from labfleet.core.authz import Actor
from labfleet.core.errors import Conflict, Forbidden, InvalidInput, LabfleetError, NotFound
from labfleet.core.models import Domain, Project, User, VFolder
from labfleet.core.secretbox import SecretBox
from labfleet.core.validate import check_fields, check_text, parse_project_ref

from . import gitops, hosts, importcreds, vfolders, vfquota
from .importsafety import (
    AllowList,
    Member,
    Resolver,
    Source,
    check_domain_hosts,
    check_members,
    check_url,
    member_path,
    resolve,
)
from .store import FolderStore, check_relpath

FIELDS = ("url", "folder", "branch", "open", "project", "image", "gpu", "resource_group")
SESSION_FIELDS = ("project", "image", "gpu", "resource_group")
STATUSES = ("fetching", "writing", "done", "failed")
STAGING = ".labfleet-imports"  # on each storage host, beside the folders: the service's own
DEFAULT_MAX_BYTES = 5 << 30  # when no quota bounds a folder
MAX_ARCHIVE_MEMBERS = 100_000
KEEP_JOBS = 200  # finished jobs remembered per service


@dataclass(frozen=True)
class Plan:
    """What an import will do, decided before anything is fetched."""

    source: Source
    username: str
    user_id: int
    folder_id: str | None  # None: a new folder of the user's, named folder_name
    folder_name: str
    host: str
    host_path: str
    owner: tuple[int, int] | None
    target: str  # where it lands in the folder ("" = the folder itself)
    open_path: str  # what a session opens, relative to the folder
    resync: bool  # a checkout is there already: update it
    branch: str | None
    room: int  # bytes the fetch may write
    session: dict[str, Any]
    credential: tuple[str, str] | None = field(default=None, repr=False)


@dataclass
class Job:
    id: str
    username: str
    plan: Plan
    status: str = "fetching"
    message: str = ""
    report: dict[str, list[str]] = field(default_factory=lambda: {"updated": [], "kept": [], "renamed": []})
    folder_id: str | None = None
    created: float = field(default_factory=time.time)
    finished: float | None = None

    def view(self) -> dict[str, Any]:
        p = self.plan
        return {
            "id": self.id,
            "url": p.source.url,
            "kind": p.source.kind,
            "status": self.status,
            "message": self.message,
            "folder": {"id": self.folder_id or p.folder_id, "name": p.folder_name},
            "path": p.open_path,
            "resync": p.resync,
            "report": self.report,
            "session": p.session,
            "created_at": _iso(self.created),
            "finished_at": _iso(self.finished) if self.finished else None,
        }


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


# ---------------------------------------------------------------- planning (in the request)


def _session_options(db: Session, user: User, body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("image", "resource_group"):
        if body.get(name) is not None:
            out[name] = check_text(body[name], name, 200)
    if body.get("gpu") is not None:
        gpu = body["gpu"]
        if isinstance(gpu, bool) or not isinstance(gpu, (int, float, str)):
            raise InvalidInput("gpu must be a number of GPUs, such as 0.5 or 1")
        try:
            amount = float(gpu)
        except ValueError:
            raise InvalidInput("gpu must be a number of GPUs, such as 0.5 or 1") from None
        if not 0 <= amount <= 64:
            raise InvalidInput("gpu must be between 0 and 64")
        out["gpu"] = amount
    if body.get("project") is not None:
        dname, pname = parse_project_ref(body["project"], user.domain.name)
        project = db.scalar(select(Project).join(Domain).where(Domain.name == dname, Project.name == pname))
        if project is None or user not in project.members:
            raise NotFound(f"no project {dname}/{pname} of yours")
        out["project"] = project.full_name
    return out


def _find_folder(db: Session, actor: Actor, user: User, ref: str) -> tuple[VFolder, vfolders.Access] | None:
    """The folder named ``ref`` (the user's own first) or with id ``ref``, if the user writes it."""
    if vfolders.UUID_RE.match(ref):
        v, acc = vfolders.readable(db, actor, ref)
    else:
        vfolders.check_folder_name(ref, "folder")
        hits = [(v, a) for v, a in vfolders.list_folders(db, actor, {"status": "READY"}) if v.name == ref]
        own = [h for h in hits if h[0].user_id == user.id]
        hits = own or hits
        if not hits:
            return None
        if len(hits) > 1:
            raise InvalidInput(f"several folders are named {ref}: give the id of the one to import into")
        v, acc = hits[0]
    if not acc.at_least("rw"):
        raise Forbidden(f"you may not write to folder {v.name}")
    vfolders.need_ready(v)
    return v, acc


def _room_new(db: Session, user: User) -> int:
    """Bytes a new folder of the user may take: the folder limit and what the user's scope has left."""
    pol = user.resource_policy
    limits = [DEFAULT_MAX_BYTES]
    if pol is not None and pol.max_vfolder_size:
        limits.append(pol.max_vfolder_size)
    if pol is not None and pol.max_quota_scope_size:
        used = sum(v.usage_bytes for v in db.scalars(select(VFolder).where(VFolder.user_id == user.id)))
        limits.append(max(0, pol.max_quota_scope_size - used))
    return min(limits)


def _room_of(db: Session, v: VFolder) -> int:
    left = [DEFAULT_MAX_BYTES]
    for r in vfquota.rooms(db, v):
        if r.limit:
            left.append(max(0, r.limit - r.used - r.reserved))
    return min(left)


def plan(
    db: Session,
    actor: Actor,
    body: Any,
    *,
    allowed: AllowList,
    default_host: str | None,
    box: SecretBox,
    resolver: Resolver = resolve,
) -> Plan:
    """Check an import request and decide what it does; a refusal (4xx) creates nothing."""
    body = check_fields(body, required=["url"], optional=list(FIELDS))
    if actor.role == "monitor":
        raise Forbidden("monitors read; they import nothing")
    user = vfolders.actor_user(db, actor)
    if user is None:
        raise Forbidden("an import writes into a user's folder: sign in as a user")
    source = check_url(body["url"], allowed, resolver)
    check_domain_hosts(source.host, user.domain.import_hosts, user.domain.name)
    branch = gitops.check_branch(body.get("branch"))
    if branch and source.kind != "repository":
        raise InvalidInput("branch is for repositories")
    session = _session_options(db, user, body)
    named = body.get("folder") not in (None, "")
    found = (
        _find_folder(db, actor, user, body["folder"]) if named else _find_folder(db, actor, user, source.name)
    )
    if found is None:
        name = vfolders.check_folder_name(body["folder"] if named else source.name, "folder")
        host_name = default_host
        if host_name is None:
            raise InvalidInput("the service has no default storage host for a new folder")
        host = hosts.get_host(db, host_name)
        hosts.need_right(hosts.rights_for(actor, user, host, None), "create-vfolder", host)
        vfquota.check_count(db, user, None)
        folder_id, room, v = None, _room_new(db, user), None
    else:
        v, _ = found
        name, host, folder_id, room = v.name, v.host, v.id, _room_of(db, v)
    if room <= 0:
        raise vfquota.QuotaExceeded(f"folder {name} has no room left for an import")
    base = source.name
    if source.kind == "notebook":
        base = posixpath.basename(urlsplit(source.url).path)
        if not base or base.startswith("."):
            base = source.name + ".ipynb"
        target = base
    else:
        target = base if named else ""
    resync = False
    if v is not None and source.kind == "repository":
        target, resync = _repository_target(v, target, base, named)
    opened = body.get("open")
    open_path = target
    if opened not in (None, ""):
        rel = check_relpath(check_text(opened, "open", 1000))
        open_path = posixpath.join(target, rel) if target else rel
    credential = importcreds.for_host(db, user, source.host, box)
    owner = vfolders.host_owner(host)
    return Plan(
        source=source,
        username=user.username,
        user_id=user.id,
        folder_id=folder_id,
        folder_name=name,
        host=host.name,
        host_path=host.path,
        owner=owner,
        target=target,
        open_path=open_path,
        resync=resync,
        branch=branch,
        room=room,
        session=session,
        credential=credential,
    )


def _repository_target(v: VFolder, target: str, base: str, named: bool) -> tuple[str, bool]:
    """Where a repository goes in an existing folder, and whether a checkout is there to update."""
    store = vfolders.store_of(v)
    for rel in [target] if target else ["", base]:
        try:
            fd = store.open_dir(rel)
        except LabfleetError:
            return rel, False  # nothing there yet: a fresh clone
        try:
            try:
                st = os.stat(".git", dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if rel == "" and not os.listdir(fd):
                    return "", False  # an empty folder named after the repository
                continue
            if stat.S_ISDIR(st.st_mode):
                return rel, True
            raise Conflict(f"{posixpath.join(v.name, rel, '.git')} is not a directory: cannot update it")
        finally:
            os.close(fd)
    raise Conflict(
        f"{v.name}/{target or base} exists and is not a checkout of a repository: name another folder"
    )


# ---------------------------------------------------------------- fetching (in a thread)


def fetch(p: Plan, staging: str, timeout: float) -> str:
    """Fetch the source into ``staging``: the path of what was staged (a file or a tree)."""
    if p.source.kind == "repository":
        return _clone(p, staging, timeout, bare=p.resync)
    path = os.path.join(staging, "download")
    _download(p, path, timeout)
    if p.source.kind == "notebook":
        return path
    out = os.path.join(staging, "unpacked")
    os.mkdir(out, 0o700)
    _unpack(path, out, p.room)
    os.unlink(path)
    return out


def _clone(p: Plan, staging: str, timeout: float, *, bare: bool) -> str:
    dest = os.path.join(staging, "upstream.git" if bare else "repo")
    askpass = gitops.write_askpass(staging) if p.credential else None
    env = gitops.network_env(os.path.join(staging, "home"), askpass, p.credential)
    os.mkdir(env["HOME"], 0o700)
    pin = gitops.pin_of(p.source.url, p.source.addresses)
    argv = gitops.clone_argv(p.source.url, dest, pin, bare=bare, branch=p.branch)
    gitops.run_watched(
        argv,
        env,
        watch=dest,
        max_bytes=p.room,
        timeout=timeout,
        secrets=[p.credential[1]] if p.credential else (),
    )
    return dest


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, host: str, address: str, port: int, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, host: str, address: str, port: int, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._address = address

    def connect(self) -> None:
        raw = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(raw, server_hostname=self.host)  # type: ignore[attr-defined]


def _download(p: Plan, path: str, timeout: float) -> None:
    """GET the URL from the checked address (no redirect followed), at most ``p.room`` bytes."""
    parts = urlsplit(p.source.url)
    if parts.scheme not in ("http", "https"):
        raise InvalidInput(f"a {p.source.kind} is fetched over http or https, not {parts.scheme}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    cls = _PinnedHTTPS if parts.scheme == "https" else _PinnedHTTP
    conn = cls(p.source.host, p.source.addresses[0], port, timeout)
    headers = {"User-Agent": "labfleet-import", "Accept": "*/*"}
    if p.credential:
        pair = f"{p.credential[0]}:{p.credential[1]}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
    started = time.monotonic()
    try:
        conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), headers=headers)
        resp = conn.getresponse()
        if 300 <= resp.status < 400:
            raise gitops.ImportFailed(
                f"the server redirects to {resp.getheader('Location', '?')[:300]}: import that address instead"
            )
        if resp.status in (401, 403):
            raise gitops.ImportFailed("the server refused access: store your credential for its host")
        if resp.status != 200:
            raise gitops.ImportFailed(f"the server answered {resp.status} {resp.reason}")
        size = 0
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            while chunk := resp.read(1 << 16):
                size += len(chunk)
                if size > p.room:
                    raise gitops.TooLarge(
                        f"the file is larger than {p.room} bytes, the room left in the folder"
                    )
                if time.monotonic() - started > timeout:
                    raise gitops.TooSlow(f"the download took longer than {int(timeout)} s and was stopped")
                f.write(chunk)
    except (OSError, http.client.HTTPException) as e:
        raise gitops.ImportFailed(
            f"could not fetch {p.source.host}: {getattr(e, 'strerror', None) or e}"
        ) from None
    finally:
        conn.close()


def _unpack(archive: str, out: str, room: int) -> None:
    """Unpack after every member passed (paths, kinds, total size); nothing written otherwise."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            infos = z.infolist()
            members = [Member(i.filename, _zip_type(i)) for i in infos[: MAX_ARCHIVE_MEMBERS + 1]]
            _check_archive(members, sum(i.file_size for i in infos), room)
            for info, rel in zip(infos, [member_path(m) for m in members], strict=True):
                if rel is None:
                    continue
                if info.is_dir():
                    os.makedirs(os.path.join(out, rel), 0o755, exist_ok=True)
                    continue
                _write_member(out, rel, z.open(info))
        return
    try:
        t = tarfile.open(archive, "r:*")
    except tarfile.TarError:
        raise InvalidInput("the file is neither a zip nor a tar archive") from None
    with t:
        entries = t.getmembers()[: MAX_ARCHIVE_MEMBERS + 1]
        members = [Member(e.name, _tar_type(e)) for e in entries]
        _check_archive(members, sum(e.size for e in entries if e.isfile()), room)
        for entry, rel in zip(entries, [member_path(m) for m in members], strict=True):
            if rel is None:
                continue
            if entry.isdir():
                os.makedirs(os.path.join(out, rel), 0o755, exist_ok=True)
                continue
            f = t.extractfile(entry)
            if f is not None:
                _write_member(out, rel, f)


def _check_archive(members: list[Member], total: int, room: int) -> None:
    if len(members) > MAX_ARCHIVE_MEMBERS:
        raise InvalidInput(f"the archive has more than {MAX_ARCHIVE_MEMBERS} members")
    check_members(members)
    if total > room:
        raise gitops.TooLarge(
            f"the archive unpacks to {total} bytes: more than the {room} left in the folder"
        )


def _zip_type(i: zipfile.ZipInfo) -> str:
    mode = (i.external_attr >> 16) & 0o170000
    if i.is_dir():
        return "dir"
    if mode and not stat.S_ISREG(mode):
        return "symlink" if stat.S_ISLNK(mode) else "device"
    return "file"


def _tar_type(i: tarfile.TarInfo) -> str:
    if i.isdir():
        return "dir"
    if i.issym():
        return "symlink"
    if i.islnk():
        return "hardlink"
    if i.isfile():
        return "file"
    return "fifo" if i.isfifo() else "device"


def _write_member(out: str, rel: str, src) -> None:
    path = os.path.join(out, rel)
    os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f, src:
        shutil.copyfileobj(src, f, 1 << 16)


# ---------------------------------------------------------------- writing into the folder


def _stage_owner(p: Plan, path: str) -> None:
    if p.owner is not None and os.geteuid() == 0:
        gitops.chown_tree(path, *p.owner)
    for top, dirs, files in os.walk(path):  # the session writes what it got, as in an upload
        for name in dirs:
            os.chmod(os.path.join(top, name), 0o775)
        for name in files:
            full = os.path.join(top, name)
            if not os.path.islink(full):
                os.chmod(full, 0o664 if not os.access(full, os.X_OK) else 0o775)
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, 0o775)


def place(p: Plan, store: FolderStore, staged: str) -> dict[str, list[str]]:
    """Move the staged files into the folder; what is there already is kept (and reported)."""
    report: dict[str, list[str]] = {"updated": [], "kept": [], "renamed": []}
    _stage_owner(p, staged)
    parent, name = os.path.split(staged)
    pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        if p.source.kind == "repository":
            _place_tree_whole(store, pfd, name, p.target, report)
        elif p.source.kind == "notebook":
            (report["updated"] if store.place(pfd, name, p.target) else report["kept"]).append(p.target)
        else:
            _place_files(store, staged, p.target, report)
    finally:
        os.close(pfd)
    return report


def _place_tree_whole(store, pfd: int, name: str, target: str, report: dict[str, list[str]]) -> None:
    if target:
        (report["updated"] if store.place(pfd, name, target) else report["kept"]).append(target)
        return
    sfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=pfd)
    try:
        for entry in sorted(os.listdir(sfd)):
            (report["updated"] if store.place(sfd, entry, entry) else report["kept"]).append(entry)
    finally:
        os.close(sfd)


def _place_files(store, staged: str, target: str, report: dict[str, list[str]]) -> None:
    """An archive merged file by file: a file of the user's in the way is kept."""
    for top, _dirs, files in os.walk(staged):
        rel_top = os.path.relpath(top, staged)
        tfd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            for name in sorted(files):
                rel = posixpath.normpath(posixpath.join(target, rel_top, name)).lstrip("./") or name
                (report["updated"] if store.place(tfd, name, rel) else report["kept"]).append(rel)
        finally:
            os.close(tfd)


# ---------------------------------------------------------------- re-sync (nbgitpuller's rules)


def resync(p: Plan, store: FolderStore, upstream: str) -> dict[str, list[str]]:
    """Update the checkout at ``p.target`` from the staged bare repository ``upstream``.

    Every command runs in the sandbox (:func:`labfleet.storage.gitops.sandbox_argv`), renames of
    the user's files too: a path in the checkout may hold links the service must not follow."""
    if p.owner is not None and os.geteuid() == 0:
        gitops.chown_tree(upstream, *p.owner)
    branch = p.branch or _default_branch(upstream)
    fd = store.open_dir(p.target)
    root = os.geteuid() == 0
    uid, gid = p.owner if p.owner is not None else (None, None)

    def run(argv: list[str]) -> tuple[int, str, str]:
        return gitops.run_in_checkout(
            gitops.sandbox_argv(f"/proc/self/fd/{fd}", upstream, argv, uid=uid, gid=gid, root=root), fd
        )

    def git(*args: str, ok: tuple[int, ...] = (0,)) -> str:
        code, out, err = run(["git", *args])
        if code not in ok:
            step = next(
                a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] != "-c")
            )
            raise gitops.ImportFailed(
                f"updating the checkout failed at `git {step}`: {gitops.explain(err or out)}"
            )
        return out

    report: dict[str, list[str]] = {"updated": [], "kept": [], "renamed": []}
    remote = f"refs/remotes/origin/{branch}"
    try:
        git("-c", "protocol.file.allow=always", "-c", "safe.directory=*", "fetch", "--no-tags", "--quiet",
            gitops.UPSTREAM, f"+refs/heads/{branch}:{remote}")  # fmt: skip
        changed = _name_status(git("diff", "--name-status", "-z", "HEAD", remote))
        modified = _changed_by_user(git("status", "--porcelain=v1", "-z", "--untracked-files=no"))
        stamp = time.strftime("__%Y%m%d%H%M%S")
        for path in changed.get("A", []):  # a file of the user's in the way of a new upstream file
            if run(["stat", "--", path])[0] == 0:
                head, tail = posixpath.split(path)
                stem, ext = posixpath.splitext(tail)
                new = posixpath.join(head, f"{stem}{stamp}{ext}")
                if run(["mv", "-n", "--", path, new])[0] != 0:
                    raise gitops.ImportFailed(f"could not move {path} out of the way of the update")
                report["renamed"].append(f"{path} -> {new}")
        for path in [x for x in git("ls-files", "--deleted", "-z").split("\0") if x]:
            git("checkout", "HEAD" if path in changed.get("D", []) else remote, "--", path)
        git("reset", "--mixed", "--quiet")
        if run(["git", "diff-files", "--quiet"])[0] != 0:
            git(*gitops.BOT, "commit", "-aqm", "Your edits, kept by labfleet's import", "--allow-empty")
        out = git(*gitops.BOT, "merge", "-Xours", "--no-edit", remote, ok=(0, 1))
        if "CONFLICT (modify/delete)" in out:
            git(*gitops.BOT, "commit", "-aqm", "Your edits, kept by labfleet's import", "--allow-empty")
        elif "CONFLICT" in out or "Automatic merge failed" in out:
            raise gitops.ImportFailed(
                "the update could not be merged with your changes: " + gitops.explain(out)
            )
    finally:
        os.close(fd)
    report["updated"] = sorted({x for k in ("A", "M", "D") for x in changed.get(k, [])})
    report["kept"] = sorted(set(modified))
    return report


def _changed_by_user(porcelain: str) -> list[str]:
    """Tracked files the user changed, from ``git status --porcelain=v1 -z``."""
    out, entries, i = [], porcelain.split("\0"), 0
    while i < len(entries):
        e = entries[i]
        i += 1
        if len(e) < 4:
            continue
        if e[0] in "RC":
            i += 1  # the rename's old name follows
        if "D" not in e[:2]:
            out.append(e[3:])
    return out


def _name_status(out: str) -> dict[str, list[str]]:
    parts = out.split("\0")
    changed: dict[str, list[str]] = {}
    i = 0
    while i < len(parts) - 1:
        kind = parts[i][:1]
        if kind in ("R", "C"):
            changed.setdefault("D", []).append(parts[i + 1])
            changed.setdefault("A", []).append(parts[i + 2])
            i += 3
            continue
        changed.setdefault(kind, []).append(parts[i + 1])
        i += 2
    return changed


def _default_branch(bare: str) -> str:
    head = os.path.join(bare, "HEAD")
    with open(head) as f:
        text = f.read().strip()
    if text.startswith("ref: refs/heads/"):
        return text[len("ref: refs/heads/") :]
    raise gitops.ImportFailed("the repository has no default branch: give branch=")


# ---------------------------------------------------------------- the service's jobs


class Imports:
    """The service's import jobs: planned in the request, run in the background, polled."""

    def __init__(
        self,
        session_factory,
        log,
        *,
        box: SecretBox,
        allowed: Callable[[], AllowList],
        default_host: Callable[[], str | None],
        rescan: Callable[[str], Any],
        timeout: float = 600,
        per_user: int = 2,
    ) -> None:
        self.session_factory = session_factory
        self.log = log
        self.box = box
        self.allowed = allowed
        self.default_host = default_host
        self.rescan = rescan
        self.timeout = timeout
        self.per_user = per_user
        self.jobs: dict[str, Job] = {}
        self._tasks: set[asyncio.Task] = set()
        self._folder_locks: dict[tuple[str, str], asyncio.Lock] = {}

    def start(self, db: Session, actor: Actor, body: Any) -> Job:
        """Plan (refusals raise) and start the job."""
        p = plan(db, actor, body, allowed=self.allowed(), default_host=self.default_host(), box=self.box)
        running = [j for j in self.jobs.values() if j.username == p.username and j.finished is None]
        if len(running) >= self.per_user:
            raise Conflict(f"you have {len(running)} imports running: wait for one to finish")
        job = Job(id=secrets.token_hex(8), username=p.username, plan=p)
        self.jobs[job.id] = job
        self._forget_old()
        task = asyncio.get_running_loop().create_task(self._run(job, actor))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    def get(self, actor: Actor, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None or not (job.username == actor.name or actor.is_superadmin):
            raise NotFound(f"no import {job_id[:40]}")
        return job

    def mine(self, actor: Actor) -> list[Job]:
        return sorted((j for j in self.jobs.values() if j.username == actor.name), key=lambda j: -j.created)

    def _forget_old(self) -> None:
        done = sorted((j for j in self.jobs.values() if j.finished), key=lambda j: j.finished or 0)
        for j in done[: max(0, len(done) - KEEP_JOBS)]:
            self.jobs.pop(j.id, None)

    async def _run(self, job: Job, actor: Actor) -> None:
        p = job.plan
        lock = self._folder_locks.setdefault((p.username, p.folder_name), asyncio.Lock())
        staging = ""
        async with lock:
            try:
                staging = await asyncio.to_thread(self._staging, p)
                staged = await asyncio.to_thread(fetch, p, staging, self.timeout)
                job.status = "writing"
                job.report = await asyncio.to_thread(self._write, job, actor, staged)
                job.status, job.message = "done", _summary(job)
            except LabfleetError as e:
                job.status, job.message = "failed", e.message
            except Exception:  # noqa: BLE001 (a job must end with a status, whatever broke)
                self.log.exception("import %s failed", job.id)
                job.status, job.message = "failed", "the import failed on the service: see its log"
            finally:
                job.finished = time.time()
                if staging:
                    await asyncio.to_thread(shutil.rmtree, staging, True)
        if job.folder_id:
            await self.rescan(job.folder_id)
        await asyncio.to_thread(self._audit, job, actor)

    def _staging(self, p: Plan) -> str:
        top = os.path.join(p.host_path, STAGING)
        os.makedirs(top, 0o700, exist_ok=True)
        os.chmod(top, 0o711)  # the folder's owner crosses it to reach a re-sync's upstream
        return tempfile.mkdtemp(prefix="import-", dir=top)

    def _write(self, job: Job, actor: Actor, staged: str) -> dict[str, list[str]]:
        p = job.plan
        if p.resync:  # no transaction held while git runs
            with database.session_scope(self.session_factory) as db:
                store = vfolders.store_of(vfolders.readable(db, actor, p.folder_id)[0])  # type: ignore[arg-type]
            job.folder_id = p.folder_id
            return resync(p, store, staged)
        with database.session_scope(self.session_factory) as db:
            if p.folder_id is None:
                v = vfolders.create(db, actor, {"name": p.folder_name, "host": p.host}, default_host=p.host)
                created = True
            else:
                v, _ = vfolders.readable(db, actor, p.folder_id)
                created = False
            job.folder_id = v.id
            size = gitops.tree_bytes(staged) if os.path.isdir(staged) else os.path.getsize(staged)
            why = vfquota.room_left(size, vfquota.rooms(db, v))
            try:
                if why:
                    raise vfquota.QuotaExceeded(why)
                return place(p, vfolders.store_of(v), staged)
            except BaseException:
                if created:
                    vfolders.store_of(v).destroy()
                    job.folder_id = None
                raise

    def _audit(self, job: Job, actor: Actor) -> None:
        p = job.plan
        with database.session_scope(self.session_factory) as db:
            user = db.get(User, p.user_id)
            audit.record(
                db,
                actor,
                "import.run",
                f"{p.folder_name}/{p.target}".rstrip("/"),
                target_domain=user.domain.name if user else None,
                details={
                    "url": p.source.url,
                    "kind": p.source.kind,
                    "resync": p.resync,
                    "status": job.status,
                    "message": job.message[:300],
                },
                success=job.status == "done",
            )


def _summary(job: Job) -> str:
    r = job.report
    n = {k: len(v) for k, v in r.items()}
    if job.plan.resync:
        return f"updated {n['updated']}, kept {n['kept']} of your changes, renamed {n['renamed']}"
    written = f"{n['updated']} {'entry' if n['updated'] == 1 else 'entries'} written into folder {job.plan.folder_name}"
    return written + (f"; {n['kept']} of yours kept as they were" if n["kept"] else "")
