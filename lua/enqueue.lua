--[[
  enqueue: gate the id, write one job row, push it pending (or delayed) and
  wake the queue's workers (lib/claimable.lua). docs/explanation/protocol.md#enqueue; wake-ups:
  docs/explanation/no-polling.md#wake-keys.

  KEYS[1] job row              P:{q}:job:<id> (hash)
  KEYS[2] pending list         P:{q}:pending (its P:{q}: is the queue's key
                               prefix: the wake key is built from it)
  KEYS[3] delayed zset         P:{q}:delayed (score: run-at, ms)
  KEYS[4] events stream        P:{q}:events
  KEYS[5] dedup key            P:{q}:dedup:<key> (string: the live job's id;
                               unused when ARGV[10] is '')

  ARGV[1] queue name
  ARGV[2] job id
  ARGV[3] job name (the handler)
  ARGV[4] payload, a JSON text
  ARGV[5] max attempts (integer >= 1), or '' for the queue's setting
  ARGV[6] backoff base (ms), or '' for the queue's setting
  ARGV[7] now (ms since the epoch, from the host)
  ARGV[8] delay (ms; 0 = claimable now)
  ARGV[9] priority (integer, higher first; '0' = the default)
  ARGV[10] dedup key ('' = none): while the job it names is live (not
          completed, not dead), the add writes nothing and answers that id
  ARGV[11] dedup ttl (ms; '' = until the job finishes)
  ARGV[12] timeout of one attempt (ms; '' = the queue's TIMEOUT_MS)
  ARGV[13] keep (ms): at most this long after it finishes (docs/explanation/lifecycle.md;
          '' = the queue's retention alone)
  ARGV[14] call token: a fresh random string per enqueue call, kept on the
          row (enqueue_token) so a replay of the same call is recognised
  ARGV[15] trace context: the W3C traceparent of the caller's add span, kept
          on the row as `traceparent` ('' = none: tracing is off;
          docs/howto/tracing.md)
  ARGV[16] the job's own retry policy, compact JSON kept as `retry_policy`
          (docs/howto/retries.md; '' = the queue's)
  ARGV[17] expires at (ms since the epoch; '' = never): not started by then,
          claim kills it with 'expired' (docs/howto/retries.md#expiry-before-start)
  ARGV[18] callbacks, compact JSON kept as `callbacks` ('' = none): the
          handlers its outcomes add a job for (docs/howto/retries.md#callbacks)
  ARGV[19] group ('' = none): kept as `group`; the job is claimed in its
          group's turn (lib/groups.lua, docs/explanation/protocol.md#groups)

  returns: the state written, 'pending' or 'delayed' (a replay of the same
           call, recognised by its token, answers the state it wrote);
           'deduplicated <id>' when the dedup key names a live job <id> (nothing
           written)
  errors:  EMQDUP <queue> <id> <state>  the id is taken; nothing is written
]]
local row, pending = KEYS[1], KEYS[2]
-- @include lib/row.lua
-- @include lib/claimable.lua
-- @include lib/emit.lua
local base = pending:sub(1, #pending - #'pending')
local queue, id = ARGV[1], ARGV[2]
local now, delay = tonumber(ARGV[7]), tonumber(ARGV[8])

local dedup = ARGV[10]
if dedup ~= '' then
  local live = redis.call('GET', KEYS[5])
  if live and live ~= id then
    local st = row_hmget_s(base .. 'job:' .. live, F_STATE)[1]
    if st and st ~= 'completed' and st ~= 'dead' then
      return 'deduplicated ' .. live
    end
  end
end

local existing = row_hmget_s(row, F_STATE, 'enqueue_token')
if existing[1] then
  -- a replay of this very call (redis-py re-sent it): done already. Equal
  -- name, payload and ms were not enough: two calls in one ms are two calls
  -- (docs/explanation/reliability.md#replays-are-recognised-by-the-call).
  if existing[2] == ARGV[14] then
    return existing[1]
  end
  return redis.error_reply('EMQDUP ' .. queue .. ' ' .. id .. ' ' .. existing[1])
end

local state = 'pending'
if delay > 0 then
  state = 'delayed'
end
-- compact row: attempts appears at the first claim; max_attempts / backoff_ms
-- only when the job sets its own (else the queue's setting applies), and the
-- scheduling settings (docs/explanation/protocol.md#scheduling) only when set
local fields = {F_NAME, ARGV[3], F_DATA, ARGV[4], F_CREATED, ARGV[7], 'enqueue_token', ARGV[14]}
if state ~= 'pending' then  -- pending: no `s` (lib/row.lua pending_if_there)
  fields[#fields + 1] = F_STATE
  fields[#fields + 1] = state
end
local priority = (ARGV[9] ~= '0') and ARGV[9] or ''
for _, f in ipairs({{'max_attempts', ARGV[5]}, {'backoff_ms', ARGV[6]}, {'priority', priority},
    {'timeout_ms', ARGV[12]}, {'dedup', dedup}, {'keep', ARGV[13]}, {'traceparent', ARGV[15]},
    {'retry_policy', ARGV[16]}, {'expires_at', ARGV[17]}, {'callbacks', ARGV[18]},
    {'group', ARGV[19]}}) do
  if f[2] ~= '' then
    fields[#fields + 1] = f[1]
    fields[#fields + 1] = f[2]
  end
end
if dedup ~= '' then
  if ARGV[11] ~= '' then
    redis.call('SET', KEYS[5], id, 'PX', ARGV[11])
  else
    redis.call('SET', KEYS[5], id)
  end
end
redis.call('HSET', row, unpack(fields))
if state == 'delayed' then
  make_delayed(base, id, now + delay)
else
  make_claimable(base, {id}, priority ~= '' and priority or nil, false,
    ARGV[19] ~= '' and ARGV[19] or nil)
end
emit_to(KEYS[4], 'added', id)
return state
