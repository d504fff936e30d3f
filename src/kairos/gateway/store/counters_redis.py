"""Counters in Redis, shared by every gateway process: a hold and a settle are each one Lua
script, which Redis runs without interleaving anything else. Rate windows carry a TTL; a hold
is a hash that expires with its lease (its charge stays)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kairos.backends.redis import blocking_client, failures_as, is_missing_script
from kairos.backends.url import take_options
from kairos.gateway.accounting.counters import Line, process_holds
from kairos.gateway.errors import AccountingUnavailable

if TYPE_CHECKING:
    from redis.asyncio import Redis

# KEYS: counters..., then the hold. ARGV: n, then limit, amount, ttl_ms per counter, lease_ms.
_HOLD = b"""
local n = tonumber(ARGV[1])
for i = 1, n do
  local spent = tonumber(redis.call('GET', KEYS[i]) or '0')
  if spent + tonumber(ARGV[3 * i]) > tonumber(ARGV[3 * i - 1]) then
    return i - 1
  end
end
local hold = KEYS[n + 1]
for i = 1, n do
  redis.call('INCRBY', KEYS[i], ARGV[3 * i])
  local ttl = tonumber(ARGV[3 * i + 1])
  if ttl > 0 and redis.call('PTTL', KEYS[i]) < 0 then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
  redis.call('HSET', hold, KEYS[i], ARGV[3 * i])
end
redis.call('HSET', hold, '', '1')
redis.call('PEXPIRE', hold, ARGV[3 * n + 2])
return -1
"""
# KEYS: the hold, then counters... ARGV: the actual amount per counter, in KEYS' order.
_SETTLE = b"""
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
for i = 2, #KEYS do
  local held = tonumber(redis.call('HGET', KEYS[1], KEYS[i]) or ARGV[i - 1])
  local delta = tonumber(ARGV[i - 1]) - held
  if delta ~= 0 and redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('INCRBY', KEYS[i], delta)
  end
end
redis.call('DEL', KEYS[1])
return 1
"""
_SHAS = {script: hashlib.sha1(script).hexdigest() for script in (_HOLD, _SETTLE)}


class RedisCounters:
    """`redis://host:port/db?prefix=name` (prefix `kairos-gw`); one Redis, not a cluster."""

    def __init__(self, url: str) -> None:
        self._url, options = take_options(url, {"prefix"})
        self.prefix = options.get("prefix", "kairos-gw")
        self._client: Redis | None = None

    def _redis(self) -> Redis:
        if self._client is None:
            # calls past the pool's size wait for a connection (the default pool refuses
            # them: a burst of 100+ calls would fail); 64 in flight are plenty for one Redis
            self._client = blocking_client(
                self._url, max_connections=64, timeout=5, socket_timeout=5
            )
        return self._client

    def _key(self, counter: str) -> str:
        return f"{self.prefix}:c:{counter}"

    async def _script(self, script: bytes, keys: list[str], args: list[Any]) -> Any:
        client = self._redis()
        with failures_as(_failed("; nothing was charged")):
            try:
                return await client.evalsha(_SHAS[script], len(keys), *keys, *args)
            except Exception as error:
                if not is_missing_script(error):
                    raise
                return await client.eval(script.decode(), len(keys), *keys, *args)

    async def spent(self, counters: Sequence[str]) -> list[int]:
        with failures_as(_failed()):
            values = await self._redis().mget([self._key(c) for c in counters])
        return [int(v) if v is not None else 0 for v in values]

    async def hold(self, hold_id: str, lines: Sequence[Line], lease_until: float) -> int | None:
        now = time.time()
        args: list[Any] = [len(lines)]
        for line in lines:
            ttl = 0 if line.expires_at is None else max(1, int((line.expires_at - now) * 1000))
            args += [line.limit, line.amount, ttl]
        args.append(max(1, int((lease_until - now) * 1000)))
        keys = [self._key(line.counter) for line in lines] + [f"{self.prefix}:h:{hold_id}"]
        refused = int(await self._script(_HOLD, keys, args))
        return None if refused < 0 else refused

    async def settle(self, hold_id: str, actual: Mapping[str, int]) -> bool:
        counters = list(actual)
        keys = [f"{self.prefix}:h:{hold_id}"] + [self._key(c) for c in counters]
        return bool(await self._script(_SETTLE, keys, [actual[c] for c in counters]))

    async def orphans(self, process: str) -> list[tuple[str, dict[str, int]]]:
        client, counter_key = self._redis(), self._key("")
        found = []
        with failures_as(_failed()):
            for low, _ in process_holds(process):
                async for name in client.scan_iter(match=f"{self.prefix}:h:{low}*", count=1000):
                    fields = await client.hgetall(name)
                    held = {
                        _text(field).removeprefix(counter_key): int(amount)
                        for field, amount in fields.items()
                        if field  # the '' field only marks the hold as existing
                    }
                    found.append((_text(name).removeprefix(f"{self.prefix}:h:"), held))
        return sorted(found)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _failed(after: str = "") -> Callable[[Exception], Exception]:
    """The AccountingUnavailable a Redis error becomes (the store fails closed)."""
    return lambda error: AccountingUnavailable(
        f"the gateway's budget store (Redis) failed ({type(error).__name__}){after}"
    )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
