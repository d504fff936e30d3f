"""What a query returns: values, per-feature errors, where each value came from, and a trace.

Each type's `to_dict()` is its JSON shape: what the HTTP server answers with, and (for a
trace's steps) what the query log keeps. Values stay Python values (a datetime stays a
datetime) for the JSON writer to format.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class FeatureError:
    """Why one feature (of one row, in a bulk query) has no value."""

    feature: str
    code: str  # resolver_error timeout upstream_error invalid_value expression_error missing
    message: str
    row: int | None = None
    resolver: str | None = None

    def to_dict(self, *, row: bool = True) -> dict[str, Any]:
        """`{"feature", "code", "message", "row"}`; without `row` when it is about the one
        entity of a single query (`row=False`).

        >>> FeatureError("user.risk", "timeout", "took over 1s", 3).to_dict()
        {'feature': 'user.risk', 'code': 'timeout', 'message': 'took over 1s', 'row': 3}
        """
        body: dict[str, Any] = {"feature": self.feature, "code": self.code, "message": self.message}
        if row:
            body["row"] = self.row
        return body


@dataclass(frozen=True, slots=True)
class FeatureValue:
    feature: str
    value: Any
    observed_at: datetime | None
    source: str | None  # "cache", "input", "default", a resolver's name, or "expression"
    error: FeatureError | None = None

    @property
    def cached(self) -> bool:
        return self.source == "cache"

    def to_dict(self) -> dict[str, Any]:
        """`{"value", "observed_at", "source", "cached"}` (the error is reported apart)."""
        return {
            "value": self.value,
            "observed_at": self.observed_at,
            "source": self.source,
            "cached": self.cached,
        }


@dataclass(frozen=True, slots=True)
class NodeTiming:
    """One step of a query: a plan node, or the store reads and writes around them."""

    node: int | None
    kind: str
    label: str
    start_ms: float
    duration_ms: float
    rows: int
    status: str  # ok | error | timeout | skipped

    def to_dict(self, digits: int | None = None) -> dict[str, Any]:
        """The step as JSON; `digits` rounds its times (in ms): an HTTP reply shows them to
        0.1 µs, the query log keeps them whole.

        >>> NodeTiming(0, "python", "user.risk", 0.123456, 2.5, 1, "ok").to_dict(4)["start_ms"]
        0.1235
        """
        start, duration = self.start_ms, self.duration_ms
        if digits is not None:
            start, duration = round(start, digits), round(duration, digits)
        return {
            "node": self.node,
            "kind": self.kind,
            "label": self.label,
            "start_ms": start,
            "duration_ms": duration,
            "rows": self.rows,
            "status": self.status,
        }


@dataclass(frozen=True, slots=True)
class QueryMeta:
    query_id: str
    now: datetime
    duration_ms: float
    rows: int
    cache_hits: int
    computed: int
    # one entry per LLM call the query made: tokens by feature, context/queue/TTFT/decode times
    llm: tuple[dict[str, Any], ...] = ()


@dataclass
class ColumnData:
    """One column of a query, one slot per entity (row)."""

    values: list[Any]
    observed_at: list[datetime | None]
    source: list[str | None]
    errors: list[FeatureError | None]

    @classmethod
    def empty(cls, rows: int) -> ColumnData:
        return cls([None] * rows, [None] * rows, [None] * rows, [None] * rows)


NameOf = Callable[[Any], str]
TRACE_DIGITS = 4  # a result's trace times as JSON: ms to 0.1 µs


@dataclass
class QueryResult:
    """The answer to `client.query(...)` for one entity.

    >>> r = client.query(input={User.id: "u1"}, output=[User.balance])  # doctest: +SKIP
    >>> r.get_value(User.balance), r.errors, r.meta.query_id  # doctest: +SKIP
    """

    features: dict[str, FeatureValue]
    meta: QueryMeta
    trace: list[NodeTiming]
    name_of: NameOf = field(repr=False, default=str)

    @property
    def values(self) -> dict[str, Any]:
        return {name: fv.value for name, fv in self.features.items()}

    @property
    def errors(self) -> list[FeatureError]:
        return [fv.error for fv in self.features.values() if fv.error is not None]

    def get(self, feature: Any) -> FeatureValue:
        return self.features[self.name_of(feature)]

    def get_value(self, feature: Any, default: Any = None) -> Any:
        found = self.features.get(self.name_of(feature))
        return default if found is None or found.value is None else found.value

    def __iter__(self) -> Iterator[FeatureValue]:
        return iter(self.features.values())

    def to_dict(self) -> dict[str, Any]:
        """The answer as JSON (what `POST /v1/query/online` replies).

        >>> r = client.query(input={User.id: "u1"}, output=[User.risk])  # doctest: +SKIP
        >>> r.to_dict()["values"]  # doctest: +SKIP
        {'user.risk': 0.12}
        """
        meta = self.meta
        return {
            "query_id": meta.query_id,
            "now": meta.now,
            "values": self.values,
            "features": {name: fv.to_dict() for name, fv in self.features.items()},
            "errors": [error.to_dict(row=False) for error in self.errors],
            "meta": {
                "duration_ms": meta.duration_ms,
                "cache_hits": meta.cache_hits,
                "computed": meta.computed,
                "llm": list(meta.llm),
            },
            "trace": [step.to_dict(TRACE_DIGITS) for step in self.trace],
        }


@dataclass
class BulkResult:
    """The answer to `client.query_bulk(...)`: one value per entity for every output."""

    columns: dict[str, ColumnData]
    meta: QueryMeta
    trace: list[NodeTiming]
    name_of: NameOf = field(repr=False, default=str)

    def __len__(self) -> int:
        return self.meta.rows

    @property
    def values(self) -> dict[str, list[Any]]:
        return {name: list(col.values) for name, col in self.columns.items()}

    @property
    def errors(self) -> list[FeatureError]:
        return [e for col in self.columns.values() for e in col.errors if e is not None]

    def column(self, feature: Any) -> list[Any]:
        return list(self.columns[self.name_of(feature)].values)

    def row(self, index: int) -> dict[str, FeatureValue]:
        return {
            name: FeatureValue(
                name,
                col.values[index],
                col.observed_at[index],
                col.source[index],
                col.errors[index],
            )
            for name, col in self.columns.items()
        }

    def to_rows(self) -> list[dict[str, Any]]:
        return [
            {name: col.values[i] for name, col in self.columns.items()}
            for i in range(self.meta.rows)
        ]

    def to_dict(self) -> dict[str, Any]:
        """The answer as JSON (what `POST /v1/query/bulk` replies): a list of values per
        output, one per entity, and each error with its row."""
        meta = self.meta
        return {
            "query_id": meta.query_id,
            "now": meta.now,
            "rows": len(self),
            "values": self.values,
            "errors": [error.to_dict() for error in self.errors],
            "meta": {"duration_ms": meta.duration_ms, "llm": list(meta.llm)},
            "trace": [step.to_dict(TRACE_DIGITS) for step in self.trace],
        }
