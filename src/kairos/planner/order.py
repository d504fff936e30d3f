"""Pass 3: number the producers in topological order and record what each node must produce."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from types import MappingProxyType

from kairos.planner.plan import Plan, PlanNode
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
        kind = first.kind
        if first.kind == "resolver" and first.resolver is not None:
            kind = first.resolver.kind
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
        nodes.append(
            PlanNode(
                id=index,
                kind=kind,
                label=label,
                path=first.column.path,
                namespace=first.column.namespace,
                args=first.args,
                outputs=node_outputs,
                needed=tuple(o for o in node_outputs if o in consumed),
                key=key_col,
                after=tuple(after),
                timeout=timeout,
                resolver=first.resolver,
                expression=first.expression,
                default=first.column.info.default if first.kind == "default" else None,
            )
        )
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


def _version(node: PlanNode) -> str | None:
    """A short hash of the code behind a node, so a logged value names what made it."""
    if node.resolver is not None:
        return node.resolver.version
    if node.expression is not None:
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
