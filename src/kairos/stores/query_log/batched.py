"""`BatchedQueryLog`: `append` queues an encoded record; one writer thread per log commits
what arrived every `max_wait`, one transaction per batch, into a backend."""

from __future__ import annotations

import asyncio
import atexit
import collections
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from kairos.errors import KairosError
from kairos.stores.query_log.base import DEFAULT_TABLE, Search, _Backend
from kairos.stores.query_log.postgres import _PostgresBackend
from kairos.stores.query_log.records import (
    LoggedQuery,
    QueryLogError,
    _decode_record,
    _encode_record,
    _Row,
    collector_paused,
)
from kairos.stores.query_log.sqlite import _SQLiteBackend

logger = logging.getLogger(__name__)


@dataclass(eq=False, slots=True)
class _FlushMarker:
    done: threading.Event


@dataclass(eq=False, slots=True)
class _Later:
    """Records the writer builds and encodes itself (`append_later`)."""

    build: Callable[[], Sequence[LoggedQuery]]
    count: int


_STOP: Final = object()
_YIELD: Final = 0.00005  # seconds the writer pauses every 8 records it builds


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
        self._backlog = 0  # records queued, built or not (the writer takes them off)
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
        row = self._encode(record)
        if row is None:
            return
        if self._backlog >= self._max_queue and not self._wait_for_room():
            self._drop(f"its queue is full ({self._max_queue} records)")
            return
        self._queue(row, 1)

    async def append_later(self, build: Callable[[], Sequence[LoggedQuery]], count: int) -> None:
        """Queue `count` records that the writer thread builds (`build()`) and encodes, so
        a query answers without spending that time. While the queue is full it waits for the
        writer (the query waits, the event loop does not): backpressure, not a dropped
        record. `build` must only read values no one changes afterwards."""
        if self._closed:
            for _ in range(count):
                self._drop("the log is closed")
            return
        await self._room()
        self._queue(_Later(build, count), count)

    async def _room(self) -> None:
        while self._backlog >= self._max_queue and self._writer.is_alive():
            self._wake.set()
            await asyncio.sleep(0.001)

    def _queue(self, item: object, count: int) -> None:
        with self._state_lock:
            if not self._closed:
                self._backlog += count
                self._pending.append(item)  # before close() queues its stop: written
                return
        for _ in range(count):  # closed while this waited for room
            self._drop("the log was closed while the record waited for room")

    def _encode(self, record: LoggedQuery) -> _Row | None:
        # Encode now (~10 us): the record is then exactly what the query saw, whatever the
        # caller does with its values later, and the writer never holds the GIL for long.
        unkept: set[str] = set()
        try:
            row = _encode_record(record, unkept)
        except Exception as exc:  # a bad record is counted, never raised into the query
            with self._state_lock:
                self._lose(1, f"record {getattr(record, 'query_id', None)!r}: {exc}")
            return None
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
        return row

    def _wait_for_room(self) -> bool:
        deadline = time.monotonic() + self._put_timeout
        while time.monotonic() < deadline:
            self._wake.set()
            time.sleep(0.001)
            if self._backlog < self._max_queue:
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

    def get_many(self, query_ids: Sequence[str]) -> dict[str, LoggedQuery]:
        self._check_open()
        self.flush()
        wanted = list(dict.fromkeys(query_ids))
        found: dict[str, LoggedQuery] = {}
        with collector_paused(len(wanted) >= 1000):
            for start in range(0, len(wanted), 500):  # SQLite binds at most 32766 values
                for row in self._backend.fetch_many(wanted[start : start + 500]):
                    found[row.query_id] = _decode_record(row)
        return found

    def recent(self, limit: int = 20, *, nested: bool = True) -> list[LoggedQuery]:
        self._check_open()
        self.flush()
        rows = self._backend.fetch_recent(limit)
        with collector_paused(len(rows) >= 1000):
            return [_decode_record(row, nested) for row in rows]

    def search(self, search: Search) -> list[LoggedQuery]:
        self._check_open()
        self.flush()
        plans = None
        if search.feature is not None or search.model is not None:
            plans = [f for f, p in self._backend.fetch_plans().items() if search.matches_plan(p)]
            if not plans:
                return []
        with collector_paused(search.limit >= 1000):
            if plans is not None and len(plans) > 1 and not search.entity:
                # one indexed range per plan (plan, now), merged: an IN list of plans would
                # have the database sort every matching record
                rows = [r for plan in plans for r in self._backend.fetch_search(search, [plan])]
                rows.sort(key=lambda r: (r.now, r.query_id), reverse=True)
                rows = rows[: search.limit]
            else:
                rows = self._backend.fetch_search(search, plans)
            return [_decode_record(row) for row in rows]

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
        self._pending.append(_STOP)  # after every record `_queue` took while the log was open
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
                taken = 0
                for item in items:
                    if isinstance(item, _Row):
                        records.append(item)
                        taken += 1
                    elif isinstance(item, _Later):
                        self._build(item, records)
                        taken += item.count
                    elif isinstance(item, _FlushMarker):
                        markers.append(item)
                    else:
                        stopping = True  # appends that raced close() are written too
                with self._state_lock:
                    self._backlog -= taken
                for start in range(0, len(records), self._max_batch):
                    self._write(records[start : start + self._max_batch])
                for marker in markers:
                    marker.done.set()
        finally:
            self._backend.close_writer()

    def _build(self, later: _Later, rows: list[_Row]) -> None:
        """Build and encode records queued by `append_later`, letting the query threads run
        every few records (this thread holds the GIL while it encodes)."""
        try:
            with collector_paused(later.count >= 1000):
                records = later.build()
        except Exception as exc:  # a bug building records: counted, never raised
            with self._state_lock:
                self._lose(later.count, f"building {later.count} records: {exc!r}")
            return
        for index, record in enumerate(records):
            row = self._encode(record)
            if row is not None:
                rows.append(row)
            if index % 8 == 7:
                # a real sleep, however short, hands the GIL to a waiting query thread;
                # sleep(0) would take it straight back (the query waits out the 5 ms switch)
                time.sleep(_YIELD)

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
                    error = f"{type(exc).__name__}: {self._backend.scrub(str(exc).strip())}"
                    with self._state_lock:
                        self._lose(len(rows), error)
                    return
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            else:
                self.batches_written += 1
                self.records_written += len(rows)
                return

    def _lose(self, count: int, error: str) -> None:
        """Count records that could not be kept (call with `_state_lock` held)."""
        self.lost += count
        self._last_error = error
        logger.warning("query log %s could not write %d records: %s", self.name, count, error)
