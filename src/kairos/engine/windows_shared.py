"""Windowed aggregates every replica agrees on: events and tiles in the shared online store.

With a Redis online store, `write_events` (and the stream consumers, and `POST
/v1/events/{ns}`) on any server puts the event, and what it adds to each windowed aggregate,
in Redis (`stores/online/redis_windows.py`); every server's next query sees it. This module is
the engine's half: it applies each aggregate's filters and projection to an event (the same
code as the in-process index), and turns what Redis merges back into the aggregate's value.

- A window of at most `EXACT` rows is answered from its rows with the arithmetic of a scan,
  exactly as `WindowIndex` answers it; a larger one from tiles, so its float sums carry the
  rounding of a different order of additions (ints are exact up to 2**53).
- count, sum, mean and std, and min and max of an int or float feature, are tiled;
  distinct_count and min and max of other types read the window's rows.
- On first use, a server loads the events the offline store holds into Redis unless Redis
  already has them, and builds each aggregate Redis has not seen yet (a new or changed
  windowed feature) from the events Redis holds. One server loads at a time (a lease in
  Redis); the others wait for its load marker. Builds are idempotent.
- A Redis that restarts empty under running servers has no load marker: its scripts answer
  "not whole" instead of a window, every windowed answer is `OnlineStoreUnavailable` (HTTP
  503), never an empty window's 0, and the first server to notice reloads it from the
  offline store in a thread of its own. Events written meanwhile are kept (the offline store
  first, then Redis, where the load skips them) and count once the load is done.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from kairos.definitions.windows import WindowSpec
from kairos.engine.evaluate import aggregate_values
from kairos.engine.windows import EventBatch, WindowAggregate, WindowIndex, Windows, or_error
from kairos.errors import InvalidInput, KairosError, OnlineStoreUnavailable
from kairos.stores.codec import decode_text, encode, encode_key, to_micros
from kairos.stores.online.redis import RedisOnlineStore
from kairos.stores.online.redis_windows import (
    BUCKET,
    FANOUT,
    Contribution,
    EventRow,
    NotWhole,
    RedisWindowStore,
    TileRead,
)

__all__ = ["EXACT", "SharedWindows", "windows_for"]

logger = logging.getLogger(__name__)

EXACT = 256  # windows with up to this many rows are answered from their rows
_ALL_ROWS = 1 << 62
_LIMIT = 1 << 53  # microseconds a Lua double holds exactly (years 1685 to 2255)
_TILED = {"count", "sum", "mean", "std"}
_EPOCH = datetime.min
_WAIT = 0.05  # seconds between looks at the load marker while another process loads
_LOAD_CHUNK = 1000  # events of the offline store encoded and written at a time by a load


def windows_for(store: object, loader: Callable[[], Iterable[EventBatch]] | None) -> Windows:
    """Windows in Redis with a Redis online store (every server shares them), else in this
    process; `loader` gives the events the offline store holds."""
    if isinstance(store, RedisOnlineStore):
        return SharedWindows(RedisWindowStore(store), loader)
    return WindowIndex(loader)


class _Series:
    """What Redis keeps for the windowed features that share events, filters and projection
    (`count` over 1d, 7d and 90d is one series): its name there and its top tile level."""

    def __init__(self, identity: str, child: str, fk: str, spec: WindowSpec, tiled: bool) -> None:
        self.identity, self.child, self.fk, self.tiled = identity, child, fk, tiled
        self.aggregate = WindowAggregate(spec, fk)
        self.top = -1
        self.name = ""
        self.cover(spec.window)

    def cover(self, window: timedelta) -> None:
        """Keep tiles up to the largest level a `window` uses; a new top is a new series."""
        if not self.tiled:
            self.name = hashlib.sha1(self.identity.encode()).hexdigest()[:16]
            return
        seconds, top = max(1, int(window.total_seconds())), 0
        while BUCKET * FANOUT ** (top + 1) <= seconds:
            top += 1
        self.top = max(self.top, top)
        named = f"{self.identity}/{BUCKET}x{FANOUT}/{self.top}".encode()
        self.name = hashlib.sha1(named).hexdigest()[:16]

    def contribution(self, row: dict[str, Any], event_id: str, micros: int) -> Contribution:
        kept, value = self.aggregate.kept(row, _EPOCH)
        text: str | None = None
        if kept:
            text = _tiled_text(value) if self.tiled else encode(value).decode()
        entity = encode_key(row.get(self.fk))
        return Contribution(self.name, event_id, micros, entity, text, self.top)


class _Shared:
    """One windowed feature: its aggregation over a series."""

    def __init__(self, spec: WindowSpec, series: _Series) -> None:
        self.spec, self.series = spec, series

    def finish(self, read: TileRead) -> Any:
        fn, counting = self.spec.fn, self.spec.projection is None
        if read.rows is not None:
            values = [_value(text, self.series.tiled) for text in read.rows]
            if fn == "count" and counting:
                return len(values)
            return aggregate_values(fn, [v for v in values if v is not None])
        if fn == "count":
            return read.count if counting else read.present
        if read.present > read.numbers:  # as the scan fails on a value that is not a number
            raise TypeError(f"{fn} over a value that is not a number")
        n = read.numbers
        if n == 0:
            return 0 if fn == "sum" else None
        total = read.total + n * read.shift
        if fn == "sum":
            return total if read.floats else int(total)
        if fn == "mean":
            return total / n
        if fn == "std":
            if n < 2:
                return None
            spread = read.squares - read.total * read.total / n  # shifted: no cancellation
            return math.sqrt(max(spread, 0.0) / (n - 1))
        found = read.low if fn == "min" else read.high
        return found if read.floats or found is None else int(found)


def _keepable(when: datetime) -> bool:
    return -_LIMIT < to_micros(when) < _LIMIT


def _tiled_text(value: Any) -> str:
    """A value as a tile script reads it: '' (null), 'i<int>', 'f<float>', or 'x': a value
    that is not a number, which counts but adds to no sum."""
    if value is None:
        return ""
    if isinstance(value, bool | int):
        return f"i{int(value)}"
    if isinstance(value, float):
        return f"f{value!r}"
    return "x"


def _value(text: str, tiled: bool) -> Any:
    if not tiled:
        return decode_text(text)
    if not text:
        return None
    if text == "x":
        return text  # not a number: counted, and a sum over it fails as the scan's does
    return int(text[1:]) if text[0] == "i" else float(text[1:])


class SharedWindows:
    """The `Windows` of N servers on one Redis: events and windows live in Redis."""

    def __init__(
        self,
        store: RedisWindowStore,
        loader: Callable[[], Iterable[EventBatch]] | None = None,
    ) -> None:
        self.store = store
        self._aggregates: dict[tuple[str, str], _Shared] = {}
        self._series: dict[str, _Series] = {}
        self._by_child: dict[str, list[_Series]] = {}
        self._loader = loader
        self._ready = False
        self._ready_lock = threading.Lock()  # held while this process makes Redis whole
        self._reload: threading.Thread | None = None
        self._reload_lock = threading.Lock()
        self._closed = threading.Event()

    def register(
        self,
        feature: tuple[str, str],
        child: str,
        fk: str,
        spec: WindowSpec,
        value_kind: str | None = None,
    ) -> None:
        """Answer `feature` from `child` events grouped by `fk`; `value_kind` is the feature's
        type (min and max are tiled for int and float)."""
        tiled = spec.fn in _TILED or (spec.fn in ("min", "max") and value_kind in ("int", "float"))
        identity = repr((child, fk, spec.time_field, spec.filters, spec.projection, tiled))
        series = self._series.get(identity)
        if series is None:
            series = self._series[identity] = _Series(identity, child, fk, spec, tiled)
            self._by_child.setdefault(child, []).append(series)
        else:
            series.cover(spec.window)
        self._aggregates[feature] = _Shared(spec, series)

    def answers(self, feature: tuple[str, str]) -> bool:
        return feature in self._aggregates

    def write(
        self,
        child: str,
        fks: Sequence[str],
        time_field: str,
        rows: Sequence[dict[str, Any]],
        primary: str | None = None,
    ) -> int:
        """Store events of `child`, already passed by `check`, and what they add to its
        windows; returns how many events changed (a retried delivery changes nothing)."""
        self._prepare()
        written = self.store.write(self._events(child, fks, time_field, rows, primary))
        if not written.whole:  # kept in Redis (and in the offline store): counted once reloaded
            self._reload_soon()
        return written.changed

    async def values(
        self, feature: tuple[str, str], keys: Sequence[Any], nows: Sequence[datetime]
    ) -> list[Any]:
        if not self._ready:
            await asyncio.to_thread(self._prepare)
        shared = self._aggregates[feature]
        spec, series = shared.spec, shared.series
        if spec.fn == "count" and spec.projection is None:
            exact = -1  # rows in the window: counted by the sorted set, no tiles read
        else:
            exact = EXACT if series.tiled else _ALL_ROWS
        requests = []
        for key, now in zip(keys, nows, strict=True):
            first = to_micros(now - spec.window) + (0 if spec.inclusive else 1)
            last = to_micros(now)
            requests.append((series.name, encode_key(key), first, last, exact, series.top))
        try:
            found = await self.store.read(requests)
        except NotWhole as error:
            raise self._lost(error) from None
        return [or_error(shared.finish, read) for read in found]

    async def event_rows(
        self, child: str, fk: str, keys: Sequence[Any], nows: Sequence[datetime]
    ) -> list[Any]:
        if not self._ready:
            await asyncio.to_thread(self._prepare)
        pairs = zip(keys, nows, strict=True)
        requests = [(child, fk, encode_key(key), to_micros(now)) for key, now in pairs]
        try:
            return await self.store.rows(requests)
        except NotWhole as error:
            raise self._lost(error) from None

    # --- whole (see redis_windows' docstring) -----------------------------------------------

    def _prepare(self) -> None:
        """Make Redis whole on first use; once per process."""
        if self._ready:
            return
        with self._ready_lock:
            if self._ready:
                return
            self.store.for_events(self._by_child)
            self._make_whole(lost=False)
            self._ready = True

    def _lost(self, error: NotWhole) -> OnlineStoreUnavailable:
        """Redis lacks events (restarted empty): reload it, and refuse to answer meanwhile."""
        self._reload_soon()
        return OnlineStoreUnavailable(str(error))

    def _reload_soon(self) -> None:
        """Make Redis whole again in a thread, one at a time in this process (the lease makes
        it one load across processes); queries are refused until it is."""
        with self._reload_lock:
            if self._closed.is_set() or (self._reload is not None and self._reload.is_alive()):
                return
            logger.warning(
                "%r lacks events the windows need (restarted empty?): reloading it from the "
                "offline store; windowed answers are OnlineStoreUnavailable until then",
                self.store.store,
            )
            self._reload = threading.Thread(
                target=self._reload_now, name="kairos-windows-reload", daemon=True
            )
            self._reload.start()

    def _reload_now(self) -> None:
        started = time.monotonic()
        try:
            with self._ready_lock:
                self._make_whole(lost=True)
        except Exception as error:  # Redis gone again: the next query that notices retries
            if not self._closed.is_set():
                logger.warning("reloading the windows in %r failed: %s", self.store.store, error)
        else:
            logger.warning(
                "the windows in %r are whole again after %.1fs",
                self.store.store,
                time.monotonic() - started,
            )

    def _make_whole(self, lost: bool) -> None:
        """Until Redis has the load marker: load the offline store's events into it under the
        lease, or wait for the process that holds the lease. Then build the series Redis has
        not seen, in the generation of that load."""
        every = [series for group in self._by_child.values() for series in group]
        while (generation := self.store.generation()) is None:
            if self._closed.is_set():
                raise self.store.not_whole()
            token = self.store.take_lease()
            if token is None:  # another process is loading
                time.sleep(_WAIT)
                continue
            try:
                if self.store.generation() is None:  # not loaded while we took the lease
                    self._load(token, lost)
                    self.store.finish_load(token, [series.name for series in every])
            except NotWhole:  # the lease was lost mid-load (Redis restarted): again
                continue
            finally:
                self.store.drop_lease(token)
        for series in every:
            if not self.store.built(series.name):
                self._build(series, generation)

    def _load(self, token: str, lost: bool) -> None:
        """The offline store's events into Redis (the lease `token` held), skipping the ones
        Redis has: they were written since the offline store kept them."""
        if self._loader is None:
            if lost:
                logger.error(
                    "%r lost its events and there is no offline store to reload them from: "
                    "windows count only the events written from now on; set offline_store",
                    self.store.store,
                )
            return
        for child, fks, time_field, primary, rows in self._loader():
            kept = [row for row in rows if _keepable(row[time_field])]
            if len(kept) < len(rows):
                logger.warning(
                    "%d %s events from the offline store are outside the years 1685-2255 "
                    "windows in Redis keep; they are in no window",
                    len(rows) - len(kept),
                    child,
                )
            for start in range(0, len(kept), _LOAD_CHUNK):
                if self._closed.is_set():  # a closing server stops its load at a chunk
                    raise self.store.not_whole()
                chunk = kept[start : start + _LOAD_CHUNK]
                events = self._events(child, fks, time_field, chunk, primary)
                self.store.write(events, load=token)

    def _build(self, series: _Series, generation: str) -> None:
        """A new series' tiles, from the events Redis holds (skipping any event that another
        server replaces meanwhile); marked built only if Redis was not emptied meanwhile."""
        batch: list[tuple[EventRow, Contribution]] = []
        for stored in self.store.stored_rows(series.child):
            row = decode_text(stored.payload.decode())
            batch.append((stored, series.contribution(row, stored.event_id, stored.micros)))
            if len(batch) >= 1000:
                self.store.build(batch)
                batch = []
        self.store.build(batch)
        self.store.set_built(series.name, generation)

    def _events(
        self,
        child: str,
        fks: Sequence[str],
        time_field: str,
        rows: Sequence[dict[str, Any]],
        primary: str | None,
    ) -> list[tuple[EventRow, list[Contribution]]]:
        """Events of `child` as Redis keeps them, with what each adds to every series."""
        if primary is None:
            raise KairosError(f"events of {child} need an id to be shared between servers")
        every = self._by_child.get(child, ())
        events: list[tuple[EventRow, list[Contribution]]] = []
        for row in rows:
            micros = to_micros(row[time_field])
            event_id = encode_key(row.get(primary))
            keys = [self.store.rows_key(child, fk, encode_key(row.get(fk))) for fk in fks]
            events.append(
                (
                    EventRow(child, event_id, micros, keys, encode(row)),
                    [series.contribution(row, event_id, micros) for series in every],
                )
            )
        return events

    def check(self, time_field: str, rows: Sequence[dict[str, Any]]) -> None:
        for row in rows:
            when = row[time_field]
            if not _keepable(when):
                raise InvalidInput(
                    f"event time {when.isoformat()} is outside the years 1685-2255 that "
                    "windows in Redis keep exactly",
                    field=time_field,
                )

    def close(self) -> None:
        self._closed.set()
        with self._reload_lock:
            reload = self._reload
        if reload is not None:
            reload.join(timeout=10)  # a load in progress stops at its next chunk
        self.store.close()
