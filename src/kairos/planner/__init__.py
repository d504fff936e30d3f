"""The planner turns (inputs, outputs) into an immutable plan DAG; see `Planner`."""

from kairos.planner.plan import (
    Column,
    DefaultNode,
    EventsNode,
    ExpressionNode,
    Plan,
    PlanNode,
    RelationNode,
    ResolverNode,
    WindowNode,
)
from kairos.planner.planner import Planner

__all__ = [
    "Column",
    "DefaultNode",
    "EventsNode",
    "ExpressionNode",
    "Plan",
    "PlanNode",
    "Planner",
    "RelationNode",
    "ResolverNode",
    "WindowNode",
]
