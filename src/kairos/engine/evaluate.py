"""Compile bound expression trees into Python closures, once per feature, and run them.

A compiled expression is called as `fn(slots, now, row)`: `slots` are the feature's dependency
values for one entity, `row` is the current has-many row (inside `[...]`). Nulls propagate:
arithmetic or comparison with None gives None, and a filter keeps a row only when True.
"""

from __future__ import annotations

import math
import operator
import statistics
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from kairos.definitions import expressions as ex
from kairos.definitions.binding import Field, Rows, Slot
from kairos.definitions.frame import DataFrame
from kairos.engine import columnar
from kairos.errors import DefinitionError

Compiled = Callable[[Sequence[Any], datetime, dict[str, Any] | None], Any]

_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": operator.mod,
    "**": operator.pow,
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}

_UNARY: dict[str, Callable[[Any], Any]] = {
    "neg": operator.neg,
    "abs": abs,
    "str.lower": str.lower,
    "str.upper": str.upper,
    "str.strip": str.strip,
    "str.len": len,
    "dt.year": lambda v: v.year,
    "dt.month": lambda v: v.month,
    "dt.day": lambda v: v.day,
    "dt.hour": lambda v: v.hour,
    "dt.weekday": lambda v: v.weekday(),
    "dt.date": lambda v: v.date() if isinstance(v, datetime) else v,
    "dt.total_seconds": lambda v: v.total_seconds(),
    "dt.days": lambda v: v.total_seconds() / 86400,
}

_BINARY_CALLS: dict[str, Callable[[Any, Any], Any]] = {
    "str.contains": lambda a, b: b in a,
    "str.startswith": lambda a, b: a.startswith(b),
    "str.endswith": lambda a, b: a.endswith(b),
    "round": lambda a, b: round(a, b),
}


def compile_expression(tree: ex.Expr) -> Compiled:
    """Turn a bound tree into a closure."""
    if isinstance(tree, Slot):
        index = tree.index
        return lambda slots, now, row: slots[index]
    if isinstance(tree, Field):
        name = tree.name
        return lambda slots, now, row: row.get(name) if row is not None else None
    if isinstance(tree, ex.Lit):
        value = _utc(tree.value)
        return lambda slots, now, row: value
    if isinstance(tree, ex.NowRef):
        return lambda slots, now, row: now
    if isinstance(tree, ex.BinOp):
        return _binary(tree)
    if isinstance(tree, ex.Call):
        return _call(tree)
    if isinstance(tree, Rows):
        return _rows(tree)
    if isinstance(tree, ex.Agg):
        return _aggregate(tree)
    raise DefinitionError(f"cannot evaluate {tree!r}; bind it to a feature class first")


def _utc(value: Any) -> Any:
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    if isinstance(value, tuple):
        return tuple(_utc(v) for v in value)
    return value


def _binary(tree: ex.BinOp) -> Compiled:
    left, right = compile_expression(tree.left), compile_expression(tree.right)
    if tree.op == "&":

        def both(slots: Sequence[Any], now: datetime, row: dict[str, Any] | None) -> Any:
            a = left(slots, now, row)
            if a is False:
                return False
            b = right(slots, now, row)
            if b is False:
                return False
            return None if a is None or b is None else True

        return both
    if tree.op == "|":

        def either(slots: Sequence[Any], now: datetime, row: dict[str, Any] | None) -> Any:
            a = left(slots, now, row)
            if a is True:
                return True
            b = right(slots, now, row)
            if b is True:
                return True
            return None if a is None or b is None else False

        return either
    fn = _BINARY[tree.op]

    def apply(slots: Sequence[Any], now: datetime, row: dict[str, Any] | None) -> Any:
        a = left(slots, now, row)
        if a is None:
            return None
        b = right(slots, now, row)
        if b is None:
            return None
        return fn(a, b)

    return apply


