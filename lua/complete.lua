--[[
  complete: active -> completed, store the result, fan in to the parent.
  DESIGN §5 `complete`, §4 invariants. A same-queue parent is resolved here
  (HSETNX :processed, DECR, release at zero); a cross-queue parent gets a
  completion entry RPUSHed onto this queue's outbox in the same step.

  KEYS[1] job row              P:{q}:job:<id>
  KEYS[2] active zset          P:{q}:active
  KEYS[3] completed zset       P:{q}:completed (score: finished-at, ms)

  ARGV[1] queue name
  ARGV[2] queue key prefix     P:{q}:
  ARGV[3] job id
  ARGV[4] lease token (from claim)
  ARGV[5] result, a JSON text
  ARGV[6] now (ms)

  returns: JSON {released: [P:{q}:id...], dead: [], flow_failed: [], outbox: n}
  errors:  EMQNOJOB <queue> <id>            no such job
           EMQSTATE <queue> <id> <state>    the job is not active
           EMQLEASE <queue> <id>            the lease token is stale
]]
local row, active, completed = KEYS[1], KEYS[2], KEYS[3]
local QUEUE = ARGV[1]
-- @include lib/flow.lua
local base, id, token, result, now = ARGV[2], ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6])

local f = redis.call('HMGET', row, 'state', 'lease')
if not f[1] then
  return redis.error_reply('EMQNOJOB ' .. QUEUE .. ' ' .. id)
end
if f[1] ~= 'active' then
  return redis.error_reply('EMQSTATE ' .. QUEUE .. ' ' .. id .. ' ' .. f[1])
end
if f[2] ~= token then
  return redis.error_reply('EMQLEASE ' .. QUEUE .. ' ' .. id)
end

redis.call('ZREM', active, id)
redis.call('HDEL', row, 'lease')
redis.call('HSET', row, 'state', 'completed', 'result', result, 'finished_at', now)
redis.call('ZADD', completed, now, id)
emit(base, 'completed', id)
resolve_done(base, id, result, now)
return cjson.encode(OUT)
