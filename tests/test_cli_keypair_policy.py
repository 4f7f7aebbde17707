"""The ``labfleet`` command's keypair policy options (issue 27, item 5), run as subprocesses:
``--max-keypairs`` on user resource policies and ``--allowed-keypair-policies`` on domains; bad
values exit non-zero with one clear line and change nothing.  One test, few processes (each is
~0.4 s): the refusals run side by side, and what the commands wrote is read from the file."""

from __future__ import annotations

import json

from tests.test_cli import Cli


def test_max_keypairs_and_a_domains_allowed_keypair_policies(tmp_path):
    cli = Cli(tmp_path)
    cli("init")
    cli("policy", "create", "user", "three", "--max-keypairs", "3")
    out = cli("domain", "create", "acme", "--allowed-keypair-policies", "default,")
    assert "keypair policies its admins may give: default" in out
    assert cli.sql("SELECT max_keypairs FROM user_resource_policies WHERE name = 'three'") == [(3,)]
    allowed = "SELECT allowed_keypair_policies FROM domains WHERE name = 'acme'"
    assert [json.loads(v) for (v,) in cli.sql(allowed)] == [["default"]]

    before = cli.dump()
    refusals = [
        (["policy", "update", "user", "three", "--max-keypairs", "-1"], "max_keypairs"),
        (["policy", "update", "user", "three", "--max-keypairs", "many"], "--max-keypairs: expected a whole"),
        (
            ["policy", "create", "keypair", "k2", "--max-keypairs", "2"],
            "--max-keypairs: only for user policies, not keypair policies",
        ),
        (
            ["domain", "update", "acme", "--allowed-keypair-policies", "default,nope"],
            "allowed_keypair_policies: no keypair policy named 'nope' (create it first)",
        ),
    ]
    problems = []
    for (args, piece), p in zip(refusals, cli.run_many([a for a, _ in refusals]), strict=True):
        lines = p.stderr.splitlines()
        if p.returncode == 0 or len(lines) != 1 or not lines[0].startswith("labfleet: error: "):
            problems.append(f"labfleet {' '.join(args)}: exit {p.returncode}, stderr {p.stderr!r}")
        elif piece not in lines[0]:
            problems.append(f"labfleet {' '.join(args)}: {lines[0]!r} does not say {piece!r}")
    assert not problems, "\n".join(problems)
    assert cli.dump() == before  # nothing changed

    cli("policy", "update", "user", "three", "--max-keypairs", "0")  # 0: no limit
    out = cli("domain", "update", "acme", "--allowed-keypair-policies", "")  # '' clears the list
    assert "keypair policies its admins may give: none" in out
    assert cli.sql("SELECT max_keypairs FROM user_resource_policies WHERE name = 'three'") == [(0,)]
    assert [json.loads(v) for (v,) in cli.sql(allowed)] == [[]]
    actions = [a for (a,) in cli.sql("SELECT action FROM audit_log WHERE target = 'acme' ORDER BY id")]
    assert actions == ["domain.create", "domain.update"]
