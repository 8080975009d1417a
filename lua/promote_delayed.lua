--[[
  promote_delayed: move due delayed ids (run-at <= now) to pending, oldest
  first, and wake the queue's workers (lib/claimable.lua). Each move emits a
  `promoted` event, so the admin mirror re-reads the job.
  docs/explanation/protocol.md#timers-and-wake-markers.

  KEYS[1] delayed zset         P:{q}:delayed (score: run-at, ms)
  KEYS[2] pending list         P:{q}:pending

  ARGV[1] queue key prefix     P:{q}:
  ARGV[2] now (ms)
  ARGV[3] limit: at most this many ids per call

  Groups whose rate window opened by now go back to the ring as well
  (lib/groups.lua release_limited: one read of a missing key on a queue
  without groups), and the workers are woken for them.

  returns: the number of ids promoted
  errors:  none; an id whose row is gone or no longer delayed is dropped
]]
local delayed = KEYS[1]
local base, now = ARGV[1], ARGV[2]
-- @include lib/row.lua
-- @include lib/claimable.lua
-- @include lib/emit.lua

local ids = redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
local moved, prios, groups = {}, nil, nil
for _, id in ipairs(ids) do
  redis.call('ZREM', delayed, id)
  local row = base .. 'job:' .. id
  local f = row_hmget_s(row, F_STATE, 'priority', 'group')
  if f[1] == 'delayed' then
    redis.call('HSET', row, F_STATE, 'pending', 'updated_at', now)
    emit_to(base .. 'events', 'promoted', id)
    moved[#moved + 1] = id
    if f[2] then  -- its priority is kept (docs/explanation/protocol.md#scheduling)
      prios = prios or {}
      prios[#moved] = f[2]
    end
    if f[3] then  -- and its group (lib/groups.lua)
      groups = groups or {}
      groups[#moved] = f[3]
    end
  end
end
make_claimable(base, moved, prios, false, groups)
if release_limited(base, now) > 0 then
  wake_workers(base)
end
return #moved
