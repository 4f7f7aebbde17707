"""labfleet.spawner.swarm_config: a LaunchSpec and the placed node's labels as a Swarm service (pure, no engine)."""

from decimal import Decimal
from types import SimpleNamespace

import pytest

from labfleet.spawner.launch import Mount, build_launch
from labfleet.spawner.options import parse_options
from labfleet.spawner.swarm_config import (
    SERVER_PORT,
    ServiceMount,
    node_placement,
    published_port,
    service_config,
)

U0 = "GPU-11111111-2222-3333-4444-555555555555"
U1 = "GPU-66666666-7777-8888-9999-000000000000"
GIB = 2**30
NODE_ID = "mj04adkh57559hq575bdruq1n"
LABELS = {"swarm.node_id": NODE_ID, "address": "10.77.0.2"}


def _spec(devices=(), slots=None, mounts=(), mps=False, mps_withheld=None, **options):
    session = {
        "id": "s-1",
        "name": "gpu",
        "user": "alice",
        "project": "acme/ml",
        "resource_group": "default",
        "node": "node-2",
        "slots": {"cpu": "2", "mem": 4 * GIB} if slots is None else slots,
        "devices": list(devices),
    }
    opts = parse_options({"project": "acme/ml", "image": "lab/py:1", **options})
    return build_launch(
        session, opts, mounts=tuple(mounts), mps=mps, mps_withheld=mps_withheld, in_container=True
    )


def _gpu(uuid, index, shares):
    return {"uuid": uuid, "index": index, "model": "A100-80GB", "memory": 80 * GIB, "shares": shares}


def test_pinned_to_the_placed_node_with_limits_and_reservations():
    cfg = service_config(_spec(), LABELS, user="1000:1000")
    assert cfg.node_id == NODE_ID
    assert cfg.constraints == [f"node.id=={NODE_ID}"]
    assert cfg.address == "10.77.0.2"
    assert cfg.image == "lab/py:1"
    assert cfg.networks == ["host"]
    assert cfg.resources == {
        "Limits": {"NanoCPUs": 2 * 10**9, "MemoryBytes": 4 * GIB, "Pids": 4096},
        "Reservations": {"NanoCPUs": 2 * 10**9, "MemoryBytes": 4 * GIB},
    }
    assert cfg.restart_policy == {"condition": "none"}
    # The Docker backend's hardening, as far as a service can express it.
    assert cfg.container_spec["cap_drop"] == ["ALL"]
    assert cfg.container_spec["init"] is True
    assert cfg.container_spec["user"] == "1000:1000"
    assert set(cfg.dropped) == {"security_opt", "memswap_limit"}
    assert cfg.labels == {
        "ai.labfleet.session-id": "s-1",
        "ai.labfleet.user": "alice",
        "ai.labfleet.project": "acme/ml",
        "ai.labfleet.node": "node-2",
    }
    assert cfg.container_spec["labels"] == cfg.labels
    # No device: CUDA sees none.
    assert cfg.env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert cfg.env["LABFLEET_NODE"] == "node-2"
    # A model-serving replica listens where the service can reach it on that node
    assert cfg.env["LABFLEET_INFERENCE_HOST"] == "0.0.0.0"


def test_fractional_cpu_and_no_reservations():
    cfg = service_config(_spec(slots={"cpu": "0.25", "mem": GIB}), LABELS, reserve=False)
    assert cfg.resources == {"Limits": {"NanoCPUs": 250_000_000, "MemoryBytes": GIB, "Pids": 4096}}


def test_no_limits_keeps_the_pids_limit():
    cfg = service_config(_spec(slots={}), LABELS)
    assert cfg.resources == {"Limits": {"Pids": 4096}}


def test_whole_gpus_by_uuid_in_the_environment():
    cfg = service_config(_spec(devices=[_gpu(U0, 0, 1), _gpu(U1, 3, 1)]), LABELS)
    assert cfg.env["NVIDIA_VISIBLE_DEVICES"] == f"{U0},{U1}"
    assert cfg.env["CUDA_VISIBLE_DEVICES"] == "0,1"  # the runtime renumbers from 0
    assert cfg.env["LABFLEET_GPU_UUIDS"] == f"{U0},{U1}"
    assert "device_requests" not in cfg.dropped  # never asked for: Swarm cannot give devices


