"""A git server for tests: git's "dumb" HTTP protocol (static files) on an address the test picks.

Repositories are bare ones under ``root``; after every change :meth:`GitServer.publish` runs
``git update-server-info`` so a client sees it.  Paths under ``/private/`` want HTTP basic auth
with the token the test set.  Other files under ``root`` (a notebook, an archive) are served as
they are.  Every request is recorded (path and whether it carried credentials) so a test can check
what reached the server.
"""

from __future__ import annotations

import base64
import subprocess
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "Teacher",
    "GIT_AUTHOR_EMAIL": "teacher@example.org",
    "GIT_COMMITTER_NAME": "Teacher",
    "GIT_COMMITTER_EMAIL": "teacher@example.org",
    "PATH": "/usr/bin:/bin",
    "HOME": "/nonexistent",
    # Tests read checkouts that belong to the sessions' uid.
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "safe.directory",
    "GIT_CONFIG_VALUE_0": "*",
}


def git(*args: str, cwd: Path | str | None = None) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True, text=True
    ).stdout


class _Handler(SimpleHTTPRequestHandler):
    server_ref: GitServer

    def log_message(self, format, *args):  # noqa: A002 (the stdlib's name)
        pass

    def do_GET(self):
        srv = self.server_ref
        auth = self.headers.get("Authorization", "")
        srv.requests.append((self.path, bool(auth)))
        if self.path.startswith("/private/"):
            want = "Basic " + base64.b64encode(f"{srv.user}:{srv.token}".encode()).decode()
            if auth != want:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="private"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        super().do_GET()


class GitServer:
    def __init__(self, root: Path, host: str = "127.0.0.1", *, user: str = "oauth2", token: str = "") -> None:
        self.root = root
        self.user, self.token = user, token
        self.requests: list[tuple[str, bool]] = []
        handler = type("Handler", (_Handler,), {"server_ref": self})
        self.httpd = ThreadingHTTPServer((host, 0), partial(handler, directory=str(root)))
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> GitServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def publish(self, work: Path, name: str) -> str:
        """Push the work tree's branch to the bare ``<root>/<name>`` and make it servable: its URL."""
        publish(work, self.root, name)
        return f"{self.url}/{name}"


def publish(work: Path, root: Path, name: str) -> Path:
    """The work tree's branch in the bare repository ``<root>/<name>``, ready for dumb HTTP (any
    static file server over ``root`` serves it)."""
    bare = root / name
    if not bare.exists():
        bare.parent.mkdir(parents=True, exist_ok=True)
        git("clone", "--quiet", "--bare", str(work), str(bare))
    else:
        git("push", "--quiet", str(bare), "HEAD:main", cwd=work)
    git("update-server-info", cwd=bare)
    return bare


def make_work_tree(path: Path, files: dict[str, str], message: str = "first") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if not (path / ".git").exists():
        git("init", "--quiet", "-b", "main", cwd=path)
    commit(path, files, message)
    return path


def commit(work: Path, files: dict[str, str], message: str) -> None:
    for rel, text in files.items():
        f = work / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    git("add", "-A", cwd=work)
    git("commit", "--quiet", "-m", message, cwd=work)
