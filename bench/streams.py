"""Streams into windowed features, per broker (Redis Streams, NATS JetStream, Kafka): sustained
events/s a consumer writes (goal >= 10k/s) and freshness, publish -> visible in a windowed
query, p50 and p99 (goal p99 <= 100 ms), each against the floor of the broker's own client in
the same run: reading and acknowledging the same messages in batches of the same size, and
publish -> a waiting read returns the message.

    .venv/bin/python bench/streams.py [--brokers redis,nats,kafka] [--events 50000]
                                      [--samples 300] [--batch 500]

Redis and NATS are this machine's (127.0.0.1:6379, :4222); the Kafka-protocol broker is the
one the tests start (noida-db, tests/sources/kafka_broker.py), started here in a temporary
folder. Every broker is read the way kairos reads it (kairos.sources.streams); the floor uses
the same client library (redis-py, nats-py, aiokafka) with nothing of kairos around it. Before
any timing, one message goes through each reader and consumer, so connecting and joining a
consumer group are not counted.
"""

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, Self

import redis.asyncio as aioredis

import kairos as kr
from kairos import DataFrame, FeatureTime, Windowed, _, features, windowed
from kairos.client.consume import Consumer, consumers_for
from kairos.project.config import Config

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = "redis://127.0.0.1:6379/0"
NATS_URL = "nats://127.0.0.1:4222"
BROKERS = ("redis", "nats", "kafka")
T0 = datetime(2026, 6, 1, 12, tzinfo=UTC)
GOAL_EVENTS_PER_S = 10_000
GOAL_P99_MS = 100.0
WAIT = 1.0  # seconds a read waits for a message before the bench calls it lost


@features(events=True)
class Payment:
    id: str
    payer_id: "Payer.id"
    amount: float
    at: FeatureTime


@features
class Payer:
    id: str
    payments: DataFrame[Payment]
    paid: Windowed[int] = windowed("7d", expression=_.payments[_.at > _.window_start].count())


def payment(i: int, payer: str) -> bytes:
    at = (T0 - timedelta(seconds=i % 86_400)).isoformat()
    return json.dumps({"id": f"e{i}", "payer_id": payer, "amount": 1.0, "at": at}).encode()


def percentile(samples: list[float], q: int) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


class Broker(Protocol):
    """One broker through its own client: what the bench publishes with, and the floor's
    reader (subscribe, fetch, settle: read and acknowledge with nothing of kairos)."""

    kind: str
    url: str
    sends: str  # the client calls that publish, and that read and acknowledge (the table)
    reads: str

    def name(self, role: str) -> str: ...
    async def create(self, stream: str) -> None: ...
    async def publish(self, stream: str, bodies: Sequence[bytes]) -> None: ...
    async def subscribe(self, stream: str) -> Any: ...
    async def fetch(self, reader: Any, count: int, timeout: float) -> list[Any]: ...
    async def settle(self, reader: Any, messages: list[Any]) -> None: ...
    async def unsubscribe(self, reader: Any) -> None: ...
    async def drop(self, stream: str) -> None: ...
    async def close(self) -> None: ...


class RedisBroker:
    kind, url, sends, reads = "redis", REDIS_URL, "XADD", "XREADGROUP + XACK"

    def __init__(self) -> None:
        self.redis = aioredis.Redis.from_url(REDIS_URL)

    def name(self, role: str) -> str:
        return f"kairos-bench-{role}-{uuid.uuid4().hex[:8]}"

    async def create(self, stream: str) -> None:
        await self.redis.xgroup_create(stream, "floor", id="$", mkstream=True)

    async def publish(self, stream: str, bodies: Sequence[bytes]) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            for body in bodies:
                pipe.xadd(stream, {"data": body})
            await pipe.execute()

    async def subscribe(self, stream: str) -> Any:
        return stream, aioredis.Redis.from_url(REDIS_URL)

    async def fetch(self, reader: Any, count: int, timeout: float) -> list[Any]:
        stream, client = reader
        got = await client.xreadgroup("floor", "c", {stream: ">"}, count=count,
                                      block=int(timeout * 1000))  # fmt: skip
        return [entry_id for entry_id, _fields in got[0][1]] if got else []

    async def settle(self, reader: Any, messages: list[Any]) -> None:
        stream, client = reader
        await client.xack(stream, "floor", *messages)

    async def unsubscribe(self, reader: Any) -> None:
        await reader[1].aclose()

    async def drop(self, stream: str) -> None:
        await self.redis.delete(stream, f"{stream}.dead")

    async def close(self) -> None:
        await self.redis.aclose()


