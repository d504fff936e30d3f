"""Offline stores: every value each feature ever had, and point-in-time (as-of) reads of them.

A spine row `(key, ts)` sees, for a feature, the latest value with `observed_at <= ts` (with a
ttl, also `observed_at > ts - ttl`), else null; a tie on `observed_at` goes to the value
inserted last. Never a value from the future.

The embedded default is one DuckDB file. Values are typed: one table per (namespace, feature),
created on the first write, with columns `(key, observed_at, inserted_at, value)` and the value
in the DuckDB type of the feature's `ValueType`; list, dict and `any` values are JSON in the
exact text of `kairos.stores.codec`, so a datetime inside a dict reads back as a datetime.

As-of reads are one `ASOF LEFT JOIN` of the spine (an Arrow table with an integer row id, never
keys glued into strings) against the feature table pruned to the spine's time range, ordered
back by row id: no Python loop per row, duplicate spine rows all answered.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kairos.definitions.types import ValueType
from kairos.errors import InvalidInput, InvalidValue, KairosError
from kairos.sources.url import take_options
from kairos.stores import codec
from kairos.stores.online import redact_url

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
    "dict": ("JSON", pa.string()),
    "any": ("JSON", pa.string()),
}
_JSON_KINDS = frozenset({"list", "dict", "any"})
_KEY_TYPES: dict[str, tuple[str, Any]] = {
    "int": ("BIGINT", pa.int64()),
    "str": ("VARCHAR", pa.string()),
}

_CATALOG = """
create table if not exists kairos_offline_features (
    namespace varchar not null,
    feature varchar not null,
    table_name varchar not null unique,
    value_kind varchar not null,
    key_kind varchar not null,
    ties boolean not null default false, -- ever two events of one (key, observed_at)
    primary key (namespace, feature)
)
"""

# Among events of the latest observed_at <= ts, the one inserted last wins (rowid breaks an
# exact tie: the later write). DuckDB's as-of picks an arbitrary one among equal observed_at, so
# a table that has ever held two events of one (key, observed_at) is joined on the struct
# (observed_at, inserted_at, rowid), which costs about twice the plain join; a null ts is
# -infinity there so it matches nothing (a struct with a null field compares as largest).
_ASOF = """
select {value} as value
from kairos_spine as spine
asof left join (
    select key, observed_at, value, (observed_at, inserted_at, rowid) as version
    from {table}
    where observed_at <= $max_ts{lower_bound}
) as event
    on spine.key = event.key
    and {inequality}
order by spine.row_id
"""
_PLAIN = "spine.ts >= event.observed_at"
_TIE_BREAKING = """(coalesce(spine.ts, '-infinity'::timestamptz), 'infinity'::timestamptz,
         9223372036854775807::bigint) >= event.version"""

# Does this write give some (key, observed_at) a second event?
_TIES = """
select 1 from {table} as stored
semi join kairos_batch as batch
    on stored.key = batch.key and stored.observed_at = batch.observed_at
group by stored.key, stored.observed_at having count(*) > 1 limit 1
"""

# A list, or a pyarrow Array / ChunkedArray (no copy through Python objects for big batches)
Column: TypeAlias = Sequence[Any]


class OfflineStore(Protocol):
    """What the engine needs from an offline store: bulk typed writes and as-of reads."""

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

    def asof(
        self,
        namespace: str,
        feature: str,
        keys: Column,
        times: Column,
        ttl: timedelta | None = None,
    ) -> pa.Array: ...

    def value_kind(self, namespace: str, feature: str) -> str | None: ...

    def close(self) -> None: ...


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
class CheckedEvents:
    """A write's columns, checked and typed for the store."""

    name: str
    value_kind: str
    key_kind: str
    keys: pa.Array
    observed_at: pa.Array
    values: pa.Array


