"""The same behaviour from every source: SQLite, DuckDB (file, Parquet, CSV, tables), Postgres."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from kairos.errors import KairosError
from kairos.sources import Source, SourceError
from tests.sources.conftest import USERS, Backend, sql

Fetched = tuple[list[str], list[tuple[Any, ...]]]

# A query that runs until interrupted, in each dialect.
ENDLESS = {
    "sqlite": "with recursive n(x) as (select 1 union all select x + 1 from n) "
    "select count(*) from n",
    "duckdb": "select sum(i) from range(1000000000000000) r(i)",
    "postgres": "select pg_sleep(60)",
}


def test_select_binds_positional_params(backend: Backend) -> None:
    async def body(source: Source) -> Fetched:
        p1, p2 = source.placeholder(1), source.placeholder(2)
        query = f"select id, name, balance from users where id = {p1} or name = {p2} order by id"
        return await source.fetch(query, ["u1", "name 2"])

    columns, rows = backend.run(body)

    assert columns == ["id", "name", "balance"]
    assert rows == [("u1", "name 1", 1.5), ("u2", "name 2", 2.5)]


@pytest.mark.parametrize(
    "evil", ["x' OR '1'='1", "1; DROP TABLE users; --", "u1' --", 'u1"; select 1; --', "%s"]
)
def test_injection_in_a_param_matches_nothing(backend: Backend, evil: str) -> None:
    async def body(source: Source) -> tuple[Fetched, Fetched, Fetched]:
        by_id = await source.fetch(sql(source, "select id from users where id = {}"), [evil])
        by_name = await source.fetch(sql(source, "select id from users where name = {}"), [evil])
        count = await source.fetch("select count(*) as n from users", [])
        return by_id, by_name, count

    by_id, by_name, count = backend.run(body)

    assert by_id == (["id"], [])
    assert by_name == (["id"], [])
    assert count == (["n"], [(len(USERS),)])  # the table is still there, and whole


def test_in_with_500_params(backend: Backend) -> None:
    keys = [f"u{i}" for i in range(0, 1000, 2)]

    async def body(source: Source) -> Fetched:
        return await source.fetch(sql(source, "select id from users where id in ({})", 500), keys)

    columns, rows = backend.run(body)

    assert columns == ["id"]
    assert sorted(row[0] for row in rows) == sorted(keys)


def test_concurrent_fetches(backend: Backend) -> None:
    async def body(source: Source) -> list[Fetched]:
        query = sql(source, "select id, balance from users where id = {}")
        return await asyncio.gather(*(source.fetch(query, [f"u{i}"]) for i in range(20)))

    results = backend.run(body)

    assert results == [(["id", "balance"], [(f"u{i}", i + 0.5)]) for i in range(20)]


def test_bad_sql_raises_source_error_naming_the_source(backend: Backend) -> None:
    async def body(source: Source) -> tuple[SourceError, Fetched]:
        with pytest.raises(SourceError) as raised:
            await source.fetch("select no_such_column from users", [])
        after = await source.fetch("select count(*) as n from users", [])
        return raised.value, after

    error, after = backend.run(body)

    assert isinstance(error, KairosError)
    assert isinstance(error, RuntimeError)
    assert error.args[0].startswith("source 'bank_")
    assert "no_such_column" in str(error)
    assert after == (["n"], [(len(USERS),)])  # one bad query does not break the source


def test_cancelled_fetch_interrupts_its_query(backend: Backend) -> None:
    async def body(source: Source) -> tuple[Fetched, float]:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(source.fetch(ENDLESS[source.dialect], []), 0.3)
        started = time.monotonic()
        # pool_max=1: this only runs if the endless query gave its connection back.
        after = await asyncio.wait_for(source.fetch("select 1 as one", []), 10)
        return after, time.monotonic() - started

    after, waited = backend.run(body, pool_max=1)

    assert after == (["one"], [(1,)])
    assert waited < 5


def test_close_releases_everything(backend: Backend) -> None:
    source = backend.source("bank_close")

    async def use() -> list[str]:
        await asyncio.gather(*(source.fetch("select 1 as one", []) for _ in range(8)))
        return backend.held(source, settle=False)

    async def close() -> SourceError:
        await source.close()
        await source.close()  # idempotent
        with pytest.raises(SourceError) as raised:
            await source.fetch("select 1 as one", [])
        return raised.value

    held_while_open = asyncio.run(use())
    error = asyncio.run(close())

    assert held_while_open  # the check below can see what a source holds
    assert backend.held(source) == []
    assert "source 'bank_close' is closed" in str(error)


def test_fetch_from_two_event_loops(backend: Backend) -> None:
    """The client runs a loop per calling thread; one source serves all of them."""
    source = backend.source("bank_loops")
    query = sql(source, "select name from users where id = {}")

    async def fetch(key: str) -> Fetched:
        return await source.fetch(query, [key])

    async def close() -> None:
        await source.close()

    first = asyncio.run(fetch("u1"))
    second = asyncio.run(fetch("u2"))
    asyncio.run(close())

    assert first == (["name"], [("name 1",)])
    assert second == (["name"], [("name 2",)])
    assert backend.held(source) == []
