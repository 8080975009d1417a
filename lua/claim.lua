--[[
  claim: pop up to K pending ids; each becomes active with a fresh lease token
  and deadline, its attempt counted. DESIGN §5 `claim`. Keeps the queue's
  wake marker true (lib/claimable.lua, DESIGN §10.1): it is put back when
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
          same call (redis-py re-sends a command whose reply was lost) gets
          the same jobs instead of leasing a second batch

  returns: a JSON array (one bulk string: the host decodes it in one C call
           instead of parsing 11 replies per job), 11 entries per claimed job:
           id, lease token, name, payload, attempts, max_attempts, backoff_ms,
           parent, parent_queue, parent_policy, created_at
           (strings; an absent field is false)
  errors:  none; an id whose row is gone or not pending is dropped silently
           (it was removed by retention or already moved by another path)
]]
local pending, active = KEYS[1], KEYS[2]
local base, count, now = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local deadline = tonumber(now) + tonumber(ARGV[4])

-- @include lib/claimable.lua

local memo = base .. 'claim:' .. ARGV[5]
local replayed = redis.call('GET', memo)
if replayed then
  return replayed
end
local ids = redis.call('LPOP', pending, count)
if ids and #ids == count and redis.call('EXISTS', pending) == 1 then
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
    'backoff_ms', 'parent', 'parent_queue', 'parent_policy', 'created_at')
  if f[1] == 'pending' then
    local token = batch .. '.' .. i
    local attempts = tostring((tonumber(f[4]) or 0) + 1)
    redis.call('HSET', row, 'state', 'active', 'lease', token, 'started_at', now,
      'attempts', attempts)
    leases[#leases + 1] = deadline
    leases[#leases + 1] = id
    out[#out + 1] = id
    out[#out + 1] = token
    out[#out + 1] = f[2]
    out[#out + 1] = f[3]
    out[#out + 1] = attempts
    for j = 5, 10 do
      out[#out + 1] = f[j]
    end
  end
end
if #leases == 0 then
  return '[]'  -- cjson would encode an empty table as {}
end
redis.call('ZADD', active, unpack(leases))
local reply = cjson.encode(out)
redis.call('SET', memo, reply, 'PX', ARGV[4])
return reply
