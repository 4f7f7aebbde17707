"""The app services' pure parts (server_ext/apps.py): command lines, which launchers appear for a PATH, the
user's choices, and the image's service ports (LABFLEET_SERVICE_PORTS) including malformed ones."""

from __future__ import annotations

import json
import os

import pytest
from jupyter_server_proxy.config import ServerProcess
from traitlets.config import Config, Configurable

from labfleet.session import apps
from labfleet.session.handlers.apps import configured_servers, link_apps

PORTS = [
    {"name": "echo", "protocol": "http", "port": 8080},
    {"name": "notes", "protocol": "preopen", "port": 8081},
    {"name": "vnc", "protocol": "tcp", "port": 5901},
]


def render(command: list[str], port: int = 4321, base_url: str = "/user/alice/work/") -> list[str]:
    """What jupyter-server-proxy runs: every argument goes through str.format."""
    return [arg.format(port=port, base_url=base_url, unix_socket="") for arg in command]


def programs(tmp_path, *names: str) -> dict[str, str]:
    """An environment whose PATH holds exactly these (runnable) programs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in names:
        path = bin_dir / name
        path.write_text("#!/bin/sh\nexit 0\n")
        path.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {"PATH": str(bin_dir), "HOME": str(home), "JUPYTERHUB_SERVER_NAME": "work"}


# -- command lines ---------------------------------------------------------------------------------------


def test_tensorboard_command_serves_below_the_proxy_prefix_on_loopback():
    cmd = render(apps.tensorboard_command("/opt/bin/tensorboard", "/home/a/runs {x}"))
    assert cmd == [
        "/opt/bin/tensorboard",
        "--logdir",
        "/home/a/runs {x}",  # braces survive jupyter-server-proxy's format()
        "--host",
        "127.0.0.1",
        "--port",
        "4321",
        "--path_prefix",
        "/user/alice/work/tensorboard",
    ]


def test_mlflow_command_store_prefix_and_origins():
    cmd = render(apps.mlflow_command("mlflow", "sqlite:////h/mlflow.db", "/h/mlartifacts"))
    assert cmd[:6] == ["mlflow", "server", "--host", "127.0.0.1", "--port", "4321"]
    args = dict(zip(cmd[2::2], cmd[3::2], strict=False))
    assert args["--backend-store-uri"] == "sqlite:////h/mlflow.db"
    assert args["--artifacts-destination"] == "/h/mlartifacts"
    assert args["--static-prefix"] == "/user/alice/work/mlflow" and args["--workers"] == "1"
    assert "--cors-allowed-origins" not in cmd
    with_origins = render(apps.mlflow_command("mlflow", "x", "y", ["https://hub.example.org"]))
    assert with_origins[-2:] == ["--cors-allowed-origins", "https://hub.example.org"]


def test_mlflow_origins_from_the_hub_public_urls():
    env = {
        "JUPYTERHUB_PUBLIC_URL": "https://hub.example.org/user/alice/work/",
        "JUPYTERHUB_PUBLIC_HUB_URL": "https://hub.example.org/hub/",
        "MLFLOW_SERVER_CORS_ALLOWED_ORIGINS": "https://a.example.org, ",
    }
    assert apps.mlflow_origins(env) == ["https://a.example.org", "https://hub.example.org"]
    assert apps.mlflow_origins({"JUPYTERHUB_PUBLIC_URL": ""}) == []


def test_code_server_has_no_auth_of_its_own_listens_on_loopback_and_keeps_state_per_session():
    cmd = render(apps.code_server_command("/x/code-server", "/home/a", "work"))
    args = dict(zip(cmd[1:-1:2], cmd[2:-1:2], strict=False))
    assert args["--auth"] == "none" and args["--bind-addr"] == "127.0.0.1:4321"
    assert args["--user-data-dir"] == "/home/a/.labfleet/code-server/sessions/work"
    assert args["--extensions-dir"] == "/home/a/.labfleet/code-server/extensions"
    assert cmd[-1] == "/home/a"  # the folder it opens
    default = render(apps.code_server_command("cs", "/home/a", ""))
    assert "/home/a/.labfleet/code-server/sessions/default" in default


# -- the user's choices -----------------------------------------------------------------------------------


def test_tensorboard_logdir_env_then_settings_then_home():
    env = {"HOME": "/home/a"}
    assert apps.tensorboard_logdir(env, {}) == "/home/a"
    settings = {"tensorboard": {"logdir": "runs/exp1"}}
    assert apps.tensorboard_logdir(env, settings) == "/home/a/runs/exp1"
    assert apps.tensorboard_logdir(env, {"tensorboard": {"logdir": "~/logs"}}) == "/home/a/logs"
    env_choice = dict(env, LABFLEET_TENSORBOARD_LOGDIR="/data/tb")
    assert apps.tensorboard_logdir(env_choice, settings) == "/data/tb"
    # A setting of the wrong shape is no choice.
    assert apps.tensorboard_logdir(env, {"tensorboard": "runs"}) == "/home/a"
    assert apps.tensorboard_logdir(env, {"tensorboard": {"logdir": 3}}) == "/home/a"


def test_mlflow_store_defaults_to_the_home():
    env = {"HOME": "/home/a"}
    assert apps.mlflow_store(env, {}) == ("sqlite:////home/a/mlflow.db", "/home/a/mlartifacts")
    rel = {"mlflow": {"backend_store_uri": "sqlite:///db/m.db", "artifacts_destination": "art"}}
    assert apps.mlflow_store(env, rel) == ("sqlite:////home/a/db/m.db", "/home/a/art")
    assert apps.mlflow_store(env, {"mlflow": {"backend_store_uri": "mlruns"}})[0] == "/home/a/mlruns"
    pg = dict(env, LABFLEET_MLFLOW_BACKEND_STORE_URI="postgresql://db/mlflow")
    assert apps.mlflow_store(pg, rel)[0] == "postgresql://db/mlflow"


def test_settings_file_missing_broken_and_good(tmp_path):
    warnings: list[str] = []
    assert apps.load_settings(str(tmp_path), warnings.append) == {}
    (tmp_path / ".labfleet").mkdir()
    path = tmp_path / ".labfleet" / "apps.json"
    path.write_text("{not json")
    assert apps.load_settings(str(tmp_path), warnings.append) == {}
    path.write_text("[1]")
    assert apps.load_settings(str(tmp_path), warnings.append) == {}
    assert len(warnings) == 2 and all(str(path) in w for w in warnings)
    path.write_text(json.dumps({"tensorboard": {"logdir": "runs"}}))
    assert apps.load_settings(str(tmp_path)) == {"tensorboard": {"logdir": "runs"}}


# -- which launchers appear --------------------------------------------------------------------------------


def test_a_launcher_appears_only_when_its_program_is_on_path(tmp_path):
    env = programs(tmp_path, "tensorboard", "mlflow")
    assert [item.name for item in apps.available_launchers(env)] == ["tensorboard", "mlflow"]
    with pytest.raises(apps.AppUnavailable, match="'code-server' is not on PATH"):
        apps.launcher_config("vscode", env)
    assert apps.available_launchers({"PATH": str(tmp_path / "nothing")}) == []
    everything = programs(tmp_path, "tensorboard", "mlflow", "code-server")
    assert [item.name for item in apps.available_launchers(everything)] == ["tensorboard", "vscode", "mlflow"]
    # A file that is not executable is not a program.
    (tmp_path / "bin" / "code-server").chmod(0o644)
    assert "vscode" not in [item.name for item in apps.available_launchers(everything)]


def test_the_image_serving_a_launcher_name_wins(tmp_path):
    env = programs(tmp_path, "tensorboard")
    env[apps.SERVICE_PORTS_ENV] = json.dumps([{"name": "tensorboard", "protocol": "http", "port": 6006}])
    with pytest.raises(apps.AppUnavailable, match="image serves 'tensorboard'"):
        apps.launcher_config("tensorboard", env)
    listed, servers, problems = apps.session_apps(env)
    assert [(a.name, a.source) for a in listed] == [("tensorboard", "image")]
    assert servers["tensorboard"]["port"] == 6006 and problems == []


def test_launcher_configs_are_valid_server_processes_with_the_users_choice(tmp_path):
    env = programs(tmp_path, "tensorboard", "mlflow", "code-server")
    home = env["HOME"]
    os.makedirs(os.path.join(home, ".labfleet"))
    with open(os.path.join(home, ".labfleet", "apps.json"), "w") as f:
        json.dump({"tensorboard": {"logdir": "runs"}}, f)
    for name in ("tensorboard", "mlflow", "vscode"):
        config = apps.launcher_config(name, env)
        process = ServerProcess(name=name, **config)  # what jupyter-server-proxy builds from it
        assert process.timeout == apps.START_TIMEOUT and process.launcher_entry.enabled
        cmd = render(config["command"]())
        assert cmd[0] == os.path.join(env["PATH"], apps.launcher(name).program)
    tb = render(apps.launcher_config("tensorboard", env)["command"]())
    assert tb[tb.index("--logdir") + 1] == os.path.join(home, "runs")
    assert apps.launcher_config("tensorboard", env)["absolute_url"] is True
    mlflow = apps.launcher_config("mlflow", env)
    assert mlflow["request_headers_override"] == {"Host": "127.0.0.1:{port}"}
    mlflow["command"]()
    assert os.path.isdir(os.path.join(home, "mlartifacts"))  # made when it starts
    vscode = render(apps.launcher_config("vscode", env)["command"]())
    assert vscode[vscode.index("--user-data-dir") + 1].endswith("/sessions/work")


# -- the image's service ports --------------------------------------------------------------------------------


def test_service_ports_parse():
    ports, problems = apps.parse_service_ports(json.dumps(PORTS))
    assert ports == PORTS and problems == []
    assert apps.parse_service_ports(None) == ([], [])
    assert apps.parse_service_ports("  ") == ([], [])


@pytest.mark.parametrize(
    "raw, words",
    [
        ("{nope", "not JSON"),
        ('{"name": "x"}', "must be a JSON list"),
        ('["echo:http:80"]', "not an object"),
        ('[{"name": "9lives", "protocol": "http", "port": 80}]', "name must be"),
        ('[{"name": "x", "protocol": "udp", "port": 80}]', "protocol must be one of http, tcp, preopen"),
        ('[{"name": "x", "protocol": "http", "port": 70000}]', "port must be a number"),
        ('[{"name": "x", "protocol": "http", "port": "80"}]', "port must be a number"),
        ('[{"name": "x", "protocol": "http", "port": true}]', "port must be a number"),
        ('[{"name": "x", "protocol": "http"}]', "port must be a number"),
    ],
)
def test_malformed_service_ports_are_left_out_with_a_reason(raw, words):
    ports, problems = apps.parse_service_ports(raw)
    assert ports == [] and len(problems) == 1 and words in problems[0]


def test_a_bad_entry_does_not_hide_the_good_ones_and_duplicates_keep_the_first():
    raw = json.dumps([PORTS[0], {"name": "bad"}, dict(PORTS[0], port=9), PORTS[2]])
    ports, problems = apps.parse_service_ports(raw)
    assert ports == [PORTS[0], PORTS[2]]
    assert len(problems) == 2 and "declared twice" in problems[1]


def test_image_servers_proxy_http_and_tcp_and_skip_reserved_and_configured_names():
    raw = json.dumps(
        [
            *PORTS,
            {"name": "lab", "protocol": "http", "port": 1},
            {"name": "mine", "protocol": "http", "port": 2},
        ]
    )
    servers, listed, problems = apps.image_servers(raw, configured=["mine"])
    assert sorted(servers) == ["echo", "notes", "vnc"]
    echo = ServerProcess(name="echo", **servers["echo"])
    assert (
        echo.port == 8080 and not echo.command and not echo.raw_socket_proxy and echo.launcher_entry.enabled
    )
    vnc = ServerProcess(name="vnc", **servers["vnc"])
    assert vnc.raw_socket_proxy and not vnc.launcher_entry.enabled  # a browser cannot open raw TCP
    assert [(a.name, a.protocol) for a in listed] == [("echo", "http"), ("notes", "preopen"), ("vnc", "tcp")]
    assert any("/lab/" in p for p in problems) and any("c.ServerProxy.servers" in p for p in problems)
    assert listed[0].view("/user/alice/work/") == {
        "name": "echo",
        "title": "echo",
        "url": "/user/alice/work/echo/",
        "source": "image",
        "protocol": "http",
    }


class FakeServer(Configurable):
    """Just what link_apps uses of a ServerApp: its config."""


class Log:
    def __init__(self):
        self.lines: list[str] = []

    def warning(self, msg, *args):
        self.lines.append(msg % args)

    info = warning


def test_link_apps_adds_the_image_ports_beside_the_users_servers(tmp_path):
    config = Config()
    config.ServerProxy.servers = {"echo": {"port": 1234}, "own": {"command": ["x", "{port}"]}}
    server = FakeServer(config=config)
    env = programs(tmp_path, "mlflow")
    env[apps.SERVICE_PORTS_ENV] = json.dumps(PORTS)
    log = Log()
    listed = link_apps(server, log, env)
    servers = configured_servers(server.config)
    assert servers["echo"] == {"port": 1234}  # the user's own, not the image's
    assert servers["own"] == {"command": ["x", "{port}"]}
    assert servers["notes"]["port"] == 8081 and servers["vnc"]["raw_socket_proxy"] is True
    assert [(a.name, a.source) for a in listed] == [
        ("mlflow", "launcher"),
        ("notes", "image"),
        ("vnc", "image"),
    ]
    assert any("echo" in line and "c.ServerProxy.servers" in line for line in log.lines)


def test_link_apps_without_ports_changes_no_config(tmp_path):
    server = FakeServer(config=Config())
    assert link_apps(server, Log(), programs(tmp_path)) == []
    assert "ServerProxy" not in server.config and configured_servers(server.config) == {}
