"""Bind `_` expressions to a feature class: check every name, find the dependencies, and
normalize the tree so the engine can evaluate it without looking anything up.

After binding, a tree contains `Slot(i)` (the i-th dependency of the feature), `Field(name)`
(a column of a has-many row), and `Rows` (a has-many feature filtered and projected), besides
literals, `Now`, operators, calls and aggregations.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kairos.definitions import expressions as ex
from kairos.definitions.feature import FeatureRef, ref_of, window_name
from kairos.errors import DefinitionError, KairosError

WINDOW_BOUNDS = ("window_start", "window_end")


@dataclass(frozen=True, slots=True, eq=False)
class Slot(ex.Expr):
    """The value of the expression's i-th dependency for the current entity."""

    index: int

    def key(self) -> tuple[Any, ...]:
        return ("slot", self.index)


@dataclass(frozen=True, slots=True, eq=False)
class Field(ex.Expr):
    """A column of the current has-many row."""

    name: str

    def key(self) -> tuple[Any, ...]:
        return ("field", self.name)


@dataclass(frozen=True, slots=True, eq=False)
class Rows(ex.Expr):
    """Rows of a has-many dependency that pass every filter, optionally projected."""

    base: ex.Expr  # a Slot
    filters: tuple[ex.Expr, ...]
    projections: tuple[ex.Expr, ...]
    names: tuple[str, ...]  # one output column name per projection

    def key(self) -> tuple[Any, ...]:
        return (
            "rows",
            self.base.key(),
            tuple(f.key() for f in self.filters),
            tuple(p.key() for p in self.projections),
        )


@dataclass(frozen=True, slots=True)
class BoundExpression:
    """An expression checked against its class: `deps[i]` is what `Slot(i)` reads."""

    namespace: str
    tree: ex.Expr
    deps: tuple[FeatureRef, ...]
    source: str  # the expression as the user wrote it, for explain()


def bind_feature(graph: Any, namespace: str, name: str) -> BoundExpression:
    """Bind the expression that defines `namespace.name` (a window's bounds filled in)."""
    info = graph.feature(namespace, name)
    if info.expression is None:
        raise DefinitionError(f"{info.fqn} is not defined by an expression")
    binder = _Binder(graph, namespace, f"{info.fqn}", info.window)
    tree = binder.top(info.expression)
    return BoundExpression(namespace, tree, tuple(binder.deps), repr(info.expression))


def bind_rows_items(
    graph: Any, child_namespace: str, items: tuple[Any, ...], where: str
) -> tuple[tuple[ex.Expr, ...], tuple[ex.Expr, ...], tuple[str, ...]]:
    """Split `[...]` items over a has-many feature into (filters, projections, names)."""
    binder = _Binder(graph, child_namespace, where, None)
    return binder.items(child_namespace, items)


def check_expressions(graph: Any) -> None:
    """Bind every expression feature once, so mistakes surface when the project loads."""
    for namespace, info in graph.classes.items():
        for name, feat in info.features.items():
            if feat.expression is not None:
                bind_feature(graph, namespace, name)


