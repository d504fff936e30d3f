"""A project's resolvers checked against its graph and indexed by the features they produce."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kairos.definitions import expressions as ex
from kairos.definitions.binding import bind_rows_items
from kairos.definitions.feature import Feature, FeatureRef, class_spec, field_of
from kairos.definitions.graph import FeatureInfo, Graph
from kairos.definitions.types import DataFrameSpec
from kairos.errors import DefinitionError, KairosError
from kairos.resolvers.python import Resolver


@dataclass(frozen=True, slots=True)
class BoundInput:
    """A resolver parameter checked against the graph."""

    name: str
    ref: FeatureRef | None  # None for Now; otherwise rooted at the resolver's namespace
    info: FeatureInfo | None
    filters: tuple[ex.Expr, ...] = ()
    projections: tuple[ex.Expr, ...] = ()
    columns: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BoundResolver:
    resolver: Resolver[..., Any]
    namespace: str
    inputs: tuple[BoundInput, ...]
    outputs: tuple[str, ...]  # feature names in `namespace`
    shape: str  # one | many | rows

    @property
    def name(self) -> str:
        return self.resolver.name

    @property
    def timeout(self) -> timedelta | None:
        return self.resolver.timeout


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
    def build(cls, graph: Graph, resolvers: Iterable[Resolver[..., Any]]) -> ResolverSet:
        bound: list[BoundResolver] = []
        names: dict[str, Resolver[..., Any]] = {}
        for resolver in resolvers:
            other = names.get(resolver.name)
            if other is not None and other is not resolver:
                raise DefinitionError(
                    f"two resolvers are named {resolver.name!r} ({other.where} and "
                    f"{resolver.where}); rename one or pass @online(name=...)"
                )
            names[resolver.name] = resolver
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
        return BoundResolver(resolver, namespace, inputs, tuple(outputs), signature_shape)
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
