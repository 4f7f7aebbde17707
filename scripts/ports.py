"""The Hub's ports for scripts/up: chosen once and kept in the state directory.

    python scripts/ports.py IP STATE PORTS_FILE [LABFLEET_PORT HUB_PORT PROXY_API_PORT SERVICE_PORT ADMIN_PORT]

Prints the five ports on one line (what scripts/up reads), notes on stderr; exits with the reason
when a port is taken by something else than this state directory's own proxy (or a labfleet
service or console of a killed Hub on its way out, which it waits for), when a Hub of this state
directory still runs, or when the ports file is not NAME=PORT lines. See scripts/up's header.
"""

import os
import socket
import sys
import time

NAMES = [
    "LABFLEET_PORT",
    "LABFLEET_HUB_PORT",
    "LABFLEET_PROXY_API_PORT",
    "LABFLEET_SERVICE_PORT",
    "LABFLEET_ADMIN_PORT",
]
WHAT = {
    "LABFLEET_PORT": "the public port, where running sessions call the Hub",
    "LABFLEET_HUB_PORT": "the Hub's API",
    "LABFLEET_PROXY_API_PORT": "the proxy's API",
    "LABFLEET_SERVICE_PORT": "the labfleet service",
    "LABFLEET_ADMIN_PORT": "the admin console",
}
PROXY_FLAG = {"LABFLEET_PORT": "--port", "LABFLEET_PROXY_API_PORT": "--api-port"}
held: list[socket.socket] = []  # every port chosen stays bound until the choice is made


def fail(message):
    sys.exit(f"[up] ERROR: {message}")


def port_number(name, value, where):
    if not value.isdigit() or not 0 < int(value) < 65536:
        fail(f"{name} must be a port number (got {value!r} {where})")
    return int(value)


