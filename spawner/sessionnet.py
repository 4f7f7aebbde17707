"""A network of their own for local sessions: one namespace per session behind a bridge.

Each session gets a network namespace ``<bridge>-<index>`` with one interface, ``eth0``, at
``subnet[index + 2]``; its other end, ``<bridge>-<index>`` on the host, is an isolated port of the
bridge (sessions never see each other's frames), whose address is the subnet's first one, the
gateway.  What a session can reach is decided by one nftables table per Hub (:func:`ruleset`):

- the host itself: nothing but the Hub's public proxy, which the session calls at
  ``gateway:<proxy port>`` (rewritten to where the proxy listens, 127.0.0.1 included); the Hub's
  API, the labfleet service, the proxy's API, kernels and replicas listen on the host's loopback or
  in other namespaces, which a session cannot address;
- other sessions, on this bridge or another labfleet bridge (interface group
  :data:`SESSION_IFGROUP`): nothing;
- ``deny`` networks (cloud metadata by default): nothing;
- everything else (the internet): through the host, masqueraded.

The host reaches every session (the proxy connects to ``address:port``).  The plan is pure
(:class:`SessionNetwork`, :func:`ruleset`, :func:`host_commands`, :func:`session_commands`); the
functions at the end run ``ip`` and ``nft`` as root.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

# Every labfleet session bridge (and the docker backend's session network) is in this interface
# group, so one Hub's rules also keep its sessions from the sessions of another Hub on the node.
SESSION_IFGROUP = 1717
NETNS_DIR = "/run/netns"
_BRIDGE = re.compile(r"^[a-z][a-z0-9]{0,8}$")  # 9 characters: "<bridge>-<index>" fits in 15
MAX_INDEX = 2**16 - 1  # 5 digits at most: "<bridge>-<index>" fits a 15-character interface name
DEFAULT_DENY = ("169.254.0.0/16",)  # link-local: the cloud's metadata service among them
BRIDGE_NF = "/proc/sys/net/bridge"  # there when the kernel's br_netfilter is loaded


class NetworkError(RuntimeError):
    """A session network could not be made or changed (the message says which command failed)."""


@dataclass(frozen=True)
class SessionNetwork:
    """The bridge, its subnet and the proxy its sessions call (plain values; no I/O)."""

    bridge: str
    subnet: ipaddress.IPv4Network
    proxy_host: str  # where the Hub's public proxy listens on the host (127.0.0.1, an address)
    proxy_port: int
    deny: tuple[ipaddress.IPv4Network, ...] = ()

    @classmethod
    def parse(
        cls, bridge: str, subnet: str, proxy_host: str, proxy_port: int, deny: Iterable[str] = DEFAULT_DENY
    ) -> SessionNetwork:
        """Check what an operator configured; ValueError says what is wrong."""
        if not _BRIDGE.match(bridge or ""):
            raise ValueError(
                f"session bridge {bridge!r}: 1 to 9 lowercase letters and digits, starting with a letter"
            )
        try:
            net = ipaddress.IPv4Network(subnet, strict=True)
        except ValueError as e:
            raise ValueError(f"session subnet {subnet!r}: {e}") from None
        if net.prefixlen > 29:
            raise ValueError(f"session subnet {subnet}: too small (at most /29)")
        if net.is_loopback or net.is_link_local or net.is_multicast:
            raise ValueError(f"session subnet {subnet}: not a loopback, link-local or multicast range")
        if not 0 < int(proxy_port) < 65536:
            raise ValueError(f"proxy port {proxy_port!r} is not a port")
        host = proxy_host if proxy_host not in ("", "0.0.0.0", "*") else "127.0.0.1"
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(
                f"the Hub's proxy listens on {proxy_host!r}: an IPv4 address is needed"
            ) from None
        denied = []
        for cidr in deny:
            try:
                denied.append(ipaddress.IPv4Network(cidr, strict=False))
            except ValueError as e:
                raise ValueError(f"denied network {cidr!r}: {e}") from None
        return cls(bridge, net, host, int(proxy_port), tuple(denied))

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        return self.subnet.network_address + 1

    @property
    def capacity(self) -> int:
        """How many sessions fit: every address but the network's, the gateway's and broadcast."""
        return min(MAX_INDEX + 1, self.subnet.num_addresses - 3)

    def address(self, index: int) -> ipaddress.IPv4Address:
        if not 0 <= index < self.capacity:
            raise ValueError(f"session index {index} is outside {self.subnet}")
        return self.subnet.network_address + 2 + index

    def name(self, index: int) -> str:
        """The session's namespace, and the host end of its interface pair."""
        return f"{self.bridge}-{index}"

    def netns_path(self, index: int) -> str:
        return f"{NETNS_DIR}/{self.name(index)}"

    @property
    def table(self) -> str:
        """This Hub's nftables table (one per bridge and proxy: two Hubs may share a bridge)."""
        return f"labfleet_{self.bridge}_{self.proxy_port}"

    @property
    def hub_url(self) -> str:
        """The Hub's public proxy as the sessions call it."""
        return f"http://{self.gateway}:{self.proxy_port}"


