"""The fleet's image registry over its HTTP API (Docker Registry v2 / OCI distribution): taking an
environment's image out of it once no environment has it.

A Docker engine pushes and pulls; only the registry's own API deletes. Deleting removes the image's
manifest (``DELETE /v2/<repository>/manifests/<digest>``, which the registry must allow: Debian's
``docker-registry`` with ``storage.delete.enabled``, as scripts/registry.sh sets it); the layers no
manifest uses any more are freed by the registry's garbage collection (``registry garbage-collect``,
the registry's operator's job). The registry is trusted as the engines trust it: HTTPS with the CA in
``/etc/docker/certs.d/<host:port>/ca.crt`` when that file is there, else the system's CAs. Blocking:
call it in a thread.
"""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from email.message import Message
from pathlib import Path

DOCKER_CERTS = Path("/etc/docker/certs.d")
# What a HEAD of a manifest accepts, so that the digest is the one the push stored.
MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
    )
)


def split_ref(ref: str) -> tuple[str, str, str]:
    """``host:port/repository:tag`` -> (host:port, repository, tag); ValueError for anything else."""
    host, _, rest = ref.partition("/")
    repository, _, tag = rest.rpartition(":")
    if not (host and repository and tag) or "/" in tag or "@" in ref:
        raise ValueError(f"{ref!r} is not registry/repository:tag")
    return host, repository, tag


def _context(host: str, certs: Path) -> ssl.SSLContext:
    ca = certs / host / "ca.crt"
    return ssl.create_default_context(cafile=str(ca) if ca.is_file() else None)


def _call(method: str, url: str, context: ssl.SSLContext, timeout: float) -> tuple[int, Message]:
    request = urllib.request.Request(url, method=method, headers={"Accept": MANIFEST_TYPES})
    try:
        with urllib.request.urlopen(request, context=context, timeout=timeout) as answer:
            return answer.status, answer.headers
    except urllib.error.HTTPError as e:
        return e.code, e.headers


def delete_image(ref: str, *, certs: Path = DOCKER_CERTS, timeout: float = 30) -> bool:
    """Delete the image ``ref`` (``registry/repository:tag``) from its registry: True; False when the
    registry has no such image. OSError (unreachable, refused: the message says the status) else."""
    host, repository, tag = split_ref(ref)
    context = _context(host, certs)
    base = f"https://{host}/v2/{repository}/manifests"
    status, headers = _call("HEAD", f"{base}/{tag}", context, timeout)
    if status == 404:
        return False
    digest = headers.get("Docker-Content-Digest")
    if status != 200 or not digest:
        raise OSError(f"the registry answered {status} for {ref} (no digest)")
    status, _ = _call("DELETE", f"{base}/{digest}", context, timeout)
    if status == 404:
        return False
    if status != 202:
        raise OSError(f"the registry refused to delete {ref}: {status} (is delete enabled?)")
    return True
