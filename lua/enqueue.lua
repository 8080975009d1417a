--[[
  enqueue: gate the id, write one job row, push it pending (or delayed) and
  wake the queue's workers (lib/claimable.lua). DESIGN §5 `enqueue`; §4
  states; §10.1 wake-ups.

  KEYS[1] job row              P:{q}:job:<id> (hash)
  KEYS[2] pending list         P:{q}:pending (its P:{q}: is the queue's key
                               prefix: the wake key is built from it)
  KEYS[3] delayed zset         P:{q}:delayed (score: run-at, ms)
  KEYS[4] events stream        P:{q}:events

  ARGV[1] queue name
  ARGV[2] job id
  ARGV[3] job name (the handler)
  ARGV[4] payload, a JSON text
  ARGV[5] max attempts (integer >= 1), or '' for the queue's setting
  ARGV[6] backoff base (ms), or '' for the queue's setting
  ARGV[7] now (ms since the epoch, from the host)
  ARGV[8] delay (ms; 0 = claimable now)
  ARGV[9] call token: a fresh random string per enqueue call, kept on the row
          (enqueue_token) so a replay of the same call is recognised

  returns: the state written, 'pending' or 'delayed' (a replay of the same
           call, recognised by its token, answers the state it wrote)
  errors:  EMQDUP <queue> <id> <state>  the id is taken; nothing is written
]]
local row, pending = KEYS[1], KEYS[2]
-- @include lib/claimable.lua
local base = pending:sub(1, #pending - #'pending')
local queue, id = ARGV[1], ARGV[2]
local now, delay = tonumber(ARGV[7]), tonumber(ARGV[8])

local existing = redis.call('HMGET', row, 'state', 'enqueue_token')
if existing[1] then
  -- a replay of this very call (redis-py re-sent it): done already. Equal
  -- name, payload and ms were not enough: two calls in one ms are two calls
  -- (issue 17, item 4).
  if existing[2] == ARGV[9] then
    return existing[1]
  end
  return redis.error_reply('EMQDUP ' .. queue .. ' ' .. id .. ' ' .. existing[1])
end

local state = 'pending'
if delay > 0 then
  state = 'delayed'
end
-- compact row: attempts appears at the first claim; max_attempts / backoff_ms
-- only when the job sets its own (else the queue's setting applies)
local fields = {'name', ARGV[3], 'payload', ARGV[4], 'state', state, 'created_at', ARGV[7],
  'enqueue_token', ARGV[9]}
if ARGV[5] ~= '' then
  fields[#fields + 1] = 'max_attempts'
  fields[#fields + 1] = ARGV[5]
end
if ARGV[6] ~= '' then
  fields[#fields + 1] = 'backoff_ms'
  fields[#fields + 1] = ARGV[6]
end
redis.call('HSET', row, unpack(fields))
if state == 'delayed' then
  make_delayed(base, id, now + delay)
else
  make_claimable(base, {id})
end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', 10000, '*', 'e', 'added', 'id', id)
return state
