"""What every offline store shares: the `OfflineStore` protocol, the value and key kinds a
store keeps, the checks of a write, and the decoding of a read.

A spine row `(key, ts)` sees, for a feature, the latest value with `observed_at <= ts` (with a
ttl, also `observed_at > ts - ttl`), else null; a tie on `observed_at` goes to the value
inserted last. Never a value from the future.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeAlias, runtime_checkable

import pyarrow as pa

from kairos.definitions.types import ValueType
from kairos.errors import InvalidInput, InvalidValue
from kairos.stores import codec

TIMESTAMP = pa.timestamp("us", tz="UTC")

# value kind -> (DuckDB column type, Arrow type the values travel in)
_VALUE_TYPES: dict[str, tuple[str, Any]] = {
    "bool": ("BOOLEAN", pa.bool_()),
    "int": ("BIGINT", pa.int64()),
    "float": ("DOUBLE", pa.float64()),
    "str": ("VARCHAR", pa.string()),
    "datetime": ("TIMESTAMPTZ", TIMESTAMP),
    "date": ("DATE", pa.date32()),
    "timedelta": ("INTERVAL", pa.duration("us")),
    "list": ("JSON", pa.string()),
    "vector": ("JSON", pa.string()),
    "dict": ("JSON", pa.string()),
    "any": ("JSON", pa.string()),
}
_JSON_KINDS = frozenset({"list", "vector", "dict", "any"})
_KEY_TYPES: dict[str, tuple[str, Any]] = {
    "int": ("BIGINT", pa.int64()),
    "str": ("VARCHAR", pa.string()),
}


# A list, or a pyarrow Array / ChunkedArray (no copy through Python objects for big batches)
Column: TypeAlias = Sequence[Any]
# feature -> (its value type, one value per event)
Written: TypeAlias = Mapping[str, tuple[ValueType, Column]]
# one ttl for every feature read, or one per feature (None: no limit)
TTLs: TypeAlias = timedelta | Mapping[str, timedelta | None] | None


class OfflineStore(Protocol):
    """What the engine needs from an offline store: bulk typed writes and as-of reads.

    `write_many` stores several features of the same events together (a resolver's outputs, a
    backfill), so `asof_many` reads them back in one join."""

    def write(
        self,
        namespace: str,
        feature: str,
        value_type: ValueType,
        key_type: ValueType,
        keys: Column,
        observed_at: Column,
        values: Column,
        inserted_at: datetime | None = None,
    ) -> None: ...

    def write_many(
        self,
        namespace: str,
        key_type: ValueType,
        keys: Column,
        observed_at: Column,
        values: Written,
        inserted_at: datetime | None = None,
    ) -> None: ...

    def asof(
        self,
        namespace: str,
        feature: str,
        keys: Column,
        times: Column,
        ttl: timedelta | None = None,
    ) -> pa.Array: ...

    def asof_many(
        self,
        namespace: str,
        features: Sequence[str],
        keys: Column,
        times: Column,
        ttl: TTLs = None,
    ) -> dict[str, pa.Array]: ...

    def latest_rows(self, namespace: str, features: Sequence[str]) -> pa.Table: ...

    def value_kind(self, namespace: str, feature: str) -> str | None: ...

    def close(self) -> None: ...


@runtime_checkable
class FollowedStore(Protocol):
    """An offline store that says which rows were written since a position it gave: what a
    process reads to see the events other processes wrote (the DuckDB store does)."""

    def changed_rows(
        self, namespace: str, features: Sequence[str], after: Mapping[str, int]
    ) -> tuple[pa.Table, dict[str, int]]: ...


class InsertionClock:
    """A store's `inserted_at`: now, but strictly increasing, so of two writes at the same
    observed_at the later always wins. Call it under the store's write lock."""

    def __init__(self) -> None:
        self._last = datetime.min.replace(tzinfo=UTC)

    def stamp(self, given: datetime | None) -> datetime:
        if given is not None:
            return given
        self._last = max(datetime.now(UTC), self._last + timedelta(microseconds=1))
        return self._last


@dataclass(frozen=True)
class CheckedBatch:
    """A write of several features of the same events, checked and typed for the store."""

    namespace: str
    key_kind: str
    keys: pa.Array
    observed_at: pa.Array
    values: Mapping[str, tuple[str, pa.Array]]  # feature -> (value kind, values)


def checked_batch(
    namespace: str,
    key_type: ValueType,
    keys: Column,
    observed_at: Column,
    values: Written,
    inserted_at: datetime | None,
) -> CheckedBatch:
    """Validate a write (lengths, no null keys or times, value types) for any backend."""
    if not values:
        raise InvalidInput(f"write to {namespace!r}: name at least one feature to write")
    names = ", ".join(f"{namespace}.{feature}" for feature in values)
    key_kind = _key_kind(names, key_type)
    for feature, (_, column) in values.items():
        if not len(keys) == len(observed_at) == len(column):
            raise InvalidInput(
                f"write of '{namespace}.{feature}': keys, observed_at and values have lengths "
                f"{len(keys)}, {len(observed_at)} and {len(column)}; pass one of each per event"
            )
    key_column = _column(keys, _KEY_TYPES[key_kind][1], f"{names} key")
    if key_column.null_count:
        raise InvalidValue(f"write of {names!r}: a key is None; every event needs its key")
    observed_column = _times(observed_at, f"{names} observed_at")
    if observed_column.null_count:
        raise InvalidValue(f"write of {names!r}: an observed_at is None; every event needs one")
    typed = {}
    for feature, (value_type, column) in values.items():
        name = f"{namespace}.{feature}"
        kind = _value_kind(name, value_type)
        typed[feature] = (kind, _values(column, kind, name))
    if inserted_at is not None:
        _aware(inserted_at, f"{names} inserted_at")
    return CheckedBatch(namespace, key_kind, key_column, observed_column, typed)


