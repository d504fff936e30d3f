"""`BatchedQueryLog`: `append` queues an encoded record; one writer thread per log commits
what arrived, one transaction per batch, into a backend.

How long an acknowledged decision can be lost to a `kill -9` is the time from its query's
answer to its batch's commit. The writer keeps that short under load: a batch is due
`max_wait` after its *first* record arrived (not on a fixed tick that restarts after each
commit), a backend writes a batch in a handful of statements (each statement hands the GIL
to the busy event loop and waits up to the 5 ms switch interval to get it back, so a
statement per row cost ~5 ms a row under load), and while the log is more than `max_lag`
behind, queries wait before they answer (backpressure by age, as a full queue is by count).
With `durability="acknowledged"` a query answers only once its record is committed: the
writer takes whatever is queued as soon as it is free, so concurrent queries share a commit.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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

# `batched`: answered at once, committed within ~max_wait + a commit (a kill loses at most
# that, ~50 ms); `acknowledged`: answered once committed (a kill loses no answered decision)
DURABILITY: Final = ("batched", "acknowledged")


@dataclass(eq=False, slots=True)
class _FlushMarker:
    done: threading.Event


@dataclass(eq=False, slots=True)
class _Queued:
    """Records waiting for the writer: encoded (`rows`, from `append`) or to be built and
    encoded by the writer (`build`, from `append_later`), when they were queued, and for
    an acknowledged append the future its query waits on."""

    rows: Sequence[_Row] | None
    build: Callable[[], Sequence[LoggedQuery]] | None
    count: int
    queued_at: float
    waiter: asyncio.Future[None] | None = field(default=None)


_STOP: Final = object()
_YIELD: Final = 0.00005  # seconds the writer pauses every 8 records it builds
# how long into a batch the writer still pauses for queries while it builds; past that it
# builds straight through (the GIL's switch interval still gives queries a turn every 5 ms)
_YIELD_FOR: Final = 0.005
_IDLE: Final = 1.0  # seconds an idle writer sleeps between looks (a new record wakes it)


class BatchedQueryLog:
    """A query log with one background writer thread.

    A batch is due `max_wait` seconds after its first record arrived (`durability=
    "acknowledged"`: at once); the writer then commits up to `max_batch` records per
    transaction. While the oldest record not yet committed is more than `max_lag` seconds
    old, `append_later` waits before it returns (the query answers later, its record is not
    at risk for longer). When `max_queue` records are waiting, `append` waits at most
    `put_timeout` seconds (default 0: an event loop must not stall), then drops the record,
    counts it in `dropped` and logs a warning. A batch that cannot be written is retried
    for `retry_for` seconds, then counted in `lost` (an acknowledged query then fails).

        >>> log = BatchedQueryLog.sqlite(".kairos/query_log.db")
        >>> log.append(record); log.get(record.query_id) == record
        True
    """

    def __init__(
        self,
        backend: _Backend,
        *,
        max_batch: int = 500,
        max_wait: float = 0.005,
        max_lag: float = 0.025,
        max_queue: int = 10_000,
        put_timeout: float = 0.0,
        retry_for: float = 5.0,
        durability: str = "batched",
    ) -> None:
        if (
            max_batch < 1
            or max_queue < 1
            or max_wait < 0
            or max_lag < 0
            or put_timeout < 0
            or retry_for < 0
        ):
            backend.close_readers()
            raise KairosError(
                f"query log settings max_batch={max_batch!r}, max_queue={max_queue!r} must be "
                f">= 1 and max_wait={max_wait!r}, max_lag={max_lag!r}, "
                f"put_timeout={put_timeout!r}, retry_for={retry_for!r} must be >= 0"
            )
        if durability not in DURABILITY:
            backend.close_readers()
            raise KairosError(
                f"query log durability {durability!r} is not one of {', '.join(DURABILITY)}: "
                "'batched' answers at once and commits within ~50 ms, 'acknowledged' answers "
                "once the decision is committed"
            )
        self._backend = backend
        self.name = backend.name
        self.durability = durability
        self._acknowledged = durability == "acknowledged"
        self._max_batch = max_batch
        self._max_wait = 0.0 if self._acknowledged else max_wait
        self._max_lag = max_lag
        self._put_timeout = put_timeout
        self._retry_for = retry_for
        # A deque, not a queue.Queue: appending takes no lock and wakes no thread unless the
        # writer sleeps with nothing to do (`_idle`).
        self._pending: collections.deque[object] = collections.deque()
        self._max_queue = max_queue
        self._backlog = 0  # records queued, built or not (the writer takes them off)
        self._wake = threading.Event()
        self._idle = False  # the writer sleeps until something is queued
        self._hurry = False  # flush, close or a full queue: take what waits now
        self._writing_since = math.inf  # when the oldest record the writer holds was queued
        # queries waiting for the log to catch up: released after each commit
        self._lag_waiters: dict[asyncio.AbstractEventLoop, asyncio.Future[None]] = {}
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
        self._queue(_Queued((row,), None, 1, time.monotonic()))

    async def append_later(self, build: Callable[[], Sequence[LoggedQuery]], count: int) -> None:
        """Queue `count` records that the writer thread builds (`build()`) and encodes, so
        a query answers without spending that time. While the queue is full, or the log is
        more than `max_lag` behind, it waits for the writer (the query waits, the event loop
        does not): backpressure, not a dropped record. With acknowledged durability it
        returns once the records are committed, and raises `QueryLogError` when they could
        not be. `build` must only read values no one changes afterwards."""
        if self._closed:
            for _ in range(count):
                self._drop("the log is closed")
            return
        await self._room()
        if self._acknowledged:
            waiter = asyncio.get_running_loop().create_future()
            if self._queue(_Queued(None, build, count, time.monotonic(), waiter)):
                await waiter
            return
        self._queue(_Queued(None, build, count, time.monotonic()))
        if self._behind():
            await self._catch_up()

    async def _room(self) -> None:
        while self._backlog >= self._max_queue and self._writer.is_alive():
            self._hurry = True
            self._wake.set()
            await asyncio.sleep(0.001)

    def _behind(self) -> bool:
        """Whether the oldest record not yet committed was queued over `max_lag` ago."""
        oldest = self._writing_since
        try:
            first = self._pending[0]
        except IndexError:
            pass
        else:
            if isinstance(first, _Queued) and first.queued_at < oldest:
                oldest = first.queued_at
        return time.monotonic() - oldest > self._max_lag

    async def _catch_up(self) -> None:
        """Wait for the writer's next commits until the log is no longer behind (the event
        loop idles meanwhile, so the writer gets the GIL at once and catches up)."""
        loop = asyncio.get_running_loop()
        while self._behind() and self._writer.is_alive():
            with self._state_lock:  # one future per loop that every waiting query shares
                committed = self._lag_waiters.get(loop)
                if committed is None:
                    committed = self._lag_waiters[loop] = loop.create_future()
            await asyncio.shield(committed)  # a cancelled query leaves it to the others

    def _queue(self, item: _Queued) -> bool:
        with self._state_lock:
            if not self._closed:
                self._backlog += item.count
                self._pending.append(item)  # before close() queues its stop: written
                if self._idle:
                    self._wake.set()
                return True
        for _ in range(item.count):  # closed while this waited for room
            self._drop("the log was closed while the record waited for room")
        return False

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
            self._hurry = True
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
            self._hurry = True
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
        self._hurry = True
        self._wake.set()
        self._writer.join(timeout)
        if self._writer.is_alive():
            logger.warning(
                "query log %s: the writer did not finish within %ss; pending records are lost",
                self.name,
                timeout,
            )
            unwritten = QueryLogError(f"query log {self.name!r} was closed before writing this")
            self._settle([(item, unwritten) for item in self._take_all()])
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
                self._await_batch()
                self._hurry = False  # before the take: a flush queued after it hurries again
                items = self._take_all()
                stopping = self._write_items(items)
        finally:
            self._caught_up()
            self._backend.close_writer()

    def _caught_up(self) -> None:
        """Let the queries waiting in `_catch_up` look again (after each commit)."""
        if not self._lag_waiters:
            return
        with self._state_lock:
            waiting, self._lag_waiters = self._lag_waiters, {}
        for loop, committed in waiting.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(_release, [(committed, None)])

    def _await_batch(self) -> None:
        """Return when a batch is due: `max_wait` after its first record was queued, or at
        once when flush, close or a full queue asks."""
        while True:
            if not self._pending:
                self._idle = True
                if not self._pending:  # a `_queue` after this sees `_idle` and wakes us
                    self._wake.wait(_IDLE)
                self._idle = False
                self._wake.clear()
                continue
            first = self._pending[0]
            if self._hurry or not isinstance(first, _Queued):
                return
            delay = first.queued_at + self._max_wait - time.monotonic()
            if delay <= 0:
                return
            self._wake.wait(delay)
            self._wake.clear()

    def _write_items(self, items: list[object]) -> bool:
        """Build, encode and commit what was taken; True when it held the stop."""
        records: list[_Row] = []
        markers: list[_FlushMarker] = []
        spans: list[tuple[_Queued, int, int]] = []  # acknowledged items: their rows
        taken, stopping = 0, False
        queued = [item.queued_at for item in items if isinstance(item, _Queued)]
        first = min(queued, default=time.monotonic())
        self._writing_since = first
        # a late batch is built straight through (see _YIELD_FOR); acknowledged, always
        yield_until = -math.inf if self._acknowledged else first + self._max_wait + _YIELD_FOR
        for item in items:
            if isinstance(item, _Queued):
                start = len(records)
                if item.rows is not None:
                    records.extend(item.rows)
                elif item.build is not None:
                    self._build(item.build, item.count, records, yield_until)
                taken += item.count
                if item.waiter is not None:
                    spans.append((item, start, len(records)))
            elif isinstance(item, _FlushMarker):
                markers.append(item)
            else:
                stopping = True  # appends that raced close() are written too
        with self._state_lock:
            self._backlog -= taken
        failed: list[tuple[int, int]] = []
        for start in range(0, len(records), self._max_batch):
            end = min(len(records), start + self._max_batch)
            if not self._write(records[start:end]):
                failed.append((start, end))
        self._writing_since = math.inf
        self._caught_up()
        if spans:
            self._settle(
                [(item, self._failure(item, start, end, failed)) for item, start, end in spans]
            )
        for marker in markers:
            marker.done.set()
        return stopping

    def _failure(
        self, item: _Queued, start: int, end: int, failed: list[tuple[int, int]]
    ) -> QueryLogError | None:
        """Why an acknowledged item's records were not all committed, or None."""
        if end - start == item.count and not any(s < end and start < e for s, e in failed):
            return None
        return QueryLogError(
            f"query log {self.name!r} could not write this decision ({self._last_error}); "
            "check that its database is reachable and writable"
        )

    def _settle(self, done: Sequence[tuple[object, BaseException | None]]) -> None:
        """Release the queries waiting on these items: one call into each event loop."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[None], Any]]] = {}
        for item, error in done:
            if isinstance(item, _Queued) and item.waiter is not None:
                waiter = item.waiter
                by_loop.setdefault(waiter.get_loop(), []).append((waiter, error))
        for loop, waiters in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(_release, waiters)

    def _build(
        self,
        build: Callable[[], Sequence[LoggedQuery]],
        count: int,
        rows: list[_Row],
        yield_until: float,
    ) -> None:
        """Build and encode records queued by `append_later`, letting the query threads run
        every few records while the batch is on time (this thread holds the GIL while it
        encodes)."""
        try:
            with collector_paused(count >= 1000):
                records = build()
        except Exception as exc:  # a bug building records: counted, never raised
            with self._state_lock:
                self._lose(count, f"building {count} records: {exc!r}")
            return
        for index, record in enumerate(records):
            row = self._encode(record)
            if row is not None:
                rows.append(row)
            if index % 8 == 7 and time.monotonic() < yield_until:
                # a real sleep, however short, hands the GIL to a waiting query thread;
                # sleep(0) would take it straight back (the query waits out the 5 ms switch)
                time.sleep(_YIELD)

    def _take_all(self) -> list[object]:
        items: list[object] = []
        pending = self._pending
        while pending:
            items.append(pending.popleft())
        return items

    def _write(self, rows: Sequence[_Row]) -> bool:
        if not rows:
            return True
        delay, give_up = 0.05, time.monotonic() + self._retry_for
        while True:
            try:
                self._backend.write_batch(rows)
            except Exception as exc:
                if time.monotonic() + delay > give_up:
                    error = f"{type(exc).__name__}: {self._backend.scrub(str(exc).strip())}"
                    with self._state_lock:
                        self._lose(len(rows), error)
                    return False
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            else:
                self.batches_written += 1
                self.records_written += len(rows)
                return True

    def _lose(self, count: int, error: str) -> None:
        """Count records that could not be kept (call with `_state_lock` held)."""
        self.lost += count
        self._last_error = error
        logger.warning("query log %s could not write %d records: %s", self.name, count, error)


def _release(waiters: Sequence[tuple[asyncio.Future[None], BaseException | None]]) -> None:
    """On a waiting query's event loop: its records are committed (or failed)."""
    for waiter, error in waiters:
        if waiter.done():  # the query was cancelled meanwhile
            continue
        if error is None:
            waiter.set_result(None)
        else:
            waiter.set_exception(error)
