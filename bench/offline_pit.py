"""Point-in-time (as-of) reads from the offline store, beside a hand-written DuckDB floor.

    .venv/bin/python bench/offline_pit.py [--spine 1000000] [--events 10000000] [--features 5]
        [--repeat 3] [--feast] [--feast-timeout 300]

Builds a spine (key, ts) and events (key, observed_at, one column per feature) as Parquet
files, then measures, each in its own child process (so peak RSS is that step's alone):

- floor: one hand-written `ASOF LEFT JOIN` over the Parquet files, all features at once (no
  tie-breaking on inserted_at, no ttl: the least work a correct-looking answer can take);
- floor, one join per feature: the same join once per feature column;
- store load: the events written into a fresh store (a folder of Parquet segments), one
  `write_many` for all features;
- floor over the store's segments: the first floor's join over the very segment files the
  store wrote (the storage kairos reads);
- native load / floor over native tables: the spine and events loaded into tables of a DuckDB
  database file (the load timed apart), then the same join over those tables;
- store as-of: `asof_many` for every feature over the whole spine, from the store;
- client offline_query: `client.offline_query(spine, outputs, recompute=False)` end to end
  (what a user calls: the client opened, the spine read), over the same store.

The target (issue 17): client offline_query <= 1.1x the floor over native DuckDB tables,
printed PASS/FAIL with its ratio to the floor over the store's own segments beside it.

With --feast (off by default: it is slow), also Feast 0.67's `get_historical_features` over
the same Parquet files, once with its DuckDB offline store and once with its file (Dask)
offline store, each run by bench/feast_offline.py under bench/.venv-feast's python (make it
with `bash bench/feast_env.sh`, then `bench/.venv-feast/bin/pip install "feast[duckdb]==0.67.0"`).
Those rows also say how many spine rows came back: Feast's file store drops spine rows that
precede their entity's first event. A Feast step past --feast-timeout seconds, or one that
fails, is reported as "did not finish" and the run goes on.

The loads run once; every read step runs --repeat times, rounds interleaved, and its median
run is printed. This machine is shared and noisy: only the same-run ratios mean anything.
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kairos.definitions.types import ValueType
from kairos.stores.offline import DuckDBOfflineStore

BASE_US = 1_767_225_600_000_000  # 2026-01-01 UTC in microseconds
SPAN_US = 30 * 86_400 * 1_000_000  # events and spine times over 30 days
TIMESTAMP = pa.timestamp("us", tz="UTC")
NATIVE_TARGET = 1.1  # client offline_query / floor over native DuckDB tables
FEAST_PYTHON = Path(__file__).resolve().parent / ".venv-feast" / "bin" / "python"
FEAST_SCRIPT = Path(__file__).resolve().parent / "feast_offline.py"


def build(folder: Path, spine_rows: int, events: int, features: int, keys: int) -> None:
    rng = np.random.default_rng(0)
    columns: dict[str, Any] = {
        "key": pa.array(rng.integers(0, keys, events)),
        "observed_at": pa.array(BASE_US + rng.integers(0, SPAN_US, events)).view(TIMESTAMP),
    }
    for i in range(features):
        columns[f"f{i}"] = pa.array(rng.random(events))
    pq.write_table(pa.table(columns), folder / "events.parquet")
    spine = {
        "row_id": pa.array(np.arange(spine_rows, dtype=np.int32)),
        "key": pa.array(rng.integers(0, keys, spine_rows)),
        "ts": pa.array(BASE_US + rng.integers(0, SPAN_US, spine_rows)).view(TIMESTAMP),
    }
    pq.write_table(pa.table(spine), folder / "spine.parquet")


CHECKSUM: list[float] = []  # the sum of every value a step returned, to compare answers


def checksum(columns: list[Any]) -> None:
    CHECKSUM.append(sum(float(pc.sum(c).as_py() or 0.0) for c in columns))


def floor(folder: Path, features: int, per_feature: bool) -> int:
    connection = duckdb.connect()
    spine, events = folder / "spine.parquet", folder / "events.parquet"
    names = [f"f{i}" for i in range(features)]
    groups = [[name] for name in names] if per_feature else [names]
    rows = 0
    for group in groups:
        selected = ", ".join(f"e.{name}" for name in group)
        table = connection.sql(
            f"select {selected} from read_parquet('{spine}') s "
            f"asof left join read_parquet('{events}') e "
            "on s.key = e.key and s.ts >= e.observed_at order by s.row_id"
        ).to_arrow_table()
        rows += table.num_rows
        checksum(table.columns)
    connection.close()
    return rows


def segment_files(folder: Path) -> list[str]:
    """The Parquet segments the store wrote for the bench's features (one table of them)."""
    found = sorted(str(p) for p in (folder / "offline.duckdb").glob("*/*.parquet"))
    if not found:
        raise SystemExit(f"no store segments under {folder / 'offline.duckdb'}; load it first")
    return found


