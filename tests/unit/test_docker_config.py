"""labfleet.spawner.docker_config: a LaunchSpec as DockerSpawner settings, the sessions' network (pure, no daemon)."""

from dataclasses import replace
from decimal import Decimal

import pytest
from docker.types import DeviceRequest

from labfleet.spawner import sessionnet
from labfleet.spawner.docker_config import (
    ContainerConfig,
    container_config,
    gateway_environment,
    image_environment,
    network_bridge,
    session_network_spec,
)
from labfleet.spawner.launch import LaunchSpec, Mount, build_launch, mps_withheld_for
from labfleet.spawner.options import parse_options

U0 = "GPU-11111111-2222-3333-4444-555555555555"
U1 = "GPU-66666666-7777-8888-9999-000000000000"
GIB = 2**30
HARDENING = {
    "pids_limit": 4096,
    "security_opt": ["no-new-privileges:true"],
    "cap_drop": ["ALL"],
    "port_bindings": None,  # nothing published on the host: the proxy connects to the container
    "init": True,
}
LABELS = {
    "ai.labfleet.session-id": "s-1",
    "ai.labfleet.user": "alice",
    "ai.labfleet.project": "acme/ml",
}


def _spec(devices=(), slots=None, mounts=(), mps=False, mps_withheld=None, **options) -> LaunchSpec:
    session = {
        "id": "s-1",
        "name": "gpu",
        "user": "alice",
        "project": "acme/ml",
        "resource_group": "default",
        "node": "node-1",
        "slots": {"cpu": "2", "mem": 4 * GIB} if slots is None else slots,
        "devices": list(devices),
    }
    opts = parse_options({"project": "acme/ml", "image": "lab/py:1", **options})
    return build_launch(
        session, opts, mounts=tuple(mounts), mps=mps, mps_withheld=mps_withheld, in_container=True
    )


def _gpu(uuid, index, shares):
    return {"uuid": uuid, "index": index, "model": "A100-80GB", "memory": 80 * GIB, "shares": shares}