def test_fraction_with_mps_mounts_the_pipe_directory():
    spec = _spec(devices=[_gpu(U0, 0, 0.25)], mps=True)
    cfg = service_config(spec, LABELS, mps_pipe_dir="/tmp/nvidia-mps", user="1000:1000")
    assert cfg.container_spec["user"] == "1000:1000"  # the one non-root uid of the node's clients
    assert cfg.env["NVIDIA_VISIBLE_DEVICES"] == U0
    assert cfg.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert cfg.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={20 * 1024}M"
    assert cfg.env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert ServiceMount("/tmp/nvidia-mps", "/tmp/nvidia-mps", False) in cfg.mounts
    assert "ipc_mode" in cfg.dropped  # a service cannot share the host's IPC namespace


def test_fraction_with_mps_needs_the_pipe_directory():
    with pytest.raises(ValueError, match="MPS pipe directory"):
        service_config(_spec(devices=[_gpu(U0, 0, 0.5)], mps=True), LABELS)


@pytest.mark.parametrize("user", [None, "", "0", "0:0", "root", "jovyan"])
def test_fraction_with_mps_runs_as_a_numeric_non_root_uid_only(user):
    spec = _spec(devices=[_gpu(U0, 0, 0.5)], mps=True)
    with pytest.raises(ValueError, match="with MPS, but"):
        service_config(spec, LABELS, mps_pipe_dir="/tmp/nvidia-mps", user=user)


async def test_the_swarm_spawner_never_gives_mps_its_sessions_cannot_reach():
    from labfleet.spawner.launch import mps_withheld_for
    from labfleet.spawner.swarm import SWARM_NO_MPS, LabfleetSwarmSpawner

    # No host IPC namespace for a service: whatever the user, MPS is withheld and the reason says why.
    for user in ("1000:1000", "", "0:0", "root", "jovyan"):
        assert LabfleetSwarmSpawner(container_user=user).lf_mps_withheld() == SWARM_NO_MPS
    withheld = _spec(devices=[_gpu(U0, 0, 0.5)], mps=True, mps_withheld=mps_withheld_for("0:0"))
    cfg = service_config(withheld, LABELS, mps_pipe_dir="/tmp/nvidia-mps", user="0:0")
    assert cfg.env["LABFLEET_GPU_ENFORCEMENT"] == "caps" and "CUDA_MPS_PIPE_DIRECTORY" not in cfg.env
    assert cfg.env["LABFLEET_GPU_MPS_WITHHELD"] == mps_withheld_for("0:0") and not cfg.mounts


async def test_the_service_runs_as_container_user_whatever_extra_container_spec_says():
    from labfleet.spawner.swarm import LabfleetSwarmSpawner

    spawner = LabfleetSwarmSpawner(
        node_labels={"node-2": LABELS},
        network_name="host",
        mps_pipe_dir="/tmp/nvidia-mps",
        extra_container_spec={"user": "0:0", "hostname": "h"},
    )
    spawner.user = SimpleNamespace(name="alice", url="/user/alice/", settings={})

    async def lf_call(method, path, body=None):
        return _Reply(200, [])

    created = {}

    async def docker_call(method, *args, **kwargs):
        if method == "create_service":
            created.update(kwargs)
            return {"ID": "svc"}
        if method == "inspect_image":
            return {"Config": {"Env": []}}
        raise AssertionError(method)

    async def command():
        return ["jupyterhub-singleuser"]

    spawner.lf_call = lf_call
    spawner.docker = docker_call
    spawner.get_command = command
    spawner.get_env = lambda: {}
    await spawner.lf_prepare(_spec(devices=[_gpu(U0, 0, 0.5)], mps=True))
    await spawner.create_object()
    container = created["task_template"]["ContainerSpec"]
    assert container["User"] == "1000:1000" and container["Hostname"] == "h"


def test_fraction_without_mps_caps_the_frameworks():
    cfg = service_config(_spec(devices=[_gpu(U0, 0, Decimal("0.5"))]), LABELS)
    assert cfg.env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.5"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in cfg.env


