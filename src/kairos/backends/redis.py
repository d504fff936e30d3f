"""Redis through redis-py's asyncio client: the one place a pooled client is opened and the
driver's errors recognised. redis-py is imported on first use, so importing kairos (whose
default stores are files) does not pay for it.

>>> client = blocking_client("redis://cache:6379/0", max_connections=64, timeout=5)
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from kairos.backends.failures import driver_failures_as

if TYPE_CHECKING:
    import redis.asyncio


def open_client(url: str, **options: Any) -> redis.asyncio.Redis:
    """A client with redis-py's own pool (`options` go to `Redis.from_url`); no I/O yet."""
    import redis.asyncio

    return redis.asyncio.Redis.from_url(url, **options)


def blocking_client(
    url: str, *, max_connections: int, timeout: float, socket_timeout: float
) -> redis.asyncio.Redis:
    """A client whose calls past the pool's size wait `timeout` seconds for a connection (the
    default pool refuses them at once); closing the client closes the pool."""
    import redis.asyncio

    pool = redis.asyncio.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=timeout, socket_timeout=socket_timeout
    )
    return redis.asyncio.Redis.from_pool(pool)


@contextmanager
def failures_as(make: Callable[[Exception], Exception]) -> Iterator[None]:
    """Raise `make(error)` for a redis-py error in the block, without the driver's error as
    its cause; other errors pass unchanged."""
    with driver_failures_as(is_error, make):
        yield


def is_error(error: BaseException) -> bool:
    """Whether `error` is redis-py's (none can be before redis-py was imported)."""
    driver = sys.modules.get("redis.exceptions")
    return driver is not None and isinstance(error, driver.RedisError)


def is_missing_script(error: BaseException) -> bool:
    """Redis does not know the script of an EVALSHA (restarted, or SCRIPT FLUSH)."""
    driver = sys.modules.get("redis.exceptions")
    return driver is not None and isinstance(error, driver.NoScriptError)
