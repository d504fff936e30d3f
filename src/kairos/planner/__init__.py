"""The planner turns (inputs, outputs) into an immutable plan DAG; see `Planner`."""

from kairos.planner.plan import Column, Plan, PlanNode
from kairos.planner.planner import Planner

__all__ = ["Column", "Plan", "PlanNode", "Planner"]
