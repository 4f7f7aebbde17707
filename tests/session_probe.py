"""What a tenant tries from inside a session: run by the boundary tests as a session's own command.

    python3 session_probe.py '<json plan>'

Standard library only (it runs in whatever Python the session has).  It tries each thing the plan
names and prints one line, ``PROBE <json>``, with what happened; it asserts nothing itself.
Plan keys (all optional): ``unreachable`` / ``reachable``: [[host, port], ...] to connect to;
``unreadable``: paths to list or read; ``listing``: folders whose entries are reported; ``read_only``: folders to write into (directly, after a
remount, and from a user namespace of its own); ``urls``: {name: [url, token]} to GET;
``hog_bytes``: memory a child process allocates; ``tmp_bytes``: bytes written to /tmp;
``busy_seconds``: seconds of wall time to spin, reporting the CPU time it got (``cpu_share``);
``listen_port``: a port to listen on (127.0.0.1 and every address) until the file ``release``
appears next to the file ``listening`` it writes in ``handshake_dir``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request


def status_field(name: str) -> str:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
    return ""


def connect(host: str, port: int, timeout: float = 2.0) -> str:
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.settimeout(timeout)
    try:
        s.connect((host, port))
        return "connected"
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    finally:
        s.close()


def read(path: str) -> str:
    try:
        if os.path.isdir(path):
            return "listed: " + ",".join(sorted(os.listdir(path))[:20])
        with open(path, "rb") as f:
            return f"read {len(f.read(4096))} bytes"
    except OSError as e:
        return f"{type(e).__name__}: {e.strerror}"


def run(cmd: list[str], timeout: float = 60) -> dict:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return {"rc": r.returncode, "err": (r.stderr or r.stdout)[-300:]}
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"rc": None, "err": str(e)}


def write_into(folder: str) -> dict:
    out = {}
    target = os.path.join(folder, "written-by-probe")
    try:
        with open(target, "w") as f:
            f.write("x")
        out["direct"] = "written"
    except OSError as e:
        out["direct"] = f"{type(e).__name__}: {e.strerror}"
    out["remount"] = run(["mount", "-o", "remount,rw,bind", folder])
    # An attacker's next move: a user namespace of its own, where it holds every capability.
    script = f"mount -o remount,rw,bind '{folder}' && echo x > '{target}'; umount '{folder}'; echo done"
    out["userns"] = run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script])
    out["exists_after"] = os.path.exists(target)
    return out


def get(url: str, token: str) -> str:
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"} if token else {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=10) as r:
            return f"{r.status} {r.read(4000).decode(errors='replace')}"
    except urllib.error.HTTPError as e:
        return f"{e.code}"
    except OSError as e:
        return f"{type(e).__name__}: {e}"


def own_address() -> str:
    """The session's address on its network (what the host reaches it at)."""
    gw = None
    with open("/proc/net/route") as f:
        for line in f.readlines()[1:]:
            parts = line.split()
            if parts[1] == "00000000":
                gw = socket.inet_ntoa(int(parts[2], 16).to_bytes(4, "little"))
    if gw is None:
        return ""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((gw, 9))
        return s.getsockname()[0]
    finally:
        s.close()


def main() -> None:
    plan = json.loads(sys.argv[1])
    out: dict = {
        "uid": os.getuid(),
        "euid": os.geteuid(),
        "CapEff": status_field("CapEff"),
        "CapBnd": status_field("CapBnd"),
        "NoNewPrivs": status_field("NoNewPrivs"),
        "address": own_address(),
    }
    out["mount"] = run(["mount", "-t", "tmpfs", "none", os.path.expanduser("~")])
    out["umount"] = run(["umount", "/tmp"])
    out["userns"] = run(["unshare", "--user", "--map-root-user", "true"])
    started = time.monotonic()
    out["unreachable"] = {f"{h}:{p}": connect(h, p) for h, p in plan.get("unreachable", [])}
    out["unreachable_seconds"] = round(time.monotonic() - started, 2)
    out["reachable"] = {f"{h}:{p}": connect(h, p, 5) for h, p in plan.get("reachable", [])}
    out["unreadable"] = {p: read(p) for p in plan.get("unreadable", [])}
    out["listing"] = {p: read(p) for p in plan.get("listing", [])}
    out["read_only"] = {p: write_into(p) for p in plan.get("read_only", [])}
    out["urls"] = {name: get(url, token) for name, (url, token) in plan.get("urls", {}).items()}
    if plan.get("tmp_bytes"):
        chunk = b"\0" * (1 << 20)
        written = 0
        try:
            with open("/tmp/fill", "wb") as f:
                while written < plan["tmp_bytes"]:
                    f.write(chunk)
                    f.flush()
                    written += len(chunk)
            out["tmp"] = f"wrote {written}"
        except OSError as e:
            out["tmp"] = f"{type(e).__name__} after {written}"
        os.remove("/tmp/fill")
    if plan.get("hog_bytes"):
        hog = f"b = bytearray({int(plan['hog_bytes'])}); print('survived', len(b))"
        out["hog"] = run([sys.executable, "-c", hog], timeout=120)
    if plan.get("busy_seconds"):
        wall, cpu0 = time.monotonic(), time.process_time()
        while time.monotonic() - wall < float(plan["busy_seconds"]):
            pass
        out["cpu_share"] = (time.process_time() - cpu0) / (time.monotonic() - wall)
    if plan.get("listen_port"):
        port = int(plan["listen_port"])
        local = socket.create_server(("127.0.0.1", port))
        every = socket.create_server(("0.0.0.0", port + 1))
        handshake = plan["handshake_dir"]
        with open(os.path.join(handshake, "listening"), "w") as f:
            json.dump({"address": out["address"], "port": port}, f)
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(handshake, "release")) and time.monotonic() < deadline:
            time.sleep(0.1)
        local.close()
        every.close()
    print("PROBE " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
