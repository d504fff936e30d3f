"""Pass 3: number the producers in topological order and record what each node must produce."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from types import MappingProxyType

from kairos.errors import PlanError
from kairos.planner.plan import (
    DefaultNode,
    EventsNode,
    ExpressionNode,
    Plan,
    PlanNode,
    RelationNode,
    ResolverNode,
    WindowNode,
)
from kairos.planner.resolve import Producer, Resolution


def order(resolution: Resolution, default_timeout: timedelta) -> Plan:
    producers = resolution.producers
    outputs = tuple(c.name for c in resolution.query.outputs)
    # One node per resolver call site: a resolver with several outputs runs once per path.
    groups: dict[tuple[object, ...], list[Producer]] = {}
    for producer in producers.values():
        if producer.kind == "input":
            continue
        identity: tuple[object, ...] = (producer.column.name,)
        if producer.kind == "resolver" and producer.resolver is not None:
            identity = ("resolver", producer.resolver.name, producer.column.path)
        groups.setdefault(identity, []).append(producer)

    group_of = {p.column.name: key for key, members in groups.items() for p in members}
    visited: dict[tuple[object, ...], int] = {}
    sorted_keys: list[tuple[object, ...]] = []
    visiting: set[tuple[object, ...]] = set()

    def visit(key: tuple[object, ...]) -> None:
        if key in visited or key in visiting:
            return
        visiting.add(key)
        for member in groups[key]:
            for arg in member.args:
                if arg is not None and arg in group_of:
                    visit(group_of[arg])
            key_col = _key(resolution, member)
            if key_col and key_col in group_of and group_of[key_col] != key:
                visit(group_of[key_col])
        visiting.discard(key)
        visited[key] = len(sorted_keys)
        sorted_keys.append(key)

    for name in outputs:
        if name in group_of:
            visit(group_of[name])
    for key in list(groups):
        visit(key)

    consumed = set(outputs)
    for producers_ in groups.values():
        for member in producers_:
            consumed.update(a for a in member.args if a is not None)
            key_col = _key(resolution, member)
            if key_col:
                consumed.add(key_col)

    nodes: list[PlanNode] = []
    producer_index: dict[str, int] = {}
    for index, key in enumerate(sorted_keys):
        members = groups[key]
        first = members[0]
        if first.resolver is not None:
            resolver = first.resolver
            prefix = first.column.name[: -len(first.column.info.name)]
            node_outputs = tuple(prefix + name for name in resolver.outputs)
            label = resolver.name
            timeout = resolver.timeout or default_timeout
        else:
            node_outputs = (first.column.name,)
            label = first.column.name
            timeout = default_timeout
        key_col = _key(resolution, first)
        after = sorted(
            {
                visited[group_of[a]]
                for a in (*first.args, key_col)
                if a is not None and a in group_of and group_of[a] != key
            }
        )
        needed = tuple(o for o in node_outputs if o in consumed)
        step: _Step = (
            index,
            label,
            first.column.path,
            first.column.namespace,
            first.args,
            node_outputs,
            needed,
            key_col,
            tuple(after),
            timeout,
        )
        nodes.append(_node(first, step))
        for output in node_outputs:
            producer_index[output] = index
    columns = dict(resolution.columns)
    versions = {output: _version(node) for node in nodes for output in node.outputs}
    return Plan(
        root=resolution.root,
        inputs=tuple(c.name for c in resolution.query.inputs),
        outputs=outputs,
        nodes=tuple(nodes),
        producer=MappingProxyType(producer_index),
        columns=MappingProxyType(columns),
        versions=MappingProxyType(versions),
    )


# The fields every node shares, in PlanNode's order.
_Step = tuple[
    int,
    str,
    tuple[str, ...],
    str,
    tuple[str | None, ...],
    tuple[str, ...],
    tuple[str, ...],
    str | None,
    tuple[int, ...],
    timedelta,
]


def _node(producer: Producer, step: _Step) -> PlanNode:
    """The typed node for a producer's step."""
    if producer.kind == "resolver" and producer.resolver is not None:
        return ResolverNode(*step, resolver=producer.resolver)
    if producer.kind == "relation":
        return RelationNode(*step)
    if producer.kind == "events":
        return EventsNode(*step)
    if producer.kind == "default":
        return DefaultNode(*step, default=producer.column.info.default)
    if producer.kind == "window" and producer.expression is not None:
        return WindowNode(*step, expression=producer.expression)
    if producer.kind == "expression" and producer.expression is not None:
        return ExpressionNode(*step, expression=producer.expression)
    raise PlanError(  # pragma: no cover - resolve() makes no other producer
        f"no plan node for {producer.column.name!r} ({producer.kind!r})"
    )


def _version(node: PlanNode) -> str | None:
    """A short hash of the code behind a node, so a logged value names what made it."""
    if isinstance(node, ResolverNode):
        return node.resolver.version
    if isinstance(node, ExpressionNode | WindowNode):
        return hashlib.sha256(node.expression.source.encode()).hexdigest()[:12]
    return None


def _key(resolution: Resolution, producer: Producer) -> str | None:
    """The primary-key column of the entity a producer computes for, when the plan has it."""
    if producer.kind == "relation":
        return None
    for name, candidate in resolution.producers.items():
        column = candidate.column
        if column.path == producer.column.path and column.info.is_primary:
            return name if name != producer.column.name else None
    return None
