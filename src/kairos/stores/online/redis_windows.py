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

FANOUT = 8  # a level-l tile covers BUCKET * FANOUT**l seconds
_MICROS = 1_000_000
BUCKET = 64  # seconds in a level-0 tile; a window's edges closer than that are read as rows
_BUCKET_MICROS = BUCKET * _MICROS
# a window read: aggregate, entity, first and last micros, exact limit, top level
_Request = tuple[str, str, int, int, int, int]
_CHUNK = 100  # events per write script: a script blocks Redis while it runs
LEASE_MS = 60_000  # a load's lease: renewed by each chunk it writes, so a dead loader's expires

# the tile geometry, the same in both scripts and in Python
_LUA_GEOMETRY = f"local BUCKET, FANOUT = {_BUCKET_MICROS}, {FANOUT}\n"

_LUA_COMMON = """
local function num(s)
  if s == nil or s == '' then return nil end
  local x = tonumber(s)
  if x == nil then
    if s == 'nan' or s == '-nan' then return 0/0 end
    if s == 'inf' then return math.huge end
    if s == '-inf' then return -math.huge end
  end
  return x
end
local function fmt(x)
  if x == nil then return '' end
  return string.format('%.17g', x)
end
-- a tiled value: '' (null), 'x' (a value that is not a number), 'i<int>' or 'f<float>';
-- returns the number (or nil), 1 if a float, 1 if a value is there
local function value_of(text)
  if text == '' then return nil, 0, 0 end
  local kind = string.sub(text, 1, 1)
  if kind == 'x' then return nil, 0, 1 end
  return num(string.sub(text, 2)), (kind == 'f') and 1 or 0, 1
end
-- a tile: rows, values, numbers, sum and sum of squares of (number - k), floats, min, max:
-- eight little-endian doubles; k is the entity's shift (its first finite number), so sums of
-- squares of large numbers keep their precision
local function empty_tile() return {0, 0, 0, 0, 0, 0, nil, nil} end
local function parse_tile(t)
  if not t then return empty_tile() end
  local c, n, m, s, q, f, lo, hi = struct.unpack('<dddddddd', t)
  if m == 0 then lo, hi = nil, nil end
  return {c, n, m, s, q, f, lo, hi}
end
local function add_value(s, v, isf, present, k)
  s[1] = s[1] + 1
  s[2] = s[2] + present
  if v ~= nil then
    local d = v - k
    s[3], s[4], s[5], s[6] = s[3] + 1, s[4] + d, s[5] + d * d, s[6] + isf
    if s[7] == nil or v < s[7] then s[7] = v end
    if s[8] == nil or v > s[8] then s[8] = v end
  end
end
local function merge_into(s, c, n, m, total, squares, floats, lo, hi)
  s[1], s[2] = s[1] + c, s[2] + n
  if m > 0 then
    s[3], s[4], s[5], s[6] = s[3] + m, s[4] + total, s[5] + squares, s[6] + floats
    if s[7] == nil or lo < s[7] then s[7] = lo end
    if s[8] == nil or hi > s[8] then s[8] = hi end
  end
end
-- the value part of a raw member: '<event id>\\n<value>'
local function member_value(m)
  return string.sub(m, string.find(m, '\\n', 1, true) + 1)
end
"""