def _call(tree: ex.Call) -> Compiled:
    args = [compile_expression(a) for a in tree.args]
    name = tree.fn
    if name in _UNARY:
        fn1 = _UNARY[name]
        (arg,) = args
        return lambda slots, now, row: None if (v := arg(slots, now, row)) is None else fn1(v)
    if name in _BINARY_CALLS:
        fn2 = _BINARY_CALLS[name]
        a, b = args

        def apply(slots: Sequence[Any], now: datetime, row: dict[str, Any] | None) -> Any:
            x, y = a(slots, now, row), b(slots, now, row)
            return None if x is None or y is None else fn2(x, y)

        return apply
    if name == "not":
        (arg,) = args
        return lambda slots, now, row: None if (v := arg(slots, now, row)) is None else not v
    if name == "is_null":
        (arg,) = args
        return lambda slots, now, row: arg(slots, now, row) is None
    if name == "is_not_null":
        (arg,) = args
        return lambda slots, now, row: arg(slots, now, row) is not None
    if name == "is_in":
        arg, options = args
        return lambda slots, now, row: (
            None if (v := arg(slots, now, row)) is None else v in options(slots, now, row)
        )
    if name in ("fill_null", "coalesce"):

        def first(slots: Sequence[Any], now: datetime, row: dict[str, Any] | None) -> Any:
            for candidate in args:
                value = candidate(slots, now, row)
                if value is not None:
                    return value
            return None

        return first
    if name == "if_then_else":
        cond, then, otherwise = args
        return lambda slots, now, row: (
            then(slots, now, row) if cond(slots, now, row) is True else otherwise(slots, now, row)
        )
    if name == "str.concat":

        def concat(slots: Sequence[Any], now: datetime, row: dict[str, Any] | None) -> Any:
            parts = [a(slots, now, row) for a in args]
            return None if any(p is None for p in parts) else "".join(str(p) for p in parts)

        return concat
    raise DefinitionError(f"unknown function {name!r} in an expression")


def _rows(tree: Rows) -> Compiled:
    base = compile_expression(tree.base)
    filters = [compile_expression(f) for f in tree.filters]
    projections = [compile_expression(p) for p in tree.projections]
    names = tree.names

    def select(slots: Sequence[Any], now: datetime, row: dict[str, Any] | None) -> Any:
        rows = base(slots, now, row)
        if rows is None:
            return None
        kept = [r for r in rows if all(f(slots, now, r) is True for f in filters)]
        if not projections:
            return kept
        if len(projections) == 1:
            project = projections[0]
            return [project(slots, now, r) for r in kept]
        return [
            {n: p(slots, now, r) for n, p in zip(names, projections, strict=True)} for r in kept
        ]

    return select


def _aggregate(tree: ex.Agg) -> Compiled:
    rows = compile_expression(tree.base)
    kind = tree.fn
    # Like SQL: count() counts rows, count() of a projected column counts its non-null values.
    counts_rows = isinstance(tree.base, Rows) and not tree.base.projections
    # rows held as Arrow columns are aggregated vectorized (same answers, see columnar.py)
    vectorized = columnar.compile_aggregate(tree, compile_expression)
    base = tree.base.base if isinstance(tree.base, Rows) else None
    slot = base.index if isinstance(base, Slot) else 0

    def aggregate(slots: Sequence[Any], now: datetime, row: dict[str, Any] | None) -> Any:
        if vectorized is not None and isinstance(frame := slots[slot], DataFrame):
            try:
                return vectorized(frame, slots, now)
            except Exception:  # no exact vectorized form for these values: rows below
                pass
        selected = rows(slots, now, row)
        if selected is None:
            return None
        if counts_rows:
            return len(selected)
        values = [v for v in selected if v is not None]
        return aggregate_values(kind, values)

    return aggregate


def sequential_sum(values: list[Any]) -> Any:
    """Left to right, one rounding per addition, on every Python (3.12's sum() of floats is
    compensated), so the vectorized engine's np.add.accumulate gives the same bits."""
    total: Any = 0
    for value in values:
        total += value
    return total


def aggregate_values(kind: str, values: list[Any]) -> Any:
    """count/sum/mean/min/max/std/distinct_count of non-null values (sample std, n >= 2)."""
    if kind == "count":
        return len(values)
    if kind == "sum":
        return sequential_sum(values)
    if kind == "distinct_count":  # NaNs count as one value (however many NaN objects)
        return len({v for v in values if v == v}) + any(v != v for v in values)
    if not values:
        return None
    if kind == "mean":
        return math.fsum(values) / len(values)
    if kind == "min":
        return min(values)
    if kind == "max":
        return max(values)
    if kind == "std":
        return statistics.stdev(values) if len(values) > 1 else None
    raise DefinitionError(f"unknown aggregation {kind!r}")
