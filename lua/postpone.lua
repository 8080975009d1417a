--[[
  postpone: an active job goes back to delayed without spending its attempt
  (a handler raised emq.RateLimited(retry_after_ms), docs/explanation/protocol.md#scheduling): its
  attempt count is taken back and it runs again after retry_after_ms. A
  job with an `inc` (it added children: a step job that moves itself,
  job.move_to_delayed) counts one more in `waits`, as wait_children does:
  its next run's add_children draws other ids.

  KEYS[1] job row              P:{q}:job:<id>
  KEYS[2] delayed zset         P:{q}:delayed (score: run-at, ms)
  KEYS[3] active zset          P:{q}:active

  ARGV[1] queue name
  ARGV[2] job id
  ARGV[3] lease token (from claim)
  ARGV[4] now (ms)
  ARGV[5] retry after (ms, >= 0)

  returns: the run-at (ms)
  errors:  EMQNOJOB <queue> <id>            no such job
           EMQSTATE <queue> <id> <state>    the job is not active (a replay
           of this call, same token, answers the run-at it wrote)
           EMQLEASE <queue> <id>            the lease token is stale
]]
local row, delayed, active = KEYS[1], KEYS[2], KEYS[3]
-- @include lib/row.lua
-- @include lib/claimable.lua
-- @include lib/emit.lua
local queue, id, token, now = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local base = row:sub(1, #row - #id - 4)  -- P:{q}: (row is P:{q}:job:<id>)

local f = row_hmget_s(row, F_STATE, 'lease', 'attempts', 'group', 'inc')
if not f[1] then
  return redis.error_reply('EMQNOJOB ' .. queue .. ' ' .. id)
end
if f[1] ~= 'active' then
  if f[1] == 'delayed' and f[2] == token then
    return redis.call('ZSCORE', delayed, id)
  end
  return redis.error_reply('EMQSTATE ' .. queue .. ' ' .. id .. ' ' .. f[1])
end
if f[2] ~= token then
  return redis.error_reply('EMQLEASE ' .. queue .. ' ' .. id)
end
local run_at = now + tonumber(ARGV[5])
redis.call('ZREM', active, id)
left_active(base, f[4] or nil)
redis.call('HSET', row, F_STATE, 'delayed', 'updated_at', now,
  'attempts', math.max(0, (tonumber(f[3]) or 1) - 1))
if f[5] then  -- a parent (a step job that added children): its next run draws other ids
  redis.call('HINCRBY', row, 'waits', 1)  -- (docs/explanation/protocol.md#step-jobs)
end
make_delayed(base, id, run_at)
emit_to(base .. 'events', 'postponed', id)
return run_at