def test_no_gpu_session():
    spec = _spec()
    cfg = container_config(spec)
    assert isinstance(cfg, ContainerConfig)
    assert cfg == ContainerConfig(
        image="lab/py:1",
        mem_limit=4 * GIB,
        cpu_limit=2.0,
        environment=dict(spec.env),
        volumes={},
        extra_host_config={**HARDENING, "network_mode": "host", "memswap_limit": 4 * GIB},
        extra_create_kwargs={"labels": LABELS},
        network_name="host",
        cmd=None,
    )
    # The spec's environment says there is no device; no device is requested from Docker.
    assert cfg.environment["CUDA_VISIBLE_DEVICES"] == ""
    assert cfg.environment["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert cfg.environment["LABFLEET_GPU_SHARES"] == "0"
    assert cfg.environment["LABFLEET_SESSION_ID"] == "s-1"
    assert "device_requests" not in cfg.extra_host_config
    assert "ipc_mode" not in cfg.extra_host_config


def test_whole_devices_are_requested_by_uuid():
    spec = _spec(devices=[_gpu(U0, 0, 1), _gpu(U1, 1, 1)], gpu=2)
    cfg = container_config(spec)
    requests = cfg.extra_host_config["device_requests"]
    assert requests == [DeviceRequest(driver="nvidia", device_ids=[U0, U1], capabilities=[["gpu"]])]
    assert requests[0] == {
        "Driver": "nvidia",
        "Count": 0,
        "DeviceIDs": [U0, U1],
        "Capabilities": [["gpu"]],
        "Options": {},
    }
    # Inside the container the devices are renumbered from 0.
    assert cfg.environment["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert cfg.environment["NVIDIA_VISIBLE_DEVICES"] == f"{U0},{U1}"
    assert cfg.environment["LABFLEET_GPU_SHARES"] == "2"
    assert "ipc_mode" not in cfg.extra_host_config
    assert cfg.volumes == {}


def test_fraction_with_mps_binds_the_pipe_dir_and_shares_ipc():
    spec = _spec(devices=[_gpu(U1, 1, 0.5)], mps=True, gpu=0.5)
    cfg = container_config(spec, mps_pipe_dir="/run/nvidia-mps", user="1000:1000")
    assert cfg.extra_create_kwargs["user"] == "1000:1000"  # the one non-root uid of the node's clients
    assert cfg.extra_host_config == {
        **HARDENING,
        "network_mode": "host",
        "memswap_limit": 4 * GIB,
        "device_requests": [DeviceRequest(driver="nvidia", device_ids=[U1], capabilities=[["gpu"]])],
        "ipc_mode": "host",
    }
    assert cfg.volumes == {"/run/nvidia-mps": {"bind": "/run/nvidia-mps", "mode": "rw"}}
    assert cfg.environment == {**spec.env, "CUDA_MPS_PIPE_DIRECTORY": "/run/nvidia-mps"}
    assert cfg.environment["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert cfg.environment["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=40960M"
    assert cfg.environment["LABFLEET_GPU_SHARES"] == "0.5"
    assert cfg.environment["CUDA_VISIBLE_DEVICES"] == "0"
    # Pure: the spec is not changed.
    assert "CUDA_MPS_PIPE_DIRECTORY" not in spec.env


def test_fraction_without_mps_uses_framework_caps_only():
    spec = _spec(devices=[_gpu(U0, 0, 0.25)], gpu=0.25)
    # A pipe directory alone does not turn MPS on: the spec decides.
    cfg = container_config(spec, mps_pipe_dir="/run/nvidia-mps")
    assert "ipc_mode" not in cfg.extra_host_config
    assert cfg.volumes == {}
    assert "CUDA_MPS_PIPE_DIRECTORY" not in cfg.environment
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in cfg.environment
    assert cfg.environment["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.25"
    assert cfg.environment["LABFLEET_GPU_MEMORY_LIMIT"] == str(20 * GIB)
    assert cfg.extra_host_config["device_requests"] == [
        DeviceRequest(driver="nvidia", device_ids=[U0], capabilities=[["gpu"]])
    ]


def test_a_fractions_pytorch_cap_merges_with_the_images_own_setting():
    inspected = {
        "Config": {"Env": ["PATH=/opt/conda/bin", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "X"]}
    }
    image_env = image_environment(inspected)
    assert image_env == {"PATH": "/opt/conda/bin", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert image_environment({"Config": {"Env": None}}) == {}
    cfg = container_config(_spec(devices=[_gpu(U0, 0, 0.25)], gpu=0.25), image_env=image_env)
    # A container's variable replaces the image's: the image's options are kept in ours.
    assert (
        cfg.environment["PYTORCH_CUDA_ALLOC_CONF"]
        == "expandable_segments:True,per_process_memory_fraction:0.25"
    )
    assert cfg.environment["LABFLEET_GPU_ENFORCEMENT"] == "caps" and "PATH" not in cfg.environment
    # A whole device: no cap, the image's setting stands.
    whole = _spec(devices=[_gpu(U0, 0, 1)], gpu=1)
    assert container_config(whole, image_env=image_env).environment == whole.env


def test_whole_device_with_mps_on_the_node_needs_no_pipe():
    # MPS limits only fractions; a whole device is the session's alone.
    cfg = container_config(_spec(devices=[_gpu(U0, 0, 1)], mps=True, gpu=1))
    assert "ipc_mode" not in cfg.extra_host_config
    assert cfg.volumes == {}


def test_mps_fraction_without_a_pipe_dir_is_refused():
    spec = _spec(devices=[_gpu(U0, 0, 0.5)], mps=True, gpu=0.5)
    with pytest.raises(ValueError, match="MPS pipe directory"):
        container_config(spec)
    with pytest.raises(ValueError, match="absolute path"):
        container_config(spec, mps_pipe_dir="nvidia-mps")


@pytest.mark.parametrize(
    "user, words",
    [
        (None, "image's own user"),
        ("", "image's own user"),
        ("0", "root"),
        ("0:0", "root"),
        ("00:1000", "root"),
        ("root", "root"),
        ("root:users", "root"),
        ("jovyan", "is a name"),
        ("jovyan:1000", "is a name"),
        ("1000:", "not uid[:gid]"),
        (":1000", "not uid[:gid]"),
        ("1000:1000:1", "not uid[:gid]"),
        ("-1", "not uid[:gid]"),
        (" 1000", "not uid[:gid]"),
        ("1000\n", "not uid[:gid]"),
    ],
)
def test_mps_is_withheld_unless_the_session_runs_as_a_numeric_non_root_uid(user, words):
    reason = mps_withheld_for(user)
    assert reason and words in reason, reason
    # The builder refuses such a container for a fraction limited with MPS (the spawner withholds
    # MPS first); a whole device, or a fraction on caps, runs as that user.
    spec = _spec(devices=[_gpu(U0, 0, 0.5)], mps=True, gpu=0.5)
    with pytest.raises(ValueError, match="with MPS, but"):
        container_config(spec, mps_pipe_dir="/run/nvidia-mps", user=user)
    caps = _spec(devices=[_gpu(U0, 0, 0.5)], gpu=0.5)
    assert container_config(caps, mps_pipe_dir="/run/nvidia-mps", user=user).volumes == {}
    whole = _spec(devices=[_gpu(U0, 0, 1)], mps=True, gpu=1)
    assert container_config(whole, mps_pipe_dir="/run/nvidia-mps", user=user).volumes == {}


@pytest.mark.parametrize("user", ["1000", "1000:1000", "1000:users", "65534:65534"])
def test_mps_is_given_to_a_numeric_non_root_uid(user):
    assert mps_withheld_for(user) is None
    spec = _spec(devices=[_gpu(U0, 0, 0.5)], mps=True, gpu=0.5)
    cfg = container_config(spec, mps_pipe_dir="/run/nvidia-mps", user=user)
    assert cfg.extra_create_kwargs["user"] == user and cfg.extra_host_config["ipc_mode"] == "host"


def test_a_withheld_fraction_holds_by_the_caps_and_says_why():
    reason = mps_withheld_for("0:0")
    spec = _spec(devices=[_gpu(U0, 0, 0.5)], mps=True, gpu=0.5, mps_withheld=reason)
    assert not spec.mps and spec.mps_withheld == reason
    cfg = container_config(spec, mps_pipe_dir="/run/nvidia-mps", user="0:0")
    assert cfg.volumes == {} and "ipc_mode" not in cfg.extra_host_config
    assert cfg.environment["LABFLEET_GPU_ENFORCEMENT"] == "caps"
    assert cfg.environment["LABFLEET_GPU_MPS_WITHHELD"] == reason
    assert cfg.environment["PYTORCH_CUDA_ALLOC_CONF"] == "per_process_memory_fraction:0.5"
    for name in (
        "CUDA_MPS_PIPE_DIRECTORY",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    ):
        assert name not in cfg.environment
    # A whole device needs no MPS: nothing is withheld from it, nothing said.
    whole = _spec(devices=[_gpu(U0, 0, 1)], mps=True, gpu=1, mps_withheld=reason)
    assert whole.mps_withheld is None and "LABFLEET_GPU_MPS_WITHHELD" not in whole.env


def test_no_gpu_driver_requests_no_device():
    cfg = container_config(_spec(devices=[_gpu(U0, 0, 0.5)], gpu=0.5), gpu_driver=None)
    assert "device_requests" not in cfg.extra_host_config
    assert cfg.environment["NVIDIA_VISIBLE_DEVICES"] == U0


def test_mounts_ro_rw_wd():
    mounts = [
        Mount("/srv/data/ref", "/home/jovyan/vfolders/ref", "ro"),
        Mount("/srv/data/work", "/home/jovyan/vfolders/work", "rw"),
        Mount("/srv/data/scratch", "/home/jovyan/vfolders/scratch", "wd"),
    ]
    cfg = container_config(_spec(mounts=mounts))
    assert cfg.volumes == {
        "/srv/data/ref": {"bind": "/home/jovyan/vfolders/ref", "mode": "ro"},
        "/srv/data/work": {"bind": "/home/jovyan/vfolders/work", "mode": "rw"},
        "/srv/data/scratch": {"bind": "/home/jovyan/vfolders/scratch", "mode": "rw"},
    }


def test_mounts_docker_cannot_express():
    with pytest.raises(ValueError, match="mounted twice"):
        container_config(_spec(mounts=[Mount("/srv/a", "/x/a", "ro"), Mount("/srv/a", "/x/b", "rw")]))
    with pytest.raises(ValueError, match="same target"):
        container_config(_spec(mounts=[Mount("/srv/a", "/x/a", "ro"), Mount("/srv/b", "/x/a", "rw")]))
    spec = _spec(devices=[_gpu(U0, 0, 0.5)], mps=True, gpu=0.5, mounts=[Mount("/run/mps", "/data", "ro")])
    with pytest.raises(ValueError, match="mounted twice"):
        container_config(spec, mps_pipe_dir="/run/mps", user="1000")


def test_limits():
    cfg = container_config(_spec(slots={"cpu": "0.5", "mem": 256 * 2**20}))
    assert (cfg.cpu_limit, cfg.mem_limit) == (0.5, 256 * 2**20)
    assert cfg.extra_host_config["memswap_limit"] == 256 * 2**20
    unlimited = container_config(_spec(slots={}))
    assert (unlimited.cpu_limit, unlimited.mem_limit) == (None, None)
    assert "memswap_limit" not in unlimited.extra_host_config
    assert "LABFLEET_CPU_LIMIT" not in unlimited.environment
    pids = container_config(replace(_spec(), pids_limit=512))
    assert pids.extra_host_config["pids_limit"] == 512


def test_limits_docker_cannot_express():
    with pytest.raises(ValueError, match="minimum"):
        container_config(_spec(slots={"mem": 1024}))
    with pytest.raises(ValueError, match="cpu limit"):
        container_config(replace(_spec(), cpu=Decimal(0)))
    with pytest.raises(ValueError, match="pids limit"):
        container_config(replace(_spec(), pids_limit=0))


def test_network_host_or_a_docker_network():
    assert container_config(_spec()).extra_host_config["network_mode"] == "host"
    cfg = container_config(_spec(), network_name="labfleet-net")
    assert cfg.network_name == "labfleet-net"
    assert cfg.extra_host_config["network_mode"] == "labfleet-net"
    bridge = container_config(_spec(), network_name="bridge")
    assert (bridge.network_name, bridge.extra_host_config["network_mode"]) == ("bridge", "bridge")
    with pytest.raises(ValueError, match="network"):
        container_config(_spec(), network_name=" ")


def test_labels_user_and_command():
    spec = _spec(type="batch", command="python train.py")
    cfg = container_config(spec, user="1000:1000", extra_labels={"team": "vision", "ai.labfleet.user": "x"})
    # labfleet's own labels win over extra ones.
    assert cfg.extra_create_kwargs == {"labels": {"team": "vision", **LABELS}, "user": "1000:1000"}
    # Batch sessions run the image's command; the runner inside reads the command from the env.
    assert cfg.cmd is None
    assert cfg.environment["LABFLEET_SESSION_TYPE"] == "batch"
    assert cfg.environment["LABFLEET_COMMAND"] == "python train.py"
    assert "user" not in container_config(spec).extra_create_kwargs


def test_specs_a_container_cannot_run():
    with pytest.raises(ValueError, match="no image"):
        container_config(replace(_spec(), image=None))
    gpus = _spec(devices=[_gpu(U0, 0, 1), _gpu(U1, 1, 1)], gpu=2).gpus
    mixed = replace(_spec(), gpus=(gpus[0], replace(gpus[1], shares=Decimal("0.5"))))
    with pytest.raises(ValueError, match="whole devices or a fraction"):
        container_config(mixed)
    twice = replace(_spec(), gpus=(gpus[0], gpus[0]))
    with pytest.raises(ValueError, match="twice"):
        container_config(twice)


# -- the Docker backend applies a ContainerConfig (no daemon: only the spawner's settings) --------------


class _User:
    name = "alice"
    url = "/user/alice/"


class _OrmSpawner:
    name = "gpu"
    display_name = ""
    server = None
    state = None


def _docker_spawner(**config):
    from labfleet.spawner.docker import LabfleetDockerSpawner

    s = LabfleetDockerSpawner(user=_User(), orm_spawner=_OrmSpawner(), **config)

    async def no_engine(method, *args, **kwargs):
        if method == "inspect_image":  # a fraction's caps merge with the image's own environment
            return {"Config": {"Env": []}}
        raise AssertionError(f"no Docker engine in unit tests: {method}")

    s.docker = no_engine
    return s


NET = sessionnet.SessionNetwork.parse("lfdock0", "10.214.0.0/16", "127.0.0.1", 8000)


async def _guarded():
    return NET


async def test_backend_applies_the_config_over_the_deployments_settings():
    s = _docker_spawner(
        network_name="host",
        volumes={"/srv/shared/{username}": {"bind": "/shared", "mode": "ro"}},
        extra_host_config={"cpu_period": 50_000, "cap_drop": ["NET_RAW"], "shm_size": "1g"},
        extra_create_kwargs={"labels": {"team": "vision"}},
    )
    spec = _spec(
        devices=[_gpu(U0, 0, 0.5)],
        gpu=0.5,
        mounts=[Mount("/srv/data/{odd}", "/home/jovyan/odd", "rw")],
    )
    await s.lf_prepare(spec)
    assert s.image == "lab/py:1"
    assert (s.mem_limit, s.cpu_limit) == (4 * GIB, 2.0)
    # The deployment's volume template stays a template; labfleet's path is kept literal.
    assert s.volumes == {
        "/srv/shared/{username}": {"bind": "/shared", "mode": "ro"},
        "/srv/data/{{odd}}": {"bind": "/home/jovyan/odd", "mode": "rw"},
    }
    host = s.extra_host_config
    # labfleet's hardening wins; the deployment's other settings stay.
    assert host["cap_drop"] == ["ALL"] and host["cpu_period"] == 50_000 and host["shm_size"] == "1g"
    assert host["auto_remove"] is False and host["port_bindings"] is None
    assert host["device_requests"] == [
        DeviceRequest(driver="nvidia", device_ids=[U0], capabilities=[["gpu"]])
    ]
    assert s.extra_create_kwargs == {"labels": {"team": "vision", **LABELS}, "user": "1000:1000"}
    # Host networking: loopback and a port of its own for every start.
    assert s.ip == "127.0.0.1" and s.port != 8888
    assert await s.get_ip_and_port() == ("127.0.0.1", s.port)
    # labfleet admitted the image: DockerSpawner's allowed_images does not apply.
    s.lf_launch = spec
    assert await s.check_allowed("lab/py:1") == "lab/py:1"
    # A second start begins again from the deployment's settings, not from the first start's.
    await s.lf_prepare(_spec(slots={}))
    assert s.volumes == {"/srv/shared/{username}": {"bind": "/shared", "mode": "ro"}}
    assert (s.mem_limit, s.cpu_limit) == (0, 0.0)
    assert "device_requests" not in s.extra_host_config


async def test_backend_merges_a_callable_host_config_and_skips_mock_devices():
    async def per_user(spawner):
        return {"shm_size": f"{len(spawner.user.name)}g", "pids_limit": 10}

    s = _docker_spawner(network_name="labfleet-net", extra_host_config=per_user, gpu_driver="nvidia")
    s.lf_session_network = _guarded  # no engine, no nftables here
    mock = "GPU-mock-0123abcd-0000-0000-0000-000000000000"
    await s.lf_prepare(_spec(devices=[_gpu(mock, 0, 1)], gpu=1))
    host = await s.extra_host_config(s)
    assert host["shm_size"] == "5g" and host["pids_limit"] == 4096
    assert host["network_mode"] == "labfleet-net" and host["port_bindings"] is None
    assert "device_requests" not in host  # Docker cannot give a mock device
    assert s.ip == "0.0.0.0" and s.port == 8888


def test_backend_exit_codes():
    s = _docker_spawner()
    s.object_id = "abc"
    assert s.lf_exit_code("ExitCode=3, Error='', FinishedAt=2026-01-01T00:00:00Z") == 3
    assert s.lf_exit_code("ExitCode=137, Error='', FinishedAt=x") == 137
    assert s.lf_exit_code(None) is None
    s.object_id = ""
    assert s.lf_exit_code(0) is None  # the container is gone: its exit code is unknown


async def test_backend_refuses_a_spec_docker_cannot_express():
    s = _docker_spawner()
    with pytest.raises(RuntimeError, match="cannot run this session in Docker: .*no image"):
        await s.lf_prepare(replace(_spec(), image=None))


async def test_backend_hands_the_containers_environment_to_the_session():
    from types import SimpleNamespace

    s = _docker_spawner(network_name="host", mps_pipe_dir="/run/nvidia-mps")
    s.api_token = "t"
    s.hub = SimpleNamespace(
        public_host="", url="/hub/", api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/"
    )
    await s.lf_prepare(_spec(devices=[_gpu(U1, 1, 0.5)], mps=True, gpu=0.5))
    env = s.get_env()
    # The MPS pipe directory the container config adds, beside the spec's own variables
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia-mps"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50" and env["LABFLEET_GPU_SHARES"] == "0.5"


async def test_backend_gives_mps_only_to_its_numeric_non_root_container_user():
    from labfleet.spawner.launch import mps_withheld_for

    assert _docker_spawner().lf_mps_withheld() is None  # 1000:1000
    for user in ("", "0:0", "root", "jovyan"):
        assert _docker_spawner(container_user=user).lf_mps_withheld() == mps_withheld_for(user or None)
    # A session given MPS runs as container_user, whatever the deployment's create kwargs say.
    s = _docker_spawner(network_name="host", extra_create_kwargs={"user": "0:0", "hostname": "h"})
    await s.lf_prepare(_spec(devices=[_gpu(U1, 1, 0.5)], mps=True, gpu=0.5))
    assert s.extra_create_kwargs["user"] == "1000:1000" and s.extra_create_kwargs["hostname"] == "h"
    assert s.extra_host_config["ipc_mode"] == "host"


async def test_backend_merges_the_pytorch_cap_with_the_deployments_and_the_images():
    from types import SimpleNamespace

    s = _docker_spawner(network_name="host", environment={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    s.api_token = "t"
    s.hub = SimpleNamespace(
        public_host="", url="/hub/", api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/"
    )
    asked = []

    async def engine(method, *args, **kwargs):
        asked.append((method, args))
        assert method == "inspect_image"
        return {
            "Config": {
                "Env": ["PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,per_process_memory_fraction:0.1"]
            }
        }

    s.docker = engine
    await s.lf_prepare(_spec(devices=[_gpu(U0, 0, 0.25)], gpu=0.25))
    assert asked == [("inspect_image", ("lab/py:1",))]
    env = s.get_env()
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == (
        "max_split_size_mb:64,expandable_segments:True,per_process_memory_fraction:0.1"
    )
    assert env["LABFLEET_GPU_ENFORCEMENT"] == "caps" and env["CUPY_GPU_MEMORY_LIMIT"] == "25%"


# -- the sessions' network -----------------------------------------------------------------------------


def test_session_network_spec_names_its_bridge_and_its_gateway():
    spec = session_network_spec("labfleet-sessions", "lfdock0", "10.214.0.0/16")
    assert spec == {
        "name": "labfleet-sessions",
        "driver": "bridge",
        "options": {
            "com.docker.network.bridge.name": "lfdock0",
            "com.docker.network.bridge.enable_icc": "false",
            "com.docker.network.bridge.enable_ip_masquerade": "false",
        },
        # The gateway is the subnet's first address: the bridge's, where sessionnet's table lets
        # sessions call the Hub's proxy.
        "ipam": {"Driver": "default", "Config": [{"Subnet": "10.214.0.0/16", "Gateway": "10.214.0.1"}]},
        "labels": {"ai.labfleet.session-network": "lfdock0"},
        "check_duplicate": True,
    }
    with pytest.raises(ValueError, match="session subnet"):
        session_network_spec("n", "lfdock0", "10.214.0.1/16")  # an address, not a network
    with pytest.raises(ValueError, match="cannot name"):
        session_network_spec("host", "lfdock0", "10.214.0.0/16")


def _inspected(**over):
    """A bridge network as the engine's inspect_network answers (the fields read)."""
    network = {
        "Name": "labfleet-sessions",
        "Id": "0123456789abcdef" * 4,
        "Driver": "bridge",
        "Options": {"com.docker.network.bridge.name": "lfdock0"},
        "IPAM": {"Driver": "default", "Config": [{"Subnet": "10.214.0.0/16", "Gateway": "10.214.0.1"}]},
    }
    return {**network, **over}


def test_network_bridge_reads_what_the_backend_guards():
    assert network_bridge(_inspected()) == ("lfdock0", "10.214.0.0/16")
    # IPv6 subnets are left out; a network made without a gateway gets the first address.
    dual = {"Config": [{"Subnet": "fd00::/64"}, {"Subnet": "10.9.0.0/24"}]}
    assert network_bridge(_inspected(IPAM=dual)) == ("lfdock0", "10.9.0.0/24")
    # Docker's own name for a bridge is longer than sessionnet's rules allow: parse says so.
    bridge, subnet = network_bridge(_inspected(Options={}))
    assert bridge == "br-0123456789ab"
    with pytest.raises(ValueError, match="1 to 9"):
        sessionnet.SessionNetwork.parse(bridge, subnet, "127.0.0.1", 8000)


def test_networks_the_backend_cannot_guard():
    with pytest.raises(ValueError, match="'overlay' network: .*bridge network only"):
        network_bridge(_inspected(Driver="overlay"))
    with pytest.raises(ValueError, match="one IPv4 subnet, not 0"):
        network_bridge(_inspected(IPAM={"Config": []}))
    two = {"Config": [{"Subnet": "10.9.0.0/24"}, {"Subnet": "10.8.0.0/24"}]}
    with pytest.raises(ValueError, match="one IPv4 subnet, not 2"):
        network_bridge(_inspected(IPAM=two))
    odd = {"Config": [{"Subnet": "10.9.0.0/24", "Gateway": "10.9.0.254"}]}
    with pytest.raises(ValueError, match="gateway 10.9.0.254 is not the first address"):
        network_bridge(_inspected(IPAM=odd))


def test_gateway_environment_points_the_session_at_the_proxy():
    env = {
        "JUPYTERHUB_API_URL": "http://127.0.0.1:8081/hub/api",
        "JUPYTERHUB_ACTIVITY_URL": "http://127.0.0.1:8081/hub/api/users/alice/activity",
        "LABFLEET_SERVICE_URL": "http://127.0.0.1:10101/services/labfleet/api",
    }
    before = dict(env)
    out = gateway_environment(env, NET.hub_url, "http://127.0.0.1:10101/services/labfleet/api")
    assert out == {
        "JUPYTERHUB_API_URL": "http://10.214.0.1:8000/hub/api",
        "JUPYTERHUB_ACTIVITY_URL": "http://10.214.0.1:8000/hub/api/users/alice/activity",
        "LABFLEET_SERVICE_URL": "http://10.214.0.1:8000/services/labfleet/api",
    }
    assert env == before
    # A service URL the deployment set for sessions (session_service_url) is not the Hub's: kept.
    assert "LABFLEET_SERVICE_URL" not in gateway_environment(env, NET.hub_url, None)


def _hub_env(s):
    from types import SimpleNamespace

    s.api_token = "t"
    s.hub = SimpleNamespace(
        public_host="", url="/hub/", api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/"
    )


async def test_backend_session_environment_on_the_guarded_network():
    s = _docker_spawner(
        network_name="labfleet-net", service_url="http://127.0.0.1:10101/services/labfleet/api"
    )
    s.lf_session_network = _guarded
    _hub_env(s)
    await s.lf_prepare(_spec())
    assert s.lf_network == NET
    env = s.get_env()
    assert env["JUPYTERHUB_API_URL"] == "http://10.214.0.1:8000/hub/api"
    assert env["JUPYTERHUB_ACTIVITY_URL"] == "http://10.214.0.1:8000/hub/api/users/alice/activity"
    assert env["LABFLEET_SERVICE_URL"] == "http://10.214.0.1:8000/services/labfleet/api"
    assert env["JUPYTERHUB_SERVICE_URL"].startswith("http://0.0.0.0:8888/")
    # The runtime names the container and, once the Hub knows it, its address on the network.
    s.object_id = "ab" * 32
    assert s.lf_runtime() == {"container": "ab" * 32}
    s.lf_address = "10.214.0.7"
    assert s.lf_runtime() == {"container": "ab" * 32, "address": "10.214.0.7"}
    # A service URL set for sessions stays as it is.
    s.session_service_url = "http://lb.example.org/services/labfleet/api"
    assert s.get_env()["LABFLEET_SERVICE_URL"] == "http://lb.example.org/services/labfleet/api"


async def test_backend_on_the_hosts_network_keeps_the_hubs_urls_and_warns(caplog):
    s = _docker_spawner(network_name="host")
    _hub_env(s)
    with caplog.at_level("WARNING"):
        await s.lf_prepare(_spec())
    assert s.lf_network is None
    assert "runs on the host's network" in caplog.text
    env = s.get_env()
    assert env["JUPYTERHUB_API_URL"] == "http://127.0.0.1:8081/hub/api"
    s.object_id, s.lf_address = "ab" * 32, "127.0.0.1"
    assert s.lf_runtime() == {"container": "ab" * 32}


def test_backend_network_defaults_and_environment(monkeypatch):
    s = _docker_spawner()
    assert (s.network_name, s.session_bridge, s.session_subnet) == (
        "labfleet-sessions",
        "lfdock0",
        "10.214.0.0/16",
    )
    assert s.ip == "0.0.0.0" and s.port == 8888
    monkeypatch.setenv("LABFLEET_DOCKER_NETWORK", "lftest-n")
    monkeypatch.setenv("LABFLEET_DOCKER_SESSION_BRIDGE", "lfd42")
    monkeypatch.setenv("LABFLEET_DOCKER_SESSION_SUBNET", "10.220.3.0/24")
    s = _docker_spawner()
    assert (s.network_name, s.session_bridge, s.session_subnet) == ("lftest-n", "lfd42", "10.220.3.0/24")
    # What a deployment configures wins over the environment.
    assert _docker_spawner(network_name="host").network_name == "host"


def test_configure_docker_backend_leaves_the_network_to_the_spawner(tmp_path, monkeypatch):
    from traitlets.config import Config

    from labfleet.hub.configure import configure

    monkeypatch.setenv("LABFLEET_SECRET_KEY_FILE", str(tmp_path / "key"))
    c = Config()
    configure(c, tmp_path, backend="docker", service_port=12345)
    assert c.JupyterHub.spawner_class == "labfleet-docker"
    assert "network_name" not in c.DockerSpawner  # the sessions' network, not the host's
    assert c.JupyterHub.hub_connect_ip == "127.0.0.1"


async def test_backend_makes_the_missing_network_and_guards_it_once(monkeypatch):
    import docker

    import labfleet.spawner.docker as backend

    s = _docker_spawner(network_name="lf-n", session_bridge="lfu1", session_subnet="10.220.9.0/24")
    s.user.settings = {"proxy": type("P", (), {"public_url": "http://127.0.0.1:8000/"})()}
    calls, networks = [], {}

    async def engine(method, *args, **kw):
        calls.append(method)
        if method == "create_network":
            networks[kw["name"]] = _inspected(Name=kw["name"], Options=kw["options"], IPAM=kw["ipam"])
            return {"Id": "x"}
        if args[0] not in networks:
            raise docker.errors.NotFound("no such network")
        return networks[args[0]]

    guarded = []

    async def ensure(net):
        guarded.append(net)

    async def filtered(bridge):
        guarded.append(bridge)

    monkeypatch.setattr(s, "docker", engine)
    monkeypatch.setattr(backend.sessionnet, "ensure", ensure)
    monkeypatch.setattr(backend, "_filter_bridged", filtered)
    monkeypatch.setattr(backend, "_GUARDED", set())
    net = await s.lf_session_network()
    assert calls == ["inspect_network", "create_network", "inspect_network"]
    assert net == sessionnet.SessionNetwork.parse("lfu1", "10.220.9.0/24", "127.0.0.1", 8000)
    assert net.hub_url == "http://10.220.9.1:8000"
    assert guarded == ["lfu1", net]
    # The next spawn finds the network, and this Hub has guarded it already.
    assert await s.lf_session_network() == net
    assert calls[3:] == ["inspect_network"] and len(guarded) == 2


async def test_backend_refuses_a_network_it_cannot_guard(monkeypatch):
    from jupyterhub.spawner import SpawnException

    s = _docker_spawner(network_name="overlay-net")

    async def engine(method, *args, **kw):
        return _inspected(Name="overlay-net", Driver="overlay")

    monkeypatch.setattr(s, "docker", engine)
    with pytest.raises(SpawnException, match="'overlay' network"):
        await s.lf_session_network()
    # Not root: no nftables, so no session network at all (host networking only where asked for).
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(SpawnException, match="needs the Hub to run as root"):
        await s.lf_session_network()
    s.network_name = "host"
    assert await s.lf_session_network() is None
