"""Vector search as a feature: `kr.nearest(...)` declares a has-many of the k documents nearest
to a query vector, searched as of the query's `now`.

    @features(events=True)
    class Doc:
        id: str
        text: str
        lang: str
        updated_at: FeatureTime
        embedding: Vector[384] = kr.embedding(model="local/minilm", input=_.text)

    @features
    class Ticket:
        id: str
        question: str
        lang: str
        question_embedding: Vector[384] = kr.embedding(model="local/minilm", input=_.question)
        related: DataFrame[Doc] = kr.nearest(Doc.embedding, query=_.question_embedding, k=5,
                                             where=(_.lang == kr.parent.lang) & (_.year >= 2020))

Inside `where`, `_` is a document; `kr.parent.<feature>` is a feature of the entity searching
(read per entity). Conditions are applied during the search, so a selective filter still
returns k rows when k documents match. Like `windowed(...)` this only records a declaration;
`Graph.build` checks it (`bind_nearest`) and the client turns it into a resolver. No I/O here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kairos.definitions import expressions as ex
from kairos.definitions.durations import DurationLike, optional_duration
from kairos.definitions.feature import MISSING, FeatureOptions, FeatureRef, ref_of
from kairos.errors import DefinitionError, did_you_mean

OPERATORS = ("==", "!=", "<", "<=", ">", ">=")
_FLIPPED = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
SUPPORTED = (
    "comparisons (== != < <= > >=) of a document feature with a literal or "
    "kr.parent.<feature>, _.feature.is_in([...]), joined with &"
)


@dataclass(frozen=True, slots=True, eq=False)
class ParentCol(ex.Expr):
    """`kr.parent.lang` inside a `where=`: the searching entity's feature `lang`."""

    name: str

    def key(self) -> tuple[Any, ...]:
        return ("parent", self.name)

    def __repr__(self) -> str:
        return f"kr.parent.{self.name}"


class _Parent:
    """The `kr.parent` root: `kr.parent.lang` is the searching entity's `lang`."""

    __slots__ = ()

    def __getattr__(self, name: str) -> ParentCol:
        if name.startswith("__"):
            raise AttributeError(name)
        return ParentCol(name)

    def __repr__(self) -> str:
        return "kr.parent"


parent: Any = _Parent()


@dataclass(frozen=True, slots=True)
class NearestOptions(FeatureOptions):
    """What `kr.nearest(...)` recorded; checked by `bind_nearest` when the graph is built."""

    vector: Any = None  # the documents' vector feature, as given (Doc.embedding)
    query: Any = None  # the parent's query vector, as given (_.question_embedding)
    k: Any = None
    where: Any = None
    timeout: timedelta | None = None


@dataclass(frozen=True, slots=True)
class Filter:
    """`document[column] <op> value`, with `value` a literal or the parent's feature `parent`
    (read per entity). For `in`, `value` is a tuple of options."""

    column: str
    op: str  # == != < <= > >= in
    value: Any = None
    parent: str | None = None


@dataclass(frozen=True, slots=True)
class NearestSearch:
    """A checked `kr.nearest` feature: what its resolver searches and how."""

    target: str  # namespace of the documents
    vector: str  # their Vector feature
    dimensions: int
    query: str  # the parent's Vector feature
    k: int
    filters: tuple[Filter, ...]
    timeout: timedelta | None = None

    @property
    def index(self) -> str:
        """The name of the index the documents are kept in: `doc.embedding`."""
        return f"{self.target}.{self.vector}"

    @property
    def parents(self) -> tuple[str, ...]:
        """The parent's features the filters read, in order, once each."""
        return tuple(dict.fromkeys(f.parent for f in self.filters if f.parent is not None))


def nearest(
    vector: Any,
    *,
    query: Any,
    k: int = 5,
    where: Any = None,
    timeout: DurationLike | None = None,
    description: str | None = None,
    tags: Iterable[str] = (),
    owner: str | None = None,
) -> Any:
    """Declare a has-many feature of the `k` documents whose `vector` is nearest the entity's
    `query` vector, nearest first, each row the document's features plus `distance` (cosine
    distance, 0 = same direction). Filtered by `where` during the search, as of the query's
    `now` (an offline row's `ts`): a document observed later does not exist for that query.

    >>> related: DataFrame[Doc] = kr.nearest(Doc.embedding, query=_.question_embedding, k=5)
    ... # doctest: +SKIP
    """
    return NearestOptions(
        default=MISSING,
        description=description,
        tags=tuple(tags),
        owner=owner,
        vector=vector,
        query=query,
        k=k,
        where=where,
        timeout=optional_duration(timeout, field="timeout"),
    )


