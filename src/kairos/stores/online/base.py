"""What every online store is: the `OnlineStore` protocol, the keys it is asked for and
the values it keeps; and `redact_url`, which shows a store's URL without its secrets.

One semantics for every backend; the engine decides freshness (observed_at <= now and
now - observed_at <= max_staleness), a store only keeps the newest value it was given.
"""

from __future__ import annotations

import re
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
