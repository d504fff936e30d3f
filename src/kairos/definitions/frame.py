"""`DataFrame`: the rows of a has-many feature, held as an Arrow table.

A resolver may return any of these; the engine keeps the columns and evaluates `_`
expressions over them vectorized:

>>> DataFrame([{"amount": 3.0}, {"amount": 4.5}])["amount"]       # a list of dicts
[3.0, 4.5]
>>> len(DataFrame({"amount": [3.0, 4.5]}))                         # a dict of columns
2

and a list of feature-class instances (`DataFrame([Transaction(id="t1", amount=3.0)])`), a
pandas or polars DataFrame, a pyarrow Table or RecordBatch. Rows built from dicts stay dicts
until someone asks for Arrow (`to_arrow()`); rows built from columns become dicts only when
someone iterates.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import pyarrow as pa

from kairos.definitions.feature import ref_of
from kairos.errors import InvalidValue

T = TypeVar("T")


@dataclass(frozen=True)
class DataFrameSpec:
    """`DataFrame[Transaction]` or `DataFrame[Transaction.id, Transaction.amount]`."""

    items: tuple[Any, ...]


class DataFrame(Generic[T]):
    """Rows of a has-many feature, as a resolver receives and may return them.

    `DataFrame[Transaction]` in an annotation declares a has-many feature. A value holds
    rows keyed by the child's feature names (an Arrow table underneath):

    >>> df = DataFrame([{"amount": 3.0}, {"amount": 4.5}])
    >>> len(df), df["amount"], df.to_arrow().num_rows
    (2, [3.0, 4.5], 2)
    """

    __slots__ = ("_rows", "_table", "cache")

    def __class_getitem__(cls, items: Any) -> Any:
        return DataFrameSpec(items if isinstance(items, tuple) else (items,))

    def __init__(self, data: Any = ()) -> None:
        self._rows: list[dict[str, Any]] | None = None
        self._table: pa.Table | None = None
        # what the engine computed once about these rows (a column is sorted, a numpy view)
        self.cache: dict[Any, Any] = {}
        if isinstance(data, DataFrame):
            self._rows, self._table = data._rows, data._table
        elif isinstance(data, pa.Table):
            self._table = data
        elif isinstance(data, pa.RecordBatch):
            self._table = pa.Table.from_batches([data])
        elif isinstance(data, Mapping):
            self._table = _from_columns(data)
        elif _is_pandas(data):
            self._table = _from_pandas(data)
        elif hasattr(data, "to_arrow") and not isinstance(data, Sequence):
            self._table = data.to_arrow()  # polars
        else:
            self._rows = [_row(item, i) for i, item in enumerate(data)]

    @classmethod
    def from_arrow(cls, table: pa.Table) -> DataFrame[Any]:
        """The rows of an Arrow table, without copying them."""
        frame: DataFrame[Any] = cls.__new__(cls)
        frame._rows, frame._table, frame.cache = None, table, {}
        return frame

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The rows as dicts (made from the columns the first time they are asked for)."""
        if self._rows is None:
            self._rows = self._table.to_pylist() if self._table is not None else []
        return self._rows

    @property
    def table(self) -> pa.Table | None:
        """The Arrow table when the rows are held as columns already, else None."""
        return self._table

    def to_arrow(self) -> pa.Table:
        """The rows as a pyarrow Table (converted from the dicts the first time)."""
        if self._table is None:
            self._table = _from_rows(self.rows)
        return self._table

    def to_polars(self) -> Any:
        import polars as pl  # optional, only when asked for

        return pl.from_arrow(self.to_arrow())

    def to_pandas(self) -> Any:
        import pandas as pd  # optional, only when asked for

        if self._table is not None:
            return self._table.to_pandas()
        return pd.DataFrame(self.rows)

    def __len__(self) -> int:
        return self._table.num_rows if self._table is not None else len(self.rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    def __getitem__(self, column: Any) -> list[Any]:
        ref = ref_of(column)
        name = ref.name if ref is not None else column
        if self._rows is None and self._table is not None:
            if name not in self._table.column_names:
                return [None] * self._table.num_rows
            return self._table.column(name).to_pylist()  # type: ignore[no-any-return]
        return [row.get(name) for row in self.rows]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, list):
            return self.rows == other
        return isinstance(other, DataFrame) and self.rows == other.rows

    def __hash__(self) -> int:
        return hash(tuple(tuple(sorted(r.items())) for r in self.rows))

    def __repr__(self) -> str:
        return f"DataFrame({len(self)} rows)"

    @property
    def columns(self) -> list[str]:
        if self._rows is None and self._table is not None:
            return list(self._table.column_names)
        seen: dict[str, None] = {}
        for row in self.rows:
            seen.update(dict.fromkeys(row))
        return list(seen)


def _row(item: Any, index: int) -> dict[str, Any]:
    if isinstance(item, dict):
        return dict(item)
    if hasattr(type(item), "__kairos__"):  # a feature-class instance: its features as set
        return dict(vars(item))
    raise InvalidValue(
        f"row {index} of a DataFrame is a {type(item).__name__} ({item!r:.60}); pass dicts or "
        "feature-class instances, e.g. DataFrame([Transaction(id='t1', amount=3.0)])"
    )


def _is_pandas(data: Any) -> bool:
    return type(data).__module__.startswith("pandas") and hasattr(data, "to_dict")


def _from_pandas(frame: Any) -> pa.Table:
    """A pandas DataFrame's columns (a float NaN, pandas' missing value, as null)."""
    try:
        return pa.Table.from_pandas(frame, preserve_index=False)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as error:
        raise InvalidValue(
            "a pandas DataFrame column holds values Arrow cannot keep in one column "
            f"({'; '.join(map(str, error.args))}); give each column one type"
        ) from None


def _from_columns(columns: Mapping[Any, Any]) -> pa.Table:
    names = [_name(k) for k in columns]
    lengths = {len(v) for v in columns.values()}
    if len(lengths) > 1:
        raise InvalidValue(
            f"the columns of a DataFrame must have one length each; got lengths "
            f"{dict(zip(names, (len(v) for v in columns.values()), strict=True))}"
        )
    return pa.table({n: _array(list(v)) for n, v in zip(names, columns.values(), strict=True)})


def _from_rows(rows: Sequence[dict[str, Any]]) -> pa.Table:
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    return pa.table({n: _array([r.get(n) for r in rows]) for n in names})


def _array(values: list[Any]) -> pa.Array:
    try:
        return pa.array(values)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as error:
        raise InvalidValue(
            f"a DataFrame column holds values Arrow cannot keep in one column ({error}); "
            "give each column one type"
        ) from None


def _name(key: Any) -> str:
    ref = ref_of(key)
    return ref.name if ref is not None else str(key)
