"""An online store in Redis: what N stateless servers share.

Layout: one hash per entity, `{prefix}:{namespace}:{key}` (prefix `kairos`; namespaces are
identifiers, without ":"; the key as `codec.encode_key`, so 1 and "1" are different
entities), one field per feature. A field's
value is the feature's observed_at as 18 fixed-width digits (microseconds since
0001-01-01 UTC) followed by `codec.encode(value)`: the Lua script that writes compares the
digits without decoding the value.

A get is one pipeline of HMGETs (one per entity) and a put one pipeline of EVALSHAs (one per
chunk of items): one network round trip each.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kairos.backends.redis import open_client
from kairos.backends.url import redact as redact_url
from kairos.backends.url import take_options
from kairos.errors import KairosError, OnlineStoreUnavailable
from kairos.stores.codec import CorruptValue, decode, encode, encode_key, from_micros, to_micros
from kairos.stores.online.base import StoredValue, StoreKey

__all__ = ["OnlineStoreUnavailable", "RedisOnlineStore"]

if TYPE_CHECKING:
    import redis.asyncio as redis

DEFAULT_PREFIX = "kairos"

logger = logging.getLogger(__name__)

_DIGITS = 18  # microseconds from year 1 to year 9999 fit in 18 digits
_MIN_MICROS = to_micros(datetime.min.replace(tzinfo=UTC))
# Items per EVALSHA: a script blocks Redis while it runs, so a huge batch runs as several.
_CHUNK = 500

# KEYS: the chunk's entity hashes. ARGV: triples (index into KEYS, feature, payload).
# Digits 1-9 and 10-18 are compared as numbers: each half is exact in a Lua double.
_PUT_NEWEST = b"""
local function newer_or_equal(new, old)
  local old_high, old_low = tonumber(string.sub(old, 1, 9)), tonumber(string.sub(old, 10, 18))
  if not old_high or not old_low then
    return true
  end
  local new_high, new_low = tonumber(string.sub(new, 1, 9)), tonumber(string.sub(new, 10, 18))
  if new_high ~= old_high then
    return new_high > old_high
  end
  return new_low >= old_low
end

local written = 0
for i = 1, #ARGV, 3 do
  local key, field, payload = KEYS[tonumber(ARGV[i])], ARGV[i + 1], ARGV[i + 2]
  local old = redis.call('HGET', key, field)
  if not old or newer_or_equal(payload, old) then
    redis.call('HSET', key, field, payload)
    written = written + 1
  end
