"""The offline store in a folder of Parquet segments read by DuckDB, the embedded default.

Values are typed: one table per set of features written together (a folder, `segments.py`),
created on the first write, with columns `(key, observed_at, inserted_at, seq, value...)` and
each value in the type of the feature's `ValueType`; list, dict and `any` values are JSON in the
exact text of `kairos.stores.codec`, so a datetime inside a dict reads back as a datetime.

Every write adds one immutable segment file and every read lists the files again, so any number
of processes on one project (`kairos serve --workers N`, `kairos query`, a backfill) write and
read the store at the same time; small segments are merged as they pile up. A store from before
(one DuckDB file at the same path) is moved into segments the first time it is opened, and the
file is kept beside it as `<name>.old` (`migration.py`).

As-of reads are one `ASOF LEFT JOIN` of the spine (an Arrow table with an integer row id, never
keys glued into strings) against the feature's segments pruned to the spine's time range, put
back in spine order by row id: no Python loop per row, duplicate spine rows all answered.
The SQL text of the reads is in `segment_sql.py`.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

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
from kairos.stores.offline.migration import opened_root
from kairos.stores.offline.segment_sql import asof_join, latest_rows
from kairos.stores.offline.segments import (
    _STORED_TYPES,
    Layout,
    Listing,
    Segment,
    TableInfo,
)

T = TypeVar("T")

MERGE_AT = 16  # this many of a table's newest segments, of one size tier, are merged
TIER_BASE = 64 << 10  # bytes: tier 0 is under this, tier t under TIER_BASE * 16**t
MERGED_TIERS = 4  # segments of tiers 0-3 are merged (up to 16 of 256 MiB), bigger ones never
_READ_ATTEMPTS = 4  # a read that meets a segment merged away lists the files again

# Does this write give a (key, observed_at) a second event? (a small batch: asked in Python)
_SMALL_BATCH = 4096
_TIES_IN_BATCH = "select 1 from kairos_batch group by key, observed_at having count(*) > 1 limit 1"
_TIES_WITH_STORED = """
select 1 from read_parquet($files, hive_partitioning = false) as stored
semi join kairos_batch as batch
    on stored.key = batch.key and stored.observed_at = batch.observed_at
where stored.observed_at between $earliest and $latest
limit 1
"""


def _segment_table(namespace: str, features: Sequence[str]) -> str:
    # "+" never occurs in a feature's name, so a group's name is no single feature's
    return table_name(namespace, "+".join(features))


def _segment_columns(features: Sequence[str]) -> list[str]:
    return ["value"] if len(features) == 1 else [f"v{i}" for i in range(len(features))]


def _readable(column: pa.ChunkedArray | pa.Array, kind: str) -> pa.Array:
    """A column as read back, in the Arrow type of its value kind."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if kind == "timedelta":
        return column.cast(pa.int64()).view(pa.duration("us"))
    return column.cast(_VALUE_TYPES[kind][1])


