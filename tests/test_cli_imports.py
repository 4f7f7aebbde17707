"""``labfleet import`` and ``labfleet import-credential``: the CLI calling a real Hub's labfleet
service with a user's keypair, and a git server on 127.0.0.1 (tests/gitserver.py) for a private
repository.

The Hub lets imports fetch from 127.0.0.1 (``LABFLEET_IMPORT_ALLOWED_HOSTS``). Commands run in this
process as in a process of their own (tests/test_cli.py's ``run_in_process``); the one that reads
the token from stdin runs as the real ``python -m labfleet.cli``, with the token piped in.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from labfleet.cli.client import Credentials, ServiceClient
from tests.gitserver import GitServer, commit, make_work_tree
from tests.hubfixture import start_hub
from tests.test_cli import ENTRY_POINT, Cli, run_in_process

pytestmark = pytest.mark.hub


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = start_hub(tmp_path_factory.mktemp("hub"), env={"LABFLEET_IMPORT_ALLOWED_HOSTS": "127.0.0.1"})
    yield h
    h.stop()


@pytest.fixture(scope="module")
def alice(hub):
    """alice in domain acme (project ml), and a keypair of hers: (access key, secret key)."""
    root = hub.wait_token("root")
    for path, body in [
        ("/domains", {"name": "acme"}),
        ("/projects", {"domain": "acme", "name": "ml"}),
        ("/users", {"username": "alice", "domain": "acme", "projects": ["ml"]}),
    ]:
        r = hub.api("POST", path, root, json=body)
        assert r.status_code == 201, r.text
    r = hub.api("POST", "/keypairs", root, json={"username": "alice"})
    assert r.status_code == 201, r.text
    return r.json()["access_key"], r.json()["secret_key"]


class UserCli:
    """``labfleet`` as alice: the service's URL and her keypair in the environment, no database."""

    def __init__(self, hub, keypair: tuple[str, str], directory: Path) -> None:
        self.dir = directory
        self.env = dict(
            Cli(directory).env,
            LABFLEET_SERVICE_URL=hub.api_url,
            LABFLEET_ACCESS_KEY=keypair[0],
            LABFLEET_SECRET_ACCESS_KEY=keypair[1],
        )
        self.service = ServiceClient(hub.api_url, Credentials(*keypair))

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        return run_in_process(list(args), {**self.env, **env}, self.dir)

    def __call__(self, *args: str) -> str:
        p = self.run(*args)
        assert p.returncode == 0, f"labfleet {' '.join(args)} failed ({p.returncode}): {p.stderr}"
        return p.stdout

    def fails(self, *args: str, code: int, **env: str) -> str:
        p = self.run(*args, **env)
        lines = p.stderr.splitlines()
        assert p.returncode == code and len(lines) == 1, (args, p)
        assert lines[0].startswith("labfleet: error: "), lines
        return lines[0]

    def piped(self, stdin: str, *args: str) -> subprocess.CompletedProcess:
        """The real command, with ``stdin`` piped in."""
        return subprocess.run(
            [*ENTRY_POINT, *args],
            cwd=self.dir,
            env=self.env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def api(self, path: str):
        return self.service.call("GET", path).data


def test_import_a_private_repository_with_a_stored_credential(hub, alice, tmp_path):
    cli = UserCli(hub, alice, tmp_path)
    token = "ghp_" + os.urandom(12).hex()
    with GitServer(tmp_path / "srv", token=token) as server:
        work = make_work_tree(tmp_path / "w", {"hello.ipynb": "{}", "README.md": "hi\n"})
        url = server.publish(work, "private/lab.git")

        # Bad input and refusals: one line, non-zero, nothing stored, nothing imported.
        assert "scheme" in cli.fails("import", "file:///etc/passwd", code=2)  # the service's 400
        assert "--gpu" in cli.fails("import", url, "--gpu", "lots", code=2)
        assert "HOST" in cli.fails("import-credential", "set", "a/b", code=2)
        assert "no token on stdin" in cli.fails("import-credential", "set", "127.0.0.1", code=2)
        assert "signature" in cli.fails(
            "import-credential", "list", code=1, LABFLEET_SECRET_ACCESS_KEY="x" * 40
        )
        assert "LABFLEET_ACCESS_KEY" in cli.fails(
            "import-credential", "list", code=2, LABFLEET_ACCESS_KEY="", LABFLEET_SECRET_ACCESS_KEY=""
        )
        assert cli.api("/imports")["items"] == [] and cli.api("/vfolders") == []
        assert cli.api("/import-credentials")["items"] == []

        # The token goes in on stdin, and comes out nowhere.
        p = cli.piped(token + "\n", "import-credential", "set", "127.0.0.1")
        assert p.returncode == 0 and "Stored your token for 127.0.0.1" in p.stdout, p
        assert token not in p.stdout + p.stderr
        listed = cli("import-credential", "list")
        assert "127.0.0.1" in listed and "oauth2" in listed and token not in listed
        assert [c["host"] for c in json.loads(cli("import-credential", "list", "--json"))] == ["127.0.0.1"]

        out = cli("import", url, "--open", "hello.ipynb", "--project", "ml")
        assert "Importing" in out and "fetching..." in out and token not in out
        assert "folder:" in out and "lab (id " in out and "path:" in out and "hello.ipynb" in out
        assert "~/vfolders/lab/hello.ipynb" in out and "updated:" in out, out
        assert any(auth for path, auth in server.requests if path.startswith("/private/"))
        [folder] = cli.api("/vfolders")
        assert folder["name"] == "lab"

        # Again after an upstream commit: a re-sync, its report as JSON.
        commit(work, {"README.md": "hi, v2\n", "new.txt": "new\n"}, "second")
        server.publish(work, "private/lab.git")
        job = json.loads(cli("import", url, "--json"))
        assert job["status"] == "done" and job["resync"] and job["folder"]["id"] == folder["id"], job
        assert {"README.md", "new.txt"} <= set(job["report"]["updated"]), job

    # The server is gone: the import fails in the service, and says why.
    started = cli("import", url, "--no-wait")
    assert started.startswith("Started import ") and "fetching" in started, started
    line = cli.fails("import", url, code=1)
    assert line.startswith("labfleet: error: the import failed: "), line
    # A Hub token does as well as a keypair (a session's own, in a session's terminal).
    token_env = {
        "LABFLEET_ACCESS_KEY": "",
        "LABFLEET_SECRET_ACCESS_KEY": "",
        "JUPYTERHUB_API_TOKEN": hub.wait_token("alice"),
    }
    p = cli.run("import-credential", "list", **token_env)
    assert p.returncode == 0 and "127.0.0.1" in p.stdout, p
    assert cli("import-credential", "delete", "127.0.0.1").startswith("Deleted your token for 127.0.0.1")
    assert cli.api("/import-credentials")["items"] == []
    assert "127.0.0.1" in cli.fails("import-credential", "delete", "127.0.0.1", code=1)  # the service's 404
