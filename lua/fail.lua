--[[
  fail: active -> delayed (the worker's delay, or exponential backoff) while attempts remain
  (straight to pending when the backoff is 0),
  else dead; a dead child resolves its parent by its policy (same queue: here;
  other queue: a fail entry on this queue's outbox). A retried attempt adds
  the job's on_failure callback job, a death its on_dead one (lib/flow.lua). A delayed retry announces
  its run-at on the queue's wake key (lib/claimable.lua), so a blocked worker
  promotes it on time. docs/explanation/protocol.md#fail, docs/explanation/no-polling.md#wake-keys.
  The error of the attempt before (the row's `error`, when it has one) moves
  to the end of P:{q}:job:<id>:errors, which keeps the newest ERRORS_EARLIER;
  so the row's `error` and that list hold each failed attempt's error
  (docs/explanation/protocol.md#the-errors-of-earlier-attempts).

  KEYS[1] job row              P:{q}:job:<id>
  KEYS[2] delayed zset         P:{q}:delayed (score: run-at, ms)

  ARGV[1] queue name
  ARGV[2] queue key prefix     P:{q}:
  ARGV[3] job id
  ARGV[4] lease token (from claim)
  ARGV[5] error text
  ARGV[6] now (ms)
  ARGV[7] backoff cap (ms): the longest wait between attempts
  ARGV[8] force dead: '1' skips the remaining attempts, '0' otherwise
  ARGV[9] the queue's max attempts, for a row without its own
  ARGV[10] the queue's backoff base (ms), for a row without its own
  ARGV[11] delay (ms) before the next attempt, as the worker's retry policy
          decided it (docs/howto/retries.md: backoff shape, jitter, Retry;
          not capped here), or '' for the row's exponential backoff

  returns: JSON {state: 'delayed'|'pending'|'dead', run_at: ms|null, released, dead,
           flow_failed, outbox, sent?: [entry...]} (`sent`: the outbox entries
           its death pushed for parents on other slots, as pushed, for a
           worker that holds the sweep lock to deliver them itself); a job cancelled while it ran (its row has
           `cancel`) dies with the error 'cancelled' whatever its attempts;
           a job whose flow was removed while it ran (`orphaned`) that dies
           is removed at once (job_dead is still sent; a replay answers
           {state: 'dead'} from P:{q}:op:<lease>, kept 10 minutes)
  errors:  EMQNOJOB <queue> <id>            no such job
           EMQSTATE <queue> <id> <state>    the job is not active (unless this
           lease failed it with this error already: a replay answers
           {state} as if it had worked)
           EMQLEASE <queue> <id>            the lease token is stale
]]
local row = KEYS[1]
local QUEUE = ARGV[1]
-- @include lib/flow.lua
local base, id, token, err = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local now, cap = tonumber(ARGV[6]), tonumber(ARGV[7])

local f = row_hmget_s(row, F_STATE, 'lease', 'attempts', 'max_attempts', 'backoff_ms',
  'cancel', 'callbacks', 'group')
if not f[1] then
  -- a replay of the call that killed a removed flow's job (lib/flow.lua drop_orphan)
  if redis.call('GET', base .. 'op:' .. token) == 'd' .. redis.sha1hex(err) then
    return cjson.encode({state = 'dead'})
  end
  return redis.error_reply('EMQNOJOB ' .. QUEUE .. ' ' .. id)
end
if f[1] ~= 'active' then
  -- a replay of this very call (redis-py re-sent it): this lease failed it,
  -- with this error, into a state a fail writes. A job this lease completed
  -- is no replay of a fail: refused (docs/explanation/reliability.md#replays-are-recognised-by-the-call).
  if f[2] == token and (f[1] == 'delayed' or f[1] == 'pending' or f[1] == 'dead')
      and get_error(row) == err then
    return cjson.encode({state = f[1]})
  end
  return redis.error_reply('EMQSTATE ' .. QUEUE .. ' ' .. id .. ' ' .. f[1])
end
if f[2] ~= token then
  return redis.error_reply('EMQLEASE ' .. QUEUE .. ' ' .. id)
end

OUT.sent = {}  -- lib/flow.lua send(): the entries as pushed, for a worker that delivers them
local function reply()
  if #OUT.sent == 0 then
    OUT.sent = nil
  end
  return cjson.encode(OUT)
end

local ERRORS_EARLIER = 9  -- protocol/reads.ERRORS_KEPT - 1: the row keeps the last
local earlier = get_error(row)
if earlier then
  local errors = row .. ':errors'
  if redis.call('RPUSH', errors, earlier) > ERRORS_EARLIER then
    redis.call('LTRIM', errors, -ERRORS_EARLIER, -1)
  end
end

local attempts, max_attempts = tonumber(f[3]), tonumber(f[4] or ARGV[9])
if f[6] then  -- cancelled while it ran (docs/explanation/lifecycle.md): dies, its attempts unspent
  kill(base, id, 'cancelled', now)
  OUT.state = 'dead'
  return reply()
end
if attempts < max_attempts and ARGV[8] ~= '1' then
  -- the worker's delay, else attempt n waits backoff * 2^(n-1), capped
  local wait = tonumber(ARGV[11])
    or math.min(tonumber(f[5] or ARGV[10]) * (2 ^ (attempts - 1)), cap)
  local run_at = now + math.floor(wait)
  redis.call('ZREM', base .. 'active', id)
  left_active(base, f[8] or nil)
  if run_at > now then
    redis.call('HSET', row, F_STATE, 'delayed', 'updated_at', now)
    set_error(row, err)
    make_delayed(base, id, run_at)
    OUT.state = 'delayed'
    OUT.run_at = run_at
  else
    redis.call('HSET', row, F_STATE, 'pending', 'updated_at', now)
    set_error(row, err)
    make_claimable_row(base, id)
    OUT.state = 'pending'
  end
  emit(base, 'failed', id)
  callback(base, id, f[7], 'f', nil, err, now)  -- its on_failure job
  return reply()
end

kill(base, id, err, now)
OUT.state = 'dead'
return reply()
