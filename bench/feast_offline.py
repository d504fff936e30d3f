"""Feast's `get_historical_features` over bench/offline_pit.py's Parquet files.

Runs with bench/.venv-feast's python (Feast 0.67; the DuckDB store needs `feast[duckdb]`):

    bench/.venv-feast/bin/python bench/feast_offline.py DIR --offline-store duckdb|file

DIR holds spine.parquet (row_id, key, ts) and events.parquet (key, observed_at, f0..fN).
Writes a throwaway Feast repo under DIR/feast-<store> (feature_store.yaml with the chosen
offline store, provider local, a registry file), registers an entity on `key` and a feature
view `bench` over events.parquet (ttl 3650 days, so the ttl never nulls a row), then times
reading the spine into pandas, `get_historical_features(...).to_arrow()` and prints one JSON
line: seconds, peak_mib (this process's peak RSS), rows (spine rows that came back) and
matched (rows with a non-null f0).
"""

import argparse
import json
import resource
import shutil
import time
from datetime import timedelta
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
from feast import (  # type: ignore[import-not-found]
    Entity,
    FeatureStore,
    FeatureView,
    Field,
    FileSource,
    ValueType,
)
from feast.types import Float64, Int64  # type: ignore[import-not-found]

VIEW = "bench"


def feature_store_yaml(repo: Path, offline_store: str) -> str:
    return (
        "project: offline_pit\n"
        f"registry: {repo / 'registry.db'}\n"
        "provider: local\n"
        "online_store:\n"
        "  type: sqlite\n"
        f"  path: {repo / 'online.db'}\n"
        "offline_store:\n"
        f"  type: {offline_store}\n"
        "entity_key_serialization_version: 3\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("dir", type=Path)
    parser.add_argument("--offline-store", choices=["duckdb", "file"], required=True)
    parser.add_argument("--features", type=int, default=5)
    args = parser.parse_args()

    folder: Path = args.dir.resolve()
    repo = folder / f"feast-{args.offline_store}"
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    (repo / "feature_store.yaml").write_text(feature_store_yaml(repo, args.offline_store))
    names = [f"f{i}" for i in range(args.features)]
    entity = Entity(name="key", join_keys=["key"], value_type=ValueType.INT64)
    view = FeatureView(
        name=VIEW,
        entities=[entity],
        ttl=timedelta(days=3650),
        schema=[Field(name="key", dtype=Int64)]
        + [Field(name=name, dtype=Float64) for name in names],
        source=FileSource(
            name="bench_events",
            path=str(folder / "events.parquet"),
            timestamp_field="observed_at",
        ),
        online=False,
    )
    store = FeatureStore(repo_path=str(repo))
    store.apply([entity, view])

    started = time.perf_counter()
    spine = pq.read_table(folder / "spine.parquet", columns=["key", "ts"])
    entity_df = spine.rename_columns(["key", "event_timestamp"]).to_pandas()
    result = store.get_historical_features(
        entity_df=entity_df, features=[f"{VIEW}:{name}" for name in names]
    ).to_arrow()
    seconds = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    matched = int(pc.sum(pc.is_valid(result.column(names[0]))).as_py() or 0)
    print(
        json.dumps(
            {
                "seconds": seconds,
                "peak_mib": peak_mib,
                "rows": result.num_rows,
                "matched": matched,
            }
        )
    )


if __name__ == "__main__":
    main()
