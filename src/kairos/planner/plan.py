"""The plan: an immutable DAG of typed nodes that together produce a query's outputs.

Each kind of step is its own node class carrying only its own fields (a resolver call, an
expression, a default...); the engine dispatches on the class. `Plan.explain()` prints it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar

from kairos.definitions.binding import BoundExpression
from kairos.definitions.durations import format_duration
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
    """One step; a subclass per kind of step. `args` line up with what the step reads
    (resolver parameters or expression dependencies); None stands for `Now`."""

    KIND: ClassVar[str]
    # Whether the step's outputs go through the online store (copies and constants do not).
    CACHED: ClassVar[bool] = True

    id: int
    label: str
    path: tuple[str, ...]
    namespace: str
    args: tuple[str | None, ...]
    outputs: tuple[str, ...]
    needed: tuple[str, ...]
    key: str | None  # primary-key column of the entity this node computes for
    after: tuple[int, ...]  # nodes that must finish first
    timeout: timedelta

    @property
    def kind(self) -> str:
        """What explain(), traces and the server call the step: `relation`, `python`..."""
        return self.KIND

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(a for a in self.args if a is not None))


@dataclass(frozen=True, slots=True)
class RelationNode(PlanNode):
    """The primary key of an entity reached through a relation, copied from the foreign key."""

    KIND = "relation"
    CACHED = False


@dataclass(frozen=True, slots=True)
class DefaultNode(PlanNode):
    """A feature's declared default, where nothing else computes it."""

    KIND = "default"
    CACHED = False
    default: Any


@dataclass(frozen=True, slots=True)
class ExpressionNode(PlanNode):
    """A feature defined by an `_` expression over other columns of its entity."""

    KIND = "expression"
    expression: BoundExpression


@dataclass(frozen=True, slots=True)
class EventsNode(PlanNode):
    """A has-many of events written to kairos, read from the event index."""

    KIND = "events"


@dataclass(frozen=True, slots=True)
class WindowNode(PlanNode):
    """A windowed aggregate over events written to kairos, answered from the event index."""

    KIND = "window"
    expression: BoundExpression


@dataclass(frozen=True, slots=True)
class ResolverNode(PlanNode):
    """One call of a resolver (python, sql, model...) for the entity at `path`."""

    KIND = "resolver"
    resolver: BoundResolver

    @property
    def kind(self) -> str:
        return self.resolver.kind


@dataclass(frozen=True)
class Plan:
    root: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    nodes: tuple[PlanNode, ...]  # topological order
    producer: Mapping[str, int]  # column -> id of the node that computes it
    columns: Mapping[str, Column]  # every column the plan touches
    versions: Mapping[str, str | None]  # column -> version of the code computing it

    @functools.cached_property
    def fingerprint(self) -> str:
        """16 hex digits naming what this plan runs: its inputs, outputs, every node (kind,
        label, reads, writes) and the version of the code behind every column. Two processes
        with the same definitions agree; a changed model version or prompt changes it."""
        text = json.dumps(
            [
                self.root,
                self.inputs,
                self.outputs,
                [[n.kind, n.label, n.args, n.outputs, n.key] for n in self.nodes],
                sorted([name, version] for name, version in self.versions.items()),
            ],
            default=str,
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @functools.cached_property
    def models(self) -> tuple[str, ...]:
        """The model versions the plan calls (`risk@v2`), in node order."""
        found: list[str] = []
        for node in self.nodes:
            if node.kind == "model":
                found.extend(v for o in node.outputs if (v := self.versions.get(o)) is not None)
        return tuple(dict.fromkeys(found))

    def node(self, column: str) -> PlanNode | None:
        index = self.producer.get(column)
        return None if index is None else self.nodes[index]

    def explain(self) -> str:
        """One line per node, in the order they may start; `after` names what each waits for.

        >>> print(client.explain(input={User.id: "u1"}, output=[User.risk]))  # doctest: +SKIP
        """
        lines = [
            f"query {self.root}",
            f"  inputs:  {', '.join(self.inputs) or '(none)'}",
            f"  outputs: {', '.join(self.outputs)}",
        ]
        for node in self.nodes:
            lines.append(self._node_line(node))
        return "\n".join(lines)

    def _node_line(self, node: PlanNode) -> str:
        reads = ", ".join("now" if a is None else a for a in node.args) or "-"
        writes = ", ".join(node.needed or node.outputs)
        head = f"  [{node.id}] {node.kind:<10} {node.label}"
        parts = [head, f"      {reads} -> {writes}"]
        extras = []
        if node.after:
            extras.append("after " + ",".join(f"[{i}]" for i in node.after))
        cached = [
            f"{name} {format_duration(self.columns[name].info.max_staleness)}"
            for name in (node.needed or node.outputs)
            if node.CACHED and self.columns[name].info.max_staleness.total_seconds() > 0
        ]
        if cached:
            extras.append("cache " + ", ".join(cached))
        if isinstance(node, ResolverNode):
            extras.append(f"timeout {format_duration(node.timeout)}")
        if isinstance(node, ExpressionNode | WindowNode):
            extras.append(f"= {node.expression.source}")
        if extras:
            parts.append("      " + "; ".join(extras))
        return "\n".join(parts)
