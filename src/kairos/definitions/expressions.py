"""`_` expressions: immutable, hashable trees that describe a feature's value.

    txn_count: int = _.transactions[_.ts > Now - timedelta(days=1)].count()
    big_spender: bool = _.transactions[_.amount].sum() > 10_000

Building an expression does nothing but build the tree; `kairos.definitions.binding` checks it
against the feature classes and the engine evaluates it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from kairos.errors import DefinitionError

COMPARISONS = frozenset({"==", "!=", "<", "<=", ">", ">="})
BOOLEAN_OPS = frozenset({"&", "|"})
AGGREGATIONS = ("count", "sum", "mean", "min", "max", "std", "distinct_count")
# Calls whose result is a boolean, so they filter when used inside `[...]`.
PREDICATE_CALLS = frozenset(
    {"is_null", "is_not_null", "is_in", "str.contains", "str.startswith", "str.endswith"}
)


class Expr:
    """Base of every expression node. Operators build new nodes; nothing is evaluated."""

    __slots__ = ()

    def key(self) -> tuple[Any, ...]:
        """A plain tuple that identifies the tree; equal trees have equal keys."""
        raise NotImplementedError  # every concrete node overrides this

    def __hash__(self) -> int:
        return hash(self.key())

    def __bool__(self) -> bool:
        raise DefinitionError(
            "an expression has no truth value; use & | ~ instead of and / or / not, "
            "and kr.if_then_else(...) instead of `x if cond else y`"
        )

    def same_as(self, other: object) -> bool:
        """Structural equality (`==` builds a comparison instead)."""
        return isinstance(other, Expr) and self.key() == other.key()

    # arithmetic
    def __add__(self, other: Any) -> Expr:
        return BinOp("+", self, lift(other))

    def __radd__(self, other: Any) -> Expr:
        return BinOp("+", lift(other), self)

    def __sub__(self, other: Any) -> Expr:
        return BinOp("-", self, lift(other))

    def __rsub__(self, other: Any) -> Expr:
        return BinOp("-", lift(other), self)

    def __mul__(self, other: Any) -> Expr:
        return BinOp("*", self, lift(other))

    def __rmul__(self, other: Any) -> Expr:
        return BinOp("*", lift(other), self)

    def __truediv__(self, other: Any) -> Expr:
        return BinOp("/", self, lift(other))

    def __rtruediv__(self, other: Any) -> Expr:
        return BinOp("/", lift(other), self)

    def __floordiv__(self, other: Any) -> Expr:
        return BinOp("//", self, lift(other))

    def __mod__(self, other: Any) -> Expr:
        return BinOp("%", self, lift(other))

    def __pow__(self, other: Any) -> Expr:
        return BinOp("**", self, lift(other))

    def __neg__(self) -> Expr:
        return Call("neg", (self,))

    def __abs__(self) -> Expr:
        return Call("abs", (self,))

    # comparison (returns expressions, so the tree is not usable as a dict key by value)
    def __eq__(self, other: Any) -> Expr:  # type: ignore[override]
        return BinOp("==", self, lift(other))

    def __ne__(self, other: Any) -> Expr:  # type: ignore[override]
        return BinOp("!=", self, lift(other))

    def __lt__(self, other: Any) -> Expr:
        return BinOp("<", self, lift(other))

    def __le__(self, other: Any) -> Expr:
        return BinOp("<=", self, lift(other))

    def __gt__(self, other: Any) -> Expr:
        return BinOp(">", self, lift(other))

    def __ge__(self, other: Any) -> Expr:
        return BinOp(">=", self, lift(other))

    # boolean logic
    def __and__(self, other: Any) -> Expr:
        return BinOp("&", self, lift(other))

    def __rand__(self, other: Any) -> Expr:
        return BinOp("&", lift(other), self)

    def __or__(self, other: Any) -> Expr:
        return BinOp("|", self, lift(other))

    def __ror__(self, other: Any) -> Expr:
        return BinOp("|", lift(other), self)

    def __invert__(self) -> Expr:
        return Call("not", (self,))

    # null handling and small helpers
    def is_null(self) -> Expr:
        return Call("is_null", (self,))

    def is_not_null(self) -> Expr:
        return Call("is_not_null", (self,))

    def fill_null(self, value: Any) -> Expr:
        return Call("fill_null", (self, lift(value)))

    def is_in(self, values: Iterable[Any]) -> Expr:
        return Call("is_in", (self, Lit(tuple(values))))

    def abs(self) -> Expr:
        return Call("abs", (self,))

    def round(self, digits: int = 0) -> Expr:
        return Call("round", (self, Lit(digits)))

    @property
    def str(self) -> StrFunctions:
        return StrFunctions(self)

    @property
    def dt(self) -> DtFunctions:
        return DtFunctions(self)

    # aggregations over a has-many feature (optionally filtered / projected with [...])
    def count(self) -> Expr:
        return Agg("count", self)

    def sum(self) -> Expr:
        return Agg("sum", self)

    def mean(self) -> Expr:
        return Agg("mean", self)

    def min(self) -> Expr:
        return Agg("min", self)

    def max(self) -> Expr:
        return Agg("max", self)

    def std(self) -> Expr:
        return Agg("std", self)

    def distinct_count(self) -> Expr:
        return Agg("distinct_count", self)


class StrFunctions:
    """`_.name.str.lower()` and friends."""

    __slots__ = ("_expr",)

    def __init__(self, expr: Expr) -> None:
        self._expr = expr

    def _call(self, name: str, *args: Any) -> Expr:
        return Call(f"str.{name}", (self._expr, *(lift(a) for a in args)))

    def lower(self) -> Expr:
        return self._call("lower")

    def upper(self) -> Expr:
        return self._call("upper")

    def strip(self) -> Expr:
        return self._call("strip")

    def len(self) -> Expr:
        return self._call("len")

    def contains(self, text: str) -> Expr:
        return self._call("contains", text)

    def startswith(self, text: str) -> Expr:
        return self._call("startswith", text)

    def endswith(self, text: str) -> Expr:
        return self._call("endswith", text)

    def concat(self, *others: Any) -> Expr:
        return self._call("concat", *others)


class DtFunctions:
    """`_.ts.dt.hour()`, `(Now - _.signup_at).dt.total_seconds()` and friends."""

    __slots__ = ("_expr",)

    def __init__(self, expr: Expr) -> None:
        self._expr = expr

    def _call(self, name: str) -> Expr:
        return Call(f"dt.{name}", (self._expr,))

    def year(self) -> Expr:
        return self._call("year")

    def month(self) -> Expr:
        return self._call("month")

    def day(self) -> Expr:
        return self._call("day")

    def hour(self) -> Expr:
        return self._call("hour")

    def weekday(self) -> Expr:
        return self._call("weekday")

    def date(self) -> Expr:
        return self._call("date")

    def total_seconds(self) -> Expr:
        return self._call("total_seconds")

    def days(self) -> Expr:
        return self._call("days")


@dataclass(frozen=True, slots=True, eq=False)
class Col(Expr):
    """A feature reached from the current entity: `_.balance`, `_.user.name`."""

    path: tuple[str, ...]
    window: str | None = None

    def key(self) -> tuple[Any, ...]:
        return ("col", self.path, self.window)

    def __getattr__(self, name: str) -> Col:
        if name.startswith("__"):
            raise AttributeError(name)
        return Col((*self.path, name))

    def __getitem__(self, items: Any) -> Expr:
        # `_.txn_count["7d"]` picks a window; anything else filters/projects a has-many feature.
        if isinstance(items, str):
            return Col(self.path, items)
        items = items if isinstance(items, tuple) else (items,)
        return Select(self, tuple(lift(i) for i in items))

    def __repr__(self) -> str:
        window = f"[{self.window!r}]" if self.window else ""
        return "_." + ".".join(self.path) + window


@dataclass(frozen=True, slots=True, eq=False)
class Lit(Expr):
    value: Any

    def key(self) -> tuple[Any, ...]:
        value = self.value
        return ("lit", type(value).__name__, value if _hashable(value) else repr(value))

    def __repr__(self) -> str:
        return repr(self.value)


@dataclass(frozen=True, slots=True, eq=False)
class NowRef(Expr):
    """The query's `now` (the row's timestamp offline)."""

    def key(self) -> tuple[Any, ...]:
        return ("now",)

    def __repr__(self) -> str:
        return "Now"


@dataclass(frozen=True, slots=True, eq=False)
class BinOp(Expr):
    op: str
    left: Expr
    right: Expr

    def key(self) -> tuple[Any, ...]:
        return ("bin", self.op, self.left.key(), self.right.key())

    def __repr__(self) -> str:
        return f"({self.left!r} {self.op} {self.right!r})"


@dataclass(frozen=True, slots=True, eq=False)
class Call(Expr):
    fn: str
    args: tuple[Expr, ...]

    def key(self) -> tuple[Any, ...]:
        return ("call", self.fn, tuple(a.key() for a in self.args))

    def __repr__(self) -> str:
        return f"{self.fn}({', '.join(repr(a) for a in self.args)})"


@dataclass(frozen=True, slots=True, eq=False)
class Select(Expr):
    """`_.transactions[_.status == "declined", _.amount]`: filters and at most one projection."""

    base: Col
    items: tuple[Expr, ...]

    def key(self) -> tuple[Any, ...]:
        return ("select", self.base.key(), tuple(i.key() for i in self.items))

    def __repr__(self) -> str:
        return f"{self.base!r}[{', '.join(repr(i) for i in self.items)}]"


@dataclass(frozen=True, slots=True, eq=False)
class Agg(Expr):
    fn: str
    base: Expr

    def key(self) -> tuple[Any, ...]:
        return ("agg", self.fn, self.base.key())

    def __repr__(self) -> str:
        return f"{self.base!r}.{self.fn}()"


class Underscore:
    """The `_` root: `_.name` refers to the feature `name` of the class being defined."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Col:
        if name.startswith("__"):
            raise AttributeError(name)
        return Col((name,))

    def __repr__(self) -> str:
        return "_"


