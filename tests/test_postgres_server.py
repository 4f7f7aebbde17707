"""The throwaway PostgreSQL server of tests/postgres_server.py works (SQLAlchemy + psycopg 3)."""

import pytest
from sqlalchemy import create_engine, inspect, text

from tests.postgres_server import fresh_database, postgres_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.postgres


def test_postgres_server_accepts_sqlalchemy(postgres_url):  # noqa: F811
    assert postgres_url.startswith("postgresql+psycopg://postgres@127.0.0.1:")
    assert postgres_url.endswith("/labfleet_test")
    engine = create_engine(postgres_url)
    try:
        with engine.begin() as conn:
            version = conn.execute(text("select version()")).scalar_one()
            assert version.startswith("PostgreSQL ")
            assert conn.execute(text("show listen_addresses")).scalar_one() == "127.0.0.1"
            conn.execute(text("create table fixture_probe (id serial primary key, name text not null)"))
            conn.execute(text("insert into fixture_probe (name) values ('a'), ('b')"))
            assert conn.execute(text("select count(*) from fixture_probe")).scalar_one() == 2
            conn.execute(text("drop table fixture_probe"))
        assert "fixture_probe" not in inspect(engine).get_table_names()
    finally:
        engine.dispose()


def test_fresh_database_is_empty(postgres_url):  # noqa: F811
    url = fresh_database(postgres_url, "labfleet_fresh_probe")
    assert url.endswith("/labfleet_fresh_probe")
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("create table t (x int)"))
        assert inspect(engine).get_table_names() == ["t"]
        engine.dispose()  # the next call drops the database WITH (FORCE): pooled connections would die
        # a second call gives an empty database again
        fresh_database(postgres_url, "labfleet_fresh_probe")
        assert inspect(engine).get_table_names() == []
    finally:
        engine.dispose()
