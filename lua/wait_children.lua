--[[
  wait_children: a running job that added children ends its attempt held
  for them (a step job, docs/explanation/protocol.md#step-jobs; its handler
  raised emq.WaitForChildren). Under the job's lease: active ->
  awaiting_children, its attempt taken back (as postpone does: waiting is
  not a failure), a `waiting_children` event, and its `waits` (the waits it
  finished) counted one up: the generated ids of its next run's children
  differ from this run's. Then, at once:
  - a child its parent must fail for (`fp`) died while the parent ran (it is
    in `:failed`): the job dies 'failed by child <ref>: ...', as a held
    parent does (lib/flow.lua kill, its own parent's policy applying);
  - every child resolved already (`:dependencies` is 0): it is released
    (lib/flow.lua release: pending at the front of its priority, `released`);
  - else it stays held until its last child resolves it (fan-in).
  A job with a cancel mark (cancelled while it ran) dies 'cancelled'.

  KEYS[1] job row              P:{q}:job:<id>
  KEYS[2] active zset          P:{q}:active
  KEYS[3] awaiting zset        P:{q}:awaiting (score: held-at, ms)

  ARGV[1] queue name
  ARGV[2] queue key prefix     P:{q}:
  ARGV[3] job id
  ARGV[4] lease token (from claim)
  ARGV[5] now (ms)

  returns: the state it left the job in: 'awaiting_children', 'pending',
           'delayed' or 'dead' (a replay of this call, same token, answers
           the job's state)
  errors:  EMQNOJOB <queue> <id>            no such job
           EMQSTATE <queue> <id> <state>    the job is not active
           EMQLEASE <queue> <id>            the lease token is stale
]]
local row, active, awaiting = KEYS[1], KEYS[2], KEYS[3]
local QUEUE = ARGV[1]
-- @include lib/flow.lua
-- @include lib/lease.lua
local base, id, token, now = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local REPLAYED = {awaiting_children = true, pending = true, delayed = true, dead = true}

local f = row_hmget_s(row, F_STATE, 'lease', 'attempts', 'cancel', 'group')
if f[1] and f[1] ~= 'active' and f[2] == token and REPLAYED[f[1]] then
  return f[1]  -- a replay: this lease ended the attempt (only one call ends one)
end
local refused = lease_refused(QUEUE, id, f[1], f[2], token)
if refused then
  return refused
end
if f[4] then  -- cancelled while it ran (docs/explanation/lifecycle.md)
  kill(base, id, 'cancelled', now)
  return 'dead'
end
redis.call('ZREM', active, id)
left_active(base, f[5] or nil)  -- its group's running count too (docs/explanation/protocol.md#groups)
redis.call('HSET', row, F_STATE, 'awaiting_children', 'updated_at', now,
  'attempts', math.max(0, (tonumber(f[3]) or 1) - 1))
-- the runs it ended waiting: a later run's add_children draws other ids
-- (docs/explanation/protocol.md#step-jobs)
redis.call('HINCRBY', row, 'waits', 1)
redis.call('ZADD', awaiting, now, id)
emit(base, 'waiting_children', id)
if redis.call('HLEN', row .. ':failed') > 0 and redis.call('HEXISTS', row, 'went_on') == 0 then
  local cursor, ref, err = '0', nil, nil
  repeat  -- one failed child names the death, as a held parent's first one does
    local page = redis.call('HSCAN', row .. ':failed', cursor, 'COUNT', 10)
    cursor, ref, err = page[1], page[2][1], page[2][2]
  until ref or cursor == '0'
  local why = failed_by(ref, err)
  signal_event(base, 'flow_failed', id, why)
  kill(base, id, why, now)
  return 'dead'
end
if tonumber(redis.call('GET', row .. ':dependencies') or '0') <= 0 then
  release(base, id, now)
end
return row_hmget_s(row, F_STATE)[1]
