"""Keys and the ledger in a SQLite file (the embedded default).

A process is marked alive by a file of its own beside the database (`<file>-processes/<id>`)
that it keeps locked (flock) until it exits: the kernel lets go of the lock however the
process ends, so a file that can be locked is a dead process's."""

from __future__ import annotations

import fcntl
import os
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from kairos.backends.sqlite import SQLiteThread
from kairos.gateway.accounting.ledger import LedgerRow
from kairos.gateway.errors import AccountingUnavailable
from kairos.gateway.keys import Budget, KeyRecord
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

# marks this process holds, by path: [the descriptor kept open and locked, gateways using it]
_HELD: dict[str, list[int]] = {}

_SCHEMA = """
create table if not exists gateway_keys (
    id text primary key, name text not null, secret_hash text not null,
    created_at integer not null, models text not null, rpm integer, tpm integer,
    budgets text not null, expires_at integer, revoked_at integer
);
create table if not exists gateway_ledger (
    request_id text primary key, key_id text not null, route text not null,
    model_requested text not null, model_dispatched text, provider text, deployment text,
    tokens_in integer not null, tokens_out integer not null, cost_micros integer not null,
    price_version text not null, ttft_ms real, latency_ms real not null, status text not null,
    attempts integer not null, created_at integer not null
);
"""


def _upgrade(connection: sqlite3.Connection) -> None:
    """Add the ledger columns a file made by an older kairos lacks, and its index by key and
    time holding the usage columns (in place of the older index by key and time alone)."""
    present = {row[1] for row in connection.execute("pragma table_info(gateway_ledger)")}
    for name, kind in LEDGER_ADDED.items():
        if name not in present:
            connection.execute(f"alter table gateway_ledger add column {name} {kind}")
    connection.execute(
        "create index if not exists gateway_ledger_usage on gateway_ledger "
        f"(key_id, created_at, {USAGE_COLUMNS})"
    )
    connection.execute("drop index if exists gateway_ledger_key_time")


