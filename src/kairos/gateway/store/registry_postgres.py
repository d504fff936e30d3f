"""Keys and the ledger in PostgreSQL (`?prefix=` names the tables; default `gateway`).

A process is marked alive by a row in `<prefix>_processes` and a session advisory lock on its
id (64 bits), held by a connection of its own until it exits: the server lets go of the lock
when that session ends, so an id whose lock can be taken is a dead process's."""

from __future__ import annotations

import asyncio
import atexit
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kairos.backends import postgres
from kairos.gateway.accounting.ledger import LedgerRow
from kairos.gateway.errors import AccountingUnavailable
from kairos.gateway.keys import Budget, KeyRecord
from kairos.gateway.store.pg import PostgresPool, failed, split_prefix
from kairos.gateway.store.registry import (
    KEY_COLUMNS,
    LEDGER_ADDED,
    LEDGER_COLUMNS,
    USAGE_COLUMNS,
    id_range,
    key_from_row,
    key_lists,
    key_to_row,
    ledger_from_row,
    ledger_to_row,
    ledger_upsert,
    to_micros,
)

if TYPE_CHECKING:
    import psycopg

_FAILED = "the gateway registry (postgres) failed"

# a process id (16 hex digits) as the bigint of its advisory lock
_LOCK_KEY = "('x' || {})::bit(64)::bigint"
# the sessions holding this process's locks, by database, with how many gateways use each
_HELD: dict[tuple[str, str], tuple[psycopg.Connection[Any], list[int]]] = {}


