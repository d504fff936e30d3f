"""Attributes kept columnar, so a search's `where` is a vectorized mask over every row.

Each attribute name is a column holding, per JSON type, a typed array (str: numpy's
variable-width StringDType, int: int64, float: float64, bool) and a mask of the rows that hold
a value of that type. A condition compares as its value's type: `Condition("year", "<", 2020)`
looks at the rows whose `year` is a number; a row whose `year` is a str, null or missing
never matches, for any operator (as in SQL, where a null never matches). The pgvector backend
gives the same answers (`jsonb_typeof` first).

>>> columns = Columns()
>>> columns.set(0, {"lang": "en", "year": 2021})
>>> columns.mask(Condition("lang", "==", "en"), rows=1)
array([ True])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from kairos.stores.vectors.base import Condition

Mask = npt.NDArray[np.bool_]

_INT64 = (-(2**63), 2**63 - 1)
_COMPARE = {
    "==": np.equal,
    "!=": np.not_equal,
    "<": np.less,
    "<=": np.less_equal,
    ">": np.greater,
    ">=": np.greater_equal,
}


def _kind(value: object) -> str | None:
    """The typed array a value lives in (None: lists, dicts and nulls, which no condition reads)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int" if _INT64[0] <= value <= _INT64[1] else "float"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    return None


_DTYPES: dict[str, Any] = {
    "bool": np.bool_,
    "int": np.int64,
    "float": np.float64,
    "str": np.dtypes.StringDType(),
}


class _Typed:
    """One JSON type of one column: values and which rows hold one."""

    __slots__ = ("present", "values")

    def __init__(self, kind: str, capacity: int) -> None:
        self.values: npt.NDArray[Any] = np.zeros(capacity, dtype=_DTYPES[kind])
        self.present: Mask = np.zeros(capacity, dtype=np.bool_)

    def grow(self, capacity: int) -> None:
        values = np.zeros(capacity, dtype=self.values.dtype)
        values[: len(self.values)] = self.values
        present = np.zeros(capacity, dtype=np.bool_)
        present[: len(self.present)] = self.present
        self.values, self.present = values, present


class Columns:
    """Every attribute column of an index's rows (a row is one document version)."""

    def __init__(self) -> None:
        self._capacity = 0
        self._columns: dict[str, dict[str, _Typed]] = {}

    def reserve(self, rows: int) -> None:
        """Room for `rows` rows (amortised: capacity doubles)."""
        if rows <= self._capacity:
            return
        capacity = max(rows, 2 * self._capacity, 1024)
        for typed in self._columns.values():
            for array in typed.values():
                array.grow(capacity)
        self._capacity = capacity

    def set(self, row: int, attributes: Mapping[str, Any]) -> None:
        """Row `row` holds `attributes` (whatever it held before is cleared)."""
        self.reserve(row + 1)
        for typed in self._columns.values():
            for array in typed.values():
                array.present[row] = False
        for column, value in attributes.items():
            kind = _kind(value)
            if kind is None:
                continue
            typed = self._columns.setdefault(column, {})
            if kind not in typed:
                typed[kind] = _Typed(kind, self._capacity)
            array = typed[kind]
            array.values[row] = float(value) if kind == "float" else value
            array.present[row] = True

    def mask(self, condition: Condition, *, rows: int) -> Mask:
        """Which of the first `rows` rows match `condition` (checked by `checks`)."""
        typed = self._columns.get(condition.column, {})
        out = np.zeros(rows, dtype=np.bool_)
        if condition.op == "in":
            for kind, options in _by_kind(condition.value).items():
                for array in _arrays(typed, kind):
                    out |= array.present[:rows] & np.isin(array.values[:rows], options)
            return out
        compare = _COMPARE[condition.op]
        for array in _arrays(typed, _kind(condition.value)):
            values = array.values[:rows]
            out |= array.present[:rows] & compare(values, condition.value)
        return out


def _arrays(typed: dict[str, _Typed], kind: str | None) -> list[_Typed]:
    # ints and floats are one JSON type, number: 3 == 3.0
    kinds = ("int", "float") if kind in ("int", "float") else (kind,)
    return [typed[name] for name in kinds if name in typed]


def _by_kind(options: tuple[Any, ...]) -> dict[str, list[Any]]:
    grouped: dict[str, list[Any]] = {}
    for option in options:
        kind = _kind(option)
        if kind in ("int", "float"):
            grouped.setdefault("number", []).append(option)
        elif kind is not None:
            grouped.setdefault(kind, []).append(option)
    if "number" in grouped:
        numbers = grouped.pop("number")
        grouped["int"] = numbers  # _arrays reads both number arrays for "int"
    return grouped
