"""Stores behind small Protocols, chosen by URL."""

from kairos.stores.online import (
    MemoryOnlineStore,
    OnlineStore,
    RedisOnlineStore,
    SQLiteOnlineStore,
    StoredValue,
    online_store_from_url,
    redact_url,
)

__all__ = [
    "MemoryOnlineStore",
    "OnlineStore",
    "RedisOnlineStore",
    "SQLiteOnlineStore",
    "StoredValue",
    "online_store_from_url",
    "redact_url",
]
