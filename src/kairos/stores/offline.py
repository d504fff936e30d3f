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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
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
create table if not exists kairos_offline_segments (
    table_name varchar primary key,
    namespace varchar not null,
    key_kind varchar not null,
    ties boolean not null default false -- ever two events of one (key, observed_at)
);
create table if not exists kairos_offline_columns (
    namespace varchar not null,
    feature varchar not null,
    table_name varchar not null,
    column_name varchar not null,
    value_kind varchar not null,
    primary key (namespace, feature, table_name)
)
"""

# Among events of the latest observed_at <= ts, the one inserted last wins (rowid breaks an
# exact tie: the later write). DuckDB's as-of picks an arbitrary one among equal observed_at, so
# a segment that has ever held two events of one (key, observed_at), or a feature spread over
# several segments, is joined on the struct (observed_at, inserted_at, rowid), which costs
# about twice the plain join; a null ts is -infinity there so it matches nothing (a struct with
# a null field compares as largest).
_ASOF = """
select {values}
from kairos_spine as spine
asof left join (
    select key, observed_at, {columns}{version}
    from {events}
    where observed_at <= $max_ts{lower_bound}
) as event
    on spine.key = event.key
    and {inequality}
order by spine.row_id
"""
_VERSION = ", (observed_at, inserted_at, rowid) as version"
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


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


@dataclass(frozen=True)
class _Segment:
    """One table of events: a key, observed_at, inserted_at and one column per feature."""

    table: str
    namespace: str
    key_kind: str
    columns: Mapping[str, tuple[str, str]]  # feature -> (column, value kind)
    ties: bool


def _segment_table(namespace: str, features: Sequence[str]) -> str:
    # "+" never occurs in a feature's name, so a group's name is no single feature's
    return table_name(namespace, "+".join(features))


def _segment_columns(features: Sequence[str]) -> list[str]:
    return ["value"] if len(features) == 1 else [f"v{i}" for i in range(len(features))]


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


class DuckDBOfflineStore(OneFeatureWrites):
    """Offline store in one DuckDB file (`:memory:` for a throwaway one); the folder is created.

    DuckDB lets one process write a file, so a store owns its connection (and its catalog, kept
    in memory); writes take a lock, reads run on their own cursor and may overlap.

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
            _migrate_catalog(connection)
        except duckdb.Error as error:
            connection.close()
            raise KairosError(f"cannot open offline store {self.path!r}: {error}") from None
        self._connection: duckdb.DuckDBPyConnection | None = connection
        self._lock = threading.Lock()
        self._clock = InsertionClock()
        self._segments: dict[str, _Segment] = {}
        self._load_catalog(connection)

    def __repr__(self) -> str:
        return f"DuckDBOfflineStore({self.path!r})"

    def write_many(
        self,
        namespace: str,
        key_type: ValueType,
        keys: Column,
        observed_at: Column,
        values: Written,
        inserted_at: datetime | None = None,
    ) -> None:
        """Append events of several features at once, `values[feature][i]` for event i, into
        one table (created for this set of features on its first write), so an as-of read of
        them all is one join.

        >>> store = DuckDBOfflineStore(":memory:")
        >>> t = datetime(2026, 1, 1, tzinfo=UTC)
        >>> store.write_many("user", ValueType("str"), ["u1"], [t],
        ...     {"age": (ValueType("int"), [41]), "name": (ValueType("str"), ["Ada"])})
        >>> found = store.asof_many("user", ["age", "name"], ["u1"], [t])
        >>> found["age"].to_pylist(), found["name"].to_pylist()
        ([41], ['Ada'])
        >>> store.close()
        """
        batch_in = checked_batch(namespace, key_type, keys, observed_at, values, inserted_at)
        features = sorted(batch_in.values)
        names = ", ".join(f"{namespace}.{feature}" for feature in features)
        with self._lock:
            connection = self._live()
            inserted_at = self._clock.stamp(inserted_at)
            count = len(batch_in.keys)
            if not count:
                return
            columns = _segment_columns(features)
            batch = pa.table(
                {
                    "key": batch_in.keys,
                    "observed_at": batch_in.observed_at,
                    "inserted_at": pa.array(
                        np.full(count, codec.to_micros(inserted_at), dtype=np.int64)
                    ).view(TIMESTAMP),
                    **{
                        column: batch_in.values[feature][1]
                        for column, feature in zip(columns, features, strict=True)
                    },
                }
            )
            try:
                connection.execute("begin transaction")
                segment = self._ensure_segment(connection, batch_in, features)
                listed = ", ".join(["key", "observed_at", "inserted_at", *columns])
                connection.register("kairos_batch", batch)
                try:
                    connection.execute(
                        f"insert into {_quoted(segment.table)} ({listed}) "
                        f"select {listed} from kairos_batch"
                    )
                    if (
                        not segment.ties
                        and connection.execute(
                            _TIES.format(table=_quoted(segment.table))
                        ).fetchall()
                    ):
                        connection.execute(
                            "update kairos_offline_segments set ties = true where table_name = ?",
                            [segment.table],
                        )
                        segment = replace(segment, ties=True)
                finally:
                    connection.unregister("kairos_batch")
                connection.execute("commit")
            except BaseException as error:
                connection.execute("rollback")
                self._load_catalog(connection)
                if isinstance(error, duckdb.Error):
                    raise KairosError(f"{self!r}: cannot write {names!r}: {error}") from None
                raise
            self._segments[segment.table] = segment  # what was committed: no catalog re-read

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
        return self.asof_many(namespace, [feature], keys, times, ttl)[feature]

    def asof_many(
        self,
        namespace: str,
        features: Sequence[str],
        keys: Column,
        times: Column,
        ttl: TTLs = None,
    ) -> dict[str, pa.Array]:
        """`asof` for several features of one spine: features written together are read in
        one join; a feature spread over several tables gets a join over their union."""
        names = ", ".join(f"{namespace}.{feature}" for feature in features)
        if len(keys) != len(times):
            raise InvalidInput(
                f"as-of read of {names!r}: {len(keys)} keys but {len(times)} times; the spine "
                "needs one time per key"
            )
        for feature in features:
            limit = ttl_of(ttl, feature)
            if limit is not None and limit <= timedelta(0):
                raise InvalidInput(
                    f"as-of read of '{namespace}.{feature}': ttl {limit!r} must be positive, "
                    "or None"
                )
        time_column = _times(times, f"{names} times")
        found: dict[str, pa.Array] = {}
        # tables -> features read in one join (a feature held by several tables: alone)
        groups: dict[tuple[str, ...], tuple[tuple[str, ...], list[str]]] = {}
        with self._lock:
            segments = list(self._segments.values())
        for feature in dict.fromkeys(features):
            holding = tuple(
                s.table for s in segments if s.namespace == namespace and feature in s.columns
            )
            if not holding:
                found[feature] = pa.nulls(len(time_column))
            else:
                shared = holding if len(holding) == 1 else (*holding, "\0" + feature)
                groups.setdefault(shared, (holding, []))[1].append(feature)
        if not groups:
            return found
        by_table = {s.table: s for s in segments}
        spines: dict[str, pa.Table] = {}
        cursor = self._cursor()
        try:
            for tables, together in groups.values():
                held = [by_table[t] for t in tables]
                key_kind = held[0].key_kind
                if key_kind not in spines:
                    spines[key_kind] = pa.table(
                        {
                            "row_id": pa.array(np.arange(len(time_column), dtype=np.int32)),
                            "key": _column(keys, _KEY_TYPES[key_kind][1], f"{names} key"),
                            "ts": time_column,
                        }
                    )
                found.update(self._asof_group(cursor, spines[key_kind], held, together, ttl))
        except duckdb.Error as error:
            raise KairosError(f"{self!r}: cannot read {names!r}: {error}") from None
        finally:
            cursor.close()
        return found

    def latest_rows(self, namespace: str, features: Sequence[str]) -> pa.Table:
        """For each key, the row written last among the tables holding `features[0]`: a
        table with `key` and one column per feature (null where a table lacks it). Events of an
        `events=True` class are stored this way, keyed by their id, so this reads them back.

        >>> store = DuckDBOfflineStore(":memory:")
        >>> t = datetime(2026, 1, 1, tzinfo=UTC)
        >>> store.write_many("txn", ValueType("str"), ["t1", "t1"], [t, t],
        ...     {"at": (ValueType("datetime"), [t, t]), "amount": (ValueType("int"), [5, 7])})
        >>> store.latest_rows("txn", ["at", "amount"]).column("amount").to_pylist()
        [7]
        >>> store.close()
        """
        if not features:
            raise InvalidInput(f"latest rows of {namespace!r}: name at least one feature")
        with self._lock:
            held = [
                s
                for s in self._segments.values()
                if s.namespace == namespace and features[0] in s.columns
            ]
        kinds: dict[str, str] = {}
        for segment in held:
            for feature in features:
                if feature in segment.columns:
                    kinds.setdefault(feature, segment.columns[feature][1])
        if not held:
            return pa.table(
                {"key": pa.array([], pa.string())}
                | {f: pa.array([], _VALUE_TYPES[kinds.get(f, "str")][1]) for f in features}
            )
        stored = [f for f in features if f in kinds]
        branches = []
        for segment in held:
            columns = [
                f"{_quoted(segment.columns[f][0])} as c{i}"
                if f in segment.columns
                else f"cast(null as {_VALUE_TYPES[kinds[f]][0]}) as c{i}"
                for i, f in enumerate(stored)
            ]
            branches.append(
                f"select key, inserted_at, rowid as row_number, {', '.join(columns)} "
                f"from {_quoted(segment.table)}"
            )
        selected = ", ".join(
            f"epoch_us(c{i}) as c{i}" if kinds[f] == "timedelta" else f"c{i}"
            for i, f in enumerate(stored)
        )
        sql = (
            f"select key, {selected} from ({' union all '.join(branches)}) "
            "qualify row_number() over (partition by key order by inserted_at desc, "
            "row_number desc) = 1 order by key"
        )
        cursor = self._cursor()
        try:
            result = cursor.sql(sql).to_arrow_table()
        except duckdb.Error as error:
            raise KairosError(f"{self!r}: cannot read events of {namespace!r}: {error}") from None
        finally:
            cursor.close()
        read: dict[str, Any] = {"key": result.column(0)}
        for feature in features:
            if feature not in kinds:
                read[feature] = pa.nulls(result.num_rows)
                continue
            column = result.column(1 + stored.index(feature)).combine_chunks()
            if kinds[feature] == "timedelta":
                column = column.cast(pa.int64()).view(pa.duration("us"))
            read[feature] = column
        return pa.table(read)

    def value_kind(self, namespace: str, feature: str) -> str | None:
        """The value kind a feature was written with (`int`, `list`...), None if never written."""
        with self._lock:
            for segment in self._segments.values():
                if segment.namespace == namespace and feature in segment.columns:
                    return segment.columns[feature][1]
        return None

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

    def _asof_group(
        self,
        cursor: duckdb.DuckDBPyConnection,
        spine: pa.Table,
        held: list[_Segment],
        group: list[str],
        ttl: TTLs,
    ) -> dict[str, pa.Array]:
        """One as-of join answering every feature of `group`, all held by the tables `held`
        (one table: any number of features; several tables: one feature, over their union)."""
        rows = spine.num_rows
        time_column = spine.column("ts")
        kinds = {feature: held[0].columns[feature][1] for feature in group}
        if not rows or time_column.null_count == rows:
            return {f: pa.nulls(rows, _VALUE_TYPES[kinds[f]][1]) for f in group}
        latest, earliest = pc.max(time_column).as_py(), pc.min(time_column).as_py()
        parameters: dict[str, Any] = {"max_ts": latest}
        values = []
        for index, feature in enumerate(group):
            value = f"event.c{index}"
            if kinds[feature] == "timedelta":
                value = f"epoch_us({value})"
            limit = ttl_of(ttl, feature)
            if limit is not None:
                value = f"case when event.observed_at > spine.ts - $ttl{index} then {value} end"
                parameters[f"ttl{index}"] = limit
            values.append(value)
        limits = [ttl_of(ttl, feature) for feature in group]
        lower_bound = ""
        if all(limit is not None for limit in limits):
            try:
                parameters["min_ts"] = earliest - max(limit for limit in limits if limit)
                lower_bound = " and observed_at > $min_ts"
            except OverflowError:  # a ttl reaching before year 1 prunes nothing
                pass
        if len(held) == 1:
            segment = held[0]
            columns = [
                f"{_quoted(segment.columns[feature][0])} as c{i}" for i, feature in enumerate(group)
            ]
            events, version = _quoted(segment.table), _VERSION
            ties = segment.ties
        else:  # one feature over several tables: inserted_at orders writes across them
            feature = group[0]
            events = (
                "("
                + " union all ".join(
                    f"select key, observed_at, inserted_at, rowid as row_number, "
                    f"{_quoted(s.columns[feature][0])} as c0 from {_quoted(s.table)}"
                    for s in held
                )
                + ")"
            )
            columns = ["c0"]
            version = ", (observed_at, inserted_at, row_number) as version"
            ties = True
        sql = _ASOF.format(
            values=", ".join(values),
            columns=", ".join(columns),
            version=version if ties else "",
            events=events,
            lower_bound=lower_bound,
            inequality=_TIE_BREAKING if ties else _PLAIN,
        )
        cursor.register("kairos_spine", spine)
        try:
            result = cursor.sql(sql, params=parameters).to_arrow_table()
        finally:
            cursor.unregister("kairos_spine")
        found = {}
        for index, feature in enumerate(group):
            column = result.column(index).combine_chunks()
            if kinds[feature] == "timedelta":
                found[feature] = column.cast(pa.int64()).view(pa.duration("us"))
            else:
                found[feature] = column.cast(_VALUE_TYPES[kinds[feature]][1])
        return found

    def _load_catalog(self, connection: duckdb.DuckDBPyConnection) -> None:
        columns: dict[str, dict[str, tuple[str, str]]] = {}
        for table, feature, column, kind in connection.execute(
            "select table_name, feature, column_name, value_kind from kairos_offline_columns"
        ).fetchall():
            columns.setdefault(str(table), {})[str(feature)] = (str(column), str(kind))
        self._segments = {
            str(table): _Segment(
                str(table), str(namespace), str(key_kind), columns.get(str(table), {}), bool(ties)
            )
            for table, namespace, key_kind, ties in connection.execute(
                "select table_name, namespace, key_kind, ties from kairos_offline_segments"
            ).fetchall()
        }

    def _ensure_segment(
        self, connection: duckdb.DuckDBPyConnection, batch: CheckedBatch, features: list[str]
    ) -> _Segment:
        """The table holding exactly `features` of `batch.namespace`, created if need be, after
        checking each feature is written with the types it was first written with."""
        namespace, key_kind = batch.namespace, batch.key_kind
        wanted = set(features)
        for segment in self._segments.values():
            if segment.namespace != namespace:
                continue
            for feature in wanted & set(segment.columns):
                stored_value = segment.columns[feature][1]
                value_kind = batch.values[feature][0]
                if (_VALUE_TYPES[stored_value][0], segment.key_kind) != (
                    _VALUE_TYPES[value_kind][0],
                    key_kind,
                ):
                    raise InvalidValue(
                        f"write of '{namespace}.{feature}': it is stored with {stored_value} "
                        f"values and {segment.key_kind} keys, not {value_kind} values and "
                        f"{key_kind} keys; write it with the types it was first written with"
                    )
            if set(segment.columns) == wanted:
                return segment
        table = _segment_table(namespace, features)
        columns = _segment_columns(features)
        typed = ", ".join(
            f"{column} {_VALUE_TYPES[batch.values[feature][0]][0]}"
            for column, feature in zip(columns, features, strict=True)
        )
        connection.execute(
            f"create table {_quoted(table)} (key {_KEY_TYPES[key_kind][0]}, "
            f"observed_at TIMESTAMPTZ not null, inserted_at TIMESTAMPTZ not null, {typed})"
        )
        connection.execute(
            "insert into kairos_offline_segments values (?, ?, ?, false)",
            [table, namespace, key_kind],
        )
        for column, feature in zip(columns, features, strict=True):
            connection.execute(
                "insert into kairos_offline_columns values (?, ?, ?, ?, ?)",
                [namespace, feature, table, column, batch.values[feature][0]],
            )
        return _Segment(
            table,
            namespace,
            key_kind,
            {
                feature: (column, batch.values[feature][0])
                for column, feature in zip(columns, features, strict=True)
            },
            False,
        )


def _migrate_catalog(connection: duckdb.DuckDBPyConnection) -> None:
    """A file from before tables held several features: one catalog row per feature becomes a
    one-feature table in the new catalog; the tables themselves are kept as they are."""
    old = connection.execute(
        "select 1 from information_schema.tables where table_name = 'kairos_offline_features'"
    ).fetchall()
    if not old:
        return
    connection.execute("begin transaction")
    connection.execute(
        "insert into kairos_offline_segments select table_name, namespace, key_kind, ties "
        "from kairos_offline_features"
    )
    connection.execute(
        "insert into kairos_offline_columns select namespace, feature, table_name, 'value', "
        "value_kind from kairos_offline_features"
    )
    connection.execute("drop table kairos_offline_features")
    connection.execute("commit")


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
