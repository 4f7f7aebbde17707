"""``labfleet node``: the nodes (list, drain, undrain) and node tokens for node agents; and
``labfleet agent``, the node agent itself (:mod:`labfleet.agent`).

Every change goes through :mod:`labfleet.compute.agents`, like the REST API's.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from labfleet.cli.base import CliError, Command, Group, ListCommand, Option, UsageError
from labfleet.cli.output import bytes_text, one_line


def _node_row(v: dict[str, Any]) -> list[Any]:
    gpus = len(v["devices"])
    return [
        v["name"],
        v["resource_group"],
        v["status"],
        "yes" if v["schedulable"] else "drained",
        "agent" if v["agent"] else "service",
        f"{v['allocated']['cpu']:g}/{v['capacity']['cpu']:g}",
        f"{bytes_text(v['allocated']['mem'])}/{bytes_text(v['capacity']['mem'])}",
        f"{v['allocated']['gpu.shares']:g}/{gpus}",
        mps_text(v["mps"]),
        v["last_seen"] or "-",
    ]


def mps_text(mps: Mapping[str, Any]) -> str:
    """A node's MPS daemon in one cell: ``on``, or ``off``/``failed`` with its reason."""
    state = str(mps.get("state") or "off")
    reason = mps.get("reason")
    return f"{state} ({one_line(str(reason))})" if reason and state != "on" else state


class NodeList(ListCommand):
    name = "labfleet node list"
    description = """List the nodes: status (ALIVE, LOST), whether they take new sessions, who registered
    them, and their MPS daemon (on, off or failed, with the reason)."""

    def run(self) -> None:
        from labfleet.compute import nodes

        views = self.transaction(
            lambda db: [nodes.node_view(db, n) for n in nodes.list_nodes(db, self.actor)]
        )
        self.emit(
            views,
            ["node", "group", "status", "schedulable", "by", "cpu", "mem", "gpu.shares", "mps", "last seen"],
            _node_row,
        )


class NodeDrain(Command):
    name = "labfleet node drain"
    description = "Drain a node: no new session is placed there; the sessions running there stay."
    arguments = ("NAME",)
    schedulable = False

    def run(self) -> None:
        from labfleet.compute import agents

        name = self.args[0]
        self.transaction(
            lambda db: agents.set_schedulable(db, self.actor, name, {"schedulable": self.schedulable})
        )
        self.out(f"Node {name} {'takes new sessions again' if self.schedulable else 'is drained'}.")


class NodeUndrain(NodeDrain):
    name = "labfleet node undrain"
    description = "Undrain a node: it takes new sessions again."
    schedulable = True


class TokenCreate(Command):
    name = "labfleet node token create"
    description = """Issue a node token for `labfleet agent`. It is printed once and stored hashed. With
    --node it registers that node only; without, any node name no other token's agent holds."""
    options = (
        Option("--node", "The only node name this token may register.", metavar="NAME"),
        Option(
            "--resource-group", "The resource group its nodes join.", metavar="GROUP", dest="resource_group"
        ),
        Option("--note", "A note for the token list (where it runs, who asked).", metavar="TEXT"),
    )
    examples = ("labfleet node token create --node gpu-02 --resource-group a100",)

    def run(self) -> None:
        from labfleet.compute import agents

        body = {
            k: v
            for k, v in (
                ("node", self.opts.node),
                ("resource_group", self.opts.resource_group),
                ("note", self.opts.note),
            )
            if v is not None
        }

        def work(db):
            token, plain = agents.create_token(db, self.actor, body)
            return token.id, plain

        token_id, plain = self.transaction(work)
        self.out(
            f"Node token {token_id} (shown once; give it to the agent with --token-file or LABFLEET_AGENT_TOKEN):"
        )
        self.out(plain)


def _token_row(v: dict[str, Any]) -> list[Any]:
    return [
        v["id"],
        v["node"] or "any",
        v["resource_group"] or "-",
        "revoked" if v["revoked"] else "active",
        ",".join(v["nodes"]) or "-",
        v["last_used"] or "-",
        v["note"] or "",
    ]


class TokenList(ListCommand):
    name = "labfleet node token list"
    description = "List the node tokens (never their secret)."

    def run(self) -> None:
        from labfleet.compute import agents

        views = self.transaction(
            lambda db: [agents.token_view(db, t) for t in agents.list_tokens(db, self.actor)]
        )
        self.emit(views, ["id", "node", "group", "state", "holds", "last used", "note"], _token_row)


class TokenRevoke(Command):
    name = "labfleet node token revoke"
    description = "Revoke a node token: its agent is refused from now on, and its nodes go LOST in time."
    arguments = ("ID",)

    def run(self) -> None:
        from labfleet.compute import agents

        token_id = self.args[0]
        self.transaction(lambda db: agents.revoke_token(db, self.actor, token_id))
        self.out(f"Revoked node token {token_id}.")


