"""``labfleet env``: My Environments from the command line.

An environment is a user's or a project's own image, a registered base plus a recipe
(:mod:`labfleet.compute.environments`), built by the service's build queue. ``labfleet env build``
sends the recipe's files, read here (``POST /api/environments``), and with ``--wait`` prints the build
log as it grows until the build is READY or FAILED; ``list``, ``delete`` and ``logs`` are the rest of
the API. NAME_OR_ID is looked up by name in ``GET /api/environments`` unless it is an id.

They call the service as a user (:mod:`labfleet.cli.client`): a keypair or a Hub token from the
environment.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from labfleet.cli.base import JSON_OPTION, CliError, Group, Option, UsageError, flag
from labfleet.cli.client import ApiCommand, RateLimited, ServiceClient, ServiceUnreachable, path_part
from labfleet.cli.imports import POLL_RETRIES
from labfleet.cli.output import format_table, json_text, one_line
from labfleet.core.display import fmt_bytes
from labfleet.core.vocab import BUILD_PENDING_STATUSES, ENVIRONMENT_STATUSES

POLL_SECONDS = 1.0  # two requests a poll (the status, the log): far below a keypair's rate limit
_, _, READY, _ = ENVIRONMENT_STATUSES
# The recipe's files: the option that names each, and the name the service knows it by.
RECIPE_OPTIONS = (
    ("requirements", "requirements.txt"),
    ("apt", "apt.txt"),
    ("postbuild", "postBuild"),
    ("environment_yml", "environment.yml"),
)
RECIPE_FILE_NAMES = ", ".join(name for _, name in RECIPE_OPTIONS)

# A new environment's owner (build, save).
OWNER_OPTION = Option(
    "--project",
    "A project of yours (DOMAIN/PROJECT or its name) to own the environment; default: it is yours.",
    metavar="PROJECT",
)
PROJECT_OPTION = Option(
    "--project",
    """The project the environment belongs to, DOMAIN/PROJECT or the name of a project of yours
    (to tell apart environments of the same name).""",
    metavar="PROJECT",
)


def is_id(value: str) -> bool:
    """Is ``value`` an environment's id (a UUID as the service writes it) rather than a name?"""
    try:
        return str(uuid.UUID(value)) == value.lower()
    except ValueError:
        return False


def in_project(env: dict[str, Any], project: str) -> bool:
    full = env.get("project") or ""
    return bool(full) and (full == project or full.split("/", 1)[-1] == project)


