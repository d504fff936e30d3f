"""Counters in a SQLite file: each hold and settle is one `BEGIN IMMEDIATE` write
transaction, so processes sharing the file never interleave a check with a charge."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping, Sequence

import orjson

from kairos.gateway.counters import Line
from kairos.gateway.sqlite_thread import SQLiteThread

_SCHEMA = """
create table if not exists gateway_counters (
    counter text primary key,
    spent integer not null,
    expires_at real                -- epoch seconds after which the row may be dropped
) without rowid;
create table if not exists gateway_holds (
    id text primary key,
    lines text not null,           -- JSON [[counter, amount], ...]
    lease_until real not null
) without rowid;
"""


class SQLiteCounters:
    def __init__(self, path: str) -> None:
        self._db = SQLiteThread(path, _SCHEMA)
        self._last_sweep = 0.0

    async def spent(self, counters: Sequence[str]) -> list[int]:
        def read(connection: sqlite3.Connection) -> list[int]:
            rows = dict(
                connection.execute(
                    "select counter, spent from gateway_counters "
                    "where counter in (select value from json_each(?))",
                    (orjson.dumps(list(counters)).decode(),),
                ).fetchall()
            )
            return [int(rows.get(c, 0)) for c in counters]

        return await self._db.run(read)

    async def hold(self, hold_id: str, lines: Sequence[Line], lease_until: float) -> int | None:
        def charge(connection: sqlite3.Connection) -> int | None:
            connection.execute("begin immediate")
            try:
                for index, line in enumerate(lines):
                    row = connection.execute(
                        "select spent from gateway_counters where counter = ?", (line.counter,)
                    ).fetchone()
                    if (row[0] if row else 0) + line.amount > line.limit:
                        connection.execute("rollback")
                        return index
                for line in lines:
                    connection.execute(
                        "insert into gateway_counters (counter, spent, expires_at) values (?, ?, ?)"
                        " on conflict (counter) do update set spent = spent + excluded.spent",
                        (line.counter, line.amount, line.expires_at),
                    )
                connection.execute(
                    "insert into gateway_holds (id, lines, lease_until) values (?, ?, ?)",
                    (hold_id, orjson.dumps([[x.counter, x.amount] for x in lines]), lease_until),
                )
                self._sweep(connection)
                connection.execute("commit")
            except BaseException:
                if connection.in_transaction:
                    connection.execute("rollback")
                raise
            return None

        return await self._db.run(charge)

    async def settle(self, hold_id: str, actual: Mapping[str, int]) -> bool:
        def apply(connection: sqlite3.Connection) -> bool:
            connection.execute("begin immediate")
            try:
                row = connection.execute(
                    "delete from gateway_holds where id = ? returning lines, lease_until",
                    (hold_id,),
                ).fetchone()
                live = row is not None and row[1] >= time.time()
                if live:
                    for counter, held in orjson.loads(row[0]):
                        delta = actual.get(counter, held) - held
                        if delta:
                            connection.execute(
                                "update gateway_counters set spent = spent + ? where counter = ?",
                                (delta, counter),
                            )
                connection.execute("commit")
            except BaseException:
                if connection.in_transaction:
                    connection.execute("rollback")
                raise
            return live

        return await self._db.run(apply)

    def _sweep(self, connection: sqlite3.Connection) -> None:
        """Drop expired rate windows and holds whose lease ran out (their charge stays)."""
        now = time.time()
        if now - self._last_sweep < 10:
            return
        self._last_sweep = now
        connection.execute("delete from gateway_counters where expires_at < ?", (now,))
        connection.execute("delete from gateway_holds where lease_until < ?", (now,))

    async def close(self) -> None:
        await self._db.close()
