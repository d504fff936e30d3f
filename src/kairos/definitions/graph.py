"""The graph of a project's feature classes: types, keys, relations and bound expressions.

`Graph.build([User, Transaction])` reads what `@features` recorded, evaluates annotations (so
forward references such as `"User.id"` work), and checks everything once, when a project loads.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import re
import sys
import tokenize
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from kairos.definitions import expressions as ex
from kairos.definitions.binding import check_expressions
from kairos.definitions.feature import (
    MISSING,
    Feature,
    FeatureClassSpec,
    FeatureRef,
    ForeignKey,
    class_spec,
    field_of,
    ref_of,
    window_name,
)
from kairos.definitions.nearest import NearestOptions, NearestSearch, bind_nearest
from kairos.definitions.types import (
    FEATURE_TIME,
    PRIMARY,
    DataFrameSpec,
    ValueType,
    Windowed,
    value_type,
)
from kairos.errors import DefinitionError, UnknownFeature, did_you_mean

ZERO = timedelta(0)


@dataclass(frozen=True, slots=True)
class FeatureInfo:
    """Everything kairos knows about one feature (one window of a windowed feature)."""

    namespace: str
    name: str  # "balance", or "txn_count[7d]" for one window
    kind: str  # scalar | has_one | has_many
    type: ValueType | None  # None for relations
    max_staleness: timedelta
    target: str | None = None  # namespace a relation points at
    join_key: str | None = None  # has_one: our foreign key; has_many: the child's foreign key
    fk_target: tuple[str, str] | None = None  # this feature is a foreign key to (namespace, name)
    is_primary: bool = False
    is_feature_time: bool = False
    expression: ex.Expr | None = None
    window: timedelta | None = None
    default: Any = MISSING
    description: str | None = None
    tags: tuple[str, ...] = ()
    owner: str | None = None
    min: Any = None
    max: Any = None
    ttl: timedelta | None = None  # older values are no values, online and offline
    nearest: NearestSearch | None = None  # a has-many found by vector search (kr.nearest)

    @property
    def fqn(self) -> str:
        return f"{self.namespace}.{self.name}"


@dataclass(frozen=True)
class ClassInfo:
    namespace: str
    cls: type
    features: Mapping[str, FeatureInfo]
    primary: str
    feature_time: str | None
    windowed: frozenset[str] = field(default_factory=frozenset)
    events: bool = False


class Graph:
    """All feature classes of a project, resolved and checked. Immutable once built."""

    def __init__(self, classes: Mapping[str, ClassInfo]) -> None:
        self.classes = classes
        self._by_class = {info.cls: ns for ns, info in classes.items()}

    @classmethod
    def build(cls, feature_classes: Iterable[type]) -> Graph:
        specs: dict[str, FeatureClassSpec] = {}
        for klass in feature_classes:
            spec = class_spec(klass)
            if spec is None:
                raise DefinitionError(f"{klass!r} is not a @features class")
            other = specs.get(spec.namespace)
            if other is not None and other.cls is not klass:
                raise DefinitionError(
                    f"two feature classes use namespace {spec.namespace!r}: "
                    f"{_where(other.cls)} and {_where(klass)}; rename one or pass "
                    "@features(namespace=...)"
                )
            specs[spec.namespace] = spec
        return _Builder(specs).build()

    # --- lookups ------------------------------------------------------------------------

    def namespace_of(self, klass: type) -> str:
        try:
            return self._by_class[klass]
        except KeyError:
            raise UnknownFeature(
                f"feature class {klass.__name__!r} is not part of this project; "
                "add its module to the project folder"
            ) from None

    def cls(self, namespace: str) -> ClassInfo:
        try:
            return self.classes[namespace]
        except KeyError:
            raise UnknownFeature(
                f"unknown namespace {namespace!r}{did_you_mean(namespace, self.classes)}"
            ) from None

    def feature(self, namespace: str, name: str) -> FeatureInfo:
        info = self.cls(namespace)
        found = info.features.get(name)
        if found is not None:
            return found
        if name in info.windowed:
            windows = [n for n in info.features if n.startswith(name + "[")]
            raise UnknownFeature(
                f"{namespace}.{name} is windowed; pick a window: "
                + ", ".join(f"{namespace}.{w}" for w in windows)
            )
        names = [f"{namespace}.{n}" for n in info.features]
        raise UnknownFeature(
            f"unknown feature '{namespace}.{name}'{did_you_mean(f'{namespace}.{name}', names)}"
        )

    def ref(self, obj: Any) -> FeatureRef:
        """A FeatureRef from a Feature, a FeatureRef or a name such as "user.txn_count[7d]"."""
        ref = ref_of(obj)
        if ref is not None:
            return ref
        if isinstance(obj, str):
            return self.parse(obj)
        raise UnknownFeature(
            f"{obj!r} is not a feature; pass a feature such as User.balance or 'user.balance'"
        )

    def parse(self, text: str) -> FeatureRef:
        window = None
        body = text.strip()
        if body.endswith("]") and "[" in body:
            body, _, rest = body.partition("[")
            window = window_name(rest[:-1].strip("'\" "))
        parts = body.split(".")
        if len(parts) < 2 or not all(parts):
            raise UnknownFeature(
                f"{text!r} is not a feature name; write 'namespace.feature', e.g. 'user.balance'"
            )
        if parts[0] not in self.classes:
            names = [info.fqn for c in self.classes.values() for info in c.features.values()]
            raise UnknownFeature(
                f"unknown feature {text!r}{did_you_mean(text, names)}"
                if did_you_mean(text, names)
                else f"unknown namespace {parts[0]!r} in {text!r}"
                f"{did_you_mean(parts[0], self.classes)}"
            )
        return FeatureRef(parts[0], tuple(parts[1:-1]), parts[-1], window)

    def namespace_at(self, root: str, path: tuple[str, ...]) -> str:
        """The namespace reached from `root` through the has-one relations in `path`."""
        namespace = root
        for hop in path:
            relation = self.feature(namespace, hop)
            if relation.kind != "has_one" or relation.target is None:
                raise UnknownFeature(
                    f"{namespace}.{hop} is not a has-one relation; only has-one relations "
                    "(from a foreign key such as user_id: 'User.id') can be walked"
                )
            namespace = relation.target
        return namespace

    def walk(self, ref: FeatureRef) -> tuple[tuple[str, ...], FeatureInfo]:
        """Follow has-one hops; returns the namespaces along the path and the final feature."""
        spaces = [ref.root]
        for index in range(len(ref.path)):
            spaces.append(self.namespace_at(ref.root, ref.path[: index + 1]))
        namespace = spaces[-1]
        name = f"{ref.name}[{ref.window}]" if ref.window else ref.name
        return tuple(spaces), self.feature(namespace, name)

    def info(self, ref: FeatureRef) -> FeatureInfo:
        return self.walk(ref)[1]

    def description(self, namespace: str, name: str) -> str | None:
        """A feature's description: `feature(description=)` or the comment above the field."""
        info = self.feature(namespace, name)
        if info.description:
            return info.description
        return _field_comments(self.cls(namespace).cls).get(name.partition("[")[0])


