"""NATS JetStream: a durable pull consumer named `group` on the stream that holds `stream`
(a subject), fetched in batches and acknowledged once the events are durable; what is not
acknowledged is delivered again after the consumer's ack wait. Poison messages are published
to `<subject>.dead` (with the reason in a header) and terminated, so they are not redelivered.

nats-py is imported when a stream connects, not when kairos is (`pip install 'kairos[streams]'`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kairos.errors import BackendUnavailable, KairosError
from kairos.sources.streams.base import Message, StreamSpec, unavailable


class NatsStream:
    def __init__(self, spec: StreamSpec) -> None:
        self.spec = spec
        self._connection: Any = None
        self._subscription: Any = None
        self._jetstream: Any = None

    def _unavailable(self, error: Exception) -> BackendUnavailable:
        return unavailable(self.spec, error)

    async def _subscribed(self) -> Any:
        if self._subscription is None:
            try:
                import nats
            except ImportError:
                raise KairosError(
                    f"stream {self.spec.name!r} is kind nats: pip install 'kairos[streams]'"
                ) from None
            try:
                connection = await nats.connect(self.spec.url, connect_timeout=5,
                                                max_reconnect_attempts=2)  # fmt: skip
                jetstream = connection.jetstream()
                config = nats.js.api.ConsumerConfig(
                    ack_wait=self.spec.claim_after, max_ack_pending=self.spec.batch * 4
                )
                self._subscription = await jetstream.pull_subscribe(
                    self.spec.stream, durable=self.spec.group, config=config
                )
            except Exception as error:  # nats-py's errors share no base class with OSError
                raise self._unavailable(error) from None
            self._connection, self._jetstream = connection, jetstream
        return self._subscription

    async def read(self, count: int, timeout: float) -> list[Message]:
        subscription = await self._subscribed()
        try:
            got = await subscription.fetch(count, timeout=max(timeout, 0.001))
        except TimeoutError:  # nats-py's own, or at times the builtin one: nothing came
            return []
        except Exception as error:
            raise self._unavailable(error) from None
        return [
            Message(
                str(msg.metadata.sequence.stream),
                bytes(msg.data),
                {"subject": msg.subject, "headers": dict(msg.headers or {})},
                msg,
            )
            for msg in got
        ]

    async def ack(self, messages: Sequence[Message]) -> None:
        try:
            for message in messages:
                await message.handle.ack()
        except Exception as error:
            raise self._unavailable(error) from None

    async def dead_letter(self, message: Message, reason: str) -> None:
        await self._subscribed()
        try:
            headers = {"Kairos-Reason": reason[:2000].replace("\n", " "),
                       "Kairos-Id": message.id}  # fmt: skip
            await self._connection.publish(self.spec.dead, message.body, headers=headers)
            await self._connection.flush()
            await message.handle.term()
        except Exception as error:
            raise self._unavailable(error) from None

    async def redeliver(self) -> None:
        return None  # JetStream delivers what was not acknowledged again after its ack wait

    async def lag(self) -> int | None:
        subscription = await self._subscribed()
        try:
            info = await subscription.consumer_info()
        except Exception:
            return None
        return int(info.num_pending) if info.num_pending is not None else None

    async def close(self) -> None:
        if self._connection is not None:  # every message taken is acknowledged or not: close
            await self._connection.close()
            self._connection = self._subscription = self._jetstream = None