class DuckDBOfflineStore(OneFeatureWrites):
    """Offline store in a folder of Parquet segments (`:memory:` for a throwaway one, in a
    temporary folder removed on close); the folder is created. Any number of processes and
    threads may write and read one store at once.

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
        self._scratch: Path | None = None
        if self.path == ":memory:":
            self._scratch = Path(tempfile.mkdtemp(prefix="kairos-offline-"))
            root = self._scratch
        else:
            root = opened_root(Path(self.path))
        self._layout = Layout(root)
        try:
            connection = duckdb.connect(":memory:")
            connection.execute("set global TimeZone = 'UTC'")  # every cursor's too
            connection.execute("set temp_directory = $folder", {"folder": str(root / ".spill")})
        except duckdb.Error as error:
            raise KairosError(f"cannot open offline store {self.path!r}: {error}") from None
        self._connection: duckdb.DuckDBPyConnection | None = connection
        self._lock = threading.Lock()
        self._clock = InsertionClock()

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
        them all is one join. The write is one segment: whole or absent.

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
        self._live()
        count = len(batch_in.keys)
        if not count:
            return
        try:
            info = self._table_for(batch_in, features)
            with self._layout.table_lock(info.table):
                listing = self._layout.listing(info.table)
                with self._lock:  # stamped under the table's lock: later writes stamp later
                    stamped = self._clock.stamp(inserted_at)
                seq = listing.seq + 1
                batch = pa.table(
                    {
                        "key": batch_in.keys,
                        "observed_at": batch_in.observed_at,
                        "inserted_at": pa.array(
                            np.full(count, codec.to_micros(stamped), dtype=np.int64)
                        ).view(TIMESTAMP),
                        "seq": pa.array(np.full(count, seq, dtype=np.int64)),
                        **{
                            info.columns[feature][0]: _stored(*batch_in.values[feature])
                            for feature in features
                        },
                    }
                )
                observed = batch.column("observed_at").cast(pa.int64())
                span = (pc.min(observed).as_py(), pc.max(observed).as_py())
                if not listing.ties and self._brings_ties(listing, batch, span):
                    self._layout.mark_ties(info.table)
                self._layout.add(info, (seq, seq), span, batch.to_batches())
                if len(listing.segments) + 1 >= MERGE_AT:
                    self._merge_small(info)
        except duckdb.Error as error:
            raise KairosError(f"{self!r}: cannot write {names!r}: {error}") from None
        except OSError as error:
            raise KairosError(f"{self!r}: cannot write {names!r}: {error}") from None

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
        self._live()
        found: dict[str, pa.Array] = {}
        # tables -> features read in one join (a feature held by several tables: alone)
        groups: dict[tuple[str, ...], tuple[tuple[str, ...], list[str]]] = {}
        tables = self._tables()
        for feature in dict.fromkeys(features):
            holding = tuple(
                t.table
                for t in tables.values()
                if t.namespace == namespace and feature in t.columns
            )
            if not holding:
                found[feature] = pa.nulls(len(time_column))
            else:
                shared = holding if len(holding) == 1 else (*holding, "\0" + feature)
                groups.setdefault(shared, (holding, []))[1].append(feature)
        if not groups:
            return found
        spines: dict[str, pa.Table] = {}
        try:
            for held, together in groups.values():
                infos = [tables[t] for t in held]
                key_kind = infos[0].key_kind
                if key_kind not in spines:
                    spines[key_kind] = pa.table(
                        {
                            "row_id": pa.array(np.arange(len(time_column), dtype=np.int32)),
                            "key": _column(keys, _KEY_TYPES[key_kind][1], f"{names} key"),
                            "ts": time_column,
                        }
                    )
                read = functools.partial(
                    self._asof_group, spines[key_kind], infos, group=together, ttl=ttl
                )
                found.update(self._reading(held, read))
        except duckdb.Error as error:
            raise KairosError(f"{self!r}: cannot read {names!r}: {error}") from None
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
        return self.changed_rows(namespace, features, {})[0]

    def changed_rows(
        self, namespace: str, features: Sequence[str], after: Mapping[str, int]
    ) -> tuple[pa.Table, dict[str, int]]:
        """`latest_rows` of only the rows written after `after` (a position this returned
        before; `{}` for every row), in the order they were written, and the position to ask
        from next time. A follower of the store (a window index in another process) reads
        what others wrote with it; when nothing was written it costs a few directory listings.

        >>> store = DuckDBOfflineStore(":memory:")
        >>> from datetime import UTC
        >>> t = datetime(2026, 1, 1, tzinfo=UTC)
        >>> write = lambda key: store.write("txn", "at", ValueType("datetime"),
        ...     ValueType("str"), [key], [t], [t])
        >>> write("t1")
        >>> rows, position = store.changed_rows("txn", ["at"], {})
        >>> write("t2")
        >>> store.changed_rows("txn", ["at"], position)[0].column("key").to_pylist()
        ['t2']
        >>> store.close()
        """
        if not features:
            raise InvalidInput(f"latest rows of {namespace!r}: name at least one feature")
        self._live()
        held = [
            t
            for t in self._tables().values()
            if t.namespace == namespace and features[0] in t.columns
        ]
        kinds: dict[str, str] = {}
        for info in held:
            for feature in features:
                if feature in info.columns:
                    kinds.setdefault(feature, info.columns[feature][1])
        try:
            return self._reading(
                [t.table for t in held],
                lambda listings: self._latest(namespace, features, held, kinds, listings, after),
            )
        except duckdb.Error as error:
            raise KairosError(f"{self!r}: cannot read events of {namespace!r}: {error}") from None

    def value_kind(self, namespace: str, feature: str) -> str | None:
        """The value kind a feature was written with (`int`, `list`...), None if never written."""
        for info in self._tables().values():
            if info.namespace == namespace and feature in info.columns:
                return info.columns[feature][1]
        return None

    def close(self) -> None:
        with self._lock:
            connection, self._connection = self._connection, None
            if connection is not None:
                connection.close()
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)
                self._scratch = None

    # --- internals ------------------------------------------------------------------------

    def _live(self) -> duckdb.DuckDBPyConnection:
        if self._connection is None:
            raise KairosError(f"{self!r} is closed; create a new store")
        return self._connection

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        with self._lock:
            return self._live().cursor()

    def _tables(self) -> dict[str, TableInfo]:
        with self._lock:
            return self._layout.tables()

    def _reading(self, tables: Sequence[str], read: Callable[[dict[str, Listing]], T]) -> T:
        """`read` over the tables' segments as listed now, listed and read again when a
        segment was merged away between the listing and the read."""
        for attempt in range(_READ_ATTEMPTS):
            listings = {}
            for table in tables:
                listings[table] = self._layout.listing(table)
            try:
                return read(listings)
            except duckdb.IOException:
                if attempt + 1 == _READ_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _table_for(self, batch: CheckedBatch, features: list[str]) -> TableInfo:
        """The table holding exactly `features` of `batch.namespace`, created if need be, after
        checking each feature is written with the types it was first written with."""
        found = self._checked(self._tables(), batch, features)
        if found is not None:
            return found
        with self._layout.store_lock():  # one process at a time makes tables
            found = self._checked(self._tables(), batch, features)
            if found is not None:
                return found
            columns = _segment_columns(features)
            info = TableInfo(
                _segment_table(batch.namespace, features),
                batch.namespace,
                batch.key_kind,
                {
                    feature: (column, batch.values[feature][0])
                    for column, feature in zip(columns, features, strict=True)
                },
                time.time_ns(),
            )
            with self._lock:
                return self._layout.create(info)

    def _checked(
        self, tables: Mapping[str, TableInfo], batch: CheckedBatch, features: list[str]
    ) -> TableInfo | None:
        namespace, key_kind = batch.namespace, batch.key_kind
        wanted = set(features)
        found = None
        for info in tables.values():
            if info.namespace != namespace:
                continue
            for feature in wanted & set(info.columns):
                stored_value = info.columns[feature][1]
                value_kind = batch.values[feature][0]
                if (_VALUE_TYPES[stored_value][0], info.key_kind) != (
                    _VALUE_TYPES[value_kind][0],
                    key_kind,
                ):
                    raise InvalidValue(
                        f"write of '{namespace}.{feature}': it is stored with {stored_value} "
                        f"values and {info.key_kind} keys, not {value_kind} values and "
                        f"{key_kind} keys; write it with the types it was first written with"
                    )
            if found is None and set(info.columns) == wanted:
                found = info
        return found

    def _brings_ties(self, listing: Listing, batch: pa.Table, span: tuple[int, int]) -> bool:
        """Whether `batch` (its rows observed in `span`) holds two events of one (key,
        observed_at), or one a stored segment holds too."""
        pairs = batch.select(["key", "observed_at"])
        if pairs.num_rows <= _SMALL_BATCH:  # a Python set beats starting a query this small
            keys = pairs.column("key").to_pylist()
            times = pairs.column("observed_at").cast(pa.int64()).to_pylist()
            if len(set(zip(keys, times, strict=True))) < pairs.num_rows:
                return True
        overlapping = [
            s.path for s in listing.segments if s.earliest <= span[1] and s.latest >= span[0]
        ]
        if not overlapping and pairs.num_rows <= _SMALL_BATCH:
            return False  # the usual case for new events: later than every stored one
        observed = pairs.column("observed_at")
        cursor = self._cursor()
        try:
            cursor.register("kairos_batch", pairs)
            if pairs.num_rows > _SMALL_BATCH and cursor.sql(_TIES_IN_BATCH).fetchall():
                return True
            if not overlapping:
                return False
            return bool(
                cursor.sql(
                    _TIES_WITH_STORED,
                    params={
                        "files": overlapping,
                        "earliest": pc.min(observed).as_py(),
                        "latest": pc.max(observed).as_py(),
                    },
                ).fetchall()
            )
        finally:
            cursor.close()

    def _merge_small(self, info: TableInfo) -> None:
        """Merge the table's newest segments into one while `MERGE_AT` of them are of one size
        tier (16 times bigger each): a row is rewritten once per tier it climbs, a few times in
        all, and a table keeps a few segments per tier. Rows keep their seq and, within a seq,
        their order. Hold the table's lock."""
        while True:
            listing = self._layout.listing(info.table)
            sizes = self._layout.sizes(listing)
            tiers = [_tier(sizes.get(s.path, 0)) for s in listing.segments]
            if not tiers or tiers[-1] >= MERGED_TIERS:
                return
            run = len(tiers) - 1
            while run > 0 and tiers[run - 1] == tiers[-1]:
                run -= 1
            newest = list(listing.segments[run:])
            if len(newest) < MERGE_AT:
                return
            span = (min(s.earliest for s in newest), max(s.latest for s in newest))
            self._layout.add(info, (newest[0].first, newest[-1].seq), span, _rows_of(newest))
            self._layout.remove(info.table, [s.path for s in newest])

    def _asof_group(
        self,
        spine: pa.Table,
        held: list[TableInfo],
        listings: Mapping[str, Listing],
        *,
        group: list[str],
        ttl: TTLs,
    ) -> dict[str, pa.Array]:
        """One as-of join answering every feature of `group`, all held by the tables `held`
        (one table: any number of features; several tables: one feature, over their union)."""
        rows = spine.num_rows
        kinds = {feature: held[0].columns[feature][1] for feature in group}
        query = asof_join(spine, held, listings, group, ttl)
        if query is None:
            return {f: pa.nulls(rows, _VALUE_TYPES[kinds[f]][1]) for f in group}
        sql, parameters = query
        cursor = self._cursor()
        try:
            cursor.register("kairos_spine", spine)
            result = cursor.sql(sql, params=parameters).to_arrow_table()
        finally:
            cursor.close()
        # back into spine order: one row per spine row came back, each with its row id, so
        # placing them by id is one pass (an ORDER BY sorted them: ~9% of the query's CPU)
        if result.num_rows != rows:  # pragma: no cover - an ASOF LEFT JOIN keeps each row once
            raise KairosError(f"{self!r}: the as-of join returned {result.num_rows} of {rows} rows")
        place = np.empty(rows, dtype=np.int64)
        place[result.column(0).to_numpy()] = np.arange(rows, dtype=np.int64)
        order = pa.array(place)
        return {
            feature: _readable(result.column(1 + index).take(order), kinds[feature])
            for index, feature in enumerate(group)
        }

    def _nothing(
        self, held: list[TableInfo], features: Sequence[str], kinds: Mapping[str, str]
    ) -> pa.Table:
        key_kind = held[0].key_kind if held else "str"
        return _no_rows(key_kind, tuple((f, kinds.get(f, "str")) for f in features))

    def _latest(
        self,
        namespace: str,
        features: Sequence[str],
        held: list[TableInfo],
        kinds: Mapping[str, str],
        listings: Mapping[str, Listing],
        after: Mapping[str, int],
    ) -> tuple[pa.Table, dict[str, int]]:
        position = {**after, **{info.table: listings[info.table].seq for info in held}}
        if after and all(listings[info.table].seq <= after.get(info.table, 0) for info in held):
            return self._nothing(held, features, kinds), position  # a follower's usual answer
        query = latest_rows(features, held, kinds, listings, after)
        if query is None:
            return self._nothing(held, features, kinds), position
        sql, parameters = query
        stored = [f for f in features if f in kinds]
        cursor = self._cursor()
        try:
            result = cursor.sql(sql, params=parameters).to_arrow_table()
        finally:
            cursor.close()
        read: dict[str, Any] = {"key": result.column(0)}
        for feature in features:
            if feature not in kinds:
                read[feature] = pa.nulls(result.num_rows)
            else:
                read[feature] = _readable(result.column(1 + stored.index(feature)), kinds[feature])
        return pa.table(read), position


@functools.lru_cache(maxsize=256)
def _no_rows(key_kind: str, features: tuple[tuple[str, str], ...]) -> pa.Table:
    """An empty table of `key` and each (feature, value kind)."""
    return pa.table(
        {"key": pa.array([], _KEY_TYPES[key_kind][1])}
        | {feature: pa.array([], _VALUE_TYPES[kind][1]) for feature, kind in features}
    )


def _tier(size: int) -> int:
    tier, limit = 0, TIER_BASE
    while size >= limit:
        tier, limit = tier + 1, limit * 16
    return tier


def _rows_of(segments: Sequence[Segment]) -> Iterator[pa.RecordBatch]:
    """The rows of segments, one after another, each in its own order: what a merge keeps."""
    for segment in segments:
        with pq.ParquetFile(segment.path) as source:
            yield from source.iter_batches(65536)


def _stored(kind: str, values: pa.Array) -> pa.Array:
    """A checked column as a segment keeps it."""
    if kind == "timedelta":
        return values.cast(pa.int64())
    return values.cast(_STORED_TYPES[kind])
