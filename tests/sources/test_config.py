"""Building sources from config: URLs, `${VAR}`s, options, and the errors that name the fix."""

from __future__ import annotations

import asyncio
import sqlite3
import traceback
import uuid
from pathlib import Path
from typing import Any

import duckdb
import pytest

from kairos.errors import KairosError
from kairos.sources import Source, SourceError, source_from_config
from tests.sources.conftest import Backend

Fetched = tuple[list[str], list[tuple[Any, ...]]]


def _run(source: Source, sql: str, params: list[Any] | None = None) -> Fetched:
    async def main() -> Fetched:
        try:
            return await source.fetch(sql, params or [])
        finally:
            await source.close()

    return asyncio.run(main())


def _failure(source: Source, sql: str) -> SourceError:
    with pytest.raises(SourceError) as raised:
        _run(source, sql)
    return raised.value


def test_url_from_an_environment_variable(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = backend.config()
    url = config if isinstance(config, str) else config["url"]
    monkeypatch.setenv("KAIROS_TEST_SOURCE_URL", url)
    templated = (
        "${KAIROS_TEST_SOURCE_URL}"
        if isinstance(config, str)
        else {**config, "url": "${KAIROS_TEST_SOURCE_URL}"}
    )

    source = source_from_config("bank", templated, backend.base_dir)

    assert _run(source, "select count(*) as n from users") == (["n"], [(1000,)])


def test_missing_variable_is_named(tmp_path: Path) -> None:
    with pytest.raises(KairosError) as raised:
        source_from_config("bank", "postgresql://app:${KAIROS_NOT_SET}@db/bank", tmp_path)

    assert "source 'bank'" in str(raised.value)
    assert "'KAIROS_NOT_SET' is not set" in str(raised.value)


@pytest.mark.usefixtures("postgres_schema")  # skips where PostgreSQL is not running
@pytest.mark.parametrize(
    ("password", "database"),
    [
        # ids of their own: a random name in the id differs between test workers
        pytest.param(
            "hunter2-s3cret", f"kairos_no_such_db_{uuid.uuid4().hex[:8]}", id="no-such-database"
        ),
        # libpq quotes a malformed percent-escape back
        pytest.param("hunter2%zz", "test", id="malformed-escape"),
    ],
)
def test_postgres_password_never_shown(
    password: str, database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAIROS_TEST_PG_PASSWORD", password)
    config = f"postgresql://postgres:${{KAIROS_TEST_PG_PASSWORD}}@127.0.0.1:5432/{database}"

    source = source_from_config("bank", config, tmp_path)
    error = _failure(source, "select 1")

    shown = "".join(traceback.format_exception(error))
    assert repr(source) == (
        f"PostgresSource(name='bank', url='postgresql://postgres:***@127.0.0.1:5432/{database}')"
    )
    assert "source 'bank' (postgres) cannot connect to 'postgresql://postgres:***@" in str(error)
    assert "hunter2" not in shown
    assert "hunter2" not in repr(source)


@pytest.mark.usefixtures("postgres_schema")
def test_postgres_error_names_a_missing_database(tmp_path: Path) -> None:
    source = source_from_config("bank", "postgres://postgres@127.0.0.1/kairos_nope", tmp_path)

    error = _failure(source, "select 1")

    assert 'database "kairos_nope" does not exist' in str(error)


def test_building_a_source_does_no_io(tmp_path: Path) -> None:
    configs = [
        "postgresql://app:pw@127.0.0.1:1/nowhere",  # nothing listens on port 1
        "sqlite:///missing.db",
        "duckdb:///missing.duckdb",
        "duckdb:///missing.parquet",
    ]
    for config in configs:
        source = source_from_config("bank", config, tmp_path)
        asyncio.run(source.close())

    assert list(tmp_path.iterdir()) == []


def test_unknown_scheme_names_source_scheme_and_supported(tmp_path: Path) -> None:
    with pytest.raises(KairosError) as raised:
        source_from_config("bank", "mysql://root:hunter2@db/bank", tmp_path)

    assert str(raised.value) == (
        "source 'bank': unknown URL scheme 'mysql' in 'mysql://root:***@db/bank'; supported: "
        "sqlite://, duckdb://, postgresql://, postgres://"
    )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            "sqlite:///bank.db?pool_mx=2",
            "unknown option 'pool_mx' in 'sqlite:///bank.db?pool_mx=2'; did you mean 'pool_max'?",
        ),
        ("sqlite:///bank.db?pool_max=0", "option pool_max='0' must be a whole number >= 1"),
        ("duckdb:///bank.duckdb?read_only=maybe", "option read_only='maybe' must be true or false"),
        ("sqlite://bank.db", "'sqlite://bank.db' names no file; write sqlite:///relative/path"),
        ("sqlite:///:memory:", "an in-memory SQLite database is empty"),
        ("duckdb:///my-users.parquet", "the view would be named 'my-users'"),
        (
            {"url": "duckdb:///:memory:", "tables": {"1st": "a.parquet"}},
            "table name '1st' is not an identifier",
        ),
        (
            {"url": "duckdb:///:memory:", "tables": {"x": "a.xlsx"}},
            "reads 'a.xlsx', which is not a",
        ),
        (
            {"url": "duckdb:///bank.duckdb", "tables": {"x": "a.csv"}},
            "tables: needs url: duckdb:///:memory:",
        ),
        (
            {"url": "sqlite:///bank.db", "tables": {"x": "a.csv"}},
            "tables: is for duckdb:///:memory: sources",
        ),
        ({"uri": "sqlite:///bank.db"}, "unknown key 'uri'; did you mean 'url'?"),
        ({"tables": {"x": 3}}, "table 'x' needs a file path, got 3"),
        ("postgresql://db/bank?pool_max=many", "option pool_max='many' must be a whole number"),
    ],
)
def test_config_errors_name_the_fix(
    config: str | dict[str, Any], message: str, tmp_path: Path
) -> None:
    with pytest.raises(KairosError) as raised:
        source_from_config("bank", config, tmp_path)

    assert str(raised.value).startswith("source 'bank'")
    assert message in str(raised.value)


