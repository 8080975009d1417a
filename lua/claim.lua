--[[
  claim: pop up to K pending ids; each becomes active with a fresh lease token
  and deadline, its attempt counted. DESIGN §5 `claim`.

  KEYS[1] pending list         P:{q}:pending
  KEYS[2] active zset          P:{q}:active (score: lease deadline, ms)
  KEYS[3] lease sequence       P:{q}:lease:seq (string counter)

  ARGV[1] queue key prefix     P:{q}: (job rows are P:{q}:job:<id>, same slot)
  ARGV[2] count K (integer >= 1)
  ARGV[3] now (ms)
  ARGV[4] lease length (ms)

  returns: a flat array, 11 entries per claimed job:
           id, lease token, name, payload, attempts, max_attempts, backoff_ms,
           parent, parent_queue, parent_policy, created_at
           (absent fields are false -> nil on the host)
  errors:  none; an id whose row is gone or not pending is dropped silently
           (it was removed by retention or already moved by another path)
]]
local pending, active = KEYS[1], KEYS[2]
local base, count = ARGV[1], tonumber(ARGV[2])
local now, lease_ms = tonumber(ARGV[3]), tonumber(ARGV[4])
local deadline = now + lease_ms

local ids = redis.call('LPOP', pending, count)
if not ids then
  return {}
end
local batch = redis.call('INCR', KEYS[3])
local out = {}
for i, id in ipairs(ids) do
  local row = base .. 'job:' .. id
  if redis.call('HGET', row, 'state') == 'pending' then
    local token = batch .. '.' .. i
    local attempts = redis.call('HINCRBY', row, 'attempts', 1)
    redis.call('HSET', row, 'state', 'active', 'lease', token, 'started_at', now)
    redis.call('ZADD', active, deadline, id)
    local f = redis.call('HMGET', row, 'name', 'payload', 'max_attempts', 'backoff_ms',
      'parent', 'parent_queue', 'parent_policy', 'created_at')
    out[#out + 1] = id
    out[#out + 1] = token
    out[#out + 1] = f[1]
    out[#out + 1] = f[2]
    out[#out + 1] = attempts
    for j = 3, 8 do
      out[#out + 1] = f[j]
    end
  end
end
return out