def test_a_fractions_caps_reach_the_service_merged_with_the_images_setting():
    image_env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    cfg = service_config(_spec(devices=[_gpu(U0, 0, Decimal("0.25"))]), LABELS, image_env=image_env)
    assert cfg.env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True,per_process_memory_fraction:0.25"
    assert (
        cfg.env["LABFLEET_GPU_ENFORCEMENT"] == "caps" and cfg.env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    )


def test_vfolder_mounts_are_binds_of_the_same_paths():
    mounts = [
        Mount("/srv/vfolders/a", "/home/jovyan/vfolders/data", "ro"),
        Mount("/srv/vfolders/b", "/home/jovyan/vfolders/out", "wd"),
    ]
    cfg = service_config(_spec(mounts=mounts), LABELS)
    assert cfg.mounts == [
        ServiceMount("/srv/vfolders/a", "/home/jovyan/vfolders/data", True),
        ServiceMount("/srv/vfolders/b", "/home/jovyan/vfolders/out", False),
    ]


def test_same_checks_as_the_docker_backend():
    twice = [Mount("/srv/a", "/home/jovyan/x", "ro"), Mount("/srv/a", "/home/jovyan/y", "ro")]
    with pytest.raises(ValueError, match="mounted twice"):
        service_config(_spec(mounts=twice), LABELS)
    with pytest.raises(ValueError, match="under Docker's minimum"):
        service_config(_spec(slots={"mem": 1024}), LABELS)


def test_on_the_sessions_network_the_node_publishes_the_server():
    cfg = service_config(_spec(), LABELS, network_name="labfleet-sessions")
    assert cfg.networks == ["labfleet-sessions"]
    assert cfg.address == "10.77.0.2"  # the Hub connects there, at the published port
    # Published on the node only (no ingress), on a port Docker picks.
    assert cfg.endpoint == {
        "Mode": "dnsrr",
        "Ports": [{"Protocol": "tcp", "TargetPort": SERVER_PORT, "PublishMode": "host"}],
    }
    assert service_config(_spec(), LABELS).endpoint == {}  # the host's network publishes nothing


def test_a_replica_is_published_on_its_own_port():
    cfg = service_config(_spec(type="inference", command="serve", port=9123), LABELS, network_name="net")
    assert {
        "Protocol": "tcp",
        "TargetPort": 9123,
        "PublishedPort": 9123,
        "PublishMode": "host",
    } in cfg.endpoint["Ports"]
    assert cfg.env["LABFLEET_INFERENCE_HOST"] == "0.0.0.0"


def test_published_port_of_a_running_task():
    task = {
        "Status": {
            "PortStatus": {
                "Ports": [
                    {"TargetPort": 9123, "PublishedPort": 9123},
                    {"TargetPort": SERVER_PORT, "PublishedPort": 30001, "PublishMode": "host"},
                ]
            }
        }
    }
    assert published_port(task) == 30001
    assert published_port(task, 9123) == 9123
    assert published_port({"Status": {"State": "starting"}}) is None
    assert published_port({}) is None


@pytest.mark.parametrize(
    "labels, message",
    [
        ({}, "no swarm.node_id label"),
        ({"address": "10.77.0.2"}, "no swarm.node_id label"),
        ({"swarm.node_id": "Not An Id!", "address": "10.77.0.2"}, "is not a Swarm node id"),
        ({"swarm.node_id": NODE_ID}, "no address label"),
        ({"swarm.node_id": NODE_ID, "address": "not an address!"}, "not an IP address or a host name"),
        ({"swarm.node_id": 7, "address": "10.77.0.2"}, "no swarm.node_id label"),
    ],
)
def test_node_labels_are_checked(labels, message):
    with pytest.raises(ValueError, match=message):
        service_config(_spec(), labels)


def test_node_placement_accepts_host_names_and_ipv6():
    assert node_placement({"swarm.node_id": NODE_ID, "address": "gpu-7.example.org"}) == (
        NODE_ID,
        "gpu-7.example.org",
    )
    assert node_placement({"swarm.node_id": NODE_ID, "address": "fd00::2"}) == (NODE_ID, "fd00::2")


