"""The agent's part of Save as environment (:mod:`labfleet.compute.envremote`): the commits the
service hands over in its heartbeat's answer, each run once in a thread of its own on this node's
Docker engine with the service's code (:func:`labfleet.compute.envcommit.commit_session`), pushed to
the fleet's registry when the order says where, and reported in every heartbeat (the log so far, and
once done the image or why it failed) until the answer no longer hands it over: the service took it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from labfleet.compute import envbuild, envcommit
from labfleet.compute.envremote import MAX_ERROR, MAX_LINE, MAX_LOG_LINES, MAX_REPORTS, MAX_TEXT
from labfleet.compute.recipes import APT_FILE, PIP_FILE
from labfleet.storage.vfolders import UUID_RE


def _clean(text: str, most: int = MAX_LINE) -> str:
    """A line as the service takes it (one line, no NUL, cut to ``most`` characters): a session's
    words in it must not make the whole heartbeat refused."""
    return text.replace("\x00", "").replace("\n", " ")[:most]


def _recorded(text: str) -> str:
    """A recorded file as the service takes it: whole lines, at most MAX_TEXT characters."""
    if len(text) <= MAX_TEXT:
        return text
    return text[: text.rfind("\n", 0, MAX_TEXT) + 1]


class Commit:
    """One commit the service handed over: its thread's log and outcome."""

    def __init__(self, order: dict[str, Any]) -> None:
        self.order = order
        self.lines: list[str] = []
        self.result: dict[str, Any] | None = None
        self.lock = threading.Lock()

    def log(self, line: str) -> None:
        with self.lock:
            if len(self.lines) < MAX_LOG_LINES - 1:
                self.lines.append(_clean(line))
            elif len(self.lines) == MAX_LOG_LINES - 1:
                self.lines.append("labfleet: the rest of this log is left out")

    def finish(self, result: dict[str, Any]) -> None:
        with self.lock:
            self.result = result

    def report(self) -> dict[str, Any]:
        with self.lock:
            out: dict[str, Any] = {"environment": self.order["environment"], "log": list(self.lines)}
            out.update(self.result or {"done": False})
            return out


def order_of(value: Any) -> dict[str, Any] | None:
    """One handed-over commit of the answer, or None when it is not one."""
    if not isinstance(value, dict):
        return None
    env, session = value.get("environment"), value.get("session")
    tag, base, push = value.get("tag"), value.get("base"), value.get("push")
    if not (
        isinstance(env, str) and UUID_RE.match(env) and isinstance(session, str) and UUID_RE.match(session)
    ):
        return None
    if not (isinstance(tag, str) and isinstance(base, str) and (push is None or isinstance(push, str))):
        return None
    return {"environment": env, "session": session, "tag": tag, "base": base, "push": push}


class Commits:
    """The commits handed to this agent (see the module's notes)."""

    def __init__(self, client_factory: Callable[[], Any], log: Any) -> None:
        self.client_factory = client_factory
        self.log = log
        self.handed: dict[str, Commit] = {}

    def apply(self, handed: Any) -> None:
        """The answer's ``commits``: start the new ones; forget those no longer handed over."""
        orders = [o for o in (order_of(v) for v in (handed if isinstance(handed, list) else [])) if o]
        wanted = {o["environment"] for o in orders}
        self.handed = {k: c for k, c in self.handed.items() if k in wanted}
        for order in orders:
            if order["environment"] in self.handed:
                continue
            commit = self.handed[order["environment"]] = Commit(order)
            self.log.info("Committing session %s as %s", order["session"], order["push"] or order["tag"])
            threading.Thread(
                target=self.run, args=(commit,), name=f"commit {order['environment']}", daemon=True
            ).start()

    def reports(self) -> list[dict[str, Any]]:
        """What the next heartbeat says: those done first, MAX_REPORTS at most (the rest next time)."""
        reports = sorted((c.report() for c in self.handed.values()), key=lambda r: not r["done"])
        return reports[:MAX_REPORTS]

    def run(self, commit: Commit) -> None:
        order = commit.order
        try:
            client = self.client_factory()
            try:
                done = envcommit.commit_session(
                    client, order["session"], tag=order["tag"], base=order["base"], log=commit.log
                )
                size = max(0, done.size - envbuild.image_size(client, order["base"]))
                if order["push"]:
                    envbuild.tag_image(client, done.image_id, order["push"])
                    envbuild.push_image(client, order["push"], log=commit.log)
            finally:
                client.close()
        except envbuild.BuildFailed as e:
            commit.finish({"done": True, "error": _clean(e.message, MAX_ERROR)})
        except Exception as e:  # noqa: BLE001 (the engine refused, or broke off: the service is told)
            self.log.warning("The commit of session %s failed: %s", order["session"], e, exc_info=True)
            commit.finish({"done": True, "error": _clean(f"{type(e).__name__}: {e}", MAX_ERROR)})
        else:
            commit.finish(
                {
                    "done": True,
                    "image_id": done.image_id,
                    "size": size,
                    "requirements": _recorded(done.recorded.get(PIP_FILE, "")),
                    "apt": _recorded(done.recorded.get(APT_FILE, "")),
                }
            )