def bind_nearest(
    where: str,
    options: NearestOptions,
    target: str,
    documents: Any,
    parent: Any,
) -> NearestSearch:
    """Check a `kr.nearest` feature against the documents' class and the parent's class
    (`ClassInfo`s); `where` names the feature (`Ticket.related`) in every error."""
    head = f"{where} = kr.nearest(...)"
    ref = ref_of(options.vector)
    if not isinstance(ref, FeatureRef) or ref.path or ref.window:
        raise DefinitionError(
            f"{head}: the first argument is the documents' vector feature, e.g. Doc.embedding; "
            f"got {options.vector!r}"
        )
    if ref.root != target:
        raise DefinitionError(
            f"{head}: {ref.fqn} is not a feature of {target}, the class the annotation "
            f"DataFrame[...] names; search the documents you return"
        )
    if not documents.events:
        raise DefinitionError(
            f"{head}: declare {documents.cls.__name__} @features(events=True) (with a "
            f"FeatureTime): its rows are written with client.write_events, which keeps the "
            f"index of {ref.fqn} current"
        )
    if "distance" in documents.features:
        raise DefinitionError(
            f"{head}: rows found by vector search carry a `distance` column, and "
            f"{documents.namespace} declares a feature of that name; rename it"
        )
    vector = documents.features.get(ref.name)
    dimensions = _dimensions(vector)
    if dimensions is None:
        raise DefinitionError(
            f"{head}: {ref.fqn} is not a vector; declare it e.g. `{ref.name}: Vector[384]`"
        )
    query = _query_name(head, options.query, parent)
    query_dimensions = _dimensions(parent.features.get(query))
    if query_dimensions is None:
        raise DefinitionError(
            f"{head}: query=_.{query} is not a vector; declare it e.g. "
            f"`{query}: Vector[{dimensions}] = kr.embedding(...)`"
        )
    if query_dimensions != dimensions:
        raise DefinitionError(
            f"{head}: query=_.{query} has {query_dimensions} dimensions and {ref.fqn} has "
            f"{dimensions}; embed both with the same model"
        )
    k = options.k
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise DefinitionError(f"{head}: k={k!r} must be a positive int (how many rows to find)")
    filters: list[Filter] = []
    if options.where is not None:
        if not isinstance(options.where, ex.Expr):
            raise DefinitionError(
                f"{head}: where={options.where!r} is not an `_` expression; supported: {SUPPORTED}"
            )
        _filters(head, options.where, options.where, documents, parent, ref.name, filters)
    return NearestSearch(target, ref.name, dimensions, query, k, tuple(filters), options.timeout)


def _dimensions(info: Any) -> int | None:
    kind = getattr(info, "type", None)
    if kind is None or kind.kind != "vector" or info.kind != "scalar":
        return None
    return int(kind.dimensions)


def _query_name(head: str, query: Any, parent: Any) -> str:
    if isinstance(query, ex.Col) and len(query.path) == 1 and not query.window:
        name = query.path[0]
    elif isinstance(query, str):
        name = query
    else:
        raise DefinitionError(
            f"{head}: query={query!r} must name the entity's vector feature, e.g. "
            "query=_.question_embedding"
        )
    if name not in parent.features:
        raise DefinitionError(
            f"{head}: query=_.{name}: {parent.namespace} has no feature {name!r}"
            f"{did_you_mean(name, parent.features)}"
        )
    return name


def _filters(
    head: str,
    node: ex.Expr,
    whole: ex.Expr,
    documents: Any,
    parent: Any,
    vector: str,
    found: list[Filter],
) -> None:
    """Append the conditions `node` is a conjunction of, or fail naming what is supported."""
    if isinstance(node, ex.BinOp) and node.op == "&":
        _filters(head, node.left, whole, documents, parent, vector, found)
        _filters(head, node.right, whole, documents, parent, vector, found)
        return
    if isinstance(node, ex.BinOp) and node.op in OPERATORS:
        left, op, right = node.left, node.op, node.right
        if not isinstance(left, ex.Col) and isinstance(right, ex.Col):
            left, op, right = right, _FLIPPED[op], left  # "en" == _.lang
        if isinstance(left, ex.Col):
            column = _column(head, left, documents, vector)
            if isinstance(right, ex.Lit) and right.value is not None:
                found.append(Filter(column, op, right.value))
                return
            if isinstance(right, ParentCol):
                found.append(Filter(column, op, None, _parent_feature(head, right, parent)))
                return
    if isinstance(node, ex.Call) and node.fn == "is_in" and isinstance(node.args[0], ex.Col):
        column = _column(head, node.args[0], documents, vector)
        options = node.args[1]
        if isinstance(options, ex.Lit) and isinstance(options.value, tuple):
            found.append(Filter(column, "in", options.value))
            return
    part = "" if node is whole else f" ({node!r} is not one of those)"
    raise DefinitionError(f"{head}: where={whole!r}: supported are {SUPPORTED}{part}")


def _column(head: str, col: ex.Col, documents: Any, vector: str) -> str:
    if len(col.path) != 1 or col.window:
        raise DefinitionError(
            f"{head}: where= compares the documents' own features (e.g. _.lang); got {col!r}"
        )
    name = col.path[0]
    info = documents.features.get(name)
    if info is None:
        raise DefinitionError(
            f"{head}: where= uses {col!r}, which is not a feature of {documents.namespace}"
            f"{did_you_mean(name, documents.features)}"
        )
    if info.kind != "scalar" or name == vector or info.type.kind in ("vector", "list", "dict"):
        raise DefinitionError(
            f"{head}: where= uses {col!r}, which is not a scalar feature a filter can compare"
        )
    return str(name)


def _parent_feature(head: str, col: ParentCol, parent: Any) -> str:
    info = parent.features.get(col.name)
    if info is None or info.kind != "scalar":
        raise DefinitionError(
            f"{head}: where= uses {col!r}, which is not a feature of {parent.namespace}"
            f"{did_you_mean(col.name, parent.features)}"
        )
    return col.name
