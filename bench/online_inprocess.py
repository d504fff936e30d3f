"""In-process online query latency: 10 features, cached vs computed, beside the floor.

    .venv/bin/python bench/online_inprocess.py [--iterations 20000]

The floor is calling the resolver function directly in the same run (this machine is shared
and noisy, so only same-run ratios mean anything). Target: cached query p50 <= 150 us.
"""

import argparse
import gc
import statistics
import time
from collections.abc import Callable

import kairos as kr
from kairos import Features, features, online

TARGET_CACHED_P50_US = 150.0


@features(max_staleness="1h")
class Cached:
    id: str
    f0: float
    f1: float
    f2: float
    f3: float
    f4: float
    f5: float
    f6: float
    f7: float
    f8: float
    f9: float


@features
class Fresh:
    id: str
    f0: float
    f1: float
    f2: float
    f3: float
    f4: float
    f5: float
    f6: float
    f7: float
    f8: float
    f9: float


Ten = tuple[float, float, float, float, float, float, float, float, float, float]


def ten(key: str) -> Ten:
    return (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, float(len(key)))


@online
def cached_ten(
    cid: Cached.id,
) -> Features[
    Cached.f0, Cached.f1, Cached.f2, Cached.f3, Cached.f4,
    Cached.f5, Cached.f6, Cached.f7, Cached.f8, Cached.f9,
]:  # fmt: skip
    return ten(cid)


@online
def fresh_ten(
    fid: Fresh.id,
) -> Features[
    Fresh.f0, Fresh.f1, Fresh.f2, Fresh.f3, Fresh.f4,
    Fresh.f5, Fresh.f6, Fresh.f7, Fresh.f8, Fresh.f9,
]:  # fmt: skip
    return ten(fid)


def measure(call: Callable[[], object], iterations: int) -> list[float]:
    for _ in range(min(1000, iterations)):
        call()
    samples = []
    gc.disable()
    try:
        for _ in range(iterations):
            start = time.perf_counter_ns()
            call()
            samples.append((time.perf_counter_ns() - start) / 1000)
    finally:
        gc.enable()
    return samples


def percentile(samples: list[float], q: float) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[int(q) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=20000)
    args = parser.parse_args()

    client = kr.Client(definitions=[Cached, Fresh, cached_ten, fresh_ten])
    cached_out = [f"cached.f{i}" for i in range(10)]
    fresh_out = [f"fresh.f{i}" for i in range(10)]
    warm = client.query({"cached.id": "c1"}, cached_out)
    assert warm.errors == [], warm.errors

    def cached_query() -> object:
        result = client.query({"cached.id": "c1"}, cached_out)
        if result.meta.cache_hits != 10:
            raise RuntimeError("expected 10 cache hits")
        return result

    def fresh_query() -> object:
        return client.query({"fresh.id": "f1"}, fresh_out)

    rows = [
        ("floor: resolver called directly", measure(lambda: fresh_ten("f1"), args.iterations)),
        ("query, 10 features, all cached", measure(cached_query, args.iterations)),
        ("query, 10 features, 1 sync resolver", measure(fresh_query, args.iterations // 4)),
    ]
    client.close()

    floor = statistics.median(rows[0][1])
    print(f"online query in process, {args.iterations} iterations (us)\n")
    print(f"{'scenario':<40} {'p50':>9} {'p99':>9} {'p50 / floor':>12}")
    for name, samples in rows:
        p50 = statistics.median(samples)
        print(f"{name:<40} {p50:>9.1f} {percentile(samples, 99):>9.1f} {p50 / floor:>11.0f}x")
    cached_p50 = statistics.median(rows[1][1])
    verdict = "PASS" if cached_p50 <= TARGET_CACHED_P50_US else "FAIL"
    print(f"\ntarget: cached p50 <= {TARGET_CACHED_P50_US:.0f} us -> {cached_p50:.1f} us {verdict}")


if __name__ == "__main__":
    main()