class PostgresRegistry:
    def __init__(self, url: str) -> None:
        conninfo, prefix = split_prefix(url)
        self.keys_table = f"{prefix}_keys"
        self.ledger_table = f"{prefix}_ledger"
        self.processes_table = f"{prefix}_processes"
        self._conninfo = conninfo
        schema = f"""
        create table if not exists {self.keys_table} (
            id text primary key, name text not null, secret_hash text not null,
            created_at bigint not null, models text not null, rpm integer, tpm integer,
            budgets text not null, expires_at bigint, revoked_at bigint);
        create table if not exists {self.ledger_table} (
            request_id text primary key, key_id text not null, route text not null,
            model_requested text not null, model_dispatched text, provider text,
            deployment text, tokens_in bigint not null, tokens_out bigint not null,
            cost_micros bigint not null, price_version text not null, ttft_ms double precision,
            latency_ms double precision not null, status text not null, attempts integer not null,
            created_at bigint not null);
        create index if not exists {self.ledger_table}_usage
            on {self.ledger_table} (key_id, created_at) include ({USAGE_COLUMNS});
        drop index if exists {self.ledger_table}_key_time;
        create table if not exists {self.processes_table} (
            id text primary key, attached_at bigint not null);
        """
        schema += "".join(  # columns a table made by an older kairos lacks
            f"alter table {self.ledger_table} add column if not exists {name} {kind};"
            for name, kind in LEDGER_ADDED.items()
        )
        self._db = PostgresPool(conninfo, schema)

    async def _run(self, sql: str, params: Sequence[Any] = (), *, many: bool = False) -> Any:
        pool = await self._db.pool()
        with postgres.failures_as(failed(_FAILED)):
            async with pool.connection() as connection:
                if many:
                    async with connection.cursor() as cursor:
                        await cursor.executemany(sql, params)
                        return None
                cursor = await connection.execute(sql, list(params))
                return await cursor.fetchall() if cursor.description else cursor.rowcount

    async def put_key(self, record: KeyRecord) -> None:
        marks = ", ".join(["%s"] * 10)
        await self._run(
            f"insert into {self.keys_table} ({KEY_COLUMNS}) values ({marks})", key_to_row(record)
        )

    async def get_key(self, key_id: str) -> KeyRecord | None:
        rows = await self._run(
            f"select {KEY_COLUMNS} from {self.keys_table} where id = %s", [key_id]
        )
        return key_from_row(rows[0]) if rows else None

    async def list_keys(self) -> list[KeyRecord]:
        rows = await self._run(f"select {KEY_COLUMNS} from {self.keys_table} order by created_at")
        return [key_from_row(row) for row in rows]

    async def revoke_key(self, key_id: str, at: datetime) -> bool:
        count = await self._run(
            f"update {self.keys_table} set revoked_at = %s where id = %s and revoked_at is null",
            [to_micros(at), key_id],
        )
        return bool(count == 1)

    async def update_key(
        self, key_id: str, models: tuple[str, ...], budgets: tuple[Budget, ...]
    ) -> bool:
        count = await self._run(
            f"update {self.keys_table} set models = %s, budgets = %s "
            "where id = %s and revoked_at is null",
            [*key_lists(models, budgets), key_id],
        )
        return bool(count == 1)

    async def write_rows(self, rows: Sequence[LedgerRow]) -> None:
        marks = ", ".join(["%s"] * len(LEDGER_COLUMNS.split(",")))
        sql = f"insert into {self.ledger_table} ({LEDGER_COLUMNS}) values ({marks}) "
        if len(rows) == 1:  # a call's pending row: one statement, no pipeline round
            await self._run(sql + ledger_upsert(), ledger_to_row(rows[0]))
            return
        await self._run(sql + ledger_upsert(), [ledger_to_row(row) for row in rows], many=True)

    async def read_rows(
        self, key_id: str | None, since: datetime | None, until: datetime | None
    ) -> list[LedgerRow]:
        rows = await self._run(
            f"select {LEDGER_COLUMNS} from {self.ledger_table} "
            "where (%s::text is null or key_id = %s) and created_at >= %s and created_at < %s "
            "order by created_at",
            [key_id, key_id, to_micros(since) if since else 0,
             to_micros(until) if until else 1 << 62],
        )  # fmt: skip
        return [ledger_from_row(row) for row in rows]

    async def attach(self, process: str) -> None:
        held = _HELD.get((self._conninfo, process))
        if held is None:
            await asyncio.to_thread(self._lock, process)
        else:
            held[1][0] += 1
        await self._run(
            f"insert into {self.processes_table} (id, attached_at) values (%s, %s) "
            "on conflict (id) do nothing",
            [process, to_micros(datetime.now(UTC))],
        )

    def _lock(self, process: str) -> None:
        with postgres.failures_as(failed(_FAILED)):
            session = postgres.connect(
                self._conninfo, autocommit=True, connect_timeout=postgres.CONNECT_TIMEOUT
            )
            held = session.execute(
                f"select pg_try_advisory_lock({_LOCK_KEY.format('%s')})", [process]
            ).fetchone()
        if not held or not held[0]:  # 64 random bits collided with a live process's
            session.close()
            raise AccountingUnavailable("this gateway's process id is in use; restart it")
        _HELD[(self._conninfo, process)] = (session, [1])
        atexit.register(session.close)

    async def detach(self, process: str) -> None:
        held = _HELD.get((self._conninfo, process))
        if held is None:
            return
        session, users = held
        users[0] -= 1
        if users[0] == 0:
            del _HELD[(self._conninfo, process)]
            await self.forget(process)
            atexit.unregister(session.close)
            await asyncio.to_thread(session.close)  # lets go of the lock

    async def dead_processes(self) -> list[str]:
        # a lock taken here is let go of at commit; a live process's cannot be taken
        pool = await self._db.pool()
        with postgres.failures_as(failed(_FAILED)):
            async with pool.connection() as connection, connection.transaction():
                cursor = await connection.execute(
                    f"select id from {self.processes_table} "
                    f"where pg_try_advisory_xact_lock({_LOCK_KEY.format('id')}) order by id"
                )
                return [row[0] for row in await cursor.fetchall()]

    async def process_rows(self, process: str, since: datetime) -> list[LedgerRow]:
        rows = await self._run(
            f"select {LEDGER_COLUMNS} from {self.ledger_table} "
            "where request_id >= %s and request_id < %s "
            "and (status = 'pending' or created_at >= %s)",
            [*id_range(process), to_micros(since)],
        )
        return [ledger_from_row(row) for row in rows]

    async def forget(self, process: str) -> None:
        await self._run(f"delete from {self.processes_table} where id = %s", [process])

    async def close(self) -> None:
        await self._db.close()
