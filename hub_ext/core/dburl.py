"""Where labfleet's DB is, as a URL: string work only, no SQLAlchemy (the Hub process reads it too)."""

from __future__ import annotations

import os
from pathlib import Path

DB_URL_ENV = "LABFLEET_DB_URL"
DEFAULT_DB_FILE = "labfleet.sqlite"


def default_db_url() -> str:
    """``$LABFLEET_DB_URL``, else a SQLite file in the working directory."""
    return os.environ.get(DB_URL_ENV) or f"sqlite:///{Path.cwd() / DEFAULT_DB_FILE}"


def normalize_url(url: str) -> str:
    # "postgresql://" alone would pick psycopg2, which we do not depend on.
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url
