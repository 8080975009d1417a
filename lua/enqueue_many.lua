--[[
  enqueue_many: land many plain jobs of one queue in one step. Every
  user-given id is gated before anything is written (one taken id refuses
  the whole call); then each row is written as `enqueue` writes it and
  pushed pending (lib/claimable.lua: one wake-up per run of jobs sharing their options) or delayed
  (its run-at announced). docs/explanation/no-polling.md#bulk-enqueue, docs/explanation/protocol.md#enqueue.

  KEYS[1] pending list         P:{q}:pending
  KEYS[2] delayed zset         P:{q}:delayed (score: run-at, ms)
  KEYS[3] events stream        P:{q}:events

  ARGV[1] queue name
  ARGV[2] queue key prefix     P:{q}: (job rows are P:{q}:job:<id>, same slot)
  ARGV[3] now (ms)
  ARGV[4] mode: 'write' lands the jobs; 'check' only gates them
  ARGV[5] jobs, as one flat JSON array of strings (a nested array costs Redis
          several times more to decode), in runs of jobs that share their
          options: name, max attempts ('' = the queue's), backoff base (ms;
          '' = the queue's), delay (ms; '0' = claimable now), priority
          ('0' = the default), timeout of one attempt (ms; '' = the queue's),
          keep (ms a finished job is kept at most, docs/explanation/lifecycle.md; '' = the
          queue's retention alone), gate ('1' = check each id is free; '0'
          for ids the host generated with 72 random bits), group ('' = none;
          docs/explanation/protocol.md#groups), retry policy (compact JSON
          kept as `retry_policy`, '' = the queue's, docs/howto/retries.md),
          expiry (ms after it is due: `expires_at` = now + delay + this;
          '' = none), callbacks (JSON kept as `callbacks`, '' = none), job
          count n, then n pairs: id, payload (a JSON text)
  ARGV[6] trace context: the W3C traceparent of the caller's add span, kept
          on every row as `traceparent` ('' = none: tracing is off;
          docs/howto/tracing.md)

  returns: the number of jobs written (0 for a replay: redis-py re-sent the
           call and its first job's row is there with the same name,
           payload and now; 0 in 'check' mode)
  errors:  EMQDUP <queue> <id> <state>  an id is taken; nothing is written
]]
local events = KEYS[3]
local queue, base, now, mode = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
-- @include lib/row.lua
-- @include lib/claimable.lua
-- @include lib/emit.lua
local a = cjson.decode(ARGV[5])

if #a == 0 then
  return 0
end
local G = 13  -- strings in a run header
local first = row_hmget(base .. 'job:' .. a[G + 1], F_NAME, F_DATA, F_CREATED)
if first[1] == a[1] and first[2] == a[G + 2] and first[3] == now then
  return 0  -- a replay of this very call: it landed already
end
local i = 1
while i <= #a do
  local gate, n = a[i + 7], tonumber(a[i + 12])
  i = i + G
  if gate == '1' then
    for j = i, i + 2 * n - 1, 2 do
      local state = row_hmget_s(base .. 'job:' .. a[j], F_STATE)[1]
      if state then
        return redis.error_reply('EMQDUP ' .. queue .. ' ' .. a[j] .. ' ' .. state)
      end
    end
  end
  i = i + 2 * n
end
if mode ~= 'write' then
  return 0
end

local landed = 0
i = 1
while i <= #a do
  local name, delay, priority, n = a[i], tonumber(a[i + 3]), a[i + 4], tonumber(a[i + 12])
  local group = a[i + 8] ~= '' and a[i + 8] or nil
  local state = delay > 0 and 'delayed' or 'pending'
  -- compact rows, as enqueue writes them: the fields after the payload
  local shared = {F_CREATED, now}  -- pending: no `s` (lib/row.lua pending_if_there)
  if state ~= 'pending' then
    shared[3], shared[4] = F_STATE, state
  end
  if a[i + 1] ~= '' then
    shared[#shared + 1] = 'max_attempts'
    shared[#shared + 1] = a[i + 1]
  end
  if a[i + 2] ~= '' then
    shared[#shared + 1] = 'backoff_ms'
    shared[#shared + 1] = a[i + 2]
  end
  if priority ~= '0' then
    shared[#shared + 1] = 'priority'
    shared[#shared + 1] = priority
  end
  if a[i + 5] ~= '' then
    shared[#shared + 1] = 'timeout_ms'
    shared[#shared + 1] = a[i + 5]
  end
  if a[i + 6] ~= '' then
    shared[#shared + 1] = 'keep'  -- read where it finishes (lib/lifecycle.lua expire_at)
    shared[#shared + 1] = a[i + 6]
  end
  if group then
    shared[#shared + 1] = 'group'
    shared[#shared + 1] = group
  end
  if ARGV[6] ~= '' then
    shared[#shared + 1] = 'traceparent'
    shared[#shared + 1] = ARGV[6]
  end
  -- its own retry policy, expiry and callbacks (docs/howto/retries.md), only when set
  local expires = a[i + 10] ~= '' and string.format('%.0f', tonumber(now) + delay + a[i + 10])
  for _, f in ipairs({{'retry_policy', a[i + 9]}, {'expires_at', expires or ''},
      {'callbacks', a[i + 11]}}) do
    if f[2] ~= '' then
      shared[#shared + 1] = f[1]
      shared[#shared + 1] = f[2]
    end
  end
  local claimable = {}
  i = i + G
  for j = i, i + 2 * n - 1, 2 do
    local id = a[j]
    redis.call('HSET', base .. 'job:' .. id, F_NAME, name, F_DATA, a[j + 1], unpack(shared))
    if delay > 0 then
      make_delayed(base, id, tonumber(now) + delay)
    else
      claimable[#claimable + 1] = id
    end
    emit_to(events, 'added', id)
  end
  make_claimable(base, claimable, priority ~= '0' and priority or nil, false, group)
  landed = landed + n
  i = i + 2 * n
end
return landed