end
return written
"""
_PUT_NEWEST_SHA = hashlib.sha1(_PUT_NEWEST).hexdigest()


class RedisOnlineStore:
    """Online store in Redis. `?prefix=name` in the URL (or `prefix=`) sets the key prefix.

    >>> store = RedisOnlineStore("redis://127.0.0.1:6379/0")  # doctest: +SKIP
    >>> await store.put([(("user", "u1", "name"), StoredValue("Ann", now))])  # doctest: +SKIP
    >>> await store.get([("user", "u1", "name")])  # doctest: +SKIP
    [StoredValue(value='Ann', observed_at=...)]
    """

    def __init__(self, url: str, *, prefix: str | None = None) -> None:
        self._url, options = take_options(url, {"prefix"})
        self.prefix = prefix if prefix is not None else options.get("prefix", DEFAULT_PREFIX)
        if not self.prefix:
            raise KairosError(f"online store URL {redact_url(url)!r}: the key prefix is empty")
        # redis-py is imported by the first store, not by `import kairos`
        from redis.asyncio.connection import parse_url
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import NoScriptError, ResponseError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        self.unreachable = (RedisConnectionError, RedisTimeoutError)
        self.no_script = NoScriptError
        self.response_error = ResponseError  # a command Redis refused (a script's error)
        try:
            parse_url(self._url)  # a bad URL fails here, not at the first query
        except ValueError as error:
            raise KairosError(f"online store URL {redact_url(url)!r}: {error}") from None
        # A redis.asyncio client belongs to the event loop it first ran on; a kairos Client
        # runs one loop per calling thread, so the store keeps one client per loop.
        self._clients: dict[asyncio.AbstractEventLoop, redis.Redis] = {}
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"RedisOnlineStore({redact_url(self._url)!r}, prefix={self.prefix!r})"

    @property
    def url(self) -> str:
        """The server's URL, without kairos's own options (it may hold a password)."""
        return self._url

    def entity_key(self, namespace: str, key: Any) -> str:
        """The Redis hash that holds one entity's features: `kairos:user:"u1"`."""
        return f"{self.prefix}:{namespace}:{encode_key(key)}"

    async def get(self, keys: Sequence[StoreKey]) -> list[StoredValue | None]:
        if not keys:
            return []
        entities: dict[str, list[tuple[int, str]]] = {}  # hash -> (position, feature)
        names: dict[tuple[str, Any], str] = {}  # a query asks for many features of one entity
        for position, (namespace, key, name) in enumerate(keys):
            entity = names.get((namespace, key))
            if entity is None:
                entity = names[(namespace, key)] = self.entity_key(namespace, key)
            entities.setdefault(entity, []).append((position, name))
        client = self.client()
        try:
            if len(entities) == 1:  # the usual online query: skip the pipeline's bookkeeping
                entity, wanted = next(iter(entities.items()))
                replies: list[Any] = [await client.hmget(entity, [name for _, name in wanted])]
            else:
                async with client.pipeline(transaction=False) as pipe:
                    for entity, wanted in entities.items():
                        pipe.hmget(entity, [name for _, name in wanted])
                    replies = await pipe.execute()
        except self.unreachable as error:
            raise self.unavailable(error) from None
        values: list[StoredValue | None] = [None] * len(keys)
        for (entity, wanted), reply in zip(entities.items(), replies, strict=True):
            for (position, name), payload in zip(wanted, reply, strict=True):
                if payload is None:
                    continue
                try:
                    values[position] = _stored(payload)
                except CorruptValue as error:
                    # A cache miss is always safe: the resolver recomputes and the put replaces it.
                    logger.warning("%r: ignoring unreadable %s %s: %s", self, entity, name, error)
        return values

    async def put(self, items: Sequence[tuple[StoreKey, StoredValue]]) -> None:
        if not items:
            return
        # Encode everything first: a value that cannot be stored fails the put before any write.
        chunks = [self._script_args(items[i : i + _CHUNK]) for i in range(0, len(items), _CHUNK)]
        client = self.client()
        try:
            replies = await self._evalsha(client, chunks)
            unloaded = [
                c for c, r in zip(chunks, replies, strict=True) if isinstance(r, self.no_script)
            ]
            if unloaded:  # first put since Redis started (or SCRIPT FLUSH): load, then retry
                await client.script_load(_PUT_NEWEST)
                replies = [r for r in replies if not isinstance(r, self.no_script)]
                replies += await self._evalsha(client, unloaded)
        except self.unreachable as error:
            raise self.unavailable(error) from None
        for reply in replies:
            if isinstance(reply, Exception):
                raise KairosError(f"{self!r}: writing features failed: {reply}") from reply

    async def close(self) -> None:
        with self._lock:
            clients, self._clients = self._clients, {}
            self._closed = True
        current = asyncio.get_running_loop()
        for loop, client in clients.items():
            await _close_on(loop, current, client)

    # --- helpers --------------------------------------------------------------------------

    def client(self) -> redis.Redis:
        """The redis.asyncio client of the running event loop (one per loop, kept)."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is not None:
            return client
        with self._lock:
            if self._closed:
                raise KairosError(f"{self!r} is closed; create a new store")
            client = self._clients.get(loop)
            if client is None:
                # Loops closed without closing the store took their connections with them.
                for stale in [old for old in self._clients if old.is_closed()]:
                    del self._clients[stale]
                client = open_client(self._url, decode_responses=False)
                self._clients[loop] = client
            return client

    def _script_args(self, items: Sequence[tuple[StoreKey, StoredValue]]) -> list[Any]:
        entities: dict[str, int] = {}
        args: list[Any] = []
        for (namespace, key, name), stored in items:
            entity = self.entity_key(namespace, key)
            index = entities.setdefault(entity, len(entities) + 1)
            args += (index, name, _payload(stored))
        return [len(entities), *entities, *args]

    async def _evalsha(self, client: redis.Redis, chunks: list[list[Any]]) -> list[Any]:
        async with client.pipeline(transaction=False) as pipe:
            for args in chunks:
                pipe.evalsha(_PUT_NEWEST_SHA, *args)
            replies: list[Any] = await pipe.execute(raise_on_error=False)
            return replies

    def unavailable(self, error: Exception) -> OnlineStoreUnavailable:
        return OnlineStoreUnavailable(
            f"online store {redact_url(self._url)!r} is unreachable ({error}); is Redis running?"
        )


def _payload(stored: StoredValue) -> bytes:
    at = f"{to_micros(stored.observed_at) - _MIN_MICROS:0{_DIGITS}d}".encode()
    return at + encode(stored.value)


def _stored(payload: bytes) -> StoredValue:
    at = payload[:_DIGITS]
    if len(at) != _DIGITS or not at.isdigit():
        raise CorruptValue(f"stored value {payload[:40]!r} does not start with observed_at")
    try:
        observed_at = from_micros(int(at) + _MIN_MICROS)
    except OverflowError:
        raise CorruptValue(f"stored observed_at {at!r} is past year 9999") from None
    return StoredValue(decode(payload[_DIGITS:]), observed_at)


async def _close_on(
    loop: asyncio.AbstractEventLoop, current: asyncio.AbstractEventLoop, client: redis.Redis
) -> None:
    """Close a client on the loop its connections belong to."""
    if loop is current:
        await client.aclose()
    elif loop.is_closed():
        return  # its connections went with it
    elif loop.is_running():  # another thread's loop, busy: ask it
        future = asyncio.run_coroutine_threadsafe(client.aclose(), loop)
        try:
            await asyncio.wait_for(asyncio.wrap_future(future), timeout=5)
        except TimeoutError:
            logger.warning("gave up closing Redis connections of a busy event loop after 5s")
    else:  # another thread's idle loop: run it briefly on a worker thread
        closing = client.aclose()
        try:
            await asyncio.to_thread(loop.run_until_complete, closing)
        except RuntimeError:  # its thread started it meanwhile: leave the client to it
            closing.close()
