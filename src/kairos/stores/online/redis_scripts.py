"""The Lua scripts the Redis window store runs (`redis_windows.py` describes the keys they
keep): one write script per chunk of events, one read script answering every window of a
query, and the three that mark a load or a series whole. Each runs atomically in Redis, so
replicas writing at once agree, and a read checks the store is whole in the same step.
"""

from __future__ import annotations

FANOUT = 8  # a level-l tile covers BUCKET * FANOUT**l seconds
MICROS = 1_000_000
BUCKET = 64  # seconds in a level-0 tile; a window's edges closer than that are read as rows
BUCKET_MICROS = BUCKET * MICROS

# the tile geometry, the same in both scripts and in Python
_GEOMETRY = f"local BUCKET, FANOUT = {BUCKET_MICROS}, {FANOUT}\n"

_COMMON = """
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
WRITE_SCRIPT = (
    _GEOMETRY
    + _COMMON
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
READ_SCRIPT = (
    _GEOMETRY
    + _COMMON
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
FINISH_LOAD_SCRIPT = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
for i = 3, #KEYS do redis.call('SET', KEYS[i], ARGV[1]) end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
return 1
"""
# KEYS: a load's lease. ARGV: its token. Gives the lease back if it is still that load's.
DROP_LEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# KEYS: the load marker, a series' built marker. ARGV: the generation the build started in.
# A build that ran across a restart (or a reload) does not mark its series built.
SET_BUILT_SCRIPT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[1])
return 1
"""