def checked_events(
    namespace: str,
    feature: str,
    value_type: ValueType,
    key_type: ValueType,
    keys: Column,
    observed_at: Column,
    values: Column,
    inserted_at: datetime | None,
) -> CheckedEvents:
    """Validate a write (lengths, no null keys or times, value types) for any backend."""
    name = f"{namespace}.{feature}"
    value_kind, key_kind = _value_kind(name, value_type), _key_kind(name, key_type)
    if not len(keys) == len(observed_at) == len(values):
        raise InvalidInput(
            f"write of {name!r}: keys, observed_at and values have lengths {len(keys)}, "
            f"{len(observed_at)} and {len(values)}; pass one of each per event"
        )
    key_column = _column(keys, _KEY_TYPES[key_kind][1], f"{name} key")
    if key_column.null_count:
        raise InvalidValue(f"write of {name!r}: a key is None; every event needs its key")
    observed_column = _times(observed_at, f"{name} observed_at")
    if observed_column.null_count:
        raise InvalidValue(f"write of {name!r}: an observed_at is None; every event needs one")
    value_column = _values(values, value_kind, name)
    if inserted_at is not None:
        _aware(inserted_at, f"{name} inserted_at")
    return CheckedEvents(name, value_kind, key_kind, key_column, observed_column, value_column)


def table_name(namespace: str, feature: str) -> str:
    """The DuckDB table of a feature: readable, and unique thanks to a hash of both names.

    >>> table_name("user", "txn_count[7d]")
    'f__user__txn_count_7d__50253148eb'
    """
    digest = hashlib.sha256(f"{namespace}\0{feature}".encode()).hexdigest()[:10]
    return f"f__{_identifier(namespace)}__{_identifier(feature)}__{digest}"


