--[[
  lib/emit.lua: the one writer of a queue's events stream `P:{q}:events`
  (docs/explanation/protocol.md: transitions, capped), inlined by the script loader wherever
  `@include lib/emit.lua` appears (lib/flow.lua includes it). Local
  definitions only; no key is touched until a script calls emit_to.

  Every entry is XADDed with MAXLEN ~ EVENTS_MAXLEN, so the stream never
  holds more than EVENTS_MAXLEN entries plus one listpack node (Redis trims
  whole nodes, `stream-node-max-entries`, 100 by default): the admin mirror
  reads it (one that falls further behind does a full pass instead,
  monitoring/mirror.py), and any process may follow it (protocol/live/events.py,
  which tells a follower that fell behind the cap).

  It also writes a finished job's note to its waiters, P:{q}:done:<id>
  (note_done; docs/explanation/protocol.md#waiting-for-a-result).
]]

-- @include lib/row.lua

local EVENTS_MAXLEN = 10000

-- Per-minute counters (docs/explanation/protocol.md#minute-counters): the
-- hash P:{q}:minutes is a ring of MINUTES_KEPT slots, slot = minute mod
-- MINUTES_KEPT; field m<slot> is the minute the slot holds (minutes since
-- the epoch, by Redis's clock: the events stream's entry ids), and a<slot>,
-- c<slot>, f<slot>, d<slot> count that minute's added, completed, failed
-- (attempts) and dead jobs. A slot met with an older minute is emptied
-- first, so the hash never holds more than 5 * MINUTES_KEPT fields. A
-- script checks the slot's minute once per queue and minute it counts in.
local MINUTES_KEPT = 1440
local COUNTED = {added = 'a', completed = 'c', failed = 'f', dead = 'd'}
local minute_checked = {}
-- A script that counts many jobs in one call (complete's batch) sets
-- minute_batch = {} and calls flush_minutes() before it returns: the counts
-- are summed here and written with one HINCRBY per ring and field, not one
-- per job. Other scripts leave it nil and count at once.
local minute_batch = nil

-- Count `n` jobs of `event` (when it is one of COUNTED) in the minute of
-- `ms` (ms since the epoch) on the ring of the queue whose key prefix is `base`.
local function count_minute(base, event, n, ms)
  local kind = COUNTED[event]
  if not kind or n <= 0 then
    return
  end
  local minute = math.floor(ms / 60000)
  local slot = minute % MINUTES_KEPT
  local ring = base .. 'minutes'
  if minute_checked[ring] ~= minute then
    minute_checked[ring] = minute
    local stamp = string.format('%d', minute)
    if redis.call('HGET', ring, 'm' .. slot) ~= stamp then
      redis.call('HDEL', ring, 'a' .. slot, 'c' .. slot, 'f' .. slot, 'd' .. slot)
      redis.call('HSET', ring, 'm' .. slot, stamp)
    end
  end
  if minute_batch then
    local fields = minute_batch[ring] or {}
    minute_batch[ring] = fields
    fields[kind .. slot] = (fields[kind .. slot] or 0) + n
  else
    redis.call('HINCRBY', ring, kind .. slot, n)
  end
end

-- Write the counts minute_batch summed (one HINCRBY per ring and field).
local function flush_minutes()
  for ring, fields in pairs(minute_batch or {}) do
    for field, n in pairs(fields) do
      redis.call('HINCRBY', ring, field, n)
    end
  end
  minute_batch = minute_batch and {}
end

-- One entry on `events` (the queue's P:{q}:events): e=<event>, id=<id>,
-- then any further field, value pairs the event carries (`progress`: p=<JSON>);
-- counted in its minute (the entry id's ms) when it is a COUNTED event.
-- A run of ids of one event a script holds back (emit_later), written as one
-- entry by emit_run before any other entry goes on a stream and before the
-- script returns (flush_later), so the stream still holds the script's
-- transitions in their order: nil when none is held.
local later = nil
local emit_run  -- defined below; flush_later writes the held run with it

local function flush_later()
  if later then
    local run = later
    later = nil
    emit_run(run.events, run.event, run.ids)
  end
end

-- The `id` field of an entry naming the jobs ids[from..to] (all of them
-- when from and to are nil), space-separated (ids hold no whitespace): the
-- first id whole, each later one that shares the first's REL_PREFIX bytes
-- as ':' and the rest (docs/explanation/protocol.md#relative-ids-in-a-run:
-- a flow's generated ids share 12 characters; the same rule, rel_rest in
-- lib/row.lua, as a row's relative parent id), and three or more such
-- ids in a row whose rests count up by one in hex (a flow's generated
-- ids: its prefix, then a hex serial) as one part '::<first>:<last>'. An
-- id never holds ':', so a part starting with one is relative, and one
-- starting with two a range (hex_of in lib/row.lua: canonical serials
-- only). core/events.py run_ids reads it.
local function run_text(ids, from, to)
  from, to = from or 1, to or #ids
  local first = ids[from]
  if from == to or #first < REL_PREFIX then
    return table.concat(ids, ' ', from, to)
  end
  local parts = {first}
  local low, last, count = nil, nil, 0  -- the hex range being read: first, last serial
  local head = string.sub(first, 1, REL_PREFIX)
  local function close()
    if count >= 3 then
      parts[#parts + 1] = string.format('::%x:%x', low, last)
    else
      for n = low, last do
        parts[#parts + 1] = string.format(':%x', n)
      end
    end
    low, count = nil, 0
  end
  for i = from + 1, to do
    local id = ids[i]
    -- the range's next serial (a claim's or a batch's usual case): one
    -- format and one compare, where rel_rest and hex_of take three
    -- substrings, a parse and a format for the same outcome
    if low and last < MAX_SERIAL and id == head .. string.format('%x', last + 1) then
      last, count = last + 1, count + 1
    else
      if low then
        close()
      end
      local rest = rel_rest(id, first)
      local n = hex_of(rest)
      if n then
        low, last, count = n, n, 1
      else
        parts[#parts + 1] = rest and (':' .. rest) or id
      end
    end
  end
  if low then
    close()
  end
  return table.concat(parts, ' ')
end

local function emit_to(events, event, id, ...)
  flush_later()
  local at = redis.call('XADD', events, 'MAXLEN', '~', EVENTS_MAXLEN, '*', 'e', event, 'id', id, ...)
  if COUNTED[event] then
    count_minute(string.sub(events, 1, #events - #'events'), event, 1,
      tonumber(string.match(at, '^%d+')))
  end
end

-- One entry on `events` naming the jobs `ids` (a table of at most RUN_IDS
-- ids) as run_text writes them, as a claim's `active` does; counted as
-- #ids jobs in its minute when `event` is COUNTED.
-- A run of jobs added (or completed) together costs the stream one entry (about 8 bytes
-- per generated id of one flow, 17 whole) instead of one entry per job (about 41 bytes each), and the
-- stream's bound stays its entries times RUN_IDS ids, as retention's
-- `removed` blocks (lib/lifecycle.lua) already make it.
local RUN_IDS = 100
emit_run = function(events, event, ids)
  if #ids == 0 then
    return
  end
  flush_later()
  local at = redis.call('XADD', events, 'MAXLEN', '~', EVENTS_MAXLEN, '*', 'e', event, 'id',
    run_text(ids))
  if COUNTED[event] then
    count_minute(string.sub(events, 1, #events - #'events'), event, #ids,
      tonumber(string.match(at, '^%d+')))
  end
end

-- A finished job's note to its waiters: e=<event> on `done` (P:{q}:done:<id>)
-- only if a waiter made that stream, so a job nobody waits for costs one
-- EXISTS and writes nothing. The waiters set its expiry; MAXLEN ~ 64 as
-- protocol/waits.DONE_MAXLEN.
local DONE_MAXLEN = 64
local function note_done(done, event)
  if redis.call('EXISTS', done) == 1 then
    redis.call('XADD', done, 'MAXLEN', '~', DONE_MAXLEN, '*', 'e', event)
  end
end

-- note_done for a batch (complete's): the notes are held and written by
-- flush_done(event) before the script returns, after one EXISTS of all
-- their keys; only when a waiter made one is each asked again. A batch
-- nobody waits for costs one command, not one a job.
local done_later = {}
local function note_done_later(done)
  done_later[#done_later + 1] = done
end

local function flush_done(event)
  local held = done_later
  done_later = {}
  for j = 1, #held, 1000 do  -- EXISTS takes them a thousand at a time
    local part = {unpack(held, j, math.min(j + 999, #held))}
    if redis.call('EXISTS', unpack(part)) > 0 then
      for _, done in ipairs(part) do
        note_done(done, event)
      end
    end
  end
end

-- `event` for job `id` on `events`, held back to go with the next ones of
-- the same event and stream in one entry (at most RUN_IDS ids): one XADD per
-- run instead of one per job (complete's batch). The script calls
-- flush_later() before it returns.
local function emit_later(events, event, id)
  if later and (later.events ~= events or later.event ~= event or #later.ids >= RUN_IDS) then
    flush_later()
  end
  if not later then
    later = {events = events, event = event, ids = {}}
  end
  later.ids[#later.ids + 1] = id
end
