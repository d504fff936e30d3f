"""What only the SQLite store does: a WAL file, one statement per get, closing for good."""

import asyncio
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kairos.errors import KairosError
from kairos.stores import SQLiteOnlineStore, StoredValue

T0 = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)


def test_the_file_is_in_wal_mode_with_one_keyed_table(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "online.db"

    async def write() -> None:
        store = SQLiteOnlineStore(path)
        try:
            await store.put([(("user", 1, "name"), StoredValue("Ann", T0))])
        finally:
            await store.close()

    asyncio.run(write())

    connection = sqlite3.connect(path)
    try:
        assert connection.execute("pragma journal_mode").fetchone() == ("wal",)
        rows = connection.execute(
            "select namespace, key, feature, value, observed_at from kairos_online"
        ).fetchall()
        key_columns = [r[1] for r in connection.execute("pragma table_info(kairos_online)") if r[5]]
    finally:
        connection.close()
    assert rows == [("user", "1", "name", b'"Ann"', 1768046400000000)]
    assert key_columns == ["namespace", "key", "feature"]


def test_a_get_of_many_keys_is_one_statement(tmp_path: Path) -> None:
    statements: list[str] = []

    async def run() -> list[StoredValue | None]:
        store = SQLiteOnlineStore(tmp_path / "online.db")
        try:
            await store.put([(("user", f"u{i}", "name"), StoredValue(i, T0)) for i in range(2000)])
            # the connection belongs to the store's thread: install the tracer there
            store._executor.submit(store._live().set_trace_callback, statements.append).result()
            return await store.get([("user", f"u{i}", "name") for i in range(2000)])
        finally:
            await store.close()

    found = asyncio.run(run())

    assert [f.value if f else None for f in found] == list(range(2000))
    assert len(statements) == 1


def test_a_closed_store_says_so() -> None:
    async def run() -> None:
        store = SQLiteOnlineStore(":memory:")
        await store.close()
        await store.close()  # twice is fine
        with pytest.raises(KairosError, match="closed"):
            await store.get([("user", "u1", "name")])

    asyncio.run(run())


def test_a_path_that_cannot_be_a_database_is_named(tmp_path: Path) -> None:
    with pytest.raises(KairosError, match="cannot open online store"):
        SQLiteOnlineStore(tmp_path)  # a folder


def test_unreadable_data_is_a_miss_and_the_next_put_replaces_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "online.db"
    key = ("user", "u1", "name")

    async def run() -> tuple[list[StoredValue | None], list[StoredValue | None]]:
        store = SQLiteOnlineStore(path)
        try:
            await store.put([(key, StoredValue("old", T0))])
            with sqlite3.connect(path) as other:
                other.execute("update kairos_online set value = x'7b6e6f'")  # '{no'
            other.close()
            missed = await store.get([key])
            await store.put([(key, StoredValue("Ann", T0))])
            return missed, await store.get([key])
        finally:
            await store.close()

    missed, replaced = asyncio.run(run())

    assert missed == [None]
    assert "unreadable" in caplog.text
    assert replaced == [StoredValue("Ann", T0)]
