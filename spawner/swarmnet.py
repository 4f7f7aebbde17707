"""The Swarm sessions' network: a bridge of their own on every node, guarded like local sessions'.

A Swarm service joins only Swarm-scoped networks. labfleet's is a *bridge* network of Swarm scope
(:data:`SWARM_NETWORK`) made ``--config-from`` a config-only network each node holds
(:data:`NODE_NETWORK`), which names that node's Linux bridge and subnet. Every node uses the same
subnet (nothing is routed between nodes' bridges), so every session calls the Hub's public proxy at
the same gateway address, whichever node it runs on.

On each node, ``labfleet node network`` (run as root, before the node takes sessions) makes:

- the bridge (:func:`labfleet.spawner.sessionnet.bridge_commands`: the gateway's address, the session
  interface group), which Docker then uses as it is, and ``br_netfilter`` on it;
- the config-only network on the node's engine (:func:`node_network_spec`);
- the node's nftables table (:func:`labfleet.spawner.sessionnet.ruleset`): a session reaches the proxy at
  ``gateway:<proxy port>`` (rewritten to the proxy's address, on this node or another), the
  internet through the node (masqueraded), and nothing else: not the node itself, not another
  session, not the ``deny`` networks (give the cluster's own network there: the Hub's and the
  nodes' other ports);
- on a manager, with ``--manager``, the Swarm network itself (:func:`swarm_network_spec`).

The Hub reaches a session's server through the port its node publishes for it (Swarm's host-mode
publishing: Docker's proxy on the node forwards it to the container), at the node's ``address``.
The specs are pure; :func:`ensure_node` and :func:`remove_node` do the I/O (``ip``, ``nft``, the
engine's API).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

import docker

from . import sessionnet
from .docker_config import BRIDGE_NAME_OPTION, session_bridge_config

SWARM_NETWORK = "labfleet-sessions"  # the Swarm-scoped network sessions join
NODE_NETWORK = "labfleet-sessions-node"  # each node's config-only network it is made from
DEFAULT_BRIDGE = "lfswarm0"
DEFAULT_SUBNET = "10.215.0.0/16"


def proxy_endpoint(value: str) -> tuple[str, int]:
    """``HOST:PORT`` of the Hub's public proxy as the nodes reach it; ValueError says what is wrong."""
    host, sep, port = (value or "").strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"the proxy {value!r:.80}: expected HOST:PORT, e.g. 10.0.0.1:8000")
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        raise ValueError(f"the proxy {value!r:.80}: HOST must be an IPv4 address") from None
    return host, int(port)


def node_network_spec(bridge: str, subnet: str, name: str = NODE_NETWORK) -> dict[str, Any]:
    """The body of ``POST /networks/create`` for a node's config-only network (docker-py has no
    ``ConfigOnly``): the Docker backend's bridge network settings, made a configuration only."""
    options, ipam, labels = session_bridge_config(bridge, subnet)
    return {
        "Name": name,
        "ConfigOnly": True,
        "Options": options,
        "IPAM": ipam,
        "Labels": labels,
        "CheckDuplicate": True,
    }


def swarm_network_spec(name: str = SWARM_NETWORK, config_from: str = NODE_NETWORK) -> dict[str, Any]:
    """The body of ``POST /networks/create`` for the Swarm-scoped bridge network sessions join."""
    return {
        "Name": name,
        "Driver": "bridge",
        "Scope": "swarm",
        "ConfigFrom": {"Network": config_from},
        "CheckDuplicate": True,
    }