def test_sqlite_missing_file_is_an_error_not_a_new_file(tmp_path: Path) -> None:
    source = source_from_config("bank", "sqlite:///missing.db", tmp_path)

    error = _failure(source, "select 1")

    assert f"source 'bank' (sqlite) cannot open {str(tmp_path / 'missing.db')!r}" in str(error)
    assert not (tmp_path / "missing.db").exists()


def test_sqlite_values_come_back_as_stored(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "events.db") as connection:
        connection.execute("create table events (id integer, at timestamp, amount real)")
        connection.execute("insert into events values (1, '2026-01-10 12:00:00', 2.5)")
    connection.close()
    source = source_from_config("events", "sqlite:///events.db?read_only=true", tmp_path)

    assert _run(source, "select id, at, amount from events where id = ?", [1]) == (
        ["id", "at", "amount"],
        [(1, "2026-01-10 12:00:00", 2.5)],
    )


def test_duckdb_file_is_read_only_unless_asked(tmp_path: Path) -> None:
    duckdb.connect(str(tmp_path / "bank.duckdb")).close()
    write = "create table audit as select 1 as x"

    refused = _failure(source_from_config("bank", "duckdb:///bank.duckdb", tmp_path), write)
    writable = source_from_config("bank", "duckdb:///bank.duckdb?read_only=false", tmp_path)
    _run(writable, write)

    assert "read-only" in str(refused)
    with duckdb.connect(str(tmp_path / "bank.duckdb"), read_only=True) as database:
        assert database.execute("select x from audit").fetchall() == [(1,)]


def test_duckdb_tables_paths_may_hold_quotes_and_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "it's here"
    folder.mkdir()
    with duckdb.connect(":memory:") as database:
        database.execute("create table t as select 7 as x")
        target = str(folder / "t.csv").replace("'", "''")
        database.execute(f"copy t to '{target}' (header)")
    monkeypatch.setenv("KAIROS_TEST_FOLDER", "it's here")
    config = {"tables": {"t": "${KAIROS_TEST_FOLDER}/t.csv"}}

    source = source_from_config("lake", config, tmp_path)

    assert _run(source, "select x from t") == (["x"], [(7,)])