# Typed as Any so `txn_count: int = _.transactions.count()` reads well to type checkers.
_: Any = Underscore()


def if_then_else(condition: Any, then: Any, otherwise: Any) -> Any:
    """`kr.if_then_else(_.amount > 100, "big", "small")`."""
    return Call("if_then_else", (lift(condition), lift(then), lift(otherwise)))


def coalesce(*values: Any) -> Any:
    """The first non-null of the arguments."""
    return Call("coalesce", tuple(lift(v) for v in values))


def lift(value: Any) -> Expr:
    """Turn a Python value (or `Now`) into an expression node."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, Underscore):
        raise DefinitionError("`_` alone is not an expression; write `_.feature_name`")
    # `Now` (the class, not a datetime of it) stands for the query's time through its metaclass
    stands_for = getattr(type(value), "__kairos_expr__", None) if isinstance(value, type) else None
    if stands_for is not None:
        return stands_for(value)  # type: ignore[no-any-return]
    if isinstance(value, list | tuple | set | frozenset):
        return Lit(tuple(value))
    if value is None or isinstance(value, bool | int | float | str | date | datetime | timedelta):
        return Lit(value)
    raise DefinitionError(
        f"{value!r} ({type(value).__name__}) cannot be used in an expression; "
        "use numbers, strings, booleans, datetimes, timedeltas, None or `_.feature`"
    )


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
