"""What a model takes and returns, inferred when it is registered, and the check that turns
rows (JSON objects, lists, Arrow, pandas, NumPy) into the 2-D array the model expects.

    ModelSchema(inputs=("amount", "count"), dtype="float64", classes=(0, 1),
                output="probability", output_shape=())
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kairos.models.errors import SchemaMismatch

OUTPUTS = ("probability", "label", "value")


@dataclass(frozen=True, slots=True)
class ModelSchema:
    """Inputs in the order the model reads them; what one row of output is."""

    inputs: tuple[str, ...]
    dtype: str = "float64"  # float32 | float64
    classes: tuple[Any, ...] | None = None
    output: str = "value"  # probability (of classes[1] when binary) | label | value
    output_shape: tuple[int, ...] = ()  # per row: () is one number, (k,) a list of k
    named: bool = True  # False when the model had no column names (x0, x1, ...)

    @property
    def n_features(self) -> int:
        return len(self.inputs)

    def describe(self) -> str:
        """`amount: float, count: float` - used in error messages."""
        return ", ".join(self.inputs)

    def to_json(self) -> dict[str, Any]:
        return {
            "inputs": list(self.inputs),
            "n_features": self.n_features,
            "dtype": self.dtype,
            "classes": None if self.classes is None else [_plain(c) for c in self.classes],
            "output": self.output,
            "output_shape": list(self.output_shape),
            "named": self.named,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelSchema:
        classes = data.get("classes")
        return cls(
            tuple(data["inputs"]),
            data.get("dtype", "float64"),
            None if classes is None else tuple(classes),
            data.get("output", "value"),
            tuple(data.get("output_shape", ())),
            bool(data.get("named", True)),
        )


def positional_names(count: int) -> tuple[str, ...]:
    """Names for a model fitted on a bare array: x0, x1, ..."""
    return tuple(f"x{i}" for i in range(count))


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def to_matrix(rows: Any, schema: ModelSchema) -> np.ndarray:
    """Rows as the (n, n_features) array the model reads, in schema order.

    Accepts a list of objects keyed by input name, a list of lists, a mapping of columns, an
    Arrow table, a pandas DataFrame or a 2-D NumPy array. Anything else, a missing or extra
    column, or a value that is not a number raises SchemaMismatch naming the expected schema.
    """
    dtype = np.dtype(schema.dtype)
    if isinstance(rows, np.ndarray):
        return _check_array(rows, schema, dtype)
    if _is_arrow(rows) or _is_pandas(rows):
        names = [str(c) for c in rows.column_names] if _is_arrow(rows) else list(rows.columns)
        _check_names(names, schema)
        columns = [_column(rows, name, schema, dtype) for name in schema.inputs]
        return _stack(columns, dtype, len(rows))
    if isinstance(rows, Mapping):
        _check_names([str(k) for k in rows], schema)
        columns = [_numbers(rows[name], name, schema, dtype) for name in schema.inputs]
        lengths = {len(c) for c in columns}
        if len(lengths) > 1:
            raise SchemaMismatch("input columns differ in length", field="rows")
        return _stack(columns, dtype, lengths.pop() if lengths else 0)
    if isinstance(rows, Sequence) and not isinstance(rows, str | bytes):
        return _rows(rows, schema, dtype)
    raise SchemaMismatch(
        f"rows must be a list of objects or lists, columns, an Arrow table, a DataFrame or a "
        f"2-D array; got {type(rows).__name__}. Expected inputs: {schema.describe()}",
        field="rows",
    )


def _is_arrow(rows: Any) -> bool:
    return type(rows).__module__.startswith("pyarrow") and hasattr(rows, "column_names")


def _is_pandas(rows: Any) -> bool:
    return type(rows).__module__.startswith("pandas") and hasattr(rows, "columns")


def _check_names(names: Sequence[str], schema: ModelSchema) -> None:
    missing = [n for n in schema.inputs if n not in names]
    extra = [n for n in names if n not in schema.inputs]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(map(repr, missing))}")
        if extra:
            parts.append(f"unexpected {', '.join(map(repr, extra))}")
        raise SchemaMismatch(
            f"rows do not match the model's inputs ({'; '.join(parts)}); send exactly "
            f"these columns: {schema.describe()}",
            field="rows",
        )


def _check_array(array: np.ndarray, schema: ModelSchema, dtype: np.dtype[Any]) -> np.ndarray:
    if array.ndim != 2 or array.shape[1] != schema.n_features:
        raise SchemaMismatch(
            f"the model takes rows of {schema.n_features} numbers ({schema.describe()}); "
            f"got an array of shape {array.shape}",
            field="rows",
        )
    if array.dtype.kind not in "fiub":
        raise SchemaMismatch(
            f"the model takes numbers ({schema.describe()}); got an array of {array.dtype}",
            field="rows",
        )
    return np.ascontiguousarray(array, dtype=dtype)


def _column(rows: Any, name: str, schema: ModelSchema, dtype: np.dtype[Any]) -> np.ndarray:
    column = rows.column(name) if _is_arrow(rows) else rows[name]
    values = column.to_numpy(zero_copy_only=False) if _is_arrow(rows) else column.to_numpy()
    if values.dtype.kind not in "fiub":
        return _numbers(list(values), name, schema, dtype)
    return np.asarray(values)


def _numbers(values: Any, name: str, schema: ModelSchema, dtype: np.dtype[Any]) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype.kind in "fiub":
        return values
    if isinstance(values, str | bytes) or not isinstance(values, Sequence | np.ndarray):
        raise SchemaMismatch(f"column {name!r} must be a list of numbers", field=name)
    out = np.empty(len(values), dtype=dtype)
    for index, value in enumerate(values):
        out[index] = _number(value, name, index, schema)
    return out


def _number(value: Any, name: str, row: int, schema: ModelSchema) -> float:
    if value is None:
        return math.nan
    if isinstance(value, bool | int | float | np.number):
        return float(value)
    raise SchemaMismatch(
        f"row {row}, column {name!r}: {value!r} is not a number; the model takes numbers "
        f"for {schema.describe()}",
        field=name,
    )


def _rows(rows: Sequence[Any], schema: ModelSchema, dtype: np.dtype[Any]) -> np.ndarray:
    out = np.empty((len(rows), schema.n_features), dtype=dtype)
    inputs = schema.inputs
    for index, row in enumerate(rows):
        if isinstance(row, Mapping):
            if len(row) != len(inputs) or any(n not in row for n in inputs):
                try:
                    _check_names([str(k) for k in row], schema)
                except SchemaMismatch as error:
                    raise SchemaMismatch(f"row {index}: {error}", field="rows") from None
            for column, name in enumerate(inputs):
                out[index, column] = _number(row[name], name, index, schema)
        elif isinstance(row, Sequence) and not isinstance(row, str | bytes):
            if len(row) != len(inputs):
                raise SchemaMismatch(
                    f"row {index} has {len(row)} values; the model takes {len(inputs)} "
                    f"({schema.describe()})",
                    field="rows",
                )
            for column, value in enumerate(row):
                out[index, column] = _number(value, inputs[column], index, schema)
        else:
            raise SchemaMismatch(
                f"row {index} must be an object keyed by input name or a list of "
                f"{len(inputs)} numbers ({schema.describe()}); got {type(row).__name__}",
                field="rows",
            )
    return out


def _stack(columns: list[np.ndarray], dtype: np.dtype[Any], rows: int) -> np.ndarray:
    out = np.empty((rows, len(columns)), dtype=dtype)
    for index, column in enumerate(columns):
        out[:, index] = column
    return out
