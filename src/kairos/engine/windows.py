"""An in-process index of events and windowed aggregates over them.

Events (rows of an `events=True` class) are kept per parent entity, sorted by time. For each
windowed aggregate the index keeps, per entity, the times and projected values of the rows
that pass its fixed filters, with prefix counts, sums and sums of squares, and sparse tables
for min and max. A query for `(now - window, now]` finds its two edges by binary search and
answers count, sum, mean and std from prefix differences and min and max from two table
lookups: its cost grows with log(events), not with the events in the window
(`distinct_count` still scans the window). Online and offline use this same code.

An event is identified by its class's primary key: the same event sent twice (a retried
delivery) is kept once, and a different event under an id already seen replaces it. An index
can be given a loader (the events a durable store already holds), read once on first use.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from kairos.definitions.windows import WindowSpec
from kairos.engine.evaluate import Compiled, aggregate_values, compile_expression

# Windows with up to this many rows are summed exactly like a scan; larger ones use prefix
# differences (O(1), but a float total carries the rounding of the whole history).
EXACT_WINDOW = 4096


@dataclass
class _Series:
    """One entity's rows for one aggregate: sorted times, values and prefix aggregates."""

    times: list[datetime] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)
    rows: list[int] = field(default_factory=lambda: [0])  # prefix count of rows
    present: list[int] = field(default_factory=lambda: [0])  # prefix count of non-null values
    sums: list[Any] = field(default_factory=lambda: [0])
    squares: list[Any] = field(default_factory=lambda: [0])
    mins: list[list[Any]] = field(default_factory=list)  # sparse tables, level k covers 2**k
    maxs: list[list[Any]] = field(default_factory=list)
    numeric: bool = False
    stale: bool = False  # a late event arrived: prefixes and tables are rebuilt on next read

    def add(self, when: datetime, value: Any, numeric: bool) -> None:
        self.numeric = numeric
        if self.stale or (self.times and when < self.times[-1]):
            at = bisect.bisect_right(self.times, when)
            self.times.insert(at, when)
            self.values.insert(at, value)
            self.stale = True
            return
        self.times.append(when)
        self.values.append(value)
        self._append_prefix(value, numeric)
        self._append_tables()

    def remove(self, when: datetime, value: Any) -> None:
        """Drop one row (a replaced event); prefixes and tables are rebuilt on next read."""
        start, end = bisect.bisect_left(self.times, when), bisect.bisect_right(self.times, when)
        for at in range(start, end):
            kept = self.values[at]
            if kept is value or kept == value or (_is_nan(kept) and _is_nan(value)):
                del self.times[at], self.values[at]
                self.stale = True
                return

    def _append_prefix(self, value: Any, numeric: bool) -> None:
        self.rows.append(self.rows[-1] + 1)
        self.present.append(self.present[-1] + (value is not None))
        # ints stay ints (exact); floats accumulate as floats
        number = value if numeric and type(value) in (int, float) else 0  # a str adds nothing
        self.sums.append(self.sums[-1] + number)
        self.squares.append(self.squares[-1] + number * number)

    def _append_tables(self) -> None:
        n = len(self.values)
        if not self.mins:
            self.mins.append([])
            self.maxs.append([])
        self.mins[0].append(self.values[-1])
        self.maxs[0].append(self.values[-1])
        level = 1
        while (1 << level) <= n:
            if len(self.mins) <= level:
                self.mins.append([])
                self.maxs.append([])
            start = n - (1 << level)
            half = start + (1 << (level - 1))
            previous_min, previous_max = self.mins[level - 1], self.maxs[level - 1]
            self.mins[level].append(_least(previous_min[start], previous_min[half]))
            self.maxs[level].append(_most(previous_max[start], previous_max[half]))
            level += 1

    def _rebuild(self) -> None:
        fresh = _Series(numeric=self.numeric)
        for when, value in zip(self.times, self.values, strict=True):
            fresh.times.append(when)
            fresh.values.append(value)
            fresh._append_prefix(value, self.numeric)
            fresh._append_tables()
        self.__dict__.update(fresh.__dict__)

    def window(self, start: datetime, end: datetime, inclusive: bool) -> tuple[int, int]:
        if self.stale:
            self._rebuild()
        find = bisect.bisect_left if inclusive else bisect.bisect_right
        return find(self.times, start), bisect.bisect_right(self.times, end)

    def extreme(self, tables: list[list[Any]], i: int, j: int, pick: Callable[..., Any]) -> Any:
        if j <= i:
            return None
        level = (j - i).bit_length() - 1
        return pick(tables[level][i], tables[level][j - (1 << level)])


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _least(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else min(a, b)


def _most(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else max(a, b)


class WindowAggregate:
    def __init__(self, spec: WindowSpec, fk: str) -> None:
        self.spec = spec
        self.fk = fk
        self.filters: list[Compiled] = [compile_expression(f) for f in spec.filters]
        self.projection = None if spec.projection is None else compile_expression(spec.projection)
        self.numeric = spec.fn in ("sum", "mean", "std")
        self.series: dict[Any, _Series] = {}

    def add(self, row: dict[str, Any], when: datetime, epoch: datetime) -> None:
        kept, value = self.kept(row, epoch)
        if kept:
            self.series.setdefault(row.get(self.fk), _Series()).add(when, value, self.numeric)

    def remove(self, row: dict[str, Any], when: datetime, epoch: datetime) -> None:
        kept, value = self.kept(row, epoch)
        series = self.series.get(row.get(self.fk))
        if kept and series is not None:
            series.remove(when, value)

    def kept(self, row: dict[str, Any], epoch: datetime) -> tuple[bool, Any]:
        """Whether the row passes the filters, and the value it adds to the aggregate."""
        try:
            if not all(f((), epoch, row) is True for f in self.filters):
                return False, None
        except Exception:  # a filter that cannot judge this row does not keep it
            return False, None
        if self.projection is None:
            return True, True  # counting rows: any non-null marker
        try:
            return True, self.projection((), epoch, row)
        except Exception:  # a projection that fails on this row counts as null
            return True, None

    def value(self, key: Any, now: datetime) -> Any:
        spec = self.spec
        series = self.series.get(key)
        if series is None:
            return 0 if spec.fn in ("count", "sum", "distinct_count") else None
        i, j = series.window(now - spec.window, now, spec.inclusive)
        n = series.present[j] - series.present[i]
        fn = spec.fn
        if fn == "count":
            return series.rows[j] - series.rows[i] if self.projection is None else n
        if fn == "sum":
            return series.sums[j] - series.sums[i] if n else 0
        if fn == "distinct_count" or (fn in ("sum", "mean", "std") and j - i <= EXACT_WINDOW):
            # small windows (and distinct counts) use the scan's own arithmetic: same answer
            return aggregate_values(fn, [v for v in series.values[i:j] if v is not None])
        if n == 0:
            return None
        if fn == "mean":
            return (series.sums[j] - series.sums[i]) / n
        if fn == "min":
            return series.extreme(series.mins, i, j, _least)
        if fn == "max":
            return series.extreme(series.maxs, i, j, _most)
        if fn == "std":
            if n < 2:
                return None
            total = series.sums[j] - series.sums[i]
            spread = series.squares[j] - series.squares[i] - total * total / n
            return math.sqrt(max(spread, 0.0) / (n - 1))
        raise ValueError(f"unknown aggregation {fn!r}")


# (child namespace, foreign keys, time field, primary key, rows): one batch of events
EventBatch = tuple[str, Sequence[str], str, str | None, Sequence[dict[str, Any]]]


class WindowIndex:
    """Events by entity and the windowed aggregates registered over them (thread-safe).

    `loader`, if given, returns the events to start from; it runs once, on first use."""

    def __init__(self, loader: Callable[[], Iterable[EventBatch]] | None = None) -> None:
        self._lock = threading.Lock()
        self._events: dict[tuple[str, str], dict[Any, tuple[list[datetime], list[dict[str, Any]]]]]
        self._events = {}
        self._by_id: dict[str, dict[Any, dict[str, Any]]] = {}
        self._aggregates: dict[tuple[str, str], WindowAggregate] = {}
        self._by_child: dict[str, list[WindowAggregate]] = {}
        self._time_field: dict[str, str] = {}
        self._loader = loader
        self._load_lock = threading.Lock()

    def register(
        self,
        feature: tuple[str, str],
        child: str,
        fk: str,
        spec: WindowSpec,
        value_kind: str | None = None,
    ) -> None:
        """Answer `feature` (namespace, name) from `child` events grouped by `fk`."""
        aggregate = WindowAggregate(spec, fk)
        self._aggregates[feature] = aggregate
        self._by_child.setdefault(child, []).append(aggregate)
        self._time_field[child] = spec.time_field

    def write(
        self,
        child: str,
        fks: Sequence[str],
        time_field: str,
        rows: Sequence[dict[str, Any]],
        primary: str | None = None,
    ) -> int:
        """Add typed event rows of `child`, indexed under each foreign key in `fks`; with
        `primary`, an event already held under its id is skipped when identical and replaced
        otherwise. Returns how many rows changed the index."""
        self._load()
        with self._lock:
            return self._add(child, fks, time_field, primary, rows)

    def _load(self) -> None:
        if self._loader is None:
            return
        with self._load_lock:
            loader = self._loader
            if loader is None:
                return
            batches = list(loader())  # a failing load is tried again on next use
            with self._lock:
                for child, fks, time_field, primary, rows in batches:
                    self._add(child, fks, time_field, primary, rows)
            self._loader = None

    def _add(
        self,
        child: str,
        fks: Sequence[str],
        time_field: str,
        primary: str | None,
        rows: Sequence[dict[str, Any]],
    ) -> int:
        epoch = datetime.min
        seen = self._by_id.setdefault(child, {}) if primary is not None else None
        changed = 0
        for row in rows:
            if seen is not None:
                event_id = row.get(primary) if primary is not None else None
                before = seen.get(event_id)
                if before is not None:
                    if before == row:
                        continue  # the same event again: a retried delivery
                    self._drop(child, fks, time_field, before, epoch)
                seen[event_id] = row
            when = row[time_field]
            for fk in fks:
                times, kept = self._events.setdefault((child, fk), {}).setdefault(
                    row.get(fk), ([], [])
                )
                at = bisect.bisect_right(times, when)
                times.insert(at, when)
                kept.insert(at, row)
            for aggregate in self._by_child.get(child, ()):
                aggregate.add(row, when, epoch)
            changed += 1
        return changed

    def _drop(
        self,
        child: str,
        fks: Sequence[str],
        time_field: str,
        row: dict[str, Any],
        epoch: datetime,
    ) -> None:
        when = row[time_field]
        for fk in fks:
            found = self._events.get((child, fk), {}).get(row.get(fk))
            if found is None:
                continue
            times, kept = found
            for at in range(bisect.bisect_left(times, when), bisect.bisect_right(times, when)):
                if kept[at] is row:
                    del times[at], kept[at]
                    break
        for aggregate in self._by_child.get(child, ()):
            aggregate.remove(row, when, epoch)

    def rows(self, child: str, fk: str, key: Any, now: datetime) -> list[dict[str, Any]]:
        """The entity's events with time <= now, oldest first."""
        self._load()
        with self._lock:
            found = self._events.get((child, fk), {}).get(key)
            if found is None:
                return []
            times, kept = found
            return [dict(r) for r in kept[: bisect.bisect_right(times, now)]]

    def value(self, feature: tuple[str, str], key: Any, now: datetime) -> Any:
        self._load()
        with self._lock:  # a read may rebuild a series after late events
            return self._aggregates[feature].value(key, now)

    def answers(self, feature: tuple[str, str]) -> bool:
        return feature in self._aggregates

    async def values(
        self, feature: tuple[str, str], keys: Sequence[Any], nows: Sequence[datetime]
    ) -> list[Any]:
        """`value` of each (key, now); a row that cannot be answered holds its exception."""
        pairs = zip(keys, nows, strict=True)
        return [or_error(self.value, feature, key, now) for key, now in pairs]

    def close(self) -> None:
        """Nothing to release: the events live in this process."""

    def check(self, time_field: str, rows: Sequence[dict[str, Any]]) -> None:
        """Any event can be kept here."""

    async def event_rows(
        self, child: str, fk: str, keys: Sequence[Any], nows: Sequence[datetime]
    ) -> list[Any]:
        """`rows` of each (key, now); a row that cannot be answered holds its exception."""
        pairs = zip(keys, nows, strict=True)
        return [or_error(self.rows, child, fk, key, now) for key, now in pairs]


def or_error(lookup: Callable[..., Any], *args: Any) -> Any:
    """`lookup(*args)`, or the exception it raised: one row's error, not the query's."""
    try:
        return lookup(*args)
    except Exception as error:  # e.g. distinct values that cannot be hashed
        return error


class Windows(Protocol):
    """Where events and their windowed aggregates live: this process (`WindowIndex`) or a
    store every replica shares (`SharedWindows`)."""

    def register(
        self,
        feature: tuple[str, str],
        child: str,
        fk: str,
        spec: WindowSpec,
        value_kind: str | None = None,
    ) -> None: ...

    def write(
        self,
        child: str,
        fks: Sequence[str],
        time_field: str,
        rows: Sequence[dict[str, Any]],
        primary: str | None = None,
    ) -> int: ...

    def answers(self, feature: tuple[str, str]) -> bool: ...

    async def values(
        self, feature: tuple[str, str], keys: Sequence[Any], nows: Sequence[datetime]
    ) -> list[Any]: ...

    async def event_rows(
        self, child: str, fk: str, keys: Sequence[Any], nows: Sequence[datetime]
    ) -> list[Any]: ...

    def close(self) -> None: ...

    def check(self, time_field: str, rows: Sequence[dict[str, Any]]) -> None:
        """Raise InvalidInput for an event these windows cannot keep, before it is stored."""
