"""Password hashing: PBKDF2-HMAC-SHA256 with a random salt and >= 600,000 rounds.

Stored as ``pbkdf2_sha256$ROUNDS$SALT_B64$HASH_B64`` so rounds can be raised later
without invalidating existing hashes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

ALGORITHM = "pbkdf2_sha256"
ROUNDS = 600_000
MIN_ROUNDS = 600_000
MIN_LENGTH = 8
MAX_LENGTH = 1024


def check_password_strength(password: str) -> str | None:
    """A message saying what is wrong with a new password, or None if it is acceptable."""
    if not isinstance(password, str):
        return "password must be a string"
    if len(password) < MIN_LENGTH:
        return f"password must be at least {MIN_LENGTH} characters"
    if len(password) > MAX_LENGTH:
        return f"password must be at most {MAX_LENGTH} characters"
    return None


def hash_password(password: str, rounds: int = ROUNDS) -> str:
    if rounds < MIN_ROUNDS:
        raise ValueError(f"at least {MIN_ROUNDS} rounds")
    salt = secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, rounds)
    b64 = base64.b64encode
    return f"{ALGORITHM}${rounds}${b64(salt).decode()}${b64(digest).decode()}"


def verify_password(password: str, stored: str | None) -> bool:
    if not stored or not isinstance(password, str) or len(password) > MAX_LENGTH:
        return False
    try:
        algorithm, rounds_s, salt_b64, digest_b64 = stored.split("$")
        rounds = int(rounds_s)
        salt = base64.b64decode(salt_b64)
        expected = base64.b64decode(digest_b64)
    except ValueError:
        return False
    if algorithm != ALGORITHM or rounds < MIN_ROUNDS:
        return False
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, rounds)
    return hmac.compare_digest(digest, expected)
