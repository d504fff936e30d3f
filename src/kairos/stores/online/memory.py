"""The online store in this process's memory (`memory://`): for tests and notebooks."""

from __future__ import annotations

import copy
import threading
from collections.abc import Hashable, Sequence

from kairos.stores.online.base import StoredValue, StoreKey

_MUTABLE = (list, dict, set)


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