class Agent(Command):
    """``labfleet agent [options]``: hands its arguments to the agent application (traitlets)."""

    name = "labfleet agent"
    description = """Run the node agent on this machine: register it with the labfleet service (a node
    token), heartbeat, sample the sessions that run here. It never touches the DB."""

    @classmethod
    def parse(cls, argv: Sequence[str], given: Mapping[str, Any]) -> Command:
        return cls(argv, argparse.Namespace(db_url=None))

    @classmethod
    def help_text(cls) -> str:
        from labfleet.agent.app import LabfleetAgent

        return LabfleetAgent.help_text()

    def run(self) -> None:
        from labfleet.agent.app import main

        main(self.args)


def _cidr(value: str) -> str:
    import ipaddress

    return str(ipaddress.IPv4Network(value.strip(), strict=False))


class NodeNetwork(Command):
    """``labfleet node network``: this node's part of the Swarm sessions' network (labfleet.spawner.swarmnet)."""

    name = "labfleet node network"
    description = """Make this Swarm node's sessions' network, as root, before it takes sessions: the
    sessions' bridge, the engine's config-only network, and the firewall table that lets a session
    reach the Hub's public proxy (at its gateway) and the internet, never the node itself, another
    session, or a --deny network. On a manager, --manager also makes the Swarm network sessions join.
    Safe to run again (after a reboot: the bridge and the table do not survive one)."""
    options = (
        Option(
            "--proxy",
            "The Hub's public proxy as the nodes reach it, HOST:PORT (the port of its public URL).",
            metavar="HOST:PORT",
        ),
        Option(
            "--deny",
            "A network sessions may not reach (repeat); give the cluster's own network. Default: "
            "169.254.0.0/16 (cloud metadata), always added.",
            metavar="CIDR",
            repeat=True,
            convert=_cidr,
        ),
        Option("--bridge", "The sessions' Linux bridge (default lfswarm0).", metavar="NAME"),
        Option(
            "--subnet",
            "The sessions' addresses, the same on every node (default 10.215.0.0/16).",
            metavar="CIDR",
        ),
        Option(
            "--docker-host",
            "This node's engine (default $DOCKER_HOST or its socket).",
            metavar="URL",
            dest="docker_host",
        ),
        Option("--manager", "Also make the Swarm network (once, on a manager).", metavar=None),
        Option("--remove", "Undo it: the networks nothing uses, the firewall table.", metavar=None),
    )
    examples = (
        "labfleet node network --proxy 10.0.0.1:8000 --deny 10.0.0.0/24 --manager",
        "labfleet node network --proxy 10.0.0.1:8000 --deny 10.0.0.0/24",
    )

    @classmethod
    def parse(cls, argv: Sequence[str], given: Mapping[str, Any]) -> Command:
        cmd = super().parse(argv, given)
        if not cmd.opts.proxy:
            raise UsageError("labfleet node network: --proxy HOST:PORT is required")
        return cmd

    def run(self) -> None:
        import asyncio
        import os

        import docker

        from labfleet.spawner import sessionnet, swarmnet

        deny = [*sessionnet.DEFAULT_DENY, *(self.opts.deny or [])]
        try:
            net = swarmnet.session_network(
                self.opts.bridge or swarmnet.DEFAULT_BRIDGE,
                self.opts.subnet or swarmnet.DEFAULT_SUBNET,
                self.opts.proxy,
                deny,
            )
        except ValueError as e:
            raise UsageError(f"labfleet node network: {e}") from None
        if os.geteuid() != 0:
            raise CliError(
                "labfleet node network: run it as root (it changes the node's network and firewall)"
            )
        api = (
            docker.APIClient(base_url=self.opts.docker_host, version="auto", timeout=60)
            if self.opts.docker_host
            else docker.from_env(version="auto", timeout=60).api
        )
        try:
            if self.opts.remove:
                done = asyncio.run(
                    swarmnet.remove_node(
                        net, api, network=swarmnet.SWARM_NETWORK if self.opts.manager else None
                    )
                )
            else:
                done = asyncio.run(swarmnet.ensure_node(net, api, manager=bool(self.opts.manager)))
        except (sessionnet.NetworkError, docker.errors.DockerException) as e:
            raise CliError(f"labfleet node network: {one_line(e)}") from None
        finally:
            api.close()
        for line in done:
            self.out(line)


NODE = Group(
    "labfleet node",
    "Manage nodes and the tokens of their agents.",
    {
        "list": NodeList,
        "drain": NodeDrain,
        "undrain": NodeUndrain,
        "network": NodeNetwork,
        "token": Group(
            "labfleet node token",
            "Issue, list and revoke node tokens (for `labfleet agent`).",
            {"create": TokenCreate, "list": TokenList, "revoke": TokenRevoke},
        ),
    },
)
