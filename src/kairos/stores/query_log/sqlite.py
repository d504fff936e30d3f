"""The query log's SQLite backend: one file in WAL mode, fsynced on every commit."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from kairos.stores.query_log.base import _COLUMNS, DEFAULT_TABLE, Search, _check_name
from kairos.stores.query_log.records import PlanInfo, QueryLogError, _Row


def _text(moment: datetime) -> str:
    """A time as the log stores it: ISO text in UTC, so text order is time order."""
    return moment.astimezone(UTC).isoformat()


_WIDTH = 11  # values of a record's VALUES row: its columns and its keys
_ROW_MARKS = "(" + ", ".join("?" * _WIDTH) + ")"
_ROWS_PER_INSERT = 512  # 5,632 bound values, far below SQLite's 32,766


def _from_json(width: int) -> str:
    """`SELECT` of the rows of a JSON array of `width`-wide arrays, in order."""
    columns = ", ".join(f"json_extract(value, '$[{i}]')" for i in range(width))
    return f"SELECT {columns} FROM json_each(?) ORDER BY key"


# Columns added after the first release, with what older rows read as.
_ADDED = {"feature_values": "'{}'", "calls": "'{}'", "plan": "NULL"}


class _SQLiteBackend:
    """A SQLite file in WAL mode with synchronous=FULL: a committed batch is fsynced, so it
    survives a process kill and a power loss; readers (another process too) never block the
    writer. Each batch is one transaction, so a record is either whole or absent.

    Beside the records: `<table>_keys` (an entity key of a record's inputs, its `now` and
    its query id; the index search reads) and `<table>_plans` (each plan once)."""

    def __init__(self, path: str | Path, table: str = DEFAULT_TABLE) -> None:
        self.path = Path(path)
        self.table = _check_name("table", table)
        keys, plans = f"{self.table}_keys", f"{self.table}_plans"
        self.name = f"sqlite:///{self.path}"
        self._writer: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        self._read_lock = threading.Lock()
        self._plans: dict[str, PlanInfo] = {}  # read side: every plan seen
        self._written_plans: set[str] = set()  # write side: plans already stored
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = self._connect()
            try:
                conn.execute("PRAGMA journal_mode=WAL")  # persistent: stored in the file
                # one transaction: two processes opening an older log do not both migrate
                # it, and a crash leaves it old or migrated (keys indexed), nothing between
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(
                    f'CREATE TABLE IF NOT EXISTS "{self.table}" ('
                    "query_id TEXT PRIMARY KEY, now TEXT NOT NULL, inputs TEXT NOT NULL, "
                    "outputs TEXT NOT NULL, trace TEXT NOT NULL, duration_ms REAL NOT NULL, "
                    "logged_at TEXT NOT NULL)"
                )
                have = {row[1] for row in conn.execute(f'PRAGMA table_info("{self.table}")')}
                older = "feature_values" not in have  # written before decision records
                for column, default in _ADDED.items():
                    if column not in have:  # a log written by an older kairos: rows kept
                        conn.execute(
                            f'ALTER TABLE "{self.table}" ADD COLUMN {column} TEXT '
                            + ("" if default == "NULL" else f"NOT NULL DEFAULT {default}")
                        )
                # (now, query_id): the order searches answer in, so a page read after
                # another (`before`) starts where it ended, ties on `now` too (a bulk
                # query's decisions share one); they replace older logs' (now) and (plan, now)
                for index, columns in (
                    ("now_id", "now, query_id"),
                    ("plan_id", "plan, now, query_id"),
                ):
                    conn.execute(
                        f'CREATE INDEX IF NOT EXISTS "{self.table}_{index}" ON "{self.table}" '
                        f"({columns})"
                    )
                conn.execute(f'DROP INDEX IF EXISTS "{self.table}_now"')
                conn.execute(f'DROP INDEX IF EXISTS "{self.table}_plan"')
                conn.execute(
                    f'CREATE TABLE IF NOT EXISTS "{keys}" (name TEXT NOT NULL, '
                    "value TEXT NOT NULL, now TEXT NOT NULL, query_id TEXT NOT NULL, "
                    "PRIMARY KEY (name, value, now, query_id)) WITHOUT ROWID"
                )
                conn.execute(
                    f'CREATE TABLE IF NOT EXISTS "{plans}" (plan TEXT PRIMARY KEY, '
                    "info TEXT NOT NULL)"
                )
                if older:  # the older rows' entity keys, so search by entity finds them too
                    conn.execute(
                        f'INSERT OR IGNORE INTO "{keys}" SELECT j.key, CAST(j.value AS TEXT), '
                        f'l.now, l.query_id FROM "{self.table}" l, json_each(l.inputs) j '
                        "WHERE j.type IN ('text', 'integer')"
                    )
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            finally:
                conn.close()
        except (OSError, sqlite3.Error) as exc:
            raise QueryLogError(f"cannot open query log {self.name!r}: {exc}") from exc
        # A batch is one statement (so one transaction): its records, as many VALUES rows,
        # into a TEMP view of the writer's connection whose trigger writes each record and
        # its keys. Every statement hands the GIL to the serving thread and waits (~5 ms
        # under load) to get it back, so executemany (a statement per row) inside
        # BEGIN/COMMIT kept records uncommitted for tens of ms. The row count is rounded up
        # to a power of two with rows of NULLs the trigger skips, so a few statements are
        # prepared once (preparing one is a hand-off too). Nothing is added to the file.
        batch = f"{self.table}_batch"
        self._batch_view = (
            f'CREATE TEMP VIEW IF NOT EXISTS "{batch}" AS SELECT {_COLUMNS}, feature_values, '
            f"calls, plan, '[]' AS keys FROM \"{self.table}\" WHERE 0"
        )
        self._batch_trigger = (
            f'CREATE TEMP TRIGGER IF NOT EXISTS "{batch}_insert" INSTEAD OF INSERT ON "{batch}" '
            "WHEN NEW.query_id IS NOT NULL "
            f"BEGIN INSERT OR IGNORE INTO \"{keys}\" SELECT json_extract(value, '$[0]'), "
            "json_extract(value, '$[1]'), NEW.now, NEW.query_id FROM json_each(NEW.keys); "
            f'INSERT OR IGNORE INTO "{self.table}" ({_COLUMNS}, feature_values, calls, plan) '
            "VALUES (NEW.query_id, NEW.now, NEW.inputs, NEW.outputs, NEW.trace, "
            "NEW.duration_ms, NEW.logged_at, NEW.feature_values, NEW.calls, NEW.plan); END"
        )
        self._insert = f'INSERT INTO "{batch}" VALUES '
        self._insert_plans = f'INSERT OR IGNORE INTO "{plans}" ' + _from_json(2)
        self._select_plans = f'SELECT plan, info FROM "{plans}"'
        self._keys = keys
        self._select = (
            f"SELECT l.query_id, l.now, l.inputs, l.outputs, l.trace, l.duration_ms, "
            f'l.logged_at, l.feature_values, l.calls, l.plan FROM "{self.table}" l'
        )

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
            conn.execute(self._batch_view)
            conn.execute(self._batch_trigger)
            self._writer = conn
        conn = self._writer
        records: list[tuple[Any, ...]] = []
        plans: dict[str, PlanInfo] = {}
        for row in rows:
            now = _text(row.now)
            plan = row.plan
            if plan is not None and plan.fingerprint not in self._written_plans:
                plans[plan.fingerprint] = plan
            records.append(
                (
                    row.query_id,
                    now,
                    row.inputs,
                    row.outputs,
                    row.trace,
                    row.duration_ms,
                    _text(row.logged_at),
                    row.values,
                    row.calls,
                    None if plan is None else plan.fingerprint,
                    orjson.dumps(row.keys).decode(),
                )
            )
        try:
            if plans:  # a plan's first batch; stored before any record names it
                stored = [(f, orjson.dumps(p.to_dict()).decode()) for f, p in plans.items()]
                conn.execute(self._insert_plans, (orjson.dumps(stored),))
            for start in range(0, len(records), _ROWS_PER_INSERT):
                chunk = records[start : start + _ROWS_PER_INSERT]
                size = 1 << (len(chunk) - 1).bit_length()  # a power of two: a few statements
                marks = ", ".join([_ROW_MARKS] * size)
                values = [v for row in chunk for v in row]
                values += [None] * (_WIDTH * (size - len(chunk)))
                conn.execute(self._insert + marks, values)
        except sqlite3.Error:
            self.close_writer()  # reopen on the next batch
            raise
        self._written_plans.update(plans)

    def close_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _reading(self) -> sqlite3.Connection:
        if self._reader is None:
            self._reader = self._connect()
            self._reader.execute("PRAGMA query_only=ON")
        return self._reader

    def _read(self, sql: str, params: Sequence[Any]) -> list[_Row]:
        with self._read_lock:
            try:
                fetched = self._reading().execute(sql, tuple(params)).fetchall()
                wanted = {row[9] for row in fetched if row[9] is not None}
                if wanted - self._plans.keys():
                    self._load_plans()
            except sqlite3.Error as exc:
                self._close_reader()
                raise QueryLogError(f"cannot read query log {self.name!r}: {exc}") from exc
        try:
            return self._rows(fetched)
        except (ValueError, TypeError) as exc:  # a row not written by this log
            raise QueryLogError(
                f"query log {self.name!r} holds a row that cannot be read ({exc}); "
                "was the table written by something else?"
            ) from None

    def _rows(self, fetched: list[Any]) -> list[_Row]:
        return [
            _Row(
                query_id=query_id,
                now=datetime.fromisoformat(now),
                inputs=inputs,
                outputs=outputs,
                trace=trace,
                duration_ms=duration_ms,
                logged_at=datetime.fromisoformat(logged_at),
                values=values,
                calls=calls,
                plan=None if plan is None else self._plans.get(plan),
            )
            for (
                query_id,
                now,
                inputs,
                outputs,
                trace,
                duration_ms,
                logged_at,
                values,
                calls,
                plan,
            ) in fetched
        ]

    def _load_plans(self) -> None:
        for plan, info in self._reading().execute(self._select_plans).fetchall():
            found = PlanInfo.stored(info)
            if found is not None:
                self._plans[plan] = found

    def fetch_plans(self) -> dict[str, PlanInfo]:
        with self._read_lock:
            try:
                self._load_plans()
            except sqlite3.Error as exc:
                self._close_reader()
                raise QueryLogError(f"cannot read query log {self.name!r}: {exc}") from exc
            return dict(self._plans)

    def fetch_one(self, query_id: str) -> _Row | None:
        rows = self._read(f"{self._select} WHERE l.query_id = ?", (query_id,))
        return rows[0] if rows else None

    def fetch_many(self, query_ids: Sequence[str]) -> list[_Row]:
        marks = ", ".join("?" * len(query_ids))
        return self._read(f"{self._select} WHERE l.query_id IN ({marks})", query_ids)

    def fetch_recent(self, limit: int) -> list[_Row]:
        # rowid grows with every insert and the writer is the only one: append order
        return self._read(f"{self._select} ORDER BY l.rowid DESC LIMIT ?", (limit,))

    def fetch_search(self, search: Search, plans: Sequence[str] | None) -> list[_Row]:
        """Newest first. With an entity key the keys index finds the records (one range of
        it per entity); else the `now` (or `plan, now`) index."""
        where: list[str] = []
        params: list[Any] = []
        since = None if search.since is None else _text(search.since)
        until = None if search.until is None else _text(search.until)
        if search.entity:
            (name, value), *others = search.entity
            sql = f'{self._select} JOIN "{self._keys}" k ON k.query_id = l.query_id'
            where.append("k.name = ? AND k.value = ?")
            params += [name, value]
            order = "k.now"
            for other_name, other_value in others:
                where.append(
                    f'l.query_id IN (SELECT query_id FROM "{self._keys}" '
                    "WHERE name = ? AND value = ?)"
                )
                params += [other_name, other_value]
        else:
            sql, order = self._select, "l.now"
        if since is not None:
            where.append(f"{order} >= ?")
            params.append(since)
        if until is not None:
            where.append(f"{order} < ?")
            params.append(until)
        if search.before is not None:  # the page after the one that ended there
            at, query_id = search.before
            where.append(f"({order}, l.query_id) < (?, ?)")  # a range of the index
            params += [_text(at), query_id]
        if plans is not None:
            where.append(f"l.plan IN ({', '.join('?' * len(plans))})")
            params += plans
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY {order} DESC, l.query_id DESC LIMIT ?"
        params.append(search.limit)
        return self._read(sql, params)

    def _close_reader(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def close_readers(self) -> None:
        with self._read_lock:
            self._close_reader()
