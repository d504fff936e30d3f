"""Counters in a SQLite file: a hold is one `BEGIN IMMEDIATE` write transaction of
conditional upserts, so processes sharing the file never interleave a check with a charge.

A hold's record is written in the same transaction (`gateway_holds`), and deleted in the one
that settles it: a process that dies leaves its open holds there for the next gateway to
start to settle (accounting/recovery.py). The process that holds keeps a copy in memory too, so its
settles read nothing first.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping, Sequence

import orjson

from kairos.backends.sqlite import SQLiteThread
from kairos.gateway.accounting.counters import Line, process_holds
from kairos.gateway.errors import AccountingUnavailable

_SCHEMA = """
create table if not exists gateway_counters (
    counter text primary key,
    spent integer not null,
    expires_at real                -- epoch seconds after which the row may be dropped
) without rowid;
create table if not exists gateway_holds (
    id text primary key,
    lines text not null,           -- [[counter, amount], ...] as JSON
    lease_until real not null
) without rowid;
"""
# Adds the amount unless that passes the limit; a row that does not exist yet is created
# (the caller has checked amount <= limit for that case).
_CHARGE = """
insert into gateway_counters (counter, spent, expires_at) values (?, ?, ?)
on conflict (counter) do update set spent = spent + excluded.spent
    where spent + excluded.spent <= ?
"""
_SWEEP_EVERY = 10.0


class SQLiteCounters:
    def __init__(self, path: str) -> None:
        self._db = SQLiteThread(
            path,
            _SCHEMA,
            name="the gateway's SQLite store",
            unavailable=AccountingUnavailable,  # fail closed: a 503
            thread_name="kairos-gateway-db",
        )
        self._holds: dict[str, tuple[tuple[tuple[str, int], ...], float]] = {}
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
        for index, line in enumerate(lines):
            if line.amount > line.limit:
                return index

        record = orjson.dumps([[x.counter, x.amount] for x in lines]).decode()

        def charge(connection: sqlite3.Connection) -> int | None:
            connection.execute("begin immediate")
            try:
                for index, line in enumerate(lines):
                    cursor = connection.execute(
                        _CHARGE, (line.counter, line.amount, line.expires_at, line.limit)
                    )
                    if cursor.rowcount != 1:
                        connection.execute("rollback")
                        return index
                connection.execute(
                    "insert into gateway_holds (id, lines, lease_until) values (?, ?, ?)",
                    (hold_id, record, lease_until),
                )
                self._sweep(connection)
                connection.execute("commit")
            except BaseException:
                if connection.in_transaction:
                    connection.execute("rollback")
                raise
            return None

        refused = await self._db.run(charge, inline=True)
        if refused is None:
            self._holds[hold_id] = (tuple((x.counter, x.amount) for x in lines), lease_until)
        return refused

    async def settle(self, hold_id: str, actual: Mapping[str, int]) -> bool:
        # a hold not in memory may be a dead process's (recovery): its record is in the file
        record = self._holds.pop(hold_id, None)

        def apply(connection: sqlite3.Connection) -> bool:
            connection.execute("begin immediate")
            try:
                stored = connection.execute(
                    "delete from gateway_holds where id = ? returning lines, lease_until",
                    (hold_id,),
                ).fetchone()
                held = record
                if held is None and stored is not None:
                    held = (tuple((c, a) for c, a in orjson.loads(stored[0])), stored[1])
                if held is None or held[1] < time.time():
                    connection.execute("commit")
                    return False  # settled already, or its lease ran out: the full hold stays
                deltas = [(actual.get(c, amount) - amount, c) for c, amount in held[0]]
                connection.executemany(
                    "update gateway_counters set spent = spent + ? where counter = ?",
                    [(delta, counter) for delta, counter in deltas if delta],
                )
                connection.execute("commit")
            except BaseException:
                if connection.in_transaction:
                    connection.execute("rollback")
                raise
            return True

        return await self._db.run(apply, inline=True)

    async def orphans(self, process: str) -> list[tuple[str, dict[str, int]]]:
        (low, high), (share_low, share_high) = process_holds(process)

        def read(connection: sqlite3.Connection) -> list[tuple[str, dict[str, int]]]:
            rows = connection.execute(
                "select id, lines from gateway_holds "
                "where (id >= ? and id < ?) or (id >= ? and id < ?) order by id",
                (low, high, share_low, share_high),
            ).fetchall()
            return [(ident, dict(orjson.loads(lines))) for ident, lines in rows]

        return await self._db.run(read)

    def _sweep(self, connection: sqlite3.Connection) -> None:
        """Drop expired rate windows, and forget holds whose lease ran out."""
        now = time.time()
        if now - self._last_sweep < _SWEEP_EVERY:
            return
        self._last_sweep = now
        connection.execute("delete from gateway_counters where expires_at < ?", (now,))
        connection.execute("delete from gateway_holds where lease_until < ?", (now,))
        for hold_id in [h for h, (_, lease) in self._holds.items() if lease < now]:
            del self._holds[hold_id]

    async def close(self) -> None:
        await self._db.close()
