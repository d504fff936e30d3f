"""A PostgreSQL connection pool opened on first use in the running event loop, and the
`?prefix=` URL option that names the gateway's tables (so tests and tenants do not collide)."""

from __future__ import annotations

import asyncio
import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg_pool import AsyncConnectionPool

from kairos.gateway.errors import AccountingUnavailable, GatewayConfigError
from kairos.stores.online import redact_url

_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,40}")


def split_prefix(url: str, default: str = "gateway") -> tuple[str, str]:
    """(the URL without `prefix=`, the table prefix)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    prefixes = [value for name, value in query if name == "prefix"]
    prefix = prefixes[-1] if prefixes else default
    if not _IDENTIFIER.fullmatch(prefix):
        raise GatewayConfigError(
            f"{redact_url(url)!r}: prefix must be lower-case letters, digits and _, got {prefix!r}"
        )
    rest = urlencode([(name, value) for name, value in query if name != "prefix"])
    return urlunsplit(parts._replace(query=rest)), prefix


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
                try:
                    connection = await psycopg.AsyncConnection.connect(
                        self.url, autocommit=True, connect_timeout=10
                    )
                    async with connection, connection.transaction():
                        # processes starting together must not race to create the tables
                        await connection.execute("select pg_advisory_xact_lock(727274)")
                        await connection.execute(self._schema)
                except psycopg.Error as error:
                    raise AccountingUnavailable(
                        f"cannot reach the gateway database {redact_url(self.url)!r} "
                        f"({type(error).__name__})"
                    ) from None  # libpq may quote the URL, password included
                pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
                    self.url,
                    kwargs={"autocommit": True},
                    min_size=1,
                    max_size=20,
                    open=False,
                    timeout=30,
                )
                await pool.open(wait=False)
                self._pool = pool
            return self._pool

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
