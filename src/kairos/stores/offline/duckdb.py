"""The offline store in one DuckDB file, the embedded default.

Values are typed: one table per (namespace, feature), created on the first write, with
columns `(key, observed_at, inserted_at, value)` and the value in the DuckDB type of the
feature's `ValueType`; list, dict and `any` values are JSON in the exact text of
`kairos.stores.codec`, so a datetime inside a dict reads back as a datetime.

As-of reads are one `ASOF LEFT JOIN` of the spine (an Arrow table with an integer row id, never
keys glued into strings) against the feature table pruned to the spine's time range, ordered
back by row id: no Python loop per row, duplicate spine rows all answered.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kairos.definitions.types import ValueType
from kairos.errors import InvalidInput, InvalidValue, KairosError
from kairos.stores import codec
from kairos.stores.offline.base import (
    _KEY_TYPES,
    _VALUE_TYPES,
    TIMESTAMP,
    CheckedBatch,
    Column,
    InsertionClock,
    OneFeatureWrites,
    TTLs,
    Written,
    _column,
    _times,
    checked_batch,
    table_name,
    ttl_of,
)

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


class DuckDBOfflineStore(OneFeatureWrites):
    """Offline store in one DuckDB file (`:memory:` for a throwaway one); the folder is created.

    DuckDB lets one process write a file, so a store owns its connection (and its catalog, kept
    in memory); writes take a lock, reads run on their own cursor and may overlap.

    >>> store = DuckDBOfflineStore(":memory:")
    >>> from datetime import UTC
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
        >>> from datetime import UTC
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
        >>> from datetime import UTC
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
