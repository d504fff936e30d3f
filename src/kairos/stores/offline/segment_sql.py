"""The SQL the DuckDB offline store runs over its Parquet segments: one as-of join per group
of features read together, and the latest row of each key for a follower. Pure text and
parameters; `duckdb.py` lists the segments, runs the query and reads the result back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kairos.stores import codec
from kairos.stores.offline.base import _VALUE_TYPES, TTLs, ttl_of
from kairos.stores.offline.segments import Listing, TableInfo

# Among events of the latest observed_at <= ts, the one inserted last wins (seq, then the row's
# place in its segment, breaks an exact tie: the later write). DuckDB's as-of picks an arbitrary
# one among equal observed_at, so a table that has ever held two events of one (key,
# observed_at), or a feature spread over several tables, is joined on the struct (observed_at,
# inserted_at, seq, row), which costs about twice the plain join; a null ts is -infinity there
# so it matches nothing (a struct with a null field compares as largest).
ASOF = """
select spine.row_id, {values}
from kairos_spine as spine
asof left join (
    select key, observed_at, {columns}{version}
    from {events}{where}
) as event
    on spine.key = event.key
    and {inequality}
"""
VERSION = ", (observed_at, inserted_at, seq, row_number) as version"
PLAIN = "spine.ts >= event.observed_at"
TIE_BREAKING = """(coalesce(spine.ts, '-infinity'::timestamptz), 'infinity'::timestamptz,
         9223372036854775807::bigint, 9223372036854775807::bigint) >= event.version"""
# one table's segments; file_row_number (a row's place in its segment) only where ties are
# broken: asking for it costs the scan its parallelism
SEGMENTS = (
    "(select *, file_row_number as row_number from read_parquet(${files}, "
    "hive_partitioning = false, file_row_number = true))"
)
SEGMENTS_PLAIN = "read_parquet(${files}, hive_partitioning = false)"


def quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def stored_sql(kind: str) -> str:
    """The DuckDB type a segment's column of this value kind reads as."""
    if kind == "timedelta":
        return "BIGINT"
    return "VARCHAR" if _VALUE_TYPES[kind][0] == "JSON" else _VALUE_TYPES[kind][0]


def asof_join(
    spine: pa.Table,
    held: list[TableInfo],
    listings: Mapping[str, Listing],
    group: list[str],
    ttl: TTLs,
) -> tuple[str, dict[str, Any]] | None:
    """The as-of join answering every feature of `group` for the `kairos_spine` table `spine`,
    all held by the tables `held` (one table: any number of features; several tables: one
    feature, over their union), and its parameters: columns `row_id, c0, c1...`, one row per
    spine row. None where it can find nothing (no spine time, no segment in range)."""
    rows = spine.num_rows
    time_column = spine.column("ts")
    if not rows or time_column.null_count == rows:
        return None
    latest, earliest = pc.max(time_column).as_py(), pc.min(time_column).as_py()
    parameters: dict[str, Any] = {"max_ts": latest}
    values = []
    for index, feature in enumerate(group):
        value = f"event.c{index}"
        limit = ttl_of(ttl, feature)
        if limit is not None:
            value = f"case when event.observed_at > spine.ts - $ttl{index} then {value} end"
            parameters[f"ttl{index}"] = limit
        values.append(value)
    limits = [ttl_of(ttl, feature) for feature in group]
    if all(limit is not None for limit in limits):
        with contextlib.suppress(OverflowError):  # a ttl reaching before year 1: no bound
            parameters["min_ts"] = earliest - max(limit for limit in limits if limit)
    # the segments holding rows the join can use: observed by the spine's last time, and
    # (with ttls) after its first time less the longest ttl
    until = codec.to_micros(latest)
    since = codec.to_micros(parameters["min_ts"]) if "min_ts" in parameters else None
    files: dict[str, list[str]] = {}
    # the row filters, only where a kept segment holds rows they drop (a filter that keeps
    # every row still costs the scan a comparison per row)
    conditions: dict[str, str] = {}
    for info in held:
        kept = [
            s
            for s in listings[info.table].segments
            if s.earliest <= until and (since is None or s.latest > since)
        ]
        if kept:
            files[info.table] = [s.path for s in kept]
        if any(s.latest > until for s in kept):
            conditions["max_ts"] = "observed_at <= $max_ts"
        if since is not None and any(s.earliest <= since for s in kept):
            conditions["min_ts"] = "observed_at > $min_ts"
    held = [info for info in held if info.table in files]
    if not held:
        return None
    for bound in ("max_ts", "min_ts"):
        if bound not in conditions:
            parameters.pop(bound, None)
    where = f"\n    where {' and '.join(conditions.values())}" if conditions else ""
    for index, info in enumerate(held):
        parameters[f"files{index}"] = files[info.table]
    if len(held) == 1:
        info = held[0]
        columns = [f"{quoted(info.columns[feature][0])} as c{i}" for i, feature in enumerate(group)]
        ties = listings[info.table].ties
        events = (SEGMENTS if ties else SEGMENTS_PLAIN).format(files="files0")
    else:  # one feature over several tables: inserted_at orders writes across them
        feature = group[0]
        events = (
            "("
            + " union all ".join(
                f"select key, observed_at, inserted_at, seq, row_number, "
                f"{quoted(info.columns[feature][0])} as c0 "
                f"from {SEGMENTS.format(files=f'files{index}')}"
                for index, info in enumerate(held)
            )
            + ")"
        )
        columns = ["c0"]
        ties = True
    return ASOF.format(
        values=", ".join(values),
        columns=", ".join(columns),
        version=VERSION if ties else "",
        events=events,
        where=where,
        inequality=TIE_BREAKING if ties else PLAIN,
    ), parameters


def latest_rows(
    features: Sequence[str],
    held: list[TableInfo],
    kinds: Mapping[str, str],
    listings: Mapping[str, Listing],
    after: Mapping[str, int],
) -> tuple[str, dict[str, Any]] | None:
    """The query reading, for each key, the row written last among `held` after the position
    `after` (`{}`: every row): columns `key, c0, c1...` for the features of `kinds`, in key
    order (`after` given: in the order they were written). None where no segment is newer."""
    stored = [f for f in features if f in kinds]
    branches = []
    parameters: dict[str, Any] = {}
    for index, info in enumerate(held):
        since = after.get(info.table, 0)
        files = [s.path for s in listings[info.table].segments if s.seq > since]
        if not files:
            continue
        columns = [
            f"{quoted(info.columns[f][0])} as c{i}"
            if f in info.columns
            else f"cast(null as {stored_sql(kinds[f])}) as c{i}"
            for i, f in enumerate(stored)
        ]
        parameters[f"files{index}"] = files
        parameters[f"after{index}"] = since
        branches.append(
            f"select key, inserted_at, seq, row_number, {', '.join(columns)} "
            f"from {SEGMENTS.format(files=f'files{index}')} where seq > $after{index}"
        )
    if not branches:
        return None
    selected = ", ".join(f"c{i}" for i in range(len(stored)))
    order = "key" if not after else "inserted_at, seq, row_number"
    return (
        f"select key, {selected} from ({' union all '.join(branches)}) "
        "qualify row_number() over (partition by key order by inserted_at desc, "
        f"seq desc, row_number desc) = 1 order by {order}"
    ), parameters
