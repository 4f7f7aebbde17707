"""Backend.AI's model-definition.yaml subset: parsed with Backend.AI's health-check defaults, bad ones
refused with a message that says what is wrong; the command line a replica runs."""

from __future__ import annotations

import subprocess

import pytest

from labfleet.core.errors import InvalidInput
from labfleet.serving.definition import (
    HealthCheck,
    ModelService,
    check_env,
    command_line,
    parse_definition,
    replica_command,
)

BACKEND_AI_EXAMPLE = """
models:
  - name: "simple-http-server"
    model_path: "/models"
    service:
      start_command:
        - python
        - -m
        - http.server
        - --directory
        - /home/work
        - "8000"
      port: 8000
      health_check:
        path: /
        max_retries: 3
"""


def test_backend_ai_example_with_defaults():
    svc = parse_definition(BACKEND_AI_EXAMPLE)
    assert svc.name == "simple-http-server" and svc.model_path == "/models" and svc.port == 8000
    assert svc.start_command == ("python", "-m", "http.server", "--directory", "/home/work", "8000")
    # What the file leaves out takes Backend.AI's defaults.
    assert svc.health_check == HealthCheck(
        path="/",
        interval=10.0,
        max_retries=3,
        max_wait_time=15.0,
        expected_status_code=200,
        initial_delay=60.0,
    )
    assert HealthCheck() == HealthCheck("/", 10.0, 10, 15.0, 200, 60.0)


def test_string_command_no_health_check_and_actions():
    svc = parse_definition(
        "models:\n- service:\n    start_command: python3 serve.py --port $PORT\n    port: 9000\n"
        "    pre_start_actions:\n    - action: mkdir\n      args: {path: cache}\n"
        "    - action: write_file\n      args: {filename: c.txt, body: 'hi', mode: '600'}\n"
    )
    assert svc.start_command == "python3 serve.py --port $PORT" and svc.health_check is None
    assert [a["action"] for a in svc.pre_start_actions] == ["mkdir", "write_file"]
    assert ModelService.from_json(svc.to_json()) == svc


@pytest.mark.parametrize(
    "text, words",
    [
        ("models:\n- service:\n    start_command: [python3, x.py]\n", "port is missing"),
        ("models:\n- service:\n    port: 80\n", "start_command is missing"),
        ("models:\n- service:\n    start_command: []\n    port: 80\n", "start_command is missing"),
        ("models: [\n  - service: {port: 80\n", "not valid YAML at line"),
        ("models: []\n", "at least one model"),
        ("just text\n", "at least one model"),
        ("models:\n- name: x\n", "service is missing"),
        ("models:\n- service:\n    start_command: x\n    port: 70000\n", "port must be from 1 to 65535"),
        ("models:\n- service:\n    start_command: x\n    port: eighty\n", "port must be a whole number"),
        (
            "models:\n- service:\n    start_command: x\n    port: 80\n    health_check: {path: health}\n",
            "must be a URL path",
        ),
        (
            "models:\n- service:\n    start_command: x\n    port: 80\n    health_check: {path: /, interval: -1}\n",
            "interval must be from",
        ),
        (
            "models:\n- service:\n    start_command: x\n    port: 80\n    health_check: {path: /, every: 3}\n",
            "unknown health_check field",
        ),
        (
            "models:\n- service:\n    start_command: x\n    port: 80\n    pre_start_actions: [{action: rm_rf}]\n",
            "not one labfleet runs",
        ),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_bad_definitions_say_what_is_wrong(text, words):
    with pytest.raises(InvalidInput) as e:
        parse_definition(text)
    assert words in e.value.message and e.value.message.startswith("model-definition.yaml: ")
    assert e.value.status == 400


def test_the_replica_gets_its_own_port():
    svc = parse_definition(BACKEND_AI_EXAMPLE)
    # The argument that was the definition's port becomes the replica's.
    assert command_line(svc, port=41000).endswith("/home/work 41000")
    svc2 = parse_definition("models:\n- service:\n    start_command: serve --port {port}\n    port: 80\n")
    assert command_line(svc2, port=41000) == "serve --port 41000"


def test_env_checks():
    assert check_env({"A": "1", "B_2": 3}) == {"A": "1", "B_2": "3"}
    for bad in ({"1A": "x"}, {"PORT": "1"}, {"LABFLEET_X": "1"}, {"A": None}, ["A"]):
        with pytest.raises(InvalidInput):
            check_env(bad)


def test_replica_command_runs_in_the_folder_with_port_host_and_env(tmp_path):
    folder = tmp_path / "vfolders" / "my model"
    folder.mkdir(parents=True)
    svc = parse_definition(
        "models:\n- service:\n    start_command: [sh, -c, 'echo $PORT $HOST $GREETING $(pwd) $(cat made/f)', '80']\n"
        "    port: 80\n    pre_start_actions:\n    - action: mkdir\n      args: {path: made}\n"
        '    - action: write_file\n      args: {filename: made/f, body: "it\'s here"}\n'
    )
    cmd = replica_command(svc, folder="my model", env={"GREETING": "a b"})
    # The definition's port becomes the placeholder the session's runner fills with the command's port
    # (as it sets $PORT); the command listens on the loopback whatever the spawner says: the replica's
    # front listens where the router reaches it (LABFLEET_INFERENCE_HOST), never the command.
    assert cmd.endswith(" {port}") and "export PORT" not in cmd
    cmd = cmd.replace("{port}", "4321")
    base = {"LABFLEET_VFOLDER_DIR": str(tmp_path / "vfolders"), "PATH": "/usr/bin:/bin", "PORT": "4321"}
    for extra in ({}, {"LABFLEET_INFERENCE_HOST": "0.0.0.0"}):
        out = subprocess.run(
            ["bash", "-c", cmd], env={**base, **extra}, capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"4321 127.0.0.1 a b {folder} it's here"


def test_a_list_command_keeps_its_arguments_quoted_and_the_placeholder_bare():
    svc = parse_definition(
        "models:\n- service:\n    start_command: [serve, 'a b', '--port={port}', '80']\n    port: 80\n"
    )
    assert command_line(svc, port="{port}") == "serve 'a b' '--port={port}' {port}"
    assert command_line(svc, port=41000) == "serve 'a b' --port=41000 41000"
