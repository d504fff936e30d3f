"""Offline recompute with a CPU-heavy Python resolver: the local engine against Ray with one
and with two workers, in one run.

    .venv/bin/python bench/ray_offline.py [--rows 200000] [--entities 2000] [--work-us 50]
        [--repeat 1]

Writes a small project to a temporary folder: one feature class and a sync Python resolver
that spends about --work-us microseconds of pure Python per row (a loop calibrated on this
machine first). The same spine (rows over --entities entities, random times over 30 days)
is then recomputed by:

- local: `client.offline_query(spine, outputs)`, one run of the engine in this process;
- Ray, N workers: a fresh local Ray with N CPUs (`ray.init(num_cpus=N)`), one small query
  first so the workers have started and built their client (that cold start is printed
  apart), then `client.offline_query(spine, outputs, engine="ray")`.

Each Ray answer is compared with the local one (every value, every error). The table gives
seconds (the best of --repeat runs), rows/s and the speed against the local engine; on a
machine with two cores, two workers can at best be about twice as fast, less what the driver
itself needs (splitting the spine, putting the rows back). This machine is shared and noisy:
only same-run ratios mean anything.
"""

import argparse
import os
import random
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import ray

import kairos as kr

T0 = datetime(2026, 1, 1, tzinfo=UTC)

FEATURES = """
from kairos import Now, features, online

LOOPS = {loops}


@features
class Sensor:
    id: str
    score: float


@online
def score(sid: Sensor.id, now: Now) -> Sensor.score:
    acc = len(sid) + now.minute
    for i in range(LOOPS):  # pure Python work, as a real feature computation would do
        acc = (acc * 31 + i) % 1_000_003
    return acc / 1_000_003
"""

CONFIG = """
offline_store: none://
query_log: none://
resolver_timeout: 1h
"""


def calibrate(work_us: float) -> int:
    """Loop iterations that take about `work_us` microseconds here."""
    loops = 1000
    started = time.perf_counter()
    for _ in range(200):
        acc = 7
        for i in range(loops):
            acc = (acc * 31 + i) % 1_000_003
    per_loop = (time.perf_counter() - started) / (200 * loops)
    return max(1, round(work_us * 1e-6 / per_loop))


def project(folder: Path, loops: int) -> Path:
    folder.mkdir()
    (folder / "features.py").write_text(FEATURES.format(loops=loops))
    (folder / "kairos.yaml").write_text(CONFIG)
    return folder


def spine(rows: int, entities: int) -> dict[str, list[Any]]:
    rng = random.Random(1)
    return {
        "sensor.id": [f"s{rng.randrange(entities)}" for _ in range(rows)],
        "ts": [T0 + timedelta(seconds=rng.randrange(30 * 86400)) for _ in range(rows)],
    }


def timed(run: Any, repeat: int = 1) -> tuple[float, Any]:
    """The best time of `repeat` runs, and the last run's result."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - started)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--entities", type=int, default=2000)
    parser.add_argument("--work-us", type=float, default=50.0)
    parser.add_argument("--repeat", type=int, default=1, help="runs per engine; the best counts")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    loops = calibrate(args.work_us)
    rows = spine(args.rows, args.entities)
    outputs = ["sensor.score"]
    warm = spine(2000, args.entities)
    results: list[tuple[str, float, str]] = []
    with tempfile.TemporaryDirectory() as scratch:
        folder = project(Path(scratch) / "sensors", loops)
        with kr.Client(folder) as client:
            client.offline_query(warm, outputs)  # the plan built, the resolver's module warm
            local_s, local = timed(lambda: client.offline_query(rows, outputs), args.repeat)
            results.append(("local engine (this process)", local_s, "-"))
            for workers in (1, 2):
                started = time.perf_counter()
                ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
                client.offline_query(warm, outputs, engine="ray")  # workers up, client built
                start_s = time.perf_counter() - started
                seconds, on_ray = timed(
                    lambda: client.offline_query(rows, outputs, engine="ray"), args.repeat
                )
                ray.shutdown()
                same = on_ray.table.equals(local.table) and on_ray.errors == local.errors
                if not same:
                    raise SystemExit(f"Ray with {workers} workers answered differently")
                results.append(
                    (f"Ray, {workers} worker{'s' * (workers > 1)}", seconds, f"{start_s:.1f}")
                )
    print(
        f"\n{args.rows:,} spine rows over {args.entities:,} entities, a Python resolver of "
        f"~{args.work_us:g} us per row ({loops} loops; {local_s / args.rows * 1e6:.0f} us per "
        f"row end to end in the local engine), {os.cpu_count()} CPUs (load average "
        f"{load:.1f} before, {os.getloadavg()[0]:.1f} after); every Ray answer equal to the "
        "local one\n"
    )
    print("| engine | seconds | rows/s | speed vs local | Ray start + first query (s) |")
    print("|---|---:|---:|---:|---:|")
    for name, seconds, start in results:
        print(
            f"| {name} | {seconds:.2f} | {args.rows / seconds:,.0f} | "
            f"{local_s / seconds:.2f}x | {start} |"
        )


if __name__ == "__main__":
    main()
