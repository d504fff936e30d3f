"""A plan's DAG laid out for drawing: each node in a column by its depth (the longest chain of
nodes before it), the query's inputs in column 0, an edge per column a node reads. Node kinds
are told apart by colour (sql, python, model, llm, expression, nearest, cache...)."""

from __future__ import annotations

from dataclasses import dataclass

from kairos.planner.plan import Plan, PlanNode

BOX_W, BOX_H, GAP_X, GAP_Y, PAD = 190.0, 36.0, 60.0, 16.0, 12.0
LLM_WORDS = ("completion", "embedding", "llm")


@dataclass(frozen=True, slots=True)
class Box:
    key: str  # "input:user.id" or "node:3"
    kind: str  # the CSS class: sql python model llm expression nearest input other
    title: str  # the node's kind as shown
    label: str
    detail: str  # what it writes (shown on hover)
    x: float
    y: float
    target: bool  # computes the feature the page is about


@dataclass(frozen=True, slots=True)
class Edge:
    path: str  # an SVG path's d


@dataclass(frozen=True, slots=True)
class Lineage:
    boxes: tuple[Box, ...]
    edges: tuple[Edge, ...]
    width: float
    height: float
    kinds: tuple[str, ...]  # the kinds present, for the legend


def node_kind(node: PlanNode) -> str:
    """The colour class of a node: LLM calls are resolvers too, told apart by their label.

    >>> from types import SimpleNamespace as N
    >>> node_kind(N(kind="python", label="user.verdict (completion local/gemma)"))
    'llm'
    """
    kind = node.kind
    if kind in ("sql", "model", "nearest", "expression"):
        return kind
    if kind in ("window", "events"):
        return "expression"
    if kind == "python":
        return "llm" if any(word in node.label.lower() for word in LLM_WORDS) else "python"
    return "other"


def layout(plan: Plan, target: str | None = None) -> Lineage:
    """Boxes and edges of `plan`; the node producing `target` is marked.

    The plan's nodes are in topological order, so one pass gives each its depth."""
    depth: dict[int, int] = {}
    for node in plan.nodes:
        depth[node.id] = 1 + max((depth[a] for a in node.after), default=0)
    columns: dict[int, list[str]] = {0: [f"input:{name}" for name in plan.inputs]}
    for node in plan.nodes:
        columns.setdefault(depth[node.id], []).append(f"node:{node.id}")
    place: dict[str, tuple[float, float]] = {}
    for column, keys in columns.items():
        for row, key in enumerate(keys):
            place[key] = (PAD + column * (BOX_W + GAP_X), PAD + row * (BOX_H + GAP_Y))
    producing = plan.producer.get(target) if target else None
    boxes = [
        Box(key, "input", "input", key.removeprefix("input:"), "", *place[key], False)
        for key in columns[0]
    ]
    edges = []
    for node in plan.nodes:
        key = f"node:{node.id}"
        x, y = place[key]
        boxes.append(
            Box(key, node_kind(node), node.kind, node.label, ", ".join(node.outputs), x, y,
                node.id == producing)
        )  # fmt: skip
        sources = {f"node:{a}" for a in node.after}
        sources |= {f"input:{a}" for a in node.inputs if a in plan.inputs}
        for source in sorted(sources):
            if source in place:
                sx, sy = place[source]
                edges.append(Edge(_curve(sx + BOX_W, sy + BOX_H / 2, x, y + BOX_H / 2)))
    width = PAD * 2 + max(columns) * (BOX_W + GAP_X) + BOX_W
    rows = max(len(keys) for keys in columns.values())
    height = PAD * 2 + rows * (BOX_H + GAP_Y) - GAP_Y
    kinds = tuple(dict.fromkeys(box.kind for box in boxes))
    return Lineage(tuple(boxes), tuple(edges), width, height, kinds)


def _curve(x1: float, y1: float, x2: float, y2: float) -> str:
    middle = (x1 + x2) / 2
    return f"M{x1:.1f},{y1:.1f} C{middle:.1f},{y1:.1f} {middle:.1f},{y2:.1f} {x2:.1f},{y2:.1f}"