def ttl_of(ttl: TTLs, feature: str) -> timedelta | None:
    """The ttl one feature is read with."""
    return ttl.get(feature) if isinstance(ttl, Mapping) else ttl


def table_name(namespace: str, feature: str) -> str:
    """The DuckDB table of a feature: readable, and unique thanks to a hash of both names.

    >>> table_name("user", "txn_count[7d]")
    'f__user__txn_count_7d__50253148eb'
    """
    digest = hashlib.sha256(f"{namespace}\0{feature}".encode()).hexdigest()[:10]
    return f"f__{_identifier(namespace)}__{_identifier(feature)}__{digest}"


def _identifier(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")[:40] or "x"


class _WritesMany(Protocol):
    def write_many(
        self,
        namespace: str,
        key_type: ValueType,
        keys: Column,
        observed_at: Column,
        values: Written,
        inserted_at: datetime | None = None,
    ) -> None: ...


class OneFeatureWrites:
    """`write` of one feature, as a `write_many` of one: shared by the offline stores."""

    def write(
        self: _WritesMany,
        namespace: str,
        feature: str,
        value_type: ValueType,
        key_type: ValueType,
        keys: Column,
        observed_at: Column,
        values: Column,
        inserted_at: datetime | None = None,
    ) -> None:
        """Append events `(keys[i], observed_at[i], values[i])`, all inserted at `inserted_at`
        (default: now, and never twice the same instant in one store), in one transaction."""
        self.write_many(
            namespace, key_type, keys, observed_at, {feature: (value_type, values)}, inserted_at
        )


def python_values(array: pa.Array, value_kind: str) -> list[Any]:
    """An as-of result as Python values; list, dict and `any` features are decoded from JSON.

    >>> python_values(pa.array(['{"a": [1, 2]}', None]), "dict")
    [{'a': [1, 2]}, None]
    """
    if value_kind in _JSON_KINDS:
        return [None if text is None else codec.decode(text.encode()) for text in array.to_pylist()]
    values: list[Any] = array.to_pylist()
    return values


def readable(array: pa.Array, value_kind: str | None) -> pa.Array | list[Any]:
    """An as-of result ready to hand out: list, dict and `any` values decoded from JSON into
    Python values; every other kind stays the Arrow array it is (no copy)."""
    return python_values(array, value_kind) if value_kind in _JSON_KINDS else array


# --- columns --------------------------------------------------------------------------------


def _value_kind(name: str, value_type: ValueType) -> str:
    if value_type.kind not in _VALUE_TYPES:
        raise InvalidValue(
            f"{name!r} has value type {value_type.kind!r}; offline stores keep "
            f"{', '.join(_VALUE_TYPES)}"
        )
    return value_type.kind


def _key_kind(name: str, key_type: ValueType) -> str:
    if key_type.kind not in _KEY_TYPES:
        raise InvalidValue(
            f"{name!r} has key type {key_type.kind!r}; offline stores key entities by int or str"
        )
    return key_type.kind


def _column(values: Column, arrow_type: Any, what: str) -> pa.Array:
    """`values` as one Arrow array of `arrow_type`, or InvalidValue naming the mismatch."""
    try:
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if isinstance(values, pa.Array):
            return values if values.type == arrow_type else values.cast(arrow_type)
        if arrow_type == pa.int64() and any(type(v) is bool for v in values):
            raise TypeError("a bool is not an int key")
        return pa.array(values, arrow_type)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as error:
        expected = {pa.int64(): "int", pa.string(): "str"}.get(arrow_type, str(arrow_type))
        raise InvalidValue(f"{what}: expected {expected} values: {error}") from None


def _aware(moment: datetime, what: str) -> None:
    if not isinstance(moment, datetime) or moment.utcoffset() is None:
        raise InvalidValue(
            f"{what} {moment!r} is not a datetime with a timezone; pass an aware datetime "
            "(e.g. datetime.now(UTC))"
        )


def _times(times: Column, what: str) -> pa.Array:
    """Aware datetimes as a UTC timestamp array; a naive one is refused, not guessed at."""
    if isinstance(times, pa.Array | pa.ChunkedArray):
        if pa.types.is_timestamp(times.type) and times.type.tz is None:
            raise InvalidValue(f"{what}: timestamps have no timezone; give them one (UTC)")
        return _column(times, TIMESTAMP, what)
    for moment in times:
        if moment is not None:
            _aware(moment, what)
    return _column(times, TIMESTAMP, what)


def _values(values: Column, kind: str, name: str) -> pa.Array:
    if kind in _JSON_KINDS and not isinstance(values, pa.Array | pa.ChunkedArray):
        try:
            text = [None if v is None else codec.encode(v).decode() for v in values]
        except codec.UnencodableValue as error:
            raise InvalidValue(f"write of {name!r}: {error}") from None
        return pa.array(text, pa.string())
    if kind == "datetime" and not isinstance(values, pa.Array | pa.ChunkedArray):
        return _times(values, f"{name} value")
    if (
        kind in ("int", "float")
        and not isinstance(values, pa.Array | pa.ChunkedArray)
        and any(type(v) is bool for v in values)
    ):
        raise InvalidValue(f"write of {name!r}: a bool is not a {kind} value")
    return _column(values, _VALUE_TYPES[kind][1], f"{name} value")
