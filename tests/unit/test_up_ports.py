"""scripts/ports.py, which scripts/up runs to choose the Hub's ports once and keep them: the ports
file's grammar, its writing (atomic, 0600), reuse on the next start, and a kept port that another
program holds (the real scripts/up restart is tests/test_restart_up.py)."""

import importlib.util
import os
import socket
import stat
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("up_ports", Path(__file__).parents[2] / "scripts" / "ports.py")
ports = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(ports)


def test_the_ports_file_round_trips_and_refuses_what_is_not_name_port():
    chosen = dict(zip(ports.NAMES, (8000, 41001, 41002, 41003, 41004), strict=True))
    text = ports.render(chosen)
    assert text.startswith("# ") and ports.parse_kept(text, "f") == chosen
    with pytest.raises(SystemExit, match=r"f, line 2: 'LABFLEET_NOPE=1' is not NAME=PORT"):
        ports.parse_kept("# c\nLABFLEET_NOPE=1\n", "f")
    with pytest.raises(SystemExit, match="must be a port number"):
        ports.parse_kept("LABFLEET_HUB_PORT=99999\n", "f")


def test_ports_are_chosen_once_kept_0600_and_reused(tmp_path, capsys):
    state = tmp_path / "state"
    state.mkdir()
    ports_file = str(state / "ports")
    ports.main(["127.0.0.1", str(state), ports_file])
    first = capsys.readouterr()
    chosen = [int(p) for p in first.out.split()]
    assert len(set(chosen)) == 5 and "ports kept in" in first.err
    assert stat.S_IMODE(os.stat(ports_file).st_mode) == 0o600
    for s in ports.held:
        s.close()
    ports.held.clear()
    ports.main(["127.0.0.1", str(state), ports_file])
    again = capsys.readouterr()
    assert [int(p) for p in again.out.split()] == chosen and "ports kept" not in again.err
    for s in ports.held:
        s.close()
    ports.held.clear()
    # A kept port another program holds stops it, naming the port and the holder, and moves nothing.
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", chosen[1]))
        squatter.listen()
        with pytest.raises(SystemExit) as e:
            ports.main(["127.0.0.1", str(state), ports_file])
        assert f"LABFLEET_HUB_PORT={chosen[1]}" in str(e.value) and f"pid {os.getpid()}" in str(e.value)
    for s in ports.held:
        s.close()
    ports.held.clear()
    assert ports.parse_kept(Path(ports_file).read_text(), "f")["LABFLEET_HUB_PORT"] == chosen[1]