class NatsBroker:
    """JetStream: a stream per subject; js.publish waits for the stream's ack, as a
    producer that must not lose an event would; the floor is a durable pull consumer."""

    kind, url, sends, reads = "nats", NATS_URL, "js.publish", "pull fetch + ack"

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.js = connection.jetstream()

    @classmethod
    async def connect(cls) -> Self:
        import nats

        return cls(await nats.connect(NATS_URL))

    def name(self, role: str) -> str:
        return f"kairos.bench.{role}.{uuid.uuid4().hex[:8]}"

    async def create(self, stream: str) -> None:
        await self.js.add_stream(name=stream.replace(".", "_"), subjects=[stream])

    async def publish(self, stream: str, bodies: Sequence[bytes]) -> None:
        for start in range(0, len(bodies), 1000):  # acks awaited 1000 at a time
            await asyncio.gather(
                *(self.js.publish(stream, b) for b in bodies[start : start + 1000])
            )

    async def subscribe(self, stream: str) -> Any:
        import nats

        config = nats.js.api.ConsumerConfig(ack_wait=30, max_ack_pending=4 * 10_000)
        return await self.js.pull_subscribe(stream, durable="floor", config=config)

    async def fetch(self, reader: Any, count: int, timeout: float) -> list[Any]:
        import nats.errors

        try:
            return list(await reader.fetch(count, timeout=timeout))
        except nats.errors.TimeoutError:
            return []

    async def settle(self, reader: Any, messages: list[Any]) -> None:
        for message in messages:
            await message.ack()

    async def unsubscribe(self, reader: Any) -> None:
        await reader.unsubscribe()

    async def drop(self, stream: str) -> None:
        await self.js.delete_stream(stream.replace(".", "_"))

    async def close(self) -> None:
        await self.connection.close()


