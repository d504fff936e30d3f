"""The planner: (inputs, outputs) -> Plan, through an ordered tuple of pure passes, cached."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from datetime import timedelta

from kairos.definitions.graph import Graph
from kairos.planner.bind import bind_query
from kairos.planner.order import order
from kairos.planner.plan import Plan
from kairos.planner.resolve import resolve
from kairos.resolvers.registry import ResolverSet

PlanKey = tuple[frozenset[str], tuple[str, ...]]


class Planner:
    """Builds plans and keeps the most recent ones, keyed by input and output names."""

    def __init__(
        self,
        graph: Graph,
        resolvers: ResolverSet,
        *,
        default_timeout: timedelta = timedelta(seconds=10),
        cache_size: int = 4096,
    ) -> None:
        self.graph = graph
        self.resolvers = resolvers
        self.default_timeout = default_timeout
        self.cache_size = cache_size
        self._cache: OrderedDict[PlanKey, Plan] = OrderedDict()
        self._lock = threading.Lock()

    def plan(self, inputs: Iterable[str], outputs: Iterable[str]) -> Plan:
        """The plan for input and output column names (cached)."""
        key = (frozenset(inputs), tuple(outputs))
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        plan = self.build(sorted(key[0]), key[1])
        with self._lock:
            self._cache[key] = plan
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return plan

    def build(self, inputs: Iterable[str], outputs: Iterable[str]) -> Plan:
        """Run the passes: bind names, choose producers, order them into a DAG."""
        query = bind_query(self.graph, inputs, outputs)
        resolution = resolve(self.graph, self.resolvers, query)
        return order(resolution, self.default_timeout)