def _identifier(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")[:40] or "x"


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


class DuckDBOfflineStore:
    """Offline store in one DuckDB file (`:memory:` for a throwaway one); the folder is created.

    DuckDB lets one process write a file, so a store owns its connection; writes take a lock,
    reads run on their own cursor and may overlap.

    >>> store = DuckDBOfflineStore(":memory:")
    >>> t = datetime(2026, 1, 1, tzinfo=UTC)
    >>> store.write("user", "age", ValueType("int"), ValueType("str"), ["u1"], [t], [41])
    >>> store.asof("user", "age", ["u1", "u1"], [t, t - timedelta(days=1)]).to_pylist()
    [41, None]
    >>> store.close()
    """

    def __init__(self, path: str | Path = ".kairos/offline.duckdb") -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            connection = duckdb.connect(self.path)
        except duckdb.Error as error:
            raise KairosError(
                f"cannot open offline store {self.path!r}: {error} (DuckDB lets one process "
                "write a file: close the other store or use a copy)"
            ) from None
        try:
            connection.execute("set TimeZone = 'UTC'")
            connection.execute(_CATALOG)
        except duckdb.Error as error:
            connection.close()
            raise KairosError(f"cannot open offline store {self.path!r}: {error}") from None
        self._connection: duckdb.DuckDBPyConnection | None = connection
        self._lock = threading.Lock()
        self._tables: dict[tuple[str, str], tuple[str, str, str, bool]] = {}
        self._clock = InsertionClock()

    def __repr__(self) -> str:
        return f"DuckDBOfflineStore({self.path!r})"

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
    ) -> None:
        """Append events `(keys[i], observed_at[i], values[i])`, all inserted at `inserted_at`
        (default: now, and never twice the same instant in one store), in one transaction."""
        batch_in = checked_events(
            namespace, feature, value_type, key_type, keys, observed_at, values, inserted_at
        )
        name, value_kind, key_kind = batch_in.name, batch_in.value_kind, batch_in.key_kind
        key_column, observed_column = batch_in.keys, batch_in.observed_at
        value_column = batch_in.values
        with self._lock:
            connection = self._live()
            inserted_at = self._clock.stamp(inserted_at)
            if not len(key_column):
                return
            batch = pa.table(
                {
                    "key": key_column,
                    "observed_at": observed_column,
                    "inserted_at": pa.array(
                        np.full(len(key_column), codec.to_micros(inserted_at), dtype=np.int64)
                    ).view(TIMESTAMP),
                    "value": value_column,
                }
            )
            try:
                connection.execute("begin transaction")
                table = self._ensure_table(connection, namespace, feature, value_kind, key_kind)
                connection.register("kairos_batch", batch)
                try:
                    connection.execute(
                        f"insert into {_quoted(table)} (key, observed_at, inserted_at, value) "
                        "select key, observed_at, inserted_at, value from kairos_batch"
                    )
                    found = self._tables[(namespace, feature)]
                    if (
                        not found[3]
                        and connection.execute(_TIES.format(table=_quoted(table))).fetchall()
                    ):
                        connection.execute(
                            "update kairos_offline_features set ties = true "
                            "where namespace = ? and feature = ?",
                            [namespace, feature],
                        )
                        self._tables[(namespace, feature)] = (*found[:3], True)
                finally:
                    connection.unregister("kairos_batch")
                connection.execute("commit")
            except BaseException as error:
                connection.execute("rollback")
                self._tables.pop((namespace, feature), None)
                if isinstance(error, duckdb.Error):
                    raise KairosError(f"{self!r}: cannot write {name!r}: {error}") from None
                raise

    def asof(
        self,
        namespace: str,
        feature: str,
        keys: Column,
        times: Column,
        ttl: timedelta | None = None,
    ) -> pa.Array:
        """For each spine row i, the feature's latest value with observed_at <= times[i] (and
        > times[i] - ttl), else null; in spine order. Null keys and null times give null."""
        name = f"{namespace}.{feature}"
        if len(keys) != len(times):
            raise InvalidInput(
                f"as-of read of {name!r}: {len(keys)} keys but {len(times)} times; the spine "
                "needs one time per key"
            )
        if ttl is not None and ttl <= timedelta(0):
            raise InvalidInput(f"as-of read of {name!r}: ttl {ttl!r} must be positive, or None")
        time_column = _times(times, f"{name} times")
        cursor = self._cursor()
        try:
            found = self._table_of(cursor, namespace, feature)
            if found is None:
                return pa.nulls(len(time_column))
            table, value_kind, key_kind, ties = found
            spine = pa.table(
                {
                    "row_id": pa.array(np.arange(len(time_column), dtype=np.int32)),
                    "key": _column(keys, _KEY_TYPES[key_kind][1], f"{name} key"),
                    "ts": time_column,
                }
            )
            if not spine.num_rows or time_column.null_count == spine.num_rows:
                return pa.nulls(spine.num_rows, _VALUE_TYPES[value_kind][1])
            latest, earliest = pc.max(time_column).as_py(), pc.min(time_column).as_py()
            value = "epoch_us(event.value)" if value_kind == "timedelta" else "event.value"
            if ttl is not None:
                value = f"case when event.observed_at > spine.ts - $ttl then {value} end"
            parameters: dict[str, Any] = {"max_ts": latest}
            lower_bound = ""
            if ttl is not None:
                lower_bound = " and observed_at > $min_ts"
                parameters["ttl"] = ttl
                try:
                    parameters["min_ts"] = earliest - ttl
                except OverflowError:  # a ttl reaching before year 1 prunes nothing
                    lower_bound = ""
            cursor.register("kairos_spine", spine)
            sql = _ASOF.format(
                value=value,
                table=_quoted(table),
                lower_bound=lower_bound,
                inequality=_TIE_BREAKING if ties else _PLAIN,
            )
            result = cursor.sql(sql, params=parameters).to_arrow_table().column(0)
        except duckdb.Error as error:
            raise KairosError(f"{self!r}: cannot read {name!r}: {error}") from None
        finally:
            cursor.close()
        column = result.combine_chunks()
        if value_kind == "timedelta":
            return column.cast(pa.int64()).view(pa.duration("us"))
        return column.cast(_VALUE_TYPES[value_kind][1])

    def value_kind(self, namespace: str, feature: str) -> str | None:
        """The value kind a feature was written with (`int`, `list`...), None if never written."""
        cursor = self._cursor()
        try:
            found = self._table_of(cursor, namespace, feature)
        finally:
            cursor.close()
        return None if found is None else found[1]

    def close(self) -> None:
        with self._lock:
            connection, self._connection = self._connection, None
            if connection is not None:
                connection.close()

    # --- internals ------------------------------------------------------------------------

    def _live(self) -> duckdb.DuckDBPyConnection:
        if self._connection is None:
            raise KairosError(f"{self!r} is closed; create a new store")
        return self._connection

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        with self._lock:
            cursor = self._live().cursor()
        cursor.execute("set TimeZone = 'UTC'")
        return cursor

    def _table_of(
        self, connection: duckdb.DuckDBPyConnection, namespace: str, feature: str
    ) -> tuple[str, str, str, bool] | None:
        found = self._tables.get((namespace, feature))
        if found is None:
            rows = connection.execute(
                "select table_name, value_kind, key_kind, ties from kairos_offline_features "
                "where namespace = ? and feature = ?",
                [namespace, feature],
            ).fetchall()
            if not rows:
                return None
            row = rows[0]
            found = (str(row[0]), str(row[1]), str(row[2]), bool(row[3]))
            self._tables[(namespace, feature)] = found
        return found

    def _ensure_table(
        self,
        connection: duckdb.DuckDBPyConnection,
        namespace: str,
        feature: str,
        value_kind: str,
        key_kind: str,
    ) -> str:
        found = self._table_of(connection, namespace, feature)
        if found is not None:
            table, stored_value, stored_key, _ = found
            if (_VALUE_TYPES[stored_value][0], stored_key) != (
                _VALUE_TYPES[value_kind][0],
                key_kind,
            ):
                raise InvalidValue(
                    f"write of '{namespace}.{feature}': it is stored with {stored_value} values "
                    f"and {stored_key} keys, not {value_kind} values and {key_kind} keys; write "
                    "it with the types it was first written with"
                )
            return table
        table = table_name(namespace, feature)
        connection.execute(
            f"create table {_quoted(table)} (key {_KEY_TYPES[key_kind][0]}, "
            "observed_at TIMESTAMPTZ not null, inserted_at TIMESTAMPTZ not null, "
            f"value {_VALUE_TYPES[value_kind][0]})"
        )
        connection.execute(
            "insert into kairos_offline_features values (?, ?, ?, ?, ?, false)",
            [namespace, feature, table, value_kind, key_kind],
        )
        self._tables[(namespace, feature)] = (table, value_kind, key_kind, False)
        return table