# KEYS: the load marker, the load's lease. ARGV: the load's token ('' for a write), the lease's
# time to live in ms, then items, each
#   'E', row hash, event id, stored row, n, then n times (series prefix, contribution, top):
#        an event and what it adds to each series (contribution '' = nothing);
#   'L': the same, skipped if the event is there (a load from the offline store);
#   'B', row hash, event id, expected stored row, series prefix, contribution, top: one
#        series' contribution of a stored event (a build), skipped unless the row is still.
# stored row: '<micros>\n<key>\t<key>...\n<payload>'; contribution:
# '<micros>|<bucket>|<len>|<entity><value>', kept in the row hash under '<id>\t<prefix>'.
# top: the series' highest tile level, -1 for a series kept as rows only.
# Returns {events changed, 1 if the store was whole (loaded) / 0 if not / -1: the load has
# lost its lease (Redis restarted, or the lease expired and another process loads)}.
_WRITE = (
    _LUA_GEOMETRY
    + _LUA_COMMON
    + """
local function parse_row(stored)
  local a = string.find(stored, '\\n', 1, true)
  local b = string.find(stored, '\\n', a + 1, true)
  local keys, start = {}, a + 1
  while start < b do
    local e = string.find(stored, '\\t', start, true)
    if e == nil or e > b then e = b end
    keys[#keys + 1] = string.sub(stored, start, e - 1)
    start = e + 1
  end
  return string.sub(stored, 1, a - 1), keys, string.sub(stored, b + 1)
end
local function parse_contribution(c)
  local a = string.find(c, '|', 1, true)
  local b = string.find(c, '|', a + 1, true)
  local d = string.find(c, '|', b + 1, true)
  local n = tonumber(string.sub(c, b + 1, d - 1))
  return string.sub(c, 1, a - 1), tonumber(string.sub(c, a + 1, b - 1)),
         string.sub(c, d + 1, d + n), string.sub(c, d + n + 1)
end
-- (a whole number below 1e14 prints as its digits, as tile_fields of the reads prints it)
local function field(level, index)
  return level .. ':' .. index
end
-- tiles read and changed by this script (by tiles key, then field), written back at its end
local cache, keys_in_order = {}, {}
local function tiles_of(tiles)
  local found = cache[tiles]
  if found == nil then
    found = {}
    cache[tiles] = found
    keys_in_order[#keys_in_order + 1] = tiles
  end
  return found
end
local function get_tile(tiles, f)
  local held = tiles_of(tiles)
  local s = held[f]
  if s == nil then
    s = parse_tile(redis.call('HGET', tiles, f))
    held[f] = s
  end
  return s
end
-- the shift of an entity's sums (field 'k' of its tiles), false while it has no number
local shifts, new_shifts = {}, {}
local function shift_of(tiles)
  local k = shifts[tiles]
  if k == nil then
    local found = redis.call('HGET', tiles, 'k')
    k = found and tonumber(found) or false
    shifts[tiles] = k
  end
  return k
end
-- a tile computed again from what it covers: its bucket's rows at level 0, else its children
-- (a removal recomputes rather than subtracts, so an inf or a huge value leaves no trace)
local function rebuilt(tiles, raw, level, index, k)
  local s = empty_tile()
  if level == 0 then
    local members = redis.call('ZRANGEBYSCORE', raw, string.format('%.0f', index * BUCKET),
                               string.format('%.0f', index * BUCKET + BUCKET - 1))
    for _, m in ipairs(members) do
      local v, isf, present = value_of(member_value(m))
      add_value(s, v, isf, present, k)
    end
    return s
  end
  for j = 0, FANOUT - 1 do
    local t = get_tile(tiles, field(level - 1, index * FANOUT + j))
    merge_into(s, t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8])
  end
  return s
end
local function apply(prefix, id, contribution, top, sign)
  local micros, bucket, entity, text = parse_contribution(contribution)
  local raw, tiles = prefix .. ':r:' .. entity, prefix .. ':t:' .. entity
  local member = id .. '\\n' .. text
  if sign > 0 then
    redis.call('ZADD', raw, micros, member)
  else
    redis.call('ZREM', raw, member)
  end
  if top < 0 then return end
  local v, isf, present = value_of(text)
  local k = shift_of(tiles)
  if k == false then
    k = 0
    if v ~= nil and sign > 0 then  -- the entity's first number: its shift from now on
      if v == v and v ~= math.huge and v ~= -math.huge then k = v end
      shifts[tiles], new_shifts[tiles] = k, true
    end
  end
  -- every level's tile of this bucket, the ones not yet held read in one HMGET
  local held, fields, indexes, missing = tiles_of(tiles), {}, {}, {}
  local size = 1
  for level = 0, top do
    indexes[level] = math.floor(bucket / size)
    fields[level] = field(level, indexes[level])
    if held[fields[level]] == nil then missing[#missing + 1] = fields[level] end
    size = size * FANOUT
  end
  if #missing > 0 then
    local found = redis.call('HMGET', tiles, unpack(missing))
    for j, f in ipairs(missing) do held[f] = parse_tile(found[j]) end
  end
  for level = 0, top do
    if sign > 0 then
      add_value(held[fields[level]], v, isf, present, k)
    else
      held[fields[level]] = rebuilt(tiles, raw, level, indexes[level], k)
    end
  end
end
-- one series' new contribution against its old one; returns the field's new value, false
-- to delete it, nil if nothing changed
local function contribute(id, prefix, contribution, top, old)
  if (old or '') == contribution then return nil end
  if old then apply(prefix, id, old, top, -1) end
  if contribution == '' then return false end
  apply(prefix, id, contribution, top, 1)
  return contribution
end
local function save(hash, sets, deletes)
  if #sets > 0 then redis.call('HSET', hash, unpack(sets)) end
  if #deletes > 0 then redis.call('HDEL', hash, unpack(deletes)) end
end

local whole = 1
if ARGV[1] ~= '' then
  if redis.call('GET', KEYS[2]) ~= ARGV[1] then return {0, -1} end
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
elseif redis.call('EXISTS', KEYS[1]) == 0 then
  whole = 0  -- kept, but unread until the load from the offline store is done
end
local changed, i = 0, 3
while i <= #ARGV do
  local kind, hash, id, stored = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  if kind == 'E' or kind == 'L' then
    local n = tonumber(ARGV[i + 4])
    local fields = {id}
    for j = 1, n do fields[j + 1] = id .. '\\t' .. ARGV[i + 2 + 3 * j] end
    local old = redis.call('HMGET', hash, unpack(fields))
    local sets, deletes = {}, {}
    if kind == 'L' and old[1] then
      n = 0  -- a load from the offline store never replaces what a server wrote since
    elseif old[1] ~= stored then
      if old[1] then
        local _, keys, payload = parse_row(old[1])
        for _, key in ipairs(keys) do redis.call('ZREM', key, payload) end
      end
      local micros, keys, payload = parse_row(stored)
      for _, key in ipairs(keys) do redis.call('ZADD', key, micros, payload) end
      sets[1], sets[2] = id, stored
      changed = changed + 1
    end
    for j = 1, n do
      local at = i + 2 + 3 * j
      local now = contribute(id, ARGV[at], ARGV[at + 1], tonumber(ARGV[at + 2]), old[j + 1])
      if now then
        sets[#sets + 1], sets[#sets + 2] = fields[j + 1], now
      elseif now == false then
        deletes[#deletes + 1] = fields[j + 1]
      end
    end
    save(hash, sets, deletes)
    i = i + 5 + 3 * tonumber(ARGV[i + 4])
  else
    local prefix, contribution, top = ARGV[i + 4], ARGV[i + 5], tonumber(ARGV[i + 6])
    local name = id .. '\\t' .. prefix
    local old = redis.call('HMGET', hash, id, name)
    if old[1] == stored then
      local now = contribute(id, prefix, contribution, top, old[2])
      if now then
        save(hash, {name, now}, {})
      elseif now == false then
        save(hash, {}, {name})
      end
    end
    i = i + 7
  end
end
for _, tiles in ipairs(keys_in_order) do
  local sets, deletes = {}, {}
  for f, t in pairs(cache[tiles]) do
    if t[1] <= 0 then
      deletes[#deletes + 1] = f
    else
      sets[#sets + 1] = f
      sets[#sets + 1] = struct.pack('<dddddddd', t[1], t[2], t[3], t[4], t[5], t[6], t[7] or 0,
                                    t[8] or 0)
    end
  end
  if new_shifts[tiles] then
    sets[#sets + 1], sets[#sets + 2] = 'k', fmt(shifts[tiles])
  end
  save(tiles, sets, deletes)
end
return {changed, whole}
"""
)

