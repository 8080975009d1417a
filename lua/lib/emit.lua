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

local EVENTS_MAXLEN = 10000

-- One entry on `events` (the queue's P:{q}:events): e=<event>, id=<id>,
-- then any further field, value pairs the event carries (`progress`: p=<JSON>).
local function emit_to(events, event, id, ...)
  redis.call('XADD', events, 'MAXLEN', '~', EVENTS_MAXLEN, '*', 'e', event, 'id', id, ...)
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
