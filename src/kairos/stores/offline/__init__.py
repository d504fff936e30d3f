"""Offline stores: every value each feature ever had, and point-in-time (as-of) reads of
them, in DuckDB (`duckdb.py`, the embedded default) or PostgreSQL (`postgres.py`); the
protocol and what the stores share are in `base.py`, the background writer of online
values in `writer.py`. `offline_store_from_url` picks the store a URL names."""

from __future__ import annotations

from kairos.backends import URL, connect
from kairos.backends.url import redact, take_options
from kairos.errors import KairosError
from kairos.stores.offline.base import (
    TIMESTAMP,
    CheckedBatch,
    Column,
    FollowedStore,
    InsertionClock,
    OfflineStore,
    OneFeatureWrites,
    TTLs,
    Written,
    checked_batch,
    python_values,
    readable,
    table_name,
    ttl_of,
)
from kairos.stores.offline.duckdb import DuckDBOfflineStore
from kairos.stores.offline.postgres import PostgresOfflineStore, postgres_table_name
from kairos.stores.offline.writer import Observation, OfflineWriter

__all__ = [
    "TIMESTAMP",
    "CheckedBatch",
    "Column",
    "DuckDBOfflineStore",
    "FollowedStore",
    "InsertionClock",
    "Observation",
    "OfflineStore",
    "OfflineWriter",
    "OneFeatureWrites",
    "PostgresOfflineStore",
    "TTLs",
    "Written",
    "checked_batch",
    "offline_store_from_url",
    "postgres_table_name",
    "python_values",
    "readable",
    "table_name",
    "ttl_of",
]


def offline_store_from_url(url: str) -> OfflineStore:
    """The offline store a URL names: `duckdb:///relative/path.duckdb`,
    `duckdb:////absolute/path.duckdb`, `duckdb:///:memory:`, or a PostgreSQL database,
    `postgresql://user@host:5432/db` (also `postgres://`), with `?schema=name` for the schema
    its tables go in (created if missing; other options go to libpq).

    >>> store = offline_store_from_url("duckdb:///:memory:")
    >>> store
    DuckDBOfflineStore(':memory:')
    >>> store.close()
    """

    def duckdb(parsed: URL) -> OfflineStore:
        path = parsed.file_path()
        if not path:
            raise KairosError(
                f"offline store URL {redact(url)!r} names no file; use "
                "duckdb:///relative/path.duckdb, duckdb:////absolute/path.duckdb or "
                "duckdb:///:memory:"
            )
        return DuckDBOfflineStore(path)

    def postgres(parsed: URL) -> OfflineStore:
        conninfo, options = take_options(url, {"schema"})
        schema = options.get("schema")
        if schema is not None and not schema:
            raise KairosError(
                f"offline store URL {redact(url)!r} has an empty ?schema=; name a schema "
                "or leave the option out"
            )
        return PostgresOfflineStore(conninfo, schema)

    def unknown(parsed: URL) -> KairosError:
        named = f"scheme {parsed.scheme!r}" if parsed.scheme else "no scheme"
        return KairosError(
            f"offline store URL {redact(url)!r} has {named}; supported: "
            "'duckdb:///path/to/offline.duckdb', 'duckdb:///:memory:', "
            "'postgresql://user@host:5432/db?schema=name'"
        )

    return connect(url, {"duckdb": duckdb, "postgresql": postgres}, unknown=unknown)
