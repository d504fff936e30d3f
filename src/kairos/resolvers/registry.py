"""A project's resolvers checked against its graph and indexed by the features they produce."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from kairos.definitions import expressions as ex
from kairos.definitions.binding import bind_rows_items
from kairos.definitions.feature import Feature, FeatureRef, class_spec, field_of
from kairos.definitions.graph import FeatureInfo, Graph
from kairos.definitions.types import DataFrameSpec
from kairos.errors import DefinitionError, KairosError, did_you_mean
from kairos.resolvers.calls import Made
from kairos.resolvers.python import PythonRunner, Resolver
from kairos.resolvers.sql import SqlPlan, SqlResolver, SqlRunner, batch_text


@dataclass(frozen=True, slots=True)
class BoundInput:
    """A resolver parameter checked against the graph."""

    name: str
    ref: FeatureRef | None  # None for Now; otherwise rooted at the resolver's namespace
    info: FeatureInfo | None
    filters: tuple[ex.Expr, ...] = ()
    projections: tuple[ex.Expr, ...] = ()
    columns: tuple[str, ...] = ()


class Runner(Protocol):
    """Runs a resolver for a batch of entities: `calls[i]` are the arguments for entity i, and
    `results[i]` is set to (True, value) or (False, exception) as each finishes; `made` is
    told of each model or LLM call, with the entities it computed, as it finishes."""

    async def run(
        self,
        calls: list[list[Any]],
        results: list[tuple[bool, Any] | None],
        pool: Executor,
        made: Made,
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class BoundResolver:
    resolver: Resolver[..., Any] | SqlResolver
    namespace: str
    inputs: tuple[BoundInput, ...]
    outputs: tuple[str, ...]  # feature names in `namespace`
    shape: str  # one | many | rows
    runner: Runner
    kind: str = "python"  # python | sql | model

    @property
    def prepare(self) -> Callable[[], Awaitable[None]] | None:
        """What the engine awaits before the call's timeout starts (a model's first load)."""
        return getattr(self.resolver, "prepare", None)

    @property
    def name(self) -> str:
        return self.resolver.name

    @property
    def timeout(self) -> timedelta | None:
        return self.resolver.timeout

    @property
    def version(self) -> str:
        """A short hash of the resolver's code, recorded in the query log."""
        return self.resolver.version


class ResolverSet:
    """Every resolver of a project, bound, and an index from feature to its producers."""

    def __init__(self, resolvers: tuple[BoundResolver, ...]) -> None:
        self.resolvers = resolvers
        index: dict[tuple[str, str], list[BoundResolver]] = {}
        for bound in resolvers:
            for output in bound.outputs:
                index.setdefault((bound.namespace, output), []).append(bound)
        self._index: Mapping[tuple[str, str], tuple[BoundResolver, ...]] = {
            key: tuple(value) for key, value in index.items()
        }

    @classmethod
    def build(
        cls,
        graph: Graph,
        resolvers: Iterable[Resolver[..., Any] | SqlResolver],
        sources: Mapping[str, Any] | None = None,
    ) -> ResolverSet:
        bound: list[BoundResolver] = []
        names: dict[str, Resolver[..., Any] | SqlResolver] = {}
        for resolver in resolvers:
            other = names.get(resolver.name)
            if other is not None and other is not resolver:
                raise DefinitionError(
                    f"two resolvers are named {resolver.name!r} ({other.where} and "
                    f"{resolver.where}); rename one or pass @online(name=...)"
                )
            names[resolver.name] = resolver
            if isinstance(resolver, SqlResolver):
                bound.append(bind_sql(graph, resolver, sources or {}))
            else:
                bound.append(_bind(graph, resolver))
        return cls(tuple(bound))

    def producers(
        self, namespace: str, name: str, kind: str = "online"
    ) -> tuple[BoundResolver, ...]:
        return tuple(r for r in self._index.get((namespace, name), ()) if r.resolver.kind == kind)