class KafkaBroker:
    """A topic of one partition; the producer sends and waits for the broker's ack; the floor
    is a consumer group that commits each batch's offsets, as kairos does."""

    kind, sends, reads = "kafka", "send_and_wait", "getmany + commit"

    def __init__(self, url: str, producer: Any) -> None:
        self.url = url
        self.servers = url.removeprefix("kafka://")
        self.producer = producer

    @classmethod
    async def connect(cls, url: str) -> Self:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=url.removeprefix("kafka://"))
        await producer.start()
        return cls(url, producer)

    def name(self, role: str) -> str:
        return f"kairos-bench-{role}-{uuid.uuid4().hex[:8]}"

    async def create(self, stream: str) -> None:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        admin = AIOKafkaAdminClient(bootstrap_servers=self.servers)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(stream, num_partitions=1, replication_factor=1)])
        finally:
            await admin.close()

    async def publish(self, stream: str, bodies: Sequence[bytes]) -> None:
        if len(bodies) == 1:
            await self.producer.send_and_wait(stream, bodies[0])
            return
        sent = [await self.producer.send(stream, body) for body in bodies]
        await asyncio.gather(*sent)

    async def subscribe(self, stream: str) -> Any:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(
            stream,
            bootstrap_servers=self.servers,
            group_id="floor",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        return consumer

    async def fetch(self, reader: Any, count: int, timeout: float) -> list[Any]:
        got = await reader.getmany(timeout_ms=int(timeout * 1000), max_records=count)
        return [(partition, record) for partition, records in got.items() for record in records]

    async def settle(self, reader: Any, messages: list[Any]) -> None:
        offsets: dict[Any, int] = {}
        for partition, record in messages:
            offsets[partition] = max(offsets.get(partition, 0), record.offset + 1)
        await reader.commit(offsets)

    async def unsubscribe(self, reader: Any) -> None:
        await reader.stop()

    async def drop(self, stream: str) -> None:
        return None  # the broker and its folder go when the bench ends

    async def close(self) -> None:
        await self.producer.stop()


@dataclass
class Result:
    floor_rate: float
    rate: float  # events/s into the window, events in the index only
    durable: float  # events/s with the events kept in DuckDB first (the default)
    floor: list[float]  # publish -> read, ms
    latencies: list[float]  # publish -> visible in a windowed query, ms
    shared: float  # events/s into windows in Redis (a Redis online store: every server's)
    shared_latencies: list[float]  # publish -> visible, windows in Redis, ms


def client_for(broker: Broker, folder: Path, stream: str, batch: int,
               offline: str = "none://", online: str = "memory://") -> kr.Client:  # fmt: skip
    spec = {"kind": broker.kind, "url": broker.url, "stream": stream, "events": "payment",
            "batch": batch, "group": "kairos"}  # fmt: skip
    config = Config(base_dir=folder, streams={"payments": spec}, offline_store=offline,
                    online_store=online)  # fmt: skip
    return kr.Client(definitions=[Payment, Payer], config=config, query_log="none://")


async def paid(client: kr.Client, payer: str) -> int:
    result = await client.query_async({"payer.id": payer}, ["payer.paid[7d]"], now=T0)
    return int(result.get_value("payer.paid[7d]"))


async def warm_reader(broker: Broker, stream: str, reader: Any) -> None:
    """One message through the floor's reader: connected, its group joined."""
    await broker.publish(stream, [payment(-1, "warm")])
    deadline = time.monotonic() + 30
    while not (got := await broker.fetch(reader, 1, WAIT)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{broker.kind}: the floor's reader got nothing in 30 s")
    await broker.settle(reader, got)


async def visible(client: kr.Client, payer: str, count: int, seconds: float) -> None:
    """Query until the window over `payer` counts `count` events."""
    deadline = time.monotonic() + seconds
    while await paid(client, payer) != count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{payer}: {await paid(client, payer)} events, not {count}")
        await asyncio.sleep(0.0005)


async def warm_consumer(broker: Broker, stream: str, client: kr.Client,
                        consumer: Consumer) -> None:  # fmt: skip
    """One event through the kairos consumer: connected, its group joined."""
    await broker.publish(stream, [payment(-1, "warm")])
    deadline = time.monotonic() + 30
    while not await consumer.step(WAIT):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{broker.kind}: the kairos consumer got nothing in 30 s")
    await visible(client, "warm", 1, 5)


async def floor_throughput(broker: Broker, events: int, batch: int) -> float:
    """The broker's client reads and acknowledges `events` waiting messages: messages/s."""
    stream = broker.name("floor")
    await broker.create(stream)
    reader = await broker.subscribe(stream)
    try:
        await warm_reader(broker, stream, reader)
        await broker.publish(stream, [payment(i, f"p{i % 100}") for i in range(events)])
        started = time.perf_counter()
        done = 0
        while done < events:
            got = await broker.fetch(reader, min(batch, events - done), WAIT)
            if not got:
                raise RuntimeError(f"{broker.kind}: {done} of {events} messages read")
            await broker.settle(reader, got)
            done += len(got)
        return events / (time.perf_counter() - started)
    finally:
        await broker.unsubscribe(reader)
        await broker.drop(stream)


async def consumer_throughput(broker: Broker, folder: Path, events: int, batch: int,
                              offline: str, online: str = "memory://") -> float:  # fmt: skip
    """The kairos consumer writes `events` waiting messages into the window: events/s, from
    its first read to the last batch acknowledged (not the idle read that ends it)."""
    stream = broker.name("events")
    await broker.create(stream)
    try:
        with client_for(broker, folder, stream, batch, offline, online) as client:
            [consumer] = consumers_for(client)
            try:
                await warm_consumer(broker, stream, client, consumer)
                await broker.publish(stream, [payment(i, f"p{i % 100}") for i in range(events)])
                started = last = time.perf_counter()
                while await consumer.step(0.05):
                    last = time.perf_counter()
            finally:
                await consumer.close()
            if consumer.stats.events != events + 1:
                raise RuntimeError(f"{broker.kind}: {consumer.stats} for {events} events")
            total = sum([await paid(client, f"p{k}") for k in range(100)])
            if total != events:
                raise RuntimeError(f"{broker.kind}: the windows count {total} of {events}")
            await client.aclose()  # on this loop, which its Redis connections belong to
        return events / (last - started)
    finally:
        await broker.drop(stream)


async def floor_round_trip(broker: Broker, samples: int) -> list[float]:
    """Publish one message while the broker's client waits for it: ms until it has it."""
    stream = broker.name("trip")
    await broker.create(stream)
    reader = await broker.subscribe(stream)
    latencies: list[float] = []
    try:
        await warm_reader(broker, stream, reader)
        for i in range(samples):
            started = time.perf_counter()
            read = asyncio.ensure_future(broker.fetch(reader, 1, WAIT))
            await asyncio.sleep(0)  # the read is waiting before the message is published
            await broker.publish(stream, [payment(10_000_000 + i, "floor")])
            got = await read
            latencies.append((time.perf_counter() - started) * 1000)
            if not got:
                raise RuntimeError(f"{broker.kind}: sample {i} not read in {WAIT} s")
            await broker.settle(reader, got)
        return latencies
    finally:
        await broker.unsubscribe(reader)
        await broker.drop(stream)


async def freshness(broker: Broker, folder: Path, samples: int, batch: int,
                    online: str = "memory://") -> list[float]:  # fmt: skip
    """Publish one event while the kairos consumer runs, then query until the window counts
    it: ms per sample."""
    stream = broker.name("fresh")
    await broker.create(stream)
    latencies: list[float] = []
    try:
        with client_for(broker, folder, stream, batch, online=online) as client:
            [consumer] = consumers_for(client)
            stop = asyncio.Event()
            try:
                await warm_consumer(broker, stream, client, consumer)
                running = asyncio.ensure_future(consumer.run(stop, idle=0.05))
                for i in range(samples):
                    started = time.perf_counter()
                    await broker.publish(stream, [payment(i, "p-fresh")])
                    await visible(client, "p-fresh", i + 1, 10)
                    latencies.append((time.perf_counter() - started) * 1000)
                stop.set()
                await running
            finally:
                await consumer.close()
            await client.aclose()
        return latencies
    finally:
        await broker.drop(stream)


async def connected(kind: str, kafka_url: str) -> Broker:
    if kind == "redis":
        return RedisBroker()
    if kind == "nats":
        return await NatsBroker.connect()
    return await KafkaBroker.connect(kafka_url)


async def measure(broker: Broker, folder: Path, args: argparse.Namespace) -> Result:
    redis = f"{REDIS_URL}?prefix=bench-windows-{uuid.uuid4().hex[:8]}"
    try:
        duckdb = f"duckdb:///{folder / 'offline.duckdb'}"
        return Result(
            floor_rate=await floor_throughput(broker, args.events, args.batch),
            rate=await consumer_throughput(broker, folder, args.events, args.batch, "none://"),
            durable=await consumer_throughput(broker, folder, args.events, args.batch, duckdb),
            floor=await floor_round_trip(broker, args.samples),
            latencies=await freshness(broker, folder, args.samples, args.batch),
            shared=await consumer_throughput(
                broker, folder, args.events, args.batch, "none://", redis
            ),
            shared_latencies=await freshness(broker, folder, args.samples, args.batch, redis),
        )
    finally:
        await broker.close()
        await drop_prefix(redis.rpartition("prefix=")[2])


async def drop_prefix(prefix: str) -> None:
    """The windows the Redis-windows runs left."""
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=5000)]
        for start in range(0, len(keys), 5000):
            await client.delete(*keys[start : start + 5000])
    finally:
        await client.aclose()


