"""``labfleet import`` and ``labfleet import-credential``: Import & Run from the command line.

An import is one of the service's jobs (:mod:`labfleet.storage.imports`): ``labfleet import URL``
starts it (``POST /api/imports``), follows it every half second (``GET /api/imports/{id}``) and
says where it landed and what the re-sync did. ``labfleet import-credential`` stores the user's
token for a host (``/api/import-credentials``), read from stdin, never from the command line.

Both call the service as a user (:mod:`labfleet.cli.client`): a keypair or a Hub token from the
environment.
"""

from __future__ import annotations

import getpass
import sys
import time
from typing import Any

from labfleet.cli.base import JSON_OPTION, CliError, Group, Option, UsageError, flag, is_tty
from labfleet.cli.client import ApiCommand, RateLimited, ServiceUnreachable, path_part
from labfleet.cli.output import format_table, json_text, one_line

POLL_SECONDS = 0.5
POLL_RETRIES = 10  # polls in a row with no answer from the service before giving up
FINISHED = ("done", "failed")
SHOWN_NAMES = 5  # names of each report list printed; the rest counted
MAX_TOKEN_READ = 64 << 10  # the service takes 4096 characters; more read is refused there


def gpu_amount(s: str) -> float:
    try:
        value = float(s.strip())
    except ValueError:
        raise ValueError(f"expected a number of GPUs such as 1 or 0.5 (got {s!r:.40})") from None
    if not value >= 0:  # negative, or NaN
        raise ValueError(f"expected a number of GPUs, 0 or more (got {s!r:.40})")
    return value


def names_text(names: list[str]) -> str:
    if not names:
        return "0"
    shown = ", ".join(names[:SHOWN_NAMES])
    more = len(names) - SHOWN_NAMES
    return f"{len(names)} ({shown}{f', and {more} more' if more > 0 else ''})"


# ---------------------------------------------------------------- labfleet import


class Import(ApiCommand):
    name = "labfleet import"
    summary = "Import a notebook, a git repository or an archive by URL into a folder (Import & Run)."
    description = """Import a notebook (.ipynb), a git repository (with its history) or an archive
    (.zip, .tar.gz, .tgz, .tar) by URL into a folder of yours, and wait until it is there. By default
    it lands in a new folder named after what is imported; importing the same repository again
    re-syncs the checkout (your edits win, a file in the way is renamed) and reports what changed.
    A private repository is cloned with your token for its host (`labfleet import-credential set`),
    never with a token in the URL. The project, image, GPU and resource group are remembered for the
    session that opens it from the Hub's import page."""
    examples = (
        "labfleet import https://github.com/acme/course.git --open lesson1.ipynb",
        "labfleet import https://example.org/data.tar.gz --folder datasets",
        "labfleet import https://gitlab.example.org/ml/lab.git --branch dev --project acme/ml --gpu 0.5",
    )
    arguments = ("URL",)
    options = (
        Option(
            "--folder", "A folder of yours (name or id) to import into, at FOLDER/NAME.", metavar="FOLDER"
        ),
        Option("--branch", "The branch of a repository (default: its default branch).", metavar="BRANCH"),
        Option("--open", "A path inside what is imported, for the session to open.", metavar="PATH"),
        Option(
            "--project", "The project of the session that opens it (a project of yours).", metavar="PROJECT"
        ),
        Option("--image", "The image of the session that opens it.", metavar="IMAGE"),
        Option("--gpu", "GPUs of the session that opens it, e.g. 1 or 0.5.", metavar="N", convert=gpu_amount),
        Option("--resource-group", "The resource group of the session that opens it.", metavar="GROUP"),
        flag("--no-wait", "Start the import and return at once (it goes on in the service)."),
        flag("--json", "Print the import as JSON (at the end; at the start with --no-wait)."),
    )

    def body(self) -> dict[str, Any]:
        url = self.args[0].strip()
        if not url:
            raise UsageError("URL is empty: give the address of a notebook, a repository or an archive")
        body: dict[str, Any] = {"url": url}
        for key in ("folder", "branch", "open", "project", "image", "resource_group"):
            value = getattr(self.opts, key)
            if value is not None:
                if not value.strip():
                    raise UsageError(f"--{key.replace('_', '-')} is empty")
                body[key] = value
        if self.opts.gpu is not None:
            body["gpu"] = self.opts.gpu
        return body

    def run(self) -> None:
        job = self.client.call("POST", "/imports", self.body()).data
        if not isinstance(job, dict) or not isinstance(job.get("id"), str):
            raise ServiceUnreachable("the labfleet service answered the import without an id")
        if self.opts.no_wait:
            if self.opts.json:
                self.out(json_text(job))
            else:
                self.out(f"Started import {job['id']} of {job.get('url', self.args[0])}: {job['status']}.")
                self.out("It goes on in the service; the Hub's import page and GET /api/imports show it.")
            return
        if not self.opts.json:
            folder = (job.get("folder") or {}).get("name") or "?"
            self.out(f"Importing {job.get('url', self.args[0])} into folder {folder} (import {job['id']}).")
            self.out(f"{job['status']}...")
        job = self.follow(job)
        if self.opts.json:
            self.out(json_text(job))
        else:
            self.summary_lines(job)
        if job["status"] != "done":
            raise CliError(f"the import failed: {one_line(job.get('message') or 'no reason given')}")

    def follow(self, job: dict[str, Any]) -> dict[str, Any]:
        """Poll until the job is done or failed, printing each change of status."""
        job_id = path_part(job["id"], "the import's id", "the id the service gave")
        status, misses = job["status"], 0
        try:
            while job["status"] not in FINISHED:
                time.sleep(POLL_SECONDS)
                try:
                    job = self.client.call("GET", f"/imports/{job_id}").data
                except ServiceUnreachable:
                    misses += 1
                    if misses >= POLL_RETRIES:
                        raise
                    continue
                except RateLimited as e:  # the keypair's window is spent: wait for the next one
                    if not self.opts.json:
                        self.out(f"(rate limited: asking again in {e.retry_after:.0f} s)")
                    time.sleep(e.retry_after)
                    continue
                misses = 0
                if job["status"] != status and job["status"] not in FINISHED and not self.opts.json:
                    self.out(f"{job['status']}...")
                status = job["status"]
        except KeyboardInterrupt:
            raise CliError(f"interrupted: import {job_id} goes on in the service", 130) from None
        return job

    def summary_lines(self, job: dict[str, Any]) -> None:
        folder = job.get("folder") or {}
        report = job.get("report") or {}
        if job["status"] == "done":
            message = one_line(job.get("message") or "")
            self.out(f"Done: {message}" if message else "Done.")
        name, path = folder.get("name") or "-", job.get("path") or ""
        rows = [
            ("folder", f"{name} (id {folder.get('id')})" if folder.get("id") else name),
            ("path", path or "(the folder itself)"),
        ]
        if job["status"] == "done":
            rows.append(("in a session", f"~/vfolders/{name}/{path}".rstrip("/")))
            rows += [
                (what, names_text(list(report.get(what) or []))) for what in ("updated", "kept", "renamed")
            ]
        width = max(len(k) for k, _ in rows) + 1
        for key, value in rows:
            self.out(f"{key + ':':<{width}} {value}")


