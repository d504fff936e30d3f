"""What every online store is: the `OnlineStore` protocol, the keys it is asked for and
the values it keeps.

One semantics for every backend; the engine decides freshness (observed_at <= now and
now - observed_at <= max_staleness), a store only keeps the newest value it was given.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class StoredValue:
    value: Any
    observed_at: datetime


# (namespace, primary key, feature name)
StoreKey = tuple[str, Hashable, str]


class OnlineStore(Protocol):
    """What the engine needs from an online store. Calls take every key of a query at once,
    so a networked store can answer in one round trip."""

    async def get(self, keys: Sequence[StoreKey]) -> list[StoredValue | None]: ...

    async def put(self, items: Sequence[tuple[StoreKey, StoredValue]]) -> None: ...

    async def close(self) -> None: ...
