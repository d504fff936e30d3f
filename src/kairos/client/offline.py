"""Offline queries that recompute history: every spine row is computed as of its own time.

    table = client.offline_query(spine, output=[User.txn_count["7d"], User.risk])

The spine is a table with one column per input feature (named like `user.id`) and a
timestamp column (`ts`, or `timestamp=`). Each row is answered as the online query would have
answered at that moment: resolvers get `Now == ts` and rows of has-many features from after
`ts` do not exist. One row out per spine row, in spine order, duplicates kept; a row whose
key is null gets nulls.

Reading stored values as of each row (`recompute=False`) needs the offline store, which is
not built yet: such a call is refused with an error that says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from kairos.engine.result import FeatureError
from kairos.engine.rows import normalize_rows
from kairos.engine.values import check, to_utc
from kairos.errors import InvalidInput, InvalidValue, KairosError

if TYPE_CHECKING:
    from kairos.client.client import Client


@dataclass
class OfflineResult:
    """The rows of an offline query as an Arrow table, plus the per-row errors."""

    table: pa.Table
    errors: list[FeatureError]

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def column(self, name: str) -> list[Any]:
        return list(self.table.column(name).to_pylist())

    def to_pylist(self) -> list[dict[str, Any]]:
        return list(self.table.to_pylist())

    def to_pandas(self) -> Any:
        return self.table.to_pandas()

    def to_polars(self) -> Any:
        import polars as pl  # optional: `pip install kairos[polars]`

        return pl.from_arrow(self.table)


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
    client: Client,
    spine: Any,
    output: Sequence[Any],
    *,
    timestamp: str = "ts",
    recompute: bool = True,
) -> OfflineResult:
    if recompute is not True:
        raise KairosError(
            "offline queries that read stored values (recompute=False or a list) need the "
            "offline store, which kairos does not have yet; pass recompute=True to compute "
            "every row as of its time"
        )
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
        if not isinstance(value, datetime):
            raise InvalidInput(
                f"spine row {index}: {timestamp}={value!r} is not a datetime", field=timestamp
            )
        row_times.append(to_utc(value))
    inputs = {client.name(name): values for name, values in columns.items()}
    names = [client.name(o) for o in output]
    plan = client.planner.plan(list(inputs), names, mode="offline")
    for name, values in inputs.items():
        info = plan.columns[name].info
        for index, value in enumerate(values):
            if value is None:
                continue  # a null key: that row's features are null
            try:
                if info.kind == "has_many":
                    values[index] = normalize_rows(client.graph, info, value, row_times[index])
                else:
                    values[index] = check(info, value, allow_null=True)
            except InvalidValue as error:
                raise InvalidInput(f"spine row {index}, {name!r}: {error}", field=name) from None
    now = max(row_times) if row_times else datetime.now().astimezone()
    outcome = await client.engine.run(plan, inputs, rows, now, {}, row_times=row_times)
    table = {timestamp: row_times, **{name: list(v) for name, v in columns.items()}}
    table.update({name: outcome.columns[name].values for name in plan.outputs})
    errors = [e for col in outcome.columns.values() for e in col.errors if e is not None]
    try:
        arrow = pa.table(table)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
        raise KairosError(f"the offline result does not fit an Arrow table: {error}") from None
    return OfflineResult(arrow, errors)