def python_values(array: pa.Array, value_kind: str) -> list[Any]:
    """An as-of result as Python values; list, dict and `any` features are decoded from JSON.

    >>> python_values(pa.array(['{"a": [1, 2]}', None]), "dict")
    [{'a': [1, 2]}, None]
    """
    if value_kind in _JSON_KINDS:
        return [None if text is None else codec.decode(text.encode()) for text in array.to_pylist()]
    values: list[Any] = array.to_pylist()
    return values


def offline_store_from_url(url: str) -> OfflineStore:
    """The offline store a URL names: `duckdb:///relative/path.duckdb`,
    `duckdb:////absolute/path.duckdb`, `duckdb:///:memory:`, or a PostgreSQL database,
    `postgresql://user@host:5432/db` (also `postgres://`), with `?schema=name` for the schema
    its tables go in (created if missing; other options go to libpq).

    >>> store = offline_store_from_url("duckdb:///:memory:")
    >>> store
    DuckDBOfflineStore(':memory:')
    >>> store.close()
    """
    scheme = url.partition(":")[0].lower() if ":" in url else ""
    if scheme == "duckdb":
        prefix = "duckdb:///"
        path = url[len(prefix) :] if url[: len(prefix)].lower() == prefix else ""
        if not path:
            raise KairosError(
                f"offline store URL {redact_url(url)!r} names no file; use "
                "duckdb:///relative/path.duckdb, duckdb:////absolute/path.duckdb or "
                "duckdb:///:memory:"
            )
        return DuckDBOfflineStore(path)
    if scheme in ("postgresql", "postgres"):
        from kairos.stores.offline_postgres import PostgresOfflineStore

        conninfo, options = take_options(url, {"schema"})
        schema = options.get("schema")
        if schema is not None and not schema:
            raise KairosError(
                f"offline store URL {redact_url(url)!r} has an empty ?schema=; name a schema "
                "or leave the option out"
            )
        return PostgresOfflineStore(conninfo, schema)
    named = f"scheme {scheme!r}" if scheme else "no scheme"
    raise KairosError(
        f"offline store URL {redact_url(url)!r} has {named}; supported: "
        "'duckdb:///path/to/offline.duckdb', 'duckdb:///:memory:', "
        "'postgresql://user@host:5432/db?schema=name'"
    )


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
