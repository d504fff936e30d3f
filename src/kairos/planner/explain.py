"""Plans as text: what `client.explain(...)` prints."""

from __future__ import annotations

from kairos.definitions.durations import format_duration
from kairos.planner.plan import Plan, PlanNode


def explain(plan: Plan) -> str:
    """One line per node, in the order they may start; `after` names what each waits for.

    >>> print(client.explain(input={User.id: "u1"}, output=[User.risk]))  # doctest: +SKIP
    """
    lines = [
        f"query {plan.root}",
        f"  inputs:  {', '.join(plan.inputs) or '(none)'}",
        f"  outputs: {', '.join(plan.outputs)}",
    ]
    for node in plan.nodes:
        lines.append(_node_line(plan, node))
    return "\n".join(lines)


def _node_line(plan: Plan, node: PlanNode) -> str:
    reads = ", ".join("now" if a is None else a for a in node.args) or "-"
    writes = ", ".join(node.needed or node.outputs)
    head = f"  [{node.id}] {node.kind:<10} {node.label}"
    parts = [head, f"      {reads} -> {writes}"]
    extras = []
    if node.after:
        extras.append("after " + ",".join(f"[{i}]" for i in node.after))
    cached = [
        f"{name} {format_duration(plan.columns[name].info.max_staleness)}"
        for name in (node.needed or node.outputs)
        if node.kind not in ("relation", "default")
        and plan.columns[name].info.max_staleness.total_seconds() > 0
    ]
    if cached:
        extras.append("cache " + ", ".join(cached))
    if node.resolver is not None:
        extras.append(f"timeout {format_duration(node.timeout)}")
    if node.expression is not None:
        extras.append(f"= {node.expression.source}")
    if extras:
        parts.append("      " + "; ".join(extras))
    return "\n".join(parts)
