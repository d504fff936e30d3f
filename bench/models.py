"""Model serving benchmark, each number against its floor measured in the same run.

    .venv/bin/python bench/models.py [--rows 1000000] [--seconds 3] [--rounds 5]

1. One row, standalone vs inside kairos. The floor is `model.predict_proba(row)` called
   directly on this thread, the faster of the process's default native threads and one
   OpenMP thread (on a loaded 2-core machine the default can be several times slower, which
   would flatter kairos). Against it: `client.models.predict` with an array row (target
   <= +0.1 ms at p50) and with a JSON-like row, a dict of features (<= +0.15 ms), and the model
   node of a `client.query` of a `kr.predict` feature, from the query's trace (<= +0.1 ms; the
   query's total, the same model node with the query log off, and a query of a plain expression
   feature are printed beside it). The client runs on a project folder's defaults (SQLite
   query log on, models: threads 1).
2. Batch scoring of N rows: `Predictor.score` (the code batch scoring and backfills use) and
   `client.models.score` on an Arrow table vs raw `model.predict_proba` on the same array.
   Target: >= 90% of raw throughput.
3. Throughput, one row per request: the floor is raw serial `predict_proba` on one thread, one
   call per request, no kairos (again the faster of default and one OpenMP thread); against it
   the micro-batching predictor (`predict_async`) with 1, 8 and 64 concurrent clients.
   Target: >= 10x the floor at 64 clients.

Rounds are interleaved (each path measured once per round) so the machine's other load hits
every path alike; latencies are medians over all rounds, throughputs the median round. The
model is a scikit-learn HistGradientBoostingClassifier (50 trees) on 8 features, registered and
loaded back from its skops artifact like any served model.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from threadpoolctl import threadpool_limits

import kairos as kr
from kairos import _, features
from kairos.models import Predictor
from kairos.project.config import Config

FEATURES = [f"f{i}" for i in range(8)]
ARRAY_TARGET_MS = 0.1
DICT_TARGET_MS = 0.15
QUERY_TARGET_MS = 0.1
BATCH_SHARE = 0.9
CLIENTS_TARGET = 64
THROUGHPUT_RATIO = 10.0


@features
class Probe:
    id: str
    f0: float
    f1: float
    f2: float
    f3: float
    f4: float
    f5: float
    f6: float
    f7: float
    risk: float = kr.predict(
        "bench", inputs=[_.f0, _.f1, _.f2, _.f3, _.f4, _.f5, _.f6, _.f7], max_staleness="0s"
    )
    shifted: float = _.f0 + 1.0  # a query of the same inputs without a model: its own floor


def timed(fn: Callable[[], Any], repeat: int) -> list[float]:
    samples = []
    for _i in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def p50(samples: list[float]) -> float:
    return statistics.median(samples)


def one_thread(fn: Callable[[], Any]) -> Callable[[], Any]:
    def call() -> Any:
        with threadpool_limits(limits=1, user_api="openmp"):
            return fn()

    return call


def settle(client: kr.Client) -> None:
    """Let the query log and the offline writer catch up, so their threads' work on earlier
    queries does not land on the next path's samples."""
    client.log.store.flush()
    writer = client.runtime.offline.writer
    if writer is not None:
        writer.flush()


def one_row(
    client: kr.Client, unlogged: kr.Client, model: Any, x: np.ndarray, rounds: int
) -> dict[str, float]:
    """p50 ms of each one-row path, rounds interleaved."""
    row = x[:1]
    as_dict = [dict(zip(FEATURES, row[0].tolist(), strict=True))]
    inputs = {
        "probe.id": "p1",
        **{f"probe.{n}": float(v) for n, v in zip(FEATURES, row[0], strict=True)},
    }
    model_node: list[float] = []
    model_node_unlogged: list[float] = []

    def query(on: kr.Client, nodes: list[float]) -> None:
        result = on.query(inputs, ["probe.risk"])
        if result.errors:
            raise AssertionError(f"the query failed: {result.errors}")
        nodes.extend(t.duration_ms for t in result.trace if t.kind == "model")

    paths: dict[str, Callable[[], Any]] = {
        "direct": lambda: model.predict_proba(row),
        "array": lambda: client.models.predict("bench", row),
        "dict": lambda: client.models.predict("bench", as_dict),
        "query": lambda: query(client, model_node),
        "query_unlogged": lambda: query(unlogged, model_node_unlogged),
        "query_plain": lambda: client.query(inputs, ["probe.shifted"]),
    }
    samples: dict[str, list[float]] = {name: [] for name in [*paths, "direct_1"]}
    for fn in paths.values():
        timed(fn, 200)  # warm up every path
    for _round in range(rounds):
        for name, fn in paths.items():
            settle(client)
            samples[name] += timed(fn, 400)
        settle(client)
        with threadpool_limits(limits=1, user_api="openmp"):
            samples["direct_1"] += timed(paths["direct"], 400)
    settle(client)
    found = {name: p50(values) for name, values in samples.items()}
    found["model_node"] = p50(model_node[-400 * rounds :])
    found["model_node_unlogged"] = p50(model_node_unlogged[-400 * rounds :])
    found["floor"] = min(found["direct"], found["direct_1"])
    return found


