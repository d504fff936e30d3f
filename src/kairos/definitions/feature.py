"""Feature classes: `@features`, `feature(...)`, `windowed(...)` and the refs they hand out.

`@features` turns annotated class attributes into `Feature` objects, so `User.balance` names a
feature everywhere (query outputs, resolver signatures). It does no I/O and resolves nothing:
annotations such as `"User.id"` are read later, when a project's graph is built.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar, dataclass_transform, overload

from kairos.definitions import expressions as ex
from kairos.definitions.durations import (
    DurationLike,
    format_duration,
    optional_duration,
    parse_duration,
)
from kairos.errors import DefinitionError, did_you_mean

C = TypeVar("C", bound=type)
MISSING: Any = type("Missing", (), {"__repr__": lambda self: "MISSING"})()

_FK_TEXT = re.compile(r"^\s*([A-Za-z_]\w*)\.([A-Za-z_]\w*)\s*(?:\|\s*None\s*)?$")


def snake_case(name: str) -> str:
    """`CreditCard` -> `credit_card`, `HTTPLog` -> `http_log`."""
    text = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", text).lower()


@dataclass(frozen=True, slots=True)
class FeatureOptions:
    """What `feature(...)` records; every field is optional."""

    default: Any = MISSING
    max_staleness: timedelta | None = None
    ttl: timedelta | None = None
    description: str | None = None
    tags: tuple[str, ...] = ()
    owner: str | None = None
    min: Any = None
    max: Any = None
    expression: ex.Expr | None = None
    windows: tuple[timedelta, ...] = ()


def feature(
    *,
    default: Any = MISSING,
    max_staleness: DurationLike | None = None,
    ttl: DurationLike | None = None,
    description: str | None = None,
    tags: Iterable[str] = (),
    owner: str | None = None,
    min: Any = None,
    max: Any = None,
    expression: Any = None,
) -> Any:
    """Options for one feature: `balance: float = feature(max_staleness="5m", min=0)`.

    `ttl` is how long a value stays true: older than that, it is no value at all, online (a
    cached value past its ttl is recomputed, whatever `max_staleness` allows) and offline (a
    spine row at `ts` sees only values observed after `ts - ttl`).
    """
    if expression is not None and not isinstance(expression, ex.Expr):
        raise DefinitionError(f"feature(expression={expression!r}) must be an `_` expression")
    return FeatureOptions(
        default=default,
        max_staleness=optional_duration(max_staleness, field="max_staleness"),
        ttl=_ttl(ttl),
        description=description,
        tags=tuple(tags),
        owner=owner,
        min=min,
        max=max,
        expression=expression,
    )


def _ttl(ttl: DurationLike | None) -> timedelta | None:
    if ttl is None:
        return None
    parsed = parse_duration(ttl, field="ttl")
    if parsed <= timedelta(0):
        raise DefinitionError(f"ttl={ttl!r} must be positive (or left out: no limit)")
    return parsed


def windowed(
    *windows: DurationLike,
    expression: Any,
    default: Any = MISSING,
    max_staleness: DurationLike | None = None,
    ttl: DurationLike | None = None,
    description: str | None = None,
    tags: Iterable[str] = (),
    owner: str | None = None,
) -> Any:
    """One feature per window: `windowed("1d", "7d", expression=_.transactions[...].count())`.

    Inside the expression `_.window_start` is `now - window` and `_.window_end` is `now`.
    """
    if not windows:
        raise DefinitionError("windowed() needs at least one window, e.g. windowed('1d', ...)")
    if not isinstance(expression, ex.Expr):
        raise DefinitionError("windowed(expression=...) must be an `_` expression")
    parsed = tuple(parse_duration(w, field="window") for w in windows)
    if any(w.total_seconds() <= 0 for w in parsed):
        raise DefinitionError(f"windowed({', '.join(map(repr, windows))}): windows must be > 0")
    options = feature(
        default=default,
        max_staleness=max_staleness,
        ttl=ttl,
        description=description,
        tags=tags,
        owner=owner,
        expression=expression,
    )
    return FeatureOptions(**{**_options_dict(options), "windows": parsed})


def _options_dict(options: FeatureOptions) -> dict[str, Any]:
    return {name: getattr(options, name) for name in FeatureOptions.__slots__}


def window_name(window: str | timedelta) -> str:
    """Canonical spelling of a window: "24h" -> "1d"."""
    return format_duration(parse_duration(window, field="window"))


@dataclass(frozen=True, slots=True)
class FeatureRef:
    """A feature reached from a root entity through has-one hops: `transaction.user.name`.

    An internal value; users hold `Feature` and `PathRef` objects, which turn into this.
    """

    root: str
    path: tuple[str, ...]
    name: str
    window: str | None = None

    @property
    def fqn(self) -> str:
        window = f"[{self.window}]" if self.window else ""
        return ".".join((self.root, *self.path, self.name)) + window

    def __str__(self) -> str:
        return self.fqn

    def hop(self, name: str) -> FeatureRef:
        if self.window:
            raise DefinitionError(f"{self.fqn!r} is a windowed value, not a relation")
        return FeatureRef(self.root, (*self.path, self.name), name)


class _Navigable:
    """Attribute access walks relations, `[...]` picks a window or filters a has-many.

    Every public attribute name is free for feature names: `Transaction.user.name` is the
    user's `name` feature. Only `fqn` is taken.
    """

    __slots__ = ()

    def _kairos_ref(self) -> FeatureRef:
        raise NotImplementedError  # both subclasses override it

    @property
    def fqn(self) -> str:
        return self._kairos_ref().fqn

    def __getattr__(self, name: str) -> PathRef:
        if name.startswith("_"):
            raise AttributeError(name)
        return PathRef(self._kairos_ref().hop(name))

    def __getitem__(self, item: Any) -> Any:
        ref = self._kairos_ref()
        if isinstance(item, str):
            return PathRef(FeatureRef(ref.root, ref.path, ref.name, window_name(item)))
        return HasManyRef(ref, _items(item))

    def __str__(self) -> str:
        return self.fqn


class PathRef(_Navigable):
    """A feature reached through relations or with a window: `Transaction.user.name`."""

    __slots__ = ("_ref",)

    def __init__(self, ref: FeatureRef) -> None:
        self._ref = ref

    def _kairos_ref(self) -> FeatureRef:
        return self._ref

    def __repr__(self) -> str:
        return f"<feature {self._ref.fqn}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PathRef) and other._ref == self._ref

    def __hash__(self) -> int:
        return hash(self._ref)


@dataclass(frozen=True, slots=True)
class HasManyRef:
    """A has-many feature filtered and projected for a resolver input.

    `User.transactions[_.amount, _.status == "declined"]` keeps declined rows, amount only.
    """

    ref: FeatureRef
    items: tuple[Any, ...]

    @property
    def fqn(self) -> str:
        return self.ref.fqn


def _items(item: Any) -> tuple[Any, ...]:
    items = item if isinstance(item, tuple) else (item,)
    return tuple(i if isinstance(i, _Navigable) else ex.lift(i) for i in items)


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """What `@features` recorded about one annotated field."""

    owner_class: type
    namespace: str
    name: str
    annotation: Any
    options: FeatureOptions
    implicit: bool = False  # a has-one relation derived from a foreign key


class Feature(_Navigable):
    """A feature as a class attribute: `User.balance`.

    It names the feature in queries and resolver signatures; `Transaction.user.name` walks a
    has-one relation and `User.txn_count["7d"]` picks a window.
    """

    __slots__ = ("_field",)

    def __init__(self, spec: FieldSpec) -> None:
        self._field = spec

    def _kairos_ref(self) -> FeatureRef:
        return FeatureRef(self._field.namespace, (), self._field.name)

    def __or__(self, other: Any) -> Any:
        # `user_id: "User.id | None"` declares a nullable foreign key
        if other is None:
            return ForeignKey(self, nullable=True)
        return NotImplemented

    def __ror__(self, other: Any) -> Any:
        return self.__or__(other)

    def __repr__(self) -> str:
        return f"<feature {self.fqn}>"


@dataclass(frozen=True, slots=True)
class ForeignKey:
    """A foreign key annotation that allows null: `"User.id | None"`."""

    target: Feature
    nullable: bool


def field_of(feature: Feature) -> FieldSpec:
    """What `@features` recorded about a class attribute."""
    return feature._field


def ref_of(obj: Any) -> FeatureRef | None:
    """The FeatureRef behind a Feature, PathRef, HasManyRef or FeatureRef; None otherwise."""
    if isinstance(obj, _Navigable):
        return obj._kairos_ref()
    if isinstance(obj, FeatureRef):
        return obj
    if isinstance(obj, HasManyRef):
        return obj.ref
    return None


@dataclass(frozen=True)
class FeatureClassSpec:
    """What `@features` records about a class; read by `Graph` when a project loads."""

    cls: type
    namespace: str
    features: dict[str, Feature] = field(default_factory=dict)
    max_staleness: timedelta | None = None
    owner: str | None = None
    tags: tuple[str, ...] = ()
    events: bool = False  # rows are written to kairos as events (client.write_events)
    ttl: timedelta | None = None  # default for the class's features


def foreign_key_target(annotation: Any) -> tuple[str, str] | None:
    """("User", "id") for `"User.id"`, `User.id` or `"User.id | None"`; None otherwise."""
    if isinstance(annotation, ForeignKey):
        annotation = annotation.target
    if isinstance(annotation, Feature):
        return annotation._field.owner_class.__name__, annotation._field.name
    if isinstance(annotation, str):
        match = _FK_TEXT.match(annotation)
        if match and match.group(1)[0].isupper():
            return match.group(1), match.group(2)
    return None


@overload
def features(cls: C, /) -> C: ...


@overload
def features(
    *,
    max_staleness: DurationLike | None = None,
    namespace: str | None = None,
    owner: str | None = None,
    tags: Iterable[str] = (),
    events: bool = False,
    ttl: DurationLike | None = None,
) -> Callable[[C], C]: ...


@dataclass_transform(kw_only_default=True, field_specifiers=(feature, windowed))
def features(
    cls: Any = None,
    /,
    *,
    max_staleness: DurationLike | None = None,
    namespace: str | None = None,
    owner: str | None = None,
    tags: Iterable[str] = (),
    events: bool = False,
    ttl: DurationLike | None = None,
) -> Any:
    """Declare a feature class; its namespace is the snake_case class name.

    `max_staleness` and `ttl` set the default of every feature of the class (see `feature`).

    `events=True` declares rows that are written to kairos (`client.write_events`): a
    has-many of them needs no resolver, and windowed aggregates over it are answered from an
    index whose cost does not grow with the events in the window.

    >>> @features
    ... class User:
    ...     id: str
    ...     balance: float
    >>> User.balance.fqn
    'user.balance'
    """

    class_ttl = _ttl(ttl)  # checked here: a bad value fails at the decorator's line

    def decorate(klass: C) -> C:
        return _decorate(
            klass,
            namespace or snake_case(klass.__name__),
            optional_duration(max_staleness, field="max_staleness"),
            owner,
            tuple(tags),
            events,
            class_ttl,
        )

    return decorate(cls) if cls is not None else decorate


def _decorate(
    cls: C,
    namespace: str,
    max_staleness: timedelta | None,
    owner: str | None,
    tags: tuple[str, ...],
    events: bool = False,
    ttl: timedelta | None = None,
) -> C:
    annotations = inspect.get_annotations(cls)
    spec = FeatureClassSpec(cls, namespace, {}, max_staleness, owner, tags, events, ttl)
    for name, annotation in annotations.items():
        if name.startswith("_"):
            continue
        value = cls.__dict__.get(name, MISSING)
        if isinstance(value, FeatureOptions):
            options = value
        elif isinstance(value, ex.Expr):
            options = FeatureOptions(expression=value)
        elif isinstance(value, ex.Underscore):
            raise DefinitionError(f"{cls.__name__}.{name} = _ is not an expression; write _.x")
        elif value is MISSING:
            options = FeatureOptions()
        else:
            options = FeatureOptions(default=value)
        spec.features[name] = Feature(FieldSpec(cls, namespace, name, annotation, options))
    for name, annotation in annotations.items():
        target = foreign_key_target(annotation)
        relation = name[: -len("_id")] if name.endswith("_id") else None
        if target and relation and relation not in spec.features:
            spec.features[relation] = Feature(
                FieldSpec(cls, namespace, relation, target[0], FeatureOptions(), implicit=True)
            )
    for name, feat in spec.features.items():
        setattr(cls, name, feat)
    cls.__kairos__ = spec  # type: ignore[attr-defined]
    cls.__init__ = _init  # type: ignore[misc]
    cls.__repr__ = _repr  # type: ignore[method-assign, assignment]
    return cls


def _init(self: Any, **values: Any) -> None:
    spec: FeatureClassSpec = type(self).__kairos__
    for name, value in values.items():
        if name not in spec.features:
            raise DefinitionError(
                f"{type(self).__name__} has no feature {name!r}{did_you_mean(name, spec.features)}"
            )
        object.__setattr__(self, name, value)


def _repr(self: Any) -> str:
    values = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
    return f"{type(self).__name__}({values})"


def class_spec(obj: Any) -> FeatureClassSpec | None:
    """The spec of a `@features` class, or None for anything else."""
    spec = getattr(obj, "__kairos__", None) if isinstance(obj, type) else None
    return spec if isinstance(spec, FeatureClassSpec) else None