def floor_segments(folder: Path, features: int) -> int:
    """The floor's one join, over the store's own segment files (value columns v0, v1...)."""
    connection = duckdb.connect()
    spine = folder / "spine.parquet"
    columns = ["value"] if features == 1 else [f"v{i}" for i in range(features)]
    table = connection.sql(
        f"select {', '.join(f'e.{c}' for c in columns)} from read_parquet('{spine}') s "
        "asof left join read_parquet($files) e "
        "on s.key = e.key and s.ts >= e.observed_at order by s.row_id",
        params={"files": segment_files(folder)},
    ).to_arrow_table()
    checksum(table.columns)
    connection.close()
    return int(table.num_rows) * features


def native_load(folder: Path, features: int) -> int:
    """The spine and the events as tables of a DuckDB database file."""
    path = folder / "native.duckdb"
    path.unlink(missing_ok=True)
    connection = duckdb.connect(str(path))
    connection.execute(f"create table spine as from read_parquet('{folder / 'spine.parquet'}')")
    connection.execute(f"create table events as from read_parquet('{folder / 'events.parquet'}')")
    rows = connection.sql("select count(*) from events").fetchall()[0][0]
    connection.close()
    return int(rows)


def floor_native(folder: Path, features: int) -> int:
    """The floor's one join over native DuckDB tables, all features at once."""
    connection = duckdb.connect(str(folder / "native.duckdb"), read_only=True)
    selected = ", ".join(f"e.f{i}" for i in range(features))
    table = connection.sql(
        f"select {selected} from spine s asof left join events e "
        "on s.key = e.key and s.ts >= e.observed_at order by s.row_id"
    ).to_arrow_table()
    checksum(table.columns)
    connection.close()
    return int(table.num_rows) * features


def store_load(folder: Path, features: int) -> int:
    events = pq.read_table(folder / "events.parquet")
    store = DuckDBOfflineStore(folder / "offline.duckdb")
    try:  # the features of one event written together, as a resolver's outputs are
        store.write_many(
            "bench",
            ValueType("int"),
            events.column("key"),
            events.column("observed_at"),
            {f"f{i}": (ValueType("float", True), events.column(f"f{i}")) for i in range(features)},
        )
    finally:
        store.close()
    return int(events.num_rows)


def store_asof(folder: Path, features: int, ttl: timedelta | None) -> int:
    spine = pq.read_table(folder / "spine.parquet")
    store = DuckDBOfflineStore(folder / "offline.duckdb")
    names = [f"f{i}" for i in range(features)]
    try:
        found = store.asof_many("bench", names, spine["key"], spine["ts"], ttl)
        rows = sum(len(found[name]) for name in names)
        if ttl is None:
            checksum([found[name] for name in names])
    finally:
        store.close()
    return rows


def client_offline(folder: Path, features: int) -> int:
    import kairos as kr

    fields = {"key": kr.Primary[int], **{f"f{i}": float for i in range(features)}}
    bench = kr.features(type("Bench", (), {"__annotations__": fields}))
    spine = pq.read_table(folder / "spine.parquet").select(["key", "ts"])
    spine = spine.rename_columns(["bench.key", "ts"])
    outputs = [f"bench.f{i}" for i in range(features)]
    with kr.Client(
        definitions=[bench],
        offline_store=f"duckdb:///{folder / 'offline.duckdb'}",
        query_log="none://",
    ) as client:
        result = client.offline_query(spine, outputs, recompute=False)
    checksum([result.table.column(name) for name in outputs])
    return len(result) * features


