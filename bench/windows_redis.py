"""Windowed aggregates in Redis (shared by every server), one entity with 1k to 1M events.

    .venv/bin/python bench/windows_redis.py [--sizes 1000,10000,100000,1000000]
        [--iterations 500] [--url redis://127.0.0.1:6379/0]

For each size, one account gets that many events spread over 120 days, written through
`client.write_events` into Redis (events and tiles); then a query at one client asks six
windowed aggregates (count over 1d/7d/90d, a filtered count, a mean and a max over 90d) at a
random `now` in the last 30 days. The floor, in the same run, is the Redis calls such a query
needs, sent by redis-py with nothing of kairos around them: the one EVALSHA of its six
windows, with its arguments already built. Goal: p50 <= 1 ms at 100k events, flat from 1k
to 1M (the cost grows with the window's length in tile levels, not with its events).
"""

import argparse
import asyncio
import random
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
import redis.asyncio
from windowed_online import OUTPUTS, make_classes  # type: ignore[import-not-found]  # bench/ is the path

import kairos as kr
from kairos.engine.windows_shared import SharedWindows
from kairos.stores.codec import encode_key, to_micros

NOW = datetime(2026, 6, 1, tzinfo=UTC)
SPAN = timedelta(days=120)
GOAL_P50_MS = 1.0


Txn, Acct, _ = make_classes(events=True)  # the in-process bench's definitions


def write(client: kr.Client, account: str, count: int, seed: int) -> float:
    rng = random.Random(seed)
    start = NOW - SPAN
    began = time.perf_counter()
    for first in range(0, count, 5000):
        rows = [
            {
                "id": f"{account}-{i}",
                "user_id": account,
                "amount": round(rng.uniform(1, 900), 2),
                "declined": rng.random() < 0.05,
                "ts": start
                + timedelta(microseconds=rng.randrange(int(SPAN / timedelta(microseconds=1)))),
            }
            for i in range(first, min(count, first + 5000))
        ]
        client.write_events(Txn, rows)
    return count / (time.perf_counter() - began)


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1e3, ordered[int(len(ordered) * 0.99)] * 1e3


def floor_calls(windows: SharedWindows, account: str, nows: list[datetime]) -> list[list[Any]]:
    """The six EVALSHAs of one query, as argument lists, for each `now`."""
    store = windows.store
    calls = []
    for now in nows:
        one = []
        for name in OUTPUTS:
            namespace, feature = name.split(".")
            series = windows._aggregates[(namespace, feature)].series
            window = timedelta(days=int(name.split("[")[1].rstrip("d]")))
            first = to_micros(now - window) + 1
            spec = windows._aggregates[(namespace, feature)].spec
            counting = spec.fn == "count" and spec.projection is None
            exact = -1 if counting else 64 if series.tiled else 1 << 62
            args = store._read_args(
                series.name, encode_key(account), first, to_micros(now), exact, series.top
            )
            one.append(args)
        calls.append(one)
    return calls


async def floor(url: str, sha: str, loaded: str, calls: list[list[list[Any]]]) -> list[float]:
    client = redis.asyncio.Redis.from_url(url)
    samples = []
    try:
        for query in calls:
            began = time.perf_counter()
            await client.evalsha(sha, 1, loaded, *[part for args in query for part in args])
            samples.append(time.perf_counter() - began)
    finally:
        await client.aclose()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000,1000000")
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    url = f"{args.url}?prefix={prefix}"
    rows = []
    try:
        with kr.Client(
            definitions=[Txn, Acct], online_store=url, offline_store="none://",
            query_log="none://",
        ) as client:  # fmt: skip
            windows = client.windows
            assert isinstance(windows, SharedWindows)
            for size in [int(s) for s in args.sizes.split(",")]:
                account = f"a{size}"
                rate = write(client, account, size, seed=size)
                rng = random.Random(1)
                nows = [
                    NOW - timedelta(seconds=rng.uniform(0, 30 * 86400))
                    for _ in range(args.iterations)
                ]
                for now in nows[:20]:  # warm up
                    client.query({"acct.id": account}, OUTPUTS, now=now)
                samples = []
                for now in nows:
                    began = time.perf_counter()
                    result = client.query({"acct.id": account}, OUTPUTS, now=now)
                    samples.append(time.perf_counter() - began)
                    assert not result.errors, result.errors
                calls = floor_calls(windows, account, nows)
                sha = windows.store._read_sha
                base = asyncio.run(floor(args.url, sha, windows.store.loaded_key, calls))
                p50, p99 = percentiles(samples)
                f50, f99 = percentiles(base)
                rows.append((size, rate, p50, p99, f50, f99))
    finally:
        cleanup = redis.Redis.from_url(args.url)
        keys = list(cleanup.scan_iter(match=f"{prefix}:*", count=5000))
        for start in range(0, len(keys), 5000):
            cleanup.unlink(*keys[start : start + 5000])  # freed in the background
        cleanup.close()
    print("| events per entity | write events/s | query p50 | query p99 | floor p50 | floor p99 "
          "| p50 / floor | goal p50 <= 1 ms |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for size, rate, p50, p99, f50, f99 in rows:
        verdict = "ok" if p50 <= GOAL_P50_MS else "MISSED"
        print(
            f"| {size:,} | {rate:,.0f} | {p50:.3f} ms | {p99:.3f} ms | {f50:.3f} ms | "
            f"{f99:.3f} ms | {p50 / f50:.2f}x | {verdict} |"
        )
    flat = max(r[2] for r in rows) / min(r[2] for r in rows)
    print(f"\nflatness: the slowest size's p50 is {flat:.2f}x the fastest's")


if __name__ == "__main__":
    main()
