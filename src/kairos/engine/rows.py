"""Has-many values: normalize what a resolver returns, and filter/project rows for inputs.

A has-many value inside the engine is a `DataFrame` whose columns are Arrow arrays of the
child's feature types (int64, float64, string, bool, timestamp[us, UTC], date32,
duration[us]); typing and dropping rows from after `now` are Arrow casts and one
comparison, not a Python call per value. Values Arrow cannot hold exactly (ints beyond
int64, `Any` columns of mixed types) keep the rows as dicts, typed one value at a time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kairos.definitions import expressions as ex
from kairos.definitions.frame import DataFrame
from kairos.definitions.graph import ClassInfo, FeatureInfo, Graph
from kairos.definitions.types import ValueType
from kairos.engine import columnar
from kairos.engine.evaluate import Compiled, compile_expression
from kairos.engine.values import coerce
from kairos.errors import InvalidValue, did_you_mean

DISTANCE = "distance"  # the column a kr.nearest row carries besides its document's features
FLOAT = ValueType("float")
UTC_MICROS = pa.timestamp("us", tz="+00:00")  # reads back as datetime.UTC, like `to_utc`
ARROW_TYPES: dict[str, pa.DataType] = {
    "bool": pa.bool_(),
    "int": pa.int64(),
    "float": pa.float64(),
    "str": pa.string(),
    "datetime": UTC_MICROS,
    "date": pa.date32(),
    "timedelta": pa.duration("us"),
}
_ARROW_ERRORS = (pa.ArrowException, TypeError, ValueError, OverflowError)


def normalize_rows(graph: Graph, info: FeatureInfo, value: Any, now: datetime) -> DataFrame[Any]:
    """Rows keyed by the child's feature names, typed, without rows from after `now`.

    Accepts a kairos DataFrame, a list of dicts or of feature-class instances, a dict of
    columns, a pandas or polars DataFrame, or a pyarrow Table or RecordBatch.
    """
    if info.target is None:  # pragma: no cover - only has-many features get here
        raise InvalidValue(f"{info.fqn} is not a has-many feature")
    child = graph.cls(info.target)
    if value is None:
        return DataFrame.from_arrow(_no_rows(child))
    if not _is_rows(value):
        raise InvalidValue(
            f"expected rows for {info.fqn} (a list of dicts, a DataFrame or an Arrow table); "
            f"got {type(value).__name__}"
        )
    try:
        frame = value if isinstance(value, DataFrame) else DataFrame(value)
    except InvalidValue as error:
        raise InvalidValue(f"rows of {info.fqn}: {error}") from None
    types = _Columns(info, child)
    table = frame.table
    if table is None:
        rows = frame.rows
        table = types.from_rows(rows)
        if table is None:  # values Arrow cannot hold exactly: typed rows, one value at a time
            return DataFrame(_typed_rows(types, rows, child.feature_time, now))
    else:
        table = types.conform(table)
    if table.num_rows == 0:
        return DataFrame.from_arrow(_no_rows(child))  # typed columns, so filters still apply
    return _until(table, child.feature_time, now)


def _no_rows(child: ClassInfo) -> pa.Table:
    fields = [
        pa.field(name, ARROW_TYPES[f.type.kind])
        for name, f in child.features.items()
        if f.kind == "scalar" and f.type is not None and f.type.kind in ARROW_TYPES
    ]
    return pa.schema(fields).empty_table()


def _is_rows(value: Any) -> bool:
    return (
        isinstance(value, DataFrame | list | tuple | Mapping | pa.Table | pa.RecordBatch)
        or hasattr(value, "to_arrow")
        or hasattr(value, "to_dict")
    )


class _Columns:
    """The child's features as the columns of rows: names checked, types in Arrow."""

    def __init__(self, info: FeatureInfo, child: ClassInfo) -> None:
        self.info, self.child = info, child

    def feature_type(self, key: Any) -> tuple[str, ValueType | None]:
        name = str(key).rpartition(".")[2]
        nearest = getattr(self.info, "nearest", None)  # kr.nearest has-many (vector search)
        if name == DISTANCE and nearest is not None and name not in self.child.features:
            return name, FLOAT  # how far a row found by vector search is
        feature = self.child.features.get(name)
        if feature is None:
            raise InvalidValue(
                f"rows of {self.info.fqn} have a column {key!r} that {self.child.namespace} "
                f"does not declare{did_you_mean(name, self.child.features)}; rename it "
                "(e.g. `select ... as name`) or drop it"
            )
        return name, feature.type

    def conform(self, table: pa.Table) -> pa.Table:
        columns: dict[str, pa.Array] = {}
        for key, column in zip(table.column_names, table.columns, strict=True):
            name, vt = self.feature_type(key)
            if name in columns:
                raise InvalidValue(
                    f"rows of {self.info.fqn} have the column {name!r} twice ({key!r} and another "
                    "spelling); keep one"
                )
            array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
            typed = _conform(array, vt)
            if typed is None:
                typed = self.coerced(name, vt, array.to_pylist())
                if typed is None:
                    typed = array  # kept as Arrow gave it (the rows read it back the same)
            columns[name] = typed
        return pa.table(columns) if columns else pa.table({}).slice(0, 0)

    def from_rows(self, rows: Sequence[dict[str, Any]]) -> pa.Table | None:
        keys: dict[Any, None] = {}
        for row in rows:
            keys.update(dict.fromkeys(row))
        columns: dict[str, pa.Array] = {}
        for key in keys:
            name, vt = self.feature_type(key)
            if name in columns:
                return None  # "txn.amount" and "amount" both: the row path decides
            values = [row.get(key) for row in rows]
            try:
                typed = _conform(pa.array(values), vt)
            except _ARROW_ERRORS:
                typed = None
            if typed is None:
                typed = self.coerced(name, vt, values)
                if typed is None:
                    return None
            columns[name] = typed
        if not columns:
            return None if rows else pa.table({})
        return pa.table(columns)

    def coerced(self, name: str, vt: ValueType | None, values: list[Any]) -> pa.Array | None:
        """The column typed one value at a time (ISO strings, 0/1 for bool...): InvalidValue
        naming the column and row when a value does not fit, None when Arrow cannot hold
        the typed values exactly."""
        if vt is not None:
            typed = []
            for index, cell in enumerate(values):
                try:
                    typed.append(coerce(vt, cell))
                except InvalidValue as error:
                    raise InvalidValue(
                        f"column {name!r} of {self.info.fqn}, row {index}: {error}"
                    ) from None
            values = typed
        target = ARROW_TYPES.get(vt.kind) if vt is not None else None
        try:
            return pa.array(values, type=target)
        except _ARROW_ERRORS:
            return None


