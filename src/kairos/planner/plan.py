"""The plan: an immutable DAG of nodes that together produce a query's outputs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kairos.definitions.binding import BoundExpression
from kairos.definitions.graph import FeatureInfo
from kairos.resolvers.registry import BoundResolver


@dataclass(frozen=True, slots=True, eq=False)
class Column:
    """One feature of one entity of the query: `transaction.user.name` is User.name reached
    from the query's transaction through the `user` relation."""

    name: str
    path: tuple[str, ...]
    info: FeatureInfo

    @property
    def namespace(self) -> str:
        return self.info.namespace

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Column) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)


def column_name(root: str, path: tuple[str, ...], feature: str) -> str:
    """`column_name("transaction", ("user",), "name") == "transaction.user.name"`."""
    return ".".join((root, *path, feature))


@dataclass(frozen=True, slots=True)
class PlanNode:
    """One step. `args` line up with what the step reads (resolver parameters or expression
    dependencies); None stands for `Now`."""

    id: int
    kind: str  # relation | expression | default | events | window | python | sql
    label: str
    path: tuple[str, ...]
    namespace: str
    args: tuple[str | None, ...]
    outputs: tuple[str, ...]
    needed: tuple[str, ...]
    key: str | None  # primary-key column of the entity this node computes for
    after: tuple[int, ...]  # nodes that must finish first
    timeout: timedelta
    resolver: BoundResolver | None = None
    expression: BoundExpression | None = None
    default: Any = None

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(a for a in self.args if a is not None))


@dataclass(frozen=True)
class Plan:
    root: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    nodes: tuple[PlanNode, ...]  # topological order
    producer: Mapping[str, int]  # column -> id of the node that computes it
    columns: Mapping[str, Column]  # every column the plan touches
    versions: Mapping[str, str | None]  # column -> version of the code computing it

    def node(self, column: str) -> PlanNode | None:
        index = self.producer.get(column)
        return None if index is None else self.nodes[index]

    def explain(self) -> str:
        from kairos.planner.explain import explain

        return explain(self)