# ---------------------------------------------------------------- the wiring (no engine, no Hub)


def test_configure_swarm_backend(tmp_path, monkeypatch):
    from traitlets.config import Config

    from labfleet.hub.configure import configure

    monkeypatch.setenv("LABFLEET_HUB_ADDRESS", "10.77.0.1")
    monkeypatch.setenv("LABFLEET_SESSION_SERVICE_URL", "http://10.77.0.1:8000/services/labfleet/api")
    monkeypatch.setenv("LABFLEET_SECRET_KEY_FILE", str(tmp_path / "key"))
    monkeypatch.delenv("LABFLEET_SWARM_NETWORK", raising=False)
    c = Config()
    configure(c, tmp_path, backend="swarm", service_port=12345)
    assert c.JupyterHub.spawner_class == "labfleet.spawner.swarm.LabfleetSwarmSpawner"
    # Sessions on their own network call the Hub through its proxy: its API stays on the loopback.
    assert "network_name" not in c.SwarmSpawner
    assert "hub_ip" not in c.JupyterHub and c.JupyterHub.hub_connect_ip == "127.0.0.1"
    assert c.LabfleetSpawnerMixin.session_service_url == "http://10.77.0.1:8000/services/labfleet/api"
    command = next(s for s in c.JupyterHub.services if s["name"] == "labfleet")["command"]
    # Agents register the nodes; the service registers none of its own.
    assert "--LabfleetService.register_local_node=False" in command
    assert any(a.startswith("--LabfleetService.storage_hosts=") and '"owner_uid": 1000' in a for a in command)


def test_configure_swarm_on_the_nodes_network(tmp_path, monkeypatch):
    from traitlets.config import Config

    from labfleet.hub.configure import configure

    monkeypatch.setenv("LABFLEET_HUB_ADDRESS", "10.77.0.1")
    monkeypatch.setenv("LABFLEET_SESSION_SERVICE_URL", "http://10.77.0.1:8000/services/labfleet/api")
    monkeypatch.setenv("LABFLEET_SECRET_KEY_FILE", str(tmp_path / "key"))
    monkeypatch.setenv("LABFLEET_SWARM_NETWORK", "host")
    c = Config()
    configure(c, tmp_path, backend="swarm", service_port=12345)
    assert c.JupyterHub.hub_ip == c.JupyterHub.hub_connect_ip == "10.77.0.1"


def test_configure_swarm_needs_the_service_url_for_remote_nodes(tmp_path, monkeypatch):
    from traitlets.config import Config

    from labfleet.hub.configure import configure

    monkeypatch.setenv("LABFLEET_HUB_ADDRESS", "10.77.0.1")
    monkeypatch.delenv("LABFLEET_SESSION_SERVICE_URL", raising=False)
    monkeypatch.setenv("LABFLEET_SECRET_KEY_FILE", str(tmp_path / "key"))
    with pytest.raises(ValueError, match="LABFLEET_SESSION_SERVICE_URL"):
        configure(Config(), tmp_path, backend="swarm", service_port=12345)


class _Reply:
    def __init__(self, code, data):
        self.code, self.data, self.message = code, data, ""

    @property
    def ok(self):
        return 200 <= self.code < 300


async def test_spawner_reads_the_placed_nodes_labels_from_the_service():
    from labfleet.spawner.swarm import LabfleetSwarmSpawner

    spawner = LabfleetSwarmSpawner(node_labels={"node-2": {"address": "10.0.0.9", "extra": "x"}})
    calls = []

    async def lf_call(method, path, body=None):
        calls.append(path)
        return _Reply(200, [{"name": "node-1", "labels": {}}, {"name": "node-2", "labels": LABELS}])

    spawner.lf_call = lf_call
    # The service's labels win over the configured ones; what only config says stays.
    assert await spawner.lf_node_labels("node-2") == {**LABELS, "extra": "x"}
    assert calls == ["/nodes?offset=0&limit=1000"]
    # The session's own node_labels, when the service puts them there, need no lookup.
    spawner.lf_session = {"node_labels": {"swarm.node_id": "abcdefghij12", "address": "10.0.0.3"}}
    assert (await spawner.lf_node_labels("node-2"))["swarm.node_id"] == "abcdefghij12"
    assert len(calls) == 1
    spawner.lf_session = None

    async def down(method, path, body=None):
        return _Reply(0, None)

    spawner.lf_call = down
    with pytest.raises(RuntimeError, match="cannot read node node-3's labels"):
        await spawner.lf_node_labels("node-3")


