"""PostgreSQL as a source: `postgresql://user:password@host:port/db` (or `postgres://`).

Placeholders are PostgreSQL's own `$1, $2, ...`: queries go through psycopg's
`AsyncRawCursor`, which sends the SQL text unchanged and the parameters separately
(server-side binding). So a literal `%` in the SQL needs no escaping, and `%s` means nothing.

Connections come from a `psycopg_pool.AsyncConnectionPool` (min 1, max `?pool_max=10`),
opened on the first fetch: building the source does no I/O. An asyncio pool belongs to the
event loop that opened it, while callers come from many loops (the client runs one per
calling thread; `asyncio.run` makes and closes one per call). So the pool lives on a loop
of its own, in one thread owned by the source, and `fetch` hands each query over to it;
cancelling a fetch cancels the query on the server.

Options kairos reads (the others go to libpq): `?pool_max=10`, `?pool_timeout=30` (seconds
to wait for a free connection). `connect_timeout` defaults to 10 seconds.
Passwords never appear in `repr()` or in error messages.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kairos.backends import postgres
from kairos.backends.url import redact, scrub, take_options
from kairos.sources.errors import SourceError, closed, source_thread
from kairos.sources.url import positive_float, positive_int

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import AsyncConnectionPool

_OPTIONS = ("pool_max", "pool_timeout")


class PostgresSource:
    """A PostgreSQL database read through pooled async connections.

    >>> source = PostgresSource("bank", "postgresql://app:s3cret@db/bank")
    >>> await source.fetch("select name from users where id = $1", ["u1"])
    (['name'], [('Ada',)])
    """

    dialect = "postgres"

    def __init__(
        self,
        name: str,
        url: str,
        *,
        conninfo: str | None = None,
        pool_max: int = 10,
        pool_timeout: float = 30.0,
    ) -> None:
        self.name = name
        self.url = url
        self.pool_max = pool_max
        self.pool_timeout = pool_timeout
        self._conninfo = url if conninfo is None else conninfo
        self._connect_options: dict[str, Any] = {"autocommit": True}
        if "connect_timeout=" not in self._conninfo:
            self._connect_options["connect_timeout"] = postgres.CONNECT_TIMEOUT
        self._lock = threading.Lock()  # guards the three fields below
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        # Used on the pool's loop only.
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None
        self._opening = asyncio.Lock()

    def __repr__(self) -> str:
        return f"PostgresSource(name={self.name!r}, url={redact(self.url)!r})"

    def placeholder(self, index: int) -> str:
        return f"${index}"

    async def fetch(
        self, sql: str, params: Sequence[Any]
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        values = list(params)
        with self._lock:
            if self._closed:
                raise closed(self.name)
            loop = self._start()
            # Scheduled under the lock, so close() cannot stop the loop in between.
            future = asyncio.run_coroutine_threadsafe(self._fetch(sql, values), loop)
        return await asyncio.wrap_future(future)

    async def close(self) -> None:
        """Close the pool and stop its loop and thread. Idempotent."""
        with self._lock:
            self._closed = True
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        try:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._shut_down(), loop))
        finally:
            loop.call_soon_threadsafe(loop.stop)
            await asyncio.get_running_loop().run_in_executor(None, thread.join)

    def _start(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=_serve, args=(loop,), name=f"{source_thread(self.name)}_pool", daemon=True
            )
            thread.start()
            self._loop, self._thread = loop, thread
        return self._loop

    # --- on the pool's loop ---------------------------------------------------------------

    async def _fetch(self, sql: str, params: list[Any]) -> tuple[list[str], list[tuple[Any, ...]]]:
        pool = self._pool or await self._open()
        try:
            async with (
                pool.connection(timeout=self.pool_timeout) as connection,
                postgres.raw_cursor(connection) as cursor,
            ):
                await cursor.execute(sql, params)
                if cursor.description is None:
                    return [], []
                names = [column.name for column in cursor.description]
                return names, await cursor.fetchall()
        except Exception as error:
            if not postgres.is_error(error):
                raise
            message = scrub(str(error).strip(), self.url)
            raise SourceError(
                f"source {self.name!r} (postgres): {type(error).__name__}: {message}"
            ) from error

    async def _open(self) -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
        async with self._opening:
            if self._pool is None:
                await self._probe()
                self._pool = await postgres.open_pool(
                    self._conninfo,
                    kwargs=self._connect_options,
                    max_size=self.pool_max,
                    timeout=self.pool_timeout,
                    name=source_thread(self.name),
                )
            return self._pool

    async def _probe(self) -> None:
        """Connect once by hand: the pool would only log why it cannot connect, and time out."""
        try:
            connection = await postgres.connect_async(self._conninfo, **self._connect_options)
        except Exception as error:
            if not postgres.is_error(error):
                raise
            message = scrub(str(error).strip(), self.url)
            raise SourceError(
                f"source {self.name!r} (postgres) cannot connect to {redact(self.url)!r}: {message}"
            ) from None  # libpq may quote a malformed URL, password included, in its message
        await connection.close()

    async def _shut_down(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        # Fetches that arrived while closing fail now rather than hang on a stopped loop.
        pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def postgres_source(name: str, url: str) -> PostgresSource:
    """Build a PostgresSource from its URL (already `${VAR}`-interpolated); no I/O."""
    conninfo, options = take_options(url, _OPTIONS)
    return PostgresSource(
        name,
        url,
        conninfo=conninfo,
        pool_max=positive_int(options, "pool_max", 10, source=name),
        pool_timeout=positive_float(options, "pool_timeout", 30.0, source=name),
    )
