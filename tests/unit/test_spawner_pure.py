"""The spawner's pure parts: user_options checks, the launch spec, the form, the sandbox."""

import json
from decimal import Decimal

import pytest

from labfleet.spawner.form import render, unavailable
from labfleet.spawner.launch import Mount, build_launch, merge_alloc_conf, with_caps
from labfleet.spawner.options import OptionsError, options_from_form, parse_mem, parse_options
from labfleet.spawner.sandbox import (
    SandboxSpec,
    environment_sources,
    link_targets,
    sandbox_command,
    site_packages_sources,
)

GIB = 2**30


def test_options_to_slots():
    o = parse_options({"project": "acme/ml", "cpu": "2.5", "mem": "4g", "gpu": "0.5", "image": "repo/x:1"})
    assert o.slots() == {"cpu": "2.5", "mem": 4 * GIB, "gpu.shares": "0.5"}
    assert parse_options({"project": "ml", "gpu": 2}).slots() == {"gpu": 2}
    assert parse_options({"project": "ml", "gpu": 1.5}).slots() == {"gpu.shares": "1.5"}
    assert parse_options({"project": "ml", "gpu": 0}).slots() == {}
    # Round trip through the Hub's state.
    o2 = parse_options({"project": "ml", "type": "batch", "command": "python t.py", "vfolders": ["a", "b"]})
    assert parse_options(o2.to_json()) == o2


@pytest.mark.parametrize(
    "raw, words",
    [
        ([], "must be a JSON object"),
        ({}, "choose a project"),
        ({"project": "ml", "x": 1}, "unknown option(s) x"),
        ({"project": "../etc"}, "not a valid name"),
        ({"project": "a/b/c"}, "not a valid name"),
        ({"project": "ml", "cpu": -1}, "cannot be negative"),
        ({"project": "ml", "cpu": 0}, "more than 0"),
        ({"project": "ml", "cpu": True}, "must be a number"),
        ({"project": "ml", "cpu": "nan"}, "finite"),
        ({"project": "ml", "cpu": 10**6}, "more than any node has"),
        ({"project": "ml", "gpu": 0.005}, "steps of 0.01"),
        ({"project": "ml", "gpu": [1]}, "must be a number"),
        ({"project": "ml", "mem": "lots"}, "size like 8g"),
        ({"project": "ml", "mem": -5}, "more than 0"),
        ({"project": "ml", "mem": "99999t"}, "more than any node has"),
        ({"project": "ml", "type": "daemon"}, "type must be one of"),
        ({"project": "ml", "type": "inference"}, "needs a command"),
        ({"project": "ml", "command": "ls"}, "takes no command"),
        ({"project": "ml", "type": "batch", "command": "a\x00b"}, "NUL"),
        ({"project": "ml", "type": "batch", "command": "x" * 9000}, "longer than"),
        ({"project": "ml", "vfolders": "a,a"}, "named twice"),
        ({"project": "ml", "vfolders": [1]}, "must be a name"),
        ({"project": "ml", "image": "bad image"}, "not a valid name"),
        ({"project": "ml", "type": "inference", "command": "x", "port": 80}, "from 1024 to 65535"),
        ({"project": "ml", "type": "inference", "command": "x", "port": "8o8o"}, "whole number"),
        ({"project": "ml", "type": "inference", "command": "x", "port": 8.5}, "whole number"),
        ({"project": "ml", "type": "batch", "command": "x", "port": 8080}, "inference sessions only"),
    ],
)
def test_bad_options_say_why(raw, words):
    with pytest.raises(OptionsError) as e:
        parse_options(raw)
    assert words in str(e.value)


def test_form_fields_and_mem_units():
    form = {"project": ["ml"], "gpu": ["0.25"], "cpu": [""], "vfolders": ["a", " "], "command": [""]}
    raw = options_from_form(form)
    o = parse_options(raw)  # blank fields count as not given
    assert (o.cpu, o.gpu, o.vfolders, o.command) == (None, Decimal("0.25"), ("a",), "")
    assert (
        parse_mem("512m") == 512 * 2**20 and parse_mem("1.5GiB") == int(1.5 * GIB) and parse_mem(1024) == 1024
    )


