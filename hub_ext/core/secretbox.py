"""Encryption of keypair secrets at rest.

A keypair's secret must be known to the service to check HMAC signatures, yet must
not be readable from the database.  So it is stored encrypted (Fernet: AES-128-CBC +
HMAC-SHA256) with a key that lives outside the database: ``$LABFLEET_SECRET_KEY``,
or a key file (default ``labfleet_secret.key`` in the working directory, mode 0600,
created by ``labfleet init`` like JupyterHub's cookie secret).
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

KEY_ENV = "LABFLEET_SECRET_KEY"
KEY_FILE_ENV = "LABFLEET_SECRET_KEY_FILE"
DEFAULT_KEY_FILE = "labfleet_secret.key"


class SecretKeyMissing(RuntimeError):
    pass


def key_file_path() -> Path:
    return Path(os.environ.get(KEY_FILE_ENV) or DEFAULT_KEY_FILE).absolute()


def ensure_key_file(path: Path | None = None) -> Path:
    """Create the key file (0600) if neither it nor $LABFLEET_SECRET_KEY exists."""
    path = path or key_file_path()
    if os.environ.get(KEY_ENV) or path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(Fernet.generate_key())
    return path


def load_key() -> bytes:
    env = os.environ.get(KEY_ENV)
    if env:
        return env.strip().encode()
    path = key_file_path()
    if not path.exists():
        raise SecretKeyMissing(
            f"no secret key: set {KEY_ENV} or create {path} with `labfleet init` (it must be the same "
            "file for the CLI and the labfleet service)"
        )
    return path.read_bytes().strip()


class SecretBox:
    def __init__(self, key: bytes | None = None) -> None:
        self._fernet = Fernet(key or load_key())

    def seal(self, plaintext: str) -> str:
        return self._fernet.encrypt(plaintext.encode()).decode()

    def open(self, token: str) -> str:
        try:
            return self._fernet.decrypt(token.encode()).decode()
        except InvalidToken:
            raise SecretKeyMissing(
                "a keypair secret cannot be decrypted: wrong LABFLEET_SECRET_KEY?"
            ) from None
