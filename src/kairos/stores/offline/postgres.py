"""The offline store in PostgreSQL: the DuckDB store's tables and as-of semantics, shared by
every process that can reach the database.

One table per (namespace, feature), created on the first write, with columns
`(key, observed_at, inserted_at, value, event_id)` and an index on
`(key, observed_at, inserted_at, event_id)`; `event_id` is an identity column, so a tie on
`(observed_at, inserted_at)` goes to the row written last. List, dict and `any` values are kept
as `text` in the exact JSON of `kairos.stores.codec` (`jsonb` would reorder keys and drop the
codec's `-0.0`), so they decode as they do from DuckDB.

An as-of read sends the spine as three arrays (keys, times, and `WITH ORDINALITY` for the row
id) and answers each row with one backward index probe (`LEFT JOIN LATERAL ... LIMIT 1`); the
ttl is checked on that latest event only, since every older one is older still.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from kairos.backends import postgres
from kairos.backends.url import redact, scrub
from kairos.definitions.types import ValueType
from kairos.errors import InvalidInput, InvalidValue, KairosError
from kairos.stores.offline.base import (
    _KEY_TYPES,
    _VALUE_TYPES,
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

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

# value kind -> (PostgreSQL column type, psycopg type name for binary COPY)
_PG_VALUE_TYPES: dict[str, tuple[str, str]] = {
    "bool": ("boolean", "bool"),
    "int": ("bigint", "int8"),
    "float": ("double precision", "float8"),
    "str": ("text", "text"),
    "datetime": ("timestamptz", "timestamptz"),
    "date": ("date", "date"),
    "timedelta": ("interval", "interval"),
    "list": ("text", "text"),
    "vector": ("text", "text"),
    "dict": ("text", "text"),
    "any": ("text", "text"),
}
_PG_KEY_TYPES: dict[str, tuple[str, str]] = {"int": ("bigint", "int8"), "str": ("text", "text")}
_MAX_IDENTIFIER = 63  # PostgreSQL cuts longer names, which could drop the hash that keeps
# them unique

_CATALOG = """
create table if not exists {catalog} (
    namespace text not null,
    feature text not null,
    table_name text not null unique,
    value_kind text not null,
    key_kind text not null,
    primary key (namespace, feature)
)
"""

_ASOF = """
select {value}
from unnest({keys}, %(times)s::timestamptz[]) with ordinality as spine(key, ts, row_id)
left join lateral (
    select event.observed_at, event.value
    from {table} as event
    where event.key = spine.key and event.observed_at <= spine.ts
    order by event.observed_at desc, event.inserted_at desc, event.event_id desc
    limit 1
) as latest on true
order by spine.row_id
"""


def postgres_table_name(namespace: str, feature: str) -> str:
    """`table_name`, shortened (keeping its hash) to fit PostgreSQL's 63-character names.

    >>> postgres_table_name("user", "txn_count[7d]")
    'f__user__txn_count_7d__50253148eb'
    """
    name = table_name(namespace, feature)
    if len(name) <= _MAX_IDENTIFIER:
        return name
    return f"{name[: _MAX_IDENTIFIER - 13].rstrip('_')}__{name[-10:]}"


class PostgresOfflineStore(OneFeatureWrites):
    """Offline store in a PostgreSQL database (in `schema`, created if missing; else the
    connection's search path). `conninfo` is a libpq URL or `key=value` string.

    The store owns one connection behind a lock; a lost connection is reopened on next use.

    >>> store = PostgresOfflineStore("postgresql://postgres@127.0.0.1:5432/test", "demo")
    >>> from datetime import UTC
    >>> t = datetime(2026, 1, 1, tzinfo=UTC)
    >>> store.write("user", "age", ValueType("int"), ValueType("str"), ["u1"], [t], [41])
    >>> store.asof("user", "age", ["u1", "u1"], [t, t - timedelta(days=1)]).to_pylist()
    [41, None]
    >>> store.close()
    """

    def __init__(self, conninfo: str, schema: str | None = None) -> None:
        if schema is not None and not schema:
            raise InvalidInput("offline store schema is empty; name one, or pass None")
        self._conninfo = conninfo
        self.name = redact(conninfo)
        self.schema = schema
        self._lock = threading.Lock()
        self._connection: psycopg.Connection[tuple[Any, ...]] | None = None
        self._closed = False
        self._tables: dict[tuple[str, str], tuple[str, str, str]] = {}
        self._clock = InsertionClock()
        with self._lock:
            self._live()

    def __repr__(self) -> str:
        schema = "" if self.schema is None else f", schema={self.schema!r}"
        return f"PostgresOfflineStore({self.name!r}{schema})"

    def write_many(
        self,
        namespace: str,
        key_type: ValueType,
        keys: Column,
        observed_at: Column,
        values: Written,
        inserted_at: datetime | None = None,
    ) -> None:
        """Several features of the same events, in one transaction: one table each (a
        PostgreSQL as-of read is an index lookup per row, which a wide table would not make
        cheaper)."""
        from psycopg import sql

        batch_in = checked_batch(namespace, key_type, keys, observed_at, values, inserted_at)
        key_kind = batch_in.key_kind
        names = ", ".join(f"{namespace}.{feature}" for feature in batch_in.values)
        with self._lock:
            connection = self._live()
            inserted_at = self._clock.stamp(inserted_at)
            if not len(batch_in.keys):
                return
            key_list = batch_in.keys.to_pylist()
            observed_list = batch_in.observed_at.to_pylist()
            try:
                with connection.transaction():
                    for feature, (value_kind, value_column) in batch_in.values.items():
                        table = self._ensure_table(
                            connection, namespace, feature, value_kind, key_kind
                        )
                        copy = sql.SQL(
                            "copy {} (key, observed_at, inserted_at, value) "
                            "from stdin (format binary)"
                        ).format(table)
                        with connection.cursor() as cursor, cursor.copy(copy) as rows:
                            rows.set_types(
                                [
                                    _PG_KEY_TYPES[key_kind][1],
                                    "timestamptz",
                                    "timestamptz",
                                    _PG_VALUE_TYPES[value_kind][1],
                                ]
                            )
                            for key, at, value in zip(
                                key_list, observed_list, value_column.to_pylist(), strict=True
                            ):
                                rows.write_row((key, at, inserted_at, value))
            except Exception as error:
                if not postgres.is_error(error):
                    raise
                self._forget(namespace, batch_in.values)
                raise KairosError(
                    f"{self!r}: cannot write {names!r}: {self._scrub(error)}"
                ) from None
            except BaseException:
                self._forget(namespace, batch_in.values)
                raise

    def _forget(self, namespace: str, features: Iterable[str]) -> None:
        """Drop cached catalog rows a rolled-back write may have added."""
        for feature in features:
            self._tables.pop((namespace, feature), None)

    def asof_many(
        self,
        namespace: str,
        features: Sequence[str],
        keys: Column,
        times: Column,
        ttl: TTLs = None,
    ) -> dict[str, pa.Array]:
        """`asof` for each of several features of one spine."""
        return {
            feature: self.asof(namespace, feature, keys, times, ttl_of(ttl, feature))
            for feature in dict.fromkeys(features)
        }

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
        from psycopg import sql

        name = f"{namespace}.{feature}"
        if len(keys) != len(times):
            raise InvalidInput(
                f"as-of read of {name!r}: {len(keys)} keys but {len(times)} times; the spine "
                "needs one time per key"
            )
        if ttl is not None and ttl <= timedelta(0):
            raise InvalidInput(f"as-of read of {name!r}: ttl {ttl!r} must be positive, or None")
        time_column = _times(times, f"{name} times")
        with self._lock:
            connection = self._live()
            try:
                found = self._table_of(connection, namespace, feature)
                if found is None:
                    return pa.nulls(len(time_column))
                table, value_kind, key_kind = found
                arrow_type = _VALUE_TYPES[value_kind][1]
                key_column = _column(keys, _KEY_TYPES[key_kind][1], f"{name} key")
                if not len(time_column) or time_column.null_count == len(time_column):
                    return pa.nulls(len(time_column), arrow_type)
                value = sql.SQL("latest.value")
                parameters: dict[str, Any] = {
                    "keys": key_column.to_pylist(),
                    "times": time_column.to_pylist(),
                }
                if ttl is not None:
                    # interval arithmetic, so no huge ttl can overflow a timestamp
                    value = sql.SQL(
                        "case when spine.ts - latest.observed_at < %(ttl)s::interval "
                        "then latest.value end"
                    )
                    parameters["ttl"] = ttl
                query = sql.SQL(_ASOF).format(
                    value=value,
                    keys=sql.SQL("%(keys)s::{}[]").format(sql.SQL(_PG_KEY_TYPES[key_kind][0])),
                    table=table,
                )
                with connection.cursor(binary=True) as cursor:
                    cursor.execute(query, parameters)
                    rows = cursor.fetchall()
            except Exception as error:
                if not postgres.is_error(error):
                    raise
                raise KairosError(f"{self!r}: cannot read {name!r}: {self._scrub(error)}") from None
        return pa.array([row[0] for row in rows], arrow_type)

    def latest_rows(self, namespace: str, features: Sequence[str]) -> pa.Table:
        """For each key, the row written last of `features[0]`, with the other features'
        values from the same write (null where it had none): see DuckDBOfflineStore."""
        from psycopg import sql

        if not features:
            raise InvalidInput(f"latest rows of {namespace!r}: name at least one feature")
        with self._lock:
            connection = self._live()
            try:
                found = {f: self._table_of(connection, namespace, f) for f in features}
                first = found[features[0]]
                if first is None:
                    return pa.table(
                        {"key": pa.array([], pa.string())}
                        | {f: pa.array([], pa.string()) for f in features}
                    )
                stored = [f for f in features if found[f] is not None]
                joins = [
                    sql.SQL(
                        "left join {table} as {alias} on {alias}.key = latest.key "
                        "and {alias}.observed_at = latest.observed_at "
                        "and {alias}.inserted_at = latest.inserted_at"
                    ).format(table=entry[0], alias=sql.Identifier(f"f{i}"))
                    for i, f in enumerate(stored)
                    if (entry := found[f]) is not None
                ]
                query = sql.SQL(
                    "select latest.key, {values} from (select distinct on (key) key, "
                    "observed_at, inserted_at from {first} order by key, inserted_at desc, "
                    "event_id desc) as latest {joins} order by latest.key"
                ).format(
                    values=sql.SQL(", ").join(
                        sql.SQL("{}.value").format(sql.Identifier(f"f{i}"))
                        for i in range(len(stored))
                    ),
                    first=first[0],
                    joins=sql.SQL(" ").join(joins),
                )
                with connection.cursor(binary=True) as cursor:
                    cursor.execute(query)
                    rows = cursor.fetchall()
            except Exception as error:
                if not postgres.is_error(error):
                    raise
                raise KairosError(
                    f"{self!r}: cannot read events of {namespace!r}: {self._scrub(error)}"
                ) from None
        key_kind = first[2]
        columns: dict[str, Any] = {
            "key": pa.array([row[0] for row in rows], _KEY_TYPES[key_kind][1])
        }
        for feature in features:
            entry = found[feature]
            if entry is None:
                columns[feature] = pa.nulls(len(rows))
                continue
            at = 1 + stored.index(feature)
            columns[feature] = pa.array([row[at] for row in rows], _VALUE_TYPES[entry[1]][1])
        return pa.table(columns)

    def value_kind(self, namespace: str, feature: str) -> str | None:
        """The value kind a feature was written with (`int`, `list`...), None if never written."""

        with self._lock:
            connection = self._live()
            try:
                found = self._table_of(connection, namespace, feature)
            except Exception as error:
                if not postgres.is_error(error):
                    raise
                raise KairosError(
                    f"{self!r}: cannot read '{namespace}.{feature}': {self._scrub(error)}"
                ) from None
        return None if found is None else found[1]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            connection, self._connection = self._connection, None
            if connection is not None:
                connection.close()

    # --- internals ------------------------------------------------------------------------

    def _scrub(self, error: BaseException) -> str:
        return scrub(str(error).strip(), self._conninfo)

    def _qualified(self, name: str) -> sql.Identifier:
        from psycopg import sql

        return sql.Identifier(name) if self.schema is None else sql.Identifier(self.schema, name)

    def _live(self) -> psycopg.Connection[tuple[Any, ...]]:
        """The open connection (opened, or reopened after a loss); call with the lock held."""
        from psycopg import sql

        if self._closed:
            raise KairosError(f"{self!r} is closed; create a new store")
        if self._connection is not None and not self._connection.broken:
            return self._connection
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        try:
            connection = postgres.connect(
                self._conninfo, autocommit=True, connect_timeout=postgres.CONNECT_TIMEOUT
            )
        except Exception as error:
            if not postgres.is_error(error):
                raise
            raise KairosError(
                f"cannot open offline store {self!r}: {self._scrub(error)} (is the server "
                "running, and the URL's host, port, user and database right?)"
            ) from None
        try:
            connection.execute("set time zone 'UTC'")
            with connection.transaction():
                # two processes starting at once would race on create ... if not exists
                connection.execute(
                    "select pg_advisory_xact_lock(hashtext(%s))",
                    (f"kairos:offline:{self.schema}",),
                )
                if self.schema is not None:
                    connection.execute(
                        sql.SQL("create schema if not exists {}").format(
                            sql.Identifier(self.schema)
                        )
                    )
                connection.execute(
                    sql.SQL(_CATALOG).format(catalog=self._qualified("kairos_offline_features"))
                )
        except Exception as error:
            if not postgres.is_error(error):
                raise
            connection.close()
            raise KairosError(f"cannot open offline store {self!r}: {self._scrub(error)}") from None
        self._connection = connection
        return connection

    def _table_of(
        self, connection: psycopg.Connection[tuple[Any, ...]], namespace: str, feature: str
    ) -> tuple[sql.Identifier, str, str] | None:
        found = self._tables.get((namespace, feature))
        if found is None:
            from psycopg import sql

            row = connection.execute(
                sql.SQL(
                    "select table_name, value_kind, key_kind from {} "
                    "where namespace = %s and feature = %s"
                ).format(self._qualified("kairos_offline_features")),
                (namespace, feature),
            ).fetchone()
            if row is None:
                return None
            found = (str(row[0]), str(row[1]), str(row[2]))
            self._tables[(namespace, feature)] = found
        return self._qualified(found[0]), found[1], found[2]

    def _ensure_table(
        self,
        connection: psycopg.Connection[tuple[Any, ...]],
        namespace: str,
        feature: str,
        value_kind: str,
        key_kind: str,
    ) -> sql.Identifier:
        from psycopg import sql

        found = self._table_of(connection, namespace, feature)
        if found is None:
            table = postgres_table_name(namespace, feature)
            connection.execute(
                "select pg_advisory_xact_lock(hashtext(%s))",
                (f"kairos:offline:{self.schema}:{table}",),
            )
            connection.execute(
                sql.SQL(
                    "create table if not exists {} (key {} not null, "
                    "observed_at timestamptz not null, inserted_at timestamptz not null, "
                    "value {}, event_id bigint generated always as identity)"
                ).format(
                    self._qualified(table),
                    sql.SQL(_PG_KEY_TYPES[key_kind][0]),
                    sql.SQL(_PG_VALUE_TYPES[value_kind][0]),
                )
            )
            connection.execute(
                sql.SQL(
                    "create index if not exists {} on {} (key, observed_at, inserted_at, event_id)"
                ).format(sql.Identifier("i" + table[1:]), self._qualified(table))
            )
            # another process may have registered it first: keep its row, read it back
            connection.execute(
                sql.SQL("insert into {} values (%s, %s, %s, %s, %s) on conflict do nothing").format(
                    self._qualified("kairos_offline_features")
                ),
                (namespace, feature, table, value_kind, key_kind),
            )
            found = self._table_of(connection, namespace, feature)
            if found is None:  # pragma: no cover - the insert above guarantees a row
                raise KairosError(f"{self!r}: cannot register '{namespace}.{feature}'")
        table_identifier, stored_value, stored_key = found
        if (_PG_VALUE_TYPES[stored_value][0], stored_key) != (
            _PG_VALUE_TYPES[value_kind][0],
            key_kind,
        ):
            raise InvalidValue(
                f"write of '{namespace}.{feature}': it is stored with {stored_value} values "
                f"and {stored_key} keys, not {value_kind} values and {key_kind} keys; write "
                "it with the types it was first written with"
            )
        return table_identifier