def ruleset(net: SessionNetwork) -> str:
    """The nftables script that (re)creates this Hub's table, in one transaction."""
    br, gw, t = net.bridge, net.gateway, net.table
    deny = ", ".join(str(d) for d in net.deny)
    # A reset for TCP (at once, where the kernel rate-limits ICMP), ICMP for the rest.
    reject = "reject with icmpx type admin-prohibited"
    refuse = ["meta l4proto tcp reject with tcp reset", reject]
    lines = [
        f"table inet {t}",  # so that the delete below never fails
        f"delete table inet {t}",
        f"table inet {t} {{",
        "  chain to_proxy {",
        "    type nat hook prerouting priority dstnat; policy accept;",
        f'    iifname "{br}" ip daddr {gw} tcp dport {net.proxy_port} dnat ip to {net.proxy_host}:{net.proxy_port}',
        "  }",
        "  chain egress {",
        "    type nat hook postrouting priority srcnat; policy accept;",
        f'    ip saddr {net.subnet} oifname != "{br}" masquerade',
        "  }",
        "  chain to_host {",
        "    type filter hook input priority filter; policy accept;",
        f'    iifname "{br}" ct state established,related accept',
        f'    iifname "{br}" ct status dnat accept',
        *(f'    iifname "{br}" {r}' for r in refuse),
        "  }",
        "  chain through_host {",
        "    type filter hook forward priority filter; policy accept;",
        # A proxy on another machine (a Swarm node's sessions call the manager's): the rewritten
        # packets leave through the host, whatever ``deny`` says of the proxy's network.
        f'    iifname "{br}" ct status dnat accept',
        *(f'    iifname "{br}" oifgroup {SESSION_IFGROUP} {r}' for r in refuse),
        *(f'    iifname "{br}" oifname "{br}" {r}' for r in refuse),
        *(f'    iifname "{br}" ip daddr {{ {deny} }} {r}' for r in (refuse if deny else [])),
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def host_commands(net: SessionNetwork, index: int) -> list[str]:
    """``ip -batch`` lines, in the host's namespace, that plug session ``index`` into the bridge."""
    name = net.name(index)
    return [
        f"link add {name} type veth peer name eth0 netns {name}",
        f"link set {name} master {net.bridge}",
        f"link set dev {name} type bridge_slave isolated on",
        f"link set {name} up",
    ]


def session_commands(net: SessionNetwork, index: int) -> list[str]:
    """``ip -batch`` lines inside the session's namespace: its address and its route out."""
    return [
        f"addr add {net.address(index)}/{net.subnet.prefixlen} dev eth0",
        "link set lo up",
        "link set eth0 up",
        f"route add default via {net.gateway}",
    ]


def bridge_commands(net: SessionNetwork) -> list[str]:
    """``ip -batch`` lines that make the bridge (when it is missing)."""
    return [
        f"link add {net.bridge} type bridge",
        f"addr add {net.gateway}/{net.subnet.prefixlen} dev {net.bridge}",
        f"link set {net.bridge} group {SESSION_IFGROUP} up",
    ]


def used_indexes(net: SessionNetwork, names: Iterable[str]) -> set[int]:
    """The indexes taken on this bridge, from the names of the namespaces that exist."""
    prefix = net.bridge + "-"
    out = set()
    for n in names:
        if n.startswith(prefix) and n[len(prefix) :].isdigit():
            out.add(int(n[len(prefix) :]))
    return out


# ---------------------------------------------------------------- I/O (root)


async def _run(args: list[str], stdin: str | None = None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate(stdin.encode() if stdin is not None else None)
    return proc.returncode or 0, out.decode(errors="replace").strip()


async def _must(args: list[str], stdin: str | None = None) -> None:
    rc, out = await _run(args, stdin)
    if rc:
        raise NetworkError(f"{' '.join(args[:4])} failed ({rc}): {out[-500:]}")


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _link_exists(name: str) -> bool:
    """Whether this network namespace has an interface ``name`` (/proc/sys/net is the caller's
    namespace; /sys/class/net is the one /sys was mounted in, wrong under ``nsenter --net``)."""
    return os.path.exists(f"/proc/sys/net/ipv4/conf/{name}")


def _taken(net: SessionNetwork) -> set[int]:
    try:
        return used_indexes(net, os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return set()


async def ensure(net: SessionNetwork, *, egress: bool = True) -> None:
    """The bridge, its address, the host's settings and this Hub's table; safe to call again."""
    if not _link_exists(net.bridge):
        rc, out = await _run(["ip", "-batch", "-"], "\n".join(bridge_commands(net)) + "\n")
        if rc and not _link_exists(net.bridge):
            raise NetworkError(f"cannot make the session bridge {net.bridge}: {out[-500:]}")
    else:
        rc, out = await _run(["ip", "-o", "-4", "addr", "show", "dev", net.bridge])
        if f" {net.gateway}/{net.subnet.prefixlen} " not in f" {out} ".replace("\n", " "):
            await _must(["ip", "addr", "add", f"{net.gateway}/{net.subnet.prefixlen}", "dev", net.bridge])
        await _must(["ip", "link", "set", net.bridge, "group", str(SESSION_IFGROUP), "up"])
    # The proxy may listen on 127.0.0.1: let the rewritten packets from the bridge reach it.
    _write(f"/proc/sys/net/ipv4/conf/{net.bridge}/route_localnet", "1")
    if egress:
        _write("/proc/sys/net/ipv4/ip_forward", "1")
    await _must(["nft", "-f", "-"], ruleset(net))


async def attach(net: SessionNetwork, start: int = 0) -> int:
    """A new namespace plugged into the bridge; returns its index.

    ``ip netns add`` refuses a name that exists, so two Hubs sharing a bridge never take one
    index twice; an index whose host interface is still there (a namespace on its way out) is
    skipped."""
    taken = _taken(net)
    for index in range(start, net.capacity):
        if index in taken or _link_exists(net.name(index)):
            continue
        rc, _ = await _run(["ip", "netns", "add", net.name(index)])
        if rc:
            continue  # taken meanwhile
        rc, out = await _run(["ip", "-batch", "-"], "\n".join(host_commands(net, index)) + "\n")
        if rc == 0:
            rc, out = await _run(
                ["ip", "-n", net.name(index), "-batch", "-"], "\n".join(session_commands(net, index)) + "\n"
            )
        if rc == 0:
            return index
        await detach(net, index)
        if "File exists" not in out:
            raise NetworkError(
                f"cannot plug session namespace {net.name(index)} into {net.bridge}: {out[-500:]}"
            )
    raise NetworkError(f"no free address left in {net.subnet} on {net.bridge}")


def bridge_filter_loaded() -> bool:
    return os.path.isdir(BRIDGE_NF)


async def filter_bridged(bridge: str) -> None:
    """Let the host's firewall see the frames ``bridge`` forwards between its ports.

    Docker plugs containers into ordinary bridge ports, which forward to each other without the
    IP layer; with ``br_netfilter`` (as Docker's own inter-container rules need it) they cross the
    ``forward`` hook, where the sessions' table refuses traffic from the bridge back into it. Set
    on this bridge only (``nf_call_iptables``), not host-wide. NetworkError when it cannot be."""
    if not bridge_filter_loaded():
        await _run(["modprobe", "br_netfilter"])
    if not bridge_filter_loaded():
        raise NetworkError(
            "the kernel's br_netfilter is not loaded (modprobe br_netfilter failed): sessions "
            f"on the bridge {bridge} could reach each other"
        )
    await _must(f"ip link set dev {bridge} type bridge nf_call_iptables 1 nf_call_ip6tables 1".split())


def exists(net: SessionNetwork, index: int) -> bool:
    return os.path.exists(net.netns_path(index))


async def detach(net: SessionNetwork, index: int) -> None:
    """Remove the session's namespace (its interface pair goes with it once its processes are gone)."""
    if exists(net, index):
        await _run(["ip", "netns", "delete", net.name(index)])
    if _link_exists(net.name(index)):
        await _run(["ip", "link", "delete", net.name(index)])


async def remove(net: SessionNetwork) -> None:
    """This Hub's table, and the bridge once no session is plugged into it (tests; uninstall)."""
    await _run(["nft", "delete", "table", "inet", net.table])
    if _link_exists(net.bridge) and not await _bridge_ports(net.bridge):
        await _run(["ip", "link", "delete", net.bridge])


async def _bridge_ports(bridge: str) -> list[str]:
    rc, out = await _run(["ip", "-o", "link", "show", "master", bridge])
    return out.splitlines() if rc == 0 else []
