"""An online store in one SQLite file: the embedded default that survives a restart.

One row per (namespace, key, feature). Writes are an upsert that only replaces a row with a
value observed at the same time or later, so an old value never overwrites a newer one, even
across processes sharing the file. All SQLite calls run on one thread owned by the store, so
the event loop never blocks and the connection is never shared between threads.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import orjson

from kairos.errors import KairosError
from kairos.stores.codec import CorruptValue, decode, encode, encode_key, from_micros, to_micros
from kairos.stores.online.base import StoredValue, StoreKey

T = TypeVar("T")

logger = logging.getLogger(__name__)

_SCHEMA = """
create table if not exists kairos_online (
    namespace text not null,
    key text not null,            -- codec.encode_key: 1 and "1" are different keys
    feature text not null,
    value blob not null,          -- codec.encode
    observed_at integer not null, -- microseconds since 1970-01-01 UTC
    primary key (namespace, key, feature)
) without rowid
"""

_UPSERT = """
insert into kairos_online (namespace, key, feature, value, observed_at) values (?, ?, ?, ?, ?)
on conflict (namespace, key, feature) do update
    set value = excluded.value, observed_at = excluded.observed_at
    where excluded.observed_at >= kairos_online.observed_at
"""

# Every key of a call travels as one JSON parameter, so a get is one statement however many
# keys it asks for (no bound-parameter limit, one cached statement text).
_SELECT = """
select stored.namespace, stored.key, stored.feature, stored.value, stored.observed_at
from json_each(?) as wanted
cross join kairos_online as stored
    on stored.namespace = json_extract(wanted.value, '$[0]')
    and stored.key = json_extract(wanted.value, '$[1]')
    and stored.feature = json_extract(wanted.value, '$[2]')
"""


class SQLiteOnlineStore:
    """Online store in a SQLite file (WAL mode); the parent folder is created.

    >>> store = SQLiteOnlineStore(".kairos/online.db")  # doctest: +SKIP
    >>> await store.put([(("user", "u1", "name"), StoredValue("Ann", now))])  # doctest: +SKIP
    >>> await store.get([("user", "u1", "name")])  # doctest: +SKIP
    [StoredValue(value='Ann', observed_at=...)]
    """

    def __init__(self, path: str | Path, *, timeout: float = 30.0) -> None:
        self.path = str(path)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="kairos-sqlite-online")
        self._connection: sqlite3.Connection | None = None
        try:
            self._executor.submit(self._open, timeout).result()
        except BaseException:
            self._executor.shutdown(wait=True)
            raise

    def __repr__(self) -> str:
        return f"SQLiteOnlineStore({self.path!r})"

    async def get(self, keys: Sequence[StoreKey]) -> list[StoredValue | None]:
        if not keys:
            return []
        encoded = [(namespace, encode_key(key), name) for namespace, key, name in keys]
        rows = await self._run(self._select, orjson.dumps(encoded).decode())
        found = {(namespace, key, name): (value, at) for namespace, key, name, value, at in rows}
        values: list[StoredValue | None] = []
        for wanted in encoded:
            row = found.get(wanted)
            # decoded per position: every caller gets its own copy of a list or dict
            values.append(None if row is None else self._decoded(wanted, *row))
        return values

    async def put(self, items: Sequence[tuple[StoreKey, StoredValue]]) -> None:
        if not items:
            return
        rows = [
            (namespace, encode_key(key), name, encode(stored.value), to_micros(stored.observed_at))
            for (namespace, key, name), stored in items
        ]
        await self._run(self._upsert, rows)

    async def close(self) -> None:
        if self._connection is not None:
            await self._run(self._close)
        self._executor.shutdown(wait=True)

    def _decoded(self, wanted: tuple[str, str, str], value: bytes, at: int) -> StoredValue | None:
        try:
            return StoredValue(decode(value), from_micros(at))
        except (CorruptValue, OverflowError) as error:
            # A cache miss is always safe: the resolver recomputes and the put replaces it.
            logger.warning("%r: ignoring unreadable value of %s: %s", self, wanted, error)
            return None

    # --- on the store's thread ------------------------------------------------------------

    async def _run(self, call: Callable[..., T], *args: Any) -> T:
        if self._connection is None:
            raise KairosError(f"{self!r} is closed; create a new store")
        return await asyncio.get_running_loop().run_in_executor(self._executor, call, *args)

    def _open(self, timeout: float) -> None:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            connection = sqlite3.connect(self.path, timeout=timeout, isolation_level=None)
        except sqlite3.Error as error:
            raise KairosError(f"cannot open online store {self.path!r}: {error}") from None
        try:
            connection.execute("pragma journal_mode = wal")
            connection.execute("pragma synchronous = normal")
            connection.execute(_SCHEMA)
        except sqlite3.Error as error:
            connection.close()
            raise KairosError(f"cannot open online store {self.path!r}: {error}") from None
        self._connection = connection

    def _select(self, wanted: str) -> list[tuple[str, str, str, bytes, int]]:
        connection = self._live()
        return connection.execute(_SELECT, (wanted,)).fetchall()

    def _upsert(self, rows: list[tuple[str, str, str, bytes, int]]) -> None:
        connection = self._live()
        connection.execute("begin immediate")  # a batch is written whole or not at all
        try:
            connection.executemany(_UPSERT, rows)
        except BaseException:
            connection.rollback()
            raise
        connection.commit()

    def _close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    def _live(self) -> sqlite3.Connection:
        if self._connection is None:
            raise KairosError(f"{self!r} is closed; create a new store")
        return self._connection
