"""Offline queries that recompute history: every spine row is computed as of its own time.

    table = client.offline_query(spine, output=[User.txn_count["7d"], User.risk])

The spine is a table with one column per input feature (named like `user.id`) and a
timestamp column (`ts`, or `timestamp=`). Each row is answered as the online query would have
answered at that moment: resolvers get `Now == ts` and rows of has-many features from after
`ts` do not exist. One row out per spine row, in spine order, duplicates kept; a row whose
key is null gets nulls.

With `recompute=False` every output is read from the offline store instead: for each row,
the latest value with `observed_at <= ts` (through has-one relations too), as written by
earlier online queries and backfills; `recompute=[...]` recomputes just those features.

What recomputes is a `Recompute`: this process's engine by default, or Ray workers
(`ray_engine.py`, `engine="ray"`); checking the spine and reading stored values stay here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc

from kairos.engine.inputs import check_inputs
from kairos.engine.result import FeatureError
from kairos.engine.values import to_utc
from kairos.errors import InvalidInput, InvalidValue, KairosError
from kairos.planner.plan import Plan
from kairos.project.snapshot import Snapshot
from kairos.stores.datasets import Dataset, DatasetStore, DatasetVersion
from kairos.stores.offline import readable

Progress = Callable[[int, int], None]  # (rows done, rows in all)
# (the offline plan, its input columns, each row's time, progress) -> each plan output's
# values, and the errors of its rows (in plan output order, then row order)
Recompute = Callable[
    [Plan, dict[str, list[Any]], list[datetime], Progress | None],
    Awaitable[tuple[dict[str, list[Any]], list[FeatureError]]],
]


@dataclass
class OfflineResult:
    """The rows of an offline query as an Arrow table, plus the per-row errors."""

    table: pa.Table
    errors: list[FeatureError]
    query: dict[str, Any]  # what was asked: outputs, timestamp column, recompute, rows

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def column(self, name: str) -> list[Any]:
        return list(self.table.column(name).to_pylist())

    def to_pylist(self) -> list[dict[str, Any]]:
        return list(self.table.to_pylist())

    def to_pandas(self) -> Any:
        return self.table.to_pandas()

    def to_polars(self) -> Any:
        import polars as pl  # optional: `pip install kairos-inference[polars]`

        return pl.from_arrow(self.table)

    def to_dict(self, *, schema: bool = False) -> dict[str, Any]:
        """The rows as columns of JSON values, each error with its row, and what was asked
        (what `POST /v1/query/offline` replies); with `schema`, also the table's Arrow schema
        as bytes (for tagged JSON, which carries bytes), so `from_dict` rebuilds it exactly."""
        body = {
            "rows": len(self),
            "columns": self.table.to_pydict(),
            "errors": [error.to_dict() for error in self.errors],
            "query": self.query,
        }
        if schema:
            body["schema"] = self.table.schema.serialize().to_pybytes()
        return body

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OfflineResult:
        """The result `to_dict` wrote: with its schema the same Arrow table, else one whose
        column types Arrow infers from the values.

        >>> OfflineResult.from_dict(result.to_dict(schema=True)) == result  # doctest: +SKIP
        True
        """
        schema = data.get("schema")
        columns = data["columns"]
        if isinstance(schema, bytes):
            table = pa.Table.from_pydict(columns, schema=pa.ipc.read_schema(pa.py_buffer(schema)))
        else:
            table = pa.Table.from_pydict(columns)
        errors = [FeatureError.from_dict(error) for error in data["errors"]]
        return cls(table, errors, dict(data["query"]))


def spine_columns(spine: Any) -> dict[str, list[Any]]:
    """Columns of a pandas, polars or Arrow table, a dict of columns, or a list of rows."""
    if isinstance(spine, pa.Table):
        return {name: spine.column(name).to_pylist() for name in spine.column_names}
    if hasattr(spine, "to_arrow"):  # polars
        return spine_columns(spine.to_arrow())
    if hasattr(spine, "to_dict") and hasattr(spine, "columns"):  # pandas
        return spine_columns(pa.Table.from_pandas(spine, preserve_index=False))
    if isinstance(spine, Mapping):
        return {str(k): list(v) for k, v in spine.items()}
    if isinstance(spine, Sequence) and not isinstance(spine, str | bytes):
        names = list(dict.fromkeys(k for row in spine for k in row))
        return {name: [row.get(name) for row in spine] for name in names}
    raise InvalidInput(
        f"the spine must be a pandas, polars or Arrow table, a dict of columns or a list of "
        f"rows; got {type(spine).__name__}",
        field="spine",
    )


async def offline_query(
    runtime: Snapshot,
    spine: Any,
    output: Sequence[Any],
    *,
    timestamp: str = "ts",
    recompute: bool | Sequence[Any] = True,
    engine: Recompute | None = None,
    progress: Progress | None = None,
) -> OfflineResult:
    if recompute is False:
        return await asyncio.to_thread(_stored_query, runtime, spine, output, timestamp)
    columns = spine_columns(spine)
    if timestamp not in columns:
        raise InvalidInput(
            f"the spine has no timestamp column {timestamp!r} (columns: "
            f"{', '.join(columns) or 'none'}); add one or pass timestamp=",
            field=timestamp,
        )
    times = columns.pop(timestamp)
    rows = len(times)
    row_times: list[datetime] = []
    for index, value in enumerate(times):
        if isinstance(value, str):  # JSON bodies and CSV files carry ISO 8601 text
            with contextlib.suppress(ValueError):
                value = datetime.fromisoformat(value)
        if not isinstance(value, datetime):
            raise InvalidInput(
                f"spine row {index}: {timestamp}={value!r} is not a datetime", field=timestamp
            )
        try:
            row_times.append(to_utc(value))
        except InvalidValue as error:
            raise InvalidInput(f"spine row {index}: {error}", field=timestamp) from None
    inputs = {runtime.name(name): values for name, values in columns.items()}
    names = [runtime.name(o) for o in output]
    if recompute is True:
        computed = names
    else:
        computed = [runtime.name(f) for f in recompute]
        unknown = sorted(set(computed) - set(names))
        if unknown:
            raise InvalidInput(
                f"recompute names {', '.join(unknown)}, which the query does not output",
                field="recompute",
            )
    stored = [name for name in names if name not in computed]
    root = runtime.graph.ref(names[0]).root if names else ""
    check_inputs(
        runtime.graph,
        inputs,
        lambda row: row_times[row],
        nulls=True,  # a null key: that row's features are null
        where=lambda row, name: f"spine row {row}, {name!r}",
    )
    table: dict[str, Any] = {timestamp: row_times, **{n: list(v) for n, v in columns.items()}}
    errors: list[FeatureError] = []
    if computed:
        plan = runtime.planner.plan(list(inputs), computed, mode="offline")
        run = engine or local_recompute(runtime)
        values, errors = await run(plan, inputs, row_times, progress)
        table.update({name: values[name] for name in computed})
    if stored:
        from_store = await asyncio.to_thread(
            _stored_values, runtime, root, inputs, stored, row_times
        )
        table.update(from_store)
    table = {
        timestamp: table[timestamp],
        **{n: table[n] for n in columns},
        **{n: table[n] for n in names},
    }
    try:
        arrow = pa.table(table)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
        raise KairosError(f"the offline result does not fit an Arrow table: {error}") from None
    query = {
        "outputs": names,
        "timestamp": timestamp,
        "recompute": computed == names if recompute is True else computed,
        "spine_rows": rows,
    }
    return OfflineResult(arrow, errors, query)


def local_recompute(runtime: Snapshot) -> Recompute:
    """Recompute in this process: one run of the engine over every row."""

    async def run(
        plan: Plan,
        inputs: dict[str, list[Any]],
        row_times: list[datetime],
        progress: Progress | None,
    ) -> tuple[dict[str, list[Any]], list[FeatureError]]:
        rows = len(row_times)
        now = max(row_times) if row_times else datetime.now().astimezone()
        outcome = await runtime.engine.run(plan, inputs, rows, now, {}, row_times=row_times)
        if progress is not None:
            progress(rows, rows)
        values = {name: column.values for name, column in outcome.columns.items()}
        errors = [e for col in outcome.columns.values() for e in col.errors if e is not None]
        return values, errors

    return run


def arrow_spine(spine: Any) -> pa.Table:
    """The spine as an Arrow table, without a Python loop over its rows where possible."""
    if isinstance(spine, pa.Table):
        return spine
    try:
        if hasattr(spine, "to_arrow"):  # polars
            return spine.to_arrow()
        if hasattr(spine, "to_dict") and hasattr(spine, "columns"):  # pandas
            return pa.Table.from_pandas(spine, preserve_index=False)
        return pa.table(spine_columns(spine))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as error:
        raise InvalidInput(
            f"the spine is not a table: {error}; give each column values of one type",
            field="spine",
        ) from None


def _stored_query(
    runtime: Snapshot, spine: Any, output: Sequence[Any], timestamp: str
) -> OfflineResult:
    """`recompute=False`: every output read as of each row, columnar end to end (a million
    spine rows never become Python objects, except values of list/dict features)."""
    table = arrow_spine(spine)
    if timestamp not in table.column_names:
        raise InvalidInput(
            f"the spine has no timestamp column {timestamp!r} (columns: "
            f"{', '.join(table.column_names) or 'none'}); add one or pass timestamp=",
            field=timestamp,
        )
    times = table.column(timestamp)
    if pa.types.is_string(times.type) or pa.types.is_large_string(times.type):
        times = pa.array(_parse_times(times.to_pylist(), timestamp), pa.timestamp("us", "UTC"))
    if not pa.types.is_timestamp(times.type):
        raise InvalidInput(
            f"spine column {timestamp!r} holds {times.type}, not times", field=timestamp
        )
    if times.type.tz is None:  # naive times are UTC, as everywhere in kairos
        times = pc.assume_timezone(times, "UTC")
    names = [runtime.name(o) for o in output]
    if not names:
        raise InvalidInput("name at least one output", field="outputs")
    root = runtime.graph.ref(names[0]).root
    others = sorted({runtime.graph.ref(n).root for n in names} - {root})
    if others:
        raise InvalidInput(
            f"outputs start from several classes ({root}, {', '.join(others)}); an offline query "
            f"is about one entity: reach the others through relations",
            field="outputs",
        )
    inputs = {runtime.name(n): table.column(n) for n in table.column_names if n != timestamp}
    found = _stored_values(runtime, root, inputs, names, times)
    for name in names:
        value = found[name]
        table = table.append_column(
            name, value if isinstance(value, pa.Array | pa.ChunkedArray) else pa.array(value)
        )
    query = {
        "outputs": names,
        "timestamp": timestamp,
        "recompute": [],
        "spine_rows": table.num_rows,
    }
    return OfflineResult(table, [], query)


def _parse_times(texts: list[Any], timestamp: str) -> list[datetime | None]:
    parsed: list[datetime | None] = []
    for index, text in enumerate(texts):
        try:
            parsed.append(None if text is None else to_utc(datetime.fromisoformat(text)))
        except (ValueError, InvalidValue):
            raise InvalidInput(
                f"spine row {index}: {timestamp}={text!r} is not a datetime", field=timestamp
            ) from None
    return parsed


def _stored_values(
    runtime: Snapshot,
    root: str,
    inputs: dict[str, Any],
    names: list[str],
    times: Any,
) -> dict[str, Any]:
    """As-of reads from the offline store: per row, the latest value at or before its time,
    following has-one relations hop by hop (the foreign key as of then, then its target)."""
    if runtime.offline.writer is not None:
        runtime.offline.writer.flush()  # what online queries computed so far counts too
    store = runtime.offline.store()
    primary = f"{root}.{runtime.graph.cls(root).primary}"
    if primary not in inputs:
        raise InvalidInput(
            f"reading stored values needs the spine's {primary!r} column", field=primary
        )
    # the keys each relation path reaches, as of each row: a hop read once for all outputs
    reached: dict[tuple[str, ...], tuple[str, Any]] = {(): (root, inputs[primary])}
    wanted: dict[tuple[str, ...], dict[str, str]] = {}  # path -> output name -> feature
    for name in names:
        ref = runtime.graph.ref(name)
        for depth in range(1, len(ref.path) + 1):
            path = tuple(ref.path[:depth])
            if path in reached:
                continue
            namespace, keys = reached[path[:-1]]
            relation = runtime.graph.feature(namespace, path[-1])
            if relation.join_key is None or relation.target is None:  # pragma: no cover
                raise InvalidInput(f"{name!r}: {namespace}.{path[-1]} is not a has-one relation")
            reached[path] = (relation.target, store.asof(namespace, relation.join_key, keys, times))
        wanted.setdefault(tuple(ref.path), {})[name] = runtime.graph.walk(ref)[1].name
    found: dict[str, Any] = {}
    for path, outputs in wanted.items():
        namespace, keys = reached[path]
        ttls = {f: runtime.graph.feature(namespace, f).ttl for f in outputs.values()}
        arrays = store.asof_many(namespace, list(outputs.values()), keys, times, ttls)
        for name, feature in outputs.items():
            found[name] = readable(arrays[feature], store.value_kind(namespace, feature))
    return found


class Datasets:
    """`client.datasets`: offline results saved by name as versioned Parquet files.

    >>> client.datasets.save("training", client.offline_query(spine, outputs))  # doctest: +SKIP
    >>> client.datasets.get("training").to_pandas()  # latest version  # doctest: +SKIP
    """

    def __init__(self, store: DatasetStore, fingerprint: Callable[[], str]) -> None:
        self.store = store
        self._fingerprint = fingerprint  # of the definitions a result is computed with now

    def save(self, name: str, result: OfflineResult) -> DatasetVersion:
        """Save an offline result with its query and the fingerprint of the definitions."""
        return self.store.save(
            name,
            result.table,
            query=result.query,
            definitions_hash=self._fingerprint(),
        )

    def get(self, name: str, version: int | None = None) -> Dataset:
        return self.store.get(name, version)

    def versions(self, name: str) -> list[DatasetVersion]:
        return self.store.versions(name)

    def names(self) -> list[str]:
        return self.store.names()
