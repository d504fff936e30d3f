"""Stores behind small Protocols, chosen by URL."""

from typing import TYPE_CHECKING, Any

from kairos.stores.online import (
    MemoryOnlineStore,
    OnlineStore,
    StoredValue,
    online_store_from_url,
    redact_url,
)
from kairos.stores.sqlite_online import SQLiteOnlineStore

if TYPE_CHECKING:
    from kairos.stores.redis_online import RedisOnlineStore

__all__ = [
    "MemoryOnlineStore",
    "OnlineStore",
    "RedisOnlineStore",
    "SQLiteOnlineStore",
    "StoredValue",
    "online_store_from_url",
    "redact_url",
]


def __getattr__(name: str) -> Any:
    # Loaded on first use: `import kairos` does not pay for importing the Redis client.
    if name == "RedisOnlineStore":
        from kairos.stores.redis_online import RedisOnlineStore

        return RedisOnlineStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
