"""labfleet.spawner.swarmnet: the Swarm sessions' network of a node, as plain values (no engine, no nft)."""

import pytest

from labfleet.spawner import sessionnet, swarmnet


def test_proxy_endpoint():
    assert swarmnet.proxy_endpoint("10.0.0.1:8000") == ("10.0.0.1", 8000)
    for bad in ("", "10.0.0.1", "10.0.0.1:", "10.0.0.1:0", "10.0.0.1:70000", "hub.example.org:8000", ":80"):
        with pytest.raises(ValueError, match="the proxy"):
            swarmnet.proxy_endpoint(bad)


def test_every_node_has_the_same_gateway():
    assert swarmnet.gateway_url("10.215.0.0/16", 8000) == "http://10.215.0.1:8000"


def test_node_network_is_config_only_on_its_bridge():
    spec = swarmnet.node_network_spec("lfswarm0", "10.215.0.0/16")
    assert spec["Name"] == swarmnet.NODE_NETWORK and spec["ConfigOnly"] is True
    assert spec["Options"]["com.docker.network.bridge.name"] == "lfswarm0"
    assert spec["IPAM"]["Config"] == [{"Subnet": "10.215.0.0/16", "Gateway": "10.215.0.1"}]
    # Swarm refuses options of its own on a network made from a config-only one.
    swarm = swarmnet.swarm_network_spec()
    assert swarm == {
        "Name": swarmnet.SWARM_NETWORK,
        "Driver": "bridge",
        "Scope": "swarm",
        "ConfigFrom": {"Network": swarmnet.NODE_NETWORK},
        "CheckDuplicate": True,
    }


def test_an_existing_node_network_must_be_the_one_asked_for():
    found = {
        "ConfigOnly": True,
        "Options": {"com.docker.network.bridge.name": "lfswarm0"},
        "IPAM": {"Config": [{"Subnet": "10.215.0.0/16", "Gateway": "10.215.0.1"}]},
    }
    assert swarmnet.node_network_matches(found, "lfswarm0", "10.215.0.0/16") is None
    assert "subnet is 10.215.0.0/16, not 10.216.0.0/16" in swarmnet.node_network_matches(
        found, "lfswarm0", "10.216.0.0/16"
    )
    assert "bridge is 'lfswarm0', not 'other0'" in swarmnet.node_network_matches(
        found, "other0", "10.215.0.0/16"
    )
    assert "not a config-only" in swarmnet.node_network_matches(
        {**found, "ConfigOnly": False}, "lfswarm0", "10.215.0.0/16"
    )


def test_a_node_forwards_its_gateway_to_the_proxy_on_another_machine():
    net = swarmnet.session_network(
        "lfswarm0", "10.215.0.0/16", "10.77.0.1:8000", ["169.254.0.0/16", "10.77.0.0/30"]
    )
    rules = sessionnet.ruleset(net)
    assert 'iifname "lfswarm0" ip daddr 10.215.0.1 tcp dport 8000 dnat ip to 10.77.0.1:8000' in rules
    # The proxy is in a denied network (the cluster's): what was rewritten to it passes, first.
    forward = rules[rules.index("chain through_host") :]
    assert forward.index("ct status dnat accept") < forward.index("10.77.0.0/30")
    with pytest.raises(ValueError, match="session bridge"):
        swarmnet.session_network("Bad-Bridge", "10.215.0.0/16", "10.77.0.1:8000")
