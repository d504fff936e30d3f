"""Counters in PostgreSQL, shared by every gateway process. A hold is one transaction: the
counter rows are created if missing, locked in a fixed (sorted) order so two holds never
deadlock, then charged by one conditional UPDATE each; any refusal rolls all of it back."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from kairos.backends.postgres import failures_as
from kairos.gateway.accounting.counters import Line, process_holds
from kairos.gateway.store.pg import PostgresPool, failed, split_prefix

_FAILED = "the gateway's budget store failed"


class _Refused(Exception):
    def __init__(self, index: int) -> None:
        self.index = index


class PostgresCounters:
    def __init__(self, url: str) -> None:
        conninfo, prefix = split_prefix(url)
        self.counters_table = f"{prefix}_counters"
        self.holds_table = f"{prefix}_holds"
        schema = f"""
        create table if not exists {self.counters_table} (
            counter text primary key, spent bigint not null, expires_at double precision);
        create table if not exists {self.holds_table} (
            id text primary key, lines jsonb not null, lease_until double precision not null);
        """
        self._db = PostgresPool(conninfo, schema)
        self._last_sweep = 0.0

    async def spent(self, counters: Sequence[str]) -> list[int]:
        rows = dict(
            await self._fetch(
                f"select counter, spent from {self.counters_table} where counter = any(%s)",
                [list(counters)],
            )
        )
        return [int(rows.get(c, 0)) for c in counters]

    async def hold(self, hold_id: str, lines: Sequence[Line], lease_until: float) -> int | None:
        order = sorted(range(len(lines)), key=lambda i: lines[i].counter)
        pool = await self._db.pool()
        try:
            with failures_as(failed(_FAILED, "; nothing was charged")):
                async with pool.connection() as connection, connection.transaction():
                    await connection.execute(
                        f"insert into {self.counters_table} (counter, spent, expires_at) "
                        "select c, 0, e from unnest(%s::text[], %s::float8[]) as t(c, e) "
                        "order by c on conflict (counter) do nothing",
                        [[lines[i].counter for i in order], [lines[i].expires_at for i in order]],
                    )
                    for index in order:
                        line = lines[index]
                        cursor = await connection.execute(
                            f"update {self.counters_table} set spent = spent + %s "
                            "where counter = %s and spent + %s <= %s",
                            [line.amount, line.counter, line.amount, line.limit],
                        )
                        if cursor.rowcount != 1:
                            raise _Refused(index)
                    await connection.execute(
                        f"insert into {self.holds_table} (id, lines, lease_until) "
                        "values (%s, %s, %s)",
                        [hold_id, orjson.dumps([[x.counter, x.amount] for x in lines]).decode(),
                         lease_until],
                    )  # fmt: skip
        except _Refused as refused:
            return refused.index
        await self._sweep()
        return None

    async def settle(self, hold_id: str, actual: Mapping[str, int]) -> bool:
        pool = await self._db.pool()
        with failures_as(failed(f"{_FAILED} while settling")):
            async with pool.connection() as connection, connection.transaction():
                cursor = await connection.execute(
                    f"delete from {self.holds_table} where id = %s returning lines, lease_until",
                    [hold_id],
                )
                row = await cursor.fetchone()
                if row is None or row[1] < time.time():
                    return False
                deltas = sorted(
                    (counter, actual.get(counter, held) - held) for counter, held in row[0]
                )
                for counter, delta in deltas:
                    if delta:
                        await connection.execute(
                            f"update {self.counters_table} set spent = spent + %s "
                            "where counter = %s",
                            [delta, counter],
                        )
        return True

    async def orphans(self, process: str) -> list[tuple[str, dict[str, int]]]:
        (low, high), (share_low, share_high) = process_holds(process)
        rows = await self._fetch(
            f"select id, lines from {self.holds_table} "
            "where (id >= %s and id < %s) or (id >= %s and id < %s) order by id",
            [low, high, share_low, share_high],
        )
        return [(ident, {counter: held for counter, held in lines}) for ident, lines in rows]

    async def _fetch(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        pool = await self._db.pool()
        with failures_as(failed(_FAILED)):
            async with pool.connection() as connection:
                cursor = await connection.execute(sql, params)
                return await cursor.fetchall()

    async def _sweep(self) -> None:
        now = time.time()
        if now - self._last_sweep < 10:
            return
        self._last_sweep = now
        await self._fetch(
            f"with a as (delete from {self.counters_table} where expires_at < %s returning 1), "
            f"b as (delete from {self.holds_table} where lease_until < %s returning 1) "
            "select (select count(*) from a), (select count(*) from b)",
            [now, now],
        )

    async def close(self) -> None:
        await self._db.close()
