"""Every online-store backend behind one fixture: memory, a SQLite file, Redis (own prefix).

A test takes `online_backend` and calls `online_backend.put(...)` / `.get(...)` (the store's
calls, run on the fixture's event loop) or `.run(coroutine)`; the store is closed and, for
Redis, every key under the test's prefix deleted after.
"""

import asyncio
import uuid
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from kairos.stores import (
    MemoryOnlineStore,
    OnlineStore,
    RedisOnlineStore,
    SQLiteOnlineStore,
    StoredValue,
    online_store_from_url,
)
from kairos.stores.online import StoreKey
from tests.conftest import REDIS_URL, delete_redis_prefix, need_redis

T = TypeVar("T")

BACKENDS = ["memory", "sqlite", "redis"]


@dataclass
class OnlineBackend:
    """A backend under test: `store` is open; `url` names the same data for a new store."""

    name: str
    url: str
    loop: asyncio.AbstractEventLoop
    store: OnlineStore
    opened: list[OnlineStore] = field(default_factory=list)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def put(self, items: Sequence[tuple[StoreKey, StoredValue]]) -> None:
        self.run(self.store.put(items))

    def get(self, keys: Sequence[StoreKey]) -> list[StoredValue | None]:
        return self.run(self.store.get(keys))

    def open(self) -> OnlineStore:
        """Another store over the same data (memory: a new, empty one); closed after the test."""
        store = online_store_from_url(self.url)
        self.opened.append(store)
        return store


def new_store(name: str, tmp_path: Path) -> tuple[str, OnlineStore]:
    if name == "memory":
        return "memory://", MemoryOnlineStore()
    if name == "sqlite":
        path = tmp_path / "stores" / "online.db"
        return f"sqlite:///{path}", SQLiteOnlineStore(path)
    need_redis()
    prefix = f"kairos-test-{uuid.uuid4().hex}"
    return f"{REDIS_URL}?prefix={prefix}", RedisOnlineStore(REDIS_URL, prefix=prefix)


@pytest.fixture(params=BACKENDS)
def online_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OnlineBackend]:
    url, store = new_store(request.param, tmp_path)
    loop = asyncio.new_event_loop()
    under_test = OnlineBackend(request.param, url, loop, store)
    try:
        yield under_test
    finally:
        for opened in [store, *under_test.opened]:
            loop.run_until_complete(opened.close())
        loop.close()
        if isinstance(store, RedisOnlineStore):
            delete_redis_prefix(store.prefix)


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL for each backend, for code that opens (and closes) its own store."""
    if request.param == "memory":
        yield "memory://"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'online.db'}"
    else:
        need_redis()
        prefix = f"kairos-test-{uuid.uuid4().hex}"
        yield f"{REDIS_URL}?prefix={prefix}"
        delete_redis_prefix(prefix)
