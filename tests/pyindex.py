"""A PEP 503 package index written by hand, for the tests of environment builds ("My Environments"):
pure-Python wheels of one module each (``<name with _>.VALUE``) and the "simple" pages that list
them, in a folder any HTTP server can serve. Builds then never need the public index."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Mapping
from pathlib import Path


def module_name(name: str) -> str:
    return name.replace("-", "_")


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def make_wheel(folder: Path, name: str, version: str, value: str) -> Path:
    """A pure-Python wheel of one module, ``<name with _>.VALUE = value``, written by hand."""
    dist = module_name(name)
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{dist}.py": f"VALUE = {value!r}\n".encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: labfleet-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(
        f"{path},sha256={_b64(hashlib.sha256(data).digest())},{len(data)}\n" for path, data in files.items()
    )
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for member, data in files.items():
            z.writestr(member, data)
    return path


def write_index(root: Path, packages: Mapping[str, tuple[str, str]]) -> None:
    """``root/simple/...`` and ``root/files/...`` for ``packages``: name -> (version, VALUE)."""
    (root / "files").mkdir(parents=True, exist_ok=True)
    for name, (version, value) in packages.items():
        wheel = make_wheel(root / "files", name, version, value)
        page = root / "simple" / name
        page.mkdir(parents=True, exist_ok=True)
        sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
        (page / "index.html").write_text(
            f'<!DOCTYPE html><html><body><a href="../../files/{wheel.name}#sha256={sha}">{wheel.name}</a>'
            "</body></html>\n"
        )
    links = "".join(f'<a href="{name}/">{name}</a>' for name in packages)
    (root / "simple" / "index.html").write_text(f"<!DOCTYPE html><html><body>{links}</body></html>\n")