SESSION = {
    "id": "s1",
    "name": "a",
    "user": "alice",
    "project": "acme/ml",
    "resource_group": "default",
    "node": "n1",
    "slots": {"cpu": 2, "mem": 4 * GIB, "gpu.shares": 0.5},
    "devices": [{"uuid": "GPU-aa", "index": 1, "model": "A100-80GB", "memory": 80 * GIB, "shares": 0.5}],
}


def test_launch_fraction_without_and_with_mps():
    o = parse_options({"project": "ml", "gpu": 0.5, "cpu": 2, "mem": "4g"})
    spec = build_launch(SESSION, o)
    assert spec.cpu == 2 and spec.mem == 4 * GIB and spec.fractional and spec.gpu_uuids == ["GPU-aa"]
    env = spec.env
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-aa" and env["LABFLEET_GPU_SHARES"] == "0.5"
    assert env["LABFLEET_GPU_MEMORY_LIMIT"] == str(40 * GIB)
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.5" and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env
    mps = build_launch(SESSION, o, mps=True, in_container=True).env
    assert mps["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert mps["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=40960M"
    assert mps["CUDA_VISIBLE_DEVICES"] == "0"  # a container sees its devices from 0


def test_launch_whole_devices_and_none():
    two = dict(
        SESSION,
        devices=[
            {"uuid": "GPU-a", "index": 0, "model": "A100", "memory": 0, "shares": 1},
            {"uuid": "GPU-b", "index": 1, "model": "A100", "memory": 0, "shares": 1},
        ],
    )
    spec = build_launch(two, parse_options({"project": "ml", "gpu": 2}))
    assert not spec.fractional and spec.gpu_shares == 2
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b" and "LABFLEET_GPU_FRACTION" not in spec.env
    none = build_launch(dict(SESSION, devices=[], slots={}), parse_options({"project": "ml"}))
    assert none.env["CUDA_VISIBLE_DEVICES"] == "" and none.env["LABFLEET_GPU_SHARES"] == "0"
    assert none.cpu is None and none.mem is None


def test_batch_launch_carries_the_command():
    o = parse_options({"project": "ml", "type": "batch", "command": "python train.py"})
    env = build_launch(SESSION, o).env
    assert env["LABFLEET_SESSION_TYPE"] == "batch" and env["LABFLEET_COMMAND"] == "python train.py"


def test_an_inference_port_reaches_the_runner_and_survives_a_round_trip():
    o = parse_options({"project": "ml", "type": "inference", "command": "serve", "port": "8088"})
    assert o.port == 8088 and parse_options(o.to_json()) == o
    assert build_launch(SESSION, o).env["LABFLEET_INFERENCE_PORT"] == "8088"
    # Without one, the runner picks a free port itself
    plain = parse_options({"project": "ml", "type": "inference", "command": "serve"})
    assert "LABFLEET_INFERENCE_PORT" not in build_launch(SESSION, plain).env


def test_launch_passes_the_image_service_ports():
    o = parse_options({"project": "ml"})
    ports = [
        {"name": "echo", "protocol": "http", "port": 8080},
        {"name": "vnc", "protocol": "tcp", "port": 5901},
    ]
    env = build_launch(dict(SESSION, service_ports=ports), o).env
    assert json.loads(env["LABFLEET_SERVICE_PORTS"]) == ports
    # None declared, or a service from before service ports: no variable.
    assert "LABFLEET_SERVICE_PORTS" not in build_launch(dict(SESSION, service_ports=[]), o).env
    assert "LABFLEET_SERVICE_PORTS" not in build_launch(SESSION, o).env


def test_mounts_are_checked():
    with pytest.raises(ValueError):
        Mount("/a", "/b", "rwx")
    with pytest.raises(ValueError):
        Mount("relative", "/b")
    assert Mount("/a", "/b", "ro").read_only and not Mount("/a", "/b", "wd").read_only


SYSTEM = (("/usr", ""), ("/etc", ""), ("/bin", "usr/bin"))


def test_sandbox_shows_the_system_the_runtime_the_home_and_the_mounts_and_nothing_else():
    spec = SandboxSpec(
        home="/h/alice",
        system=SYSTEM,
        runtime=("/opt/venv", "/opt/venv/lib", "/usr/lib/python3"),
        mounts=(Mount("/d/ro", "/h/alice/r", "ro"), Mount("/d/rw", "/h/alice/w")),
        tmp_size=64 << 20,
        hostname="alice-gpu",
        uid=999,
        gid=995,
        netns="/run/netns/lf-3",
    )
    cmd = sandbox_command("bwrap", spec)
    text = " ".join(cmd)
    # Into the session's network namespace, bwrap as root, then the session account with nothing.
    assert cmd[:3] == ["nsenter", "--net=/run/netns/lf-3", "bwrap"] and cmd[-2:] == ["/bin/sh", "-c"]
    drop = cmd[cmd.index("setpriv") :]
    assert drop[:7] == [
        "setpriv",
        "--reuid=999",
        "--regid=995",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
    ]
    assert cmd[cmd.index("setpriv") - 1] == "--"
    # Then an unprivileged bwrap that takes user namespaces away, unless they are allowed.
    assert drop[7:] == [
        "--",
        "bwrap",
        "--dev-bind",
        "/",
        "/",
        "--unshare-user",
        "--disable-userns",
        "--cap-drop",
        "ALL",
        "--",
        "/bin/sh",
        "-c",
    ]
    allowed = sandbox_command("bwrap", SandboxSpec(home="/h", uid=1, gid=1, user_namespaces=True))
    assert allowed[allowed.index("setpriv") + 7 :] == ["--", "/bin/sh", "-c"]
    assert "--ro-bind / /" not in text  # no view of the whole host
    assert "--ro-bind /usr /usr" in text and "--symlink usr/bin /bin" in text
    # The runtime once (not what is inside it, nor what the system shows already).
    assert text.count("--ro-bind /opt/venv /opt/venv") == 1 and "/opt/venv/lib" not in text
    assert "/usr/lib/python3" not in text
    # Parents the session must cross are made 0755 before the binds that need them.
    assert text.index("--perms 0755 --dir /opt") < text.index("--ro-bind /opt/venv")
    assert text.index("--perms 0755 --dir /h") < text.index("--bind /h/alice /h/alice")
    assert "--size 67108864 --perms 1777 --tmpfs /tmp" in text and "--tmpfs /var/tmp" in text
    assert text.index("--dev /dev") < text.index("--size 67108864 --perms 1777 --tmpfs /dev/shm")
    assert "--ro-bind /d/ro /h/alice/r" in text and "--bind /d/rw /h/alice/w" in text
    assert "--hostname alice-gpu" in text and "--unshare-pid" in text
    assert "--unshare-user" not in text[: text.index("setpriv")]  # the mounts are the host's


def test_sandbox_without_root_is_a_user_namespace_with_every_capability_dropped():
    cmd = sandbox_command("bwrap", SandboxSpec(home="/h/a", system=SYSTEM))
    assert cmd[0] == "bwrap" and "setpriv" not in cmd and "nsenter" not in cmd
    text = " ".join(cmd)
    assert "--unshare-user --cap-drop ALL -- /bin/sh -c" in text


def test_sandbox_shows_a_checkout_but_keeps_its_state_and_tools_hidden():
    spec = SandboxSpec(
        home="/tmp/co/.labfleet-state/homes/alice",
        system=SYSTEM,
        runtime=("/tmp/co", "/tmp/co/.labfleet-tools/apps"),
        hidden=("/tmp/co/.labfleet-state", "/tmp/co/.labfleet-tools", "/srv/vf"),
        hidden_files=("/tmp/co/secret.key",),
        mounts=(
            Mount("/tmp/co/.labfleet-state/vfolders/u/d", "/tmp/co/.labfleet-state/homes/alice/vfolders/d"),
        ),
        uid=999,
        gid=995,
    )
    text = " ".join(sandbox_command("bwrap", spec))
    assert text.index("--tmpfs /tmp ") < text.index("--ro-bind /tmp/co /tmp/co")
    assert text.index("--ro-bind /tmp/co /tmp/co") < text.index("--tmpfs /tmp/co/.labfleet-state")
    assert "--ro-bind /dev/null /tmp/co/secret.key" in text
    # The app launchers' programs come back from inside the hidden tools folder.
    assert text.index("--tmpfs /tmp/co/.labfleet-tools") < text.index(
        "--ro-bind /tmp/co/.labfleet-tools/apps /tmp/co/.labfleet-tools/apps"
    )
    # The home and the folders are bound over the hidden state, with 0755 parents in the tmpfs.
    assert text.index("--tmpfs /tmp/co/.labfleet-state") < text.index(
        "--perms 0755 --dir /tmp/co/.labfleet-state/homes"
    )
    assert text.index("--dir /tmp/co/.labfleet-state/homes") < text.index(
        "--bind /tmp/co/.labfleet-state/homes/alice"
    )
    assert (
        "--bind /tmp/co/.labfleet-state/vfolders/u/d /tmp/co/.labfleet-state/homes/alice/vfolders/d" in text
    )
    # A hidden folder the sandbox does not show anyway needs no cover.
    assert "/srv/vf" not in text


def _fake_venv(root):
    """A venv as pip leaves it after editable installs of four kinds, and a linked labextension."""
    venv = root / "venv"
    sp = venv / "lib" / "python3.11" / "site-packages"
    sp.mkdir(parents=True)
    checkout, src, pkg, legacy = root / "checkout", root / "src-layout", root / "edit", root / "legacy"
    for d in (checkout / "labextension" / "build", src / "src" / "pkg", pkg / "x", legacy):
        d.mkdir(parents=True)
    # hatchling (the default dev mode): the checkout itself, once per package.
    (sp / "_editable_impl_labfleet.pth").write_text(f"{checkout}\n{checkout}\n")
    # setuptools: a .pth importing a finder whose MAPPING names the packages.
    (sp / "__editable__.pkg-1.0.pth").write_text(
        "import __editable___pkg_1_0_finder; __editable___pkg_1_0_finder.install()\n"
    )
    (sp / "__editable___pkg_1_0_finder.py").write_text(
        f"MAPPING: dict[str, str] = {{'pkg': {str(src / 'src' / 'pkg')!r}}}\n"
        "NAMESPACES: dict[str, list[str]] = {}\n"
        "PATH_PLACEHOLDER = '__editable__.pkg-1.0.finder' + '.__path_hook__'\n"
    )
    # hatchling's exact mode (editables): map_module to the package's __init__.py.
    (sp / "_x.pth").write_text("import _editable_impl_x\n")
    (sp / "_editable_impl_x.py").write_text(
        "from editables.redirector import RedirectingFinder as F\n"
        f"F.install()\nF.map_module('x', {str(pkg / 'x' / '__init__.py')!r})\n"
    )
    # setup.py develop, a PEP 610 record, comments, blank lines and other import lines.
    (sp / "legacy.egg-link").write_text(f"{legacy}\n.\n")
    dist = sp / "labfleet-0.1.0.dist-info"
    dist.mkdir()
    (dist / "direct_url.json").write_text(
        json.dumps({"url": f"file://{checkout}", "dir_info": {"editable": True}})
    )
    (sp / "distutils-precedence.pth").write_text(
        "import os; var = 'X'; enabled = os.environ.get(var, 'local') == 'local'; "
        "enabled and __import__('_distutils_hack').add_shim(); \n"
    )
    (sp / "notes.pth").write_text("# a comment\n\nrelative-dir\n")
    # The labextension linked into the venv (scripts/setup.sh), and one installed as files.
    ext = venv / "share" / "jupyter" / "labextensions"
    (ext / "@labfleet").mkdir(parents=True)
    (ext / "@labfleet" / "labextension").symlink_to(checkout / "labextension" / "build")
    (ext / "jupyterlab_pygments").mkdir()
    return venv, sp, checkout, src, pkg, legacy


def test_the_sources_of_editable_installs_are_found(tmp_path):
    venv, sp, checkout, src, pkg, legacy = _fake_venv(tmp_path)
    found = site_packages_sources(str(sp))
    # .pth path lines first (in file name order), then the finders, egg-links and PEP 610 records.
    assert found == [
        str(checkout),
        str(sp / "relative-dir"),
        str(src / "src" / "pkg"),
        str(pkg / "x"),
        str(legacy),
    ]
    assert link_targets(str(venv / "share" / "jupyter" / "labextensions")) == [
        str(checkout / "labextension" / "build")
    ]
    assert set(environment_sources(str(venv))) == {*found, str(checkout / "labextension" / "build")}
    # Nothing there (a system Python, a missing folder): nothing found, no error.
    assert environment_sources(str(tmp_path / "nowhere")) == []


CHOICES = {
    "projects": [
        {"name": "acme/ml", "left": {"cpu": 4, "mem": 8 * GIB, "gpu": None, "gpu.shares": 1.5}},
        {"name": "acme/<b>", "left": {"cpu": None, "mem": None, "gpu": None, "gpu.shares": None}},
    ],
    "images": [{"name": "repo/x:1", "display_name": "X <img>", "projects": ["acme/ml"], "min_slots": {}}],
    "resource_groups": [
        {
            "name": "default",
            "session_types": ["interactive", "batch"],
            "free_now": {
                "alive_nodes": 1,
                "nodes": 2,
                "cpu": 2,
                "mem": 3 * GIB,
                "gpu": 0,
                "gpu.shares": 0.75,
            },
        }
    ],
}


def test_form_offers_only_the_choices_and_escapes_them():
    html = render(CHOICES, previous={"project": "acme/ml", "gpu": "0.5"})
    assert '<option value="acme/ml" selected>acme/ml</option>' in html
    assert "acme/&lt;b&gt;" in html and "<b>" not in html and "X &lt;img&gt;" in html
    assert 'data-projects="acme/ml"' in html and 'value="0.5"' in html
    assert "What the quota of acme/ml leaves" in html and "8 GiB" in html and "unlimited" in html
    # Beside each quota, what the group can give one session now: no whole GPU, though 0.75 of one is free.
    table = html[html.index('data-project="acme/ml" data-group="default"') :]
    table = table[: table.index("</table>")]
    assert "(1 of 2 nodes up)" in table
    assert "<th scope='row'>Whole GPUs</th><td>unlimited</td><td>0</td>" in table
    assert "<th scope='row'>GPU shares</th><td>1.5</td><td>0.75</td>" in table
    assert "<th scope='row'>Memory</th><td>8 GiB</td><td>3 GiB</td>" in table
    assert '"acme/ml": {"cpu": 4' in html  # the bounds the script applies to the inputs
    assert 'var previewUrl = "/services/labfleet/api/sessions/preview"' in render(
        CHOICES, preview_url="/services/labfleet/api/sessions/preview"
    )
    # No project: who can add you, by name; an admin is sent to the console; no Start to press.
    nobody = {"projects": [], "user": "dan", "role": "user", "project_admins": ["carol", "<x>"]}
    assert "ask carol, &lt;x&gt; to add you" in render(nobody)
    assert "Domains &amp; Projects" in render({**nobody, "user": "carol", "role": "admin"})
    assert "#spawn_form [type=submit]" in render(nobody)
    assert "&lt;x&gt;" in unavailable("<x>")


def test_a_session_gets_its_gpus_device_nodes_and_the_drivers_only(tmp_path):
    from labfleet.spawner.launch import GPUAssignment
    from labfleet.spawner.sandbox import gpu_device_nodes

    for name in ("nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1", "nvidia2"):
        (tmp_path / name).write_text("")
    gpu = GPUAssignment(uuid="GPU-1", index=1, model="m", memory=0, shares=Decimal("0.5"))
    nodes = gpu_device_nodes([gpu], dev=str(tmp_path))
    assert nodes == (str(tmp_path / "nvidiactl"), str(tmp_path / "nvidia-uvm"), str(tmp_path / "nvidia1"))
    assert gpu_device_nodes([], dev=str(tmp_path)) == ()


CAPS = (
    "PYTORCH_CUDA_ALLOC_CONF",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "CUPY_GPU_MEMORY_LIMIT",
    "LABFLEET_GPU_ENFORCEMENT",
)


def test_a_fraction_caps_every_framework_with_or_without_mps():
    o = parse_options({"project": "ml", "gpu": 0.5})
    quarter = dict(SESSION, devices=[dict(SESSION["devices"][0], shares=0.25)])
    caps = build_launch(quarter, o).env
    assert {k: caps[k] for k in CAPS} == {
        "PYTORCH_CUDA_ALLOC_CONF": "per_process_memory_fraction:0.25",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.25",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        "CUPY_GPU_MEMORY_LIMIT": "25%",
        "LABFLEET_GPU_ENFORCEMENT": "caps",
    }
    assert caps["LABFLEET_GPU_MEMORY_LIMIT"] == str(20 * GIB)
    mps = build_launch(SESSION, o, mps=True).env
    assert mps["LABFLEET_GPU_ENFORCEMENT"] == "mps" and mps["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert mps["PYTORCH_CUDA_ALLOC_CONF"] == "per_process_memory_fraction:0.5"
    assert mps["CUPY_GPU_MEMORY_LIMIT"] == "50%"
    whole = dict(SESSION, devices=[dict(SESSION["devices"][0], shares=1)])
    for env in (build_launch(whole, o, mps=True).env, build_launch(dict(SESSION, devices=[]), o).env):
        assert not set(CAPS) & set(env)


@pytest.mark.parametrize(
    "theirs, expected",
    [
        (None, "per_process_memory_fraction:0.25"),
        ("", "per_process_memory_fraction:0.25"),
        (" , ", "per_process_memory_fraction:0.25"),
        (
            "expandable_segments:True,max_split_size_mb:128",
            "expandable_segments:True,max_split_size_mb:128,per_process_memory_fraction:0.25",
        ),
        # Theirs is larger: ours; smaller: theirs, as they wrote it.
        (
            "per_process_memory_fraction:0.9,expandable_segments:True",
            "expandable_segments:True,per_process_memory_fraction:0.25",
        ),
        ("per_process_memory_fraction:1e-1", "per_process_memory_fraction:1e-1"),
        # A fraction PyTorch would refuse gives way to ours; other odd items stay theirs to judge.
        ("per_process_memory_fraction:lots", "per_process_memory_fraction:0.25"),
        ("per_process_memory_fraction:0,junk", "junk,per_process_memory_fraction:0.25"),
        ("per_process_memory_fraction:NaN", "per_process_memory_fraction:0.25"),
        ("per_process_memory_fraction:", "per_process_memory_fraction:0.25"),
        # A [...] list keeps its commas.
        (
            "roundup_power2_divisions:[256:1,512:2],garbage_collection_threshold:0.6",
            "roundup_power2_divisions:[256:1,512:2],garbage_collection_threshold:0.6,"
            "per_process_memory_fraction:0.25",
        ),
    ],
)
def test_merge_alloc_conf_keeps_theirs_under_the_smaller_fraction(theirs, expected):
    ours = "per_process_memory_fraction:0.25"
    assert merge_alloc_conf(theirs, ours) == expected
    assert merge_alloc_conf(expected, ours) == expected  # merging again changes nothing


def test_with_caps_merges_their_pytorch_setting_and_leaves_whole_devices_alone():
    ours = {"PYTORCH_CUDA_ALLOC_CONF": "per_process_memory_fraction:0.5", "LABFLEET_GPU_FRACTION": "0.5"}
    theirs = {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "PYTORCH_ALLOC_CONF": "per_process_memory_fraction:0.2",
    }
    assert with_caps(theirs, ours) == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,per_process_memory_fraction:0.5",
        # PyTorch reads the newer name first: the cap goes there too (theirs is smaller).
        "PYTORCH_ALLOC_CONF": "per_process_memory_fraction:0.2",
        "LABFLEET_GPU_FRACTION": "0.5",
    }
    assert with_caps(theirs, {"LABFLEET_GPU_SHARES": "1"}) == {"LABFLEET_GPU_SHARES": "1"}


def test_mps_follows_the_sessions_node_not_the_hub_host(monkeypatch, tmp_path):
    from labfleet.spawner.mixin import session_mps

    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))  # the Hub host's: never looked at
    on = {"node_mps": {"state": "on", "reason": None, "pipe_dir": "/run/labfleet/mps"}}
    failed = {"node_mps": {"state": "failed", "reason": "died", "pipe_dir": None}}
    assert session_mps("auto", on) == (True, "/run/labfleet/mps")
    assert session_mps("auto", failed) == (False, None)
    assert session_mps("auto", {"node_mps": None}) == (False, None)
    assert session_mps("auto", {}) == (False, None)
    assert session_mps("yes", failed) == (True, None)
    assert session_mps("no", on) == (False, None)


