--[[
  claim: pop up to K pending ids; each becomes active with a fresh lease token
  and deadline, its attempt counted. docs/explanation/protocol.md#claim. Keeps the queue's
  wake marker true (lib/claimable.lua, docs/explanation/no-polling.md): it is put back when
  jobs are left pending, so the next idle worker wakes too, and removed when
  this call drained pending, so no worker wakes for nothing.

  KEYS[1] pending list         P:{q}:pending
  KEYS[2] active zset          P:{q}:active (score: lease deadline, ms)
  KEYS[3] lease sequence       P:{q}:lease:seq (string counter)

  ARGV[1] queue key prefix     P:{q}: (job rows are P:{q}:job:<id>, same slot)
  ARGV[2] count K (integer >= 1)
  ARGV[3] now (ms)
  ARGV[4] lease length (ms)
  ARGV[5] call token: a fresh random string per claim call; the reply is kept
          under P:{q}:claim:<token> for the lease length, so a replay of the
          same call (redis-py re-sends a command whose reply was lost, or a
          worker asks again with the token of a claim that raised) gets the
          same jobs instead of leasing a second batch
  ARGV[6] rate limit: at most this many claims per window ('0' = no limit),
          counted for all workers in the hash P:{q}:limiter {start, n}
          (docs/explanation/protocol.md#scheduling RATE_LIMIT)
  ARGV[7] rate window (ms): a window opens at the first claim after the
          last one closed

  Order (docs/explanation/protocol.md#scheduling): priorities > 0 (P:{q}:prioritized, scores < 0, see
  lib/claimable.lua), then the pending list (priority 0), then priorities < 0;
  FIFO within a priority. A paused queue (P:{q}:paused) gives nothing.

  Emits one `active` entry on P:{q}:events (lib/emit.lua) per call that
  leased jobs, naming their ids space-separated: one XADD per claim, not per
  job (docs/explanation/protocol.md#events).

  returns: a JSON array (one bulk string: the host decodes it in one C call
           instead of parsing 13 replies per job), 13 entries per claimed job:
           id, lease token, name, payload, attempts, max_attempts, backoff_ms,
           parent, parent_queue, parent_policy, created_at, timeout_ms, priority
           (strings; an absent field is false);
           '{"paused":1}' when the queue is paused, '{"wait":ms}' when the
           rate limit's window is full (ms until it opens) and a job is
           claimable ('[]' when none is: nothing to wait for); a replay answers
           '{"left":ms,"jobs":[...]}': the first call's array and the ms its
           leases have left
  errors:  none; an id whose row is gone or not pending is dropped silently
           (it was removed by retention or already moved by another path)
]]
local pending, active = KEYS[1], KEYS[2]
local base, count, now = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local deadline = tonumber(now) + tonumber(ARGV[4])

-- @include lib/claimable.lua
-- @include lib/emit.lua

local memo = base .. 'claim:' .. ARGV[5]
local replayed = redis.call('GET', memo)
if replayed then
  return '{"left":' .. redis.call('PTTL', memo) .. ',"jobs":' .. replayed .. '}'
end
if redis.call('EXISTS', base .. 'paused') == 1 then
  redis.call('ZREM', base .. 'wake', WAKE_NOW)  -- resume wakes the workers again
  return '{"paused":1}'
end
-- the rate limit: a fixed window per queue, by the host's clock
-- (docs/explanation/protocol.md#the-hosts-clock), in one hash {start, n} that never grows
local limit, per = tonumber(ARGV[6]), tonumber(ARGV[7])
local limiter, start, used = base .. 'limiter', 0, 0
if limit > 0 then
  local w = redis.call('HMGET', limiter, 'start', 'n')
  start, used = tonumber(w[1] or '0'), tonumber(w[2] or '0')
  if tonumber(now) >= start + per then
    start, used = tonumber(now), 0
  end
  if used >= limit then
    if redis.call('EXISTS', pending, base .. 'prioritized') == 0 then
      return '[]'  -- nothing to wait for: a burst worker ends, an idle one rests until woken
    end
    return cjson.encode({wait = start + per - tonumber(now)})
  end
  count = math.min(count, limit - used)
end
local ids
local prioritized = base .. 'prioritized'
if redis.call('EXISTS', prioritized) == 0 then
  ids = redis.call('LPOP', pending, count)  -- the plain path: one command
else
  ids = redis.call('ZRANGE', prioritized, '-inf', '(0', 'BYSCORE', 'LIMIT', 0, count)
  if #ids > 0 then
    redis.call('ZREM', prioritized, unpack(ids))
  end
  if #ids < count then
    for _, id in ipairs(redis.call('LPOP', pending, count - #ids) or {}) do
      ids[#ids + 1] = id
    end
  end
  if #ids < count then
    local low = redis.call('ZPOPMIN', prioritized, count - #ids)
    for i = 1, #low, 2 do
      ids[#ids + 1] = low[i]
    end
  end
  if #ids == 0 then
    ids = false
  end
end
if ids and #ids == count
    and (redis.call('EXISTS', pending) == 1 or redis.call('EXISTS', prioritized) == 1) then
  wake_workers(base)  -- more is waiting: the next idle worker claims it
else
  redis.call('ZREM', base .. 'wake', WAKE_NOW)  -- drained: nothing left to wake for
end
if not ids then
  return '[]'
end
local batch = redis.call('INCR', KEYS[3])
local out = {}
local leases = {}
for i, id in ipairs(ids) do
  local row = base .. 'job:' .. id
  -- one read and one write per job: this loop is the hot path of a worker
  local f = redis.call('HMGET', row, 'state', 'name', 'payload', 'attempts', 'max_attempts',
    'backoff_ms', 'parent', 'parent_queue', 'parent_policy', 'created_at', 'timeout_ms', 'priority')
  if f[1] == 'pending' then
    local token = batch .. '.' .. i
    local attempts = tostring((tonumber(f[4]) or 0) + 1)
    if attempts ~= '1' then
      -- a later attempt: its first start stays as `first_started_at` (HSETNX
      -- keeps the earliest); a first attempt writes nothing more
      -- (docs/explanation/protocol.md#the-errors-of-earlier-attempts)
      local first = redis.call('HGET', row, 'started_at')
      if first then
        redis.call('HSETNX', row, 'first_started_at', first)
      end
    end
    redis.call('HSET', row, 'state', 'active', 'lease', token, 'started_at', now,
      'attempts', attempts)
    leases[#leases + 1] = deadline
    leases[#leases + 1] = id
    out[#out + 1] = id
    out[#out + 1] = token
    out[#out + 1] = f[2]
    out[#out + 1] = f[3]
    out[#out + 1] = attempts
    for j = 5, 12 do
      out[#out + 1] = f[j]
    end
  end
end
if #leases == 0 then
  return '[]'  -- cjson would encode an empty table as {}
end
redis.call('ZADD', active, unpack(leases))
local claimed = {}
for i = 2, #leases, 2 do
  claimed[#claimed + 1] = leases[i]
end
emit_to(base .. 'events', 'active', table.concat(claimed, ' '))
if limit > 0 then
  redis.call('HSET', limiter, 'start', start, 'n', used + #leases / 2)
end
local reply = cjson.encode(out)
redis.call('SET', memo, reply, 'PX', ARGV[4])
return reply
