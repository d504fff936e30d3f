"""Pass 2: choose what produces each column, walking back from the outputs.

For every column the first that applies wins: a value the caller supplied; a primary key
reached through a relation (copied from the foreign key); the feature's expression; the one
online resolver whose inputs can themselves be produced; the feature's default. No producer,
two producers, or a loop is an error naming the features involved and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kairos.definitions.binding import BoundExpression, bind_feature
from kairos.definitions.feature import MISSING, FeatureRef
from kairos.definitions.graph import Graph
from kairos.definitions.windows import indexed_window
from kairos.errors import AmbiguousResolvers, CycleError, MissingInput, NoPath, PlanError
from kairos.planner.bind import BoundQuery
from kairos.planner.plan import Column, column_name
from kairos.resolvers.registry import BoundResolver, ResolverSet


@dataclass(frozen=True, slots=True)
class Producer:
    """How one column is made (before nodes are numbered and ordered)."""

    kind: str  # input | relation | expression | resolver | default
    column: Column
    args: tuple[str | None, ...] = ()
    resolver: BoundResolver | None = None
    expression: BoundExpression | None = None


@dataclass
class Resolution:
    root: str
    query: BoundQuery
    producers: dict[str, Producer] = field(default_factory=dict)
    columns: dict[str, Column] = field(default_factory=dict)


def resolve(
    graph: Graph, resolvers: ResolverSet, query: BoundQuery, mode: str = "online"
) -> Resolution:
    return _Resolver(graph, resolvers, query, mode).run()


class _Resolver:
    def __init__(
        self, graph: Graph, resolvers: ResolverSet, query: BoundQuery, mode: str = "online"
    ) -> None:
        self.mode = mode
        self.graph = graph
        self.resolvers = resolvers
        self.query = query
        self.supplied = {c.name for c in query.inputs}
        self.done: dict[str, Producer] = {}
        self.columns: dict[str, Column] = {c.name: c for c in (*query.inputs, *query.outputs)}
        self.stack: list[str] = []

    def run(self) -> Resolution:
        for column in self.query.inputs:
            self.done[column.name] = Producer("input", column)
        for column in self.query.outputs:
            self.produce(column)
        # The entity key of every computed column lets the engine cache it and skip absent
        # entities; it is optional where it cannot be reached (e.g. only derived inputs given).
        for producer in list(self.done.values()):
            if producer.kind in ("resolver", "expression", "default", "events", "window"):
                key = self.key_column(producer.column.path)
                if key.name not in self.done:
                    try:
                        self.produce(key)
                    except PlanError:
                        if producer.column.path:
                            raise
        return Resolution(self.query.root, self.query, self.done, self.columns)

    # --- columns ---------------------------------------------------------------------------

    def column(self, path: tuple[str, ...], ref: FeatureRef) -> Column:
        """The column for `ref` (relative to the entity at `path`) seen from the query root."""
        full = FeatureRef(self.query.root, (*path, *ref.path), ref.name, ref.window)
        _, info = self.graph.walk(full)
        name = column_name(self.query.root, full.path, info.name)
        return self.columns.setdefault(name, Column(name, full.path, info))

    def key_column(self, path: tuple[str, ...]) -> Column:
        namespace = self.graph.namespace_at(self.query.root, path)
        primary = self.graph.cls(namespace).primary
        return self.column(path, FeatureRef(namespace, (), primary))

    # --- producers -------------------------------------------------------------------------

    def produce(self, column: Column) -> Producer:
        found = self.done.get(column.name)
        if found is not None:
            return found
        if column.name in self.stack:
            loop = [*self.stack[self.stack.index(column.name) :], column.name]
            raise CycleError(
                f"features depend on each other in a loop: {' -> '.join(loop)}; pass one of "
                "them as an input or change a resolver so the loop is broken"
            )
        self.stack.append(column.name)
        try:
            producer = self.choose(column)
        finally:
            self.stack.pop()
        self.done[column.name] = producer
        return producer

    def choose(self, column: Column) -> Producer:
        info = column.info
        if column.path and info.is_primary:
            *parent, relation = column.path
            parent_path = tuple(parent)
            parent_ns = self.key_column(parent_path).namespace
            join_key = self.graph.feature(parent_ns, relation).join_key
            if join_key is not None:
                fk = self.column(parent_path, FeatureRef(parent_ns, (), join_key))
                self.produce(fk)
                return Producer("relation", column, (fk.name,))
        events = info.target and self.graph.cls(info.target).events and info.nearest is None
        if info.kind == "has_many" and events:
            key = self.key_column(column.path)  # events written to kairos: no resolver
            self.produce(key)
            return Producer("events", column, (key.name,))
        if indexed_window(self.graph, info.namespace, info.name) is not None:
            key = self.key_column(column.path)  # answered from the event index
            self.produce(key)
            bound = bind_feature(self.graph, info.namespace, info.name)
            return Producer("window", column, (key.name,), expression=bound)
        if info.expression is not None:
            bound = bind_feature(self.graph, info.namespace, info.name)
            args = tuple(self.column(column.path, dep) for dep in bound.deps)
            for arg in args:
                self.produce(arg)
            return Producer("expression", column, tuple(a.name for a in args), expression=bound)
        candidates = self.resolvers.producers(info.namespace, info.name)
        if self.mode == "offline":
            # offline queries prefer a feature's @offline resolvers, and fall back to online ones
            offline = self.resolvers.producers(info.namespace, info.name, "offline")
            candidates = offline or candidates
        chosen: list[tuple[BoundResolver, tuple[str | None, ...]]] = []
        failures: list[PlanError] = []
        for candidate in candidates:
            try:
                chosen.append((candidate, self.resolver_args(column.path, candidate)))
            except CycleError:
                raise
            except PlanError as error:
                failures.append(error)
        if len(chosen) > 1:
            names = ", ".join(repr(c.name) for c, _ in chosen)
            raise AmbiguousResolvers(
                f"{column.name} can be computed by several resolvers ({names}) from these "
                "inputs; remove one, or give them different inputs"
            )
        if chosen:
            resolver, resolver_args = chosen[0]
            for output in resolver.outputs:  # siblings come from the same call
                self.column(column.path, FeatureRef(resolver.namespace, (), output))
            return Producer("resolver", column, resolver_args, resolver=resolver)
        if info.default is not MISSING:
            return Producer("default", column)
        raise self.no_path(column, candidates, failures)

    def resolver_args(
        self, path: tuple[str, ...], resolver: BoundResolver
    ) -> tuple[str | None, ...]:
        args: list[str | None] = []
        for param in resolver.inputs:
            if param.ref is None:
                args.append(None)
                continue
            arg = self.column(path, param.ref)
            self.produce(arg)
            args.append(arg.name)
        return tuple(args)

    def no_path(
        self, column: Column, candidates: tuple[BoundResolver, ...], failures: list[PlanError]
    ) -> PlanError:
        if column.info.is_primary and not column.path:
            return MissingInput(
                f"the query needs {column.name!r} in its input (it is the primary key of "
                f"{column.namespace!r}); pass input={{{column.name!r}: ...}}"
            )
        if failures and all(isinstance(f, MissingInput) for f in failures):
            return failures[0]  # the real fix is the key to pass, however deep the need
        if candidates and failures:
            reasons = "; ".join(str(f) for f in failures)
            return NoPath(
                f"cannot compute {column.name!r}: "
                + ", ".join(repr(c.name) for c in candidates)
                + f" could, but not from these inputs ({reasons})"
            )
        return NoPath(
            f"nothing computes {column.name!r}: no resolver, expression or default produces "
            f"{column.info.fqn}; add an @online resolver that returns it, or pass it as an input"
        )
