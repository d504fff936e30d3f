"""A throwaway Feast repo for bench/online_http.py; runs with bench/.venv-feast's python.

    bench/.venv-feast/bin/python bench/feast_repo.py REPO_DIR --project NAME --entity e1 \\
        --redis 127.0.0.1:6379 --values 1,2,3,4,5,6,7,8,9,10

Writes feature_store.yaml (Redis online store, a registry file), registers an entity `eid`
and a feature view `bench` with 10 Float64 features f0..f9 (what `feast apply` does, through
`FeatureStore.apply`), writes the values for one entity to the online store, reads them back
and prints them as JSON with Feast's version. Feast's Redis keys end with the project name,
so they can be deleted by matching `*NAME`.
"""

import argparse
import json
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from pathlib import Path

import pandas as pd
from feast import (  # type: ignore[import-not-found]
    Entity,
    FeatureStore,
    FeatureView,
    Field,
    FileSource,
    ValueType,
)
from feast.types import Float64, String  # type: ignore[import-not-found]

VIEW = "bench"
JOIN_KEY = "eid"


def feature_store_yaml(repo: Path, project: str, redis: str) -> str:
    return (
        f"project: {project}\n"
        f"registry: {repo / 'registry.db'}\n"
        "provider: local\n"
        "online_store:\n"
        "  type: redis\n"
        f'  connection_string: "{redis},db=0"\n'
        "offline_store:\n"
        "  type: file\n"
        "entity_key_serialization_version: 3\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("repo", type=Path)
    parser.add_argument("--project", required=True)
    parser.add_argument("--entity", required=True)
    parser.add_argument("--redis", default="127.0.0.1:6379")
    parser.add_argument("--values", required=True, help="comma-separated floats, one a feature")
    args = parser.parse_args()

    repo: Path = args.repo.resolve()
    values = [float(v) for v in args.values.split(",")]
    names = [f"f{i}" for i in range(len(values))]
    repo.mkdir(parents=True, exist_ok=True)
    (repo / "feature_store.yaml").write_text(feature_store_yaml(repo, args.project, args.redis))

    # The file source only exists so the view has one; reads come from Redis.
    frame = pd.DataFrame(
        {
            JOIN_KEY: [args.entity],
            **{name: [value] for name, value in zip(names, values, strict=True)},
            "event_timestamp": [datetime.now(UTC)],
        }
    )
    frame.to_parquet(repo / "values.parquet")
    entity = Entity(name=JOIN_KEY, join_keys=[JOIN_KEY], value_type=ValueType.STRING)
    view = FeatureView(
        name=VIEW,
        entities=[entity],
        ttl=timedelta(days=1),
        schema=[Field(name=JOIN_KEY, dtype=String)]
        + [Field(name=name, dtype=Float64) for name in names],
        source=FileSource(
            name="bench_values",
            path=str(repo / "values.parquet"),
            timestamp_field="event_timestamp",
        ),
        online=True,
    )
    store = FeatureStore(repo_path=str(repo))
    store.apply([entity, view])
    store.write_to_online_store(VIEW, frame)
    read = store.get_online_features(
        features=[f"{VIEW}:{name}" for name in names], entity_rows=[{JOIN_KEY: args.entity}]
    ).to_dict()
    print(json.dumps({"feast": version("feast"), "values": read}))


if __name__ == "__main__":
    main()