# -- MPS only for sessions that run as one non-root uid (issue [3/7], item 2) -------------------------

MPS_ON = {"node_mps": {"state": "on", "reason": None, "pipe_dir": "/run/labfleet/mps"}}


class _Started:
    """The backend below the mixin: its start() answers the server's URL."""

    async def start(self):
        return "http://127.0.0.1:9/"


def _mixin_spawner(withheld, tmp_path, **config):
    from types import SimpleNamespace

    from labfleet.core.http import HTTPReply
    from labfleet.spawner.mixin import LabfleetSpawnerMixin

    placed = {**SESSION, **MPS_ON, "id": "s-1", "status": "SCHEDULED", "node": "node-1"}

    class Spawner(LabfleetSpawnerMixin, _Started):
        name = "gpu"
        _log_name = "alice/gpu"
        user_options: dict = {}
        user = SimpleNamespace(name="alice")
        lf_in_container = True

        def lf_mps_withheld(self):
            return withheld

        def lf_session_home(self):
            return "/home/jovyan"

        async def lf_call(self, method, path, body=None):
            self.calls.append((method, path, body))
            return HTTPReply(201 if method == "POST" else 200, placed)

    s = Spawner(session_log_dir=str(tmp_path), **config)
    s.calls = []
    s.lf_options = parse_options({"project": "ml", "gpu": 0.5})
    return s


