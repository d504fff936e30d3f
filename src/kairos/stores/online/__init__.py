"""Online stores: the latest value of each feature of each entity, with its observed_at.

One semantics for every backend; the engine decides freshness (observed_at <= now and
now - observed_at <= max_staleness), a store only keeps the newest value it was given.

In memory (`memory.py`), a SQLite file (`sqlite.py`) or Redis (`redis.py`); the
protocol and the stored types are in `base.py`.
"""

from __future__ import annotations

from kairos.backends import URL, connect
from kairos.backends.url import redact as redact_url
from kairos.errors import KairosError
from kairos.stores.online.base import OnlineStore, StoredValue, StoreKey
from kairos.stores.online.memory import MemoryOnlineStore
from kairos.stores.online.redis import OnlineStoreUnavailable, RedisOnlineStore
from kairos.stores.online.sqlite import SQLiteOnlineStore

__all__ = [
    "MemoryOnlineStore",
    "OnlineStore",
    "OnlineStoreUnavailable",
    "RedisOnlineStore",
    "SQLiteOnlineStore",
    "StoreKey",
    "StoredValue",
    "online_store_from_url",
    "redact_url",
]


def online_store_from_url(url: str) -> OnlineStore:
    """The online store a URL names.

    `memory://` (in this process), `sqlite:///relative/path.db` or `sqlite:////abs/path.db`
    (a SQLite file), `redis://host:port/db` or `rediss://...` (Redis; `?prefix=name` sets the
    key prefix, default `kairos`).

    >>> online_store_from_url("memory://")  # doctest: +ELLIPSIS
    <kairos.stores.online.memory.MemoryOnlineStore object at ...>
    """

    def sqlite(parsed: URL) -> OnlineStore:
        path = parsed.file_path()
        if not path:
            raise KairosError(
                f"online store URL {redact_url(url)!r} names no file; use "
                "sqlite:///relative/path.db or sqlite:////absolute/path.db"
            )
        return SQLiteOnlineStore(path)

    def unknown(parsed: URL) -> KairosError:
        named = f"scheme {parsed.scheme!r}" if parsed.scheme else "no scheme"
        return KairosError(
            f"online store URL {redact_url(url)!r} has {named}; supported: 'memory://', "
            "'sqlite:///path/to/online.db', 'redis://host:port/db' (or 'rediss://')"
        )

    return connect(
        url,
        {
            "memory": lambda parsed: MemoryOnlineStore(),
            "sqlite": sqlite,
            "redis": lambda parsed: RedisOnlineStore(url),
        },
        unknown=unknown,
    )
