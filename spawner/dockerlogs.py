"""A Docker object's output followed into the session's log file, for the docker and swarm backends.

The follower runs in a daemon thread with a Docker client of its own (a followed stream holds its
connection for the session's life); the spawner's ``_lf_log_done`` future resolves when the stream
ends. The swarm backend may cut a stream that outlives its service (``_lf_log_cut`` set, then the
client in ``_lf_log_stream_client`` closed): that ending is not logged as a failure.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable
from typing import Any

import docker
from docker.utils import kwargs_from_env


def log_client(spawner: Any) -> docker.APIClient:
    """A client of its own, configured as the spawner's (TLS, client_kwargs, the environment)."""
    kwargs: dict[str, Any] = {"version": "auto"}
    if spawner.tls_config:
        kwargs["tls"] = docker.tls.TLSConfig(**spawner.tls_config)
    kwargs.update(kwargs_from_env())
    kwargs.update(spawner.client_kwargs)
    return docker.APIClient(**kwargs)


def follow_logs(
    spawner: Any, what: str, object_id: str, open_stream: Callable[[docker.APIClient], Iterable[bytes]]
) -> None:
    """Append what ``open_stream(client)`` yields to ``spawner.session_log_path``, in a daemon thread;
    nothing when there is no log file, no object, or a follower still running. ``what`` names the
    object in the log (container, service)."""
    path = spawner.session_log_path
    if path is None or not object_id:
        return
    if spawner._lf_log_done is not None and not spawner._lf_log_done.done():
        return
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()
    spawner._lf_log_done = done
    spawner._lf_log_cut = False
    log = spawner.log

    def finished() -> None:
        if not done.done():
            done.set_result(None)

    def follow() -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            client = log_client(spawner)
            spawner._lf_log_stream_client = client
            try:
                with open(path, "ab", buffering=0) as f:
                    for chunk in open_stream(client):
                        f.write(chunk)
            finally:
                client.close()
        except docker.errors.NotFound:
            pass  # removed before we got to it
        except Exception:
            if not done.done() and not spawner._lf_log_cut:
                log.exception("labfleet: following the logs of %s %s failed", what, object_id[:12])
        finally:
            try:
                loop.call_soon_threadsafe(finished)
            except RuntimeError:
                pass  # the Hub's loop is closed: it is shutting down

    threading.Thread(target=follow, name=f"labfleet-logs-{object_id[:12]}", daemon=True).start()
