"""A PostgreSQL connection pool opened on first use in the running event loop, and the
`?prefix=` URL option that names the gateway's tables (so tests and tenants do not collide)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kairos.backends import postgres
from kairos.backends.url import redact, take_options
from kairos.gateway.errors import AccountingUnavailable, GatewayConfigError

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import AsyncConnectionPool

_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,40}")


def split_prefix(url: str, default: str = "gateway") -> tuple[str, str]:
    """(the URL without `prefix=`, the table prefix)."""
    rest, options = take_options(url, {"prefix"})
    prefix = options.get("prefix", default)
    if not _IDENTIFIER.fullmatch(prefix):
        raise GatewayConfigError(
            f"{redact(url)!r}: prefix must be lower-case letters, digits and _, got {prefix!r}"
        )
    return rest, prefix


class PostgresPool:
    def __init__(self, url: str, schema: str) -> None:
        self.url = url
        self._schema = schema
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None
        self._opening: asyncio.Lock | None = None

    async def pool(self) -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
        if self._pool is not None:
            return self._pool
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._pool is None:
                # libpq may quote the URL, password included: its message is left out
                unreachable = failed(f"cannot reach the gateway database {redact(self.url)!r}")
                with postgres.failures_as(unreachable):
                    connection = await postgres.connect_async(
                        self.url, autocommit=True, connect_timeout=postgres.CONNECT_TIMEOUT
                    )
                    async with connection, connection.transaction():
                        # processes starting together must not race to create the tables
                        await connection.execute("select pg_advisory_xact_lock(727274)")
                        await connection.execute(self._schema)
                self._pool = await postgres.open_pool(
                    self.url, kwargs={"autocommit": True}, max_size=20, timeout=30
                )
            return self._pool

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


def failed(message: str, after: str = "") -> Callable[[Exception], Exception]:
    """The AccountingUnavailable a psycopg error becomes (the gateway fails closed): the
    message and the error's type, never the driver's text."""
    return lambda error: AccountingUnavailable(f"{message} ({type(error).__name__}){after}")
