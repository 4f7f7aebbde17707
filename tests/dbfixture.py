"""A fresh labfleet database for DB-level tests: the secret key, the schema, a session factory."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from labfleet.core import database, unitofwork
from labfleet.core.secretbox import ensure_key_file


def fresh_db(
    url: str, tmp_path: Any, monkeypatch: Any, **engine_kwargs: Any
) -> tuple[Engine, sessionmaker[Session]]:
    """An upgraded database at ``url`` (empty before), with the service's secret key in ``tmp_path``."""
    monkeypatch.setenv("LABFLEET_SECRET_KEY_FILE", str(tmp_path / "key"))
    ensure_key_file(tmp_path / "key")
    engine = database.make_engine(url, **engine_kwargs)
    database.upgrade(engine)
    return engine, unitofwork.make_session_factory(engine)