async def bench(kind: str, kafka_url: str, folder: Path,
                args: argparse.Namespace) -> list[tuple[str, ...]]:  # fmt: skip
    broker = await connected(kind, kafka_url)
    return rows_for(broker, await measure(broker, folder, args), args)


@contextlib.contextmanager
def kafka_started(folder: Path, wanted: bool) -> Iterator[str]:
    if not wanted:
        yield ""
        return
    sys.path.insert(0, str(ROOT))
    from tests.sources.kafka_broker import kafka_broker

    (folder / "broker").mkdir()
    with kafka_broker(folder / "broker") as url:
        yield url


def rows_for(broker: Broker, result: Result, args: argparse.Namespace) -> list[tuple[str, ...]]:
    def rate_row(what: str, rate: float) -> tuple[str, ...]:
        goal = "ok" if rate >= GOAL_EVENTS_PER_S else "MISSED"
        return (broker.kind, f"{what}, {args.events:,} events", f"{rate:,.0f} events/s",
                f"{rate / result.floor_rate:.1%} of floor",
                f">= {GOAL_EVENTS_PER_S:,}/s: {goal}")  # fmt: skip

    def spread(samples: list[float]) -> str:
        return f"p50 {statistics.median(samples):.2f} ms, p99 {percentile(samples, 99):.2f} ms"

    def fresh_row(what: str, samples: list[float]) -> tuple[str, ...]:
        p50, p99 = statistics.median(samples), percentile(samples, 99)
        return (broker.kind, what, spread(samples),
                f"p50 {p50 / statistics.median(result.floor):.1f}x, "
                f"p99 {p99 / percentile(result.floor, 99):.1f}x floor",
                f"p99 <= {GOAL_P99_MS:.0f} ms: {'ok' if p99 <= GOAL_P99_MS else 'MISSED'}")  # fmt: skip  # noqa: E501

    return [
        (broker.kind, f"floor: {broker.reads}, batches of {args.batch}",
         f"{result.floor_rate:,.0f} messages/s", "floor", ""),
        rate_row("consumed into a window (index only)", result.rate),
        rate_row("consumed, events kept in DuckDB first (the default)", result.durable),
        (broker.kind, f"floor: {broker.sends} -> waiting read, "
         f"{args.samples} samples", spread(result.floor), "floor", ""),
        fresh_row("publish -> visible in a windowed query", result.latencies),
        rate_row("consumed into windows in Redis (shared by every server)", result.shared),
        fresh_row("publish -> visible, windows in Redis", result.shared_latencies),
    ]  # fmt: skip


