"""The online engine: run a plan for one entity or a batch.

A run has four steps:
1. probe: one online-store read for every cacheable column whose entity key is known;
2. demand: walk back from the outputs, skipping columns the cache already answers;
3. execute: start every needed node as a task that waits only for the nodes it reads from,
   so independent nodes run concurrently (sync user code in a thread pool), each under its
   timeout; a failure nulls only what depends on it, with a per-feature error;
4. write back: one store write for every freshly computed cacheable value.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kairos import telemetry
from kairos.definitions.binding import BoundExpression
from kairos.definitions.graph import Graph
from kairos.definitions.types import DataFrame, ValueType
from kairos.engine.evaluate import Compiled, compile_expression
from kairos.engine.resolving import call_resolver, values_by_name
from kairos.engine.result import ColumnData, FeatureError, NodeTiming
from kairos.engine.rows import Selection, compile_selection, normalize_rows, select_rows
from kairos.engine.scheduling import run_in_order
from kairos.engine.tracing import traced_node, traced_store
from kairos.engine.values import check
from kairos.engine.windows import WindowIndex, Windows
from kairos.errors import InvalidValue
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
from kairos.resolvers.calls import Calls
from kairos.resolvers.raised import resolver_failure
from kairos.resolvers.registry import BoundInput
from kairos.stores.online import OnlineStore, StoredValue, StoreKey

ZERO = timedelta(0)
ANY = ValueType("any", True)
# How far ahead of the wall clock a query's `now` may be and still write the cache.
FUTURE_SKEW = timedelta(seconds=5)
logger = logging.getLogger(__name__)


@dataclass
class RunOutcome:
    columns: dict[str, ColumnData]
    trace: list[NodeTiming]
    cache_hits: int
    computed: int
    # (namespace, feature, value type, key type, key, observed_at, value) of computed values
    observed: list[tuple[Any, ...]]
    # every column the run read or produced (inputs, cache reads, intermediates, outputs):
    # what the decision record keeps
    values: dict[str, ColumnData]
    # every model and LLM call the run made, pinned to the rows it computed
    calls: Calls


class Engine:
    """Runs plans against one online store, with one thread pool for sync user code."""

    def __init__(
        self,
        graph: Graph,
        store: OnlineStore,
        pool: ThreadPoolExecutor,
        *,
        observe: bool = False,
        windows: Windows | None = None,
    ) -> None:
        self.graph = graph
        self.store = store
        self.pool = pool
        self.windows: Windows = windows or WindowIndex()  # events written to kairos, and aggregates
        self.observe = observe  # collect computed values for the offline store
        self._compiled: dict[tuple[str, str], Compiled] = {}
        self._inputs: dict[tuple[str, str], Selection] = {}

    def compiled(self, bound: BoundExpression, column: str) -> Compiled:
        key = (bound.namespace, column)
        found = self._compiled.get(key)
        if found is None:
            found = self._compiled[key] = compile_expression(bound.tree)
        return found

    def compiled_input(self, param: BoundInput) -> Selection:
        """Filters and projections of a has-many resolver input, compiled once."""
        key = ("input", str(id(param)))
        found = self._inputs.get(key)
        if found is None:
            found = self._inputs[key] = compile_selection(
                param.filters, param.projections, param.columns
            )
        return found

    async def run(
        self,
        plan: Plan,
        inputs: dict[str, list[Any]],
        rows: int,
        now: datetime,
        staleness: dict[str, timedelta],
        *,
        row_times: list[datetime] | None = None,
    ) -> RunOutcome:
        """Run `plan` for `rows` entities as of `now`. With `row_times` each row has its own
        `now` (an offline query recomputing history): the online store is neither read nor
        written, since a cached value belongs to one moment."""
        run = _Run(self, plan, rows, now, staleness, row_times)
        run.load(inputs)
        await run.probe()
        needed = run.demand()
        if needed:
            await run.execute(needed)
        await run.write_back()
        return RunOutcome(
            {name: _plain(run.cols[name]) for name in plan.outputs},
            run.trace,
            run.hits,
            run.computed,
            run.observed,
            run.cols,
            run.calls,
        )


class _Run:
    def __init__(
        self,
        engine: Engine,
        plan: Plan,
        rows: int,
        now: datetime,
        staleness: dict[str, timedelta],
        row_times: list[datetime] | None = None,
    ) -> None:
        self.engine = engine
        self.plan = plan
        self.n = rows
        self.now = now
        self.nows = row_times if row_times is not None else [now] * rows
        self.use_cache = row_times is None
        self.present = now <= datetime.now(UTC) + FUTURE_SKEW
        self.staleness = staleness
        self.cols: dict[str, ColumnData] = {}
        self.cached: dict[str, list[StoredValue | None]] = {}
        self.demanded: set[str] = set()
        self.trace: list[NodeTiming] = []
        self.started = time.perf_counter()
        self.hits = 0
        self.computed = 0
        self.fresh: list[tuple[StoreKey, StoredValue]] = []
        self.observed: list[tuple[Any, ...]] = []
        self.calls = Calls()

    # --- helpers ------------------------------------------------------------------------

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000

    def max_staleness(self, column: str) -> timedelta:
        override = self.staleness.get(column)
        return override if override is not None else self.plan.columns[column].info.max_staleness

    def keys(self, node: PlanNode | None) -> list[Any] | None:
        """Primary keys of the entities a node computes for, once they are known."""
        if node is None or node.key is None:
            return None
        column = self.cols.get(node.key)
        return column.values if column is not None else None

    def is_fresh(self, stored: StoredValue | None, column: str) -> bool:
        """Served from the cache: observed by `now`, within max_staleness, and younger than
        the feature's ttl (the same rule as an offline read at `ts = now`)."""
        if stored is None or stored.observed_at > self.now:
            return False
        age = self.now - stored.observed_at
        ttl = self.plan.columns[column].info.ttl
        return age <= self.max_staleness(column) and (ttl is None or age < ttl)

    def cacheable(self, node: PlanNode) -> list[str]:
        if not self.use_cache or node.key is None or not node.CACHED:
            return []
        return [c for c in node.outputs if self.max_staleness(c) > ZERO]

    def timed(
        self, node: PlanNode | None, kind: str, label: str, start: float, rows: int, status: str
    ) -> None:
        self.trace.append(
            NodeTiming(
                node.id if node else None,
                kind,
                label,
                start,
                self.elapsed_ms() - start,
                rows,
                status,
            )
        )

    # --- 1. inputs and cache probe --------------------------------------------------------

    def load(self, inputs: dict[str, list[Any]]) -> None:
        for name, values in inputs.items():
            self.cols[name] = ColumnData(
                values, list(self.nows), ["input"] * self.n, [None] * self.n
            )

    async def probe(self) -> None:
        """Read every cacheable column whose entity key was given, in one store call."""
        wanted: list[tuple[str, int]] = []
        keys: list[StoreKey] = []
        for node in self.plan.nodes:
            if self.keys(node) is not None:
                columns = [c for c in self.cacheable(node) if c not in self.cols]
                self.cache_requests(node, columns, wanted, keys)
        if keys:
            await self.read_cache(None, "online store read", wanted, keys)

    def cache_requests(
        self,
        node: PlanNode,
        columns: list[str],
        wanted: list[tuple[str, int]],
        keys: list[StoreKey],
    ) -> None:
        """Add a store key per (column, row) of `node` whose entity key is known."""
        key_values = self.keys(node) or []
        for column in columns:
            feature = self.plan.columns[column].info.name
            for row, key in enumerate(key_values):
                if key is not None:
                    wanted.append((column, row))
                    keys.append((node.namespace, _hashable(key), feature))

    async def read_cache(
        self, node: PlanNode | None, label: str, wanted: list[tuple[str, int]], keys: list[StoreKey]
    ) -> None:
        """One store read; an unreachable or failing store is a miss, never a failed query."""
        start = self.elapsed_ms()
        try:
            reading = self.engine.store.get(keys)
            found = await (
                reading if telemetry.TRACER is None else traced_store("get", len(keys), reading)
            )
        except Exception as error:  # the cache is an optimization: compute instead
            logger.warning("online store read failed, computing instead: %s", error)
            self.timed(node, "cache", label, start, len(keys), "error")
            return
        for (column, row), stored in zip(wanted, found, strict=True):
            if self.is_fresh(stored, column):
                self.cached.setdefault(column, [None] * self.n)[row] = stored
        self.timed(node, "cache", label, start, len(keys), "ok")

    # --- 2. demand ----------------------------------------------------------------------

    def answered_by_cache(self, column: str) -> bool:
        cached = self.cached.get(column)
        if cached is None:
            return False
        node = self.plan.node(column)
        key_values = self.keys(node)
        return all(
            stored is not None or (key_values is not None and key_values[row] is None)
            for row, stored in enumerate(cached)
        )

    def demand(self) -> list[PlanNode]:
        needed: set[int] = set()
        stack = list(self.plan.outputs)
        while stack:
            column = stack.pop()
            if column in self.demanded:
                continue
            self.demanded.add(column)
            if column in self.cols:
                continue
            if self.answered_by_cache(column):
                self.cols[column] = self.from_cache(column, ColumnData.empty(self.n))
                continue
            node = self.plan.node(column)
            if node is None:  # pragma: no cover - the planner guarantees a producer
                raise RuntimeError(f"no producer for {column}")
            if node.id not in needed:
                needed.add(node.id)
                stack.extend(node.inputs)
                if node.key:
                    stack.append(node.key)
        return [node for node in self.plan.nodes if node.id in needed]

    def from_cache(self, column: str, data: ColumnData) -> ColumnData:
        for row, stored in enumerate(self.cached.get(column, ())):
            if stored is not None:
                data.values[row] = stored.value
                data.observed_at[row] = stored.observed_at
                data.source[row] = "cache"
                data.errors[row] = None
                self.hits += 1
        return data

    # --- 3. execute ---------------------------------------------------------------------

    async def execute(self, nodes: list[PlanNode]) -> None:
        """Run every node once the nodes it reads from are done (see `run_in_order`); each
        has its own line in the trace."""
        await run_in_order(nodes, self.runs_inline, self.run_node)

    def runs_inline(self, node: PlanNode) -> bool:
        """Whether a node is pure computation on the loop: no resolver, no index or store."""
        if isinstance(node, RelationNode):
            return True
        if not isinstance(node, ExpressionNode | DefaultNode):
            return False
        if self.keys(node) is None or node.key in self.plan.inputs:
            return True  # no cache probe of its own (see run_node)
        return all(c in self.cached for c in self.cacheable(node))

    async def run_node(self, node: PlanNode) -> None:
        if isinstance(node, RelationNode):  # a copy of the foreign key: nothing to run
            self.cols[node.outputs[0]] = self.cols[node.inputs[0]]
            return
        if self.keys(node) is not None and node.key not in self.plan.inputs:
            await self.probe_node(node)
        outputs = {name: ColumnData.empty(self.n) for name in node.outputs}
        rows = self.rows_to_compute(node, outputs)
        start = self.elapsed_ms()
        if rows:
            work = self.compute(node, rows, outputs)
            status = await (
                work if telemetry.TRACER is None else traced_node(node, len(rows), work)
            )
            self.computed += len(rows)
            self.timed(node, node.kind, node.label, start, len(rows), status)
        for name, data in outputs.items():
            if name in self.plan.inputs or name in self.cols:
                continue  # the caller's value (or the cache's, already counted) wins
            self.cols[name] = self.from_cache(name, data) if name in self.cached else data

    async def compute(self, node: PlanNode, rows: list[int], outputs: dict[str, ColumnData]) -> str:
        """Compute `rows` of a node with the runner of its kind; the status for the trace."""
        match node:
            case DefaultNode():
                return self.run_default(node, rows, outputs)
            case ExpressionNode():
                return self.run_expression(node, rows, outputs)
            case EventsNode():
                return await self.run_events(node, rows, outputs)
            case WindowNode():
                return await self.run_window(node, rows, outputs)
            case ResolverNode():
                return await self.run_resolver(node, rows, outputs)
        raise TypeError(f"no runner for {type(node).__name__}")  # pragma: no cover

    async def probe_node(self, node: PlanNode) -> None:
        """Cache read for an entity reached through a relation (its key is known only now)."""
        wanted: list[tuple[str, int]] = []
        keys: list[StoreKey] = []
        columns = [c for c in self.cacheable(node) if c not in self.cached]
        self.cache_requests(node, columns, wanted, keys)
        if keys:
            await self.read_cache(node, f"online store read ({node.namespace})", wanted, keys)

    def rows_to_compute(self, node: PlanNode, outputs: dict[str, ColumnData]) -> list[int]:
        key_values = self.keys(node)
        wanted = [c for c in node.outputs if c in self.demanded] or list(node.outputs)
        rows: list[int] = []
        for row in range(self.n):
            failed = self.failed_input(node, row)
            if failed is not None:
                for name in node.outputs:
                    outputs[name].errors[row] = FeatureError(
                        name,
                        "upstream_error",
                        f"depends on {failed.feature}, which failed: {failed.message}",
                        row,
                        node.label if isinstance(node, ResolverNode) else None,
                    )
                continue
            if key_values is not None and key_values[row] is None:
                continue  # the entity does not exist (a null foreign key): values stay null
            if all(self.cached.get(c) and self.cached[c][row] is not None for c in wanted):
                continue
            rows.append(row)
        return rows

    def failed_input(self, node: PlanNode, row: int) -> FeatureError | None:
        reads = [*node.inputs, node.key] if node.key is not None else list(node.inputs)
        for arg in reads:
            column = self.cols.get(arg)
            error = column.errors[row] if column is not None else None
            if error is not None:
                return error
        return None

    def set(
        self, outputs: dict[str, ColumnData], column: str, row: int, value: Any, source: str
    ) -> None:
        info = self.plan.columns[column].info
        try:
            value = check(info, value, allow_null=source in ("expression", "window"))
        except InvalidValue as error:
            self.fail(outputs, column, row, "invalid_value", f"{column}: {error}", source)
            return
        data = outputs[column]
        data.values[row] = value
        data.observed_at[row] = self.nows[row]
        data.source[row] = source
        if not self.use_cache or source == "default":
            return
        node = self.plan.node(column)
        key_values = self.keys(node)
        key = key_values[row] if key_values is not None else None
        if key is None or node is None or node.key is None:
            return
        keeps = self.max_staleness_declared(column) or (self.engine.observe and self.present)
        if isinstance(value, DataFrame) and keeps:
            value = value.rows  # has-many rows leave the engine as dicts
        if self.engine.observe and self.present and source != "events":
            # every computed value goes to the offline store (not events' own rows, which
            # kairos already holds, and nothing "observed" at a future `now`)
            key_type = self.plan.columns[node.key].info.type or ANY
            self.observed.append(
                (node.namespace, info.name, info.type or ANY, key_type, key, self.now, value)
            )
        if self.max_staleness_declared(column) and value is not None:
            self.fresh.append(
                ((node.namespace, _hashable(key), info.name), StoredValue(value, self.now))
            )

    def max_staleness_declared(self, column: str) -> bool:
        return self.plan.columns[column].info.max_staleness > ZERO

    def fail(
        self,
        outputs: dict[str, ColumnData],
        column: str,
        row: int,
        code: str,
        message: str,
        resolver: str | None,
    ) -> None:
        outputs[column].errors[row] = FeatureError(column, code, message, row, resolver)

    def run_default(
        self, node: DefaultNode, rows: list[int], outputs: dict[str, ColumnData]
    ) -> str:
        for row in rows:
            self.set(outputs, node.outputs[0], row, node.default, "default")
        return "ok"

    async def run_events(
        self, node: EventsNode, rows: list[int], outputs: dict[str, ColumnData]
    ) -> str:
        """Events written to kairos, from the index."""
        info = self.plan.columns[node.outputs[0]].info
        child, fk = info.target or "", info.join_key or ""
        keys, nows = self.index_keys(node, rows)
        found = await self.engine.windows.event_rows(child, fk, keys, nows)
        return self.from_index(node, rows, outputs, found)

    async def run_window(
        self, node: WindowNode, rows: list[int], outputs: dict[str, ColumnData]
    ) -> str:
        """A windowed aggregate over events written to kairos, from the index."""
        info = self.plan.columns[node.outputs[0]].info
        keys, nows = self.index_keys(node, rows)
        found = await self.engine.windows.values((info.namespace, info.name), keys, nows)
        return self.from_index(node, rows, outputs, found)

    def index_keys(
        self, node: EventsNode | WindowNode, rows: list[int]
    ) -> tuple[list[Any], list[datetime]]:
        keys = self.cols[node.inputs[0]].values
        return [keys[row] for row in rows], [self.nows[row] for row in rows]

    def from_index(
        self,
        node: EventsNode | WindowNode,
        rows: list[int],
        outputs: dict[str, ColumnData],
        found: list[Any],
    ) -> str:
        column = node.outputs[0]
        for row, value in zip(rows, found, strict=True):
            if isinstance(value, Exception):
                self.fail(outputs, column, row, "expression_error",
                          f"{column}: {type(value).__name__}: {value}", None)  # fmt: skip
                continue
            self.set(outputs, column, row, value, node.kind)
        return "ok"  # a failed lookup is an error of its row's feature, not of the node

    def run_expression(
        self, node: ExpressionNode, rows: list[int], outputs: dict[str, ColumnData]
    ) -> str:
        column = node.outputs[0]
        fn = self.engine.compiled(node.expression, column)
        arg_cols = [self.cols[a].values for a in node.args if a is not None]
        status = "ok"
        for row in rows:
            try:
                value = fn([values[row] for values in arg_cols], self.nows[row], None)
            except Exception as error:  # the user's expression on this row's data
                self.fail(
                    outputs,
                    column,
                    row,
                    "expression_error",
                    f"{column}: {type(error).__name__}: {error}",
                    None,
                )
                status = "error"
                continue
            self.set(outputs, column, row, value, "expression")
        return status

    async def run_resolver(
        self, node: ResolverNode, rows: list[int], outputs: dict[str, ColumnData]
    ) -> str:
        arguments = []
        ready = []
        for row in rows:
            try:
                arguments.append(self.arguments(node, row))
                ready.append(row)
            except Exception as error:  # e.g. a has-many filter that cannot compare its values
                for name in node.outputs:
                    self.fail(outputs, name, row, "resolver_error",
                              f"preparing the inputs of {node.label!r} failed: "
                              f"{type(error).__name__}: {error}", node.label)  # fmt: skip
        rows = ready
        results, timed_out = await call_resolver(
            node, arguments, rows, self.engine.pool, self.calls
        )
        status = "timeout" if timed_out else "ok"
        failures: dict[int, str] = {}  # a batch's one exception fails every row: one message
        for index, row in enumerate(rows):
            result = results[index]
            if result is None:
                for name in node.outputs:
                    self.fail(
                        outputs,
                        name,
                        row,
                        "timeout",
                        f"resolver {node.label!r} did not finish within "
                        f"{node.timeout.total_seconds():g}s",
                        node.label,
                    )
                continue
            ok, value = result
            if not ok:
                status = "error" if status == "ok" else status
                if id(value) not in failures:  # the traceback to the log, once
                    failures[id(value)] = resolver_failure(node.label, value)
                for name in node.outputs:
                    self.fail(outputs, name, row, "resolver_error", failures[id(value)], node.label)
                continue
            self.store_result(node, row, value, outputs)
        return status

    def arguments(self, node: ResolverNode, row: int) -> list[Any]:
        args: list[Any] = []
        for param, column in zip(node.resolver.inputs, node.args, strict=True):
            if column is None:
                args.append(self.nows[row])
                continue
            value = self.cols[column].values[row]
            if param.info is not None and param.info.kind == "has_many":
                value = select_rows(value, self.engine.compiled_input(param), self.nows[row])
            args.append(value)
        return args

    def store_result(
        self, node: ResolverNode, row: int, value: Any, outputs: dict[str, ColumnData]
    ) -> None:
        bound = node.resolver
        label = node.label
        if bound.shape == "rows":
            column = node.outputs[0]
            info = self.plan.columns[column].info
            try:
                rows = normalize_rows(self.engine.graph, info, value, self.nows[row])
            except InvalidValue as error:
                self.fail(outputs, column, row, "invalid_value", f"{column}: {error}", label)
                return
            self.set(outputs, column, row, rows, label)
            return
        if bound.shape == "one":
            self.set(outputs, node.outputs[0], row, value, label)
            return
        names = bound.outputs
        by_name = values_by_name(names, value)
        if by_name is None:
            for column in node.outputs:
                self.fail(
                    outputs,
                    column,
                    row,
                    "invalid_value",
                    f"resolver {label!r} must return a tuple of {len(names)} values, a "
                    f"dict or a feature-class instance; got {type(value).__name__}",
                    label,
                )
            return
        for name, column in zip(names, node.outputs, strict=True):
            if name in by_name:
                self.set(outputs, column, row, by_name[name], label)
            else:
                self.fail(
                    outputs,
                    column,
                    row,
                    "missing",
                    f"resolver {label!r} returned no value for {name!r}",
                    label,
                )

    # --- 4. write back --------------------------------------------------------------------

    async def write_back(self) -> None:
        if not self.fresh:
            return
        if not self.present:
            # A value "observed" in the future would outrank every real one until then.
            return
        start = self.elapsed_ms()
        try:
            writing = self.engine.store.put(self.fresh)
            await (
                writing
                if telemetry.TRACER is None
                else traced_store("put", len(self.fresh), writing)
            )
        except Exception as error:  # the answer is computed; failing to cache it is not fatal
            logger.warning("online store write failed; values stay uncached: %s", error)
            self.timed(None, "cache", "online store write", start, len(self.fresh), "error")
            return
        self.timed(None, "cache", "online store write", start, len(self.fresh), "ok")


def _plain(column: ColumnData) -> ColumnData:
    """An output column with has-many rows as lists of dicts, as callers have always had."""
    if not any(isinstance(v, DataFrame) for v in column.values):
        return column
    values = [v.rows if isinstance(v, DataFrame) else v for v in column.values]
    return ColumnData(values, column.observed_at, column.source, column.errors)


def _hashable(key: Any) -> Hashable:
    return key if isinstance(key, Hashable) else repr(key)
