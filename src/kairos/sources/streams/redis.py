"""Redis Streams: a consumer group per `group`, read with XREADGROUP, acknowledged with
XACK once the events are durable. Messages another consumer took and never acknowledged are
claimed after `claim_after` seconds (XAUTOCLAIM); this consumer's own (it was killed) are
read again first. Poison messages are added to `<stream>.dead` with the reason."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from kairos.errors import BackendUnavailable
from kairos.sources.streams.base import Message, StreamSpec, unavailable

BODY = "data"  # the entry field holding the JSON event


class RedisStream:
    def __init__(self, spec: StreamSpec) -> None:
        self.spec = spec
        self._redis: aioredis.Redis | None = None
        self._own_pending = True  # start with what this consumer was given and did not ack

    async def _client(self) -> aioredis.Redis:
        if self._redis is None:
            client = aioredis.Redis.from_url(self.spec.url)
            try:
                await client.xgroup_create(self.spec.stream, self.spec.group, id="0", mkstream=True)
            except ResponseError as error:
                if "BUSYGROUP" not in str(error):
                    await client.aclose()
                    raise self._unavailable(error) from None
            except (RedisError, OSError) as error:
                await client.aclose()
                raise self._unavailable(error) from None
            self._redis = client
        return self._redis

    def _unavailable(self, error: Exception) -> BackendUnavailable:
        return unavailable(self.spec, error)

    async def read(self, count: int, timeout: float) -> list[Message]:
        redis = await self._client()
        spec = self.spec
        try:
            if self._own_pending:
                got = await redis.xreadgroup(
                    spec.group, spec.consumer, {spec.stream: "0"}, count=count
                )
                messages = _messages(got)
                if messages:
                    return messages
                self._own_pending = False  # every message delivered before is acknowledged
            _, claimed, *_ = await redis.xautoclaim(
                spec.stream, spec.group, spec.consumer,
                min_idle_time=int(spec.claim_after * 1000), start_id="0-0", count=count,
            )  # fmt: skip
            if claimed:
                return [_message(entry_id, fields) for entry_id, fields in claimed if fields]
            got = await redis.xreadgroup(
                spec.group, spec.consumer, {spec.stream: ">"}, count=count,
                block=max(1, int(timeout * 1000)),
            )  # fmt: skip
        except (RedisError, OSError) as error:
            raise self._unavailable(error) from None
        return _messages(got)

    async def ack(self, messages: Sequence[Message]) -> None:
        if not messages:
            return
        redis = await self._client()
        try:
            await redis.xack(self.spec.stream, self.spec.group, *[m.id for m in messages])
        except (RedisError, OSError) as error:
            raise self._unavailable(error) from None

    async def dead_letter(self, message: Message, reason: str) -> None:
        redis = await self._client()
        entry: dict[Any, Any] = {"reason": reason[:2000], "id": message.id, BODY: message.body}
        try:
            async with redis.pipeline(transaction=True) as pipe:
                pipe.xadd(self.spec.dead, entry)
                pipe.xack(self.spec.stream, self.spec.group, message.id)
                await pipe.execute()
        except (RedisError, OSError) as error:
            raise self._unavailable(error) from None

    async def redeliver(self) -> None:
        self._own_pending = True  # what this consumer was given and did not acknowledge

    async def lag(self) -> int | None:
        redis = await self._client()
        try:
            groups = await redis.xinfo_groups(self.spec.stream)
        except (RedisError, OSError):
            return None
        for group in groups:
            name = group.get("name")
            if name in (self.spec.group, self.spec.group.encode()):
                lag = group.get("lag")
                return int(lag) if lag is not None else None
        return None

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None


def _messages(got: Any) -> list[Message]:
    found = []
    for _stream, entries in got or []:
        for entry_id, fields in entries:
            if fields:  # a deleted entry still pending comes back without fields
                found.append(_message(entry_id, fields))
    return found


def _message(entry_id: Any, fields: dict[Any, Any]) -> Message:
    decoded = {_text(k): v for k, v in fields.items()}
    body = decoded.get(BODY, b"")
    return Message(_text(entry_id), body if isinstance(body, bytes) else str(body).encode(),
                   decoded)  # fmt: skip


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
