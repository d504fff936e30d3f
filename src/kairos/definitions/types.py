"""Feature value types and the markers users write in annotations.

id: Primary[str]              primary key (a field named `id` is one by default)
ts: FeatureTime               when the row became true
user_id: "User.id"            foreign key: makes `Transaction.user` and `User.transactions`
transactions: DataFrame[Transaction]         has-many
txn_count: Windowed[int] = windowed("1d", "7d", expression=...)
embedding: Vector[384]        a vector of 384 floats (`Vector[Literal[384]]` for type checkers)
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, Generic, TypeAlias, TypeVar, TypeVarTuple

from kairos.definitions import expressions as ex
from kairos.definitions.frame import DataFrame as DataFrame  # re-exported: defined beside
from kairos.definitions.frame import DataFrameSpec as DataFrameSpec
from kairos.errors import DefinitionError

T = TypeVar("T")
N = TypeVar("N")


class _PrimaryMarker:
    def __repr__(self) -> str:
        return "Primary"


class _FeatureTimeMarker:
    def __repr__(self) -> str:
        return "FeatureTime"


PRIMARY = _PrimaryMarker()
FEATURE_TIME = _FeatureTimeMarker()

Primary = Annotated[T, PRIMARY]
"""`id: Primary[str]` marks the primary key when it is not called `id`."""

FeatureTime = Annotated[datetime, FEATURE_TIME]
"""`ts: FeatureTime` is the time a row became true; rows after the query's `now` do not exist."""


class _NowMeta(type):
    """Lets the `Now` class itself take part in expressions: `_.ts > Now - timedelta(days=1)`."""

    def __sub__(cls, other: Any) -> Any:
        return ex.NowRef() - other

    def __add__(cls, other: Any) -> Any:
        return ex.NowRef() + other

    def __rsub__(cls, other: Any) -> Any:
        return ex.lift(other) - ex.NowRef()

    def __lt__(cls, other: Any) -> Any:
        return ex.NowRef() < other

    def __le__(cls, other: Any) -> Any:
        return ex.NowRef() <= other

    def __gt__(cls, other: Any) -> Any:
        return ex.NowRef() > other

    def __ge__(cls, other: Any) -> Any:
        return ex.NowRef() >= other

    def __hash__(cls) -> int:
        return id(cls)

    def __kairos_expr__(cls) -> ex.Expr:
        """What `ex.lift(Now)` turns the class into."""
        return ex.NowRef()


class Now(datetime, metaclass=_NowMeta):
    """The query's time: a resolver parameter `now: Now`, or `Now` inside an expression.

    Online it is the request's `now`; offline it is the spine row's timestamp.
    """


class Windowed(Generic[T]):
    """Annotation for a windowed feature: `txn_count: Windowed[int] = windowed("1d", ...)`.

    `User.txn_count["7d"]` is the feature for one window.
    """

    def __getitem__(self, window: str) -> T:  # pragma: no cover - replaced on feature classes
        raise TypeError("use a window on a feature class attribute: User.txn_count['7d']")


class _Features:
    """Return annotation of a resolver that produces several features: `Features[A, B]`.

    The resolver returns a tuple in that order, a dict by name, or a feature-class instance.
    """

    def __class_getitem__(cls, items: Any) -> FeaturesSpec:
        return FeaturesSpec(items if isinstance(items, tuple) else (items,))


if TYPE_CHECKING:
    Ts = TypeVarTuple("Ts")
    Features: TypeAlias = tuple[*Ts]  # what type checkers see: resolvers return a tuple
else:
    Features = _Features


@dataclass(frozen=True)
class FeaturesSpec:
    items: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class VectorSpec:
    """What `Vector[n]` records in its `Annotated[list[float], ...]`."""

    dimensions: int


if TYPE_CHECKING:

    class Vector(list[float], Generic[N]):
        """What type checkers see: a list of floats (write `Vector[Literal[384]]` for them)."""

else:

    class Vector:
        """A fixed-length vector of floats: `embedding: Vector[384]`.

        A value may be given as a list, a tuple or a numpy array; it is kept as a list of
        floats, and one of another length is refused naming the feature.
        """

        def __class_getitem__(cls, dimensions: Any) -> Any:
            if typing.get_origin(dimensions) is typing.Literal:
                dimensions = typing.get_args(dimensions)[0]
            if not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1:
                raise DefinitionError(
                    f"Vector[{dimensions!r}]: give the number of dimensions, a positive int "
                    "such as Vector[384]"
                )
            return Annotated[list[float], VectorSpec(dimensions)]


# --- value types -------------------------------------------------------------------------

SCALARS: dict[type, str] = {
    bool: "bool",
    int: "int",
    float: "float",
    str: "str",
    datetime: "datetime",
    date: "date",
    timedelta: "timedelta",
}


@dataclass(frozen=True, slots=True)
class ValueType:
    """The type of a feature's value: a scalar name, `list` of an item type, or `dict`."""

    kind: str  # bool int float str datetime date timedelta list vector dict any
    nullable: bool = False
    item: ValueType | None = None
    dimensions: int | None = None  # of a vector

    def __str__(self) -> str:
        text = f"list[{self.item}]" if self.kind == "list" and self.item else self.kind
        text = f"vector[{self.dimensions}]" if self.kind == "vector" else text
        return f"{text} | None" if self.nullable else text


def value_type(annotation: Any) -> ValueType | None:
    """The ValueType of a plain annotation (`int`, `list[str]`, `float | None`), else None."""
    nullable = False
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            return None
        nullable = len(args) < len(typing.get_args(annotation))
        annotation = args[0]
        origin = typing.get_origin(annotation)
    if origin is Annotated:
        vector = [m for m in annotation.__metadata__ if isinstance(m, VectorSpec)]
        if vector:
            return ValueType("vector", nullable, ValueType("float"), vector[0].dimensions)
        annotation = typing.get_args(annotation)[0]
        origin = typing.get_origin(annotation)
    if annotation in SCALARS:
        return ValueType(SCALARS[annotation], nullable)
    if annotation is Any:
        return ValueType("any", True)
    if annotation is list or origin is list:
        items = typing.get_args(annotation)
        item = value_type(items[0]) if items else ValueType("any", True)
        return ValueType("list", nullable, item) if item else None
    if annotation is dict or origin is dict:
        return ValueType("dict", nullable)
    return None
