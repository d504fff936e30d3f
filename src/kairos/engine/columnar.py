"""Evaluate `_` expressions over a has-many value held as an Arrow table, vectorized.

Same answers as the row engine in `evaluate.py` (integers to the bit, floats to the bit too:
sums are added left to right like Python's `sum`, means are `math.fsum` of the values), with
the same null rules (a comparison with null is null, a filter keeps a row only when True,
NaN is not null and compares False). Whatever this module cannot do exactly (a function it
does not know, an int64 overflow, mixed types) raises `Unsupported` or an Arrow error, and
the caller evaluates that expression with the row engine instead: correct first.

A filter comparing a sorted, null-free time or int column with a value (`_.ts > Now - 7d`)
becomes a binary search and a slice instead of a mask.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kairos.definitions import expressions as ex
from kairos.definitions.binding import Field, Rows, Slot
from kairos.definitions.frame import DataFrame
from kairos.engine.summation import fsum

Compiled = Callable[[Sequence[Any], datetime, dict[str, Any] | None], Any]
_EXACT_FLOAT_INT = 2**53  # ints up to this size are exact as floats
_INT64 = 2**63
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Unsupported(Exception):
    """This expression (or these values) has no exact vectorized form: use the row engine."""


@dataclass(frozen=True, slots=True)
class Scalar:
    """A value that is the same for every row (a literal, `Now`, a parent's feature)."""

    value: Any


Value: TypeAlias = "Scalar | pa.Array"
Node: TypeAlias = Callable[["Context"], Value]


class Context:
    """One evaluation: the rows (sliced by filters so far), the entity's slots and `now`."""

    __slots__ = ("frame", "now", "slots", "table")

    def __init__(self, frame: DataFrame[Any], table: pa.Table, slots: Sequence[Any], now: Any):
        self.frame, self.table, self.slots, self.now = frame, table, slots, now

    def column(self, name: str) -> pa.Array:
        at = self.table.schema.get_field_index(name)  # -1 when absent (or twice)
        if at < 0:
            if name in self.table.column_names:
                raise Unsupported(f"two columns named {name!r}")
            return pa.nulls(self.table.num_rows)  # the row engine's row.get(name)
        column = self.table.column(at)
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


# --- compiling -------------------------------------------------------------------------


def compile_aggregate(
    tree: ex.Agg, scalar: Callable[[ex.Expr], Compiled]
) -> Callable[[DataFrame[Any], Sequence[Any], datetime], Any] | None:
    """`fn(frame, slots, now)` computing the aggregate over an Arrow-backed frame, or None
    when the tree has no vectorized form (then only the row engine evaluates it)."""
    rows = tree.base
    if not isinstance(rows, Rows) or not isinstance(rows.base, Slot):
        return None
    try:
        filters = [(_range_filter(f, scalar), _compile(f, scalar)) for f in rows.filters]
        projection = _compile(rows.projections[0], scalar) if rows.projections else None
    except Unsupported:
        return None
    kind = tree.fn

    def aggregate(frame: DataFrame[Any], slots: Sequence[Any], now: datetime) -> Any:
        table = frame.to_arrow()
        ctx = Context(frame, table, slots, now)
        lo, hi = 0, table.num_rows
        masks: list[Node] = []
        for search, mask in filters:
            found = search(ctx) if search is not None else None
            if found is None:
                masks.append(mask)
            else:
                lo, hi = max(lo, found[0]), min(hi, found[1])
        if lo != 0 or hi != table.num_rows:
            ctx.table = table.slice(lo, max(hi - lo, 0))
        if projection is None and masks:  # count() of rows: the last mask's Trues, no filter
            for mask_of in masks[:-1]:
                ctx.table = _kept(ctx.table, mask_of(ctx))
            return _kept_count(ctx.table, masks[-1](ctx))
        for mask_of in masks:
            ctx.table = _kept(ctx.table, mask_of(ctx))
        if projection is None:
            return ctx.table.num_rows  # count() of rows
        values = projection(ctx)
        if isinstance(values, Scalar):
            raise Unsupported("a projection that is the same for every row")
        return aggregate_array(kind, values)

    return aggregate


def select_table(
    frame: DataFrame[Any],
    filters: Sequence[Node],
    projections: Sequence[Node],
    names: Sequence[str],
    now: datetime,
) -> pa.Table:
    """The rows passing every filter, reduced to the projected columns (all if none)."""
    ctx = Context(frame, frame.to_arrow(), (), now)
    for mask_of in filters:
        ctx.table = _kept(ctx.table, mask_of(ctx))
    if not projections:
        return ctx.table
    columns: list[pa.Array] = []
    for project in projections:
        value = project(ctx)
        if isinstance(value, Scalar):
            raise Unsupported("a projection that is the same for every row")
        columns.append(value)
    return pa.Table.from_arrays(columns, names=list(names))


def compile_row_expression(node: ex.Expr, scalar: Callable[[ex.Expr], Compiled]) -> Node | None:
    """A filter or projection over rows, vectorized, or None when it has no exact form."""
    try:
        return _compile(node, scalar)
    except Unsupported:
        return None


def _kept(table: pa.Table, mask: Value) -> pa.Table:
    """The rows where the mask is True (null and False drop the row, like the row engine)."""
    if isinstance(mask, Scalar):
        return table if mask.value is True else table.slice(0, 0)
    if not pa.types.is_boolean(mask.type):
        raise Unsupported("a filter that is not boolean")
    return table.filter(mask, null_selection_behavior="drop")


def _kept_count(table: pa.Table, mask: Value) -> int:
    """How many rows `_kept` would keep, without building them."""
    if isinstance(mask, Scalar):
        return table.num_rows if mask.value is True else 0
    if not pa.types.is_boolean(mask.type):
        raise Unsupported("a filter that is not boolean")
    return int(mask.true_count)  # True and valid: null drops the row


def _has_field(node: Any) -> bool:
    if isinstance(node, Field):
        return True
    if isinstance(node, ex.BinOp):
        return _has_field(node.left) or _has_field(node.right)
    if isinstance(node, ex.Call):
        return any(_has_field(a) for a in node.args)
    return False


def _compile(node: ex.Expr, scalar: Callable[[ex.Expr], Compiled]) -> Node:
    if not _has_field(node):
        if isinstance(node, ex.Agg | Rows):
            raise Unsupported("a nested aggregate")
        fn = scalar(node)
        return lambda ctx: Scalar(fn(ctx.slots, ctx.now, None))
    if isinstance(node, Field):
        name = node.name
        return lambda ctx: ctx.column(name)
    if isinstance(node, ex.BinOp):
        return _binary(node.op, _compile(node.left, scalar), _compile(node.right, scalar))
    if isinstance(node, ex.Call):
        return _call(node, [_compile(a, scalar) for a in node.args])
    raise Unsupported(f"{node!r}")


def _range_filter(
    node: ex.Expr, scalar: Callable[[ex.Expr], Compiled]
) -> Callable[[Context], tuple[int, int] | None] | None:
    """`_.ts > x` (or >=, <, <=), x the same for every row: the rows it keeps as a range
    found by binary search when the column is sorted and has no nulls (None otherwise: then
    the filter is applied as a mask)."""
    if not (
        isinstance(node, ex.BinOp)
        and node.op in (">", ">=", "<", "<=")
        and isinstance(node.left, Field)
        and not _has_field(node.right)
    ):
        return None
    name, op = node.left.name, node.op
    bound = scalar(node.right)
    side: Literal["left", "right"] = "right" if op in (">", "<=") else "left"

    def find(ctx: Context) -> tuple[int, int] | None:
        keys = sorted_keys(ctx.frame, ctx.table, name)
        if keys is None:
            return None
        target = key_of(bound(ctx.slots, ctx.now, None), ctx.table.schema.field(name).type)
        if target is None:
            return None
        at = int(np.searchsorted(keys, target, side=side))
        return (at, len(keys)) if op in (">", ">=") else (0, at)

    return find


def sorted_keys(frame: DataFrame[Any], table: pa.Table, name: str) -> np.ndarray | None:
    """`column_keys` of the table, remembered by the frame."""
    cache_key = ("sorted", name, id(table))
    if cache_key in frame.cache:
        return frame.cache[cache_key]  # type: ignore[no-any-return]
    keys = column_keys(table, name)
    frame.cache[cache_key] = keys
    return keys


def remember_sorted(frame: DataFrame[Any], table: pa.Table, name: str, keys: np.ndarray) -> None:
    """Tell the frame what `column_keys(table, name)` is, found by whoever checked it."""
    frame.cache[("sorted", name, id(table))] = keys


def column_keys(table: pa.Table, name: str) -> np.ndarray | None:
    """The column as int64 when it is a timestamp or int column, sorted, without nulls."""
    if name not in table.column_names:
        return None
    column = table.column(name)
    kind = column.type
    if not (pa.types.is_timestamp(kind) or kind == pa.int64()) or column.null_count:
        return None
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    values = array.view(pa.int64()) if pa.types.is_timestamp(kind) else array
    keys: np.ndarray = values.to_numpy(zero_copy_only=True)
    if len(keys) < 2 or bool(np.all(keys[1:] >= keys[:-1])):
        return keys
    return None


def key_of(value: Any, kind: pa.DataType) -> int | None:
    """`value` as the int64 a timestamp or int64 column holds, None when not comparable so."""
    if pa.types.is_timestamp(kind):
        if not isinstance(value, datetime) or value.tzinfo is None:
            return None  # the row engine would raise or compare differently
        if kind.unit == "us":  # the engine's own unit: integer arithmetic, no Arrow scalar
            delta = value - _EPOCH
            return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
        return int(pa.scalar(value, type=kind).value)
    if kind == pa.int64() and type(value) is int and -_INT64 <= value < _INT64:
        return value
    return None


# --- operators -------------------------------------------------------------------------

_COMPARE = {
    "==": pc.equal,
    "!=": pc.not_equal,
    "<": pc.less,
    "<=": pc.less_equal,
    ">": pc.greater,
    ">=": pc.greater_equal,
}
_ARITHMETIC = {"+": pc.add_checked, "-": pc.subtract_checked, "*": pc.multiply_checked}


def _kind(value: Value) -> str:
    """What a value is, for deciding whether Arrow gives Python's answer."""
    if isinstance(value, Scalar):
        v = value.value
        if v is None:
            return "null"
        if isinstance(v, bool):
            return "bool"
        if isinstance(v, int):
            return "int" if -_INT64 <= v < _INT64 else "bigint"
        if isinstance(v, float):
            return "float"
        if isinstance(v, str):
            return "str"
        if isinstance(v, datetime):
            return "datetime" if v.tzinfo is not None else "naive"
        if isinstance(v, date):
            return "date"
        if isinstance(v, timedelta):
            return "timedelta"
        return "other"
    t = value.type
    if pa.types.is_boolean(t):
        return "bool"
    if t == pa.int64():
        return "int"
    if t == pa.float64():
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "str"
    if pa.types.is_timestamp(t):
        return "datetime" if t.tz is not None else "naive"
    if pa.types.is_date32(t):
        return "date"
    if pa.types.is_duration(t):
        return "timedelta"
    if pa.types.is_null(t):
        return "null"
    return "other"


def _arrow(value: Value, like: Value) -> Any:
    """A Scalar as an Arrow scalar of the other side's type (or the array itself)."""
    if not isinstance(value, Scalar):
        return value
    if isinstance(like, Scalar):  # pragma: no cover - scalar-only trees are not compiled here
        raise Unsupported("two scalars")
    if value.value is None:
        return pa.scalar(None, type=like.type)
    kind = _kind(value)
    if kind == "float":
        return pa.scalar(value.value, type=pa.float64())
    if kind == "int" and _kind(like) == "float":
        if abs(value.value) > _EXACT_FLOAT_INT:
            raise Unsupported("an int too large to compare exactly as a float")
        return pa.scalar(float(value.value), type=pa.float64())
    return pa.scalar(value.value, type=like.type)


def _check_int_range(value: Value) -> None:
    """An int column compared with (or divided as) floats: exact only up to 2**53."""
    if isinstance(value, Scalar) or _kind(value) != "int" or len(value) == value.null_count:
        return
    low, high = pc.min_max(value).values()
    if max(abs(low.as_py()), abs(high.as_py())) > _EXACT_FLOAT_INT:
        raise Unsupported("ints too large to mix with floats exactly")


def _binary(op: str, left: Node, right: Node) -> Node:
    if op in ("&", "|"):
        combine = pc.and_kleene if op == "&" else pc.or_kleene

        def logic(ctx: Context) -> Value:
            a, b = left(ctx), right(ctx)
            for side in (a, b):
                if _kind(side) not in ("bool", "null"):
                    raise Unsupported("& or | of values that are not booleans")
            a, b = _as_bool(a, ctx), _as_bool(b, ctx)
            return combine(_arrow(a, b), _arrow(b, a))

        return logic
    if op in _COMPARE:
        compare = _COMPARE[op]

        def comparison(ctx: Context) -> Value:
            a, b = left(ctx), right(ctx)
            ka, kb = _kind(a), _kind(b)
            if "null" in (ka, kb):  # a comparison with null is null
                return pa.nulls(ctx.table.num_rows, pa.bool_())
            numeric = {ka, kb} <= {"int", "float", "null"}
            if not (ka == kb or numeric or "null" in (ka, kb)) or {ka, kb} & {"other", "bigint"}:
                raise Unsupported(f"comparing {ka} with {kb}")
            if ka == "naive" or kb == "naive":
                raise Unsupported("a datetime without a timezone")
            if numeric and ka != kb:
                _check_int_range(a)
                _check_int_range(b)
            return compare(_arrow(a, b), _arrow(b, a))

        return comparison
    if op in _ARITHMETIC or op == "/":
        arithmetic = _ARITHMETIC.get(op, pc.divide_checked)

        def apply(ctx: Context) -> Value:
            a, b = left(ctx), right(ctx)
            ka, kb = _kind(a), _kind(b)
            if not {ka, kb} <= {"int", "float", "null"}:
                raise Unsupported(f"{op} of {ka} and {kb}")
            if "null" in (ka, kb):  # arithmetic with null is null
                return pa.nulls(ctx.table.num_rows)
            if op == "/" or ka != kb:
                _check_int_range(a)  # ints become floats: Python's int / int is exact too
                _check_int_range(b)
                a, b = _as_float(a), _as_float(b)
            return arithmetic(_arrow(a, b), _arrow(b, a))

        return apply
    raise Unsupported(f"operator {op!r}")


def _as_bool(value: Value, ctx: Context) -> Value:
    if isinstance(value, Scalar):
        return value
    return value.cast(pa.bool_()) if pa.types.is_null(value.type) else value


def _as_float(value: Value) -> Value:
    if isinstance(value, Scalar):
        v = value.value
        return Scalar(float(v)) if isinstance(v, int) and not isinstance(v, bool) else value
    return value.cast(pa.float64()) if _kind(value) == "int" else value


_DT = {"dt.year": pc.year, "dt.month": pc.month, "dt.day": pc.day, "dt.hour": pc.hour}


def _call(node: ex.Call, args: list[Node]) -> Node:
    name = node.fn
    if name == "not":
        (arg,) = args
        return lambda ctx: pc.invert(_typed(arg(ctx), ("bool",)))
    if name in ("is_null", "is_not_null"):
        (arg,) = args
        test = pc.is_null if name == "is_null" else pc.is_valid
        return lambda ctx: test(_array(arg(ctx)))
    if name == "is_in" and isinstance(node.args[1], ex.Lit):
        (arg, _options) = args
        options = node.args[1].value
        return lambda ctx: _is_in(_array(arg(ctx)), options)
    if name in ("str.contains", "str.startswith", "str.endswith") and isinstance(
        node.args[1], ex.Lit
    ):
        text = node.args[1].value
        if not isinstance(text, str):
            raise Unsupported("a pattern that is not a string")
        match = {
            "str.contains": pc.match_substring,
            "str.startswith": pc.starts_with,
            "str.endswith": pc.ends_with,
        }[name]
        arg = args[0]
        return lambda ctx: match(_typed(arg(ctx), ("str",)), pattern=text)
    if name == "str.len":
        (arg,) = args
        return lambda ctx: pc.utf8_length(_typed(arg(ctx), ("str",))).cast(pa.int64())
    if name in ("str.lower", "str.upper"):
        (arg,) = args
        change = pc.ascii_lower if name == "str.lower" else pc.ascii_upper
        return lambda ctx: change(_ascii(_typed(arg(ctx), ("str",))))
    if name in _DT:
        (arg,) = args
        part = _DT[name]
        return lambda ctx: part(_typed(arg(ctx), ("datetime",)))
    if name == "dt.weekday":
        (arg,) = args
        return lambda ctx: pc.day_of_week(_typed(arg(ctx), ("datetime",)))
    if name in ("neg", "abs"):
        (arg,) = args
        change = pc.negate_checked if name == "neg" else pc.abs_checked
        return lambda ctx: change(_typed(arg(ctx), ("int", "float")))
    raise Unsupported(f"function {name!r}")


def _array(value: Value) -> pa.Array:
    if isinstance(value, Scalar):
        raise Unsupported("a row-independent argument")
    return value


def _typed(value: Value, kinds: tuple[str, ...]) -> pa.Array:
    array = _array(value)
    if _kind(array) not in kinds:
        raise Unsupported(f"expected {kinds}, got {array.type}")
    return array


def _ascii(array: pa.Array) -> pa.Array:
    # Python's str.lower/upper follow full Unicode case mapping; Arrow's ASCII ones are exact
    # only when every string is ASCII.
    if pc.all(pc.string_is_ascii(array)).as_py() not in (True, None):
        raise Unsupported("non-ASCII strings")
    return array


def _is_in(array: pa.Array, options: tuple[Any, ...]) -> pa.Array:
    kind = _kind(array)
    kinds = {_kind(Scalar(o)) for o in options}
    if kinds - {kind} or any(isinstance(o, float) and math.isnan(o) for o in options):
        raise Unsupported("options of another type than the column")
    if kind not in ("int", "str", "bool", "date", "datetime"):
        raise Unsupported(f"is_in over {array.type}")
    found = pc.is_in(array, value_set=pa.array(list(options), type=array.type))
    return pc.if_else(pc.is_null(array), pa.scalar(None, pa.bool_()), found)


# --- aggregates ------------------------------------------------------------------------


def aggregate_array(kind: str, values: pa.Array) -> Any:
    """count/sum/mean/min/max/std/distinct_count of the non-null values, as the row engine's
    `aggregate_values` computes them."""
    valid = len(values) - values.null_count
    if kind == "count":
        return valid
    if valid == 0:
        return 0 if kind in ("sum", "distinct_count") else None
    type_kind = _kind(values)
    if kind == "sum":
        if valid == 0:
            return 0
        if type_kind == "int":
            low, high = pc.min_max(values).values()
            if max(abs(low.as_py()), abs(high.as_py())) * valid < _INT64:
                return pc.sum(values).as_py()
            return sum(values.drop_null().to_pylist())  # Python ints do not overflow
        if type_kind == "bool":
            return int(pc.sum(values.cast(pa.int64())).as_py())
        if type_kind == "float":
            floats = _numpy(values)
            # left to right like Python's sum(), which starts from 0 (-0.0 + 0.0 == 0.0)
            return float(np.add.accumulate(floats)[-1]) + 0.0
        raise Unsupported(f"sum of {values.type}")
    if kind == "distinct_count":
        if type_kind == "float":
            return len(np.unique(_numpy(values) + 0.0))  # -0.0 == 0.0; NaNs are one
        if type_kind in ("int", "str", "bool", "date", "datetime", "timedelta"):
            return int(pc.count_distinct(values, mode="only_valid").as_py())
        raise Unsupported(f"distinct_count of {values.type}")
    if valid == 0:
        return None
    if kind == "mean":
        if type_kind not in ("int", "float", "bool"):
            raise Unsupported(f"mean of {values.type}")
        floats = _numpy(values.cast(pa.float64()) if type_kind != "float" else values)
        return fsum(floats) / valid  # math.fsum's value, vectorized
    if kind in ("min", "max"):
        if type_kind == "float":
            return _float_extreme(kind, _numpy(values))
        if type_kind in ("int", "str", "bool", "date", "datetime", "timedelta"):
            found = pc.min_max(values)
            return found["min" if kind == "min" else "max"].as_py()
        raise Unsupported(f"{kind} of {values.type}")
    if kind == "std":
        if type_kind not in ("int", "float"):
            raise Unsupported(f"std of {values.type}")
        return statistics.stdev(values.drop_null().to_pylist()) if valid > 1 else None
    raise Unsupported(f"aggregation {kind!r}")


def _numpy(values: pa.Array) -> np.ndarray:
    if values.null_count:
        values = values.drop_null()
    return values.to_numpy(zero_copy_only=False)  # type: ignore[no-any-return]


def _float_extreme(kind: str, floats: np.ndarray) -> float:
    """Python's min()/max(): NaN only when the first value is NaN (every comparison with it
    is False), else the extreme of the rest; among equal values (0.0, -0.0) the first."""
    first = floats[0]
    if math.isnan(first):
        return float(first)
    best = np.min(floats) if kind == "min" else np.max(floats)  # NaN if there is one
    if math.isnan(best):
        best = np.nanmin(floats) if kind == "min" else np.nanmax(floats)
    if best != 0.0:
        return float(best)
    return float(floats[int(np.argmax(floats == best))])  # 0.0 or -0.0: the first of them
