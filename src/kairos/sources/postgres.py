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

A has-many SQL resolver's rows come through `fetch_arrow`: the ADBC PostgreSQL driver
(`adbc-driver-postgresql`, when installed) reads the binary result into Arrow columns, with no
Python object per value (at 100k rows about 4x faster than psycopg's rows). Where it cannot
give the rows psycopg would (the driver is missing, a NULL or odd parameter, a column type
such as interval or json, a statement it refuses) it returns None and the caller reads rows.

Options kairos reads (the others go to libpq): `?pool_max=10`, `?pool_timeout=30` (seconds
to wait for a free connection). `connect_timeout` defaults to 10 seconds.
Passwords never appear in `repr()` or in error messages.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import threading
from collections.abc import Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from kairos.backends import postgres
from kairos.backends.threads import ConnectionThreads
from kairos.backends.url import redact, scrub, take_options
from kairos.sources.errors import SourceError, closed, source_thread
from kairos.sources.url import positive_float, positive_int

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import AsyncConnectionPool

_OPTIONS = ("pool_max", "pool_timeout")
# Parameters ADBC binds as psycopg does (None and others: psycopg's rows instead).
_ARROW_PARAMETERS = (str, int, float, datetime, date)
INT64 = range(-(2**63), 2**63)


def _arrow_parameter(value: Any) -> bool:
    """Whether ADBC binds `value` as psycopg does (psycopg binds an int beyond int64 as numeric)."""
    if isinstance(value, bool) or not isinstance(value, _ARROW_PARAMETERS):
        return False
    return not isinstance(value, int) or value in INT64


logger = logging.getLogger("kairos.sources")


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
        self._arrow: ConnectionThreads[_ArrowConnection] | None = None
        self._arrow_failed = False  # ADBC cannot connect: stop trying it

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

    async def fetch_arrow(self, sql: str, params: Sequence[Any]) -> pa.Table | None:
        """The result as an Arrow table read by ADBC, or None where `fetch` must read it."""
        values = list(params)
        if self._arrow_failed or not all(_arrow_parameter(v) for v in values):
            return None
        with self._lock:
            if self._closed:
                raise closed(self.name)
            if self._arrow is None:
                driver = _adbc()
                if driver is None:
                    self._arrow_failed = True
                    return None
                self._arrow = ConnectionThreads(
                    lambda: _ArrowConnection(driver, self._conninfo, self._arrow_refused),
                    size=self.pool_max,
                    thread_name=f"{source_thread(self.name)}_arrow",
                    closed=lambda: closed(self.name),
                )
            threads = self._arrow
        try:
            table = await threads.run(lambda connection: connection.query(sql, values))
        except Exception as error:
            if type(error).__module__.partition(".")[0] != "adbc_driver_manager":
                raise
            logger.debug("source %s: ADBC refused a statement, reading rows", self.name)
            return None
        return _as_psycopg_reads(table)

    def _arrow_refused(self) -> None:
        self._arrow_failed = True

    async def close(self) -> None:
        """Close the pool and stop its loop and thread. Idempotent."""
        with self._lock:
            self._closed = True
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
            arrow, self._arrow = self._arrow, None
        if arrow is not None:
            await arrow.close()
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


def _adbc() -> Any:
    """The ADBC PostgreSQL driver's DB-API module, or None when it is not installed."""
    try:
        return importlib.import_module("adbc_driver_postgresql.dbapi")
    except ImportError:
        return None


class _ArrowConnection:
    """One ADBC connection, on one thread of `ConnectionThreads`."""

    def __init__(self, driver: Any, conninfo: str, refused: Any) -> None:
        if "connect_timeout=" not in conninfo:  # libpq's default waits forever
            url_form = "://" in conninfo
            glue = ("&" if "?" in conninfo else "?") if url_form else " "
            conninfo += f"{glue}connect_timeout={postgres.CONNECT_TIMEOUT}"
        try:
            self._connection = driver.connect(conninfo, autocommit=True)
        except Exception:
            refused()  # psycopg's fetch reports why (its messages are scrubbed of secrets)
            raise
        self._cursor: Any = None

    def query(self, sql: str, params: list[Any]) -> pa.Table:
        cursor = self._connection.cursor()
        self._cursor = cursor
        try:
            cursor.execute(sql, params or None)
            return cursor.fetch_arrow_table()
        finally:
            self._cursor = None
            cursor.close()

    def interrupt(self) -> None:
        cursor = self._cursor
        if cursor is not None:
            cursor.adbc_cancel()  # a timed-out query stops on the server too

    def close(self) -> None:
        self._connection.close()


def _as_psycopg_reads(table: pa.Table) -> pa.Table | None:
    """Columns as psycopg would read their values: numeric as Decimal (ADBC gives its text);
    None when a column's type has no such form here (interval, json, arrays...)."""
    columns = []
    for column in table.columns:
        kind = column.type
        if isinstance(kind, pa.OpaqueType) and kind.type_name == "numeric":
            texts = [t for chunk in column.chunks for t in chunk.storage.to_pylist()]
            column = pa.array([None if t is None else Decimal(t) for t in texts])
        elif not (
            pa.types.is_null(kind)
            or pa.types.is_boolean(kind)
            or pa.types.is_integer(kind)
            or pa.types.is_floating(kind)
            or pa.types.is_string(kind)
            or pa.types.is_large_string(kind)
            or pa.types.is_timestamp(kind)
            or pa.types.is_date32(kind)
        ):
            return None
        columns.append(column)
    return pa.Table.from_arrays(columns, names=table.column_names)


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
