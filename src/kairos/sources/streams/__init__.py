"""Brokers that feed events to kairos: Redis Streams (consumer groups), NATS JetStream
(durable pull consumers) and Kafka (consumer groups, aiokafka), behind one `Stream` protocol.

A stream hands out messages in batches; a message is acknowledged only after the events it
carries are durable (the consumer's job), so a consumer killed mid-batch gets the batch again
when it restarts: delivery is at least once, and the event id makes a repeat count once.

    >>> stream = stream_from_config("payments", {"kind": "redis", "url": "redis://...",
    ...                                          "stream": "payments", "events": "transaction"})
    >>> batch = await stream.read(500, timeout=1.0)
    >>> await stream.ack(batch); await stream.close()
"""

from __future__ import annotations

from typing import Any

from kairos.errors import KairosError
from kairos.sources.streams.base import Message, Stream, StreamSpec
from kairos.sources.streams.kafka import KafkaStream
from kairos.sources.streams.nats import NatsStream
from kairos.sources.streams.redis import RedisStream

KINDS = ("redis", "nats", "kafka")


def stream_from_config(name: str, raw: Any, where: str = "kairos.yaml") -> Stream:
    """The stream a `streams:` entry names (connecting lazily, on the first read)."""
    spec = StreamSpec.parse(name, raw, where)
    if spec.kind == "redis":
        return RedisStream(spec)
    if spec.kind == "nats":
        return NatsStream(spec)
    if spec.kind == "kafka":
        return KafkaStream(spec)
    raise KairosError(  # pragma: no cover - StreamSpec.parse checks the kind
        f"{where}: streams.{name}.kind {spec.kind!r} is not one of {', '.join(KINDS)}"
    )


__all__ = ["KINDS", "KafkaStream", "Message", "NatsStream", "RedisStream", "Stream",
           "StreamSpec", "stream_from_config"]  # fmt: skip