class SQLiteRegistry:
    def __init__(self, path: str) -> None:
        self._db = SQLiteThread(
            path,
            _SCHEMA,
            _upgrade,
            name="the gateway's SQLite store",
            unavailable=AccountingUnavailable,  # fail closed: a 503
            thread_name="kairos-gateway-db",
        )

    async def put_key(self, record: KeyRecord) -> None:
        def put(connection: sqlite3.Connection) -> None:
            connection.execute(
                f"insert into gateway_keys ({KEY_COLUMNS}) values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                key_to_row(record),
            )

        await self._db.run(put)

    async def get_key(self, key_id: str) -> KeyRecord | None:
        def get(connection: sqlite3.Connection) -> KeyRecord | None:
            row = connection.execute(
                f"select {KEY_COLUMNS} from gateway_keys where id = ?", (key_id,)
            ).fetchone()
            return key_from_row(row) if row else None

        return await self._db.run(get, inline=True)

    async def list_keys(self) -> list[KeyRecord]:
        def read(connection: sqlite3.Connection) -> list[KeyRecord]:
            rows = connection.execute(
                f"select {KEY_COLUMNS} from gateway_keys order by created_at"
            ).fetchall()
            return [key_from_row(row) for row in rows]

        return await self._db.run(read)

    async def revoke_key(self, key_id: str, at: datetime) -> bool:
        def revoke(connection: sqlite3.Connection) -> bool:
            cursor = connection.execute(
                "update gateway_keys set revoked_at = ? where id = ? and revoked_at is null",
                (to_micros(at), key_id),
            )
            return cursor.rowcount == 1

        return await self._db.run(revoke)

    async def update_key(
        self, key_id: str, models: tuple[str, ...], budgets: tuple[Budget, ...]
    ) -> bool:
        def update(connection: sqlite3.Connection) -> bool:
            cursor = connection.execute(
                "update gateway_keys set models = ?, budgets = ? "
                "where id = ? and revoked_at is null",
                (*key_lists(models, budgets), key_id),
            )
            return cursor.rowcount == 1

        return await self._db.run(update)

    async def write_rows(self, rows: Sequence[LedgerRow]) -> None:
        def write(connection: sqlite3.Connection) -> None:
            marks = ", ".join("?" * len(LEDGER_COLUMNS.split(",")))
            connection.execute("begin immediate")
            try:
                connection.executemany(
                    f"insert into gateway_ledger ({LEDGER_COLUMNS}) values ({marks}) "
                    + ledger_upsert(),
                    [ledger_to_row(row) for row in rows],
                )
                connection.execute("commit")
            except BaseException:
                if connection.in_transaction:
                    connection.execute("rollback")
                raise

        # on the event loop when the file is free: a thread would contend for the GIL with
        # the requests being served
        await self._db.run(write, inline=True)

    async def read_rows(
        self, key_id: str | None, since: datetime | None, until: datetime | None
    ) -> list[LedgerRow]:
        def read(connection: sqlite3.Connection) -> list[LedgerRow]:
            rows = connection.execute(
                f"select {LEDGER_COLUMNS} from gateway_ledger "
                "where (? is null or key_id = ?) and created_at >= ? and created_at < ? "
                "order by created_at",
                (
                    key_id,
                    key_id,
                    to_micros(since) if since else 0,
                    to_micros(until) if until else 1 << 62,
                ),
            ).fetchall()
            return [ledger_from_row(row) for row in rows]

        return await self._db.run(read)

    def _processes(self) -> Path | None:
        return None if self._db.path == ":memory:" else Path(f"{self._db.path}-processes")

    async def attach(self, process: str) -> None:
        folder = self._processes()
        if folder is None:
            return
        if (held := _HELD.get(str(folder / process))) is not None:
            held[1] += 1
            return
        # locked under a name no one reads, then renamed: a mark is never seen unlocked
        hidden = folder / f".{process}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(hidden, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            os.replace(hidden, folder / process)
        except OSError as error:
            raise AccountingUnavailable(
                f"the gateway cannot mark its process alive beside its SQLite registry "
                f"({error.strerror}); make that folder writable"
            ) from None
        _HELD[str(folder / process)] = [descriptor, 1]

    async def detach(self, process: str) -> None:
        folder = self._processes()
        held = None if folder is None else _HELD.get(str(folder / process))
        if folder is None or held is None:
            return
        held[1] -= 1
        if held[1] == 0:
            del _HELD[str(folder / process)]
            (folder / process).unlink(missing_ok=True)
            os.close(held[0])

    async def dead_processes(self) -> list[str]:
        folder = self._processes()
        if folder is None or not folder.is_dir():
            return []
        dead = []
        for mark in sorted(folder.iterdir()):
            if mark.name.startswith(".") or str(mark) in _HELD:
                continue
            try:
                descriptor = os.open(mark, os.O_RDWR)
            except FileNotFoundError:  # forgotten meanwhile by another gateway starting
                continue
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its process holds it: alive
            finally:
                os.close(descriptor)  # lets go of the lock, if taken
            dead.append(mark.name)
        return dead

    async def process_rows(self, process: str, since: datetime) -> list[LedgerRow]:
        def read(connection: sqlite3.Connection) -> list[LedgerRow]:
            rows = connection.execute(
                f"select {LEDGER_COLUMNS} from gateway_ledger "
                "where request_id >= ? and request_id < ? "
                "and (status = 'pending' or created_at >= ?)",
                (*id_range(process), to_micros(since)),
            ).fetchall()
            return [ledger_from_row(row) for row in rows]

        return await self._db.run(read)

    async def forget(self, process: str) -> None:
        folder = self._processes()
        if folder is not None:
            (folder / process).unlink(missing_ok=True)

    async def close(self) -> None:
        await self._db.close()
