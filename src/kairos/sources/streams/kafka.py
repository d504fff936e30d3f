"""Kafka: a consumer group (`group`) on the topic `stream`, read with aiokafka; offsets are
committed only after a batch's events are written (and its poison published to
`<topic>.dead` with the reason in a header), so a consumer killed mid-batch reads it again.
Nothing here is broker-specific: it runs against any Kafka-protocol broker.

aiokafka is imported when a stream connects (`pip install 'kairos-inference[streams]'`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kairos.errors import BackendUnavailable, KairosError
from kairos.sources.streams.base import Message, StreamSpec, unavailable


class KafkaStream:
    def __init__(self, spec: StreamSpec) -> None:
        self.spec = spec
        self._consumer: Any = None
        self._producer: Any = None
        self._settled: dict[Any, int] = {}  # partition -> next offset dead-lettered up to

    @property
    def _servers(self) -> str:
        return self.spec.url.split("://", 1)[-1].rstrip("/")

    def _unavailable(self, error: Exception) -> BackendUnavailable:
        return unavailable(self.spec, error)

    async def _started(self) -> Any:
        if self._consumer is None:
            try:
                from aiokafka import AIOKafkaConsumer
            except ImportError:
                raise KairosError(
                    f"stream {self.spec.name!r} is kind kafka: "
                    "pip install 'kairos-inference[streams]'"
                ) from None
            consumer = AIOKafkaConsumer(
                self.spec.stream,
                bootstrap_servers=self._servers,
                group_id=self.spec.group,
                client_id=self.spec.consumer,
                enable_auto_commit=False,  # offsets move only once events are written
                auto_offset_reset="earliest",
            )
            try:
                await consumer.start()
            except Exception as error:  # aiokafka's errors share no base with OSError
                await consumer.stop()
                raise self._unavailable(error) from None
            self._consumer = consumer
        return self._consumer

    async def read(self, count: int, timeout: float) -> list[Message]:
        consumer = await self._started()
        try:
            got = await consumer.getmany(timeout_ms=max(1, int(timeout * 1000)), max_records=count)
        except Exception as error:
            raise self._unavailable(error) from None
        return [
            Message(
                f"{record.topic}:{record.partition}:{record.offset}",
                bytes(record.value or b""),
                {
                    "topic": record.topic,
                    "partition": record.partition,
                    "key": record.key,
                    "headers": dict(record.headers or ()),
                },
                (partition, record.offset),
            )
            for partition, records in got.items()
            for record in records
        ]

    async def ack(self, messages: Sequence[Message]) -> None:
        offsets = dict(self._settled)
        for message in messages:
            partition, offset = message.handle
            offsets[partition] = max(offsets.get(partition, 0), offset + 1)
        if not offsets:
            return
        consumer = await self._started()
        try:
            await consumer.commit(offsets)
        except Exception as error:
            raise self._unavailable(error) from None
        self._settled.clear()

    async def dead_letter(self, message: Message, reason: str) -> None:
        try:
            if self._producer is None:
                from aiokafka import AIOKafkaProducer

                producer = AIOKafkaProducer(bootstrap_servers=self._servers)
                await producer.start()
                self._producer = producer
            headers = [("kairos-reason", reason[:2000].encode()),
                       ("kairos-id", message.id.encode())]  # fmt: skip
            await self._producer.send_and_wait(self.spec.dead, message.body, headers=headers)
        except Exception as error:
            raise self._unavailable(error) from None
        partition, offset = message.handle  # committed with the batch it came in
        self._settled[partition] = max(self._settled.get(partition, 0), offset + 1)

    async def redeliver(self) -> None:
        """After a batch failed: read again from the last committed offsets."""
        if self._consumer is None:
            return
        self._settled.clear()
        try:
            for partition in self._consumer.assignment():
                committed = await self._consumer.committed(partition)
                if committed is None:
                    await self._consumer.seek_to_beginning(partition)
                else:
                    self._consumer.seek(partition, committed)
        except Exception as error:
            raise self._unavailable(error) from None

    async def lag(self) -> int | None:
        if self._consumer is None:
            return None
        total = 0
        for partition in self._consumer.assignment():
            high = self._consumer.highwater(partition)
            if high is None:
                return None
            total += max(0, high - await self._consumer.position(partition))
        return total

    async def close(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