def table(rows: list[tuple[str, ...]]) -> str:
    header = ("broker", "measurement", "result", "vs floor", "goal")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
             for row in [header, *rows]]  # fmt: skip
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--brokers", default=",".join(BROKERS),
                        help="comma-separated, of: " + ", ".join(BROKERS))  # fmt: skip
    parser.add_argument("--events", type=int, default=50_000, help="events per throughput run")
    parser.add_argument("--samples", type=int, default=300, help="publish -> visible samples")
    parser.add_argument("--batch", type=int, default=500, help="messages a read takes")
    args = parser.parse_args()
    kinds = [kind.strip() for kind in args.brokers.split(",") if kind.strip()]
    unknown = sorted(set(kinds) - set(BROKERS))
    if unknown or not kinds:
        parser.error(f"--brokers {args.brokers!r}: use some of {', '.join(BROKERS)}")
    if args.events < 1 or args.samples < 1 or not 1 <= args.batch <= 10_000:
        parser.error("--events and --samples are >= 1, --batch is 1..10000")
    rows: list[tuple[str, ...]] = []
    with (
        tempfile.TemporaryDirectory(prefix="kairos-bench-streams-") as tmp,
        kafka_started(Path(tmp), "kafka" in kinds) as kafka_url,
    ):
        for kind in kinds:
            folder = Path(tmp) / kind
            folder.mkdir()
            rows += asyncio.run(bench(kind, kafka_url, folder, args))
            print(f"{kind}: done", file=sys.stderr, flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