# KEYS: the load marker. ARGV: windows of 12 values: series prefix, entity, first micros, last
# micros, exact limit, the two edge ranges (4 values, '' when none), the whole buckets
# [first, end) the tiles cover, the top level. Returns for each {0, members} (the window's
# rows), {1, rows, values, numbers, sum and squares of (number - shift), floats, min, max,
# shift} as text, or with an exact limit below 0 {2, rows}; or, instead of any window, -1
# when the store is not loaded and -2 when a series is not built.
_READ = (
    _LUA_GEOMETRY
    + _LUA_COMMON
    + """
-- the tiles covering whole buckets [lo, hi): at most 7 per level on each side
local function tile_fields(lo, hi, top)
  local left, right = {}, {}
  local size, level = 1, 0
  while lo < hi and level < top do
    local parent = size * FANOUT
    local up, down = math.ceil(lo / parent) * parent, math.floor(hi / parent) * parent
    if up >= down then break end
    while lo < up do
      left[#left + 1] = level .. ':' .. lo / size
      lo = lo + size
    end
    while hi > down do
      hi = hi - size
      right[#right + 1] = level .. ':' .. hi / size
    end
    size, level = parent, level + 1
  end
  while lo < hi do
    left[#left + 1] = level .. ':' .. lo / size
    lo = lo + size
  end
  for i = #right, 1, -1 do left[#left + 1] = right[i] end
  return left
end

local function window(a)
  local raw, tiles = ARGV[a] .. ':r:' .. ARGV[a + 1], ARGV[a] .. ':t:' .. ARGV[a + 1]
  local count = redis.call('ZCOUNT', raw, ARGV[a + 2], ARGV[a + 3])
  local exact = tonumber(ARGV[a + 4])
  if exact < 0 then return {2, count} end  -- a count of rows: the sorted set counts them
  if count <= exact then
    return {0, redis.call('ZRANGEBYSCORE', raw, ARGV[a + 2], ARGV[a + 3])}
  end
  local fields = tile_fields(tonumber(ARGV[a + 9]), tonumber(ARGV[a + 10]),
                             tonumber(ARGV[a + 11]))
  table.insert(fields, 1, 'k')
  local found = redis.call('HMGET', tiles, unpack(fields))
  local k = found[1] and tonumber(found[1]) or 0
  local s = empty_tile()
  for e = a + 5, a + 7, 2 do
    if ARGV[e] ~= '' then
      for _, m in ipairs(redis.call('ZRANGEBYSCORE', raw, ARGV[e], ARGV[e + 1])) do
        local v, isf, present = value_of(member_value(m))
        add_value(s, v, isf, present, k)
      end
    end
  end
  for i = 2, #found do
    local t = found[i]
    if t then  -- merged without a table per tile
      local c, n, m, total, squares, floats, lo, hi = struct.unpack('<dddddddd', t)
      merge_into(s, c, n, m, total, squares, floats, lo, hi)
    end
  end
  return {1, fmt(s[1]), fmt(s[2]), fmt(s[3]), fmt(s[4]), fmt(s[5]), fmt(s[6]), fmt(s[7]),
          fmt(s[8]), fmt(k)}
end

if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local built = {}
for a = 1, #ARGV, 12 do
  if not built[ARGV[a]] then
    if redis.call('EXISTS', ARGV[a] .. ':built') == 0 then return -2 end
    built[ARGV[a]] = true
  end
end
local replies = {}
for a = 1, #ARGV, 12 do replies[#replies + 1] = window(a) end
return replies
"""
)

