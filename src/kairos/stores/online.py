"""Online stores: the latest value of each feature of each entity, with its observed_at.

One semantics for every backend; the engine decides freshness (observed_at <= now and
now - observed_at <= max_staleness), a store only keeps the newest value it was given.
"""

from __future__ import annotations

import copy
import re
import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from kairos.errors import KairosError


@dataclass(frozen=True, slots=True)
class StoredValue:
    value: Any
    observed_at: datetime


_MUTABLE = (list, dict, set)

# (namespace, primary key, feature name)
StoreKey = tuple[str, Hashable, str]


class OnlineStore(Protocol):
    """What the engine needs from an online store. Calls take every key of a query at once,
    so a networked store can answer in one round trip."""

    async def get(self, keys: Sequence[StoreKey]) -> list[StoredValue | None]: ...

    async def put(self, items: Sequence[tuple[StoreKey, StoredValue]]) -> None: ...

    async def close(self) -> None: ...


class MemoryOnlineStore:
    """In-process store: a dict per entity. Never replaces a value with an older one."""

    def __init__(self) -> None:
        self._entities: dict[tuple[str, Hashable], dict[str, StoredValue]] = {}
        self._lock = threading.Lock()

    async def get(self, keys: Sequence[StoreKey]) -> list[StoredValue | None]:
        entities = self._entities
        found: list[StoredValue | None] = []
        for namespace, key, name in keys:
            entity = entities.get((namespace, key))
            stored = entity.get(name) if entity is not None else None
            if stored is not None and type(stored.value) in _MUTABLE:
                stored = StoredValue(copy.deepcopy(stored.value), stored.observed_at)
            found.append(stored)
        return found

    async def put(self, items: Sequence[tuple[StoreKey, StoredValue]]) -> None:
        with self._lock:
            for (namespace, key, name), stored in items:
                entity = self._entities.setdefault((namespace, key), {})
                current = entity.get(name)
                if current is None or current.observed_at <= stored.observed_at:
                    if type(stored.value) in _MUTABLE:  # callers must not share what we keep
                        stored = StoredValue(copy.deepcopy(stored.value), stored.observed_at)
                    entity[name] = stored

    async def close(self) -> None:
        return None

    def __len__(self) -> int:
        return sum(len(entity) for entity in self._entities.values())


def online_store_from_url(url: str) -> OnlineStore:
    """The online store a URL names.

    `memory://` (in this process), `sqlite:///relative/path.db` or `sqlite:////abs/path.db`
    (a SQLite file), `redis://host:port/db` or `rediss://...` (Redis; `?prefix=name` sets the
    key prefix, default `kairos`).

    >>> online_store_from_url("memory://")  # doctest: +ELLIPSIS
    <kairos.stores.online.MemoryOnlineStore object at ...>
    """
    scheme = url.partition(":")[0].lower() if ":" in url else ""
    if scheme == "memory":
        return MemoryOnlineStore()
    if scheme == "sqlite":
        from kairos.stores.sqlite_online import SQLiteOnlineStore

        path = url[len("sqlite:///") :] if url[: len("sqlite:///")].lower() == "sqlite:///" else ""
        if not path:
            raise KairosError(
                f"online store URL {redact_url(url)!r} names no file; use "
                "sqlite:///relative/path.db or sqlite:////absolute/path.db"
            )
        return SQLiteOnlineStore(path)
    if scheme in ("redis", "rediss"):
        from kairos.stores.redis_online import RedisOnlineStore

        return RedisOnlineStore(url)
    named = f"scheme {scheme!r}" if scheme else "no scheme"
    raise KairosError(
        f"online store URL {redact_url(url)!r} has {named}; supported: 'memory://', "
        "'sqlite:///path/to/online.db', 'redis://host:port/db' (or 'rediss://')"
    )


# `?password=...` and the like: query parameters that carry a secret
_SECRET_PARAMETER = re.compile(
    r"((?:^|[?&;])[^=&;]*(?:password|passwd|secret|token)[^=&;]*)=[^&;#]*", re.I
)


def redact_url(url: str) -> str:
    """The URL with its password (and any secret query parameter) replaced by `***`.

    >>> redact_url("redis://app:s3cret@cache:6379/0")
    'redis://app:***@cache:6379/0'
    """
    scheme, sep, rest = url.partition("://")
    if not sep:  # no scheme: all of it may be an address with credentials
        scheme, rest = "", url
    userinfo, at, address = rest.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        rest = f"{user}:***@{address}" if colon else f"***@{address}"
    rest = _SECRET_PARAMETER.sub(r"\1=***", rest)
    return f"{scheme}{sep}{rest}"
