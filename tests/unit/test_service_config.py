"""Configuration like every Jupyter app: configure(c, ...) takes settings as arguments and hands them
to the service's command line without touching os.environ; the service reads
labfleet_service_config.py, and its command line wins; --help-all lists every option."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from traitlets.config import Config

from labfleet.core.envtraits import EnvError, env_names, load_env_fallbacks, parse_env
from labfleet.core.secretbox import ensure_key_file
from labfleet.hub.configure import configure, service_args
from labfleet.service.app import LabfleetService

REPO = Path(__file__).resolve().parents[2]

MOCK = [{"model": "A100-80GB", "memory": "80g", "count": 2}]


def test_service_args_give_one_argument_per_item():
    args = service_args(
        {"schedule_interval": 2.5, "device_plugins": ["mock", "nvidia"], "mock_devices": MOCK}
    )
    assert args == [
        "--LabfleetService.schedule_interval=2.5",
        "--LabfleetService.device_plugins=mock",
        "--LabfleetService.device_plugins=nvidia",
        f"--LabfleetService.mock_devices={json.dumps(MOCK[0])}",
    ]


def test_configure_passes_settings_to_the_service_and_leaves_the_environment_alone(tmp_path, monkeypatch):
    monkeypatch.delenv("LABFLEET_ADMIN_PORT", raising=False)
    for name in (
        "LABFLEET_DB_URL",
        "LABFLEET_SECRET_KEY_FILE",
        "LABFLEET_SESSION_LOG_DIR",
        "LABFLEET_STORAGE_HOSTS",
    ):
        monkeypatch.delenv(name, raising=False)
    before = dict(os.environ)
    c = Config()
    configure(
        c,
        tmp_path,
        service_port=12345,
        db_url="postgresql://lf:secret@db/lf",
        device_plugins=["mock"],
        mock_devices=MOCK,
        service_config={"schedule_interval": 2, "idle_check_interval": 7},
    )
    assert dict(os.environ) == before
    service, console = c.JupyterHub.services
    # The admin console beside it: a Hub login with no confirmation page, tokens that reach the service
    assert console["name"] == "labfleet-admin" and console["oauth_no_confirm"] is True
    assert console["oauth_client_allowed_scopes"] == ["access:services!service=labfleet"]
    assert console["url"] == "http://127.0.0.1:12346"
    assert console["environment"]["LABFLEET_SERVICE_URL"] == "http://127.0.0.1:12345/services/labfleet/api"
    assert service["url"] == "http://127.0.0.1:12345"
    command = service["command"]
    # The DB URL may carry a password: in the service's environment, never on its command line.
    assert not any("secret" in a for a in command)
    assert service["environment"]["LABFLEET_DB_URL"] == "postgresql://lf:secret@db/lf"
    # The command line the Hub runs is one the service understands: parse it back.
    app = LabfleetService()
    app.parse_command_line(command[3:])
    assert app.schedule_interval == 2 and app.idle_check_interval == 7
    assert app.device_plugins == ["mock"] and app.mock_devices == MOCK
    assert app.session_log_dir == str(tmp_path / "session-logs")
    assert [h["name"] for h in app.storage_hosts] == ["local"]
    assert app.storage_hosts[0]["path"] == str(tmp_path / "vfolders")
    assert [i["name"] for i in app.default_images] == [c.LabfleetSpawnerMixin.default_image] == ["local/host"]


@pytest.mark.parametrize(
    "argument, variable, runs",
    [(None, None, True), (False, None, False), (None, "0", False), (None, "off", False), (True, "0", True)],
)
def test_the_admin_console_can_be_left_out(tmp_path, monkeypatch, argument, variable, runs):
    if variable is None:
        monkeypatch.delenv("LABFLEET_ADMIN_CONSOLE", raising=False)
    else:
        monkeypatch.setenv("LABFLEET_ADMIN_CONSOLE", variable)
    c = Config()
    c.JupyterHub.template_vars = {"announcement": "kept"}
    configure(c, tmp_path, service_port=12345, db_url="sqlite:///x.sqlite", admin_console=argument)
    names = [s["name"] for s in c.JupyterHub.services]
    assert names == (["labfleet", "labfleet-admin"] if runs else ["labfleet"])
    # The pages' "Fleet admin" link follows; the deployment's own template variables stay
    assert c.JupyterHub.template_vars == {"announcement": "kept", "labfleet_console": runs}


def test_every_labfleet_variable_of_the_hub_reaches_the_service(tmp_path, monkeypatch):
    """Set in the environment of `jupyterhub -f jupyterhub_config.py`, a LABFLEET_* setting reaches
    the service (which reads it as its default), but configure()'s own arguments win."""
    monkeypatch.setenv("LABFLEET_IDLE_CHECK_INTERVAL", "3")
    monkeypatch.setenv("LABFLEET_IDLE_TIMEOUT", "900")
    monkeypatch.setenv("LABFLEET_DB_URL", "sqlite:///elsewhere.sqlite")
    monkeypatch.setenv("DOCKER_HOST", "unix:///tmp/docker.sock")
    monkeypatch.setenv("UNRELATED_SECRET", "x")
    c = Config()
    configure(c, tmp_path, service_port=12345, db_url="sqlite:///given.sqlite", device_plugins=["mock"])
    service, _ = c.JupyterHub.services
    env = service["environment"]
    assert env["LABFLEET_IDLE_CHECK_INTERVAL"] == "3" and env["LABFLEET_IDLE_TIMEOUT"] == "900"
    assert env["DOCKER_HOST"] == "unix:///tmp/docker.sock" and "UNRELATED_SECRET" not in env
    assert env["LABFLEET_DB_URL"] == "sqlite:///given.sqlite"
    for name, value in env.items():
        if name.startswith("LABFLEET_"):
            monkeypatch.setenv(name, value)
    app = LabfleetService()
    load_env_fallbacks(app, {})  # as its initialize() does, after its config file and command line
    assert app.idle_check_interval == 3 and app.idle_timeout == 900