class _Builder:
    def __init__(self, specs: dict[str, FeatureClassSpec]) -> None:
        self.specs = specs
        self.by_name = {spec.cls.__name__: spec for spec in specs.values()}
        self.searches: dict[tuple[str, str], NearestOptions] = {}  # kr.nearest, bound last

    def build(self) -> Graph:
        classes = {ns: self._class(spec) for ns, spec in self.specs.items()}
        classes = {ns: self._link_has_many(info, classes) for ns, info in classes.items()}
        graph = Graph(classes)
        check_expressions(graph)
        return graph

    def _evaluate(self, spec: FeatureClassSpec, feat: Feature) -> Any:
        annotation = field_of(feat).annotation
        if not isinstance(annotation, str):
            return annotation
        module = sys.modules.get(spec.cls.__module__)
        names = {s.cls.__name__: s.cls for s in self.specs.values()}
        scope = {**(vars(module) if module else {}), **names}
        try:
            return eval(annotation, scope)  # annotations are the user's own code
        except Exception as error:
            raise DefinitionError(
                f"{spec.cls.__name__}.{field_of(feat).name}: cannot read annotation {annotation!r} "
                f"({error}); is the class it names part of the project?"
            ) from None

    def _class(self, spec: FeatureClassSpec) -> ClassInfo:
        where = spec.cls.__name__
        features: dict[str, FeatureInfo] = {}
        primary = None
        feature_time = None
        windowed: set[str] = set()
        for name, feat in spec.features.items():
            annotation = self._evaluate(spec, feat)
            options = field_of(feat).options
            staleness = options.max_staleness
            if staleness is None:
                staleness = spec.max_staleness if spec.max_staleness is not None else ZERO
            common: dict[str, Any] = {
                "namespace": spec.namespace,
                "max_staleness": staleness,
                "ttl": options.ttl if options.ttl is not None else spec.ttl,
                "default": options.default,
                "description": options.description,
                "tags": options.tags + spec.tags,
                "owner": options.owner or spec.owner,
                "min": options.min,
                "max": options.max,
                "expression": options.expression,
            }
            metadata = typing.get_args(annotation)[1:] if _is_annotated(annotation) else ()
            target_spec = class_spec(annotation)
            if isinstance(annotation, Feature | ForeignKey):
                key = annotation.target if isinstance(annotation, ForeignKey) else annotation
                target_field = field_of(key)
                target = self.specs.get(target_field.namespace)
                if target is None:
                    raise DefinitionError(
                        f"{where}.{name} is a foreign key to {key.fqn}, whose class is "
                        "not part of the project"
                    )
                target_type = self._evaluate(target, target.features[target_field.name])
                vt = value_type(target_type)
                if vt is None:
                    raise DefinitionError(f"{where}.{name}: {key.fqn} has no plain type")
                if isinstance(annotation, ForeignKey) and annotation.nullable:
                    vt = ValueType(vt.kind, True, vt.item)
                features[name] = FeatureInfo(
                    name=name,
                    kind="scalar",
                    type=vt,
                    fk_target=(target_field.namespace, target_field.name),
                    **common,
                )
            elif target_spec is not None:
                self._require(where, name, target_spec)
                fk = self._foreign_key(spec, target_spec, name)
                features[name] = FeatureInfo(
                    name=name,
                    kind="has_one",
                    type=None,
                    target=target_spec.namespace,
                    join_key=fk,
                    **common,
                )
            elif isinstance(annotation, DataFrameSpec):
                child = self._dataframe_target(annotation)
                if child is None:
                    raise DefinitionError(
                        f"{where}.{name}: DataFrame[...] needs a feature class, e.g. "
                        "DataFrame[Transaction]"
                    )
                self._require(where, name, child)
                if isinstance(options, NearestOptions):
                    self.searches[(spec.namespace, name)] = options
                features[name] = FeatureInfo(
                    name=name, kind="has_many", type=None, target=child.namespace, **common
                )
            elif typing.get_origin(annotation) is Windowed:
                if not options.windows:
                    raise DefinitionError(
                        f"{where}.{name}: Windowed[...] features need = windowed('1d', ..., "
                        "expression=...)"
                    )
                vt = value_type(typing.get_args(annotation)[0])
                if vt is None:
                    raise DefinitionError(
                        f"{where}.{name}: unsupported annotation {annotation!r}; a window holds "
                        "int, float, str, bool, datetime, date, list[T], dict or T | None"
                    )
                windowed.add(name)
                for window in options.windows:
                    wname = f"{name}[{window_name(window)}]"
                    features[wname] = FeatureInfo(
                        name=wname, kind="scalar", type=vt, window=window, **common
                    )
            else:
                if options.windows:
                    raise DefinitionError(
                        f"{where}.{name}: a windowed(...) feature is annotated Windowed[T]"
                    )
                vt = value_type(annotation)
                if vt is None:
                    raise DefinitionError(
                        f"{where}.{name}: unsupported annotation {annotation!r}; use int, float, "
                        "str, bool, datetime, date, list[T], dict, T | None, Primary[T], "
                        "FeatureTime, DataFrame[Class], Windowed[T], a feature class (has-one) "
                        "or a foreign key such as 'User.id'"
                    )
                is_primary = PRIMARY in metadata
                is_time = FEATURE_TIME in metadata
                features[name] = FeatureInfo(
                    name=name,
                    kind="scalar",
                    type=vt,
                    is_primary=is_primary,
                    is_feature_time=is_time,
                    **common,
                )
                if is_primary:
                    if primary:
                        raise DefinitionError(
                            f"{where} has two primary keys ({primary!r} and {name!r}); keep one"
                        )
                    primary = name
                if is_time:
                    if feature_time:
                        raise DefinitionError(
                            f"{where} has two FeatureTime fields ({feature_time!r}, {name!r})"
                        )
                    feature_time = name
        if primary is None:
            if "id" not in features:
                raise DefinitionError(
                    f"{where} has no primary key; add `id: str` or mark one `Primary[str]`"
                )
            primary = "id"
            features["id"] = _replace(features["id"], is_primary=True)
        if spec.events and feature_time is None:
            raise DefinitionError(
                f"{where} is declared with events=True but has no FeatureTime; add e.g. "
                "`ts: FeatureTime`"
            )
        return ClassInfo(
            spec.namespace,
            spec.cls,
            features,
            primary,
            feature_time,
            frozenset(windowed),
            spec.events,
        )

    def _require(self, where: str, name: str, target: FeatureClassSpec) -> None:
        if self.specs.get(target.namespace) is not target:
            raise DefinitionError(
                f"{where}.{name} refers to {target.cls.__name__}, which is not part of the "
                "project; add its module to the project folder (or to definitions=[...])"
            )

    def _dataframe_target(self, spec: DataFrameSpec) -> FeatureClassSpec | None:
        first = spec.items[0] if spec.items else None
        if isinstance(first, Feature):
            first = field_of(first).owner_class
        if isinstance(first, str):  # DataFrame["Comment"]: a forward reference
            found = self.by_name.get(first.strip())
            return found
        return class_spec(first)

    def _foreign_key(self, spec: FeatureClassSpec, target: FeatureClassSpec, relation: str) -> str:
        keys = [
            name
            for name, feat in spec.features.items()
            if (key := _key_target(self._evaluate(spec, feat))) is not None
            and field_of(key).namespace == target.namespace
        ]
        preferred = f"{relation}_id"
        if preferred in keys:
            return preferred
        if len(keys) == 1:
            return keys[0]
        raise DefinitionError(
            f"{spec.cls.__name__}.{relation}: "
            + (
                f"no foreign key to {target.cls.__name__}; add e.g. "
                f"`{relation}_id: '{target.cls.__name__}.id'`"
                if not keys
                else f"several foreign keys to {target.cls.__name__} ({', '.join(keys)}); "
                f"name the relation after one of them ({', '.join(k[:-3] for k in keys)})"
            )
        )

    def _link_has_many(self, info: ClassInfo, classes: dict[str, ClassInfo]) -> ClassInfo:
        features = dict(info.features)
        for name, feat in info.features.items():
            if feat.kind != "has_many" or feat.target is None:
                continue
            child = classes[feat.target]
            search = self.searches.get((info.namespace, name))
            if search is not None:  # found by vector search: no foreign key joins them
                where = f"{info.cls.__name__}.{name}"
                bound = bind_nearest(where, search, feat.target, child, info)
                features[name] = _replace(feat, nearest=bound)
                continue
            keys = [
                k
                for k, f in child.features.items()
                if f.fk_target is not None and f.fk_target[0] == info.namespace
            ]
            if len(keys) != 1:
                raise DefinitionError(
                    f"{info.cls.__name__}.{name}: "
                    + (
                        f"{child.cls.__name__} has no foreign key to {info.cls.__name__}; add "
                        f"`{info.namespace}_id: '{info.cls.__name__}.{info.primary}'` to it"
                        if not keys
                        else f"{child.cls.__name__} has several foreign keys to "
                        f"{info.cls.__name__} ({', '.join(keys)}); keep one"
                    )
                )
            features[name] = _replace(feat, join_key=keys[0])
        return ClassInfo(
            info.namespace,
            info.cls,
            features,
            info.primary,
            info.feature_time,
            info.windowed,
            info.events,
        )


