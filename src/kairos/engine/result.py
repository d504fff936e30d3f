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


def _time(value: Any) -> datetime | None:
    """A time of a JSON answer: a datetime (tagged JSON), ISO 8601 text (plain JSON) or None."""
    return datetime.fromisoformat(value) if isinstance(value, str) else value


@dataclass(frozen=True, slots=True)
class FeatureError:
    """Why one feature (of one row, in a bulk query) has no value."""

    feature: str
    code: str  # resolver_error timeout upstream_error invalid_value expression_error missing
    message: str
    row: int | None = None
    resolver: str | None = None

    def to_dict(self, *, row: bool = True) -> dict[str, Any]:
        """`{"feature", "code", "message", "resolver", "row"}`; without `row` when it is about
        the one entity of a single query (`row=False`).

        >>> FeatureError("user.risk", "timeout", "took over 1s", 3).to_dict()["row"]
        3
        """
        body: dict[str, Any] = {
            "feature": self.feature,
            "code": self.code,
            "message": self.message,
            "resolver": self.resolver,
        }
        if row:
            body["row"] = self.row
        return body

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FeatureError:
        """The error `to_dict` wrote.

        >>> FeatureError.from_dict({"feature": "user.risk", "code": "timeout", "message": "m"})
        FeatureError(feature='user.risk', code='timeout', message='m', row=None, resolver=None)
        """
        return cls(
            data["feature"], data["code"], data["message"], data.get("row"), data.get("resolver")
        )


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

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeTiming:
        return cls(
            data["node"],
            data["kind"],
            data["label"],
            data["start_ms"],
            data["duration_ms"],
            data["rows"],
            data["status"],
        )


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

    @classmethod
    def from_dict(cls, data: dict[str, Any], name_of: NameOf = str) -> QueryResult:
        """The result `to_dict` wrote (what a remote client reads back); `name_of` turns the
        features `get` is given into names.

        >>> QueryResult.from_dict(served.to_dict()).values == served.values  # doctest: +SKIP
        """
        errors = {e["feature"]: FeatureError.from_dict(e) for e in data["errors"]}
        features = {
            name: FeatureValue(
                name,
                answer["value"],
                _time(answer["observed_at"]),
                answer["source"],
                errors.get(name),
            )
            for name, answer in data["features"].items()
        }
        meta = data["meta"]
        return cls(
            features,
            QueryMeta(
                data["query_id"],
                _when(data["now"]),
                meta["duration_ms"],
                1,
                meta["cache_hits"],
                meta["computed"],
                tuple(meta["llm"]),
            ),
            [NodeTiming.from_dict(step) for step in data["trace"]],
            name_of,
        )


def _when(value: Any) -> datetime:
    found = _time(value)
    if not isinstance(found, datetime):
        raise ValueError(f"a result's now must be a time, got {value!r}")
    return found


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
        output, one per entity, when and where each came from, and each error with its row."""
        meta = self.meta
        return {
            "query_id": meta.query_id,
            "now": meta.now,
            "rows": len(self),
            "values": self.values,
            "features": {
                name: {"observed_at": list(col.observed_at), "source": list(col.source)}
                for name, col in self.columns.items()
            },
            "errors": [error.to_dict() for error in self.errors],
            "meta": {
                "duration_ms": meta.duration_ms,
                "cache_hits": meta.cache_hits,
                "computed": meta.computed,
                "llm": list(meta.llm),
            },
            "trace": [step.to_dict(TRACE_DIGITS) for step in self.trace],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], name_of: NameOf = str) -> BulkResult:
        """The result `to_dict` wrote (what a remote client reads back)."""
        rows = data["rows"]
        features = data.get("features") or {}
        columns = {}
        for name, values in data["values"].items():
            seen = features.get(name) or {}
            columns[name] = ColumnData(
                list(values),
                [_time(t) for t in seen.get("observed_at") or [None] * rows],
                list(seen.get("source") or [None] * rows),
                [None] * rows,
            )
        for error in data["errors"]:
            found = FeatureError.from_dict(error)
            if found.feature in columns and found.row is not None:
                columns[found.feature].errors[found.row] = found
        meta = data["meta"]
        return cls(
            columns,
            QueryMeta(
                data["query_id"],
                _when(data["now"]),
                meta["duration_ms"],
                rows,
                meta.get("cache_hits", 0),
                meta.get("computed", 0),
                tuple(meta.get("llm") or ()),
            ),
            [NodeTiming.from_dict(step) for step in data["trace"]],
            name_of,
        )
