"""The query log: every online query appended, so the exact inputs and outputs of any past
decision can be read back (and replayed against a new model or prompt).

`append` is on the query's hot path, so it only encodes the record and puts it on a bounded
queue; one writer thread per log takes the records off every `max_wait` (20 ms) and commits
each batch in one transaction. A kill loses what was not yet committed (the last ~20 ms of
queries, or the backlog if the database stalls) and never leaves a half-written row; `flush`
and `get` return only after everything appended before them is committed.

    >>> log = query_log_from_url("sqlite:///.kairos/query_log.db")
    >>> log.append(record)                      # cheap, never raises
    >>> log.get(record.query_id).outputs["user.risk"].value
    0.12
    >>> log.close()                             # flushes; also done at interpreter exit

Records and their encoding live in `kairos.stores.query_log_records`.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import logging
import math
import re
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from kairos.errors import KairosError
from kairos.stores.query_log_records import (
    LoggedQuery,
    LoggedValue,
    QueryLogError,
    _decode_record,
    _encode_record,
    _Row,
)

__all__ = [
    "DEFAULT_TABLE",
    "BatchedQueryLog",
    "LoggedQuery",
    "LoggedValue",
    "NullQueryLog",
    "QueryLog",
    "QueryLogError",
    "query_log_from_url",
    "redact_text",
    "redact_url",
]

if TYPE_CHECKING:
    import psycopg

logger = logging.getLogger(__name__)

DEFAULT_TABLE: Final = "kairos_query_log"


class QueryLog(Protocol):
    """Where online queries are appended and read back."""

    @property
    def dropped(self) -> int:
        """Records given to `append` that were not queued (queue full, or log closed)."""
        ...

    def append(self, record: LoggedQuery) -> None:
        """Queue one record; cheap, never blocks on I/O and never raises."""
        ...

    def flush(self, timeout: float = 10.0) -> None:
        """Return once every record appended before this call is committed durably."""
        ...

    def get(self, query_id: str) -> LoggedQuery | None:
        """The record of one query (pending writes are flushed first), or None."""
        ...

    def recent(self, limit: int = 20) -> list[LoggedQuery]:
        """The newest records first."""
        ...

    def close(self) -> None:
        """Flush, then stop the writer. Safe to call twice."""
        ...

    async def aflush(self, timeout: float = 10.0) -> None: ...

    async def aget(self, query_id: str) -> LoggedQuery | None: ...

    async def arecent(self, limit: int = 20) -> list[LoggedQuery]: ...


# --- encoding -----------------------------------------------------------------------------


_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,47}")


def _check_name(kind: str, name: str) -> str:
    if not _TABLE_NAME.fullmatch(name):
        raise KairosError(
            f"query log {kind} name {name!r} is not allowed; use letters, digits and '_' "
            "(at most 48, not starting with a digit), e.g. 'kairos_query_log'"
        )
    return name


class _Backend(Protocol):
    """Storage for `BatchedQueryLog`. `write_batch` and `close_writer` are only called from
    the writer thread; the read methods from any thread."""

    name: str  # for messages; never holds a password

    def scrub(self, text: str) -> str:
        """`text` (an error message) with any secret of the connection masked."""
        ...

    def write_batch(self, rows: Sequence[_Row]) -> None: ...

    def close_writer(self) -> None: ...

    def fetch_one(self, query_id: str) -> _Row | None: ...

    def fetch_recent(self, limit: int) -> list[_Row]: ...

    def close_readers(self) -> None: ...


_COLUMNS: Final = "query_id, now, inputs, outputs, trace, duration_ms, logged_at"


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


class _PostgresBackend:
    """A PostgreSQL table, written with psycopg 3 from the writer thread. Each batch is one
    transaction with synchronous_commit on (a commit has reached the server's WAL on disk).
    The structured columns are `json` (kept verbatim; `jsonb` would reorder dict keys and
    turn -0.0 into 0), so SQL can still look inside: `inputs->>'user.id'`."""

    def __init__(self, conninfo: str, table: str = DEFAULT_TABLE, schema: str | None = None):
        from psycopg import sql

        self._conninfo = conninfo
        self.name = redact_url(conninfo)
        self._password = _password_of(conninfo)
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
        return redact_text(text, self._password)

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        import psycopg

        conn = psycopg.connect(self._conninfo, autocommit=True, connect_timeout=10)
        conn.execute("SET TIME ZONE 'UTC'")
        conn.execute("SET synchronous_commit TO on")  # flush() promises durable commits
        return conn

    def write_batch(self, rows: Sequence[_Row]) -> None:
        import psycopg

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
        except psycopg.Error:
            self.close_writer()  # reconnect on the next batch
            raise

    def close_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _read(self, where: str, params: tuple[Any, ...]) -> list[_Row]:
        import psycopg
        from psycopg import sql

        with self._read_lock:
            try:
                if self._reader is None or self._reader.closed:
                    self._reader = self._connect()
                fetched = self._reader.execute(
                    sql.Composed([self._select, sql.SQL(where)]), params
                ).fetchall()
            except psycopg.Error as exc:
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


# --- the batched log ---------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class _FlushMarker:
    done: threading.Event


_STOP: Final = object()


class BatchedQueryLog:
    """A query log with one background writer thread.

    The writer takes up to `max_batch` records, waiting at most `max_wait` seconds after the
    first, and commits them in one transaction. When `max_queue` records are waiting, `append`
    waits at most `put_timeout` seconds (default 0: an event loop must not stall), then drops
    the record, counts it in `dropped` and logs a warning. A batch that cannot be written is
    retried for `retry_for` seconds, then counted in `lost`.

        >>> log = BatchedQueryLog.sqlite(".kairos/query_log.db")
        >>> log.append(record); log.get(record.query_id) == record
        True
    """

    def __init__(
        self,
        backend: _Backend,
        *,
        max_batch: int = 500,
        max_wait: float = 0.02,
        max_queue: int = 10_000,
        put_timeout: float = 0.0,
        retry_for: float = 5.0,
    ) -> None:
        if max_batch < 1 or max_queue < 1 or max_wait < 0 or put_timeout < 0 or retry_for < 0:
            backend.close_readers()
            raise KairosError(
                f"query log settings max_batch={max_batch!r}, max_queue={max_queue!r} must be "
                f">= 1 and max_wait={max_wait!r}, put_timeout={put_timeout!r}, "
                f"retry_for={retry_for!r} must be >= 0"
            )
        self._backend = backend
        self.name = backend.name
        self._max_batch = max_batch
        self._max_wait = max_wait
        self._put_timeout = put_timeout
        self._retry_for = retry_for
        # A deque, not a queue.Queue: appending takes no lock and wakes no thread; the writer
        # drains it every max_wait (or at once when flush() or close() set _wake).
        self._pending: collections.deque[object] = collections.deque()
        self._max_queue = max_queue
        self._wake = threading.Event()
        self._closed = False
        self._state_lock = threading.Lock()
        self._dropped = 0
        self._last_drop_warning = -math.inf
        self.batches_written = 0  # transactions committed (writer thread only)
        self.records_written = 0
        self.lost = 0  # records taken by the writer that could not be written
        self._last_error = ""
        self._warned_unkept: set[str] = set()
        self._writer = threading.Thread(
            target=self._run, name="kairos-query-log-writer", daemon=True
        )
        self._writer.start()
        atexit.register(self.close)  # daemon writer: flush before the interpreter exits

    @classmethod
    def sqlite(
        cls, path: str | Path, *, table: str = DEFAULT_TABLE, **settings: Any
    ) -> BatchedQueryLog:
        """A log in a SQLite file (parent folders are created)."""
        return cls(_SQLiteBackend(path, table), **settings)

    @classmethod
    def postgres(
        cls,
        conninfo: str,
        *,
        table: str = DEFAULT_TABLE,
        schema: str | None = None,
        **settings: Any,
    ) -> BatchedQueryLog:
        """A log in a PostgreSQL table (and schema), created if missing."""
        return cls(_PostgresBackend(conninfo, table, schema), **settings)

    @property
    def dropped(self) -> int:
        return self._dropped

    def append(self, record: LoggedQuery) -> None:
        if self._closed:
            self._drop("the log is closed")
            return
        # Encode now (~10 us): the record is then exactly what the query saw, whatever the
        # caller does with its values later, and the writer never holds the GIL for long.
        unkept: set[str] = set()
        try:
            row = _encode_record(record, unkept)
        except Exception as exc:  # a bad record is counted, never raised into the query
            with self._state_lock:
                self._lose(1, f"record {getattr(record, 'query_id', None)!r}: {exc}")
            return
        if unkept - self._warned_unkept:
            with self._state_lock:
                self._warned_unkept |= unkept
            logger.warning(
                "query log %s stores values of type %s as their repr (the codec cannot keep "
                "them exactly), first in query %r",
                self.name,
                ", ".join(sorted(unkept)),
                record.query_id,
            )
        if len(self._pending) >= self._max_queue and not self._wait_for_room():
            self._drop(f"its queue is full ({self._max_queue} records)")
            return
        self._pending.append(row)

    def _wait_for_room(self) -> bool:
        deadline = time.monotonic() + self._put_timeout
        while time.monotonic() < deadline:
            self._wake.set()
            time.sleep(0.001)
            if len(self._pending) < self._max_queue:
                return True
        return False

    def _drop(self, why: str) -> None:
        with self._state_lock:
            self._dropped += 1
            now = time.monotonic()
            if now - self._last_drop_warning < 10.0:  # one warning per 10 s, not per record
                return
            self._last_drop_warning = now
            dropped = self._dropped
        logger.warning(
            "query log %s dropped a record because %s; %d dropped so far. Raise max_queue or "
            "put_timeout, or check that the log's database keeps up.",
            self.name,
            why,
            dropped,
        )

    def flush(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        lost_before = self.lost
        marker = _FlushMarker(threading.Event())
        if self._writer.is_alive():
            self._pending.append(marker)
            self._wake.set()
        else:
            marker.done.set()  # closed: nothing is pending
        while not marker.done.wait(min(0.1, max(0.0, deadline - time.monotonic()))):
            if not self._writer.is_alive():
                break  # close() ran meanwhile; it wrote what was queued before it
            if time.monotonic() >= deadline:
                raise QueryLogError(
                    f"query log {self.name!r} did not finish writing within {timeout}s; "
                    "check that its database is reachable, or flush with a longer timeout"
                )
        if self.lost > lost_before:
            raise QueryLogError(
                f"query log {self.name!r} could not write {self.lost - lost_before} records "
                f"({self._last_error}); check that its database is reachable and writable"
            )

    def get(self, query_id: str) -> LoggedQuery | None:
        self._check_open()
        self.flush()
        row = self._backend.fetch_one(query_id)
        return None if row is None else _decode_record(row)

    def recent(self, limit: int = 20) -> list[LoggedQuery]:
        self._check_open()
        self.flush()
        return [_decode_record(row) for row in self._backend.fetch_recent(limit)]

    async def aflush(self, timeout: float = 10.0) -> None:
        await asyncio.to_thread(self.flush, timeout)

    async def aget(self, query_id: str) -> LoggedQuery | None:
        return await asyncio.to_thread(self.get, query_id)

    async def arecent(self, limit: int = 20) -> list[LoggedQuery]:
        return await asyncio.to_thread(self.recent, limit)

    def _check_open(self) -> None:
        if self._closed:
            raise QueryLogError(f"query log {self.name!r} is closed; open it again to read")

    def close(self, timeout: float = 10.0) -> None:
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self.close)
        self._pending.append(_STOP)
        self._wake.set()
        self._writer.join(timeout)
        if self._writer.is_alive():
            logger.warning(
                "query log %s: the writer did not finish within %ss; pending records are lost",
                self.name,
                timeout,
            )
        self._backend.close_readers()

    def __enter__(self) -> BatchedQueryLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- writer thread --

    def _run(self) -> None:
        stopping = False
        try:
            while not stopping:
                # A batch is whatever arrived in the last max_wait; flush() and close() cut
                # the wait short. Idle, this wakes max_wait-ly and finds nothing.
                self._wake.wait(self._max_wait)
                self._wake.clear()
                items = self._take_all()
                if not items:
                    continue
                records: list[_Row] = []
                markers: list[_FlushMarker] = []
                for item in items:
                    if isinstance(item, _Row):
                        records.append(item)
                    elif isinstance(item, _FlushMarker):
                        markers.append(item)
                    else:
                        stopping = True  # appends that raced close() are written too
                for start in range(0, len(records), self._max_batch):
                    self._write(records[start : start + self._max_batch])
                for marker in markers:
                    marker.done.set()
        finally:
            self._backend.close_writer()

    def _take_all(self) -> list[object]:
        items: list[object] = []
        pending = self._pending
        while pending:
            items.append(pending.popleft())
        return items

    def _write(self, rows: Sequence[_Row]) -> None:
        if not rows:
            return
        delay, give_up = 0.05, time.monotonic() + self._retry_for
        while True:
            try:
                self._backend.write_batch(rows)
            except Exception as exc:
                if time.monotonic() + delay > give_up:
                    self._lose(
                        len(rows), f"{type(exc).__name__}: {self._backend.scrub(str(exc).strip())}"
                    )
                    return
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            else:
                self.batches_written += 1
                self.records_written += len(rows)
                return

    def _lose(self, count: int, error: str) -> None:
        self.lost += count
        self._last_error = error
        logger.warning("query log %s could not write %d records: %s", self.name, count, error)


class NullQueryLog:
    """A log that keeps nothing (`none://`), for benchmarks."""

    name = "none://"
    batches_written = 0

    @property
    def dropped(self) -> int:
        return 0

    def append(self, record: LoggedQuery) -> None:
        return None

    def flush(self, timeout: float = 10.0) -> None:
        return None

    def get(self, query_id: str) -> LoggedQuery | None:
        return None

    def recent(self, limit: int = 20) -> list[LoggedQuery]:
        return []

    def close(self) -> None:
        return None

    async def aflush(self, timeout: float = 10.0) -> None:
        return None

    async def aget(self, query_id: str) -> LoggedQuery | None:
        return None

    async def arecent(self, limit: int = 20) -> list[LoggedQuery]:
        return []


# --- URLs ------------------------------------------------------------------------------------

_EXAMPLES: Final = (
    "'sqlite:///.kairos/query_log.db', 'postgresql://user@host:5432/db?table=kairos_query_log' "
    "or 'none://'"
)


_PASSWORD_SETTING = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]*)", re.IGNORECASE)


def redact_url(url: str) -> str:
    """`url` (or a `key=value` conninfo) with any password replaced by '***', safe to show.

    >>> redact_url("postgresql://kairos:s3cret@db:5432/prod")
    'postgresql://kairos:***@db:5432/prod'
    """
    shown = _PASSWORD_SETTING.sub(r"\1***", url)  # ?password=... and conninfo strings
    try:
        parts = urllib.parse.urlsplit(shown)
        if parts.password is None:
            return shown
        host = parts.netloc.rpartition("@")[2]
        return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))
    except ValueError:  # unparsable: show only the scheme
        return url.partition("://")[0] + "://***"


def _password_of(conninfo: str) -> str | None:
    match = _PASSWORD_SETTING.search(conninfo)
    if match and match.group(2):
        return match.group(2).strip("'")
    try:
        password = urllib.parse.urlsplit(conninfo).password
    except ValueError:
        return None
    return urllib.parse.unquote(password) if password else None


def redact_text(text: str, password: str | None) -> str:
    """`text` with `password` (raw or URL-quoted) masked."""
    if not password:
        return text
    for secret in {password, urllib.parse.quote(password, safe="")}:
        text = text.replace(secret, "***")
    return text


def query_log_from_url(url: str, **settings: Any) -> QueryLog:
    """Open the query log a URL names; `settings` go to `BatchedQueryLog` (max_batch, ...).

    >>> query_log_from_url("sqlite:///.kairos/query_log.db")        # relative path
    >>> query_log_from_url("sqlite:////var/lib/kairos/log.db")      # absolute path
    >>> query_log_from_url("postgresql://kairos@db:5432/prod?table=query_log&schema=ml")
    >>> query_log_from_url("none://")                               # keeps nothing
    """
    shown = redact_url(url)
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise KairosError(f"query log URL {shown!r} has no scheme; use {_EXAMPLES}")
    if scheme == "none":
        return NullQueryLog()
    if scheme == "sqlite":
        path, _, query = rest.partition("?")
        table = _url_options(shown, query, {"table"}).get("table", DEFAULT_TABLE)
        if not path.startswith("/") or path in ("/", "/:memory:"):
            raise KairosError(
                f"query log URL {shown!r} needs a file path, which readers in other processes "
                "can open too: 'sqlite:///relative/log.db' or 'sqlite:////absolute/log.db'"
            )
        return BatchedQueryLog.sqlite(path[1:], table=table, **settings)
    if scheme in ("postgresql", "postgres"):
        parts = urllib.parse.urlsplit(url)
        params = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        ours = {key: value for key, value in params if key in ("table", "schema")}
        conninfo = urllib.parse.urlunsplit(
            parts._replace(
                query=urllib.parse.urlencode([(k, v) for k, v in params if k not in ours])
            )
        )
        return BatchedQueryLog.postgres(
            conninfo,
            table=ours.get("table", DEFAULT_TABLE),
            schema=ours.get("schema"),
            **settings,
        )
    raise KairosError(
        f"query log URL scheme {scheme!r} (in {shown!r}) is not supported; use {_EXAMPLES}"
    )


def _url_options(shown: str, query: str, allowed: set[str]) -> dict[str, str]:
    options = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise KairosError(
            f"query log URL {shown!r} has unknown option {unknown[0]!r}; "
            f"supported: {', '.join(sorted(allowed))}"
        )
    return options