def _bind(graph: Graph, resolver: Resolver[..., Any]) -> BoundResolver:
    where = f"resolver {resolver.name!r} ({resolver.where})"
    try:
        signature = resolver.signature
        roots = {p.ref.root for p in signature.parameters if p.ref is not None}
        outputs: list[str] = []
        namespace: str | None = None
        for output in signature.outputs:
            if isinstance(output, FeatureRef):
                graph.feature(output.root, output.name)
                outputs.append(
                    output.name if not output.window else f"{output.name}[{output.window}]"
                )
                namespace = namespace or output.root
                if output.root != namespace:
                    raise DefinitionError(f"{where}: outputs must all belong to one class")
        if signature.shape == "rows":
            spec = signature.outputs[0]
            namespace = _rows_namespace(graph, where, roots)
            outputs = [_has_many_for(graph, where, namespace, spec)]
        if namespace is None:
            raise DefinitionError(f"{where}: it declares no output")
        if roots - {namespace}:
            raise DefinitionError(
                f"{where}: inputs ({', '.join(sorted(roots))}) and outputs ({namespace}) must "
                f"start from the same class; reach other classes through relations, "
                f"e.g. Transaction.user.name"
            )
        if signature.shape == "one" and graph.feature(namespace, outputs[0]).kind == "has_many":
            signature_shape = "rows"
        else:
            signature_shape = signature.shape
        inputs = tuple(_bind_input(graph, where, p) for p in signature.parameters)
        for output in outputs:
            info = graph.feature(namespace, output)
            if info.expression is not None:
                raise DefinitionError(
                    f"{where}: {info.fqn} is defined by an expression; remove the expression "
                    "or the resolver"
                )
        return BoundResolver(
            resolver,
            namespace,
            inputs,
            tuple(outputs),
            signature_shape,
            PythonRunner(resolver),
            getattr(resolver, "node_kind", "python"),  # "model" for kr.predict features
        )
    except DefinitionError:
        raise
    except KairosError as error:
        raise DefinitionError(f"{where}: {error}") from None


def _bind_input(graph: Graph, where: str, param: Any) -> BoundInput:
    if param.ref is None:
        return BoundInput(param.name, None, None)
    _, info = graph.walk(param.ref)
    if param.items and info.kind != "has_many":
        raise DefinitionError(f"{where}: {param.ref.fqn}[...] is only for has-many features")
    if info.kind == "has_one":
        raise DefinitionError(
            f"{where}: parameter {param.name!r} is the relation {param.ref.fqn}; "
            f"ask for one of its features, e.g. {param.ref.fqn}.id"
        )
    if info.kind == "has_many" and info.target is not None:
        filters, projections, columns = bind_rows_items(
            graph, info.target, param.items, f"{where} parameter {param.name!r}"
        )
        return BoundInput(param.name, param.ref, info, filters, projections, columns)
    return BoundInput(param.name, param.ref, info)


def _rows_namespace(graph: Graph, where: str, roots: set[str]) -> str:
    if len(roots) != 1:
        raise DefinitionError(
            f"{where}: a resolver returning DataFrame[...] takes the parent's key, "
            "e.g. (uid: User.id) -> DataFrame[Transaction]"
        )
    return next(iter(roots))


def _has_many_for(graph: Graph, where: str, namespace: str, spec: DataFrameSpec) -> str:
    first = spec.items[0] if spec.items else None
    target = class_spec(field_of(first).owner_class if isinstance(first, Feature) else first)
    if target is None:
        raise DefinitionError(f"{where}: DataFrame[...] needs a feature class")
    matches = [
        name
        for name, info in graph.cls(namespace).features.items()
        if info.kind == "has_many" and info.target == target.namespace
    ]
    if len(matches) != 1:
        raise DefinitionError(
            f"{where}: {namespace} has "
            + (
                f"no has-many feature of {target.cls.__name__}; declare one, e.g. "
                f"`{target.namespace}s: DataFrame[{target.cls.__name__}]`"
                if not matches
                else f"several has-many features of {target.cls.__name__} ({', '.join(matches)})"
                f"; return one of them by name, e.g. -> {namespace}.{matches[0]}"
            )
        )
    return matches[0]


