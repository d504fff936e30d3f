"""Recognize windowed aggregates an index can answer without scanning the window.

A windowed feature such as

    txn_count: Windowed[int] = windowed("7d", expression=_.transactions[
        _.status == "declined", _.ts > _.window_start].count())

binds to `Agg(fn, Rows(Slot(0), filters, projections))` where one filter compares the child's
FeatureTime with `Now - window` and every other filter and the projection depend on the row
alone. Such a feature is `count | sum | mean | min | max | std | distinct_count` of the rows
(or of one projected column) that pass fixed filters and fall in `(now - window, now]`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kairos.definitions import expressions as ex
from kairos.definitions.binding import BoundExpression, Field, Rows, Slot, bind_feature


@dataclass(frozen=True)
class WindowSpec:
    fn: str
    time_field: str
    inclusive: bool  # `ts >= start` rather than `ts > start`
    window: timedelta
    filters: tuple[ex.Expr, ...]  # row-only predicates
    projection: ex.Expr | None


def window_spec(bound: BoundExpression, window: timedelta, time_field: str) -> WindowSpec | None:
    """The spec of a windowed aggregate an index can answer, or None (then rows are scanned)."""
    tree = bound.tree
    if not isinstance(tree, ex.Agg) or not isinstance(tree.base, Rows):
        return None
    rows = tree.base
    if not isinstance(rows.base, Slot) or len(bound.deps) != 1 or len(rows.projections) > 1:
        return None
    bounds = [f for f in rows.filters if _window_start(f, time_field, window) is not None]
    others = [
        f
        for f in rows.filters
        if not any(f is b for b in bounds) and not _is_window_end(f, time_field)
    ]
    if len(bounds) != 1 or any(_uses_now(f) for f in others):
        return None
    projection = rows.projections[0] if rows.projections else None
    if projection is not None and _uses_now(projection):
        return None
    inclusive = _window_start(bounds[0], time_field, window)
    return WindowSpec(tree.fn, time_field, bool(inclusive), window, tuple(others), projection)


def _window_start(node: ex.Expr, time_field: str, window: timedelta) -> bool | None:
    """True for `ts >= now - window`, False for `ts > now - window`, else None."""
    if not isinstance(node, ex.BinOp) or node.op not in (">", ">="):
        return None
    left, right = node.left, node.right
    if not (isinstance(left, Field) and left.name == time_field):
        return None
    if (
        isinstance(right, ex.BinOp)
        and right.op == "-"
        and isinstance(right.left, ex.NowRef)
        and isinstance(right.right, ex.Lit)
        and right.right.value == window
    ):
        return node.op == ">="
    return None


def _is_window_end(node: ex.Expr, time_field: str) -> bool:
    """`ts <= now`: always true for the rows a query sees, so it changes nothing."""
    return (
        isinstance(node, ex.BinOp)
        and node.op == "<="
        and isinstance(node.left, Field)
        and node.left.name == time_field
        and isinstance(node.right, ex.NowRef)
    )


def _uses_now(node: Any) -> bool:
    if isinstance(node, ex.NowRef):
        return True
    if isinstance(node, ex.BinOp):
        return _uses_now(node.left) or _uses_now(node.right)
    if isinstance(node, ex.Call):
        return any(_uses_now(a) for a in node.args)
    if isinstance(node, ex.Agg):
        return _uses_now(node.base)
    if isinstance(node, Rows):
        return any(_uses_now(x) for x in (*node.filters, *node.projections))
    return False


@dataclass(frozen=True)
class IndexedWindow:
    """A windowed feature answered from the event index: over which events, grouped how."""

    child: str  # namespace of the events
    fk: str  # the child's foreign key to the feature's class
    spec: WindowSpec


def indexed_window(graph: Any, namespace: str, name: str) -> IndexedWindow | None:
    """How the event index answers `namespace.name`, or None when it cannot (then the
    engine evaluates the expression over the rows)."""
    info = graph.feature(namespace, name)
    if info.expression is None or info.window is None:
        return None
    bound = bind_feature(graph, namespace, name)
    if len(bound.deps) != 1 or bound.deps[0].path:
        return None
    relation = graph.feature(namespace, bound.deps[0].name)
    if relation.kind != "has_many" or relation.target is None or relation.join_key is None:
        return None
    child = graph.cls(relation.target)
    if not child.events or child.feature_time is None:
        return None
    spec = window_spec(bound, info.window, child.feature_time)
    return None if spec is None else IndexedWindow(child.namespace, relation.join_key, spec)
