"""Blocking drivers (sqlite3, duckdb) behind an event loop: a thread pool owning its
connections, each thread holding its own, so no loop ever waits on a query.

A call whose awaiting task is cancelled (a node timeout) may interrupt the query it started
(`interrupt_on_cancel`), so a runaway query gives its thread back instead of holding it until
it ends; a store whose writes must finish once begun leaves it running.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, Protocol, TypeVar


class Interruptible(Protocol):
    def interrupt(self) -> None: ...

    def close(self) -> None: ...


C = TypeVar("C", bound=Interruptible)
T = TypeVar("T")


class _Abandoned(Exception):
    """The caller stopped waiting before the query started."""


class _Call:
    """One query on its way through a thread: lets the awaiting side interrupt it."""

    __slots__ = ("cancelled", "connection", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cancelled = False
        self.connection: Interruptible | None = None

    def interrupt(self) -> None:
        with self.lock:
            self.cancelled = True
            if self.connection is not None:
                self.connection.interrupt()


class ConnectionThreads(Generic[C]):
    """`size` threads, each opening its own connection with `connect` on first use.
    `closed()` is the error a call after `close()` raises.

    >>> threads = ConnectionThreads(lambda: sqlite3.connect(path), size=4,
    ...                             thread_name="kairos-source-bank", closed=closed_error)
    >>> rows = await threads.run(lambda con: con.execute("select 1").fetchall())
    >>> await threads.close()
    """

    def __init__(
        self,
        connect: Callable[[], C],
        *,
        size: int,
        thread_name: str,
        closed: Callable[[], Exception],
        interrupt_on_cancel: bool = True,
    ) -> None:
        self._connect = connect
        self._closed_error = closed
        self._interrupt_on_cancel = interrupt_on_cancel
        self._executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix=thread_name)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[C] = []
        self._calls: set[_Call] = set()
        self._closed = False

    async def run(self, work: Callable[[C], T]) -> T:
        """Run `work(connection)` on one of the threads and wait for it without blocking."""
        call = _Call()
        with self._lock:
            if self._closed:
                raise self._closed_error()
            self._calls.add(call)
        try:
            loop = asyncio.get_running_loop()
            try:
                future = loop.run_in_executor(self._executor, self._in_thread, call, work)
            except RuntimeError:  # closed between the check above and here
                raise self._closed_error() from None
            return await future
        except asyncio.CancelledError:
            if self._interrupt_on_cancel:
                call.interrupt()
            raise
        finally:
            with self._lock:
                self._calls.discard(call)

    def submit(self, work: Callable[[C], object]) -> Future[object]:
        """Queue `work(connection)` on the threads without waiting for it (nor its errors)."""
        return self._executor.submit(lambda: work(self._connection()))

    def _in_thread(self, call: _Call, work: Callable[[C], T]) -> T:
        connection = self._connection()
        with call.lock:
            if call.cancelled:
                raise _Abandoned  # nobody waits for this result any more
            call.connection = connection
        try:
            return work(connection)
        finally:
            with call.lock:
                call.connection = None

    def _connection(self) -> C:
        connection: C | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._connect()
            with self._lock:
                self._connections.append(connection)
            self._local.connection = connection
        return connection

    async def close(self) -> None:
        """Stop the threads, close every connection. Idempotent. With `interrupt_on_cancel`,
        running queries are interrupted and queued ones dropped; otherwise all of them end."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            calls = list(self._calls)
        if self._interrupt_on_cancel:
            for call in calls:
                call.interrupt()
        await asyncio.get_running_loop().run_in_executor(None, self._shut_down)

    def _shut_down(self) -> None:
        # Connections are closed only after their threads have finished with them.
        self._executor.shutdown(wait=True, cancel_futures=self._interrupt_on_cancel)
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()