def _replace(info: FeatureInfo, **changes: Any) -> FeatureInfo:
    return dataclasses.replace(info, **changes)


def _is_annotated(annotation: Any) -> bool:
    return typing.get_origin(annotation) is typing.Annotated


def _key_target(annotation: Any) -> Feature | None:
    """The feature a foreign-key annotation points at, or None."""
    if isinstance(annotation, ForeignKey):
        return annotation.target
    return annotation if isinstance(annotation, Feature) else None


def _where(klass: type) -> str:
    return f"{klass.__module__}.{klass.__qualname__}"


def _field_comments(klass: type) -> dict[str, str]:
    """Descriptions from comments: the lines directly above `name: type`, or one at its end."""
    try:
        source = inspect.getsource(klass)
    except (OSError, TypeError):
        return {}
    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in source.splitlines():
        text = line.strip()
        if text.startswith("#"):
            pending.append(text.lstrip("#").strip())
            continue
        match = _FIELD_LINE.match(text)
        if match:
            comments[match.group(1)] = " ".join(pending) or _trailing_comment(text)
        pending = []
    return {name: text for name, text in comments.items() if text}


def _trailing_comment(line: str) -> str:
    """The comment at the end of one line of code (a `#` inside a string is not one)."""
    try:
        for token in tokenize.generate_tokens(io.StringIO(line).readline):
            if token.type == tokenize.COMMENT:
                return token.string.lstrip("#").strip()
    except (tokenize.TokenError, SyntaxError):
        return ""
    return ""


_FIELD_LINE = re.compile(r"^([A-Za-z_]\w*)\s*:")