async def test_a_session_the_backend_withholds_mps_from_holds_by_caps_and_says_why(tmp_path, caplog):
    from labfleet.session import fleet
    from labfleet.session.runner import SessionEnv

    reason = "the session runs as root ('0:0'), who could change the node's MPS limits"
    s = _mixin_spawner(reason, tmp_path, mps="auto")
    assert await s.start() == "http://127.0.0.1:9/"
    launch = s.lf_launch
    assert not launch.mps and launch.mps_withheld == reason
    assert launch.env["LABFLEET_GPU_ENFORCEMENT"] == "caps"
    assert launch.env["LABFLEET_GPU_MPS_WITHHELD"] == reason
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in launch.env
    assert s.lf_mps_pipe_dir is None  # no pipe reaches the session (get_env, the sandbox's writable dirs)
    # The Hub's log and the session's status at the service say why.
    assert any(
        "gets no MPS on node node-1" in r.getMessage() and reason in r.getMessage() for r in caplog.records
    )
    (running,) = [body for method, _, body in s.calls if method == "PATCH" and body["status"] == "RUNNING"]
    assert running["reason"] == f"server started; MPS withheld, framework caps only: {reason}"
    # The session's sidebar: its share, held by caps, and why not by MPS.
    share = fleet.gpu_share(SessionEnv.from_environ(launch.env))
    assert share == {"shares": 0.5, "memory": 40 * GIB, "enforcement": "caps", "mps_withheld": reason}