def batch_scoring(client: kr.Client, model: Any, rows: int) -> dict[str, float]:
    rng = np.random.default_rng(1)
    big = rng.normal(size=(rows, len(FEATURES)))
    table = pa.table({name: big[:, i] for i, name in enumerate(FEATURES)})
    _, predictor = client.models.store.predictor("bench")
    samples: dict[str, list[float]] = {"raw": [], "score": [], "table": []}
    for _round in range(5):  # interleaved rounds, best of each
        samples["raw"] += timed(lambda: model.predict_proba(big)[:, 1], 1)
        samples["score"] += timed(lambda: predictor.score(big), 1)
        samples["table"] += timed(lambda: client.models.score("bench", table), 1)
    return {name: rows / min(values) * 1000 for name, values in samples.items()}


def serial(model: Any, x: np.ndarray, seconds: float) -> float:
    """Requests per second of raw predict_proba, one row per call, one after another."""
    done = 0
    started = time.perf_counter()
    stop = started + seconds
    while time.perf_counter() < stop:
        start = done % 1000
        model.predict_proba(x[start : start + 1])
        done += 1
    return done / (time.perf_counter() - started)


async def hammer(predictor: Predictor, x: np.ndarray, clients: int, seconds: float) -> float:
    """Requests per second from `clients` concurrent callers, one row per request."""
    done = 0
    stop = time.perf_counter() + seconds

    async def caller(i: int) -> None:
        nonlocal done
        row = x[i : i + 1]
        while time.perf_counter() < stop:
            out = await predictor.predict_async(row)
            if len(out) != 1:
                raise AssertionError("a caller got someone else's rows")
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(caller(i) for i in range(clients)))
    return done / (time.perf_counter() - started)


def throughput(
    client: kr.Client, model: Any, x: np.ndarray, seconds: float, rounds: int
) -> dict[str, Any]:
    _, predictor = client.models.store.predictor("bench")
    counts = (1, 8, CLIENTS_TARGET)
    samples: dict[str, list[float]] = {"serial": [], "serial_1": []}
    samples.update({f"batched_{n}": [] for n in counts})
    calls = {n: [0, 0] for n in counts}  # model calls, requests
    asyncio.run(hammer(predictor, x, CLIENTS_TARGET, 0.3))  # warm up
    for _round in range(rounds):
        samples["serial"].append(serial(model, x, seconds))
        samples["serial_1"].append(one_thread(lambda: serial(model, x, seconds))())
        for n in counts:
            batches, requests = predictor.batches, predictor.batched_requests
            samples[f"batched_{n}"].append(asyncio.run(hammer(predictor, x, n, seconds)))
            calls[n][0] += predictor.batches - batches
            calls[n][1] += predictor.batched_requests - requests
    found: dict[str, Any] = {name: statistics.median(values) for name, values in samples.items()}
    found["floor"] = max(found["serial"], found["serial_1"])
    found["mean_batch"] = {n: calls[n][1] / max(calls[n][0], 1) for n in counts}
    return found