# KEYS: the load marker, the load's lease, then the built marker of each series the load
# filled. ARGV: the load's token. The store is marked whole (generation: the token) only if
# the load still holds its lease; returns 1 if it was.
_FINISH_LOAD = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
for i = 3, #KEYS do redis.call('SET', KEYS[i], ARGV[1]) end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
return 1
"""
# KEYS: a load's lease. ARGV: its token. Gives the lease back if it is still that load's.
_DROP_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# KEYS: the load marker, a series' built marker. ARGV: the generation the build started in.
# A build that ran across a restart (or a reload) does not mark its series built.
_SET_BUILT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[1])
return 1
"""


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
    bucket = c.micros // _BUCKET_MICROS
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
        self._write = self._blocking.register_script(_WRITE)
        self._finish_load = self._blocking.register_script(_FINISH_LOAD)
        self._drop_lease = self._blocking.register_script(_DROP_LEASE)
        self._set_built = self._blocking.register_script(_SET_BUILT)
        self.loaded_key = self.lease_key = ""
        self.for_events(())
        self._read_sha = hashlib.sha1(_READ.encode()).hexdigest()
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
                await client.script_load(_READ)
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
        start = -(-first // _BUCKET_MICROS)  # the first whole bucket in the window
        end = (last + 1) // _BUCKET_MICROS  # whole buckets end before this one
        if top < 0 or start >= end:
            return [*args, first, last, "", "", 0, 0, 0]
        left, right = (first, start * _BUCKET_MICROS - 1), (end * _BUCKET_MICROS, last)
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