async def test_spawner_pins_the_service_and_listens_on_the_nodes_address():
    from labfleet.spawner.swarm import LabfleetSwarmSpawner

    spawner = LabfleetSwarmSpawner(node_labels={"node-2": LABELS}, network_name="host")
    spawner.user = SimpleNamespace(name="alice", url="/user/alice/")

    async def lf_call(method, path, body=None):
        return _Reply(200, [])

    spawner.lf_call = lf_call
    await spawner.lf_prepare(_spec())
    assert spawner.ip == "10.77.0.2" and 1024 < spawner.port < 65536
    assert spawner.lf_service.constraints == [f"node.id=={NODE_ID}"]
    assert spawner.image == "lab/py:1"
    assert await spawner.get_ip_and_port() == ("10.77.0.2", spawner.port)
    spawner.node_labels = {"node-2": {"address": "10.77.0.2"}}
    with pytest.raises(
        RuntimeError, match="cannot run this session in Swarm: node 'node-2' has no swarm.node_id"
    ):
        await spawner.lf_prepare(_spec())


async def test_on_the_sessions_network_the_session_calls_the_proxy_at_its_gateway(monkeypatch):
    from labfleet.spawner.swarm import LabfleetSwarmSpawner

    monkeypatch.delenv("LABFLEET_SWARM_NETWORK", raising=False)
    monkeypatch.delenv("LABFLEET_SWARM_SESSION_SUBNET", raising=False)
    spawner = LabfleetSwarmSpawner(
        node_labels={"node-2": LABELS},
        session_service_url="http://10.77.0.1:8000/services/labfleet/api",
    )
    spawner.api_token = "t"
    spawner.hub = SimpleNamespace(
        public_host="", url="/hub/", api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/"
    )
    assert spawner.network_name == "labfleet-sessions"
    spawner.user = SimpleNamespace(name="alice", url="/user/alice/", settings={})

    async def lf_call(method, path, body=None):
        return _Reply(200, [])

    seen = []

    async def docker_call(method, *args, **kwargs):
        seen.append((method, args))
        return {"Name": args[0], "Scope": "swarm"} if method == "inspect_network" else None

    spawner.lf_call = lf_call
    spawner.docker = docker_call
    await spawner.lf_prepare(_spec())
    assert ("inspect_network", ("labfleet-sessions",)) in seen
    assert (spawner.ip, spawner.port) == ("0.0.0.0", SERVER_PORT)
    env = spawner.get_env()
    assert env["JUPYTERHUB_API_URL"] == "http://10.215.0.1:8000/hub/api"
    assert env["LABFLEET_SERVICE_URL"] == "http://10.215.0.1:8000/services/labfleet/api"
    tasks = [{}, {"Status": {"PortStatus": {"Ports": [{"TargetPort": SERVER_PORT, "PublishedPort": 31000}]}}}]

    async def get_task():
        return tasks.pop(0)

    spawner.get_task = get_task
    assert await spawner.get_ip_and_port() == ("10.77.0.2", 31000)


async def test_a_missing_sessions_network_fails_the_spawn_with_what_to_run(monkeypatch):
    import docker
    from jupyterhub.spawner import SpawnException

    from labfleet.spawner.swarm import LabfleetSwarmSpawner

    spawner = LabfleetSwarmSpawner(node_labels={"node-2": LABELS}, network_name="labfleet-sessions")
    spawner.user = SimpleNamespace(name="alice", url="/user/alice/", settings={})

    async def lf_call(method, path, body=None):
        return _Reply(200, [])

    async def docker_call(method, *args, **kwargs):
        raise docker.errors.NotFound("no such network")

    spawner.lf_call = lf_call
    spawner.docker = docker_call
    with pytest.raises(SpawnException, match="labfleet node network"):
        await spawner.lf_prepare(_spec())
