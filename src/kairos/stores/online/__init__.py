"""Online stores: the latest value of each feature of each entity, with its observed_at.

One semantics for every backend; the engine decides freshness (observed_at <= now and
now - observed_at <= max_staleness), a store only keeps the newest value it was given.

In memory (`memory.py`), a SQLite file (`sqlite.py`) or Redis (`redis.py`); the
protocol and the stored types are in `base.py`.
"""

from __future__ import annotations

from kairos.errors import KairosError
from kairos.stores.online.base import OnlineStore, StoredValue, StoreKey, redact_url
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
    scheme = url.partition(":")[0].lower() if ":" in url else ""
    if scheme == "memory":
        return MemoryOnlineStore()
    if scheme == "sqlite":
        path = url[len("sqlite:///") :] if url[: len("sqlite:///")].lower() == "sqlite:///" else ""
        if not path:
            raise KairosError(
                f"online store URL {redact_url(url)!r} names no file; use "
                "sqlite:///relative/path.db or sqlite:////absolute/path.db"
            )
        return SQLiteOnlineStore(path)
    if scheme in ("redis", "rediss"):
        return RedisOnlineStore(url)
    named = f"scheme {scheme!r}" if scheme else "no scheme"
    raise KairosError(
        f"online store URL {redact_url(url)!r} has {named}; supported: 'memory://', "
        "'sqlite:///path/to/online.db', 'redis://host:port/db' (or 'rediss://')"
    )
