--[[
  recover_stalled: active ids whose lease deadline has passed go back to
  pending; one that has stalled more than the limit, or was cancelled while
  it ran (docs/explanation/lifecycle.md), dies through the same path as a failure (its
  parent's policy applies). Recovered jobs wake the queue's workers
  (lib/claimable.lua). docs/explanation/protocol.md#leases-and-recovery.

  KEYS[1] active zset          P:{q}:active (score: lease deadline, ms)
  KEYS[2] pending list         P:{q}:pending

  ARGV[1] queue name
  ARGV[2] queue key prefix     P:{q}:
  ARGV[3] now (ms)
  ARGV[4] limit: at most this many ids per call
  ARGV[5] stall limit: a job may stall this many times; one more and it dies

  returns: JSON {recovered: n, released, dead, flow_failed, outbox}
  errors:  none
]]
local active = KEYS[1]
local QUEUE = ARGV[1]
-- @include lib/flow.lua
local base, now, max_stalls = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[5])

local ids = redis.call('ZRANGEBYSCORE', active, '-inf', '(' .. now, 'LIMIT', 0, tonumber(ARGV[4]))
OUT.recovered = 0
local back, prios, groups = {}, nil, nil
for _, id in ipairs(ids) do
  local row = base .. 'job:' .. id
  local f = row_hmget_s(row, F_STATE, 'priority', 'group')
  if f[1] ~= 'active' then
    redis.call('ZREM', active, id)
    left_active(base, f[3] or nil)
  else
    local stalls = redis.call('HINCRBY', row, 'stalls', 1)
    if redis.call('HEXISTS', row, 'cancel') == 1 then
      kill(base, id, 'cancelled', now)  -- cancelled while it ran (docs/explanation/lifecycle.md)
    elseif stalls > max_stalls then
      kill(base, id, 'stalled ' .. stalls .. ' times (lease expired; limit ' .. max_stalls .. ')', now)
    else
      redis.call('ZREM', active, id)
      left_active(base, f[3] or nil)
      redis.call('HDEL', row, 'lease')
      redis.call('HSET', row, F_STATE, 'pending', 'updated_at', now)
      back[#back + 1] = id
      if f[2] then  -- its priority is kept (docs/explanation/protocol.md#scheduling)
        prios = prios or {}
        prios[#back] = f[2]
      end
      if f[3] then  -- and its group (lib/groups.lua)
        groups = groups or {}
        groups[#back] = f[3]
      end
      emit(base, 'stalled', id)
      OUT.recovered = OUT.recovered + 1
    end
  end
end
make_claimable(base, back, prios, false, groups)
return cjson.encode(OUT)
