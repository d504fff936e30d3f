"""Streams into windowed features: sustained events/s a consumer writes (goal >= 10k/s) and
freshness, publish -> visible in a windowed query, p50 and p99 (goal p99 <= 100 ms), each
against the floor of Redis's own calls in the same run (XADD then XREADGROUP + XACK).

    .venv/bin/python bench/streams.py [--events 50000] [--samples 300]
"""

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis

import kairos as kr
from kairos import DataFrame, FeatureTime, Windowed, _, features, windowed
from kairos.client.config import Config
from kairos.client.consume import consumers_for

REDIS_URL = "redis://127.0.0.1:6379/0"
T0 = datetime(2026, 6, 1, 12, tzinfo=UTC)
GOAL_EVENTS_PER_S = 10_000
GOAL_P99_MS = 100.0


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


def client_for(folder: Path, key: str, batch: int, offline: str = "none://") -> kr.Client:
    spec = {"kind": "redis", "url": REDIS_URL, "stream": key, "events": "payment",
            "batch": batch}  # fmt: skip
    config = Config(base_dir=folder, streams={"payments": spec}, offline_store=offline)
    return kr.Client(definitions=[Payment, Payer], config=config, query_log="none://")


def floor_throughput(r: redis.Redis, events: int) -> float:
    """Raw XREADGROUP + XACK of `events` messages, batches of 500: messages/s."""
    key = f"kairos-bench-floor-{uuid.uuid4().hex[:8]}"
    try:
        pipe = r.pipeline(transaction=False)
        for i in range(events):
            pipe.xadd(key, {"data": payment(i, f"p{i % 100}")})
        pipe.execute()
        r.xgroup_create(key, "g", id="0")
        started = time.perf_counter()
        while True:
            got: Any = r.xreadgroup("g", "c", {key: ">"}, count=500)
            if not got:
                break
            ids = [entry_id for entry_id, _fields in got[0][1]]
            r.xack(key, "g", *ids)
        return events / (time.perf_counter() - started)
    finally:
        r.delete(key)


def consumer_throughput(folder: Path, r: redis.Redis, events: int, offline: str) -> float:
    key = f"kairos-bench-{uuid.uuid4().hex[:8]}"
    try:
        pipe = r.pipeline(transaction=False)
        for i in range(events):
            pipe.xadd(key, {"data": payment(i, f"p{i % 100}")})
        pipe.execute()
        with client_for(folder, key, 500, offline) as client:
            [consumer] = consumers_for(client)

            async def drain() -> float:
                started = time.perf_counter()
                try:
                    await consumer.drain(idle=0.05)
                finally:
                    await consumer.close()
                return time.perf_counter() - started

            seconds = asyncio.run(drain())
            assert consumer.stats.events == events, consumer.stats
            total = sum(
                int(client.query({"payer.id": f"p{k}"}, ["payer.paid[7d]"], now=T0)
                    .get_value("payer.paid[7d]"))
                for k in range(100)
            )  # fmt: skip
            assert total == events, total
        return events / seconds
    finally:
        r.delete(key)


async def freshness(folder: Path, samples: int) -> tuple[list[float], list[float]]:
    """Publish one event, then query until the window counts it: ms per sample; and the floor,
    XADD -> a blocked XREADGROUP returns it."""
    key = f"kairos-bench-fresh-{uuid.uuid4().hex[:8]}"
    publisher = aioredis.Redis.from_url(REDIS_URL)
    floor: list[float] = []
    try:
        await publisher.xgroup_create(key, "floor", id="$", mkstream=True)
        reader = aioredis.Redis.from_url(REDIS_URL)
        for i in range(samples):
            started = time.perf_counter()
            read = asyncio.ensure_future(
                reader.xreadgroup("floor", "c", {key: ">"}, count=1, block=1000)
            )
            await asyncio.sleep(0)
            await publisher.xadd(key, {"data": payment(10_000_000 + i, "floor")})
            await read
            floor.append((time.perf_counter() - started) * 1000)
        await reader.aclose()
        latencies: list[float] = []
        with client_for(folder, key, 500) as client:
            [consumer] = consumers_for(client)
            stop = asyncio.Event()
            running = asyncio.ensure_future(consumer.run(stop, idle=0.05))
            await asyncio.sleep(0.2)  # the group exists, the consumer waits on the stream
            for i in range(samples):
                started = time.perf_counter()
                await publisher.xadd(key, {"data": payment(i, "p-fresh")})
                while True:
                    result = await client.query_async(
                        {"payer.id": "p-fresh"}, ["payer.paid[7d]"], now=T0
                    )
                    if result.get_value("payer.paid[7d]") == i + 1:
                        break
                    await asyncio.sleep(0.0005)
                latencies.append((time.perf_counter() - started) * 1000)
            stop.set()
            await running
            await consumer.close()
        return latencies, floor
    finally:
        await publisher.delete(key)
        await publisher.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--samples", type=int, default=300)
    args = parser.parse_args()
    r = redis.Redis.from_url(REDIS_URL)
    with tempfile.TemporaryDirectory(prefix="kairos-bench-streams-") as tmp:
        folder = Path(tmp)
        floor_rate = floor_throughput(r, args.events)
        rate = consumer_throughput(folder, r, args.events, "none://")
        durable = consumer_throughput(
            folder, r, args.events, f"duckdb:///{folder / 'offline.duckdb'}"
        )
        latencies, floor = asyncio.run(freshness(folder, args.samples))
    r.close()
    rows: list[tuple[str, str, str, str]] = [
        (f"Redis floor: XREADGROUP + XACK, {args.events:,} messages", f"{floor_rate:,.0f}/s",
         "floor", ""),
        (f"consumed into a window (index only), {args.events:,} events",
         f"{rate:,.0f} events/s", f"{rate / floor_rate:.1%} of floor",
         f">= {GOAL_EVENTS_PER_S:,}/s: {'ok' if rate >= GOAL_EVENTS_PER_S else 'MISSED'}"),
        (f"consumed, events kept in DuckDB first (the default), {args.events:,} events",
         f"{durable:,.0f} events/s", f"{durable / floor_rate:.1%} of floor",
         f">= {GOAL_EVENTS_PER_S:,}/s: {'ok' if durable >= GOAL_EVENTS_PER_S else 'MISSED'}"),
        (f"Redis floor: XADD -> blocked XREADGROUP, {args.samples} samples",
         f"p50 {statistics.median(floor):.2f} ms, p99 {percentile(floor, 99):.2f} ms",
         "floor", ""),
        ("publish -> visible in a windowed query",
         f"p50 {statistics.median(latencies):.2f} ms, p99 {percentile(latencies, 99):.2f} ms",
         f"{statistics.median(latencies) / statistics.median(floor):.1f}x floor p50",
         f"p99 <= {GOAL_P99_MS:.0f} ms: "
         + ("ok" if percentile(latencies, 99) <= GOAL_P99_MS else "MISSED")),
    ]  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    header = ("measurement", "result", "vs floor", "goal")
    widths = [max(w, len(h)) for w, h in zip(widths, header, strict=True)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")


if __name__ == "__main__":
    main()