class _Binder:
    def __init__(self, graph: Any, namespace: str, where: str, window: timedelta | None) -> None:
        self.graph = graph
        self.namespace = namespace
        self.where = where
        self.window = window
        self.deps: list[FeatureRef] = []

    def fail(self, message: str) -> DefinitionError:
        return DefinitionError(f"{self.where}: {message}")

    def slot(self, ref: FeatureRef) -> Slot:
        if ref not in self.deps:
            self.deps.append(ref)
        return Slot(self.deps.index(ref))

    # --- entity scope: `_` is an entity of self.namespace ---------------------------------

    def top(self, node: ex.Expr) -> ex.Expr:
        if isinstance(node, ex.Col):
            return self.col(node)
        if isinstance(node, ex.Select):
            return self.select(node)
        if isinstance(node, ex.Agg):
            base = node.base
            rows = self.select(ex.Select(base, ())) if isinstance(base, ex.Col) else self.top(base)
            if not isinstance(rows, Rows):
                raise self.fail(
                    f"{node.fn}() applies to a has-many feature, e.g. _.transactions[_.amount]"
                    f".{node.fn}(); got {base!r}"
                )
            if node.fn != "count" and len(rows.projections) != 1:
                raise self.fail(
                    f"{node.fn}() needs exactly one column: write {base!r}[_.column]."
                    f"{node.fn}() (got {len(rows.projections)})"
                )
            return ex.Agg(node.fn, rows)
        return self.generic(node, self.top)

    def col(self, node: ex.Col) -> ex.Expr:
        if node.path[0] in WINDOW_BOUNDS and len(node.path) == 1:
            bound = self.window_bound(node.path[0])
            if bound is not None:
                return bound
        *hops, name = node.path
        ref = FeatureRef(
            self.namespace, tuple(hops), name, node.window and window_name(node.window)
        )
        try:
            _, info = self.graph.walk(ref)
        except KairosError as error:
            raise self.fail(str(error)) from None
        if info.kind == "has_one":
            raise self.fail(f"{node!r} is a relation; use one of its features, e.g. {node!r}.id")
        return self.slot(ref)

    def window_bound(self, name: str) -> ex.Expr | None:
        if name in self.graph.cls(self.namespace).features:
            return None  # a real feature with that name wins
        if self.window is None:
            raise self.fail(f"_.{name} is only defined inside windowed(..., expression=...)")
        return ex.NowRef() if name == "window_end" else ex.NowRef() - self.window

    def select(self, node: ex.Select) -> Rows:
        base = node.base
        if base.window:
            raise self.fail(
                f"{base!r} is one value per entity; filters and aggregations apply to has-many "
                "features such as _.transactions"
            )
        *hops, name = base.path
        ref = FeatureRef(self.namespace, tuple(hops), name)
        try:
            _, info = self.graph.walk(ref)
        except KairosError as error:
            raise self.fail(str(error)) from None
        if info.kind != "has_many" or info.target is None:
            raise self.fail(f"{base!r}[...] filters a has-many feature; {base!r} is not one")
        filters, projections, names = self.items(info.target, node.items)
        return Rows(self.slot(ref), filters, projections, names)

    # --- row scope: `_` is one row of a has-many feature ---------------------------------

    def items(
        self, child: str, items: tuple[Any, ...]
    ) -> tuple[tuple[ex.Expr, ...], tuple[ex.Expr, ...], tuple[str, ...]]:
        filters: list[ex.Expr] = []
        projections: list[ex.Expr] = []
        names: list[str] = []
        for item in items:
            ref = ref_of(item)
            if ref is not None:
                item = ex.Col((ref.name,))
            bound = self.row(child, item)
            if self.is_predicate(child, item, bound):
                filters.append(bound)
            else:
                projections.append(bound)
                names.append(item.path[-1] if isinstance(item, ex.Col) else repr(item))
        return tuple(filters), tuple(projections), tuple(names)

    def row(self, child: str, node: ex.Expr) -> ex.Expr:
        if isinstance(node, ex.Col):
            if len(node.path) == 1 and node.path[0] in WINDOW_BOUNDS:
                bound = self.window_bound(node.path[0])
                if bound is not None:
                    return bound
            if len(node.path) != 1 or node.window:
                raise self.fail(
                    f"inside [...] use the row's own features (e.g. _.amount); got {node!r}"
                )
            try:
                info = self.graph.feature(child, node.path[0])
            except KairosError as error:
                raise self.fail(f"inside [...]: {error}") from None
            if info.kind != "scalar":
                raise self.fail(f"inside [...] {info.fqn} is a relation, not a column")
            if info.expression is not None:
                # a computed column of the child: evaluate its definition on the row
                return _Binder(self.graph, child, info.fqn, self.window).row(child, info.expression)
            return Field(node.path[0])
        if isinstance(node, ex.Select | ex.Agg):
            raise self.fail(f"nested has-many expressions are not supported inside [...]: {node!r}")
        return self.generic(node, lambda n: self.row(child, n))

    def is_predicate(self, child: str, item: Any, bound: ex.Expr) -> bool:
        if isinstance(bound, ex.BinOp):
            return bound.op in ex.COMPARISONS or bound.op in ex.BOOLEAN_OPS
        if isinstance(bound, ex.Call):
            return bound.fn == "not" or bound.fn in ex.PREDICATE_CALLS
        if isinstance(bound, Field):
            info = self.graph.feature(child, bound.name)
            return info.type is not None and info.type.kind == "bool"
        return False

    # --- shared --------------------------------------------------------------------------

    def generic(self, node: ex.Expr, recurse: Any) -> ex.Expr:
        if isinstance(node, ex.Lit | ex.NowRef):
            return node
        if isinstance(node, ex.BinOp):
            return ex.BinOp(node.op, recurse(node.left), recurse(node.right))
        if isinstance(node, ex.Call):
            return ex.Call(node.fn, tuple(recurse(a) for a in node.args))
        if isinstance(node, ex.Agg | ex.Select):
            raise self.fail(f"aggregations are not allowed here: {node!r}")
        raise self.fail(f"cannot bind {node!r}")