def node_network_matches(network: Mapping[str, Any], bridge: str, subnet: str) -> str | None:
    """None when an existing config-only network (``inspect_network``) is the one asked for, else
    what differs (the operator must remove it or ask for what it is)."""
    options = network.get("Options") or {}
    configs = (network.get("IPAM") or {}).get("Config") or []
    subnets = {str(c.get("Subnet")) for c in configs if isinstance(c, Mapping)}
    if not network.get("ConfigOnly"):
        return "it is not a config-only network"
    if options.get(BRIDGE_NAME_OPTION) != bridge:
        return f"its bridge is {options.get(BRIDGE_NAME_OPTION)!r}, not {bridge!r}"
    if subnets != {str(ipaddress.IPv4Network(subnet, strict=True))}:
        return f"its subnet is {', '.join(sorted(subnets)) or 'none'}, not {subnet}"
    return None


def session_network(
    bridge: str, subnet: str, proxy: str, deny: Iterable[str] = sessionnet.DEFAULT_DENY
) -> sessionnet.SessionNetwork:
    """The node's guarded network (the same rules as local and Docker sessions'); ValueError."""
    host, port = proxy_endpoint(proxy)
    return sessionnet.SessionNetwork.parse(bridge, subnet, host, port, deny)


def gateway_url(subnet: str, proxy_port: int) -> str:
    """Where a session on any node calls the Hub's public proxy."""
    net = ipaddress.IPv4Network(subnet, strict=True)
    return f"http://{net.network_address + 1}:{proxy_port}"


# ---------------------------------------------------------------- I/O (root, the node's engine)


def _create(api: Any, body: dict[str, Any]) -> None:
    res = api._post_json(api._url("/networks/create"), data=body)
    api._result(res, json=True)


def _inspect(api: Any, name: str) -> dict[str, Any] | None:
    try:
        return api.inspect_network(name)
    except docker.errors.NotFound:
        return None


async def ensure_node(
    net: sessionnet.SessionNetwork,
    api: Any,
    *,
    manager: bool = False,
    network: str = SWARM_NETWORK,
    node_network: str = NODE_NETWORK,
) -> list[str]:
    """Make this node's part (see the module doc); safe to run again. ``api``: docker-py's
    ``APIClient`` of the node's engine. Returns what it did, a line each. NetworkError or
    docker's errors say what failed."""
    done: list[str] = []
    # The bridge first, so that Docker takes it as it is (our address, our interface group).
    await sessionnet.ensure(net)
    await sessionnet.filter_bridged(net.bridge)
    done.append(
        f"bridge {net.bridge} ({net.gateway}/{net.subnet.prefixlen}) guarded by nftables table {net.table}"
    )
    found = _inspect(api, node_network)
    if found is None:
        _create(api, node_network_spec(net.bridge, str(net.subnet), node_network))
        done.append(f"config-only network {node_network} made")
    else:
        differs = node_network_matches(found, net.bridge, str(net.subnet))
        if differs:
            raise sessionnet.NetworkError(
                f"the engine's network {node_network} exists and {differs}: remove it (docker network rm "
                f"{node_network}) or ask for what it is"
            )
        done.append(f"config-only network {node_network} kept")
    if manager:
        swarm = _inspect(api, network)
        if swarm is None:
            _create(api, swarm_network_spec(network, node_network))
            done.append(f"Swarm network {network} made")
        elif (swarm.get("ConfigFrom") or {}).get("Network") != node_network or swarm.get("Scope") != "swarm":
            raise sessionnet.NetworkError(
                f"the Swarm network {network} exists but is not made from {node_network}: remove it first"
            )
        else:
            done.append(f"Swarm network {network} kept")
    return done


async def remove_node(
    net: sessionnet.SessionNetwork, api: Any, *, network: str | None = None, node_network: str = NODE_NETWORK
) -> list[str]:
    """Undo :func:`ensure_node` as far as nothing uses it (the Swarm network when named; the
    config-only network; this Hub's table; the bridge once no session is on it)."""
    done: list[str] = []
    for name in [n for n in (network, node_network) if n]:
        try:
            api.remove_network(name)
            done.append(f"network {name} removed")
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            done.append(f"network {name} kept: {e.explanation or e}")
    await sessionnet.remove(net)
    done.append(f"nftables table {net.table} removed")
    return done
