"""PostgreSQL through psycopg 3: the one place connections and pools are opened and a
driver's errors recognised. psycopg is imported on first use, so importing kairos (whose
default stores are files) does not pay for it.

>>> connection = connect("postgresql://app@db/bank", autocommit=True, connect_timeout=10)
>>> pool = await open_pool(conninfo, kwargs={"autocommit": True}, max_size=20, timeout=30)
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from kairos.backends.failures import driver_failures_as

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import AsyncConnectionPool

CONNECT_TIMEOUT = 10  # seconds; what kairos passes unless the URL says otherwise


def connect(conninfo: str, **options: Any) -> psycopg.Connection[tuple[Any, ...]]:
    """A blocking connection (`options` go to `psycopg.connect`); raises psycopg's errors."""
    import psycopg

    return psycopg.connect(conninfo, **options)


async def connect_async(conninfo: str, **options: Any) -> psycopg.AsyncConnection[Any]:
    """An asyncio connection in the running loop; raises psycopg's errors."""
    import psycopg

    return await psycopg.AsyncConnection.connect(conninfo, **options)


async def open_pool(
    conninfo: str,
    *,
    kwargs: dict[str, Any],
    max_size: int,
    timeout: float,
    name: str | None = None,
) -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
    """A pool of 1 to `max_size` connections in the running loop, opened without waiting
    (connect once by hand first: a pool only logs why it cannot connect, and times out)."""
    from psycopg_pool import AsyncConnectionPool

    pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
        conninfo,
        kwargs=kwargs,
        min_size=1,
        max_size=max_size,
        open=False,
        name=name,
        timeout=timeout,
    )
    await pool.open(wait=False)
    return pool


def raw_cursor(connection: psycopg.AsyncConnection[Any]) -> psycopg.AsyncRawCursor[Any]:
    """A cursor that sends SQL unchanged (`$1` placeholders) and binds values server-side."""
    import psycopg

    return psycopg.AsyncRawCursor(connection)


@contextmanager
def failures_as(make: Callable[[Exception], Exception]) -> Iterator[None]:
    """Raise `make(error)` for a psycopg error in the block, without the driver's error as
    its cause (libpq may quote the URL, password included); other errors pass unchanged.

    >>> with failures_as(lambda error: BackendUnavailable(f"store failed ({error})")):
    ...     connection.execute("select 1")
    """
    with driver_failures_as(is_error, make):
        yield


def is_error(error: BaseException) -> bool:
    """Whether `error` is psycopg's (none can be before psycopg was imported)."""
    driver = sys.modules.get("psycopg")
    return driver is not None and isinstance(error, driver.Error)


def is_outage(error: BaseException) -> bool:
    """A server that is down or a connection that broke (psycopg's OperationalError or
    InterfaceError itself), not a statement that is wrong."""
    return is_error(error) and type(error).__name__ in ("OperationalError", "InterfaceError")
