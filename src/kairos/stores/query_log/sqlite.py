"""The query log's SQLite backend: one file in WAL mode, fsynced on every commit."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from kairos.stores.query_log.base import _COLUMNS, DEFAULT_TABLE, _check_name
from kairos.stores.query_log.records import QueryLogError, _Row


class _SQLiteBackend:
    """A SQLite file in WAL mode with synchronous=FULL: a committed batch is fsynced, so it
    survives a process kill and a power loss; readers (another process too) never block the
    writer. Each batch is one transaction, so a row is either whole or absent."""

    def __init__(self, path: str | Path, table: str = DEFAULT_TABLE) -> None:
        self.path = Path(path)
        self.table = _check_name("table", table)
        self.name = f"sqlite:///{self.path}"
        self._writer: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        self._read_lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = self._connect()
            try:
                conn.execute("PRAGMA journal_mode=WAL")  # persistent: stored in the file
                conn.execute(
                    f'CREATE TABLE IF NOT EXISTS "{self.table}" ('
                    "query_id TEXT PRIMARY KEY, now TEXT NOT NULL, inputs TEXT NOT NULL, "
                    "outputs TEXT NOT NULL, trace TEXT NOT NULL, duration_ms REAL NOT NULL, "
                    "logged_at TEXT NOT NULL)"
                )
            finally:
                conn.close()
        except (OSError, sqlite3.Error) as exc:
            raise QueryLogError(f"cannot open query log {self.name!r}: {exc}") from exc
        self._insert = (
            f'INSERT OR IGNORE INTO "{self.table}" ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)'
        )
        self._select = f'SELECT {_COLUMNS} FROM "{self.table}"'

    def scrub(self, text: str) -> str:
        return text

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout=5000")
        return conn

    def write_batch(self, rows: Sequence[_Row]) -> None:
        if self._writer is None:
            conn = self._connect()
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")  # fsync the WAL on every commit
            self._writer = conn
        conn = self._writer
        params = [
            (
                row.query_id,
                row.now.isoformat(),
                row.inputs,
                row.outputs,
                row.trace,
                row.duration_ms,
                row.logged_at.isoformat(),
            )
            for row in rows
        ]
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(self._insert, params)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error:
            self.close_writer()  # reopen on the next batch
            raise

    def close_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _read(self, sql: str, params: tuple[Any, ...]) -> list[_Row]:
        with self._read_lock:
            try:
                if self._reader is None:
                    self._reader = self._connect()
                    self._reader.execute("PRAGMA query_only=ON")
                fetched = self._reader.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                self._close_reader()
                raise QueryLogError(f"cannot read query log {self.name!r}: {exc}") from exc
        return [
            _Row(
                query_id=query_id,
                now=datetime.fromisoformat(now),
                inputs=inputs,
                outputs=outputs,
                trace=trace,
                duration_ms=duration_ms,
                logged_at=datetime.fromisoformat(logged_at),
            )
            for query_id, now, inputs, outputs, trace, duration_ms, logged_at in fetched
        ]

    def fetch_one(self, query_id: str) -> _Row | None:
        rows = self._read(f"{self._select} WHERE query_id = ?", (query_id,))
        return rows[0] if rows else None

    def fetch_recent(self, limit: int) -> list[_Row]:
        # rowid grows with every insert and the writer is the only one: append order
        return self._read(f"{self._select} ORDER BY rowid DESC LIMIT ?", (limit,))

    def _close_reader(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def close_readers(self) -> None:
        with self._read_lock:
            self._close_reader()