def bind(host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a listener still refuses it
    try:
        s.bind((host, port))
    except OSError:
        s.close()
        return None
    held.append(s)
    return s.getsockname()[1]


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def holders(port):
    """The pids holding a listening TCP socket on ``port`` in this network namespace (those this
    user may see: all of them as root)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            field = row.split()
            if len(field) > 9 and field[3] == "0A" and int(field[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{field[9]}]")
    pids = set()
    for pid in filter(str.isdigit, os.listdir("/proc")) if inodes else ():
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in os.listdir(f"/proc/{pid}/fd")):
                pids.add(int(pid))
        except OSError:
            pass
    return pids


def own_proxy(state):
    """The pid of this state directory's proxy (JupyterHub's pid file, a configurable-http-proxy)."""
    try:
        with open(os.path.join(state, "jupyterhub-proxy.pid")) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return pid if "configurable-http-proxy" in cmdline(pid) else None


def in_state(pid, state):
    try:
        return os.path.realpath(f"/proc/{pid}/cwd") == os.path.realpath(state)
    except OSError:
        return False


def ours_leaving(pids, state):
    """A labfleet service or admin console of this state directory (a killed Hub's, on its way out)."""
    return bool(pids) and all(
        in_state(p, state) and any(m in cmdline(p) for m in ("labfleet.service", "-m labfleet.console"))
        for p in pids
    )


def who(pids, port):
    if not pids:
        return f"a process this user cannot see (as root: ss -ltnp 'sport = :{port}')"
    return ", ".join(f"pid {p} ({cmdline(p)[:100] or '?'})" for p in sorted(pids))


def take(name, port, host, source, state, ports_file):
    """Hold ``port`` for ``name``; True where this state directory's own proxy holds it (the Hub
    replaces it); exits with what to do where something else holds it."""
    if bind(host, port) is not None:
        return False
    pids = holders(port)
    proxy = own_proxy(state)
    if name in PROXY_FLAG and proxy is not None:
        if pids == {proxy} or (not pids and f"{PROXY_FLAG[name]} {port} " in cmdline(proxy) + " "):
            return True
    if ours_leaving(pids, state):  # wait while it goes (no holder for a moment: its socket is closing)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(0.2)
            if bind(host, port) is not None:
                return False
            now = holders(port)
            if now and not ours_leaving(now, state):
                break
        pids = holders(port)
    where = host or "all addresses"
    if source == "kept":
        fail(
            f"{name}={port} ({WHAT[name]}), kept in {ports_file} since this state directory's first "
            f"start, is taken on {where} by {who(pids, port)}. The Hub keeps its ports so that running "
            f"sessions and its proxy find it again, so scripts/up does not move it: stop that process and "
            f"run scripts/up again. To move the Hub anyway, run scripts/up with {name}=<another port> (it "
            f"is kept from then on)."
        )
    fail(f"{name}={port} ({WHAT[name]}) is taken on {where} by {who(pids, port)}; choose another")


def parse_kept(text, where):
    """The ports a ports file keeps, {NAME: port}; exits with the line that is not NAME=PORT."""
    kept = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep or name not in NAMES:
            fail(f"{where}, line {number}: {line!r} is not NAME=PORT (NAME one of {', '.join(NAMES)})")
        kept[name] = port_number(name, value, f"in {where}")
    return kept


def render(chosen):
    """The ports file for ``chosen`` ({NAME: port}, every name)."""
    head = (
        "# The Hub's ports, chosen at the first start and kept by scripts/up: running sessions expect them.\n"
    )
    return head + "".join(f"{name}={chosen[name]}\n" for name in NAMES)


def keep(ports_file, text):
    """Write ``text`` to the ports file atomically, 0600, when it changed; what changed, or None."""
    old = None
    try:
        with open(ports_file) as f:
            old = f.read()
    except OSError:
        pass
    note = None
    if old != text:  # a crash never leaves half a file
        tmp = f"{ports_file}.tmp{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, ports_file)
        note = f"ports {'kept' if old is None else 'updated'} in {ports_file}"
    os.chmod(ports_file, 0o600)
    return note


def main(argv):
    ip, state, ports_file = argv[0], argv[1], argv[2]
    given = (list(argv[3:]) + [""] * 5)[:5]
    hubs = [
        int(pid)
        for pid in filter(str.isdigit, os.listdir("/proc"))
        if in_state(pid, state) and any(os.path.basename(a) == "jupyterhub" for a in cmdline(pid).split())
    ]
    if hubs:  # its proxy holds the kept ports: the new Hub would replace it under the running one
        fail(
            f"a Hub of this state directory is running: {who(set(hubs), 0)}. Stop it first (Ctrl-C where it runs)."
        )
    kept = {}
    if os.path.exists(ports_file):
        with open(ports_file) as f:
            kept = parse_kept(f.read(), ports_file)

    chosen, notes, proxy_kept = {}, [], []
    for i, name in enumerate(NAMES):  # the given and kept ones first, then free ones
        host = ("" if ip in ("0.0.0.0", "*", "") else ip.strip("[]")) if i == 0 else "127.0.0.1"
        value, source = (given[i], "given") if given[i] else (str(kept.get(name, "")), "kept")
        if not value:
            continue
        port = port_number(name, value, "in the environment" if source == "given" else f"in {ports_file}")
        if port in chosen.values():
            fail(f"{name}={port}: that port is also {[n for n, p in chosen.items() if p == port][0]}'s")
        if name in kept and kept[name] != port:
            notes.append(f"{name} moves from {kept[name]} to {port} (given), and is kept")
        if take(name, port, host, source, state, ports_file):
            proxy_kept.append(f"{name}={port}")
        chosen[name] = port
    for i, name in enumerate(NAMES):
        if name in chosen:
            continue
        host = ("" if ip in ("0.0.0.0", "*", "") else ip.strip("[]")) if i == 0 else "127.0.0.1"
        if i == 0:
            port = next((p for p in range(8000, 8100) if p not in chosen.values() and bind(host, p)), None)
            if port is None:
                fail(f"ports 8000 to 8099 are all taken on {host or 'all addresses'}: set LABFLEET_PORT")
            if port != 8000:
                notes.append(f"port 8000 is taken (another Hub?): the Hub listens on {port}")
        else:
            port = bind(host, 0)
        chosen[name] = port

    note = keep(ports_file, render(chosen))
    if note:
        notes.append(note)
    if proxy_kept:
        held_by = ", ".join(proxy_kept)
        notes.append(
            f"the proxy of an earlier Hub of this state directory still holds {held_by}: the Hub replaces it"
        )
    for note in notes:
        print(f"[up] {note}", file=sys.stderr)
    print(*(chosen[name] for name in NAMES))


if __name__ == "__main__":
    main(sys.argv[1:])