async def test_a_session_the_backend_may_give_mps_gets_it_and_says_nothing(tmp_path):
    from labfleet.session import fleet
    from labfleet.session.runner import SessionEnv

    s = _mixin_spawner(None, tmp_path, mps="auto")
    await s.start()
    assert s.lf_launch.mps and s.lf_launch.mps_withheld is None
    assert s.lf_launch.env["LABFLEET_GPU_ENFORCEMENT"] == "mps" and s.lf_mps_pipe_dir == "/run/labfleet/mps"
    assert "LABFLEET_GPU_MPS_WITHHELD" not in s.lf_launch.env
    (running,) = [body for method, _, body in s.calls if method == "PATCH" and body["status"] == "RUNNING"]
    assert running["reason"] == "server started"
    assert "mps_withheld" not in fleet.gpu_share(SessionEnv.from_environ(s.lf_launch.env))
    # Where the node runs no MPS, nothing is withheld: the hook is not even asked.
    off = _mixin_spawner("never asked", tmp_path, mps="no")
    await off.start()
    assert off.lf_launch.env["LABFLEET_GPU_ENFORCEMENT"] == "caps" and off.lf_launch.mps_withheld is None


def test_local_sessions_get_mps_unless_they_would_run_as_root(monkeypatch):
    from types import SimpleNamespace

    import labfleet.spawner.local as local
    from labfleet.spawner.local import LabfleetLocalSpawner

    s = LabfleetLocalSpawner(user=SimpleNamespace(name="alice", url="/user/alice/"))
    monkeypatch.setattr(local.os, "geteuid", lambda: 1000)
    assert s.lf_mps_withheld() is None  # a Hub that is not root: sessions run as its own user
    monkeypatch.setattr(local.os, "geteuid", lambda: 0)
    account = SimpleNamespace(pw_uid=999, pw_gid=999)
    monkeypatch.setattr(local.pwd, "getpwnam", lambda name: account)
    assert s.lf_mps_withheld() is None  # the session account

    def missing(name):
        raise KeyError(name)

    monkeypatch.setattr(local.pwd, "getpwnam", missing)
    assert s.lf_mps_withheld() is None  # no account: the spawn fails in lf_prepare, with its reason
    s.allow_privileged_sessions, s.sandbox = True, "no"
    assert "root" in s.lf_mps_withheld()  # sessions as root: never a client of the node's daemon
