"""Events and windowed partial aggregates in Redis: the window state N servers share.

The engine decides what an event adds to each windowed aggregate (its filters and
projection); this module keeps it. For an events class `child` and prefix `P`:

- `P:ev:{child}`: a hash, event id -> the event as kairos stored it last (its time, the sorted
  sets it is in, its encoded row). A retried delivery (the same row) changes nothing; a new
  row under a known id replaces the old one everywhere.
- `P:ev:{child}:{fk}:{entity}`: a sorted set of the entity's encoded events scored by time in
  microseconds (the has-many of events a query reads).

For a series `A` (windowed features over the same events, filters and projection; named by a
hash of that definition and the tile geometry, so a changed one starts afresh):

- `P:ev:{child}` also holds, under `<event id>\t<series>`, the event's contribution to each
  series (time, entity, value): what makes every write idempotent, and what a replaced or
  moved event takes back.
- `P:w:{A}:r:{entity}`: a sorted set of (event id, value) scored by time: the exact rows.
- `P:w:{A}:t:{entity}`: a hash of tiles. A tile is the partial aggregate of one time bucket
  (rows, non-null values, numbers, sum and sum of squares of (number - the entity's shift,
  field `k`: its first finite number), float count, min, max: eight doubles). Level `l`
  buckets are `64 * 8**l` seconds long, so a window is at most 7 tiles per level on each side
  plus the exact rows of the two partial buckets at its edges: the cost of a query grows with
  the window's length in levels, not with its events.

A write is one Lua script per chunk of events (atomic, so replicas writing at once agree); a
removal recomputes its tiles from their rows and children. One read script answers every
window of a query. A count of rows is the sorted set's count; a window of at most `exact`
rows is answered from its rows, so it gets the arithmetic of a scan.

Whole or refused: a Redis that restarts empty loses the events with the windows, and an empty
window looks like a real 0. So the windows are answered only while Redis says it holds every
event: `P:w:loaded:{events}` (the load marker, named for the event classes, holding the
generation of the load that set it) is set when a load from the offline store completes, and
`P:w:{A}:built` when series `A` holds every event's contribution. The read script checks both
atomically with its reads and answers "not whole" instead of a window; the write script
checks the marker and says whether it wrote into a whole store (a write into an emptied one
is kept, and the load later skips that event, but nothing reads it before the load ends).
One process at a time loads, under the lease `P:w:loading:{events}`; each chunk it writes
checks that it still holds the lease, and the marker is set only by the holder of the lease
it started with: a Redis that restarts during a load is not marked whole.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kairos.errors import KairosError, OnlineStoreUnavailable
from kairos.stores.codec import decode
from kairos.stores.online.redis_scripts import (
    BUCKET,
    BUCKET_MICROS,
    DROP_LEASE_SCRIPT,
    FANOUT,
    FINISH_LOAD_SCRIPT,
    READ_SCRIPT,
    SET_BUILT_SCRIPT,
    WRITE_SCRIPT,
)

if TYPE_CHECKING:
    import redis

    from kairos.stores.online.redis import RedisOnlineStore

__all__ = [
    "BUCKET",
    "FANOUT",
    "Contribution",
    "EventRow",
    "NotWhole",
    "RedisWindowStore",
    "TileRead",
    "Written",
]

# a window read: aggregate, entity, first and last micros, exact limit, top level
_Request = tuple[str, str, int, int, int, int]
_CHUNK = 100  # events per write script: a script blocks Redis while it runs
LEASE_MS = 60_000  # a load's lease: renewed by each chunk it writes, so a dead loader's expires


class NotWhole(OnlineStoreUnavailable):
    """Redis lacks events the windows need: it restarted empty (no load marker) and the load
    from the offline store has not finished, or a series is not built yet."""


@dataclass(frozen=True)
class Written:
    """What a write did: events changed, and whether the store it wrote into was whole."""

    changed: int
    whole: bool


@dataclass(frozen=True)
class EventRow:
    """One event as stored: its id and time, the sorted sets it is in, its encoded row."""

    child: str
    event_id: str  # codec.encode_key of the id
    micros: int
    keys: Sequence[str]  # its `P:ev:{child}:{fk}:{entity}` sorted sets
    payload: bytes


@dataclass(frozen=True)
class Contribution:
    """What one event adds to one aggregate; `value` None: the event is not kept."""

    aggregate: str
    event_id: str
    micros: int
    entity: str  # codec.encode_key of the entity
    value: str | None  # tiled: '' (null), 'i<int>', 'f<float>'; raw: the encoded value
    top: int  # the highest tile level, -1 for an aggregate kept as rows only


@dataclass(frozen=True)
class TileRead:
    """One window of one entity: its exact rows, or the merged partial aggregate. Sums are of
    (number - shift): the shift is the entity's first finite number, so large numbers keep
    the precision of their spread."""

    rows: list[str] | None  # values of the window's rows ('' for null), when it is small
    count: int = 0  # rows
    present: int = 0  # non-null values
    numbers: int = 0  # values that are numbers
    total: float = 0.0  # of (number - shift)
    squares: float = 0.0
    floats: int = 0
    low: float | None = None
    high: float | None = None
    shift: float = 0.0


def _stored(row: EventRow) -> bytes:
    return f"{row.micros}\n{chr(9).join(row.keys)}\n".encode() + row.payload


def _text(c: Contribution) -> str:
    if c.value is None:
        return ""
    bucket = c.micros // BUCKET_MICROS
    return f"{c.micros}|{bucket}|{len(c.entity.encode())}|{c.entity}{c.value}"


def _float(text: bytes) -> float | None:
    return None if not text else float(text)


class RedisWindowStore:
    """Events and tiles under one Redis online store's prefix (its connections too)."""

    def __init__(self, store: RedisOnlineStore) -> None:
        import redis as redis_sync  # redis-py is imported by the first store

        self.store = store
        self.prefix = store.prefix
        self._blocking: redis.Redis = redis_sync.Redis.from_url(store.url)
        self._write = self._blocking.register_script(WRITE_SCRIPT)
        self._finish_load = self._blocking.register_script(FINISH_LOAD_SCRIPT)
        self._drop_lease = self._blocking.register_script(DROP_LEASE_SCRIPT)
        self._set_built = self._blocking.register_script(SET_BUILT_SCRIPT)
        self.loaded_key = self.lease_key = ""
        self.for_events(())
        self._read_sha = hashlib.sha1(READ_SCRIPT.encode()).hexdigest()
        # reads waiting for the next pipeline, per event loop: (requests, their replies)
        self._waiting: dict[asyncio.AbstractEventLoop, tuple[list[Any], asyncio.Future[Any]]] = {}

    def __repr__(self) -> str:
        return f"RedisWindowStore({self.store!r})"

    # --- names ----------------------------------------------------------------------------

    def row_hash(self, child: str) -> str:
        return f"{self.prefix}:ev:{child}"

    def rows_key(self, child: str, fk: str, entity: str) -> str:
        return f"{self.prefix}:ev:{child}:{fk}:{entity}"

    def aggregate_prefix(self, name: str) -> str:
        return f"{self.prefix}:w:{name}"

    def built_key(self, name: str) -> str:
        return f"{self.aggregate_prefix(name)}:built"

    def for_events(self, children: Iterable[str]) -> None:
        """Check the load marker of these event classes from now on (processes with the same
        events classes share it): `P:w:loaded:{hash}`, and its lease `P:w:loading:{hash}`."""
        named = hashlib.sha1(",".join(sorted(children)).encode()).hexdigest()[:16]
        self.loaded_key = f"{self.prefix}:w:loaded:{named}"
        self.lease_key = f"{self.prefix}:w:loading:{named}"

    def not_whole(self) -> NotWhole:
        return NotWhole(
            f"{self.store!r} lacks events its windows need (Redis lost its data: restarted "
            "empty?) and is being reloaded from the offline store; retry in a few seconds"
        )

    # --- writes (blocking: called where the events were accepted) ---------------------------

    def write(
        self,
        events: Sequence[tuple[EventRow, Sequence[Contribution]]],
        *,
        load: str | None = None,
    ) -> Written:
        """Store events with what each adds to its series: how many events changed (a retried
        delivery changes nothing), and whether the store was whole. `load`, the token of a
        held lease (`take_lease`), loads them from the offline store: an event Redis already
        has is left as it is (a server may have written a newer row since the offline store
        was read); a load that lost its lease raises NotWhole."""
        items: list[list[Any]] = []
        for row, contributions in events:
            kind = "E" if load is None else "L"
            item: list[Any] = [kind, self.row_hash(row.child), row.event_id, _stored(row)]
            item.append(len(contributions))
            for c in contributions:
                item += (self.aggregate_prefix(c.aggregate), _text(c), c.top)
            items.append(item)
        return self._run(items, load)

    def build(self, contributions: Sequence[tuple[EventRow, Contribution]]) -> None:
        """A new series' contributions of stored events, each applied only if its event is
        still that row (another server may replace it meanwhile)."""
        self._run(
            [
                [
                    "B",
                    self.row_hash(row.child),
                    row.event_id,
                    _stored(row),
                    self.aggregate_prefix(c.aggregate),
                    _text(c),
                    c.top,
                ]
                for row, c in contributions
            ]
        )

    def _run(self, items: Sequence[list[Any]], load: str | None = None) -> Written:
        changed, whole = 0, True
        keys = [self.loaded_key, self.lease_key]
        with self._failures():
            for start in range(0, len(items), _CHUNK):
                flat = [part for item in items[start : start + _CHUNK] for part in item]
                done, state = self._write(keys=keys, args=[load or "", LEASE_MS, *flat])
                if int(state) < 0:
                    raise self.not_whole()  # the load's lease is gone: Redis restarted?
                changed, whole = changed + int(done), whole and int(state) == 1
        return Written(changed, whole)

    # --- whole or not (see the module's docstring) ------------------------------------------

    def generation(self) -> str | None:
        """The load marker: the token of the load that completed last, None before one."""
        with self._failures():
            found = self._blocking.get(self.loaded_key)
        if found is None:
            return None
        return found.decode() if isinstance(found, bytes) else str(found)

    def take_lease(self) -> str | None:
        """The token of a new lease to load the store, None while another process holds it."""
        token = uuid.uuid4().hex
        with self._failures():
            taken = self._blocking.set(self.lease_key, token, nx=True, px=LEASE_MS)
        return token if taken else None

    def finish_load(self, token: str, series: Sequence[str]) -> bool:
        """Mark the store whole and `series` built, if the load `token` still holds its lease."""
        keys = [self.loaded_key, self.lease_key, *(self.built_key(name) for name in series)]
        with self._failures():
            return bool(self._finish_load(keys=keys, args=[token]))

    def drop_lease(self, token: str) -> None:
        with self._failures():
            self._drop_lease(keys=[self.lease_key], args=[token])

    def built(self, name: str) -> bool:
        with self._failures():
            return bool(self._blocking.exists(self.built_key(name)))

    def set_built(self, name: str, generation: str) -> bool:
        """Mark a series built, if the store is still the one loaded in `generation`."""
        with self._failures():
            keys = [self.loaded_key, self.built_key(name)]
            return bool(self._set_built(keys=keys, args=[generation]))

    def stored_rows(self, child: str) -> Iterator[EventRow]:
        """Every event Redis holds for `child` (for a new aggregate's first build)."""
        with self._failures():
            for event_id, stored in self._blocking.hscan_iter(self.row_hash(child), count=1000):
                if b"\t" in event_id:
                    continue  # a contribution, '<id>\t<series>'
                head, keys, payload = stored.split(b"\n", 2)
                yield EventRow(
                    child,
                    event_id.decode(),
                    int(head),
                    keys.decode().split("\t") if keys else [],
                    payload,
                )

    # --- reads ----------------------------------------------------------------------------

    async def read(self, requests: Sequence[_Request]) -> list[TileRead]:
        """Windows (aggregate, entity, first micros, last micros, exact limit, top level).
        The reads of one turn of the event loop (a query's window nodes run at once) share
        one pipeline."""
        if not requests:
            return []
        loop = asyncio.get_running_loop()
        batch = self._waiting.get(loop)
        if batch is None:
            batch = self._waiting[loop] = ([], loop.create_future())
            # a query whose other node failed first cancels its waiters: the failure is seen
            batch[1].add_done_callback(lambda replies: replies.cancelled() or replies.exception())
            loop.call_soon(self._send, loop)
        start = len(batch[0])
        batch[0].extend(requests)
        found: list[TileRead] = await asyncio.shield(batch[1])
        return found[start : start + len(requests)]

    def _send(self, loop: asyncio.AbstractEventLoop) -> None:
        requests, future = self._waiting.pop(loop)
        task = loop.create_task(self._read(requests))

        def done(task: asyncio.Task[list[TileRead]]) -> None:
            if future.done():
                return
            if task.cancelled():
                future.cancel()
            elif (error := task.exception()) is not None:
                future.set_exception(error)
            else:
                future.set_result(task.result())

        task.add_done_callback(done)

    async def _read(self, requests: Sequence[_Request]) -> list[TileRead]:
        client = self.store.client()
        args = [self._read_args(*request) for request in requests]
        try:
            replies = await self._pipeline(client, args)
            if any(isinstance(r, self.store.no_script) for r in replies):
                await client.script_load(READ_SCRIPT)
                replies = await self._pipeline(client, args)
        except self.store.unreachable as error:
            raise self.store.unavailable(error) from None
        reads: list[TileRead] = []
        for reply in replies:
            if isinstance(reply, Exception):
                raise KairosError(f"{self!r}: reading a window failed: {reply}") from reply
            if int(reply[0]) == 0:
                reads.append(TileRead([m.partition(b"\n")[2].decode() for m in reply[1]]))
                continue
            if int(reply[0]) == 2:
                reads.append(TileRead(None, count=int(reply[1])))
                continue
            count, present, numbers, total, squares, floats, low, high, shift = reply[1:]
            reads.append(
                TileRead(
                    None,
                    int(count),
                    int(present),
                    int(numbers),
                    float(total),
                    float(squares),
                    int(floats),
                    _float(low),
                    _float(high),
                    float(shift),
                )
            )
        return reads

    async def rows(self, requests: Sequence[tuple[str, str, str, int]]) -> list[list[Any]]:
        """Events (child, fk, entity, last micros), oldest first, decoded; one pipeline."""
        if not requests:
            return []
        client = self.store.client()
        try:
            async with client.pipeline(transaction=True) as pipe:  # the marker with the rows
                pipe.exists(self.loaded_key)
                for child, fk, entity, last in requests:
                    pipe.zrangebyscore(self.rows_key(child, fk, entity), "-inf", last)
                loaded, *replies = await pipe.execute()
        except self.store.unreachable as error:
            raise self.store.unavailable(error) from None
        if not loaded:
            raise self.not_whole()
        return [[decode(payload) for payload in reply] for reply in replies]

    def close(self) -> None:
        self._blocking.close()

    # --- helpers --------------------------------------------------------------------------

    def _read_args(
        self, aggregate: str, entity: str, first: int, last: int, exact: int, top: int
    ) -> list[Any]:
        args: list[Any] = [self.aggregate_prefix(aggregate), entity, first, last, exact]
        start = -(-first // BUCKET_MICROS)  # the first whole bucket in the window
        end = (last + 1) // BUCKET_MICROS  # whole buckets end before this one
        if top < 0 or start >= end:
            return [*args, first, last, "", "", 0, 0, 0]
        left, right = (first, start * BUCKET_MICROS - 1), (end * BUCKET_MICROS, last)
        edges = [x if low <= high else "" for low, high in (left, right) for x in (low, high)]
        return [*args, *edges, start, end, top]

    async def _pipeline(self, client: Any, args: list[list[Any]]) -> list[Any]:
        """One EVALSHA per `_CHUNK` windows: a query's are one call, a bulk query's a
        pipeline of them; a script that failed gives its error for each of its windows."""
        chunks = [args[i : i + _CHUNK] for i in range(0, len(args), _CHUNK)]
        flat = [[part for window in chunk for part in window] for chunk in chunks]
        replies: list[Any]
        if len(flat) == 1:  # the usual online query: no pipeline to build
            try:
                replies = [await client.evalsha(self._read_sha, 1, self.loaded_key, *flat[0])]
            except self.store.response_error as error:
                replies = [error]
        else:
            async with client.pipeline(transaction=False) as pipe:
                for arguments in flat:
                    pipe.evalsha(self._read_sha, 1, self.loaded_key, *arguments)
                replies = await pipe.execute(raise_on_error=False)
        found: list[Any] = []
        for chunk, reply in zip(chunks, replies, strict=True):
            if isinstance(reply, int):  # -1 not loaded, -2 a series not built: none is whole
                raise self.not_whole()
            found += [reply] * len(chunk) if isinstance(reply, Exception) else reply
        return found

    @contextmanager
    def _failures(self) -> Iterator[None]:
        """Redis down: the store's BackendUnavailable; a command Redis refused (out of
        memory, a key of another type): a KairosError saying so."""
        try:
            yield
        except self.store.unreachable as error:
            raise self.store.unavailable(error) from None
        except self.store.response_error as error:
            raise KairosError(f"{self!r}: Redis refused a windows write: {error}") from None