def test_the_service_reads_its_config_file_and_the_command_line_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LABFLEET_SECRET_KEY_FILE", str(tmp_path / "key"))
    ensure_key_file(tmp_path / "key")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "token-of-the-service")
    monkeypatch.delenv("JUPYTERHUB_API_URL", raising=False)
    (tmp_path / "labfleet_service_config.py").write_text(
        "c.LabfleetService.schedule_interval = 3\n"
        "c.LabfleetService.idle_check_interval = 11\n"
        "c.LabfleetService.register_local_node = False\n"
        f"c.LabfleetService.storage_hosts = [{{'name': 'here', 'path': {str(tmp_path / 'vf')!r}}}]\n"
    )
    app = LabfleetService()
    app.initialize(
        [f"--db-url=sqlite:///{tmp_path / 'lf.sqlite'}", "--LabfleetService.idle_check_interval=5"]
    )
    try:
        assert app.schedule_interval == 3  # from the file
        assert app.idle_check_interval == 5  # the command line wins
        assert app.vfolder_default_host == "here"
    finally:
        app.engine.dispose()


def test_help_all_lists_every_option_with_its_help():
    out = subprocess.run(
        [sys.executable, "-m", "labfleet.service", "--help-all"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    for trait in LabfleetService.class_own_traits(config=True):
        assert f"--LabfleetService.{trait}" in out.stdout, trait
    text = " ".join(out.stdout.split())
    assert "a pending timeout fires within this" in text
    assert "labfleet_service_config.py" in text


def test_a_hub_started_with_sigint_ignored_starts_interruptible_children():
    """Run in a process that starts with SIGINT ignored (a background job of a script): after
    interruptible_children(), a child it starts neither ignores SIGINT nor outlives one."""
    code = (
        "import signal, subprocess, sys\n"
        "from labfleet.hub.configure import interruptible_children\n"
        "before = subprocess.run(['grep', 'SigIgn', '/proc/self/status'], capture_output=True, text=True).stdout\n"
        "interruptible_children()\n"
        "after = subprocess.run(['grep', 'SigIgn', '/proc/self/status'], capture_output=True, text=True).stdout\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "child.send_signal(signal.SIGINT)\n"
        "print(before.split()[1], after.split()[1], child.wait(30))\n"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import signal, os, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); exec({code!r})",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    before, after, code_of_child = out.stdout.split()
    sigint = 1 << (signal.SIGINT - 1)
    assert int(before, 16) & sigint and not int(after, 16) & sigint
    assert int(code_of_child) != 0  # interrupted (KeyboardInterrupt), not a 60 s sleep


def test_the_hubs_spawn_limit_grows_by_what_the_fleet_may_queue(tmp_path):
    """Queued sessions are pending spawns: a queue full to its limit leaves the Hub's own default
    for sessions that start at once (issue [2/7]: 100 queued had locked every spawn out)."""
    c = Config()
    configure(c, tmp_path, service_port=12345, admin_console=False)
    assert c.JupyterHub.concurrent_spawn_limit == 100 + 200
    c = Config()
    configure(c, tmp_path, service_port=12345, admin_console=False, service_config={"max_queued_sessions": 7})
    assert c.JupyterHub.concurrent_spawn_limit == 107
    app = LabfleetService()
    app.parse_command_line(c.JupyterHub.services[0]["command"][3:])
    assert app.max_queued_sessions == 7 and app.max_pending_per_user == 20
    # An unlimited queue: the Hub's limit cannot be sized for it, so the Hub limits nothing either
    c = Config()
    configure(c, tmp_path, service_port=12345, admin_console=False, service_config={"max_queued_sessions": 0})
    assert c.JupyterHub.concurrent_spawn_limit == 0
    # A deployment's own choice stays
    c = Config()
    c.JupyterHub.concurrent_spawn_limit = 30
    configure(c, tmp_path, service_port=12345, admin_console=False)
    assert c.JupyterHub.concurrent_spawn_limit == 30


# ---------------------------------------------------------------- options that fall back on variables

# A value each kind of option takes from its variable, and what it then is.
SAMPLES = {
    "Unicode": ("some-text", "some-text"),
    "Float": ("2.5", 2.5),
    "Int": ("7", 7),
    "List": ("mock, nvidia", ["mock", "nvidia"]),
    "ListOfObjects": ('[{"name": "x", "path": "/srv/x"}]', [{"name": "x", "path": "/srv/x"}]),
}


def _sample(trait):
    kind = type(trait).__name__
    if kind == "List" and type(getattr(trait, "_trait", None)).__name__ != "Unicode":
        kind = "ListOfObjects"
    return SAMPLES[kind]


ENV_OPTIONS = sorted(n for n, t in LabfleetService.class_traits(config=True).items() if env_names(t))


def test_the_service_reads_no_variable_but_through_its_options():
    """The variables are declared on the options (one loader reads them): no default of the
    service's reads the environment itself, but the one that asks whether the Hub started it."""
    source = (REPO / "hub_ext" / "service" / "app.py").read_text()
    cls = source[source.index("class LabfleetService(") :]
    reads = [line.strip() for line in cls.splitlines() if "os.environ" in line]
    assert reads == ['return bool(os.environ.get("JUPYTERHUB_SERVICE_NAME"))'], reads
    assert len(ENV_OPTIONS) >= 25


@pytest.mark.parametrize("option", ENV_OPTIONS)
def test_an_option_falls_back_on_its_variable_and_configuration_wins(option, monkeypatch):
    trait = LabfleetService.class_traits()[option]
    names = env_names(trait)
    if option == "mps":
        raw, value = "off", "off"
    elif option == "environment_index_url":  # a URL, checked
        raw = value = "http://pypi.example.org/simple/"
    else:
        raw, value = _sample(trait)
    for name in names:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(names[-1], raw)  # the last of them too (a former name)
    app = LabfleetService()
    assert load_env_fallbacks(app, {}) == [option]
    assert getattr(app, option) == value
    # Set in the config file or on the command line: the variable is not read.
    assert load_env_fallbacks(LabfleetService(), {option: "set in the config"}) == []


@pytest.mark.parametrize(
    ("name", "raw", "says"),
    [
        ("LABFLEET_SCHEDULE_INTERVAL", "soon", "not a number"),
        ("LABFLEET_NODE_LOST_AFTER", "2.5", "not a whole number"),
        ("LABFLEET_MOCK_DEVICES", "[{not json", "not JSON"),
        ("LABFLEET_NODE_LOST_AFTER", "0", "must be more than 0"),
        ("LABFLEET_MPS", "sometimes", "LABFLEET_MPS"),
        ("LABFLEET_ENVIRONMENT_INDEX_URL", "ftp://mirror/simple", "not an http(s) URL"),
        ("LABFLEET_ENVIRONMENT_BUILDS_MAX", "0", "must be more than 0"),
    ],
)
def test_a_variable_that_cannot_be_read_is_refused_by_name(name, raw, says, monkeypatch):
    monkeypatch.setenv(name, raw)
    with pytest.raises(EnvError) as e:
        load_env_fallbacks(LabfleetService(), {})
    assert f"${name}=" in str(e.value) and says in str(e.value)


def test_the_service_started_with_a_bad_variable_stops_with_its_name(tmp_path):
    env = {**os.environ, "LABFLEET_SCHEDULE_INTERVAL": "soon"}
    out = subprocess.run(
        [sys.executable, "-m", "labfleet.service", f"--db-url=sqlite:///{tmp_path / 'lf.sqlite'}"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 2, out.stderr
    assert "$LABFLEET_SCHEDULE_INTERVAL='soon': not a number" in out.stderr
    assert not (tmp_path / "lf.sqlite").exists()  # nothing was done


def test_help_all_lists_each_options_variables():
    out = subprocess.run(
        [sys.executable, "-m", "labfleet.service", "--help-all"], capture_output=True, text=True, timeout=60
    )
    text = " ".join(out.stdout.split())
    for option in ENV_OPTIONS:
        trait = LabfleetService.class_traits()[option]
        listed = "Environment: " + ", then ".join(f"${n}" for n in env_names(trait))
        assert listed in text, option
    assert parse_env(LabfleetService.class_traits()["register_local_node"], "X", "yes") is True


# ---------------------------------------------------------------- the node agent: the same loader


AGENT_ENV = (
    "LABFLEET_AGENT_SERVICE_URL",
    "LABFLEET_AGENT_TOKEN",
    "LABFLEET_AGENT_TOKEN_FILE",
    "LABFLEET_AGENT_NODE",
    "LABFLEET_AGENT_MOCK_DEVICES",
    "LABFLEET_MOCK_DEVICES",
    "LABFLEET_AGENT_MPS",
    "DOCKER_HOST",
)


@pytest.fixture
def agent_env(monkeypatch):
    for name in AGENT_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LABFLEET_AGENT_SERVICE_URL", "http://127.0.0.1:9/services/labfleet/api")
    monkeypatch.setenv("LABFLEET_AGENT_TOKEN", "node-token")
    return monkeypatch


def _agent(argv):
    from labfleet.agent.app import LabfleetAgent

    agent = LabfleetAgent()
    agent.initialize(argv)
    return agent


def test_the_agent_reads_its_variables_and_its_command_line_wins(agent_env):
    agent_env.setenv("LABFLEET_AGENT_NODE", "from-env")
    agent_env.setenv("LABFLEET_MOCK_DEVICES", "3")  # the second variable of mock_devices
    agent_env.setenv("LABFLEET_AGENT_MPS", "off")
    agent = _agent(["--node-name=from-argv"])
    assert (agent.service_url, agent.token) == ("http://127.0.0.1:9/services/labfleet/api", "node-token")
    assert agent.node_name == "from-argv"
    assert agent.mock_devices == "3" and agent.mps == "off"
    assert agent.device_plugins == "mock" and agent.docker_host == ""  # the traits' own defaults
    agent_env.setenv("LABFLEET_AGENT_MOCK_DEVICES", "1")  # the first variable wins over the second
    assert _agent([]).mock_devices == "1"


def test_the_agents_help_names_each_options_variable():
    from labfleet.agent.app import LabfleetAgent

    text = LabfleetAgent.help_text()
    for name in (
        "$LABFLEET_AGENT_SERVICE_URL",
        "$LABFLEET_AGENT_NODE",
        "$DOCKER_HOST",
        "$LABFLEET_AGENT_MPS",
    ):
        assert f"Environment: {name}" in text, name


def test_the_agent_refuses_a_bad_variable_with_exit_2(agent_env):
    agent_env.setenv("LABFLEET_AGENT_MPS", "sometimes")
    with pytest.raises(SystemExit) as e:
        _agent([])
    assert e.value.code == 2