def cpu_seconds() -> float:
    """User + system CPU time of this process (all its threads) so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child(step: str, folder: Path, features: int) -> None:
    import pyarrow.dataset  # noqa: F401  (pq.read_table's import, 0.4 s: not the step's work)

    started, cpu_before = time.perf_counter(), cpu_seconds()
    if step == "floor":
        rows = floor(folder, features, per_feature=False)
    elif step == "floor_per_feature":
        rows = floor(folder, features, per_feature=True)
    elif step == "store_load":
        rows = store_load(folder, features)
    elif step == "floor_segments":
        rows = floor_segments(folder, features)
    elif step == "native_load":
        rows = native_load(folder, features)
    elif step == "floor_native":
        rows = floor_native(folder, features)
    elif step == "store_asof":
        rows = store_asof(folder, features, None)
    elif step == "client_offline":
        rows = client_offline(folder, features)
    else:
        rows = store_asof(folder, features, timedelta(days=7))
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu_before
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    total = round(sum(CHECKSUM), 3) if CHECKSUM else None
    print(
        json.dumps(
            {"seconds": seconds, "cpu": cpu, "peak_mib": peak_mib, "rows": rows, "sum": total}
        )
    )


def measure(step: str, folder: Path, features: int) -> dict[str, Any]:
    done = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            step,
            "--dir",
            str(folder),
            "--features",
            str(features),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def median_run(found: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median time among a step's rounds (its RSS and checksum with it)."""
    ordered = sorted(found, key=lambda r: float(r["seconds"]))
    return ordered[(len(ordered) - 1) // 2]


def measure_feast(
    offline_store: str, folder: Path, features: int, timeout: float
) -> dict[str, float] | str:
    """Feast's get_historical_features in its own venv; a reason string if it did not finish."""
    if not FEAST_PYTHON.exists():
        return f"no {FEAST_PYTHON.parent.parent} (run bash bench/feast_env.sh)"
    command = [
        str(FEAST_PYTHON),
        str(FEAST_SCRIPT),
        str(folder),
        "--offline-store",
        offline_store,
        "--features",
        str(features),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:.0f} s"
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        return lines[-1][:120]
    try:
        result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return "no result printed"
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spine", type=int, default=1_000_000)
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--features", type=int, default=5)
    parser.add_argument("--keys", type=int, default=0, help="distinct keys (default: spine / 2)")
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the read steps")
    parser.add_argument("--feast", action="store_true", help="also time Feast (slow)")
    parser.add_argument("--feast-timeout", type=float, default=300.0, help="seconds a Feast step")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.dir, args.features)
        return
    with tempfile.TemporaryDirectory(prefix="kairos-offline-pit-") as scratch:
        folder = args.dir or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(folder / "offline.duckdb", ignore_errors=True)  # a folder of segments
        (folder / "offline.duckdb").unlink(missing_ok=True)  # a store from before segments
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        build(folder, args.spine, args.events, args.features, args.keys or max(1, args.spine // 2))
        print(
            f"spine {args.spine:,} rows, events {args.events:,} rows x {args.features} features "
            f"(built in {time.perf_counter() - started:.1f} s)"
        )
        steps = [
            ("floor: one ASOF JOIN over Parquet", "floor"),
            ("floor: one ASOF JOIN per feature", "floor_per_feature"),
            ("store load (one write_many)", "store_load"),
            ("floor: one ASOF JOIN, store segments", "floor_segments"),
            ("native load (DuckDB tables)", "native_load"),
            ("floor: one ASOF JOIN, native tables", "floor_native"),
            ("store as-of (asof_many)", "store_asof"),
            ("store as-of, ttl 7d", "store_asof_ttl"),
            ("client offline_query(recompute=False)", "client_offline"),
        ]
        # loads once, in order; every read step once per round, rounds interleaved so the
        # machine's other load (and the page cache after a load) hits every step alike
        runs: dict[str, list[dict[str, Any]]] = {step: [] for _, step in steps}
        for _, step in steps:
            if step.endswith("_load"):
                runs[step].append(measure(step, folder, args.features))
        for _round in range(args.repeat):
            for _, step in steps:
                if not step.endswith("_load"):
                    runs[step].append(measure(step, folder, args.features))
        results = {step: median_run(found) for step, found in runs.items()}
        feast_steps = [
            ("feast get_historical (duckdb store)", "duckdb"),
            ("feast get_historical (file store)", "file"),
        ]
        feast = {
            store: measure_feast(store, folder, args.features, args.feast_timeout)
            for _, store in (feast_steps if args.feast else [])
        }
        base = results["floor"]["seconds"]
        header = (
            f"{'step':<36} {'seconds':>9} {'x floor':>8} {'CPU s':>7} {'peak RSS MiB':>13} "
            f"{'x floor':>8} {'same values':>12}"
        )
        print(header + (f"  {'spine rows back':>21}" if args.feast else ""))
        for label, step in steps:
            r = results[step]
            ratio = "" if step.endswith("_load") else f"{r['seconds'] / base:.2f}"
            memory = f"{r['peak_mib'] / results['floor']['peak_mib']:.2f}"
            same = "" if r.get("sum") is None else str(r["sum"] == results["floor"]["sum"])
            print(
                f"{label:<36} {r['seconds']:>9.2f} {ratio:>8} {r['cpu']:>7.2f} "
                f"{r['peak_mib']:>13.0f} {memory:>8} {same:>12}"
            )
        for label, store in feast_steps if args.feast else []:
            f = feast[store]
            if isinstance(f, str):
                print(f"{label:<36} did not finish: {f}")
                continue
            back = f"{int(f['rows']):,} / {args.spine:,}"
            print(
                f"{label:<36} {f['seconds']:>9.2f} {f['seconds'] / base:>8.2f} "
                f"{f['peak_mib']:>13.0f}  {back:>21}"
            )
        if args.feast:
            print(
                "(spine rows back: rows get_historical_features returned, of the spine's; "
                "the floor returns every spine row)"
            )
        client = results["client_offline"]["seconds"]
        native = results["floor_native"]["seconds"]
        segments = results["floor_segments"]["seconds"]
        print("\ntargets (issue 17)")
        print(
            f"  client offline_query <= {NATIVE_TARGET}x floor over native DuckDB tables  "
            f"{client / native:.2f}x  {'PASS' if client <= NATIVE_TARGET * native else 'FAIL'}"
        )
        print(
            f"  (client offline_query vs the floor over the store's own segments: "
            f"{client / segments:.2f}x; that floor vs native tables: {segments / native:.2f}x)"
        )
        cpu = {step: results[step]["cpu"] for step in ("client_offline", "floor_native")}
        print(
            f"  (in CPU seconds, steadier on a loaded machine: client offline_query / native "
            f"floor {cpu['client_offline'] / cpu['floor_native']:.2f}x)"
        )
        print(f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