def bind_sql(graph: Graph, resolver: SqlResolver, sources: Mapping[str, Any]) -> BoundResolver:
    """Check a `.sql` resolver against the graph and its source; decide how it batches."""
    where = f"sql resolver {resolver.name!r} ({resolver.where})"
    info = _resolved_class(graph, where, resolver.resolves)
    source = _source_for(where, resolver.source, sources)
    statement = resolver.read(source.dialect)  # a DefinitionError if it cannot be parsed
    if statement.columns is None:
        raise DefinitionError(
            f"{where}: name every selected column, aliasing expressions with `as` "
            "(e.g. `count(*) as txn_count`); `select *` cannot be planned"
        )
    features = info.features
    lowered = {name.lower(): name for name in features}
    columns: dict[str, str] = {}
    for column in statement.columns:
        name = lowered.get(column.lower())
        if name is None or features[name].kind != "scalar":
            raise DefinitionError(
                f"{where}: column {column!r} is not a feature of {info.namespace}"
                f"{did_you_mean(column, features)}; alias it to one with `as`"
            )
        if features[name].expression is not None:
            raise DefinitionError(
                f"{where}: {info.namespace}.{name} is defined by an expression; drop the column"
            )
        columns[column] = name
    params = tuple(dict.fromkeys(statement.text.params))
    keys = []
    for param in params:
        if param == "now":
            continue
        feature = features.get(param)
        if feature is None or feature.kind != "scalar":
            raise DefinitionError(
                f"{where}: parameter :{param} is not a feature of {info.namespace}"
                f"{did_you_mean(param, features)}; parameters name features (or :now)"
            )
        if feature.is_primary or feature.fk_target is not None:
            keys.append(param)
    if len(keys) != 1:
        raise DefinitionError(
            f"{where}: compare exactly one key parameter, the primary key (`where "
            f"{info.primary} = :{info.primary}`) or a foreign key (`where user_id = :user_id`); "
            f"found {', '.join(':' + k for k in keys) or 'none'}"
        )
    key = keys[0]
    key_info = features[key]
    selected = set(columns.values())
    if key_info.is_primary:
        namespace = info.namespace
        inputs = tuple(
            BoundInput(p, None, None)
            if p == "now"
            else BoundInput(p, FeatureRef(namespace, (), p), features[p])
            for p in params
        )
        outputs = tuple(dict.fromkeys(n for n in columns.values() if n not in params))
        if not outputs:
            raise DefinitionError(f"{where}: it selects no feature besides its inputs")
        rows = False
        shape = "many"
    else:
        parent_ns, parent_key = key_info.fk_target
        namespace = parent_ns
        extra = [p for p in params if p not in (key, "now")]
        if extra:
            raise DefinitionError(
                f"{where}: a resolver filling a has-many feature takes only :{key} and :now; "
                f"remove {', '.join(':' + p for p in extra)}"
            )
        has_many = [
            name
            for name, feat in graph.cls(parent_ns).features.items()
            if feat.kind == "has_many" and feat.target == info.namespace and feat.join_key == key
        ]
        if len(has_many) != 1:
            raise DefinitionError(
                f"{where}: {parent_ns} has no has-many feature of {info.namespace} joined on "
                f"{key}; declare one, e.g. `{info.namespace}s: DataFrame[{info.cls.__name__}]`"
            )
        inputs = tuple(
            BoundInput(p, None, None)
            if p == "now"
            else BoundInput(
                p, FeatureRef(parent_ns, (), parent_key), graph.feature(parent_ns, parent_key)
            )
            for p in params
        )
        outputs = (has_many[0],)
        rows = True
        shape = "rows"
    key_column = (
        next((c for c, n in columns.items() if n == key), None) if key in selected else None
    )
    rewritten = batch_text(statement.text, key, source.dialect) if key_column else None
    plan = SqlPlan(
        resolver,
        key,
        key_column if rewritten else None,
        rows,
        params,
        rewritten[0] if rewritten else None,
        columns,
    )
    return BoundResolver(
        resolver, namespace, inputs, outputs, shape, SqlRunner(plan, source), "sql"
    )


def _resolved_class(graph: Graph, where: str, name: str) -> Any:
    for info in graph.classes.values():
        if name in (info.cls.__name__, info.namespace):
            return info
    names = [info.cls.__name__ for info in graph.classes.values()]
    raise DefinitionError(
        f"{where}: `-- resolves: {name}` names no feature class{did_you_mean(name, names)}"
    )


def _source_for(where: str, name: str | None, sources: Mapping[str, Any]) -> Any:
    if name is None:
        if len(sources) == 1:
            return next(iter(sources.values()))
        raise DefinitionError(
            f"{where}: add `-- source: NAME` (configured sources: {', '.join(sources) or 'none'})"
        )
    try:
        return sources[name]
    except KeyError:
        raise DefinitionError(
            f"{where}: source {name!r} is not configured in kairos.yaml"
            f"{did_you_mean(name, sources)}; configured: {', '.join(sources) or 'none'}"
        ) from None
