"""The ``labfleet`` command: its commands, and ``main()``, which reports every error as one line."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from labfleet.cli.base import CliError, Group, dispatch
from labfleet.cli.compute import IMAGE
from labfleet.cli.environments import ENV
from labfleet.cli.imports import IMPORT_CREDENTIAL, Import
from labfleet.cli.init import Demo, Init
from labfleet.cli.keypairs import KEYPAIR
from labfleet.cli.maintenance import MAINTENANCE
from labfleet.cli.nodes import NODE, Agent
from labfleet.cli.output import one_line
from labfleet.cli.policies import POLICY
from labfleet.cli.reclaim import IDLE_CHECKER
from labfleet.cli.storage import STORAGE_HOST
from labfleet.cli.tenancy import DOMAIN, PROJECT, USER
from labfleet.core.errors import LabfleetError


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version("labfleet")
    except PackageNotFoundError:  # running from a source checkout
        return "0.1.0"


def root() -> Group:
    return Group(
        "labfleet",
        """Set up and manage labfleet, the multi-tenant GPU platform on JupyterHub: domains,
        projects, users, resource policies and keypairs. Every command goes through the same
        checks as the REST API and records its change in the audit log.""",
        {
            "init": Init,
            "domain": DOMAIN,
            "project": PROJECT,
            "user": USER,
            "policy": POLICY,
            "keypair": KEYPAIR,
            "image": IMAGE,
            "node": NODE,
            "agent": Agent,
            "storage-host": STORAGE_HOST,
            "import": Import,
            "import-credential": IMPORT_CREDENTIAL,
            "env": ENV,
            "idle-checker": IDLE_CHECKER,
            "maintenance": MAINTENANCE,
            "demo": Demo,
        },
        examples=(
            "labfleet init",
            "labfleet demo",
            "labfleet domain create acme --slots cpu=64,mem=256g,gpu=4",
            "labfleet project create acme/vision --slots gpu.shares=2.5",
            "labfleet user create alice --domain acme --project acme/vision",
            "labfleet keypair issue alice",
            "labfleet node token create --node gpu-02",
            "labfleet maintenance recalc-usage --dry-run",
            "labfleet import https://github.com/acme/course.git --open lesson1.ipynb",
            "labfleet env build torch --base labfleet/singleuser:test --from-dir ./binder --wait",
            "labfleet --db-url sqlite:////srv/labfleet/labfleet.sqlite domain list",
        ),
        version=version,
    )


def _fail(message: str, code: int) -> None:
    print(f"labfleet: error: {one_line(message)}", file=sys.stderr)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``labfleet`` with ``argv`` (default: the process's arguments)."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        dispatch(root(), args)
    except CliError as e:
        _fail(e.message, e.code)
    except LabfleetError as e:
        # 400: the input is wrong (usage); 403/404/409: the operation was refused.
        _fail(e.message, 2 if e.status == 400 else 1)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except BrokenPipeError:
        # The reader went away (`labfleet user list | head`): stop quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except Exception as e:
        # Only modules already loaded can have raised their errors: no import needed to check.
        box, sa_exc = sys.modules.get("labfleet.core.secretbox"), sys.modules.get("sqlalchemy.exc")
        if box is not None and isinstance(e, box.SecretKeyMissing):
            _fail(str(e), 1)
        if debug:
            raise
        if sa_exc is not None and isinstance(e, sa_exc.SQLAlchemyError):
            cause = getattr(e, "orig", None) or e
            first = str(cause).splitlines()[0] if str(cause) else ""
            _fail(f"database error: {type(cause).__name__}: {first}", 1)
        _fail(f"unexpected {type(e).__name__}: {e} (run again with --debug for the traceback)", 1)