def _conform(array: pa.Array, vt: ValueType | None) -> pa.Array | None:
    """The array as the feature's Arrow type where the cast keeps every value exactly as
    `coerce` would; None where values must be typed one at a time."""
    if vt is None or vt.kind not in ARROW_TYPES:
        return array if not pa.types.is_null(array.type) or vt is None else None
    target = ARROW_TYPES[vt.kind]
    kind = array.type
    try:
        if kind == target:
            return array  # already typed: no cast call
        if pa.types.is_null(kind):
            return array.cast(target)
        if vt.kind == "float" and (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
            return array.cast(target, safe=False)  # float(int) rounds the same way
        if vt.kind == "int" and (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
            return array.cast(target)  # safe: a fraction or an overflow is refused
        if vt.kind == "str" and pa.types.is_large_string(kind):
            return array.cast(target)
        if vt.kind == "bool" and pa.types.is_integer(kind):
            zero_one = pc.all(pc.is_in(array, value_set=pa.array([0, 1], kind))).as_py()
            return array.cast(target) if zero_one in (True, None) else None
        if vt.kind == "datetime" and pa.types.is_timestamp(kind):
            return array.cast(target)  # a naive time is UTC already, as in `to_utc`
        if vt.kind == "date" and pa.types.is_date64(kind):
            return array.cast(target)
        if vt.kind == "timedelta" and pa.types.is_duration(kind):
            return array.cast(target)
    except _ARROW_ERRORS:
        return None
    return None


def _until(table: pa.Table, time_column: str | None, now: datetime) -> DataFrame[Any]:
    """Nothing from the future: rows whose time is after `now` do not exist yet."""
    if time_column is None or time_column not in table.column_names or table.num_rows == 0:
        return DataFrame.from_arrow(table)
    times = table.column(time_column)
    if not pa.types.is_timestamp(times.type):
        return DataFrame.from_arrow(table)
    keys = columnar.column_keys(table, time_column)
    bound = columnar.key_of(now, times.type) if keys is not None else None
    if keys is not None and bound is not None:  # sorted times: the future is a tail
        cut = int(np.searchsorted(keys, bound, side="right"))
        kept = table if cut == len(keys) else table.slice(0, cut)
        frame = DataFrame.from_arrow(kept)
        columnar.remember_sorted(frame, kept, time_column, keys[:cut])  # windows search it
        return frame
    late = pc.greater(times, pa.scalar(now, type=times.type))
    if not pc.any(late).as_py():
        return DataFrame.from_arrow(table)
    return DataFrame.from_arrow(table.filter(pc.invert(pc.fill_null(late, False))))


def _typed_rows(
    types: _Columns, rows: Sequence[dict[str, Any]], time_column: str | None, now: datetime
) -> list[dict[str, Any]]:
    kept: list[dict[str, Any]] = []
    for index, raw in enumerate(rows):
        row: dict[str, Any] = {}
        for key, cell in raw.items():
            name, vt = types.feature_type(key)
            try:
                row[name] = coerce(vt, cell) if vt is not None else cell
            except InvalidValue as error:
                raise InvalidValue(
                    f"column {name!r} of {types.info.fqn}, row {index}: {error}"
                ) from None
        if time_column is not None:
            observed = row.get(time_column)
            if observed is not None and observed > now:
                continue  # nothing from the future: this row does not exist yet
        kept.append(row)
    return kept


@dataclass(frozen=True)
class Selection:
    """Filters and projections of a has-many resolver input, compiled once: closures for
    the row engine, and vectorized nodes when every one of them has an exact form."""

    filters: tuple[Compiled, ...]
    projections: tuple[Compiled, ...]
    names: tuple[str, ...]
    vectorized: tuple[tuple[columnar.Node, ...], tuple[columnar.Node, ...]] | None


def compile_selection(
    filters: Sequence[ex.Expr], projections: Sequence[ex.Expr], names: Sequence[str]
) -> Selection:
    vec_filters = [columnar.compile_row_expression(f, compile_expression) for f in filters]
    vec_projections = [columnar.compile_row_expression(p, compile_expression) for p in projections]
    vectorized = None
    if all(v is not None for v in (*vec_filters, *vec_projections)):
        vectorized = (
            tuple(v for v in vec_filters if v is not None),
            tuple(v for v in vec_projections if v is not None),
        )
    return Selection(
        tuple(compile_expression(f) for f in filters),
        tuple(compile_expression(p) for p in projections),
        tuple(names),
        vectorized,
    )


def select_rows(value: Any, selection: Selection, now: datetime) -> DataFrame[Any]:
    """Rows passing every filter, reduced to the projected columns (all columns if none)."""
    if isinstance(value, DataFrame) and value.table is not None:
        if not selection.filters and not selection.projections:
            return value
        if selection.vectorized is not None:
            filters, projections = selection.vectorized
            try:
                table = columnar.select_table(value, filters, projections, selection.names, now)
                return DataFrame.from_arrow(table)
            except Exception:  # no exact vectorized form for these values: rows below
                pass
    rows = value if value is not None else []
    kept = [r for r in rows if all(f((), now, r) is True for f in selection.filters)]
    if not selection.projections:
        return DataFrame(kept)
    pairs = list(zip(selection.names, selection.projections, strict=True))
    return DataFrame([{name: project((), now, r) for name, project in pairs} for r in kept])