def verdict(passed: bool) -> str:
    return "PASS" if passed else "FAIL"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows for batch scoring")
    parser.add_argument("--seconds", type=float, default=2.0, help="per throughput sample")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    args = parser.parse_args()

    from sklearn.ensemble import HistGradientBoostingClassifier

    load_before = os.getloadavg()[0]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20_000, len(FEATURES)))
    y = (x[:, 0] + x[:, 1] * x[:, 2] - x[:, 3] > 0).astype(int)
    model = HistGradientBoostingClassifier(max_iter=50).fit(x, y)
    with tempfile.TemporaryDirectory() as folder:
        config = Config.load(Path(folder))  # a project folder's defaults
        unlogged_config = replace(config, query_log="none://")
        with (
            kr.Client(definitions=[Probe], config=config) as client,
            kr.Client(definitions=[Probe], config=unlogged_config) as unlogged,
        ):
            client.models.register("bench", model, inputs=FEATURES)
            unlogged.models.rebind()  # registered by the other client: bind it here too
            latency = one_row(client, unlogged, model, x, args.rounds)
            batch = batch_scoring(client, model, args.rows)
            flow = throughput(client, model, x, args.seconds, args.rounds)
    floor = latency["floor"]
    rows: list[list[str]] = [
        ["1 row: predict_proba, default threads", f"{latency['direct']:.3f} ms p50", "", ""],
        ["1 row: predict_proba, 1 OpenMP thread", f"{latency['direct_1']:.3f} ms p50", "", ""],
        ["1 row: client.models.predict(array row)", f"{latency['array']:.3f} ms p50",
         f"+{latency['array'] - floor:.3f} ms", f"<= +{ARRAY_TARGET_MS} ms"],
        ["1 row: client.models.predict(dict row)", f"{latency['dict']:.3f} ms p50",
         f"+{latency['dict'] - floor:.3f} ms", f"<= +{DICT_TARGET_MS} ms"],
        ["1 row: client.query, its model node", f"{latency['model_node']:.3f} ms p50",
         f"+{latency['model_node'] - floor:.3f} ms", f"<= +{QUERY_TARGET_MS} ms"],
        ["1 row: client.query, model node, query log off",
         f"{latency['model_node_unlogged']:.3f} ms p50",
         f"+{latency['model_node_unlogged'] - floor:.3f} ms", "(the log's thread left out)"],
        ["1 row: client.query(kr.predict feature)", f"{latency['query']:.3f} ms p50",
         f"+{latency['query'] - floor:.3f} ms", "(whole query)"],
        ["1 row: client.query(expression feature)", f"{latency['query_plain']:.3f} ms p50",
         "", "(the same query, no model)"],
        [f"batch: raw predict_proba, {args.rows:,} rows", f"{batch['raw']:,.0f} rows/s", "", ""],
        [f"batch: Predictor.score, {args.rows:,} rows", f"{batch['score']:,.0f} rows/s",
         f"{batch['score'] / batch['raw']:.0%} of raw", f">= {BATCH_SHARE:.0%}"],
        [f"batch: client.models.score(Arrow), {args.rows:,} rows",
         f"{batch['table']:,.0f} rows/s", f"{batch['table'] / batch['raw']:.0%} of raw",
         "(incl. Arrow -> array)"],
        ["serial predict_proba, 1 row/call, default threads", f"{flow['serial']:,.0f} req/s",
         "", ""],
        ["serial predict_proba, 1 row/call, 1 OpenMP thread",
         f"{flow['serial_1']:,.0f} req/s", "", ""],
    ]  # fmt: skip
    for n, mean in flow["mean_batch"].items():
        rate = flow[f"batched_{n}"]
        rows.append(
            [
                f"micro-batched, {n} clients (mean {mean:.0f} rows/call)",
                f"{rate:,.0f} req/s",
                f"{rate / flow['floor']:.1f}x",
                f">= {THROUGHPUT_RATIO:g}x" if n == CLIENTS_TARGET else "",
            ]
        )
    headers = ["measurement", "result", "vs floor", "target"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print(
        f"HistGradientBoostingClassifier, 50 trees, 8 features; {os.cpu_count()} CPUs, "
        f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print("latency floor: the faster predict_proba row; throughput floor: the faster serial\n")
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    ratio = flow[f"batched_{CLIENTS_TARGET}"] / flow["floor"]
    targets = [
        (f"array row: client.models.predict <= floor + {ARRAY_TARGET_MS} ms",
         f"+{latency['array'] - floor:.3f} ms", latency["array"] - floor <= ARRAY_TARGET_MS),
        (f"dict row: client.models.predict <= floor + {DICT_TARGET_MS} ms",
         f"+{latency['dict'] - floor:.3f} ms", latency["dict"] - floor <= DICT_TARGET_MS),
        (f"client.query model node <= floor + {QUERY_TARGET_MS} ms",
         f"+{latency['model_node'] - floor:.3f} ms",
         latency["model_node"] - floor <= QUERY_TARGET_MS),
        (f"Predictor.score >= {BATCH_SHARE:.0%} of raw", f"{batch['score'] / batch['raw']:.0%}",
         batch["score"] / batch["raw"] >= BATCH_SHARE),
        (f"{CLIENTS_TARGET} clients micro-batched >= {THROUGHPUT_RATIO:g}x serial floor",
         f"{ratio:.1f}x", ratio >= THROUGHPUT_RATIO),
    ]  # fmt: skip
    print("\ntargets (issue 17)")
    for label, measured, passed in targets:
        print(f"  {label:<52} {measured:<12} {verdict(passed)}")


if __name__ == "__main__":
    main()