def read_recipe_file(path: Path, option: str) -> str:
    """The text of a recipe file named on the command line; a usage error says what is wrong with it."""
    from labfleet.compute.recipes import MAX_RECIPE_BYTES

    try:
        with path.open("rb") as f:
            raw = f.read(MAX_RECIPE_BYTES + 1)  # a bigger one is refused: never read a huge file whole
    except OSError as e:
        raise UsageError(f"{option}: cannot read {path}: {e.strerror or e}") from None
    if len(raw) > MAX_RECIPE_BYTES:
        raise UsageError(
            f"{option}: {path} is over {MAX_RECIPE_BYTES} bytes, the most a whole recipe may hold "
            "(keep large files in a folder and fetch them from postBuild)"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{option}: {path} is not UTF-8 text") from None


class _LogClient(ServiceClient):
    """The service's client for the one answer that is text, not JSON: a build log."""

    def _json(self, raw: bytes, status: int) -> bytes:  # the answer as it came (call() reads JSON)
        return raw


class EnvCommand(ApiCommand):
    """What the ``labfleet env`` commands share: finding an environment, reading and following its log."""

    misses = 0  # polls in a row with no answer from the service, while following a build

    def items(self) -> list[dict[str, Any]]:
        data = self.client.call("GET", "/environments").data
        return data.get("items", []) if isinstance(data, dict) else []

    def env_path(self, env_id: str) -> str:
        return "/environments/" + path_part(
            env_id, "the environment's id", "an id that `env list --json` shows"
        )

    def find(self, name_or_id: str) -> dict[str, Any]:
        """The environment NAME_OR_ID names: by id, or the one of that name the caller sees (in
        ``--project`` when given); unknown or ambiguous is an error that says what to give instead."""
        value = name_or_id.strip()
        if not value:
            raise UsageError("NAME_OR_ID is empty")
        if is_id(value):
            return self.client.call("GET", self.env_path(value)).data
        project = (self.opts.project or "").strip()
        found = [e for e in self.items() if e["name"] == value and (not project or in_project(e, project))]
        if not found:
            where = f" in project {project}" if project else ""
            raise CliError(
                f"no environment {value!r}{where} that you can see (`labfleet env list` shows them)"
            )
        if len(found) > 1:
            which = "; ".join(f"{e['id']} ({e['owner']})" for e in found)
            raise CliError(
                f"{len(found)} environments are named {value!r}: {which}; give the id, or --project"
            )
        return found[0]

    def poll(self, method: Callable[[], Any]) -> Any:
        """``method()`` while following a build: no answer is retried (POLL_RETRIES in a row), a rate
        limit waited out; None when it is to be asked again."""
        try:
            answer = method()
        except ServiceUnreachable:
            self.misses += 1
            if self.misses >= POLL_RETRIES:
                raise
            return None
        except RateLimited as e:  # the keypair's window is spent: wait for the next one
            self.out(f"(rate limited: asking again in {e.retry_after:.0f} s)")
            time.sleep(e.retry_after)
            return None
        self.misses = 0
        return answer

    def log_bytes(self, env_id: str) -> bytes:
        """The build's log as far as it got (empty before the build starts)."""
        reader = _LogClient(self.client.base_url, self.client.credentials, self.client.timeout)
        data = reader.call("GET", self.env_path(env_id) + "/logs").data
        return data if isinstance(data, bytes) else b""

    def follow(self, env: dict[str, Any]) -> dict[str, Any]:
        """Print the build's log as it grows until the build is READY or FAILED; the environment then."""
        env_id, shown = env["id"], 0
        try:
            while True:
                # The status is read before the log: a finished build's log then holds its end.
                finished = env["status"] not in BUILD_PENDING_STATUSES
                log = self.poll(lambda: self.log_bytes(env_id))
                if log is not None:
                    if len(log) < shown:  # the build started again (the service restarted): a new log
                        shown = 0
                    # Whole lines only while it runs: the last one may be half written.
                    end = len(log) if finished else log.rfind(b"\n", shown) + 1
                    if end > shown:
                        sys.stdout.write(log[shown:end].decode("utf-8", "replace"))
                        sys.stdout.flush()
                        shown = end
                    if finished:
                        if shown and not log.endswith(b"\n"):
                            self.out()
                        return env
                time.sleep(POLL_SECONDS)
                env = self.poll(lambda: self.client.call("GET", self.env_path(env_id)).data) or env
        except KeyboardInterrupt:
            raise CliError(
                f"interrupted: the build of environment {env['name']} goes on in the service", 130
            ) from None

    def create(self, body: dict[str, Any]) -> None:
        """POST ``body``; say what the service answered, and with --wait follow the build to its end."""
        env = self.client.call("POST", "/environments", body).data
        if not isinstance(env, dict) or not isinstance(env.get("id"), str):
            raise ServiceUnreachable("the labfleet service answered the build without an id")
        self.out(f"Environment {env['name']} (id {env['id']}): {env['status']}.")
        if not self.opts.wait:
            if env["status"] in BUILD_PENDING_STATUSES:
                self.out(
                    f"The service builds it; `labfleet env logs {env['id']} --follow` follows the build."
                )
            elif env.get("status_reason"):
                self.out(one_line(env["status_reason"]))
            return
        self.outcome(self.follow(env))

    def outcome(self, env: dict[str, Any]) -> None:
        """Say how the build ended; FAILED is an error (exit 1) with the service's reason."""
        reason = one_line(env.get("status_reason") or "")
        if env["status"] != READY:
            raise CliError(f"the build of environment {env['name']} failed: {reason or 'no reason given'}")
        size = env.get("size_bytes")
        self.out(
            f"READY: environment {env['name']} is image {env.get('image')}"
            + (f" ({fmt_bytes(size)})." if size else ".")
        )


# ---------------------------------------------------------------- labfleet env build


class Build(EnvCommand):
    name = "labfleet env build"
    summary = "Build an environment of your own: a registered base image plus a recipe."
    description = f"""Build an environment (an image of your own, or your project's): a registered
    base image you may use, plus any of the recipe files {RECIPE_FILE_NAMES} (environment.yml only
    where the base has conda), read from the files you name or from a folder. The service checks the
    recipe and queues the build; a recipe built before is READY at once with its image. With --wait
    the build log is printed as it grows, and the command ends when the build does: exit 0 when it
    is READY, 1 (saying why) when it FAILED."""
    examples = (
        "labfleet env build torch --base labfleet/singleuser:test --requirements requirements.txt --wait",
        "labfleet env build course --base labfleet/singleuser:test --from-dir ./binder --project acme/ml",
    )
    arguments = ("NAME",)
    options = (
        Option("--base", "The base image: a registered image you may use (required).", metavar="IMAGE"),
        OWNER_OPTION,
        Option("--requirements", "A requirements.txt: pip packages from the package index.", metavar="FILE"),
        Option("--apt", "An apt.txt: Debian packages, one a line.", metavar="FILE"),
        Option("--postbuild", "A postBuild script, run as the image's user.", metavar="FILE"),
        Option("--environment-yml", "An environment.yml, for a base with conda.", metavar="FILE"),
        Option(
            "--from-dir",
            f"A folder: whichever of {RECIPE_FILE_NAMES} it has (a file named by its own option wins).",
            metavar="DIR",
        ),
        Option(
            "--folder",
            "A virtual folder's id: the recipe files it has (read by the service; an imported repository's).",
            metavar="ID",
        ),
        Option("--path", "With --folder: a directory in it, e.g. binder.", metavar="DIR"),
        flag("--wait", "Print the build log as it grows, until the build is READY or FAILED."),
    )

    def files(self) -> dict[str, str]:
        """The recipe's files, read before anything is sent (a file that is wrong creates nothing)."""
        paths: dict[str, tuple[Path, str]] = {}
        if self.opts.from_dir is not None:
            folder = Path(self.opts.from_dir)
            if not folder.is_dir():
                raise UsageError(f"--from-dir: {folder} is not a folder")
            paths = {
                name: (folder / name, "--from-dir") for _, name in RECIPE_OPTIONS if (folder / name).is_file()
            }
            if not paths:
                raise UsageError(f"--from-dir: {folder} has none of {RECIPE_FILE_NAMES}")
        for key, name in RECIPE_OPTIONS:
            given = getattr(self.opts, key)
            if given is not None:
                paths[name] = (Path(given), "--" + key.replace("_", "-"))
        return {name: read_recipe_file(path, option) for name, (path, option) in paths.items()}

    def body(self) -> dict[str, Any]:
        base = (self.opts.base or "").strip()
        if not base:
            raise UsageError("--base IMAGE is required: a registered image you may use in the project")
        body: dict[str, Any] = {"name": self.args[0].strip(), "base": base}
        if (self.opts.folder or "").strip():
            if any(getattr(self.opts, key) is not None for key, _ in RECIPE_OPTIONS) or self.opts.from_dir:
                raise UsageError(
                    "--folder takes the recipe from the folder: give no recipe file or --from-dir"
                )
            body["folder"] = self.opts.folder.strip()
            if self.opts.path is not None:
                body["path"] = self.opts.path
        else:
            body["files"] = self.files()
        if self.opts.project is not None:
            if not self.opts.project.strip():
                raise UsageError("--project is empty")
            body["project"] = self.opts.project.strip()
        return body

    def run(self) -> None:
        body = self.body()  # the files first: one that is wrong is said before credentials are looked for
        self.create(body)


class Save(EnvCommand):
    name = "labfleet env save"
    summary = "Save a running session of yours as an environment (Save as environment)."
    description = """Save one of your running Docker or Swarm sessions as an environment: its
    container's files become an image of yours (with its base image's settings, none of the
    session's), and what was installed in it (pip and apt packages beyond the base's) is recorded as its recipe. With --wait
    the log is printed as it grows: exit 0 when it is READY, 1 (saying why) when it FAILED."""
    examples = ("labfleet env save my-setup --session 0b6c...-... --wait",)
    arguments = ("NAME",)
    options = (
        Option("--session", "The id of the running session to save (required).", metavar="ID"),
        OWNER_OPTION,
        flag("--wait", "Print the log as it grows, until the environment is READY or FAILED."),
    )

    def run(self) -> None:
        session = (self.opts.session or "").strip()
        if not session:
            raise UsageError(
                "--session ID is required: one of your running sessions (`labfleet session list`)"
            )
        body: dict[str, Any] = {"name": self.args[0].strip(), "session": session}
        if (self.opts.project or "").strip():
            body["project"] = self.opts.project.strip()
        self.create(body)


class Promote(EnvCommand):
    name = "labfleet env promote"
    summary = "Register a READY environment's image for everyone (superadmins)."
    description = """Register a READY environment's image as an image for everyone, with its base's
    minimum resources, accelerators and apps (superadmins only). It stays on the engines while it is
    registered; `labfleet image` commands edit or remove it like any other."""
    arguments = ("NAME_OR_ID",)
    options = (
        PROJECT_OPTION,
        Option(
            "--display-name", "What the spawn form shows (default: its name, owner and base).", metavar="TEXT"
        ),
    )

    def run(self) -> None:
        env = self.find(self.args[0])
        body = (
            {"display_name": self.opts.display_name.strip()} if (self.opts.display_name or "").strip() else {}
        )
        image = self.client.call("POST", self.env_path(env["id"]) + "/image", body).data
        self.out(f"Registered image {image.get('name')} ({image.get('display_name')}) for everyone.")


# ---------------------------------------------------------------- list, delete, logs


class List(EnvCommand):
    name = "labfleet env list"
    description = "List the environments you see: yours and your projects' (an admin: the domain's)."
    options = (JSON_OPTION,)

    def run(self) -> None:
        items = self.items()
        if self.opts.json:
            self.out(json_text(items))
            return
        self.out(
            format_table(
                ["name", "owner", "status", "size", "image"],
                (
                    [
                        e["name"],
                        e["owner"],
                        e["status"],
                        fmt_bytes(e["size_bytes"]) if e.get("size_bytes") else None,
                        e.get("image"),
                    ]
                    for e in items
                ),
            )
        )


class Delete(EnvCommand):
    name = "labfleet env delete"
    summary = "Delete an environment, by name or id."
    description = """Delete an environment: yours, or one of your project's that you created (an
    admin: any in the domain). Its build stops; its image goes when no other environment has it."""
    arguments = ("NAME_OR_ID",)
    options = (PROJECT_OPTION,)

    def run(self) -> None:
        env = self.find(self.args[0])
        gone = self.client.call("DELETE", self.env_path(env["id"])).data
        self.out(f"Deleted environment {gone.get('name', env['name'])} (id {env['id']}).")


class Logs(EnvCommand):
    name = "labfleet env logs"
    summary = "Print an environment's build log (--follow: as it grows, until the build ends)."
    description = """Print an environment's build log, as far as it got (nothing before the build
    starts). With --follow, print it as it grows until the build is READY or FAILED: exit 0 when it
    is READY, 1 (saying why) when it FAILED."""
    arguments = ("NAME_OR_ID",)
    options = (PROJECT_OPTION, flag("--follow", "Print the log as it grows, until the build ends."))

    def run(self) -> None:
        env = self.find(self.args[0])
        if self.opts.follow:
            self.outcome(self.follow(env))
            return
        sys.stdout.write(self.log_bytes(env["id"]).decode("utf-8", "replace"))


ENV = Group(
    "labfleet env",
    """Build and manage your environments (My Environments): images of your own or your project's,
    each a registered base image plus a recipe (requirements.txt, apt.txt, postBuild, environment.yml).""",
    {"build": Build, "save": Save, "list": List, "delete": Delete, "logs": Logs, "promote": Promote},
)
