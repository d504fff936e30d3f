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

PlanKey = tuple[frozenset[str], tuple[str, ...], str]


class Planner:
    """Builds plans and keeps them, keyed by input and output names and the mode (once
    `cache_size` are kept, the oldest is dropped first)."""

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

    def plan(self, inputs: Iterable[str], outputs: Iterable[str], mode: str = "online") -> Plan:
        """The plan for input and output column names (cached). `mode="offline"` prefers
        @offline resolvers where a feature has one."""
        key = (frozenset(inputs), tuple(outputs), mode)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        plan = self.build(sorted(key[0]), key[1], mode)
        with self._lock:
            self._cache[key] = plan
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return plan

    def build(self, inputs: Iterable[str], outputs: Iterable[str], mode: str = "online") -> Plan:
        """Run the passes: bind names, choose producers, order them into a DAG."""
        query = bind_query(self.graph, inputs, outputs)
        resolution = resolve(self.graph, self.resolvers, query, mode)
        return order(resolution, self.default_timeout)