# ---------------------------------------------------------------- labfleet import-credential

HOST_EXAMPLE = "a host name such as github.com"


class CredentialSet(ApiCommand):
    name = "labfleet import-credential set"
    summary = "Store your token for a host (read from stdin), for imports of private repositories."
    description = """Store (or replace) your access token for a host, used to clone private
    repositories from it. The token is read from stdin (asked for without echo on a terminal), never
    from the command line, which shows in `ps` and in shell history. The service stores it encrypted
    and never shows it again."""
    examples = (
        "labfleet import-credential set github.com            # asks for the token",
        "labfleet import-credential set gitlab.example.org --username oauth2 < token-file",
    )
    arguments = ("HOST",)
    options = (
        Option(
            "--username",
            "The user name sent with the token (default oauth2, what GitLab wants; GitHub takes any).",
            metavar="NAME",
        ),
        JSON_OPTION,
    )

    def read_token(self, host: str) -> str:
        if is_tty():
            token = getpass.getpass(f"Token for {host} (not echoed): ")
        else:
            token = sys.stdin.read(MAX_TOKEN_READ)
        token = token.strip()
        if not token:
            raise UsageError(
                f"no token on stdin: pipe it in (`labfleet import-credential set {host} < FILE`) "
                "or run this on a terminal to be asked"
            )
        return token

    def run(self) -> None:
        host = path_part(self.args[0].strip().lower(), "HOST", HOST_EXAMPLE)
        if self.opts.username is not None and not self.opts.username.strip():
            raise UsageError("--username is empty")
        client = self.client  # no credentials, no service URL: said before the token is asked for
        body: dict[str, Any] = {"token": self.read_token(host)}
        if self.opts.username is not None:
            body["username"] = self.opts.username.strip()
        view = client.call("PUT", f"/import-credentials/{host}", body).data
        if self.opts.json:
            self.out(json_text(view))
            return
        self.out(
            f"Stored your token for {view.get('host', host)} (user name {view.get('username', '?')}); "
            "it is never shown again."
        )


class CredentialList(ApiCommand):
    name = "labfleet import-credential list"
    description = "List the hosts you stored a token for (never the tokens)."
    options = (JSON_OPTION,)

    def run(self) -> None:
        data = self.client.call("GET", "/import-credentials").data
        items = data.get("items", []) if isinstance(data, dict) else []
        if self.opts.json:
            self.out(json_text(items))
            return
        self.out(
            format_table(
                ["host", "username", "stored"], ([c["host"], c["username"], c["created_at"]] for c in items)
            )
        )


class CredentialDelete(ApiCommand):
    name = "labfleet import-credential delete"
    description = "Forget your token for a host."
    arguments = ("HOST",)

    def run(self) -> None:
        host = path_part(self.args[0].strip().lower(), "HOST", HOST_EXAMPLE)
        self.client.call("DELETE", f"/import-credentials/{host}")
        self.out(f"Deleted your token for {host}.")


IMPORT_CREDENTIAL = Group(
    "labfleet import-credential",
    "Manage your tokens for the hosts imports clone private repositories from.",
    {"set": CredentialSet, "list": CredentialList, "delete": CredentialDelete},
)
