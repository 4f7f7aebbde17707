"""The pure plans of a local session's isolation: its network (labfleet.spawner.sessionnet) and its control
groups (labfleet.spawner.cgroups). The real-Hub tests (tests/test_tenant_boundary.py) run them."""

from decimal import Decimal
from pathlib import Path

import pytest

from labfleet.spawner.cgroups import SessionGroup, limit_files, startup_cpu
from labfleet.spawner.sessionnet import (
    SESSION_IFGROUP,
    SessionNetwork,
    ruleset,
    session_commands,
    used_indexes,
)


def _net(**kw):
    args = {"bridge": "lf0", "subnet": "10.213.0.0/24", "proxy_host": "127.0.0.1", "proxy_port": 8000, **kw}
    return SessionNetwork.parse(**args)


def test_addresses_and_names_follow_the_index():
    net = _net()
    assert str(net.gateway) == "10.213.0.1"
    assert str(net.address(0)) == "10.213.0.2" and str(net.address(252)) == "10.213.0.254"
    assert net.capacity == 253
    with pytest.raises(ValueError):
        net.address(253)  # the broadcast address
    assert net.name(7) == "lf0-7" and net.netns_path(7) == "/run/netns/lf0-7"
    assert net.hub_url == "http://10.213.0.1:8000"
    assert used_indexes(net, ["lf0-1", "lf0-12", "lf01-3", "lf0-x", "other"]) == {1, 12}
    assert session_commands(net, 3)[0] == "addr add 10.213.0.5/24 dev eth0"
    assert "route add default via 10.213.0.1" in session_commands(net, 3)


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"bridge": "Bad"}, "lowercase"),
        ({"bridge": "muchtoolong0"}, "1 to 9"),
        ({"subnet": "10.213.0.1/24"}, "host bits"),
        ({"subnet": "10.213.0.0/30"}, "too small"),
        ({"subnet": "127.0.0.0/8"}, "loopback"),
        ({"proxy_port": 0}, "not a port"),
        ({"proxy_host": "hub.example"}, "IPv4 address"),
        ({"deny": ["nonsense"]}, "denied network"),
    ],
)
def test_bad_settings_say_what_is_wrong(kw, words):
    with pytest.raises(ValueError, match=words):
        _net(**kw)


def test_a_proxy_on_every_address_is_reached_on_the_loopback():
    assert _net(proxy_host="0.0.0.0").proxy_host == "127.0.0.1"
    assert _net(proxy_host="").proxy_host == "127.0.0.1"


def test_the_ruleset_lets_sessions_reach_the_proxy_and_the_internet_only():
    net = _net(deny=["169.254.0.0/16", "192.168.0.0/16"])
    rules = ruleset(net)
    assert rules.startswith("table inet labfleet_lf0_8000\ndelete table inet labfleet_lf0_8000\n")
    # The Hub's proxy at the gateway, wherever it listens on the host.
    assert 'iifname "lf0" ip daddr 10.213.0.1 tcp dport 8000 dnat ip to 127.0.0.1:8000' in rules
    # The host: only what was rewritten to the proxy, and answers to connections the host opened.
    to_host = rules[rules.index("chain to_host") : rules.index("chain through_host")]
    assert 'iifname "lf0" ct status dnat accept' in to_host
    assert 'iifname "lf0" ct state established,related accept' in to_host
    assert to_host.rstrip().splitlines()[-3:-1] == [
        '    iifname "lf0" meta l4proto tcp reject with tcp reset',
        '    iifname "lf0" reject with icmpx type admin-prohibited',
    ]
    # Through the host: not to other sessions (on this bridge or any other), not to denied networks.
    through = rules[rules.index("chain through_host") :]
    assert f'iifname "lf0" oifgroup {SESSION_IFGROUP} meta l4proto tcp reject with tcp reset' in through
    assert f'iifname "lf0" oifgroup {SESSION_IFGROUP} reject with icmpx' in through
    assert 'iifname "lf0" ip daddr { 169.254.0.0/16, 192.168.0.0/16 } meta l4proto tcp reject' in through
    assert 'ip saddr 10.213.0.0/24 oifname != "lf0" masquerade' in rules
    # Nothing denied: no empty set (nft refuses one).
    assert "{  }" not in ruleset(_net(deny=[]))


def test_cgroup_limits_for_both_hierarchies():
    v1 = limit_files(1, cpu=Decimal("0.5"), mem=2 << 30, pids=100)
    assert v1 == [
        ("memory", "memory.limit_in_bytes", str(2 << 30)),
        ("memory", "memory.memsw.limit_in_bytes", str(2 << 30)),
        ("cpu", "cpu.cfs_period_us", "100000"),
        ("cpu", "cpu.cfs_quota_us", "50000"),
        ("pids", "pids.max", "100"),
    ]
    assert limit_files(1, cpu=None, mem=1 << 30, pids=None, swap_file=False) == [
        ("memory", "memory.limit_in_bytes", str(1 << 30))
    ]
    v2 = limit_files(2, cpu=Decimal(2), mem=1 << 30, pids=64)
    assert v2 == [
        ("", "memory.max", str(1 << 30)),
        ("", "memory.swap.max", "0"),
        ("", "cpu.max", "200000 100000"),
        ("", "pids.max", "64"),
    ]
    assert limit_files(2, cpu=None, mem=None, pids=None) == []


def test_startup_boost_never_lowers_a_limit_nor_adds_one():
    assert startup_cpu(Decimal("0.1"), Decimal(1)) == Decimal(1)
    assert startup_cpu(Decimal(4), Decimal(1)) == Decimal(4)
    assert startup_cpu(None, Decimal(1)) is None  # no limit stays none
    assert startup_cpu(Decimal("0.25"), Decimal(0)) == Decimal("0.25")  # boost off


def test_a_group_gets_its_own_cpu_after_the_boost(tmp_path):
    for version, controller_dir, name in ((1, "cpu", "cpu.cfs_quota_us"), (2, "", "cpu.max")):
        root = tmp_path / f"v{version}"
        group = SessionGroup("labfleet", "s-1", version, root=str(root))
        for _, d in group.dirs():
            Path(d).mkdir(parents=True)
        group.set_cpu(Decimal("0.25"))
        written = (root / controller_dir / "labfleet" / "s-1" / name).read_text()
        assert written == ("25000" if version == 1 else "25000 100000")


def test_cgroup_names_are_path_components():
    g = SessionGroup("labfleet", "0b9c-4a", 1, root="/cg")
    assert g.dirs()[0] == ("memory", "/cg/memory/labfleet/0b9c-4a")
    assert SessionGroup("labfleet", "x", 2, root="/cg").dirs() == [("", "/cg/labfleet/x")]
    for bad in ("../x", "a/b", "", ".hidden"):
        with pytest.raises(ValueError):
            SessionGroup("labfleet", bad, 1)
