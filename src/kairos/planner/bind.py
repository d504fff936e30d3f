"""Pass 1: names -> columns. Checks every input and output against the graph."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kairos.definitions.feature import FeatureRef
from kairos.definitions.graph import Graph
from kairos.errors import InvalidInput, PlanError
from kairos.planner.plan import Column


@dataclass(frozen=True, slots=True)
class BoundQuery:
    root: str
    inputs: tuple[Column, ...]
    outputs: tuple[Column, ...]


def to_column(graph: Graph, ref: FeatureRef) -> Column:
    """The column a ref names, after walking its relations."""
    _, info = graph.walk(ref)
    return Column(ref.fqn, ref.path, info)


def bind_query(graph: Graph, inputs: Iterable[Any], outputs: Iterable[Any]) -> BoundQuery:
    input_refs = [graph.ref(i) for i in inputs]
    output_refs = [graph.ref(o) for o in outputs]
    if not output_refs:
        raise PlanError("a query needs at least one output, e.g. output=[User.balance]")
    roots = {ref.root for ref in output_refs}
    if len(roots) > 1:
        raise PlanError(
            f"outputs start from several classes ({', '.join(sorted(roots))}); a query is about "
            "one entity: reach the others through relations, e.g. 'transaction.user.name'"
        )
    root = roots.pop()
    for ref in input_refs:
        if ref.root != root:
            raise InvalidInput(
                f"input {ref.fqn!r} is not about {root!r}, the entity the outputs describe; "
                f"pass e.g. '{root}.{graph.cls(root).primary}'"
            )
    return BoundQuery(
        root,
        tuple(to_column(graph, r) for r in input_refs),
        tuple(dict.fromkeys(to_column(graph, r) for r in output_refs)),
    )
