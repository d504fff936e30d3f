"""The query log's PostgreSQL backend: a table written with psycopg 3.

psycopg is imported when a log is opened, not when kairos is: most processes never use it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kairos.backends import postgres
from kairos.backends.url import redact, scrub
from kairos.stores.query_log.base import _COLUMNS, DEFAULT_TABLE, _check_name
from kairos.stores.query_log.records import QueryLogError, _Row

if TYPE_CHECKING:
    import psycopg


class _PostgresBackend:
    """A PostgreSQL table, written with psycopg 3 from the writer thread. Each batch is one
    transaction with synchronous_commit on (a commit has reached the server's WAL on disk).
    The structured columns are `json` (kept verbatim; `jsonb` would reorder dict keys and
    turn -0.0 into 0), so SQL can still look inside: `inputs->>'user.id'`."""

    def __init__(self, conninfo: str, table: str = DEFAULT_TABLE, schema: str | None = None):
        from psycopg import sql

        self._conninfo = conninfo
        self.name = redact(conninfo)
        _check_name("table", table)
        if schema is not None:
            _check_name("schema", schema)
        self._writer: psycopg.Connection[tuple[Any, ...]] | None = None
        self._reader: psycopg.Connection[tuple[Any, ...]] | None = None
        self._read_lock = threading.Lock()
        target = sql.Identifier(table) if schema is None else sql.Identifier(schema, table)
        self._insert = sql.SQL(
            "INSERT INTO {} ({}) VALUES (%s, %s, %s::json, %s::json, %s::json, %s, %s) "
            "ON CONFLICT (query_id) DO NOTHING"
        ).format(target, sql.SQL(_COLUMNS))
        self._select = sql.SQL(
            "SELECT query_id, now, inputs::text, outputs::text, trace::text, duration_ms, "
            "logged_at FROM {}"
        ).format(target)
        create = [
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (seq bigint GENERATED ALWAYS AS IDENTITY, "
                "query_id text PRIMARY KEY, now timestamptz NOT NULL, inputs json NOT NULL, "
                "outputs json NOT NULL, trace json NOT NULL, "
                "duration_ms double precision NOT NULL, logged_at timestamptz NOT NULL)"
            ).format(target),
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (seq)").format(
                sql.Identifier(f"{table}_seq_idx"), target
            ),
        ]
        if schema is not None:
            create.insert(
                0, sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema))
            )
        try:
            with self._connect() as conn, conn.transaction():
                # Two servers starting at once would race on CREATE ... IF NOT EXISTS.
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"kairos:{table}",))
                for statement in create:
                    conn.execute(statement)
        except Exception as exc:
            # `from None`: the original message may echo the connection string
            raise QueryLogError(
                f"cannot open query log {self.name!r}: {self.scrub(str(exc).strip())}"
            ) from None

    def scrub(self, text: str) -> str:
        return scrub(text, self._conninfo)

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        conn = postgres.connect(
            self._conninfo, autocommit=True, connect_timeout=postgres.CONNECT_TIMEOUT
        )
        conn.execute("SET TIME ZONE 'UTC'")
        conn.execute("SET synchronous_commit TO on")  # flush() promises durable commits
        return conn

    def write_batch(self, rows: Sequence[_Row]) -> None:
        params = [
            (
                row.query_id,
                row.now,
                row.inputs,
                row.outputs,
                row.trace,
                row.duration_ms,
                row.logged_at,
            )
            for row in rows
        ]
        try:
            if self._writer is None:
                self._writer = self._connect()
            conn = self._writer
            with conn.transaction(), conn.cursor() as cursor:
                cursor.executemany(self._insert, params)
        except Exception as error:
            if postgres.is_error(error):
                self.close_writer()  # reconnect on the next batch
            raise

    def close_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _read(self, where: str, params: tuple[Any, ...]) -> list[_Row]:
        from psycopg import sql

        with self._read_lock:
            try:
                if self._reader is None or self._reader.closed:
                    self._reader = self._connect()
                fetched = self._reader.execute(
                    sql.Composed([self._select, sql.SQL(where)]), params
                ).fetchall()
            except Exception as exc:
                if not postgres.is_error(exc):
                    raise
                self._close_reader()
                raise QueryLogError(
                    f"cannot read query log {self.name!r}: {self.scrub(str(exc).strip())}"
                ) from None
        return [_Row(*row) for row in fetched]

    def fetch_one(self, query_id: str) -> _Row | None:
        rows = self._read(" WHERE query_id = %s", (query_id,))
        return rows[0] if rows else None

    def fetch_recent(self, limit: int) -> list[_Row]:
        return self._read(" ORDER BY seq DESC LIMIT %s", (limit,))

    def _close_reader(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def close_readers(self) -> None:
        with self._read_lock:
            self._close_reader()
