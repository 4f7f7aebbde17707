"""Virtual folders behind a real JupyterHub, configurable-http-proxy and the labfleet service:
sharing and project permissions as the right and the wrong users, the folder lifecycle with
sessions, streamed and resumable uploads, tar downloads, paths and symlinks that try to leave
the folder, and quotas (also at their edge, under concurrent uploads)."""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import os
import socket
import struct
import tarfile
import threading
import time
from pathlib import Path
from urllib.parse import quote, urlparse

import pytest

from tests.hubfixture import read_http_answer, start_hub

pytestmark = pytest.mark.hub

API = "/services/labfleet/api"
KiB = 1024
MiB = 1024 * 1024


# ---------------------------------------------------------------- the world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """acme: alice, bob (members of acme/ml), erin (no project), carol (admin), frank, quser,
    edge, usr10, racer; globex: dave (admin), gina; root: mona (monitor) and root (superadmin)."""
    hub = start_hub(tmp_path_factory.mktemp("hub"))
    root = hub.wait_token("root")

    def ok(method, path, body=None):
        r = hub.api(method, path, root, json=body)
        assert r.status_code in (200, 201), (path, r.text)
        return r.json()

    ok("POST", "/domains", {"name": "acme"})
    ok("POST", "/domains", {"name": "globex"})
    ok("POST", "/projects", {"domain": "acme", "name": "ml"})
    users = [
        {"username": "alice", "domain": "acme", "projects": ["ml"]},
        {"username": "bob", "domain": "acme", "projects": ["ml"]},
        {"username": "erin", "domain": "acme"},
        {"username": "carol", "domain": "acme", "role": "admin"},
        {"username": "frank", "domain": "acme"},
        {"username": "quser", "domain": "acme"},
        {"username": "edge", "domain": "acme"},
        {"username": "usr10", "domain": "acme"},
        {"username": "racer", "domain": "acme"},
        {"username": "dave", "domain": "globex", "role": "admin"},
        {"username": "gina", "domain": "globex"},
        {"username": "mona", "domain": "root", "role": "monitor"},
    ]
    for u in users:
        ok("POST", "/users", u)
    tokens = {"root": root}
    for u in users:
        tokens[u["username"]] = hub.wait_token(u["username"])
    vfroot = Path(ok("GET", "/storage-hosts/local")["path"])
    # Each host once, the default one marked (the sidebar offers it first, not twice).
    assert [(h["name"], h["is_default"]) for h in ok("GET", "/storage-hosts")] == [("local", True)]
    yield World(hub, tokens, vfroot)
    hub.stop()


class World:
    """The Hub plus helpers: ``w.call("alice", "GET", "/vfolders")``."""

    def __init__(self, hub, tokens, vfroot: Path) -> None:
        self.hub = hub
        self.tokens = tokens
        self.vfroot = vfroot

    def call(self, who, method, path, **kw):
        return self.hub.api(method, path, self.tokens[who], **kw)

    def ok(self, who, method, path, *codes, **kw):
        r = self.call(who, method, path, **kw)
        assert r.status_code in (codes or (200, 201)), (who, method, path, r.status_code, r.text)
        return r.json()

    def status(self, who, method, path, **kw) -> int:
        return self.call(who, method, path, **kw).status_code

    def folder(self, who, name, **body) -> str:
        return self.ok(who, "POST", "/vfolders", 201, json={"name": name, **body})["id"]

    def put(self, who, fid, path, data: bytes):
        return self.call(who, "PUT", f"/vfolders/{fid}/files/{quote(path)}", data=data)

    def get(self, who, fid, path="", **kw):
        return self.call(who, "GET", f"/vfolders/{fid}/files/{quote(path)}", **kw)

    def data_dir(self, fid) -> Path:
        return self.vfroot / fid / "data"

    def uploads_dir(self, fid) -> Path:
        return self.vfroot / fid / "uploads"

    def usage(self, who, fid) -> dict:
        return self.ok(who, "GET", f"/vfolders/{fid}", 200)["usage"]

    def my_scope(self, who) -> dict:
        scopes = self.ok(who, "GET", "/vfolders/usage", 200)["scopes"]
        return next(s for s in scopes if s["kind"] == "user")


def _proxy_addr(w: World) -> tuple[str, int]:
    u = urlparse(w.hub.url)
    return u.hostname, u.port


def _service_addr(w: World) -> tuple[str, int]:
    return "127.0.0.1", w.hub.ports[3]


def raw_request(addr, method, path, token, body: bytes = b"", headers=None):
    """A request whose path is sent exactly as given (no normalisation by the client)."""
    conn = http.client.HTTPConnection(*addr, timeout=30)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        conn.putheader("Authorization", f"token {token}")
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        if method in ("PUT", "PATCH", "POST"):
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body or None)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def send_partial(addr, method, path, token, total: int, part: bytes, headers=None) -> socket.socket:
    """Start a request announcing ``total`` body bytes and send only ``part`` of them."""
    s = socket.create_connection(addr, timeout=30)
    head = [f"{method} {path} HTTP/1.1", f"Host: {addr[0]}:{addr[1]}", f"Authorization: token {token}"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    head += [f"Content-Length: {total}", "", ""]
    s.sendall("\r\n".join(head).encode() + part)
    return s


def abort(s: socket.socket) -> None:
    """Close with a reset, as a client that dies does."""
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def wait_until(cond, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def tree(d: Path) -> dict[str, bytes | None]:
    """Every entry below d (not following links): relpath -> content (None for dirs)."""
    out: dict[str, bytes | None] = {}
    for p in sorted(d.rglob("*")):
        rel = str(p.relative_to(d))
        out[rel] = p.read_bytes() if p.is_file() and not p.is_symlink() else None
    return out


# ---------------------------------------------------------------- 1. sharing


def test_sharing_lifecycle_as_right_and_wrong_users(world):
    w = world
    fid = w.folder("alice", "shared")
    assert w.put("alice", fid, "hello.txt", b"hello bob").status_code == 201
    inv = f"/vfolders/{fid}/invitations"

    # Who may not invite: no access (404), another domain's admin (404), the domain admin,
    # the monitor (they see the folder, but are not its owner: 403).
    assert w.status("erin", "POST", inv, json={"invitee": "bob"}) == 404
    assert w.status("dave", "POST", inv, json={"invitee": "bob"}) == 404
    assert w.status("carol", "POST", inv, json={"invitee": "bob"}) == 403
    assert w.status("mona", "POST", inv, json={"invitee": "bob"}) == 403
    # Not across domains, not to oneself, not with an unknown permission.
    assert w.status("alice", "POST", inv, json={"invitee": "gina"}) == 404
    assert w.status("alice", "POST", inv, json={"invitee": "alice"}) == 400
    assert w.status("alice", "POST", inv, json={"invitee": "bob", "permission": "admin"}) == 400
    # Admins manage the folder but cannot read a user's files unless shared.
    assert w.get("carol", fid, "hello.txt").status_code == 403
    assert w.get("root", fid, "hello.txt").status_code == 403
    assert w.get("bob", fid, "hello.txt").status_code == 404

    # Invite bob (ro); he sees it, erin does not.
    i1 = w.ok("alice", "POST", inv, 201, json={"invitee": "bob", "permission": "ro"})
    assert (i1["state"], i1["invitee"], i1["permission"]) == ("pending", "bob", "ro")
    assert w.status("alice", "POST", inv, json={"invitee": "bob"}) == 409  # already pending
    assert i1["id"] in {i["id"] for i in w.ok("bob", "GET", "/vfolder-invitations", 200)}
    assert i1["id"] in {i["id"] for i in w.ok("alice", "GET", "/vfolder-invitations", 200)}
    assert i1["id"] not in {i["id"] for i in w.ok("erin", "GET", "/vfolder-invitations", 200)}
    # Only bob can accept it: someone else's invitation is not found; the inviter cannot answer it.
    assert w.status("erin", "POST", f"/vfolder-invitations/{i1['id']}/accept") == 404
    assert w.status("alice", "POST", f"/vfolder-invitations/{i1['id']}/accept") == 403
    assert w.ok("bob", "POST", f"/vfolder-invitations/{i1['id']}/accept", 200)["state"] == "accepted"
    assert w.status("bob", "POST", f"/vfolder-invitations/{i1['id']}/accept") == 409
    assert w.status("alice", "POST", inv, json={"invitee": "bob"}) == 409  # already shares it
    mine = {f["id"]: f for f in w.ok("bob", "GET", "/vfolders", 200)}
    assert mine[fid]["permission"] == "ro" and not mine[fid]["can_manage"]

    # Decline: erin is invited; bob cannot answer for her; she declines and sees nothing.
    i2 = w.ok("alice", "POST", inv, 201, json={"invitee": "erin"})
    assert w.status("bob", "POST", f"/vfolder-invitations/{i2['id']}/accept") == 404
    assert w.ok("erin", "POST", f"/vfolder-invitations/{i2['id']}/decline", 200)["state"] == "declined"
    assert w.status("erin", "GET", f"/vfolders/{fid}") == 404
    # Cancel: only the inviter; a cancelled invitation cannot be accepted.
    i3 = w.ok("alice", "POST", inv, 201, json={"invitee": "erin", "permission": "wd"})
    assert w.status("erin", "DELETE", f"/vfolder-invitations/{i3['id']}") == 403
    assert w.status("bob", "DELETE", f"/vfolder-invitations/{i3['id']}") == 404
    assert w.ok("alice", "DELETE", f"/vfolder-invitations/{i3['id']}", 200)["state"] == "cancelled"
    assert w.status("erin", "POST", f"/vfolder-invitations/{i3['id']}/accept") == 409
    assert w.status("erin", "GET", f"/vfolders/{fid}") == 404
    assert w.get("erin", fid, "hello.txt").status_code == 404

    # ro: bob reads, cannot write, make dirs, move or delete.
    r = w.get("bob", fid, "hello.txt")
    assert r.status_code == 200 and r.content == b"hello bob"
    assert w.put("bob", fid, "bob.txt", b"x").status_code == 403
    assert w.status("bob", "POST", f"/vfolders/{fid}/mkdir", json={"path": "d"}) == 403
    assert w.status("bob", "POST", f"/vfolders/{fid}/move", json={"from": "hello.txt", "to": "h2"}) == 403
    assert w.status("bob", "DELETE", f"/vfolders/{fid}/files/hello.txt") == 403
    assert not (w.data_dir(fid) / "bob.txt").exists()

    # rw: bob writes, still cannot delete, overwrite by move, or change his own permission.
    perm = f"/vfolders/{fid}/permissions"
    assert w.ok("alice", "PUT", f"{perm}/bob", 200, json={"permission": "rw"})["permission"] == "rw"
    assert w.put("bob", fid, "bob.txt", b"from bob").status_code == 201
    assert (w.data_dir(fid) / "bob.txt").read_bytes() == b"from bob"
    assert w.status("bob", "DELETE", f"/vfolders/{fid}/files/bob.txt") == 403
    assert (
        w.status(
            "bob",
            "POST",
            f"/vfolders/{fid}/move",
            json={"from": "bob.txt", "to": "hello.txt", "overwrite": True},
        )
        == 403
    )
    assert w.status("bob", "PUT", f"{perm}/bob", json={"permission": "wd"}) == 403
    assert w.status("bob", "GET", perm) == 403
    assert w.status("bob", "POST", inv, json={"invitee": "erin"}) == 403
    assert w.status("bob", "DELETE", f"/vfolders/{fid}") == 403
    assert w.ok("alice", "GET", perm, 200) == [{"user": "bob", "permission": "rw"}]

    # wd: bob trashes a file (the trash is purged by the owner or an admin only).
    w.ok("alice", "PUT", f"{perm}/bob", 200, json={"permission": "wd"})
    t = w.ok("bob", "DELETE", f"/vfolders/{fid}/files/bob.txt", 200)
    assert t["path"] == "bob.txt" and not (w.data_dir(fid) / "bob.txt").exists()
    assert w.status("bob", "DELETE", f"/vfolders/{fid}/trash/{t['id']}") == 403
    assert w.status("erin", "DELETE", f"/vfolders/{fid}/permissions/bob") == 404
    # Even with wd, a sharee cannot remove another sharee.
    i5 = w.ok("alice", "POST", inv, 201, json={"invitee": "erin", "permission": "ro"})
    w.ok("erin", "POST", f"/vfolder-invitations/{i5['id']}/accept", 200)
    assert w.status("bob", "DELETE", f"{perm}/erin") == 403
    assert w.status("erin", "DELETE", f"{perm}/bob") == 403
    assert w.get("erin", fid, "hello.txt").status_code == 200
    w.ok("alice", "DELETE", f"{perm}/erin", 200)
    assert w.get("erin", fid, "hello.txt").status_code == 404

    # Revoke: bob no longer finds the folder at all.
    w.ok("alice", "DELETE", f"{perm}/bob", 200)
    assert w.status("bob", "GET", f"/vfolders/{fid}") == 404
    assert w.get("bob", fid, "hello.txt").status_code == 404
    assert w.put("bob", fid, "again.txt", b"x").status_code == 404
    assert fid not in {f["id"] for f in w.ok("bob", "GET", "/vfolders", 200)}

    # Leave: invited again, bob removes himself.
    i4 = w.ok("alice", "POST", inv, 201, json={"invitee": "bob", "permission": "rw"})
    w.ok("bob", "POST", f"/vfolder-invitations/{i4['id']}/accept", 200)
    assert w.get("bob", fid, "hello.txt").status_code == 200
    w.ok("bob", "DELETE", f"{perm}/bob", 200)
    assert w.status("bob", "GET", f"/vfolders/{fid}") == 404
    assert w.ok("alice", "GET", perm, 200) == []


# ---------------------------------------------------------------- 2. project folders


def test_project_folders_and_member_overrides(world):
    w = world
    body = {"name": "pf", "project": "acme/ml", "permission": "ro"}
    assert w.status("alice", "POST", "/vfolders", json=body) == 403  # a member, not an admin
    assert w.status("dave", "POST", "/vfolders", json=body) == 404  # another domain's admin
    pf = w.ok("carol", "POST", "/vfolders", 201, json=body)
    fid = pf["id"]
    assert pf["owner_kind"] == "project" and pf["project_permission"] == "ro"
    assert w.put("carol", fid, "readme.txt", b"project data").status_code == 201

    # Members read, cannot write.
    for m in ("alice", "bob"):
        assert fid in {f["id"] for f in w.ok(m, "GET", "/vfolders", 200)}
        assert w.ok(m, "GET", f"/vfolders/{fid}", 200)["permission"] == "ro"
        r = w.get(m, fid, "readme.txt")
        assert r.status_code == 200 and r.content == b"project data"
        assert w.put(m, fid, f"{m}.txt", b"x").status_code == 403
        assert w.status(m, "POST", f"/vfolders/{fid}/mkdir", json={"path": m}) == 403
    # A member cannot set permissions; an admin cannot give them to a non-member.
    perm = f"/vfolders/{fid}/permissions"
    assert w.status("alice", "PUT", f"{perm}/alice", json={"permission": "rw"}) == 403
    assert w.status("carol", "PUT", f"{perm}/erin", json={"permission": "rw"}) == 400

    # Override for alice only.
    w.ok("carol", "PUT", f"{perm}/alice", 200, json={"permission": "rw"})
    assert w.ok("alice", "GET", f"/vfolders/{fid}", 200)["permission"] == "rw"
    assert w.put("alice", fid, "alice.txt", b"by alice").status_code == 201
    assert w.status("alice", "DELETE", f"/vfolders/{fid}/files/alice.txt") == 403  # rw, not wd
    assert w.put("bob", fid, "bob.txt", b"x").status_code == 403
    assert not (w.data_dir(fid) / "bob.txt").exists()

    # Outsiders: same domain but not a member, another domain's admin -> not found.
    for who in ("erin", "dave", "gina"):
        assert w.status(who, "GET", f"/vfolders/{fid}") == 404, who
        assert w.get(who, fid, "readme.txt").status_code == 404, who
        assert w.put(who, fid, f"{who}.txt", b"x").status_code == 404, who
        assert w.status(who, "PUT", f"{perm}/bob", json={"permission": "wd"}) == 404, who
        assert fid not in {f["id"] for f in w.ok(who, "GET", "/vfolders", 200)}, who

    # The superadmin does everything.
    assert w.get("root", fid, "alice.txt").content == b"by alice"
    assert w.put("root", fid, "root.txt", b"root").status_code == 201
    w.ok("root", "DELETE", f"/vfolders/{fid}/files/root.txt", 200)
    w.ok("root", "PUT", f"{perm}/bob", 200, json={"permission": "wd"})
    assert w.put("bob", fid, "bob.txt", b"now").status_code == 201
    assert sorted(p["user"] for p in w.ok("root", "GET", perm, 200)) == ["alice", "bob"]


# ---------------------------------------------------------------- 3. delete / restore / purge


def test_delete_restore_purge_and_mounted_sessions(world):
    w = world
    fid = w.folder("alice", "lifecycle")
    assert w.put("alice", fid, "keep.txt", b"data").status_code == 201
    root_dir = w.vfroot / fid
    assert (root_dir / "data" / "keep.txt").exists()
    outsiders = ("bob", "erin", "dave", "gina")

    def unreachable():
        for who in outsiders:
            for method, path in (
                ("DELETE", f"/vfolders/{fid}"),
                ("POST", f"/vfolders/{fid}/restore"),
                ("POST", f"/vfolders/{fid}/purge"),
                ("GET", f"/vfolders/{fid}"),
            ):
                assert w.status(who, method, path) == 404, (who, method, path)

    unreachable()
    assert w.status("alice", "POST", f"/vfolders/{fid}/purge") == 409  # not in the trash
    assert w.status("alice", "POST", f"/vfolders/{fid}/restore") == 409
    assert w.status("mona", "DELETE", f"/vfolders/{fid}") == 403  # a monitor only looks

    # A session of alice mounts it (admitted as the Hub's spawner asks: the service token, for alice).
    r = w.hub.api(
        "POST",
        "/sessions",
        w.hub.service_token,
        json={"project": "acme/ml", "username": "alice", "slots": {"cpu": 0.01}, "vfolders": ["lifecycle"]},
    )
    assert r.status_code == 201, r.text
    s = r.json()
    mount = next(m for m in s["mounts"] if m["vfolder"] == fid)
    assert mount["permission"] == "wd" and Path(mount["source"]) == root_dir / "data"

    d = w.ok("alice", "DELETE", f"/vfolders/{fid}", 200)
    assert d["status"] == "DELETE_PENDING"
    assert w.status("alice", "DELETE", f"/vfolders/{fid}") == 409
    assert w.get("alice", fid, "keep.txt").status_code == 409
    assert w.put("alice", fid, "new.txt", b"x").status_code == 409
    unreachable()
    # A trashed folder cannot be mounted by a new session.
    r = w.call(
        "alice", "POST", "/sessions", json={"project": "acme/ml", "slots": {"cpu": 0.01}, "vfolders": [fid]}
    )
    assert r.status_code == 404, r.text

    # Purge refused while the admitted session holds it.
    r = w.call("alice", "POST", f"/vfolders/{fid}/purge")
    assert r.status_code == 409 and "mounted" in r.json()["message"], r.text
    assert (root_dir / "data" / "keep.txt").exists()

    # The domain admin restores and deletes it again.
    assert w.ok("carol", "POST", f"/vfolders/{fid}/restore", 200)["status"] == "READY"
    assert w.get("alice", fid, "keep.txt").content == b"data"
    assert w.ok("carol", "DELETE", f"/vfolders/{fid}", 200)["status"] == "DELETE_PENDING"
    assert w.status("alice", "POST", f"/vfolders/{fid}/purge") == 409

    w.ok("alice", "DELETE", f"/sessions/{s['id']}", 200)
    unreachable()
    assert w.ok("alice", "POST", f"/vfolders/{fid}/purge", 200) == {"purged": fid}
    assert not root_dir.exists()
    assert w.status("alice", "GET", f"/vfolders/{fid}") == 404
    assert w.status("alice", "POST", f"/vfolders/{fid}/purge") == 404
    assert fid not in {f["id"] for f in w.ok("alice", "GET", "/vfolders", 200)}


# ---------------------------------------------------------------- 4. a 200 MB file


def test_200mb_upload_and_download_streamed(world, tmp_path):
    w = world
    fid = w.folder("frank", "big")
    src = tmp_path / "big.bin"
    size = 200 * MiB
    h = hashlib.sha256()
    with open(src, "wb") as f:
        for _ in range(size // MiB):
            block = os.urandom(MiB)
            h.update(block)
            f.write(block)
    t0 = time.monotonic()
    with open(src, "rb") as f:  # a file object: requests sends a Content-Length, not chunks
        r = w.call("frank", "PUT", f"/vfolders/{fid}/files/big.bin", data=f)
    up_s = time.monotonic() - t0
    assert r.status_code == 201, r.text
    assert r.json()["size"] == size
    src.unlink()

    t0 = time.monotonic()
    got = hashlib.sha256()
    n = 0
    with w.call("frank", "GET", f"/vfolders/{fid}/files/big.bin", stream=True) as r:
        assert r.status_code == 200
        assert int(r.headers["Content-Length"]) == size
        for chunk in r.iter_content(MiB):
            got.update(chunk)
            n += len(chunk)
    down_s = time.monotonic() - t0
    assert n == size and got.hexdigest() == h.hexdigest()
    assert w.usage("frank", fid)["bytes"] == size
    print(f"200 MiB through the proxy: upload {up_s:.1f}s, download {down_s:.1f}s")
    # Without a Content-Length (chunked) a whole-file PUT is refused.
    r = w.call("frank", "PUT", f"/vfolders/{fid}/files/chunked.bin", data=iter([b"a", b"b"]))
    assert r.status_code == 411, r.text
    assert not (w.data_dir(fid) / "chunked.bin").exists()
    w.ok("frank", "DELETE", f"/vfolders/{fid}/files/big.bin", 200)


# ---------------------------------------------------------------- 5. resumable uploads


def test_resumed_upload_after_a_dropped_connection(world):
    w = world
    fid = w.folder("frank", "resume")
    size = 8 * MiB
    payload = os.urandom(size)
    up = w.ok("frank", "POST", f"/vfolders/{fid}/uploads", 201, json={"path": "in/part.bin", "size": size})
    assert up["offset"] == 0
    upath = f"/vfolders/{fid}/uploads/{up['id']}"

    half = size // 2
    s = send_partial(
        _proxy_addr(w),
        "PATCH",
        API + upath,
        w.tokens["frank"],
        size,
        payload[:half],
        headers={"Upload-Offset": "0"},
    )
    try:
        wait_until(lambda: w.ok("frank", "GET", upath, 200)["offset"] > 0, what="the first bytes to arrive")
    finally:
        abort(s)

    # Resume from wherever the server got to (once the dropped request let go of the upload).
    deadline = time.monotonic() + 10
    while True:
        offset = w.ok("frank", "GET", upath, 200)["offset"]
        assert 0 < offset <= half
        r = w.call("frank", "PATCH", upath, data=payload[offset:], headers={"Upload-Offset": str(offset)})
        if r.status_code != 409 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert r.status_code == 200, r.text
    done = r.json()
    assert done["complete"] is True and done["offset"] == size
    assert done["entry"]["path"] == "in/part.bin" and done["entry"]["size"] == size
    assert w.status("frank", "GET", upath) == 404  # finished
    got = w.get("frank", fid, "in/part.bin")
    assert hashlib.sha256(got.content).hexdigest() == hashlib.sha256(payload).hexdigest()
    assert list(w.uploads_dir(fid).iterdir()) == []

    # Wrong offset -> 409 with the real one; past the size -> 400; nothing is appended.
    up = w.ok("frank", "POST", f"/vfolders/{fid}/uploads", 201, json={"path": "small.bin", "size": 1000})
    upath = f"/vfolders/{fid}/uploads/{up['id']}"
    r = w.call("frank", "PATCH", upath, data=b"a" * 100, headers={"Upload-Offset": "0"})
    assert r.status_code == 200, r.text
    assert (r.json()["offset"], r.json()["complete"]) == (100, False)
    assert r.headers["Upload-Offset"] == "100"
    r = w.call("frank", "PATCH", upath, data=b"b" * 10, headers={"Upload-Offset": "50"})
    assert r.status_code == 409 and r.headers.get("Upload-Offset") == "100", (r.status_code, r.text)
    r = w.call("frank", "PATCH", upath, data=b"c" * 10, headers={"Upload-Offset": "0"})
    assert r.status_code == 409 and r.headers.get("Upload-Offset") == "100", (r.status_code, r.text)
    r = w.call("frank", "PATCH", upath, data=b"d" * 901, headers={"Upload-Offset": "100"})
    assert r.status_code == 400, r.text
    assert w.status("frank", "PATCH", upath, data=b"e", headers={"Upload-Offset": "x"}) == 400
    assert w.ok("frank", "GET", upath, 200)["offset"] == 100
    assert w.status("bob", "GET", upath) == 404  # not his folder
    assert (w.uploads_dir(fid) / up["id"]).read_bytes() == b"a" * 100
    w.ok("frank", "DELETE", upath, 200)
    assert w.status("frank", "GET", upath) == 404
    assert list(w.uploads_dir(fid).iterdir()) == []
    assert not (w.data_dir(fid) / "small.bin").exists()
    assert w.my_scope("frank")["reserved"] == 0
    # A body with a method its path does not take is never streamed into an upload: 405, nothing held.
    assert w.status("frank", "PATCH", f"/vfolders/{fid}/files/p.bin", data=b"abc") == 405
    up = w.ok("frank", "POST", f"/vfolders/{fid}/uploads", 201, json={"path": "q.bin", "size": 3})
    assert w.status("frank", "PUT", f"/vfolders/{fid}/uploads/{up['id']}", data=b"abc") == 405
    w.ok("frank", "DELETE", f"/vfolders/{fid}/uploads/{up['id']}", 200)
    assert not (w.data_dir(fid) / "p.bin").exists() and list(w.uploads_dir(fid).iterdir()) == []
    assert w.my_scope("frank")["reserved"] == 0


# ---------------------------------------------------------------- 6. directories as tar


def test_directory_download_as_tar(world):
    w = world
    fid = w.folder("frank", "tarme")
    files = {
        "proj/x.txt": b"x" * 10,
        "proj/a/y.bin": os.urandom(70_000),
        "proj/a/b/z.txt": b"zzz",
        "proj/a/b/c/empty.txt": b"",
        "other.txt": b"not in proj",
    }
    for path, data in files.items():
        assert w.put("frank", fid, path, data).status_code == 201, path
    w.ok("frank", "POST", f"/vfolders/{fid}/mkdir", 201, json={"path": "proj/emptydir"})
    r = w.get("frank", fid, "proj", params={"archive": "tar"})
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("application/x-tar")
    with tarfile.open(fileobj=io.BytesIO(r.content), mode="r:") as tf:
        members = {m.name: m for m in tf.getmembers()}
        contents = {n: tf.extractfile(m).read() for n, m in members.items() if m.isfile()}
    dirs = {n for n, m in members.items() if m.isdir()}
    assert dirs == {"proj", "proj/a", "proj/a/b", "proj/a/b/c", "proj/emptydir"}
    assert contents == {k: v for k, v in files.items() if k.startswith("proj/")}
    # The JSON listing of the same directory.
    listing = w.get("frank", fid, "proj").json()
    assert listing["path"] == "proj"
    assert {(e["name"], e["type"]) for e in listing["entries"]} == {
        ("x.txt", "file"),
        ("a", "dir"),
        ("emptydir", "dir"),
    }
    # The whole folder is named after the folder.
    r = w.get("frank", fid, "", params={"archive": "tar"})
    with tarfile.open(fileobj=io.BytesIO(r.content), mode="r:") as tf:
        names = {m.name for m in tf.getmembers() if m.isfile()}
    assert names == {f"tarme/{k}" for k in files}
    assert w.get("frank", fid, "proj", params={"archive": "zip"}).status_code == 400
    assert w.get("bob", fid, "proj", params={"archive": "tar"}).status_code == 404


# ---------------------------------------------------------------- 7. bad paths, names and links


BAD_PATHS = ["..", "a/../b", "/etc", "../x", "a\x00b", "x" * 256, "a/" * 2500]


def test_bad_paths_and_names_are_refused(world):
    w = world
    fid = w.folder("frank", "paths")
    assert w.put("frank", fid, "ok.txt", b"ok").status_code == 201
    before = tree(w.vfroot / fid)
    for bad in BAD_PATHS:
        for parents in (False, True):
            r = w.call("frank", "POST", f"/vfolders/{fid}/mkdir", json={"path": bad, "parents": parents})
            assert r.status_code == 400, (bad[:40], r.text)
        r = w.call("frank", "POST", f"/vfolders/{fid}/move", json={"from": "ok.txt", "to": bad})
        assert r.status_code == 400, (bad[:40], r.text)
        r = w.call("frank", "POST", f"/vfolders/{fid}/move", json={"from": bad, "to": "moved.txt"})
        assert r.status_code == 400, (bad[:40], r.text)
        r = w.call("frank", "POST", f"/vfolders/{fid}/uploads", json={"path": bad, "size": 1})
        assert r.status_code == 400, (bad[:40], r.text)
    # Bad paths in the URL that survive the proxy: NUL, an over-long name, an absolute path.
    for bad in ("a%00b", "x" * 256, "%2Fetc%2Fpasswd", "a%2F..%2F..%2Fb"):
        assert w.call("frank", "PUT", f"/vfolders/{fid}/files/{bad}", data=b"x").status_code == 400, bad
        assert w.call("frank", "GET", f"/vfolders/{fid}/files/{bad}").status_code == 400, bad
    assert tree(w.vfroot / fid) == before

    names = {f["name"] for f in w.ok("frank", "GET", "/vfolders", 200)}
    for bad in ("..", ".", "a/b", "", "x" * 65, "a b", "a\x00"):
        r = w.call("frank", "POST", "/vfolders", json={"name": bad})
        assert r.status_code == 400, (bad, r.text)
        assert w.status("frank", "PATCH", f"/vfolders/{fid}", json={"name": bad}) == 400, bad
    assert w.status("frank", "POST", "/vfolders", json={"name": "x" * 64}) == 201  # the limit itself
    assert {f["name"] for f in w.ok("frank", "GET", "/vfolders", 200)} == names | {"x" * 64}


def test_raw_path_traversal_never_leaves_the_folder(world):
    w = world
    fid = w.folder("frank", "trav")
    secret = w.hub.state / "outside-secret.txt"
    secret.write_bytes(b"TOP-SECRET-OUTSIDE")
    rel = os.path.relpath(secret, w.data_dir(fid))  # ../../../outside-secret.txt
    assert rel.startswith("../")
    enc = rel.replace("..", "%2e%2e")
    slash = rel.replace("/", "%2f")
    both = rel.replace("..", "%2e%2e").replace("/", "%2F")
    variants = [
        rel,
        enc,
        slash,
        both,
        f"sub/../../{rel}",
        "/" + str(secret),
        "%2F" + quote(str(secret), safe=""),
    ]
    token = w.tokens["frank"]
    for addr in (_proxy_addr(w), _service_addr(w)):
        for v in variants:
            path = f"{API}/vfolders/{fid}/files/{v}"
            status, body = raw_request(addr, "GET", path, token)
            assert status in (400, 404), (addr, v, status, body[:200])
            assert b"TOP-SECRET" not in body, (addr, v)
            status, body = raw_request(addr, "GET", path + "?archive=tar", token)
            assert status in (400, 404) and b"TOP-SECRET" not in body, (addr, v, status)
            status, body = raw_request(
                addr, "PUT", path.replace("outside-secret", "outside-new"), token, b"pwn"
            )
            assert status in (400, 404), (addr, v, status, body[:200])
            status, body = raw_request(addr, "DELETE", path, token)
            assert status in (400, 404), (addr, v, status, body[:200])
    assert secret.read_bytes() == b"TOP-SECRET-OUTSIDE"
    assert not (w.hub.state / "outside-new.txt").exists()
    assert list(w.data_dir(fid).iterdir()) == [] and list(w.uploads_dir(fid).iterdir()) == []
    # The same requests in a legal form do reach the folder (the assertions above can fail).
    assert w.put("frank", fid, "sub/inside.txt", b"inside").status_code == 201
    status, body = raw_request(_service_addr(w), "GET", f"{API}/vfolders/{fid}/files/sub/./inside.txt", token)
    assert (status, body) == (200, b"inside")


def test_symlinks_out_of_the_folder_are_refused(world, tmp_path):
    w = world
    fid = w.folder("frank", "links")
    data = w.data_dir(fid)
    assert w.put("frank", fid, "ok.txt", b"ok").status_code == 201
    assert w.put("frank", fid, "sub/f.txt", b"inside").status_code == 201
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "secret.txt").write_bytes(b"OUTSIDE-SECRET")
    (outside / "deep" / "more.txt").write_bytes(b"OUTSIDE-MORE")
    # What a session could do inside its mount.
    os.symlink(outside, data / "link")
    os.symlink(outside / "secret.txt", data / "flink")
    os.symlink(os.path.relpath(outside, data), data / "rlink")
    os.symlink("sub", data / "inlink")  # stays inside: followed
    snapshot = tree(outside)

    assert w.get("frank", fid, "inlink/f.txt").content == b"inside"  # the control
    listing = {e["name"]: e["type"] for e in w.get("frank", fid).json()["entries"]}
    assert listing == {
        "ok.txt": "file",
        "sub": "dir",
        "link": "symlink",
        "flink": "symlink",
        "rlink": "symlink",
        "inlink": "symlink",
    }
    for path in ("link/secret.txt", "rlink/secret.txt", "flink", "link/deep/more.txt", "link", "link/deep"):
        r = w.get("frank", fid, path)
        assert r.status_code == 400, (path, r.status_code, r.text)
        assert b"OUTSIDE" not in r.content
        r = w.get("frank", fid, path, params={"archive": "tar"})
        assert r.status_code == 400 and b"OUTSIDE" not in r.content, (path, r.status_code)
    for path in ("link/new.txt", "rlink/new.txt", "link/deep/new.txt"):
        assert w.put("frank", fid, path, b"pwned").status_code == 400, path
        r = w.call("frank", "POST", f"/vfolders/{fid}/uploads", json={"path": path, "size": 5})
        assert r.status_code == 400, (path, r.text)
    for body in ({"path": "link/x"}, {"path": "link/x/y", "parents": True}, {"path": "rlink/x"}):
        assert w.status("frank", "POST", f"/vfolders/{fid}/mkdir", json=body) == 400, body
    for body in (
        {"from": "ok.txt", "to": "link/ok.txt"},
        {"from": "ok.txt", "to": "link/secret.txt", "overwrite": True},
        {"from": "sub", "to": "rlink/sub"},
        {"from": "link/secret.txt", "to": "stolen.txt"},
        {"from": "flink/x", "to": "stolen2.txt"},
    ):
        assert w.status("frank", "POST", f"/vfolders/{fid}/move", json=body) == 400, body
    assert w.status("frank", "DELETE", f"/vfolders/{fid}/files/link/secret.txt") == 400

    # The whole folder as tar: links are skipped, never followed.
    r = w.get("frank", fid, "", params={"archive": "tar"})
    assert r.status_code == 200 and b"OUTSIDE" not in r.content
    with tarfile.open(fileobj=io.BytesIO(r.content), mode="r:") as tf:
        names = {m.name for m in tf.getmembers()}
    assert names == {"links", "links/ok.txt", "links/sub", "links/sub/f.txt"}
    assert tree(outside) == snapshot
    assert sorted(p.name for p in data.iterdir()) == ["flink", "inlink", "link", "ok.txt", "rlink", "sub"]

    # Deleting the link trashes the link itself; purging it leaves the target alone.
    t = w.ok("frank", "DELETE", f"/vfolders/{fid}/files/link", 200)
    assert t["type"] == "symlink"
    assert not os.path.lexists(data / "link")
    assert tree(outside) == snapshot
    w.ok("frank", "DELETE", f"/vfolders/{fid}/trash/{t['id']}", 200)
    assert tree(outside) == snapshot
    # Uploading over a link replaces the link, never writes through it.
    assert w.put("frank", fid, "flink", b"replaced").status_code == 201
    assert not (data / "flink").is_symlink() and (data / "flink").read_bytes() == b"replaced"
    assert tree(outside) == snapshot


# ---------------------------------------------------------------- 8. quotas


def test_quota_limits_and_failed_uploads_leave_nothing(world):
    w = world
    policy = {"max_quota_scope_size": MiB, "max_vfolder_size": 900 * KiB, "max_vfolder_count": 2}
    w.ok("root", "POST", "/policies/user", 201, json={"name": "tiny", **policy})
    user = w.ok("root", "PATCH", "/users/quser", 200, json={"resource_policy": "tiny"})
    assert user["resource_policy"] == "tiny"
    f1 = w.folder("quser", "q1")
    f2 = w.folder("quser", "q2", max_size=256 * KiB)
    r = w.call("quser", "POST", "/vfolders", json={"name": "q3"})
    assert r.status_code == 409 and r.json()["message"], r.text
    assert "q3" not in {f["name"] for f in w.ok("quser", "GET", "/vfolders", 200)}

    limits = w.ok("quser", "GET", f"/vfolders/{f1}", 200)["limits"]
    assert limits["max_size"] == 900 * KiB
    scope = limits["scope"]
    assert (scope["kind"], scope["name"], scope["limit"], scope["folders"], scope["max_folders"]) == (
        "user",
        "quser",
        MiB,
        2,
        2,
    )
    assert w.ok("quser", "GET", f"/vfolders/{f2}", 200)["limits"]["max_size"] == 256 * KiB

    def empty(fid):
        return list(w.data_dir(fid).iterdir()) == [] and list(w.uploads_dir(fid).iterdir()) == []

    # Over the limits: refused before anything is written.
    r = w.put("quser", f1, "two.bin", os.urandom(2 * MiB))
    assert r.status_code == 413 and "do not fit" in r.json()["message"], r.text
    assert empty(f1)
    assert w.usage("quser", f1)["bytes"] == 0
    r = w.call("quser", "POST", f"/vfolders/{f1}/uploads", json={"path": "two.bin", "size": 2 * MiB})
    assert r.status_code == 413 and r.json()["message"], r.text
    assert empty(f1)
    # Refused from its headers: the answer comes with 64 KiB of the 2 MiB sent (the proxy passes the
    # headers on with the body's first bytes); what comes after is dropped unread
    s = send_partial(
        _proxy_addr(w), "PUT", f"{API}/vfolders/{f1}/files/big.bin", w.tokens["quser"], 2 * MiB, b"x" * 65536
    )
    try:
        status, _, body = read_http_answer(s)
    finally:
        abort(s)
    assert status == 413 and "do not fit" in json.loads(body)["message"], body
    assert empty(f1)
    # Over the policy's per-folder size, and over the folder's own max_size.
    assert w.put("quser", f1, "big.bin", os.urandom(900 * KiB + 1)).status_code == 413
    assert w.put("quser", f2, "mid.bin", os.urandom(256 * KiB + 1)).status_code == 413
    assert empty(f1) and empty(f2)
    assert w.put("quser", f2, "small.bin", os.urandom(200 * KiB)).status_code == 201
    assert w.usage("quser", f2)["bytes"] == 200 * KiB

    # A PUT whose client dies mid-body leaves no file, no temp file and no reservation.
    s = send_partial(
        _proxy_addr(w),
        "PUT",
        f"{API}/vfolders/{f1}/files/dropped.bin",
        w.tokens["quser"],
        600 * KiB,
        os.urandom(300 * KiB),
    )
    try:
        wait_until(
            lambda: any(p.stat().st_size > 0 for p in w.uploads_dir(f1).iterdir()), what="the upload to start"
        )
        assert w.my_scope("quser")["reserved"] == 600 * KiB
    finally:
        abort(s)
    wait_until(lambda: empty(f1), timeout=5, what="the dropped upload's temp file to go")
    wait_until(lambda: w.my_scope("quser")["reserved"] == 0, timeout=5, what="the reservation to go")

    # A resumable upload reserves its whole size from its start and while a request writes it;
    # once a request's connection dies it holds only what arrived, until it is resumed, finishes,
    # is cancelled or expires. The folder lists it (what it holds, where it stands), and its owner
    # may cancel it.
    started = w.ok(
        "quser", "POST", f"/vfolders/{f1}/uploads", 201, json={"path": "later.bin", "size": 100 * KiB}
    )
    upath = f"{API}/vfolders/{f1}/uploads/{started['id']}"
    listed = w.ok("quser", "GET", f"/vfolders/{f1}/uploads", 200)
    assert [(u["id"], u["path"], u["size"], u["offset"], u["reserved"]) for u in listed] == [
        (started["id"], "later.bin", 100 * KiB, 0, 100 * KiB)
    ]
    assert w.my_scope("quser")["reserved"] == 100 * KiB
    s = send_partial(
        _proxy_addr(w),
        "PATCH",
        upath,
        w.tokens["quser"],
        100 * KiB,
        os.urandom(40 * KiB),
        headers={"Upload-Offset": "0"},
    )
    try:
        wait_until(
            lambda: w.ok("quser", "GET", f"/vfolders/{f1}/uploads", 200)[0]["offset"] > 0,
            what="the chunk's first bytes",
        )
        assert w.my_scope("quser")["reserved"] == 100 * KiB
    finally:
        abort(s)

    def holds_what_arrived():
        (u,) = w.ok("quser", "GET", f"/vfolders/{f1}/uploads", 200)
        return 0 < u["offset"] <= 40 * KiB and u["reserved"] == u["offset"] == w.my_scope("quser")["reserved"]

    wait_until(holds_what_arrived, timeout=5, what="the dropped chunk's reservation to go")
    w.ok("quser", "DELETE", f"/vfolders/{f1}/uploads/{started['id']}", 200)
    assert w.ok("quser", "GET", f"/vfolders/{f1}/uploads", 200) == []
    assert w.my_scope("quser")["reserved"] == 0

    # The room it had reserved is free again: exactly what the scope has left fits, a byte more not.
    left = MiB - 200 * KiB
    r = w.put("quser", f1, "over.bin", os.urandom(left + 1))
    assert r.status_code == 413 and "quota of user quser" in r.json()["message"], r.text
    assert w.put("quser", f1, "fill.bin", os.urandom(left)).status_code == 201
    r = w.put("quser", f2, "one-more.bin", b"x")  # room in q2 itself, none in the scope
    assert r.status_code == 413 and "quota of user quser" in r.json()["message"], r.text
    assert sorted(p.name for p in w.data_dir(f1).iterdir()) == ["fill.bin"]
    assert sorted(p.name for p in w.data_dir(f2).iterdir()) == ["small.bin"]
    scope = w.my_scope("quser")
    assert (scope["used"], scope["reserved"], scope["limit"]) == (MiB, 0, MiB)


# ---------------------------------------------------------------- 9. concurrency at the edge


def _concurrently(n, fn):
    barrier = threading.Barrier(n)
    results = [None] * n

    def run(i):
        barrier.wait(10)
        try:
            results[i] = fn(i)
        except Exception as e:  # reported below, not lost in the thread
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return results


def test_concurrent_uploads_cannot_both_pass_the_limit(world):
    w = world
    w.ok("root", "POST", "/policies/user", 201, json={"name": "edge", "max_quota_scope_size": MiB})
    w.ok("root", "PATCH", "/users/edge", 200, json={"resource_policy": "edge"})
    fid = w.folder("edge", "e1")

    # (a) two resumable uploads of 600 KiB: one reservation only.
    res = _concurrently(
        2,
        lambda i: w.call(
            "edge", "POST", f"/vfolders/{fid}/uploads", json={"path": f"r{i}.bin", "size": 600 * KiB}
        ),
    )
    assert sorted(r.status_code for r in res) == [201, 413], [getattr(r, "text", r) for r in res]
    won = next(r.json() for r in res if r.status_code == 201)
    assert w.my_scope("edge")["reserved"] == 600 * KiB
    w.ok("edge", "DELETE", f"/vfolders/{fid}/uploads/{won['id']}", 200)
    assert w.my_scope("edge")["reserved"] == 0

    # (b) eight whole-file PUTs of 200 KiB: five fit in 1 MiB, six do not.
    size = 200 * KiB
    bodies = [os.urandom(size) for _ in range(8)]
    res = _concurrently(8, lambda i: w.put("edge", fid, f"p{i}.bin", bodies[i]))
    codes = [getattr(r, "status_code", r) for r in res]
    assert set(codes) <= {201, 413}, codes
    won = [i for i, c in enumerate(codes) if c == 201]
    assert len(won) <= 5, codes
    assert len(won) == 5, f"five uploads fit but {len(won)} passed: {codes}"
    usage = w.usage("edge", fid)
    scope = w.my_scope("edge")
    assert usage["bytes"] == scope["used"] == size * len(won) <= MiB, (usage, scope)
    assert usage["files"] == len(won) and scope["reserved"] == 0
    assert sorted(p.name for p in w.data_dir(fid).iterdir()) == sorted(f"p{i}.bin" for i in won)
    assert list(w.uploads_dir(fid).iterdir()) == []
    for i in won:
        assert (w.data_dir(fid) / f"p{i}.bin").read_bytes() == bodies[i]


# ---------------------------------------------------------------- 10. usage


def test_usage_follows_uploads_trash_and_purge(world):
    w = world
    a = w.folder("usr10", "ua")
    b = w.folder("usr10", "ub")
    for path, n in (("one.bin", 1000), ("d/two.bin", 2000), ("d/e/three.bin", 3000)):
        assert w.put("usr10", a, path, os.urandom(n)).status_code == 201
    assert w.put("usr10", b, "b.bin", os.urandom(500)).status_code == 201
    ua = w.usage("usr10", a)
    assert (ua["bytes"], ua["files"], ua["trash_bytes"]) == (6000, 3, 0) and ua["scanned_at"]
    assert w.usage("usr10", b)["bytes"] == 500
    listed = {f["id"]: f for f in w.ok("usr10", "GET", "/vfolders", 200)}
    assert listed[a]["usage"]["bytes"] == 6000 and listed[b]["usage"]["files"] == 1
    assert listed[a]["limits"]["scope"]["used"] == 6500
    scope = w.my_scope("usr10")
    assert (scope["name"], scope["used"], scope["folders"], scope["reserved"]) == ("usr10", 6500, 2, 0)

    # Overwriting counts the new size only.
    assert w.put("usr10", a, "one.bin", os.urandom(1500)).status_code == 201
    assert w.usage("usr10", a)["bytes"] == 6500
    # The trash still counts; purging it frees the room.
    t = w.ok("usr10", "DELETE", f"/vfolders/{a}/files/d/two.bin", 200)
    ua = w.usage("usr10", a)
    assert (ua["bytes"], ua["files"], ua["trash_bytes"]) == (6500, 2, 2000)
    assert [x["id"] for x in w.ok("usr10", "GET", f"/vfolders/{a}/trash", 200)] == [t["id"]]
    w.ok("usr10", "DELETE", f"/vfolders/{a}/trash/{t['id']}", 200)
    ua = w.usage("usr10", a)
    assert (ua["bytes"], ua["files"], ua["trash_bytes"]) == (4500, 2, 0)
    assert w.my_scope("usr10")["used"] == 5000
    # Admins read a user's usage; others do not.
    assert w.ok("carol", "GET", "/vfolders/usage?user=usr10", 200)["scopes"][0]["used"] == 5000
    assert w.status("alice", "GET", "/vfolders/usage?user=usr10") == 404
    assert w.status("dave", "GET", "/vfolders/usage?user=usr10") == 404


# ---------------------------------------------------------------- 11. rescans vs. quota


def test_a_rescan_never_undercounts_an_upload_that_finished_meanwhile(world):
    """The service measures a folder in a thread after each change.  An upload that finishes
    while an earlier measurement runs must stay counted, else a third upload gets room that is
    not there and the scope ends over its limit."""
    w = world
    w.ok("root", "POST", "/policies/user", 201, json={"name": "edge2", "max_quota_scope_size": MiB})
    w.ok("root", "PATCH", "/users/racer", 200, json={"resource_policy": "edge2"})
    fid = w.folder("racer", "r1")
    data = w.data_dir(fid)
    # Many empty files, as a session makes them: measuring the folder now takes a moment.
    many = data / "zzz"
    many.mkdir()
    for i in range(30_000):
        os.close(os.open(many / f"{i:05d}", os.O_CREAT | os.O_WRONLY, 0o644))
    codes: dict[str, int] = {}

    def put(name, n):
        codes[name] = w.put("racer", fid, name, os.urandom(n)).status_code

    def wait_file(p: Path):
        deadline = time.monotonic() + 10
        while not p.exists():
            assert time.monotonic() < deadline, f"{p.name} never arrived"
            time.sleep(0.002)

    a = threading.Thread(target=put, args=("a.bin", 1))
    a.start()
    wait_file(data / "a.bin")  # A is in place: the folder is being measured for it now
    b = threading.Thread(target=put, args=("b.bin", 600 * KiB))
    b.start()
    wait_file(data / "b.bin")  # B is in place (and counted, in the same transaction)
    seen: list[int] = []
    c_code = None
    deadline = time.monotonic() + 10
    while b.is_alive() and time.monotonic() < deadline:
        used = w.usage("racer", fid)["bytes"]
        seen.append(used)
        if used < 600 * KiB and c_code is None:
            c_code = w.put("racer", fid, "c.bin", os.urandom(600 * KiB)).status_code
    a.join(30)
    b.join(30)
    assert codes == {"a.bin": 201, "b.bin": 201}
    if c_code is None:
        c_code = w.put("racer", fid, "c.bin", os.urandom(600 * KiB)).status_code
    final = w.usage("racer", fid)["bytes"]
    assert (c_code, final <= MiB) == (413, True), (
        f"c.bin (600 KiB) got {c_code}; the scope holds {final} of {MiB} bytes; usage seen after "
        f"b.bin (600 KiB) was in place: {sorted(set(seen))}"
    )
    assert min(seen, default=600 * KiB) >= 600 * KiB, sorted(set(seen))
